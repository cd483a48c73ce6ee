//! The container and volumes the webhook adds to a pod.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar,
    EnvVarSource, HTTPGetAction, KeyToPath, ObjectFieldSelector, Probe, ProjectedVolumeSource,
    SeccompProfile, SecurityContext, ServiceAccountTokenProjection, Volume, VolumeMount,
    VolumeProjection,
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
}

/// The sidecar container.
pub fn container(config: &WebhookFileConfig, plan: &SidecarPlan) -> Container {
    let s = &config.sidecar;
    let cp = &config.control_plane;
    let args = vec![
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
        "--ledger".to_owned(),
        format!("{DATA_DIR}/ledger.db"),
        "--log-format".to_owned(),
        "json".to_owned(),
    ];
    let mut env = vec![
        field_env("POD_NAMESPACE", "metadata.namespace"),
        field_env("POD_NAME", "metadata.name"),
    ];
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
    Container {
        name: SIDECAR_NAME.into(),
        image: Some(s.image.clone()),
        image_pull_policy: s.image_pull_policy.map(|p| p.as_str().to_owned()),
        args: Some(args),
        env: Some(env),
        ports: Some(vec![
            ContainerPort {
                name: Some(plan.port_name.clone()),
                container_port: plan.port_number,
                protocol: Some("TCP".into()),
                ..ContainerPort::default()
            },
            ContainerPort {
                name: Some(ADMIN_PORT_NAME.into()),
                container_port: i32::from(plan.admin_port),
                protocol: Some("TCP".into()),
                ..ContainerPort::default()
            },
        ]),
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

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    }
}
