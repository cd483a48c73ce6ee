//! References from Lifeguard's configuration files to Secrets.

use serde::{Deserialize, Serialize};

/// One key of one Secret in the component's own namespace (`--namespace`), as the operator's
/// and the webhook's configuration files name it: `{secretName, key}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretKeyRef {
    /// Name of the Secret.
    pub secret_name: String,
    /// Key inside the Secret's `data`.
    pub key: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shape_is_secret_name_and_key_and_nothing_else() {
        let r: SecretKeyRef =
            serde_json::from_str(r#"{"secretName": "approvers", "key": "jwks.json"}"#).unwrap();
        assert_eq!(
            r,
            SecretKeyRef {
                secret_name: "approvers".into(),
                key: "jwks.json".into()
            }
        );
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            serde_json::json!({"secretName": "approvers", "key": "jwks.json"})
        );
        let err = serde_json::from_str::<SecretKeyRef>(
            r#"{"secretName": "approvers", "key": "k", "namespace": "x"}"#,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("unknown field `namespace`"),
            "{err}"
        );
    }
}
