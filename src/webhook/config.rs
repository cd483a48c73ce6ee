//! `lifeguard webhook --config FILE`: injection settings (YAML). Unknown keys are an error
//! that names the key.
//!
//! ```yaml
//! sidecar:
//!   image: ghcr.io/lifeguard-dev/lifeguard:0.1.0     # required
//!   imagePullPolicy: IfNotPresent
//!   resources: {requests: {cpu: 50m, memory: 64Mi}, limits: {memory: 256Mi}}
//!   native: true                                     # init container with restartPolicy Always
//!   adminPort: 15020
//!   upstreamPort: 15080
//!   internalPort: 15021                              # the hop of policies with spec.ledger
//!   tokenExpirationSeconds: 600                      # 600..=3600
//!   dataSizeLimit: 256Mi
//! controlPlane:
//!   url: https://lifeguard-operator.lifeguard.svc:8443   # required
//!   caConfigMap: {name: lifeguard-ca, key: ca.crt}       # required
//! approverKeys: {secretName: lifeguard-approvers, key: approvers.jwks.json}
//! defaults:
//!   injectionRequired: false
//! ```

use std::path::Path;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::{Deserialize, Serialize};

pub use crate::api::SecretKeyRef;

/// The whole file.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookFileConfig {
    pub sidecar: SidecarSettings,
    pub control_plane: ControlPlaneSettings,
    /// Secret (in the webhook's namespace) with the approver JWKS that CapabilityException
    /// signatures must verify against; the same reference the operator takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approver_keys: Option<SecretKeyRef>,
    #[serde(default)]
    pub defaults: Defaults,
}

/// The injected container.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SidecarSettings {
    /// Image of the sidecar (the `lifeguard` image).
    pub image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Native sidecar (init container with `restartPolicy: Always`, Kubernetes 1.29+); false
    /// injects a regular container first in the list. Per pod:
    /// annotation `lifeguard.dev/native-sidecar`.
    #[serde(default = "default_true")]
    pub native: bool,
    /// The sidecar's admin port (`/live`, `/ready`, `/metrics`, rewritten probes).
    #[serde(default = "default_admin_port")]
    pub admin_port: u16,
    /// The loopback port the MCP container moves to (the first free port from here).
    #[serde(default = "default_upstream_port")]
    pub upstream_port: u16,
    /// The sidecar's internal hop (container port `lifeguard-hop`), injected only for pods
    /// whose policy sets `spec.ledger`: the other replicas' sidecars forward requests about
    /// tasks this replica's container owns to it (the first free port from here).
    #[serde(default = "default_internal_port")]
    pub internal_port: u16,
    /// Lifetime of the projected ServiceAccount token (kubelet refreshes it at 80 %).
    #[serde(default = "default_token_expiration")]
    pub token_expiration_seconds: i64,
    /// `sizeLimit` of the emptyDir holding the ledger and the last snapshot.
    #[serde(default = "default_data_size_limit")]
    pub data_size_limit: Quantity,
    /// Where injected sidecars export their traces (the chart's `otel.*` values); absent: they
    /// export nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otel: Option<OtelSettings>,
}

