//! "Already injected" is proven, never claimed.
//!
//! A pod that carries any of Lifeguard's marks (a `lifeguard-sidecar` container, a `lifeguard-*`
//! volume, a mount of one, a port named like the sidecar's) may have been injected by this
//! webhook (a reinvocation, a pod copied from a running injected pod), or may be dressed up to
//! look so. [`proof`] re-derives the sidecar this webhook would inject for the pod, from the
//! pod, its governing policy and the configuration, and compares it with what the pod carries:
//! the container (image, args, env, ports, probes, security context, mounts, placement), the
//! volumes, the taken-over port (declared by the sidecar only), the MCP container told the
//! upstream port, the rewritten probes, and the status annotation. The comparison tolerates
//! only what the API server fills in by itself (defaults such as `terminationMessagePath`, and
//! the ServiceAccount token mount added to every container of a copied pod). Anything else
//! makes the pod [`SkipReason::ForeignSidecar`]: not injected, and refused by a required policy.
//!
//! The status annotation alone is no mark: a pod with only the annotation is injected afresh
//! (the annotation is overwritten) and a skipped pod loses it.
//!
//! [`SkipReason::ForeignSidecar`]: crate::webhook::reasons::SkipReason::ForeignSidecar

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::{Value, json};

use crate::api::McpServerPolicy;

use super::port::port_name;
use super::probes::{PROBE_KINDS, app_health_path};
use super::sidecar::{
    self, ADMIN_PORT_NAME, APP_PROBES_ENV, CA_VOLUME, DATA_VOLUME, HOP_PORT_NAME, SIDECAR_NAME,
    TOKEN_VOLUME, UPSTREAM_PORT_ENV,
};
use super::{Candidate, DEFAULT_PORT_NAME, STATUS_ANNOTATION, native, plan, status_json};

/// The volumes the webhook adds.
const VOLUMES: [&str; 3] = [TOKEN_VOLUME, CA_VOLUME, DATA_VOLUME];
/// Where the ServiceAccount admission plugin mounts the API token into every container.
const SERVICE_ACCOUNT_MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Whether the pod carries any name the webhook injects (the status annotation is not one).
pub fn carries_marks(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    let ephemeral = spec.ephemeral_containers.iter().flatten();
    containers.clone().any(|c| c.name == SIDECAR_NAME)
        || ephemeral.clone().any(|c| c.name == SIDECAR_NAME)
        || spec
            .volumes
            .iter()
            .flatten()
            .any(|v| VOLUMES.contains(&v.name.as_str()))
        || containers.clone().any(mounts_lifeguard_volume)
        || ephemeral.clone().any(|c| {
            c.volume_mounts
                .iter()
                .flatten()
                .any(|m| VOLUMES.contains(&m.name.as_str()))
        })
        || containers.flat_map(|c| c.ports.iter().flatten()).any(|p| {
            matches!(
                p.name.as_deref(),
                Some(ADMIN_PORT_NAME) | Some(HOP_PORT_NAME)
            )
        })
}

fn mounts_lifeguard_volume(c: &Container) -> bool {
    c.volume_mounts
        .iter()
        .flatten()
        .any(|m| VOLUMES.contains(&m.name.as_str()))
        || c.volume_devices
            .iter()
            .flatten()
            .any(|d| VOLUMES.contains(&d.name.as_str()))
}

