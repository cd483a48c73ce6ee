//! The container and volumes the webhook adds to a pod.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar,
    EnvVarSource, HTTPGetAction, KeyToPath, ObjectFieldSelector, Probe, ProjectedVolumeSource,
    SeccompProfile, SecretKeySelector, SecurityContext, ServiceAccountTokenProjection, Volume,
    VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

use crate::webhook::config::WebhookFileConfig;

/// Name of the injected container.
pub const SIDECAR_NAME: &str = "lifeguard-sidecar";
/// Name of the sidecar's admin port.
pub const ADMIN_PORT_NAME: &str = "lifeguard-admin";
/// Env var telling the MCP container which loopback port to listen on.
pub const UPSTREAM_PORT_ENV: &str = "LIFEGUARD_UPSTREAM_PORT";
/// Env var carrying the probe checks the sidecar runs for rewritten probes.
pub const APP_PROBES_ENV: &str = "LIFEGUARD_APP_PROBES";
pub use crate::api::HOP_PORT_NAME;
/// Env var with the ledger location (`--ledger`), from the policy's Secret.
pub const LEDGER_ENV: &str = "LIFEGUARD_LEDGER";
/// Env var naming whose rows of a shared ledger are this server's (`--ledger-scope`).
pub const LEDGER_SCOPE_ENV: &str = "LIFEGUARD_LEDGER_SCOPE";
/// Env var with the address other replicas reach the hop at (`--internal-advertise`).
pub const INTERNAL_ADVERTISE_ENV: &str = "LIFEGUARD_INTERNAL_ADVERTISE";
/// Env var with the sidecar's `--upstream-http2`, from the pod's annotation.
pub const UPSTREAM_HTTP2_ENV: &str = "LIFEGUARD_UPSTREAM_HTTP2";
/// Env var with the sidecar's `--client-http2`, from the pod's annotation.
pub const CLIENT_HTTP2_ENV: &str = "LIFEGUARD_CLIENT_HTTP2";
/// Env var with the pod's IP (downward API), expanded into [`INTERNAL_ADVERTISE_ENV`].
pub const POD_IP_ENV: &str = "POD_IP";

pub const TOKEN_VOLUME: &str = "lifeguard-token";
pub const CA_VOLUME: &str = "lifeguard-ca";
pub const DATA_VOLUME: &str = "lifeguard-data";
pub const TOKEN_DIR: &str = "/var/run/secrets/lifeguard";
pub const CA_DIR: &str = "/var/run/lifeguard/ca";
pub const DATA_DIR: &str = "/var/lib/lifeguard";
/// Audience of the projected token; the operator's TokenReview asks for it.
pub const TOKEN_AUDIENCE: &str = "lifeguard";
/// The UID/GID the sidecar runs as (distroless `nonroot`).
pub const SIDECAR_UID: i64 = 65532;

/// What the sidecar needs to know about the pod it joins.
#[derive(Clone, Debug)]
pub struct SidecarPlan {
    /// The MCP port's name and number (the sidecar listens on it).
    pub port_name: String,
    pub port_number: i32,
    /// The loopback port the MCP container moves to.
    pub upstream_port: u16,
    /// The sidecar's admin port.
    pub admin_port: u16,
    /// Path of the MCP endpoint on the upstream.
    pub upstream_path: String,
    /// Checks for rewritten probes, keyed `<container>/<kind>` (empty: none).
    pub app_probes: BTreeMap<String, Value>,
    /// Native sidecar (init container with `restartPolicy: Always`).
    pub native: bool,
    /// The shared ledger and internal hop of a policy with `spec.ledger`; `None`: the
    /// embedded SQLite ledger on the data volume, no hop.
    pub shared_ledger: Option<SharedLedgerPlan>,
    /// `listen` or `always`: the MCP server speaks HTTP/2 cleartext (`--upstream-http2`);
    /// `None`: HTTP/1.1.
    pub upstream_http2: Option<&'static str>,
    /// Clients may speak HTTP/2 by prior knowledge to the sidecar (`--client-http2 on`).
    pub client_http2: bool,
}

