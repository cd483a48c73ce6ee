//! `lifeguard operator --config FILE`: the operator's configuration file (YAML). Every key is
//! optional; unknown keys are an error that names the key.
//!
//! ```yaml
//! approverKeys: {secretName: lifeguard-approvers, key: approvers.jwks.json}
//! securityEvents: {...}            # see operator::ssf::config
//! bypassPrevention:
//!   networkPolicy: optIn           # disabled (default) | optIn | all
//!   sidecarPorts: [mcp]            # ports (names or numbers) the NetworkPolicy admits
//! caDistribution:                  # the CA ConfigMap injected sidecars mount
//!   secretName: lifeguard-operator-tls
//!   secretKey: ca.crt
//!   configMap: {name: lifeguard-ca, key: ca.crt}
//! ```

use std::path::Path;

use serde::{Deserialize, Serialize};

pub use super::ssf::config::{SecretKeyRef, SecurityEventsConfig};

/// The whole file.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperatorFileConfig {
    /// Secret (in the operator's namespace) holding the approver JWKS that CapabilityException
    /// signatures must verify against; same format as `lifeguard sidecar --approver-keys`.
    #[serde(default)]
    pub approver_keys: Option<SecretKeyRef>,
    /// Security-event transmitters (SSF/CAEP/RISC).
    #[serde(default)]
    pub security_events: Option<SecurityEventsConfig>,
    #[serde(default)]
    pub bypass_prevention: BypassPrevention,
    /// Copy the CA that signed the operator's serving certificate into a ConfigMap in every
    /// namespace whose pods get a sidecar (see `operator::ca_distribution`).
    #[serde(default)]
    pub ca_distribution: Option<CaDistribution>,
}

/// Where the operator's CA comes from (a Secret in the operator's namespace) and the
/// ConfigMap it is copied to in every opted-in namespace.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CaDistribution {
    /// Secret in the operator's namespace that holds the CA (e.g. the serving certificate's
    /// Secret, whose `ca.crt` cert-manager and the chart fill in).
    pub secret_name: String,
    /// Key of that Secret holding the PEM CA bundle (default `ca.crt`).
    #[serde(default = "default_ca_key")]
    pub secret_key: String,
    /// The ConfigMap written in each namespace (default `{name: lifeguard-ca, key: ca.crt}`).
    #[serde(default)]
    pub config_map: ConfigMapKeyRef,
}

/// A ConfigMap name and one key of its `data`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigMapKeyRef {
    pub name: String,
    pub key: String,
}

impl Default for ConfigMapKeyRef {
    fn default() -> Self {
        Self {
            name: "lifeguard-ca".into(),
            key: default_ca_key(),
        }
    }
}

fn default_ca_key() -> String {
    "ca.crt".into()
}

impl CaDistribution {
    /// Names the API server would refuse, refused here with the field's path.
    fn validate(&self) -> Result<(), String> {
        for (field, value) in [
            ("secretName", &self.secret_name),
            ("configMap.name", &self.config_map.name),
        ] {
            if !is_dns_subdomain(value) {
                return Err(format!(
                    "caDistribution.{field}: {value:?} is not a valid object name (lowercase \
                     letters, digits, '-' and '.', at most 253 characters)"
                ));
            }
        }
        for (field, value) in [
            ("secretKey", &self.secret_key),
            ("configMap.key", &self.config_map.key),
        ] {
            if !is_data_key(value) {
                return Err(format!(
                    "caDistribution.{field}: {value:?} is not a valid data key (letters, \
                     digits, '-', '_' and '.', at most 253 characters)"
                ));
            }
        }
        Ok(())
    }
}

/// RFC 1123 subdomain: what Kubernetes accepts as a Secret or ConfigMap name.
fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// A key of a Secret's or ConfigMap's `data`.
fn is_data_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 253
        && key != "."
        && key != ".."
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// When the operator writes a NetworkPolicy per McpServerPolicy that admits traffic to the
/// selected pods only on the sidecar's ports.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BypassPrevention {
    #[serde(default)]
    pub network_policy: NetworkPolicyMode,
    /// Ports of the selected pods that stay reachable: the sidecar's MCP port (and its admin
    /// port if Prometheus scrapes it). Names resolve against the pod's container ports.
    #[serde(default = "default_ports")]
    pub sidecar_ports: Vec<PortRef>,
}

impl Default for BypassPrevention {
    fn default() -> Self {
        Self {
            network_policy: NetworkPolicyMode::default(),
            sidecar_ports: default_ports(),
        }
    }
}

fn default_ports() -> Vec<PortRef> {
    vec![PortRef::Name("mcp".into())]
}

/// A port by name or number.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum PortRef {
    Number(u16),
    Name(String),
}

/// Which policies get a NetworkPolicy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum NetworkPolicyMode {
    /// None (the default: a NetworkPolicy changes who can reach a workload, so it is opt-in).
    #[default]
    Disabled,
    /// Policies annotated `lifeguard.dev/bypass-prevention: enabled`.
    OptIn,
    /// Every McpServerPolicy.
    All,
}

/// Annotation that opts one McpServerPolicy into a NetworkPolicy (mode `optIn`).
pub const BYPASS_PREVENTION_ANNOTATION: &str = "lifeguard.dev/bypass-prevention";

/// Why the file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
}

