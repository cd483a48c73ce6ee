//! `/inject`: whether a pod gets the sidecar, and the pod after injection.
//!
//! [`decide`] is pure: the pod as the API server sent it (raw JSON, so fields this build does
//! not know survive untouched), the namespace's labels and policies from the watch caches, and
//! the configuration. The patch is the JSON diff of the pod before and after.

pub mod port;
pub mod probes;
pub mod sidecar;
pub mod verify;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::api::McpServerPolicy;
use crate::policy::selection;
use crate::webhook::config::WebhookFileConfig;
use crate::webhook::opt_in::opt_in;
use crate::webhook::reasons::SkipReason;

use port::{McpPort, mcp_port, port_name};
use probes::MovedPort;
use sidecar::{SharedLedgerPlan, SidecarPlan, UPSTREAM_PORT_ENV};

/// Annotation written on injected pods (JSON, see [`InjectionStatus`]).
pub const STATUS_ANNOTATION: &str = "lifeguard.dev/status";
/// Annotation written on pods left without a sidecar: the [`SkipReason`].
pub const SKIPPED_ANNOTATION: &str = "lifeguard.dev/injection-skipped";
/// Annotation naming the MCP port (default [`DEFAULT_PORT_NAME`]).
pub const PORT_ANNOTATION: &str = "lifeguard.dev/port";
/// Annotation with the path of the MCP endpoint on the upstream (default `/mcp`).
pub const UPSTREAM_PATH_ANNOTATION: &str = "lifeguard.dev/upstream-path";
/// Annotation overriding `sidecar.native` for one pod (`"true"` or `"false"`).
pub const NATIVE_ANNOTATION: &str = "lifeguard.dev/native-sidecar";
/// Pod annotation: `listen` or `always` when the MCP server speaks HTTP/2 without an upgrade
/// (the sidecar's `--upstream-http2`); any other value leaves the default, HTTP/1.1.
pub const UPSTREAM_HTTP2_ANNOTATION: &str = "lifeguard.dev/upstream-http2";
/// Pod annotation: `on` lets the pod's clients speak HTTP/2 by prior knowledge to the sidecar
/// (its `--client-http2`); any other value leaves the default, HTTP/1.1 only.
pub const CLIENT_HTTP2_ANNOTATION: &str = "lifeguard.dev/client-http2";
/// Label that marks Lifeguard's own pods, which are never mutated.
pub const PART_OF_LABEL: &str = "app.kubernetes.io/part-of";
pub const PART_OF_VALUE: &str = "lifeguard";
pub const DEFAULT_PORT_NAME: &str = "mcp";
pub const DEFAULT_UPSTREAM_PATH: &str = "/mcp";
/// Namespaces whose pods are never mutated, besides the webhook's own.
pub const SYSTEM_NAMESPACES: [&str; 3] = ["kube-system", "kube-public", "kube-node-lease"];

/// What the webhook knows when a pod arrives.
pub struct Candidate<'a> {
    /// The pod as sent in `request.object`.
    pub pod: &'a Value,
    /// `request.namespace` (the pod's own `metadata.namespace` may be empty at CREATE).
    pub namespace: &'a str,
    /// Labels of that namespace (`None` when the cache does not have it).
    pub namespace_labels: Option<&'a BTreeMap<String, String>>,
    /// The McpServerPolicies of that namespace.
    pub policies: &'a [&'a McpServerPolicy],
    /// The webhook's own namespace.
    pub own_namespace: &'a str,
    pub config: &'a WebhookFileConfig,
}

/// The outcome for one pod.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// The pod after injection.
    Inject { pod: Value, policy: String },
    /// Left alone; reported reasons add the skip annotation.
    Skip(SkipReason),
    /// Refused: the governing policy requires injection and the pod cannot take it.
    Deny { reason: SkipReason, policy: String },
}

/// `lifeguard.dev/status`: stable for a given input (no timestamp), so a dry run and the
/// real request produce the same patch.
#[derive(Debug, Serialize)]
pub struct InjectionStatus<'a> {
    pub version: &'a str,
    pub policy: &'a str,
    pub native: bool,
    pub port: &'a str,
}

