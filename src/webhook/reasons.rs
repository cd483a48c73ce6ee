//! Why a pod was not injected: one enum, used as the metric label, the value of the
//! `lifeguard.dev/injection-skipped` annotation and the text of the admission warning.

/// Why the webhook left a pod without a sidecar.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SkipReason {
    /// `spec.hostNetwork: true`: the sidecar cannot take over a port of the node's network.
    HostNetwork,
    /// Pod label or annotation `lifeguard.dev/inject=disabled`.
    OptedOut,
    /// Neither the namespace nor the pod carries `lifeguard.dev/inject=enabled`.
    NotOptedIn,
    /// No McpServerPolicy in the namespace selects the pod.
    NoPolicy,
    /// No container declares the MCP port by name (`mcp`, or annotation `lifeguard.dev/port`).
    NoNamedPort,
    /// A probe on the MCP port cannot be carried through the sidecar (HTTPS, a `host`, gRPC).
    UnsupportedProbe,
    /// The pod already carries the sidecar (`lifeguard.dev/status`); a second pass is a no-op.
    AlreadyInjected,
    /// kube-system, kube-public, kube-node-lease or the webhook's own namespace.
    SystemNamespace,
    /// A pod of Lifeguard itself (`app.kubernetes.io/part-of=lifeguard`).
    LifeguardComponent,
}

impl SkipReason {
    pub const ALL: [Self; 9] = [
        Self::HostNetwork,
        Self::OptedOut,
        Self::NotOptedIn,
        Self::NoPolicy,
        Self::NoNamedPort,
        Self::UnsupportedProbe,
        Self::AlreadyInjected,
        Self::SystemNamespace,
        Self::LifeguardComponent,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::HostNetwork => "HostNetwork",
            Self::OptedOut => "OptedOut",
            Self::NotOptedIn => "NotOptedIn",
            Self::NoPolicy => "NoPolicy",
            Self::NoNamedPort => "NoNamedPort",
            Self::UnsupportedProbe => "UnsupportedProbe",
            Self::AlreadyInjected => "AlreadyInjected",
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
            Self::NoPolicy => "no McpServerPolicy in the namespace selects the pod",
            Self::NoNamedPort => {
                "no container declares the MCP port by name (default `mcp`, or annotation lifeguard.dev/port)"
            }
            Self::UnsupportedProbe => {
                "a probe on the MCP port cannot be carried through the sidecar (HTTPS, a host, or gRPC)"
            }
            Self::AlreadyInjected => "the pod already carries the Lifeguard sidecar",
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
