//! References to Secrets: [`SecretKeyRef`] from Lifeguard's own configuration files (a Secret
//! in the component's namespace), [`SecretKeySelector`] from Lifeguard's custom resources (a
//! Secret in the object's namespace, shaped like a container's `env[].valueFrom.secretKeyRef`).

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use super::rules;

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

/// One key of one Secret in the namespace of the custom resource that names it, written
/// `{name, key}` like a container's `env[].valueFrom.secretKeyRef`. Lifeguard never reads it:
/// it is handed to the kubelet of the pods that need it.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeySelector {
    /// Name of the Secret: a lowercase RFC 1123 subdomain.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(
        validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')")
            .message(rules::SECRET_NAME_DNS_SUBDOMAIN)
    )]
    pub name: String,
    /// Key inside the Secret's `data`: letters, digits, `-`, `_` and `.`.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(
        validation = Rule::new("self.matches('^[-._a-zA-Z0-9]+$') && self != '.' && !self.startsWith('..')")
            .message(rules::SECRET_DATA_KEY)
    )]
    pub key: String,
}

impl SecretKeySelector {
    /// Whether `name` is a Secret name the API server accepts (the CEL rule above).
    pub fn valid_name(name: &str) -> bool {
        let label = |l: &str| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        !name.is_empty() && name.len() <= 253 && name.split('.').all(label)
    }

    /// Whether `key` is a Secret data key the API server accepts (the CEL rule above).
    pub fn valid_key(key: &str) -> bool {
        !key.is_empty()
            && key.len() <= 253
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && key != "."
            && !key.starts_with("..")
    }
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

    #[test]
    fn selector_names_and_keys_follow_the_api_servers_rules() {
        for ok in [
            "ledger",
            "reports-ledger",
            "a.b-c.d",
            "0db",
            &"a".repeat(253),
        ] {
            assert!(SecretKeySelector::valid_name(ok), "{ok}");
        }
        for bad in [
            "",
            "Ledger",
            "a_b",
            "-a",
            "a-",
            "a..b",
            ".a",
            "a.",
            &"a".repeat(254),
        ] {
            assert!(!SecretKeySelector::valid_name(bad), "{bad}");
        }
        for ok in [
            "url",
            "DATABASE_URL",
            "pg.url",
            "a-b_c.d",
            ".env",
            &"k".repeat(253),
        ] {
            assert!(SecretKeySelector::valid_key(ok), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "..data",
            "a/b",
            "a b",
            "ключ",
            &"k".repeat(254),
        ] {
            assert!(!SecretKeySelector::valid_key(bad), "{bad}");
        }
    }
}
