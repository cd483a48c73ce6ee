//! Probes of the MCP container on the port the sidecar takes over.
//!
//! After injection the MCP container listens on a loopback port the kubelet cannot reach, so an
//! `httpGet` or `tcpSocket` probe on the moved port is rewritten to an `httpGet` on the
//! sidecar's admin port, `/app-health/<container>/<livez|readyz|startupz>`; the sidecar runs the
//! original check against 127.0.0.1 and answers with its outcome (the table it needs travels in
//! `LIFEGUARD_APP_PROBES`). Timings and thresholds stay as they were. A probe that cannot be
//! carried that way (HTTPS, a `host`, gRPC) makes the pod uninjectable (`UnsupportedProbe`).
//! Probes on other ports and `exec` probes are left alone.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::webhook::reasons::SkipReason;

/// The port the sidecar takes over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MovedPort {
    pub name: String,
    pub number: i64,
}

/// The probe fields of a container and the path segment the sidecar serves each one under.
pub const PROBE_KINDS: [(&str, &str); 3] = [
    ("livenessProbe", "livez"),
    ("readinessProbe", "readyz"),
    ("startupProbe", "startupz"),
];

/// Admin-port path of a rewritten probe.
pub fn app_health_path(container: &str, kind: &str) -> String {
    format!("/app-health/{container}/{kind}")
}

/// Rewrites the probes of `container` (a core/v1 Container as JSON) that target `moved`, and
/// returns the checks the sidecar must run for them, keyed `<container>/<kind>`.
pub fn rewrite(
    container: &mut Value,
    moved: &MovedPort,
    upstream_port: u16,
    admin_port: u16,
) -> Result<BTreeMap<String, Value>, SkipReason> {
    let name = container
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let mut checks = BTreeMap::new();
    for (field, kind) in PROBE_KINDS {
        let Some(probe) = container.get_mut(field).and_then(Value::as_object_mut) else {
            continue;
        };
        let Some(check) = carried_check(probe, moved, upstream_port)? else {
            continue;
        };
        probe.remove("httpGet");
        probe.remove("tcpSocket");
        probe.insert(
            "httpGet".into(),
            json!({
                "path": app_health_path(&name, kind),
                "port": admin_port,
                "scheme": "HTTP",
            }),
        );
        checks.insert(format!("{name}/{kind}"), check);
    }
    Ok(checks)
}

/// The check the sidecar runs for one probe, or `None` when the probe does not involve the
/// moved port.
fn carried_check(
    probe: &Map<String, Value>,
    moved: &MovedPort,
    upstream_port: u16,
) -> Result<Option<Value>, SkipReason> {
    if let Some(http) = probe.get("httpGet") {
        if !targets(http.get("port"), moved) {
            return Ok(None);
        }
        let host = http.get("host").and_then(Value::as_str).unwrap_or_default();
        let scheme = http.get("scheme").and_then(Value::as_str).unwrap_or("HTTP");
        if !host.is_empty() || !scheme.eq_ignore_ascii_case("HTTP") {
            return Err(SkipReason::UnsupportedProbe);
        }
        let mut check = Map::new();
        check.insert(
            "path".into(),
            http.get("path").cloned().unwrap_or_else(|| json!("/")),
        );
        check.insert("port".into(), json!(upstream_port));
        check.insert("scheme".into(), json!("HTTP"));
        if let Some(headers) = http.get("httpHeaders").filter(|h| !is_empty_array(h)) {
            check.insert("httpHeaders".into(), headers.clone());
        }
        return Ok(Some(json!({ "httpGet": check })));
    }
    if let Some(tcp) = probe.get("tcpSocket") {
        if !targets(tcp.get("port"), moved) {
            return Ok(None);
        }
        if !tcp
            .get("host")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .is_empty()
        {
            return Err(SkipReason::UnsupportedProbe);
        }
        return Ok(Some(json!({ "tcpSocket": { "port": upstream_port } })));
    }
    if let Some(grpc) = probe.get("grpc")
        && targets(grpc.get("port"), moved)
    {
        return Err(SkipReason::UnsupportedProbe);
    }
    Ok(None)
}