/// The sidecar version written into the status annotation.
pub const SIDECAR_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Decides what happens to the pod.
pub fn decide(c: &Candidate<'_>) -> Result<Decision, String> {
    let pod: Pod = serde_json::from_value(c.pod.clone())
        .map_err(|e| format!("request.object is not a valid Pod: {e}"))?;
    let meta = &pod.metadata;
    if SYSTEM_NAMESPACES.contains(&c.namespace) || c.namespace == c.own_namespace {
        return Ok(Decision::Skip(SkipReason::SystemNamespace));
    }
    let label = |key: &str| {
        meta.labels
            .as_ref()
            .and_then(|l| l.get(key))
            .map(String::as_str)
    };
    let governing = selection::governing(
        c.policies.iter().copied(),
        c.namespace,
        meta.labels.as_ref(),
    );
    // The label is the pod's own claim: it spares the pod no more than a required policy allows.
    let component = if label(PART_OF_LABEL) == Some(PART_OF_VALUE) {
        Err(SkipReason::LifeguardComponent)
    } else {
        Ok(())
    };
    let outcome = component
        .and_then(|()| {
            opt_in(
                meta.labels.as_ref(),
                meta.annotations.as_ref(),
                c.namespace_labels,
            )
        })
        .and_then(|_| {
            let spec = pod.spec.as_ref();
            if spec.and_then(|s| s.host_network) == Some(true) {
                return Err(SkipReason::HostNetwork);
            }
            if spec.and_then(|s| s.share_process_namespace) == Some(true)
                || spec.and_then(|s| s.host_pid) == Some(true)
            {
                return Err(SkipReason::SharedProcessNamespace);
            }
            let policy = governing.ok_or(SkipReason::NoPolicy)?;
            if verify::carries_marks(&pod) {
                // Proven by re-deriving the sidecar, never by the status annotation.
                return match verify::proof(c, &pod, policy) {
                    Ok(()) => Ok(Decision::Skip(SkipReason::AlreadyInjected)),
                    Err(_) => Err(SkipReason::ForeignSidecar),
                };
            }
            injected(c, &pod, policy)
        });
    match outcome {
        Ok(decision) => Ok(decision),
        Err(reason) => Ok(match governing {
            Some(policy) if required(policy, c.config) => Decision::Deny {
                reason,
                policy: policy.metadata.name.clone().unwrap_or_default(),
            },
            _ => Decision::Skip(reason),
        }),
    }
}

/// Whether a policy refuses pods it cannot protect.
fn required(policy: &McpServerPolicy, config: &WebhookFileConfig) -> bool {
    policy
        .spec
        .injection
        .as_ref()
        .and_then(|i| i.required)
        .unwrap_or(config.defaults.injection_required)
}

/// Whether the sidecar is a native one: annotation `lifeguard.dev/native-sidecar`, else
/// `sidecar.native`.
fn native(annotations: Option<&BTreeMap<String, String>>, config: &WebhookFileConfig) -> bool {
    match annotations
        .and_then(|a| a.get(NATIVE_ANNOTATION))
        .map(String::as_str)
    {
        Some("true") => true,
        Some("false") => false,
        _ => config.sidecar.native,
    }
}

/// The value of `lifeguard.dev/status`.
fn status_json(policy: &str, native: bool, port: &str) -> String {
    serde_json::to_string(&InjectionStatus {
        version: SIDECAR_VERSION,
        policy,
        native,
        port,
    })
    .expect("the status serializes")
}

/// The sidecar's plan for a pod whose MCP port is `port_name`/`port_number` and whose
/// containers (the sidecar aside, the MCP port included) declare the ports `used`; the probe
/// table is left empty.
fn plan(
    c: &Candidate<'_>,
    annotations: Option<&BTreeMap<String, String>>,
    policy: &McpServerPolicy,
    port_name: &str,
    port_number: i32,
    used: &[i64],
    native: bool,
) -> SidecarPlan {
    let annotation = |key: &str| annotations.and_then(|a| a.get(key)).map(String::as_str);
    let admin_port = first_free(c.config.sidecar.admin_port, used, &[]);
    let upstream_port = first_free(c.config.sidecar.upstream_port, used, &[admin_port]);
    let shared_ledger = policy.spec.ledger.as_ref().map(|ledger| SharedLedgerPlan {
        secret_name: ledger.connection_secret_ref.name.clone(),
        secret_key: ledger.connection_secret_ref.key.clone(),
        scope: format!(
            "{}/{}",
            policy.metadata.namespace.as_deref().unwrap_or(c.namespace),
            policy.metadata.name.as_deref().unwrap_or_default()
        ),
        internal_port: first_free(
            c.config.sidecar.internal_port,
            used,
            &[admin_port, upstream_port],
        ),
    });
    SidecarPlan {
        port_name: port_name.to_owned(),
        port_number,
        upstream_port,
        admin_port,
        upstream_path: annotation(UPSTREAM_PATH_ANNOTATION)
            .filter(|p| p.starts_with('/'))
            .unwrap_or(DEFAULT_UPSTREAM_PATH)
            .to_owned(),
        app_probes: BTreeMap::new(),
        native,
        shared_ledger,
        upstream_http2: match annotation(UPSTREAM_HTTP2_ANNOTATION) {
            Some("listen") => Some("listen"),
            Some("always") => Some("always"),
            _ => None,
        },
        client_http2: annotation(CLIENT_HTTP2_ANNOTATION) == Some("on"),
    }
}

