//! Why a pod was not injected: one enum, used as the metric label, the value of the
//! `lifeguard.dev/injection-skipped` annotation and the text of the admission warning.

/// Why the webhook left a pod without a sidecar.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SkipReason {
    /// `spec.hostNetwork: true`: the sidecar cannot take over a port of the node's network.
    HostNetwork,
    /// `spec.shareProcessNamespace: true` or `spec.hostPID: true`: other processes running as
    /// the sidecar's UID could read its token, its ledger and its environment through
    /// `/proc/<pid>/root` and `/proc/<pid>/environ`.
    SharedProcessNamespace,
    /// Pod label or annotation `lifeguard.dev/inject=disabled`.
    OptedOut,
    /// Neither the namespace nor the pod carries `lifeguard.dev/inject=enabled`.
    NotOptedIn,
    /// No McpServerPolicy in the namespace selects the pod.
    NoPolicy,
    /// No container declares the MCP port by name (`mcp`, or annotation `lifeguard.dev/port`).
    NoNamedPort,
    /// The MCP port is not the MCP server's alone: the annotation `lifeguard.dev/port` names
    /// another port while a container declares `mcp`, another port entry of the pod carries
    /// the same name or number, or the port has a `hostPort`.
    AmbiguousPort,
    /// A probe on the MCP port cannot be carried through the sidecar (HTTPS, a `host`, gRPC).
    UnsupportedProbe,
    /// The pod carries exactly the sidecar this webhook would inject for it (re-derived and
    /// compared, never taken from `lifeguard.dev/status`); a second pass is a no-op.
    AlreadyInjected,
    /// The pod carries Lifeguard's marks (a `lifeguard-sidecar` container, a `lifeguard-*`
    /// volume, volume mount or port) that are not the sidecar this webhook would inject, or
    /// a container other than the MCP server's already carries `LIFEGUARD_UPSTREAM_PORT`.
    ForeignSidecar,
    /// kube-system, kube-public, kube-node-lease or the webhook's own namespace.
    SystemNamespace,
    /// A pod of Lifeguard itself (`app.kubernetes.io/part-of=lifeguard`).
    LifeguardComponent,
}

impl SkipReason {
    pub const ALL: [Self; 12] = [
        Self::HostNetwork,
        Self::SharedProcessNamespace,
        Self::OptedOut,
        Self::NotOptedIn,
        Self::NoPolicy,
        Self::NoNamedPort,
        Self::AmbiguousPort,
        Self::UnsupportedProbe,
        Self::AlreadyInjected,
        Self::ForeignSidecar,
        Self::SystemNamespace,
        Self::LifeguardComponent,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::HostNetwork => "HostNetwork",
            Self::SharedProcessNamespace => "SharedProcessNamespace",
            Self::OptedOut => "OptedOut",
            Self::NotOptedIn => "NotOptedIn",
            Self::NoPolicy => "NoPolicy",
            Self::NoNamedPort => "NoNamedPort",
            Self::AmbiguousPort => "AmbiguousPort",
            Self::UnsupportedProbe => "UnsupportedProbe",
            Self::AlreadyInjected => "AlreadyInjected",
            Self::ForeignSidecar => "ForeignSidecar",
            Self::SystemNamespace => "SystemNamespace",
            Self::LifeguardComponent => "LifeguardComponent",
        }
    }

    /// Whether the pod is told: annotation `lifeguard.dev/injection-skipped` and an admission
    /// warning. Pods that were never candidates (system namespaces, Lifeguard's own pods) and
    /// pods already injected get an empty patch and no warning.
    pub fn is_reported(self) -> bool {
        !matches!(
            self,
            Self::AlreadyInjected | Self::SystemNamespace | Self::LifeguardComponent
        )
    }

    /// One line for the admission warning and the denial message.
    pub fn explanation(self) -> &'static str {
        match self {
            Self::HostNetwork => {
                "the pod uses the host network, so the sidecar cannot take over its MCP port"
            }
            Self::OptedOut => "the pod opted out with lifeguard.dev/inject=disabled",
            Self::NotOptedIn => {
                "neither the namespace nor the pod is labelled lifeguard.dev/inject=enabled"
            }
            Self::SharedProcessNamespace => {
                "the pod shares a process namespace (shareProcessNamespace or hostPID), so other containers could read the sidecar's token and ledger through /proc"
            }
            Self::NoPolicy => "no McpServerPolicy in the namespace selects the pod",
            Self::NoNamedPort => {
                "no container declares the MCP port by name (default `mcp`, or annotation lifeguard.dev/port)"
            }
            Self::AmbiguousPort => {
                "the MCP port is not the MCP server's alone (lifeguard.dev/port names another port while a container declares `mcp`, another port of the pod has the same name or number, or the port has a hostPort)"
            }
            Self::UnsupportedProbe => {
                "a probe on the MCP port cannot be carried through the sidecar (HTTPS, a host, or gRPC)"
            }
            Self::AlreadyInjected => "the pod already carries the Lifeguard sidecar",
            Self::ForeignSidecar => {
                "the pod carries Lifeguard's sidecar names (container, volume, volume mount, port, or LIFEGUARD_UPSTREAM_PORT outside the MCP container) but not the sidecar this webhook injects"
            }
            Self::SystemNamespace => "the namespace is a system namespace or Lifeguard's own",
            Self::LifeguardComponent => "the pod is part of Lifeguard",
        }
    }
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