/// Wiring for a policy with `spec.ledger.connectionSecretRef`.
#[derive(Clone, Debug)]
pub struct SharedLedgerPlan {
    /// The Secret (in the pod's namespace, which is the policy's) and its key holding the
    /// connection URL; the kubelet resolves it, the webhook never reads it.
    pub secret_name: String,
    pub secret_key: String,
    /// `<policy namespace>/<policy name>`: the server's rows in the shared database.
    pub scope: String,
    /// The internal hop's port.
    pub internal_port: u16,
}

/// The sidecar container.
pub fn container(config: &WebhookFileConfig, plan: &SidecarPlan) -> Container {
    let s = &config.sidecar;
    let cp = &config.control_plane;
    let mut args = vec![
        "sidecar".to_owned(),
        "--control-plane".to_owned(),
        cp.url.as_str().trim_end_matches('/').to_owned(),
        "--control-plane-ca".to_owned(),
        format!("{CA_DIR}/{}", cp.ca_config_map.key),
        "--token-file".to_owned(),
        format!("{TOKEN_DIR}/token"),
        "--upstream".to_owned(),
        format!(
            "http://127.0.0.1:{}{}",
            plan.upstream_port, plan.upstream_path
        ),
        "--listen".to_owned(),
        format!("0.0.0.0:{}", plan.port_number),
        "--admin".to_owned(),
        format!("0.0.0.0:{}", plan.admin_port),
    ];
    let mut env = vec![
        field_env("POD_NAMESPACE", "metadata.namespace"),
        field_env("POD_NAME", "metadata.name"),
    ];
    match &plan.shared_ledger {
        // The embedded SQLite ledger on the pod's data volume.
        None => args.extend(["--ledger".to_owned(), format!("{DATA_DIR}/ledger.db")]),
        // No `--ledger` argument: it would win over the env var that carries the Secret.
        Some(shared) => {
            args.extend([
                "--internal-listen".to_owned(),
                format!("0.0.0.0:{}", shared.internal_port),
                // The last policy snapshot, which lives beside an SQLite ledger otherwise.
                "--state-dir".to_owned(),
                DATA_DIR.to_owned(),
            ]);
            env.extend([
                field_env(POD_IP_ENV, "status.podIP"),
                EnvVar {
                    name: LEDGER_ENV.into(),
                    value_from: Some(EnvVarSource {
                        secret_key_ref: Some(SecretKeySelector {
                            name: shared.secret_name.clone(),
                            key: shared.secret_key.clone(),
                            optional: None,
                        }),
                        ..EnvVarSource::default()
                    }),
                    ..EnvVar::default()
                },
                literal_env(LEDGER_SCOPE_ENV, &shared.scope),
                // Dependent env var: the kubelet expands `$(POD_IP)`, declared above.
                literal_env(
                    INTERNAL_ADVERTISE_ENV,
                    &format!("$({POD_IP_ENV}):{}", shared.internal_port),
                ),
            ]);
        }
    }
    args.extend(["--log-format".to_owned(), "json".to_owned()]);
    if let Some(http2) = plan.upstream_http2 {
        env.push(literal_env(UPSTREAM_HTTP2_ENV, http2));
    }
    if plan.client_http2 {
        env.push(literal_env(CLIENT_HTTP2_ENV, "on"));
    }
    if let Some(otel) = &config.sidecar.otel {
        env.extend(
            otel.env()
                .into_iter()
                .map(|(name, value)| literal_env(name, value)),
        );
        // Which pod a span is from (dependent variables: POD_NAMESPACE and POD_NAME come first).
        env.push(literal_env(
            "OTEL_RESOURCE_ATTRIBUTES",
            "k8s.namespace.name=$(POD_NAMESPACE),k8s.pod.name=$(POD_NAME)",
        ));
    }
    if !plan.app_probes.is_empty() {
        env.push(EnvVar {
            name: APP_PROBES_ENV.into(),
            value: Some(
                serde_json::to_string(&plan.app_probes).expect("a map of JSON values serializes"),
            ),
            ..EnvVar::default()
        });
    }
    let admin_probe = |path: &str, period: i32, failures: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(i32::from(plan.admin_port)),
            scheme: Some("HTTP".into()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        timeout_seconds: Some(2),
        ..Probe::default()
    };
    let tcp_port = |name: &str, number: i32| ContainerPort {
        name: Some(name.into()),
        container_port: number,
        protocol: Some("TCP".into()),
        ..ContainerPort::default()
    };
    let mut ports = vec![
        tcp_port(&plan.port_name, plan.port_number),
        tcp_port(ADMIN_PORT_NAME, i32::from(plan.admin_port)),
    ];
    if let Some(shared) = &plan.shared_ledger {
        ports.push(tcp_port(HOP_PORT_NAME, i32::from(shared.internal_port)));
    }
    Container {
        name: SIDECAR_NAME.into(),
        image: Some(s.image.clone()),
        image_pull_policy: s.image_pull_policy.map(|p| p.as_str().to_owned()),
        args: Some(args),
        env: Some(env),
        ports: Some(ports),
        resources: s.resources.clone(),
        // The pod starts its MCP container only once the sidecar enforces a policy (native
        // sidecars hold the main containers until the startup probe passes): up to 5 minutes
        // for the first snapshot.
        startup_probe: Some(admin_probe("/ready", 1, 300)),
        readiness_probe: Some(admin_probe("/ready", 5, 3)),
        liveness_probe: Some(admin_probe("/live", 10, 3)),
        restart_policy: plan.native.then(|| "Always".to_owned()),
        security_context: Some(hardened_security_context()),
        volume_mounts: Some(vec![
            mount(TOKEN_VOLUME, TOKEN_DIR, true),
            mount(CA_VOLUME, CA_DIR, true),
            mount(DATA_VOLUME, DATA_DIR, false),
        ]),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Container::default()
    }
}

