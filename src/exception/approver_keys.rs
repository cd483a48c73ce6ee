//! The approver keys as a component last read them from their Secret: one parsing rule shared by
//! the operator (which verifies and distributes them) and the admission webhook (which verifies
//! CapabilityExceptions before they are stored). Pure: the caller looks the Secret up (from a
//! watch cache) and hands it in.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use serde_json::value::RawValue;

use super::ApproverTrust;

/// The approver keys, or why there are none.
#[derive(Clone, Debug, Default)]
pub enum ApproverKeys {
    /// No `approverKeys` configured, or the Secret (or its key) does not exist.
    #[default]
    Missing,
    /// The Secret's value is not a usable trust document.
    Unusable(String),
    /// Parsed trust, with the document as sidecars receive it.
    Loaded {
        trust: Arc<ApproverTrust>,
        document: Arc<RawValue>,
    },
}

impl ApproverKeys {
    /// Parses a trust document (a JWKS with optional `revokedKeys`/`revokedApprovals`).
    pub fn from_document(bytes: &[u8]) -> Self {
        let trust = match ApproverTrust::from_json(bytes) {
            Ok(t) => t,
            Err(e) => return Self::Unusable(e.to_string()),
        };
        // Re-serialized compactly: the document travels embedded in one NDJSON line of the
        // policy stream, and a pretty-printed JWKS (as `kubectl create secret --from-file`
        // stores a formatted file) would otherwise split that line.
        let compact = serde_json::from_slice::<serde_json::Value>(bytes)
            .and_then(|value| serde_json::value::to_raw_value(&value));
        match compact {
            Ok(document) => Self::Loaded {
                trust: Arc::new(trust),
                document: Arc::from(document),
            },
            Err(e) => Self::Unusable(e.to_string()),
        }
    }

    /// Reads `key` of `secret` (`data` first, then `stringData`, as a Secret not yet
    /// normalised by the API server may carry it). A missing key is [`ApproverKeys::Missing`].
    pub fn from_secret(secret: &Secret, key: &str) -> Self {
        let data = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|b| &b.0[..]);
        let string_data = || {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(String::as_bytes)
        };
        match data.or_else(string_data) {
            Some(bytes) => Self::from_document(bytes),
            None => Self::Missing,
        }
    }

    /// The parsed trust, when loaded.
    pub fn trust(&self) -> Option<&Arc<ApproverTrust>> {
        match self {
            Self::Loaded { trust, .. } => Some(trust),
            Self::Missing | Self::Unusable(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;

    use super::*;

    const JWKS: &[u8] = include_bytes!("../../tests/fixtures/keys/issuer-jwks.json");

    fn secret(data: Option<(&str, &[u8])>, string_data: Option<(&str, &str)>) -> Secret {
        Secret {
            data: data.map(|(k, v)| BTreeMap::from([(k.to_owned(), ByteString(v.to_vec()))])),
            string_data: string_data.map(|(k, v)| BTreeMap::from([(k.to_owned(), v.to_owned())])),
            ..Secret::default()
        }
    }

    #[test]
    fn a_jwks_under_the_key_loads_from_data_or_string_data() {
        let from_data = ApproverKeys::from_secret(&secret(Some(("keys", JWKS)), None), "keys");
        let ApproverKeys::Loaded { trust, document } = &from_data else {
            panic!("{from_data:?}");
        };
        assert!(!trust.keys.is_empty());
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(document.get()).unwrap(),
            serde_json::from_slice::<serde_json::Value>(JWKS).unwrap()
        );
        assert!(
            JWKS.contains(&b'\n') && !document.get().contains('\n'),
            "a formatted document is kept on one line (it travels in an NDJSON stream)"
        );
        let text = std::str::from_utf8(JWKS).unwrap();
        assert!(matches!(
            ApproverKeys::from_secret(&secret(None, Some(("keys", text))), "keys"),
            ApproverKeys::Loaded { .. }
        ));
    }

    #[test]
    fn a_missing_key_is_missing_and_a_bad_document_is_unusable() {
        assert!(matches!(
            ApproverKeys::from_secret(&secret(Some(("other", JWKS)), None), "keys"),
            ApproverKeys::Missing
        ));
        assert!(matches!(
            ApproverKeys::from_secret(&Secret::default(), "keys"),
            ApproverKeys::Missing
        ));
        let bad = ApproverKeys::from_secret(&secret(Some(("keys", b"{not json")), None), "keys");
        let ApproverKeys::Unusable(why) = &bad else {
            panic!("{bad:?}");
        };
        assert!(!why.is_empty());
        assert!(bad.trust().is_none());
    }
}