/// `Ok` when the pod carries exactly the sidecar this webhook would inject for it under
/// `policy`; otherwise what differs (for logs and tests).
pub fn proof(c: &Candidate<'_>, pod: &Pod, policy: &McpServerPolicy) -> Result<(), String> {
    let spec = pod.spec.as_ref().ok_or("the pod has no spec")?;
    if spec.ephemeral_containers.iter().flatten().any(|e| {
        e.name == SIDECAR_NAME
            || e.volume_mounts
                .iter()
                .flatten()
                .any(|m| VOLUMES.contains(&m.name.as_str()))
    }) {
        return Err(
            "an ephemeral container is named like the sidecar or mounts its volumes".into(),
        );
    }
    let positions = |list: &[Container]| -> Vec<usize> {
        list.iter()
            .enumerate()
            .filter(|(_, c)| c.name == SIDECAR_NAME)
            .map(|(i, _)| i)
            .collect()
    };
    let init = spec.init_containers.as_deref().unwrap_or_default();
    let (is_native, list, index) = match (
        positions(&spec.containers).as_slice(),
        positions(init).as_slice(),
    ) {
        ([i], []) => (false, "containers", *i),
        ([], [i]) => (true, "initContainers", *i),
        _ => return Err(format!("not exactly one {SIDECAR_NAME} container")),
    };
    let raw_sidecar = &c.pod["spec"][list][index];
    let typed_sidecar = if is_native {
        &init[index]
    } else {
        &spec.containers[index]
    };
    let annotations = pod.metadata.annotations.as_ref();
    if is_native != native(annotations, c.config) {
        return Err("the sidecar is not where this webhook puts it (native or not)".into());
    }

    // The taken-over port: declared by the sidecar, by nobody else.
    let name = port_name(annotations);
    let number = typed_sidecar
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(name))
        .map(|p| p.container_port)
        .ok_or_else(|| format!("the sidecar does not declare the MCP port `{name}`"))?;
    // Every container but the sidecar: (in `spec.containers`, raw JSON, typed).
    let others: Vec<(bool, &Value, &Container)> = spec
        .containers
        .iter()
        .enumerate()
        .map(|(i, t)| (true, &c.pod["spec"]["containers"][i], t))
        .chain(
            init.iter()
                .enumerate()
                .map(|(i, t)| (false, &c.pod["spec"]["initContainers"][i], t)),
        )
        .filter(|(_, _, t)| t.name != SIDECAR_NAME)
        .collect();
    let other_ports = || others.iter().flat_map(|(_, _, t)| t.ports.iter().flatten());
    if other_ports().any(|p| {
        p.name.as_deref() == Some(name)
            || p.container_port == number
            || matches!(
                p.name.as_deref(),
                Some(ADMIN_PORT_NAME) | Some(HOP_PORT_NAME)
            )
            || (name != DEFAULT_PORT_NAME && p.name.as_deref() == Some(DEFAULT_PORT_NAME))
    }) {
        return Err("another container declares the MCP port or a sidecar port".into());
    }
    if others.iter().any(|(_, _, t)| mounts_lifeguard_volume(t)) {
        return Err("another container mounts the sidecar's volumes".into());
    }
    let used: Vec<i64> = other_ports()
        .map(|p| i64::from(p.container_port))
        .chain([i64::from(number)])
        .collect();
    let mut plan = plan(c, annotations, policy, name, number, &used, is_native);

    // The MCP container: the one container told the upstream port, literally.
    let told: Vec<(bool, &Value, &Value)> = others
        .iter()
        .filter_map(|(main, raw, _)| Some((*main, *raw, env_entry(raw, UPSTREAM_PORT_ENV)?)))
        .collect();
    let upstream = json!({"name": UPSTREAM_PORT_ENV, "value": plan.upstream_port.to_string()});
    let mcp = match told.as_slice() {
        [(true, raw, entry)] if **entry == upstream => *raw,
        _ => return Err(format!("not exactly one container told {upstream}")),
    };
    plan.app_probes = app_probes(raw_sidecar, mcp, plan.admin_port, plan.upstream_port)?;

    let expected =
        serde_json::to_value(sidecar::container(c.config, &plan)).expect("a Container serializes");
    if !same(&expected, &without_service_account_mount(raw_sidecar)) {
        return Err("the sidecar container differs from the one this webhook injects".into());
    }
    let volumes = c.pod["spec"]["volumes"].as_array().map(Vec::as_slice);
    for volume in sidecar::volumes(c.config) {
        let expected = serde_json::to_value(&volume).expect("a Volume serializes");
        let found: Vec<&Value> = volumes
            .unwrap_or_default()
            .iter()
            .filter(|v| v["name"] == expected["name"])
            .collect();
        if !matches!(found.as_slice(), [one] if same(&expected, one)) {
            return Err(format!("volume {} differs", volume.name));
        }
    }
    let status = annotations.and_then(|a| a.get(STATUS_ANNOTATION));
    let expected_status = status_json(
        policy.metadata.name.as_deref().unwrap_or_default(),
        is_native,
        name,
    );
    let status_matches = status
        .and_then(|s| serde_json::from_str::<Value>(s).ok())
        .is_some_and(|s| Some(s) == serde_json::from_str::<Value>(&expected_status).ok());
    if !status_matches {
        return Err(format!("{STATUS_ANNOTATION} is not {expected_status}"));
    }
    Ok(())
}

/// The env entry `name` of a raw container.
fn env_entry<'v>(container: &'v Value, name: &str) -> Option<&'v Value> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
}

