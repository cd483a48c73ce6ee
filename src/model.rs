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