/// Non-root, read-only root filesystem, no privilege escalation, RuntimeDefault seccomp, no
/// capabilities: the sidecar needs none of them (it binds ports above 1024 and writes only
/// to its emptyDir).
pub fn hardened_security_context() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(SIDECAR_UID),
        run_as_group: Some(SIDECAR_UID),
        read_only_root_filesystem: Some(true),
        allow_privilege_escalation: Some(false),
        privileged: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        }),
        ..SecurityContext::default()
    }
}

/// The projected token, the control-plane CA and the data directory.
pub fn volumes(config: &WebhookFileConfig) -> Vec<Volume> {
    let ca = &config.control_plane.ca_config_map;
    vec![
        Volume {
            name: TOKEN_VOLUME.into(),
            projected: Some(ProjectedVolumeSource {
                sources: Some(vec![VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        audience: Some(TOKEN_AUDIENCE.into()),
                        expiration_seconds: Some(config.sidecar.token_expiration_seconds),
                        path: "token".into(),
                    }),
                    ..VolumeProjection::default()
                }]),
                default_mode: None,
            }),
            ..Volume::default()
        },
        Volume {
            name: CA_VOLUME.into(),
            config_map: Some(ConfigMapVolumeSource {
                name: ca.name.clone(),
                items: Some(vec![KeyToPath {
                    key: ca.key.clone(),
                    path: ca.key.clone(),
                    mode: None,
                }]),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        },
        Volume {
            name: DATA_VOLUME.into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: None,
                size_limit: Some(config.sidecar.data_size_limit.clone()),
            }),
            ..Volume::default()
        },
    ]
}

fn field_env(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field_path.into(),
                api_version: None,
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

fn literal_env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..EnvVar::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    }
}
