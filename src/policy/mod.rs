//! The policy compiler: Lifeguard objects in, one [`EffectivePolicy`] per MCP server out.
//!
//! Pure: no Kubernetes client, no filesystem, no clock. The same code serves the operator, the
//! admission webhook's validation, the sidecar's standalone mode and `lifeguard policy check`.

pub mod check;
pub mod compile;
pub mod compile_rate_limits;
pub mod diff;
pub mod effective;
pub mod jws_shape;
pub mod locate;
pub mod manifest;
pub mod problem;
pub mod rate_limits;
pub mod selection;
pub mod uri_pattern;
pub mod validate;
pub mod validate_pop;

#[cfg(test)]
mod compile_tests;

pub use check::{
    CheckReport, Finding, ManifestFile, StandaloneError, check_files, document_findings,
    load_standalone,
};
pub use compile::{Compilation, CompileInput, ObjectKind, ObjectProblem, ObjectRef, compile};
pub use effective::*;
pub use problem::{Problem, Severity};
pub use uri_pattern::{PatternIdentity, UriPattern};
pub use validate::CompileMode;

/// Policies for unit tests elsewhere in the crate.
#[cfg(test)]
pub(crate) mod testing {
    use super::{EffectivePolicy, load_standalone};

    /// A minimal valid McpServerPolicy whose `spec.tasks` is `tasks_yaml` (indented by four
    /// spaces, one field per line), compiled.
    pub fn with_tasks(tasks_yaml: &str) -> EffectivePolicy {
        let yaml = format!(
            "apiVersion: lifeguard.dev/v1alpha1
kind: McpServerPolicy
metadata: {{name: reports, namespace: team-a}}
spec:
  selector: {{matchLabels: {{app: reports}}}}
  resource: https://mcp.example.com/mcp
  identity:
    issuers:
      - issuer: https://idp.example.com
        audiences: [https://mcp.example.com/mcp]
        jwksUri: https://idp.example.com/jwks
  tasks:
{tasks_yaml}"
        );
        match load_standalone("test.yaml", &yaml, jiff::Timestamp::now()) {
            Ok((policy, _)) => policy,
            Err(e) => panic!("test policy does not compile: {e}\n{yaml}"),
        }
    }
}
