//! Custom resource types of the `lifeguard.dev/v1alpha1` API.
//!
//! The Rust types are the single source of truth: `lifeguard crdgen` derives the CRD YAML in
//! `crds/` from them (a test fails when the committed YAML drifts), the `///` comments become
//! `kubectl explain` text, and the CEL rules declared here are evaluated both by the API server
//! and, client-side, by `lifeguard policy check`.

pub mod conditions;
pub mod duration;
pub mod exception;
pub mod revocation;
pub mod rules;
pub mod server_policy;

pub use duration::PolicyDuration;
pub use exception::{
    CapabilityException, CapabilityExceptionSpec, CapabilityExceptionStatus, ExceptionCapability,
    ExceptionLimits, ExceptionState, PolicyRef, PrincipalRef,
};
pub use revocation::{
    PrincipalRevocation, PrincipalRevocationSpec, PrincipalRevocationStatus, RevocationReason,
    RevocationSource, RevocationSourceKind,
};
pub use server_policy::{
    AuditSink, AuditSpec, CapabilitiesSpec, CapabilityMode, ClaimNames, ConcurrencySpec,
    DeadlineSpec, IdempotencySpec, IdentitySpec, IssuerSpec, JwsAlgorithm, ListenNotification,
    ListenSpec, McpServerPolicy, McpServerPolicySpec, McpServerPolicyStatus, ProtocolSpec,
    ResourceSubscriptionsSpec, RetentionSpec, TasksSpec,
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// API group of every Lifeguard custom resource.
pub const GROUP: &str = "lifeguard.dev";
/// The one served and stored API version.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` as it appears in manifests.
pub const API_VERSION: &str = "lifeguard.dev/v1alpha1";

/// Every CRD Lifeguard installs, paired with the file name `crdgen` writes it to.
pub fn all_crds() -> Vec<(&'static str, CustomResourceDefinition)> {
    vec![
        ("mcpserverpolicies.yaml", McpServerPolicy::crd()),
        ("capabilityexceptions.yaml", CapabilityException::crd()),
        ("principalrevocations.yaml", PrincipalRevocation::crd()),
    ]
}