/// The OpenTelemetry settings given to every injected sidecar as the standard `OTEL_*`
/// variables (docs/operations.md, "Tracing").
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OtelSettings {
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`: the collector's base URL.
    pub endpoint: String,
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`: `grpc`, `http/protobuf` or `http/json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// `OTEL_TRACES_SAMPLER`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampler: Option<String>,
    /// `OTEL_TRACES_SAMPLER_ARG`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampler_arg: Option<String>,
}

impl OtelSettings {
    /// The variables an injected sidecar gets, in a fixed order.
    pub fn env(&self) -> Vec<(&'static str, &str)> {
        let mut env = vec![("OTEL_EXPORTER_OTLP_ENDPOINT", self.endpoint.as_str())];
        for (name, value) in [
            ("OTEL_EXPORTER_OTLP_PROTOCOL", &self.protocol),
            ("OTEL_TRACES_SAMPLER", &self.sampler),
            ("OTEL_TRACES_SAMPLER_ARG", &self.sampler_arg),
        ] {
            if let Some(value) = value {
                env.push((name, value.as_str()));
            }
        }
        env
    }

    /// The sidecar would refuse to start with these: the same check, at admission time.
    fn check(&self) -> Result<(), String> {
        let env = self.env();
        crate::telemetry::otel_config::from_env(
            |name| {
                env.iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| (*v).to_owned())
            },
            "lifeguard-sidecar",
        )
        .map(|_| ())
        .map_err(|e| format!("sidecar.otel: {e}"))
    }
}

/// `imagePullPolicy` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "Always",
            Self::IfNotPresent => "IfNotPresent",
            Self::Never => "Never",
        }
    }
}

/// Where injected sidecars find the operator.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ControlPlaneSettings {
    /// The operator's distribution endpoint, `https://HOST:PORT`.
    pub url: url::Url,
    /// The ConfigMap (kept in every opted-in namespace by the operator) with the CA that
    /// signed the operator's serving certificate.
    pub ca_config_map: ConfigMapKeyRef,
}

/// One key of a ConfigMap in the pod's namespace.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigMapKeyRef {
    pub name: String,
    pub key: String,
}

/// Defaults a policy can override.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Defaults {
    /// Deny selected pods that cannot be injected, unless the selecting policy sets
    /// `spec.injection.required` itself.
    #[serde(default)]
    pub injection_required: bool,
}

fn default_true() -> bool {
    true
}
fn default_admin_port() -> u16 {
    15020
}
fn default_upstream_port() -> u16 {
    15080
}
fn default_internal_port() -> u16 {
    15021
}
fn default_token_expiration() -> i64 {
    600
}
fn default_data_size_limit() -> Quantity {
    Quantity("256Mi".into())
}

/// The bounds the kubelet accepts for a projected token's lifetime, capped at one hour here:
/// a shorter token limits what a leaked one is worth.
pub const TOKEN_EXPIRATION_RANGE: std::ops::RangeInclusive<i64> = 600..=3600;

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