/// The probe table the sidecar carries, checked against the MCP container's rewritten probes:
/// every entry is one of the MCP container's probes, now pointing at the admin port, and its
/// check reaches only the upstream port over plain HTTP or TCP.
fn app_probes(
    sidecar: &Value,
    mcp: &Value,
    admin_port: u16,
    upstream_port: u16,
) -> Result<BTreeMap<String, Value>, String> {
    let Some(entry) = env_entry(sidecar, APP_PROBES_ENV) else {
        return Ok(BTreeMap::new());
    };
    let table: BTreeMap<String, Value> = entry["value"]
        .as_str()
        .and_then(|v| serde_json::from_str(v).ok())
        .ok_or_else(|| format!("{APP_PROBES_ENV} is not a probe table"))?;
    let container = mcp["name"].as_str().unwrap_or_default();
    for (key, check) in &table {
        let rewritten = PROBE_KINDS.iter().any(|(field, kind)| {
            *key == format!("{container}/{kind}")
                && same(
                    &json!({"path": app_health_path(container, kind), "port": admin_port, "scheme": "HTTP"}),
                    &mcp[*field]["httpGet"],
                )
        });
        let upstream_only = match check {
            Value::Object(o) if o.len() == 1 => {
                let http = &check["httpGet"];
                (http["port"] == upstream_port
                    && http["scheme"] == "HTTP"
                    && http["path"].is_string()
                    && http.as_object().is_some_and(|h| {
                        h.keys().all(|k| {
                            ["path", "port", "scheme", "httpHeaders"].contains(&k.as_str())
                        })
                    }))
                    || check["tcpSocket"] == json!({"port": upstream_port})
            }
            _ => false,
        };
        if !rewritten || !upstream_only {
            return Err(format!(
                "{APP_PROBES_ENV} entry {key} is not this webhook's"
            ));
        }
    }
    Ok(table)
}

/// The container without the ServiceAccount token mount the API server adds to every container
/// of a pod created with one (a copied pod's sidecar gets it on creation).
fn without_service_account_mount(container: &Value) -> Value {
    let mut out = container.clone();
    if let Some(mounts) = out.get_mut("volumeMounts").and_then(Value::as_array_mut) {
        mounts.retain(|m| m["mountPath"] != SERVICE_ACCOUNT_MOUNT || m["readOnly"] != true);
    }
    out
}

/// Whether `actual` is `expected`, up to fields the API server sets by default.
fn same(expected: &Value, actual: &Value) -> bool {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            e.iter().all(|(k, v)| a.get(k).is_some_and(|x| same(v, x)))
                && a.iter().all(|(k, v)| e.contains_key(k) || defaulted(k, v))
        }
        (Value::Array(e), Value::Array(a)) => {
            e.len() == a.len() && e.iter().zip(a).all(|(e, a)| same(e, a))
        }
        _ => expected == actual,
    }
}

/// A field the API server adds with its default value.
fn defaulted(key: &str, value: &Value) -> bool {
    match key {
        "terminationMessagePath" => value == "/dev/termination-log",
        "successThreshold" => value == 1,
        // fieldRef.apiVersion
        "apiVersion" => value == "v1",
        // configMap and projected volumes
        "defaultMode" => value == 420,
        "imagePullPolicy" => value == "Always" || value == "IfNotPresent",
        "resources" => value == &json!({}),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_of_the_api_server_are_tolerated_and_nothing_else() {
        let expected = json!({"name": "x", "env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}], "livenessProbe": {"periodSeconds": 1}});
        let defaulted = json!({"name": "x", "terminationMessagePath": "/dev/termination-log", "env": [{"name": "A", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}}], "livenessProbe": {"periodSeconds": 1, "successThreshold": 1}});
        assert!(same(&expected, &defaulted));
        for changed in [
            json!({"name": "x", "command": ["sh"], "env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}], "livenessProbe": {"periodSeconds": 1}}),
            json!({"name": "x", "env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}, {"name": "B", "value": "1"}], "livenessProbe": {"periodSeconds": 1}}),
            json!({"name": "x", "env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}], "livenessProbe": {"periodSeconds": 1, "successThreshold": 2}}),
            json!({"name": "x", "terminationMessagePath": "/tmp/x", "env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}], "livenessProbe": {"periodSeconds": 1}}),
        ] {
            assert!(!same(&expected, &changed), "{changed}");
        }
    }

    #[test]
    fn only_the_read_only_service_account_mount_is_ignored() {
        let c = json!({"volumeMounts": [
            {"name": "lifeguard-token", "mountPath": "/var/run/secrets/lifeguard", "readOnly": true},
            {"name": "kube-api-access-x", "mountPath": SERVICE_ACCOUNT_MOUNT, "readOnly": true},
            {"name": "evil", "mountPath": SERVICE_ACCOUNT_MOUNT},
        ]});
        assert_eq!(
            without_service_account_mount(&c)["volumeMounts"],
            json!([
                {"name": "lifeguard-token", "mountPath": "/var/run/secrets/lifeguard", "readOnly": true},
                {"name": "evil", "mountPath": SERVICE_ACCOUNT_MOUNT},
            ])
        );
    }
}