/// Whether a probe's `port` (a number or a port name) is the moved port.
fn targets(port: Option<&Value>, moved: &MovedPort) -> bool {
    match port {
        Some(Value::Number(n)) => n.as_i64() == Some(moved.number),
        Some(Value::String(s)) => {
            *s == moved.name || s.parse::<i64>().is_ok_and(|n| n == moved.number)
        }
        _ => false,
    }
}

fn is_empty_array(v: &Value) -> bool {
    v.as_array().is_some_and(Vec::is_empty)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn moved() -> MovedPort {
        MovedPort {
            name: "mcp".into(),
            number: 8080,
        }
    }

    fn rewrite_of(container: Value) -> (Value, Result<BTreeMap<String, Value>, SkipReason>) {
        let mut c = container;
        let r = rewrite(&mut c, &moved(), 15080, 15020);
        (c, r)
    }

    #[test]
    fn http_probes_on_the_moved_port_go_through_the_admin_port() {
        let (c, checks) = rewrite_of(json!({
            "name": "reports",
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": "mcp", "httpHeaders": [{"name": "X-Probe", "value": "1"}]}, "periodSeconds": 7},
            "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080, "scheme": "HTTP"}, "failureThreshold": 2},
        }));
        let checks = checks.unwrap();
        assert_eq!(
            c["livenessProbe"],
            json!({"httpGet": {"path": "/app-health/reports/livez", "port": 15020, "scheme": "HTTP"}, "periodSeconds": 7})
        );
        assert_eq!(
            c["readinessProbe"],
            json!({"httpGet": {"path": "/app-health/reports/readyz", "port": 15020, "scheme": "HTTP"}, "failureThreshold": 2})
        );
        assert_eq!(
            checks["reports/livez"],
            json!({"httpGet": {"path": "/healthz", "port": 15080, "scheme": "HTTP", "httpHeaders": [{"name": "X-Probe", "value": "1"}]}})
        );
        assert_eq!(
            checks["reports/readyz"],
            json!({"httpGet": {"path": "/ready", "port": 15080, "scheme": "HTTP"}})
        );
    }

    #[test]
    fn tcp_probes_become_http_checks_of_a_tcp_connect() {
        let (c, checks) = rewrite_of(json!({
            "name": "reports",
            "startupProbe": {"tcpSocket": {"port": "mcp"}, "failureThreshold": 30},
        }));
        assert_eq!(
            c["startupProbe"],
            json!({"httpGet": {"path": "/app-health/reports/startupz", "port": 15020, "scheme": "HTTP"}, "failureThreshold": 30})
        );
        assert_eq!(
            checks.unwrap()["reports/startupz"],
            json!({"tcpSocket": {"port": 15080}})
        );
    }

    #[test]
    fn probes_elsewhere_are_left_alone() {
        let original = json!({
            "name": "reports",
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": 9090}},
            "readinessProbe": {"exec": {"command": ["true"]}},
            "startupProbe": {"grpc": {"port": 9091}},
        });
        let (c, checks) = rewrite_of(original.clone());
        assert_eq!(c, original);
        assert!(checks.unwrap().is_empty());
    }

    #[test]
    fn probes_the_sidecar_cannot_carry_make_the_pod_uninjectable() {
        for probe in [
            json!({"httpGet": {"path": "/", "port": "mcp", "scheme": "HTTPS"}}),
            json!({"httpGet": {"path": "/", "port": 8080, "host": "10.0.0.1"}}),
            json!({"tcpSocket": {"port": "mcp", "host": "example.com"}}),
            json!({"grpc": {"port": 8080}}),
        ] {
            let (_, r) = rewrite_of(json!({"name": "reports", "livenessProbe": probe}));
            assert_eq!(r, Err(SkipReason::UnsupportedProbe), "{probe}");
        }
    }
}
