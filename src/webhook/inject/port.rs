//! Which port the sidecar takes over, and which container is the MCP server.
//!
//! The MCP server is, by definition, the one container of `spec.containers` that declares the
//! MCP port: the TCP port named `mcp`, or the name in annotation `lifeguard.dev/port`. The
//! sidecar takes that port over, so the port must be the MCP server's alone; otherwise the pod
//! is refused ([`SkipReason::AmbiguousPort`]) rather than injected with the real port exposed:
//!
//! - the annotation names another port while some container declares `mcp` (a decoy: the
//!   sidecar would take over the decoy and leave `mcp` reaching the server directly);
//! - another port entry of the pod (any container, init container, protocol) carries the same
//!   name (a Service's named `targetPort` could resolve to either) or the same number;
//! - the port has a `hostPort` (the node's port would be dropped with the entry; the sidecar
//!   does not take a node port over).
//!
//! A port named so only in an init container, or only over UDP/SCTP, is no MCP port
//! ([`SkipReason::NoNamedPort`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ContainerPort, PodSpec};

use crate::webhook::reasons::SkipReason;

use super::{DEFAULT_PORT_NAME, PORT_ANNOTATION};

/// The port the sidecar takes over and the MCP container that declared it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McpPort {
    pub name: String,
    pub number: i32,
    /// Index of the MCP container in `spec.containers`.
    pub container: usize,
}

/// The MCP port's name: annotation `lifeguard.dev/port`, else `mcp`.
pub fn port_name(annotations: Option<&BTreeMap<String, String>>) -> &str {
    annotations
        .and_then(|a| a.get(PORT_ANNOTATION))
        .map_or(DEFAULT_PORT_NAME, String::as_str)
}

/// Every port entry of the pod: (in `spec.containers`, container index, port).
fn entries(spec: &PodSpec) -> impl Iterator<Item = (bool, usize, &ContainerPort)> {
    let main = spec
        .containers
        .iter()
        .enumerate()
        .flat_map(|(i, c)| c.ports.iter().flatten().map(move |p| (true, i, p)));
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .enumerate()
        .flat_map(|(i, c)| c.ports.iter().flatten().map(move |p| (false, i, p)));
    main.chain(init)
}

/// Finds the MCP port of a pod not yet injected, applying the rules of the module comment.
pub fn mcp_port(spec: &PodSpec, name: &str) -> Result<McpPort, SkipReason> {
    let named: Vec<_> = entries(spec)
        .filter(|(_, _, p)| p.name.as_deref() == Some(name))
        .collect();
    let &(main, container, port) = match named.as_slice() {
        [] => return Err(SkipReason::NoNamedPort),
        [one] => one,
        _ => return Err(SkipReason::AmbiguousPort),
    };
    if !main || port.protocol.as_deref().unwrap_or("TCP") != "TCP" {
        return Err(SkipReason::NoNamedPort);
    }
    let decoy = name != DEFAULT_PORT_NAME
        && entries(spec).any(|(_, _, p)| p.name.as_deref() == Some(DEFAULT_PORT_NAME));
    let same_number = entries(spec)
        .filter(|(_, _, p)| p.container_port == port.container_port)
        .count()
        > 1;
    let host_port = port.host_port.is_some_and(|h| h != 0);
    if decoy || same_number || host_port {
        return Err(SkipReason::AmbiguousPort);
    }
    Ok(McpPort {
        name: name.to_owned(),
        number: port.container_port,
        container,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn spec(value: Value) -> PodSpec {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn the_mcp_container_is_the_one_declaring_the_named_port() {
        let s = spec(json!({"containers": [
            {"name": "shipper", "ports": [{"name": "metrics", "containerPort": 9100}]},
            {"name": "server", "ports": [{"name": "http", "containerPort": 3000}, {"name": "mcp", "containerPort": 8080}]},
        ]}));
        assert_eq!(
            mcp_port(&s, "mcp"),
            Ok(McpPort {
                name: "mcp".into(),
                number: 8080,
                container: 1
            })
        );
        let renamed = spec(json!({"containers": [
            {"name": "server", "ports": [{"name": "http", "containerPort": 3000}]},
        ]}));
        assert_eq!(mcp_port(&renamed, "http").map(|p| p.number), Ok(3000));
    }

    #[test]
    fn ports_that_are_not_the_servers_alone_are_refused() {
        use SkipReason::*;
        for (containers, init, name, expected) in [
            // The annotation names a decoy while the server declares `mcp`.
            (
                json!([{"name": "server", "ports": [{"name": "mcp", "containerPort": 8080}]},
                       {"name": "decoy", "ports": [{"name": "metrics", "containerPort": 9100}]}]),
                json!([]),
                "metrics",
                Err(AmbiguousPort),
            ),
            // Even a second port of the server itself.
            (
                json!([{"name": "server", "ports": [{"name": "mcp", "containerPort": 8080}, {"name": "alt", "containerPort": 8081}]}]),
                json!([]),
                "alt",
                Err(AmbiguousPort),
            ),
            // Two containers declare the name.
            (
                json!([{"name": "decoy", "ports": [{"name": "mcp", "containerPort": 9000}]},
                       {"name": "server", "ports": [{"name": "mcp", "containerPort": 8080}]}]),
                json!([]),
                "mcp",
                Err(AmbiguousPort),
            ),
            // An init container declares it too.
            (
                json!([{"name": "server", "ports": [{"name": "mcp", "containerPort": 8080}]}]),
                json!([{"name": "helper", "ports": [{"name": "mcp", "containerPort": 9000}]}]),
                "mcp",
                Err(AmbiguousPort),
            ),
            // The same number under another name.
            (
                json!([{"name": "server", "ports": [{"name": "mcp", "containerPort": 8080}, {"name": "direct", "containerPort": 8080, "hostPort": 30080}]}]),
                json!([]),
                "mcp",
                Err(AmbiguousPort),
            ),
            // A hostPort on the MCP port.
            (
                json!([{"name": "server", "ports": [{"name": "mcp", "containerPort": 8080, "hostPort": 8080}]}]),
                json!([]),
                "mcp",
                Err(AmbiguousPort),
            ),
            // Only an init container, or only UDP: no MCP port.
            (
                json!([{"name": "server"}]),
                json!([{"name": "helper", "ports": [{"name": "mcp", "containerPort": 9000}]}]),
                "mcp",
                Err(NoNamedPort),
            ),
            (
                json!([{"name": "server", "ports": [{"name": "mcp", "containerPort": 8080, "protocol": "UDP"}]}]),
                json!([]),
                "mcp",
                Err(NoNamedPort),
            ),
            (
                json!([{"name": "server"}]),
                json!([]),
                "mcp",
                Err(NoNamedPort),
            ),
        ] {
            let s = spec(json!({"containers": containers, "initContainers": init}));
            assert_eq!(
                mcp_port(&s, name).map(|p| p.number),
                expected,
                "{containers} {init} {name}"
            );
        }
    }
}