/// The pod with the sidecar, or why it cannot have one.
fn injected(
    c: &Candidate<'_>,
    pod: &Pod,
    policy: &McpServerPolicy,
) -> Result<Decision, SkipReason> {
    let annotations = pod.metadata.annotations.as_ref();
    let spec = pod.spec.as_ref().ok_or(SkipReason::NoNamedPort)?;
    let McpPort {
        name: port_name,
        number: port_number,
        container: index,
    } = mcp_port(spec, port_name(annotations))?;
    // Only the MCP container is told the upstream port: another container carrying it would
    // make this injection's own output unprovable (verify.rs) and mislead whoever reads the pod.
    let told_elsewhere = spec
        .containers
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != index)
        .map(|(_, c)| c)
        .chain(spec.init_containers.iter().flatten())
        .any(|c| c.env.iter().flatten().any(|e| e.name == UPSTREAM_PORT_ENV));
    if told_elsewhere {
        return Err(SkipReason::ForeignSidecar);
    }
    let used: Vec<i64> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| c.ports.iter().flatten())
        .map(|p| i64::from(p.container_port))
        .collect();
    let native = native(annotations, c.config);
    let mut plan = plan(
        c,
        annotations,
        policy,
        &port_name,
        port_number,
        &used,
        native,
    );
    let moved = MovedPort {
        name: port_name.clone(),
        number: i64::from(port_number),
    };

    let mut after = c.pod.clone();
    let containers = after
        .pointer_mut("/spec/containers")
        .and_then(Value::as_array_mut)
        .ok_or(SkipReason::NoNamedPort)?;
    let mcp = &mut containers[index];
    plan.app_probes = probes::rewrite(mcp, &moved, plan.upstream_port, plan.admin_port)?;
    move_port_out(mcp, &port_name);
    set_env(mcp, UPSTREAM_PORT_ENV, &plan.upstream_port.to_string());

    let container =
        serde_json::to_value(sidecar::container(c.config, &plan)).expect("a Container serializes");
    let list = if native {
        "initContainers"
    } else {
        "containers"
    };
    push(&mut after, &["spec", list], container);
    for volume in sidecar::volumes(c.config) {
        push(
            &mut after,
            &["spec", "volumes"],
            serde_json::to_value(volume).expect("a Volume serializes"),
        );
    }
    let policy_name = policy.metadata.name.clone().unwrap_or_default();
    let annotations = object_at(&mut after, &["metadata", "annotations"]);
    annotations.remove(SKIPPED_ANNOTATION);
    annotations.insert(
        STATUS_ANNOTATION.into(),
        Value::String(status_json(&policy_name, native, &port_name)),
    );
    Ok(Decision::Inject {
        pod: after,
        policy: policy_name,
    })
}

/// The pod with the skip annotation (reported reasons only), and without a status
/// annotation: a pod left without a (proven) sidecar never claims to have one.
pub fn annotated_skip(pod: &Value, reason: SkipReason) -> Value {
    let mut after = pod.clone();
    if reason.is_reported() {
        let annotations = object_at(&mut after, &["metadata", "annotations"]);
        annotations.remove(STATUS_ANNOTATION);
        annotations.insert(
            SKIPPED_ANNOTATION.into(),
            Value::String(reason.as_str().into()),
        );
    }
    after
}

/// The first port from `start` that no container declares and that is not in `taken`.
fn first_free(start: u16, used: &[i64], taken: &[u16]) -> u16 {
    (start..=u16::MAX)
        .find(|p| !used.contains(&i64::from(*p)) && !taken.contains(p))
        .unwrap_or(start)
}

/// Removes the MCP port from the container: the sidecar declares it now, so the Service's
/// named `targetPort` resolves to the sidecar.
fn move_port_out(container: &mut Value, port_name: &str) {
    let Some(ports) = container.get_mut("ports").and_then(Value::as_array_mut) else {
        return;
    };
    ports.retain(|p| p.get("name").and_then(Value::as_str) != Some(port_name));
    if ports.is_empty() {
        container
            .as_object_mut()
            .expect("a container is an object")
            .remove("ports");
    }
}

/// Sets (or replaces) one literal env var.
fn set_env(container: &mut Value, name: &str, value: &str) {
    let entry = json!({"name": name, "value": value});
    let object = container.as_object_mut().expect("a container is an object");
    let env = object
        .entry("env")
        .or_insert_with(|| Value::Array(Vec::new()));
    if !env.is_array() {
        *env = Value::Array(Vec::new());
    }
    let list = env.as_array_mut().expect("just made an array");
    list.retain(|e| e.get("name").and_then(Value::as_str) != Some(name));
    list.push(entry);
}

/// Appends to the array at `path`, creating it (and parents) when absent.
fn push(root: &mut Value, path: &[&str], item: Value) {
    let (last, parents) = path.split_last().expect("a non-empty path");
    let parent = object_at(root, parents);
    let slot = parent
        .entry((*last).to_owned())
        .or_insert_with(|| Value::Array(Vec::new()));
    if !slot.is_array() {
        *slot = Value::Array(Vec::new());
    }
    slot.as_array_mut().expect("just made an array").push(item);
}

/// The object at `path`, creating objects along the way.
fn object_at<'v>(root: &'v mut Value, path: &[&str]) -> &'v mut Map<String, Value> {
    let mut node = root;
    for key in path {
        if !node.is_object() {
            *node = Value::Object(Map::new());
        }
        node = node
            .as_object_mut()
            .expect("just made an object")
            .entry((*key).to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        if node.is_null() {
            *node = Value::Object(Map::new());
        }
    }
    if !node.is_object() {
        *node = Value::Object(Map::new());
    }
    node.as_object_mut().expect("just made an object")
}