impl WebhookFileConfig {
    /// Parses the YAML text; errors name the offending key.
    pub fn parse(path: &str, text: &str) -> Result<Self, ConfigError> {
        let invalid = |message: String| ConfigError::Invalid {
            path: path.to_owned(),
            message,
        };
        let value: serde_json::Value =
            serde_saphyr::from_str(text).map_err(|e| invalid(e.to_string()))?;
        if value.is_null() {
            return Err(invalid(
                "the file is empty: sidecar.image and controlPlane are required".into(),
            ));
        }
        let config: Self = serde_path_to_error::deserialize(value).map_err(|e| {
            let at = e.path().to_string();
            invalid(if at == "." {
                e.inner().to_string()
            } else {
                format!("{at}: {}", e.inner())
            })
        })?;
        config.check().map_err(invalid)?;
        Ok(config)
    }

    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&path.display().to_string(), &text)
    }

    /// Rules serde cannot express.
    fn check(&self) -> Result<(), String> {
        let s = &self.sidecar;
        if s.image.trim().is_empty() {
            return Err("sidecar.image: must name an image".into());
        }
        if let Some(otel) = &s.otel {
            otel.check()?;
        }
        if !TOKEN_EXPIRATION_RANGE.contains(&s.token_expiration_seconds) {
            return Err(format!(
                "sidecar.tokenExpirationSeconds: {} is outside {}..={} (the kubelet refuses less than 600; more than an hour makes a leaked token worth more)",
                s.token_expiration_seconds,
                TOKEN_EXPIRATION_RANGE.start(),
                TOKEN_EXPIRATION_RANGE.end()
            ));
        }
        for (field, port) in [
            ("sidecar.adminPort", s.admin_port),
            ("sidecar.upstreamPort", s.upstream_port),
            ("sidecar.internalPort", s.internal_port),
        ] {
            if port == 0 {
                return Err(format!("{field}: must be a port number from 1 to 65535"));
            }
        }
        if s.admin_port == s.upstream_port {
            return Err("sidecar.adminPort and sidecar.upstreamPort must differ".into());
        }
        for (field, port) in [
            ("sidecar.adminPort", s.admin_port),
            ("sidecar.upstreamPort", s.upstream_port),
        ] {
            if s.internal_port == port {
                return Err(format!(
                    "sidecar.internalPort and {field} must differ (both are {port}): they share the pod's network namespace"
                ));
            }
        }
        let url = &self.control_plane.url;
        if url.scheme() != "https" || url.host_str().is_none() {
            return Err(format!(
                "controlPlane.url: `{url}` must be an https://HOST:PORT URL (the sidecar only talks TLS to the operator)"
            ));
        }
        let ca = &self.control_plane.ca_config_map;
        if ca.name.is_empty() || ca.key.is_empty() {
            return Err("controlPlane.caConfigMap: name and key must not be empty".into());
        }
        if ca.key.contains('/') || ca.key == ".." {
            return Err(format!(
                "controlPlane.caConfigMap.key: `{}` must be a plain file name (it is mounted as one)",
                ca.key
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "sidecar: {image: lifeguard:dev}\ncontrolPlane: {url: 'https://op.lifeguard.svc:8443', caConfigMap: {name: lifeguard-ca, key: ca.crt}}\n";

    fn parse(text: &str) -> Result<WebhookFileConfig, String> {
        WebhookFileConfig::parse("w.yaml", text).map_err(|e| e.to_string())
    }

    #[test]
    fn minimal_file_gets_the_documented_defaults() {
        let c = parse(MINIMAL).unwrap();
        assert!(c.sidecar.native);
        assert_eq!(c.sidecar.admin_port, 15020);
        assert_eq!(c.sidecar.upstream_port, 15080);
        assert_eq!(c.sidecar.internal_port, 15021);
        assert_eq!(c.sidecar.token_expiration_seconds, 600);
        assert_eq!(c.sidecar.data_size_limit, Quantity("256Mi".into()));
        assert!(!c.defaults.injection_required);
        assert!(c.approver_keys.is_none());
    }

    #[test]
    fn every_documented_key_parses() {
        let text = "sidecar:\n  image: ghcr.io/lifeguard-dev/lifeguard:0.1.0\n  imagePullPolicy: IfNotPresent\n  resources: {requests: {cpu: 50m, memory: 64Mi}, limits: {memory: 256Mi}}\n  native: false\n  adminPort: 15021\n  upstreamPort: 15081\n  internalPort: 15022\n  tokenExpirationSeconds: 3600\n  dataSizeLimit: 1Gi\ncontrolPlane:\n  url: https://lifeguard-operator.lifeguard.svc:8443\n  caConfigMap: {name: lifeguard-ca, key: ca.crt}\napproverKeys: {secretName: lifeguard-approvers, key: approvers.jwks.json}\ndefaults: {injectionRequired: true}\n";
        let c = parse(text).unwrap();
        assert!(!c.sidecar.native);
        assert_eq!(c.sidecar.image_pull_policy, Some(PullPolicy::IfNotPresent));
        assert_eq!(
            c.sidecar.resources.unwrap().requests.unwrap()["cpu"],
            Quantity("50m".into())
        );
        assert_eq!(c.approver_keys.unwrap().secret_name, "lifeguard-approvers");
        assert!(c.defaults.injection_required);
        assert_eq!(c.sidecar.token_expiration_seconds, 3600);
        assert_eq!(
            (
                c.sidecar.admin_port,
                c.sidecar.upstream_port,
                c.sidecar.internal_port
            ),
            (15021, 15081, 15022)
        );
    }

    #[test]
    fn unknown_keys_are_named() {
        for (text, key) in [
            (format!("{MINIMAL}extra: 1\n"), "extra"),
            (
                MINIMAL.replace("image: lifeguard:dev", "image: x, nativ: true"),
                "nativ",
            ),
            (
                format!("{MINIMAL}defaults: {{injectionRequire: true}}\n"),
                "injectionRequire",
            ),
            (
                MINIMAL.replace("key: ca.crt", "key: ca.crt, namespace: x"),
                "namespace",
            ),
        ] {
            let err = parse(&text).unwrap_err();
            assert!(err.contains(key), "{err} should name {key}");
        }
    }

    #[test]
    fn sidecar_trace_settings_are_checked_as_the_sidecar_would() {
        let with = |otel: &str| {
            MINIMAL.replace("image: lifeguard:dev", &format!("image: x, otel: {otel}"))
        };
        let c = parse(&with("{endpoint: 'http://otel-collector.observability:4317', protocol: grpc, sampler: parentbased_traceidratio, samplerArg: '0.1'}")).unwrap();
        assert_eq!(
            c.sidecar.otel.unwrap().env(),
            [
                (
                    "OTEL_EXPORTER_OTLP_ENDPOINT",
                    "http://otel-collector.observability:4317"
                ),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.1"),
            ]
        );
        assert!(parse(MINIMAL).unwrap().sidecar.otel.is_none());
        assert_eq!(
            parse(&with("{endpoint: 'http://c:4318', protocol: http/thrift}")).unwrap_err(),
            "w.yaml: sidecar.otel: OTEL_EXPORTER_OTLP_PROTOCOL=http/thrift: expected grpc, http/protobuf or http/json"
        );
        assert_eq!(
            parse(&with("{endpoint: 'collector:4317'}")).unwrap_err(),
            "w.yaml: sidecar.otel: OTEL_EXPORTER_OTLP_ENDPOINT=collector:4317: expected an http:// or https:// URL"
        );
    }

    #[test]
    fn bad_values_say_what_is_wrong() {
        for (text, needle) in [
            ("", "empty"),
            ("sidecar: {image: x}\n", "controlPlane"),
            (
                &MINIMAL.replace(
                    "image: lifeguard:dev",
                    "image: x, tokenExpirationSeconds: 7200",
                ),
                "tokenExpirationSeconds",
            ),
            (
                &MINIMAL.replace(
                    "image: lifeguard:dev",
                    "image: x, tokenExpirationSeconds: 60",
                ),
                "600",
            ),
            (&MINIMAL.replace("https://", "http://"), "controlPlane.url"),
            (
                &MINIMAL.replace("image: lifeguard:dev", "image: ' '"),
                "sidecar.image",
            ),
            (
                &MINIMAL.replace("image: lifeguard:dev", "image: x, adminPort: 15080"),
                "differ",
            ),
            (
                &MINIMAL.replace("image: lifeguard:dev", "image: x, internalPort: 15020"),
                "sidecar.internalPort and sidecar.adminPort must differ",
            ),
            (
                &MINIMAL.replace("image: lifeguard:dev", "image: x, internalPort: 15080"),
                "sidecar.internalPort and sidecar.upstreamPort must differ",
            ),
            (
                &MINIMAL.replace("image: lifeguard:dev", "image: x, internalPort: 0"),
                "sidecar.internalPort: must be a port number",
            ),
            (
                &MINIMAL.replace("image: lifeguard:dev", "image: x, internalPort: 70000"),
                "internalPort",
            ),
            (
                &MINIMAL.replace(
                    "image: lifeguard:dev",
                    "image: x, imagePullPolicy: Sometimes",
                ),
                "imagePullPolicy",
            ),
            (
                &MINIMAL.replace("key: ca.crt", "key: a/b"),
                "plain file name",
            ),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(needle), "{err} should mention {needle}");
        }
    }
}