impl OperatorFileConfig {
    /// Parses the YAML text; errors name the offending key.
    pub fn parse(path: &str, text: &str) -> Result<Self, ConfigError> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        let value: serde_json::Value =
            serde_saphyr::from_str(text).map_err(|e| ConfigError::Invalid {
                path: path.to_owned(),
                message: e.to_string(),
            })?;
        let config: Self = serde_path_to_error::deserialize(value).map_err(|e| {
            let at = e.path().to_string();
            ConfigError::Invalid {
                path: path.to_owned(),
                message: if at == "." {
                    e.inner().to_string()
                } else {
                    format!("{at}: {}", e.inner())
                },
            }
        })?;
        if let Some(events) = &config.security_events {
            events.validate().map_err(|e| ConfigError::Invalid {
                path: path.to_owned(),
                message: format!("securityEvents: {e}"),
            })?;
        }
        if let Some(ca) = &config.ca_distribution {
            ca.validate().map_err(|message| ConfigError::Invalid {
                path: path.to_owned(),
                message,
            })?;
        }
        Ok(config)
    }

    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&path.display().to_string(), &text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_named() {
        let err = OperatorFileConfig::parse("c.yaml", "approverKey: {secretName: a, key: b}\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("approverKey"), "{err}");
        let err = OperatorFileConfig::parse(
            "c.yaml",
            "approverKeys: {secretName: a, key: b, namespace: x}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("approverKeys") && err.contains("namespace"),
            "{err}"
        );
    }

    #[test]
    fn the_example_configuration_parses() {
        let c = OperatorFileConfig::parse(
            "examples/operator/operator.yaml",
            include_str!("../../examples/operator/operator.yaml"),
        )
        .unwrap();
        assert_eq!(c.security_events.unwrap().transmitters.len(), 2);
        assert_eq!(c.bypass_prevention.network_policy, NetworkPolicyMode::OptIn);
    }

    #[test]
    fn a_poll_field_on_a_push_transmitter_is_refused_with_its_path() {
        let err = OperatorFileConfig::parse(
            "c.yaml",
            "securityEvents:\n  audience: https://a\n  transmitters:\n    - {issuer: https://i, jwksUri: https://i/jwks, delivery: push, pollInterval: 5s}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("transmitters[0]") && err.contains("pollInterval"),
            "{err}"
        );
    }

    #[test]
    fn the_documented_keys_parse() {
        let c = OperatorFileConfig::parse(
            "c.yaml",
            "approverKeys: {secretName: lifeguard-approvers, key: approvers.jwks.json}\nbypassPrevention: {networkPolicy: optIn, sidecarPorts: [mcp, 9090]}\n",
        )
        .unwrap();
        assert_eq!(c.approver_keys.unwrap().secret_name, "lifeguard-approvers");
        assert_eq!(c.bypass_prevention.network_policy, NetworkPolicyMode::OptIn);
        assert_eq!(
            c.bypass_prevention.sidecar_ports,
            vec![PortRef::Name("mcp".into()), PortRef::Number(9090)]
        );
        assert_eq!(
            OperatorFileConfig::parse("c.yaml", "").unwrap(),
            OperatorFileConfig::default()
        );
    }

    #[test]
    fn ca_distribution_parses_with_its_defaults() {
        let c = OperatorFileConfig::parse(
            "c.yaml",
            "caDistribution:\n  secretName: lifeguard-operator-tls\n  secretKey: ca.crt\n  configMap: {name: lifeguard-ca, key: ca.crt}\n",
        )
        .unwrap();
        let ca = c.ca_distribution.unwrap();
        assert_eq!(ca.secret_name, "lifeguard-operator-tls");
        assert_eq!(ca.config_map, ConfigMapKeyRef::default());
        let short =
            OperatorFileConfig::parse("c.yaml", "caDistribution: {secretName: tls}\n").unwrap();
        assert_eq!(
            short.ca_distribution.unwrap(),
            CaDistribution {
                secret_name: "tls".into(),
                secret_key: "ca.crt".into(),
                config_map: ConfigMapKeyRef {
                    name: "lifeguard-ca".into(),
                    key: "ca.crt".into()
                },
            }
        );
        assert!(
            OperatorFileConfig::parse("c.yaml", "")
                .unwrap()
                .ca_distribution
                .is_none()
        );
    }

    #[test]
    fn ca_distribution_refuses_unknown_keys_missing_secret_and_bad_names() {
        let cases = [
            (
                "caDistribution: {secretName: tls, configMap: {name: ca, key: ca.crt, namespace: x}}\n",
                &["caDistribution.configMap", "namespace"][..],
            ),
            (
                "caDistribution: {secretName: tls, secretKeys: ca.crt}\n",
                &["caDistribution", "secretKeys"][..],
            ),
            (
                "caDistribution: {configMap: {name: ca, key: ca.crt}}\n",
                &["caDistribution", "secretName"][..],
            ),
            (
                "caDistribution: {secretName: Lifeguard_TLS}\n",
                &["caDistribution.secretName", "Lifeguard_TLS"][..],
            ),
            (
                "caDistribution: {secretName: tls, configMap: {name: ca, key: \"ca/crt\"}}\n",
                &["caDistribution.configMap.key", "ca/crt"][..],
            ),
            (
                "caDistribution: {secretName: tls, secretKey: \"..\"}\n",
                &["caDistribution.secretKey"][..],
            ),
        ];
        for (text, expected) in cases {
            let err = OperatorFileConfig::parse("c.yaml", text)
                .unwrap_err()
                .to_string();
            for part in expected {
                assert!(err.contains(part), "{text}: {err} lacks {part}");
            }
        }
    }
}
