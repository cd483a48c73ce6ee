//! The domain types every layer names: who owns a task ([`Owner`]), which task ([`TaskId`]) and
//! where it stands ([`TaskStatus`]).
//!
//! Pure data with no storage behind it, so the wire layer, identity, audit and exceptions can
//! name them without depending on the ledger (which re-exports them for its own callers).

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};

/// Why a domain value could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The OS random number generator failed, so no task ID could be minted.
    #[error("random number generator failed: {0}")]
    Random(#[source] getrandom::Error),
}

/// A task ID the sidecar minted: `lgt_` + 192 bits from the OS CSPRNG, base64url.
/// Unguessable, and unrelated to the upstream server's own ID (which never reaches clients).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TaskId(String);

/// Prefix of every sidecar task ID (also makes them recognisable to secret scanners).
pub const TASK_ID_PREFIX: &str = "lgt_";

impl TaskId {
    /// Mints a fresh ID.
    pub fn generate() -> Result<Self, ModelError> {
        let mut bytes = [0u8; 24];
        getrandom::fill(&mut bytes).map_err(ModelError::Random)?;
        Ok(Self(format!(
            "{TASK_ID_PREFIX}{}",
            URL_SAFE_NO_PAD.encode(bytes)
        )))
    }

    /// Wraps an ID received from a client or read from storage. Any string is accepted (unknown
    /// IDs simply match nothing); use [`TaskId::looks_minted`] to skip a lookup for IDs that
    /// cannot exist.
    pub fn from_string(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether the ID has the shape of one this sidecar mints.
    pub fn looks_minted(&self) -> bool {
        self.0.len() == TASK_ID_PREFIX.len() + 32
            && self.0.starts_with(TASK_ID_PREFIX)
            && self.0[TASK_ID_PREFIX.len()..]
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Task IDs are bearer-like secrets for existence; never print them in debug output.
impl fmt::Debug for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TaskId(..)")
    }
}

/// Who a task belongs to: issuer + subject, tenant and OAuth client, from the creating token.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Owner {
    pub issuer: String,
    pub subject: String,
    /// Empty when the token carries no tenant claim.
    pub tenant: String,
    /// Empty when the token carries no client claim.
    pub client: String,
}

/// The key a caller proved possession of, from its token's `cnf` confirmation: the RFC 7638
/// thumbprint of a DPoP key (RFC 9449 `jkt`) or the SHA-256 thumbprint of a client certificate
/// (RFC 8705 `x5t#S256`), both base64url. A task created by a key-bound token is bound to that
/// key: only requests proving the same key may touch it. Thumbprints are digests of public
/// keys, not secrets.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum KeyBinding {
    /// A DPoP proof key (`cnf.jkt`).
    Dpop { jkt: String },
    /// A TLS client certificate (`cnf["x5t#S256"]`).
    Mtls { x5t_s256: String },
}

impl KeyBinding {
    const DPOP_PREFIX: &'static str = "jkt:";
    const MTLS_PREFIX: &'static str = "x5t#S256:";

    /// How the key is proven: `dpop` or `mtls` (metrics, audit, delegation assertions).
    pub fn method(&self) -> &'static str {
        match self {
            Self::Dpop { .. } => "dpop",
            Self::Mtls { .. } => "mtls",
        }
    }

    /// The thumbprint, base64url.
    pub fn thumbprint(&self) -> &str {
        match self {
            Self::Dpop { jkt } => jkt,
            Self::Mtls { x5t_s256 } => x5t_s256,
        }
    }

    /// The form kept in the ledger and written to the audit trail: `jkt:<thumbprint>` or
    /// `x5t#S256:<thumbprint>`.
    pub fn to_stored(&self) -> String {
        match self {
            Self::Dpop { jkt } => format!("{}{jkt}", Self::DPOP_PREFIX),
            Self::Mtls { x5t_s256 } => format!("{}{x5t_s256}", Self::MTLS_PREFIX),
        }
    }

    /// Reads [`KeyBinding::to_stored`]'s form; `None` for anything else (including an empty
    /// thumbprint).
    pub fn from_stored(stored: &str) -> Option<Self> {
        if let Some(jkt) = stored.strip_prefix(Self::DPOP_PREFIX) {
            return (!jkt.is_empty()).then(|| Self::Dpop {
                jkt: jkt.to_owned(),
            });
        }
        let x5t = stored.strip_prefix(Self::MTLS_PREFIX)?;
        (!x5t.is_empty()).then(|| Self::Mtls {
            x5t_s256: x5t.to_owned(),
        })
    }
}

/// Task status as in the MCP Tasks extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    Working,
    InputRequired,
    Completed,
    Failed,
    Cancelled,
}

impl TaskStatus {
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }

    /// The wire name (`working`, `input_required`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Working => "working",
            Self::InputRequired => "input_required",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "working" => Self::Working,
            "input_required" => Self::InputRequired,
            "completed" => Self::Completed,
            "failed" => Self::Failed,
            "cancelled" => Self::Cancelled,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_bindings_round_trip_through_their_stored_form() {
        let dpop = KeyBinding::Dpop {
            jkt: "0ZcOCORZNYy-DWpqq30jZyJGHTN0d2HglBV3uiguA4I".into(),
        };
        let mtls = KeyBinding::Mtls {
            x5t_s256: "bwcK0esc3ACC3DB2Y5_lESsXE8o9ltc05O89jdN-dg2".into(),
        };
        assert_eq!(
            dpop.to_stored(),
            "jkt:0ZcOCORZNYy-DWpqq30jZyJGHTN0d2HglBV3uiguA4I"
        );
        assert_eq!(
            mtls.to_stored(),
            "x5t#S256:bwcK0esc3ACC3DB2Y5_lESsXE8o9ltc05O89jdN-dg2"
        );
        for binding in [&dpop, &mtls] {
            assert_eq!(
                KeyBinding::from_stored(&binding.to_stored()).as_ref(),
                Some(binding)
            );
        }
        assert_eq!((dpop.method(), mtls.method()), ("dpop", "mtls"));
        for bad in ["", "jkt:", "x5t#S256:", "sha256:abc", "JKT:abc"] {
            assert_eq!(KeyBinding::from_stored(bad), None, "{bad}");
        }
    }

    #[test]
    fn minted_ids_are_unique_and_well_formed() {
        let a = TaskId::generate().unwrap();
        let b = TaskId::generate().unwrap();
        assert_ne!(a, b);
        assert!(a.looks_minted(), "{a}");
        assert_eq!(a.as_str().len(), 36);
        assert!(!TaskId::from_string("task-1").looks_minted());
        assert!(!TaskId::from_string(format!("{TASK_ID_PREFIX}{}", "!".repeat(32))).looks_minted());
        assert_eq!(format!("{a:?}"), "TaskId(..)");
    }

    #[test]
    fn status_names_round_trip() {
        for s in [
            TaskStatus::Working,
            TaskStatus::InputRequired,
            TaskStatus::Completed,
            TaskStatus::Failed,
            TaskStatus::Cancelled,
        ] {
            assert_eq!(TaskStatus::parse(s.as_str()), Some(s));
            assert_eq!(
                serde_json::to_value(s).unwrap(),
                serde_json::Value::from(s.as_str())
            );
        }
        assert!(!TaskStatus::Working.is_terminal() && !TaskStatus::InputRequired.is_terminal());
        assert_eq!(TaskStatus::parse("done"), None);
    }
}
