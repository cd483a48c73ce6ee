//! McpServerPolicy + its CapabilityExceptions + the PrincipalRevocations in force ⇒ one
//! [`EffectivePolicy`]. Pure: no IO, no clock (the caller passes `now`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use jiff::Timestamp;
use serde::Serialize;

use crate::api::{
    AuditFailureMode, AuditSink, CapabilityException, CapabilityMode, JwsAlgorithm,
    ListenNotification, McpServerPolicy, PolicyDuration, PrincipalRevocation, TasksSpec,
    UpstreamIdentity,
};

use super::effective::*;
use super::problem::{Problem, Problems, Severity};
use super::uri_pattern::UriPattern;
use super::validate::{
    CompileMode, SUPPORTED_PROTOCOL_VERSIONS, validate_exception, validate_policy,
    validate_revocation,
};

/// Documented defaults, applied when a field is omitted.
pub mod defaults {
    use std::time::Duration;

    pub const TTL: Duration = Duration::from_secs(15 * 60);
    pub const DEADLINE: Duration = Duration::from_secs(30 * 60);
    pub const MAX_DEADLINE: Duration = Duration::from_secs(2 * 3600);
    pub const MIN_POLL_INTERVAL: Duration = Duration::from_secs(2);
    pub const PER_PRINCIPAL: u32 = 5;
    pub const PER_TENANT: u32 = 50;
    pub const PER_CLIENT: u32 = 20;
    pub const PER_SERVER: u32 = 500;
    pub const IDEMPOTENCY_WINDOW: Duration = Duration::from_secs(10 * 60);
    pub const MAX_STREAMS_PER_PRINCIPAL: u32 = 4;
    pub const MAX_STREAM_DURATION: Duration = Duration::from_secs(3600);
    pub const SUBJECT_CLAIM: &str = "sub";
    pub const TENANT_CLAIM: &str = "tid";
    pub const CLIENT_CLAIM: &str = "client_id";
    pub const SCOPES_CLAIM: &str = "scope";
    pub const AUTHORIZER_TIMEOUT: Duration = Duration::from_secs(1);
    pub const AUTHORIZER_CACHE_TTL: Duration = Duration::from_secs(5);
    pub const AUTHORIZER_CACHE_SIZE: u32 = 10_000;
    /// Namespace of objects that do not name one, as kubectl assumes.
    pub const NAMESPACE: &str = "default";
}

/// The kinds of Lifeguard object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum ObjectKind {
    McpServerPolicy,
    CapabilityException,
    PrincipalRevocation,
}

impl ObjectKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::McpServerPolicy => "McpServerPolicy",
            Self::CapabilityException => "CapabilityException",
            Self::PrincipalRevocation => "PrincipalRevocation",
        }
    }
}

/// Which object a problem belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ObjectRef {
    pub kind: ObjectKind,
    /// `None` for cluster-scoped objects.
    pub namespace: Option<String>,
    pub name: String,
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {}/{}", self.kind.as_str(), ns, self.name),
            None => write!(f, "{} {}", self.kind.as_str(), self.name),
        }
    }
}

impl ObjectRef {
    pub fn policy(policy: &McpServerPolicy) -> Self {
        Self {
            kind: ObjectKind::McpServerPolicy,
            namespace: Some(namespace_of(&policy.metadata)),
            name: policy.metadata.name.clone().unwrap_or_default(),
        }
    }

    pub fn exception(exception: &CapabilityException) -> Self {
        Self {
            kind: ObjectKind::CapabilityException,
            namespace: Some(namespace_of(&exception.metadata)),
            name: exception.metadata.name.clone().unwrap_or_default(),
        }
    }

    pub fn revocation(revocation: &PrincipalRevocation) -> Self {
        Self {
            kind: ObjectKind::PrincipalRevocation,
            namespace: None,
            name: revocation.metadata.name.clone().unwrap_or_default(),
        }
    }
}

/// A problem and the object it is in.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct ObjectProblem {
    pub object: ObjectRef,
    pub problem: Problem,
}

/// What to compile.
#[derive(Clone, Copy, Debug)]
pub struct CompileInput<'a> {
    pub policy: &'a McpServerPolicy,
    /// Candidate exceptions; those that do not target `policy` are ignored.
    pub exceptions: &'a [CapabilityException],
    /// Every PrincipalRevocation (they are cluster-wide).
    pub revocations: &'a [PrincipalRevocation],
    pub mode: CompileMode,
    /// Used only for warnings about exceptions that already expired.
    pub now: Timestamp,
}

/// The result of compiling: the policy (absent when the McpServerPolicy itself has errors)
/// and every problem found in any input object.
#[derive(Clone, Debug)]
pub struct Compilation {
    pub effective: Option<EffectivePolicy>,
    pub problems: Vec<ObjectProblem>,
}

impl Compilation {
    pub fn has_errors(&self) -> bool {
        self.problems
            .iter()
            .any(|p| p.problem.severity == Severity::Error)
    }
}

/// Namespace of a namespaced object, defaulted like kubectl does.
pub fn namespace_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.namespace
        .clone()
        .unwrap_or_else(|| defaults::NAMESPACE.to_owned())
}

/// Whether `exception` names `policy` (same namespace, `policyRef.name`).
pub fn targets(exception: &CapabilityException, policy: &McpServerPolicy) -> bool {
    namespace_of(&exception.metadata) == namespace_of(&policy.metadata)
        && Some(exception.spec.policy_ref.name.as_str()) == policy.metadata.name.as_deref()
}

fn attach(object: &ObjectRef, problems: Problems, out: &mut Vec<ObjectProblem>) {
    out.extend(
        problems
            .into_vec()
            .into_iter()
            .map(|problem| ObjectProblem {
                object: object.clone(),
                problem,
            }),
    );
}

/// The rule a PrincipalRevocation compiles to, whatever its problems (see [`compile`]). A
/// policy's rules are these, sorted by name.
pub fn revocation_rule(revocation: &PrincipalRevocation) -> RevocationRule {
    let spec = &revocation.spec;
    RevocationRule {
        name: ObjectRef::revocation(revocation).name,
        issuer: spec.issuer.clone(),
        subject: spec.subject.clone(),
        tenant: spec.tenant.clone(),
        client: spec.client.clone(),
        revoked_before: spec.revoked_before.0,
        reason: spec.reason,
    }
}

/// Compiles one server's policy. Exceptions with errors are left out (and reported); the
/// policy is still produced. Errors in the McpServerPolicy itself produce no policy.
pub fn compile(input: CompileInput<'_>) -> Compilation {
    let mut problems = Vec::new();
    let policy = input.policy;
    let policy_ref = ObjectRef::policy(policy);
    let mut policy_problems = Problems::new();
    validate_policy(policy, input.mode, &mut policy_problems);
    let policy_ok = !policy_problems.has_errors();
    attach(&policy_ref, policy_problems, &mut problems);

    let capabilities = compile_capabilities(policy);
    let mut exceptions = Vec::new();
    for exception in input.exceptions.iter().filter(|e| targets(e, policy)) {
        let object = ObjectRef::exception(exception);
        let mut p = Problems::new();
        validate_exception(exception, &mut p);
        if capabilities.mode(exception.spec.capability) == CapabilityMode::Deny {
            p.warning(
                "spec.capability",
                format!(
                    "has no effect while the policy's spec.capabilities.{} is deny",
                    serde_plain_name(&exception.spec.capability)
                ),
            );
        }
        if exception.spec.expires_at.0 <= input.now {
            p.warning(
                "spec.expiresAt",
                format!("the exception expired at {}", exception.spec.expires_at.0),
            );
        }
        if !p.has_errors() {
            exceptions.push(GrantedException {
                exception: ObjectKey {
                    namespace: namespace_of(&exception.metadata),
                    name: object.name.clone(),
                },
                spec: exception.spec.clone(),
                not_before: exception.spec.not_before.0,
                expires_at: exception.spec.expires_at.0,
            });
        }
        attach(&object, p, &mut problems);
    }
    exceptions.sort_by(|a, b| a.exception.cmp(&b.exception));

    let mut revocations = Vec::new();
    for revocation in input.revocations {
        let object = ObjectRef::revocation(revocation);
        let mut p = Problems::new();
        validate_revocation(revocation, &mut p);
        attach(&object, p, &mut problems);
        // A revocation is applied even when it has problems: refusing to apply it would
        // fail open. An empty issuer or subject simply matches no token, and one naming no
        // subject, tenant or client covers nobody (`RevocationRule::covers`).
        revocations.push(revocation_rule(revocation));
    }
    revocations.sort_by(|a, b| a.name.cmp(&b.name));

    let effective = policy_ok.then(|| EffectivePolicy {
        policy: ObjectKey {
            namespace: policy_ref.namespace.clone().unwrap_or_default(),
            name: policy_ref.name.clone(),
        },
        generation: policy.metadata.generation,
        resource: policy.spec.resource.clone(),
        issuers: compile_issuers(policy),
        dpop: policy.spec.identity.dpop.as_ref().map(compile_dpop),
        client_certificates: policy
            .spec
            .identity
            .client_certificates
            .as_ref()
            .map(compile_client_certificates),
        upstream_identity: policy
            .spec
            .upstream
            .as_ref()
            .and_then(|u| u.identity)
            .unwrap_or(UpstreamIdentity::IdentityHeaders),
        upstream_task_state: policy
            .spec
            .upstream
            .as_ref()
            .and_then(|u| u.task_state)
            .unwrap_or_default(),
        rate_limits: policy
            .spec
            .rate_limits
            .as_ref()
            .and_then(super::compile_rate_limits::compile_rate_limits),
        protocol: ProtocolRules {
            versions: policy
                .spec
                .protocol
                .as_ref()
                .and_then(|p| p.versions.clone())
                .unwrap_or_else(|| {
                    SUPPORTED_PROTOCOL_VERSIONS
                        .iter()
                        .map(|v| (*v).to_owned())
                        .collect()
                }),
            allowed_origins: policy
                .spec
                .protocol
                .as_ref()
                .and_then(|p| p.allowed_origins.clone())
                .unwrap_or_default(),
            allow_missing_name_header: policy
                .spec
                .protocol
                .as_ref()
                .and_then(|p| p.allow_missing_name_header)
                .unwrap_or(false),
        },
        tasks: policy.spec.tasks.as_ref().and_then(compile_tasks),
        listen: policy.spec.listen.as_ref().map(compile_listen),
        capabilities,
        exceptions,
        revocations,
        audit: AuditRules {
            sink: policy
                .spec
                .audit
                .as_ref()
                .and_then(|a| a.sink)
                .unwrap_or(AuditSink::Stdout),
            path: policy.spec.audit.as_ref().and_then(|a| a.path.clone()),
            status_read_sample_percent: policy
                .spec
                .audit
                .as_ref()
                .and_then(|a| a.status_read_sample_percent)
                .unwrap_or(100),
            on_failure: policy
                .spec
                .audit
                .as_ref()
                .and_then(|a| a.on_failure)
                .unwrap_or(AuditFailureMode::FailClosed),
            identity_digests: policy
                .spec
                .audit
                .as_ref()
                .and_then(|a| a.identity_digests)
                .unwrap_or(false),
        },
    });
    Compilation {
        effective,
        problems,
    }
}

fn serde_plain_name<T: Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn compile_dpop(spec: &crate::api::DpopSpec) -> DpopRules {
    let defaults = DpopRules::default();
    DpopRules {
        algorithms: spec.algorithms.clone().unwrap_or(defaults.algorithms),
        proof_window_secs: spec
            .proof_window
            .as_ref()
            .map_or(defaults.proof_window_secs, |w| w.get().as_secs()),
        require_nonce: spec.require_nonce.unwrap_or(defaults.require_nonce),
    }
}

/// Validation has checked the header name and the ranges; a range that does not parse is
/// left out here (a policy with one does not compile).
fn compile_client_certificates(
    spec: &crate::api::ClientCertificatesSpec,
) -> ClientCertificateRules {
    let trusted = match &spec.trusted_proxies {
        Some(ranges) => ranges.iter().filter_map(|r| r.parse().ok()).collect(),
        None => super::validate_pop::LOOPBACK
            .iter()
            .filter_map(|r| r.parse().ok())
            .collect(),
    };
    ClientCertificateRules {
        header: spec.header.to_ascii_lowercase(),
        format: spec.format,
        trusted_proxies: trusted,
    }
}

fn compile_issuers(policy: &McpServerPolicy) -> Vec<TrustedIssuer> {
    policy
        .spec
        .identity
        .issuers
        .iter()
        .map(|issuer| {
            let claims = issuer.claims.clone().unwrap_or(crate::api::ClaimNames {
                subject: None,
                tenant: None,
                client: None,
                scopes: None,
            });
            TrustedIssuer {
                issuer: issuer.issuer.clone(),
                audiences: issuer
                    .audiences
                    .clone()
                    .unwrap_or_else(|| vec![policy.spec.resource.clone()]),
                // Validation guarantees exactly one source when the policy compiles.
                keys: match (&issuer.jwks_uri, &issuer.jwks_file) {
                    (Some(uri), _) => KeySource::JwksUri(uri.clone()),
                    (None, file) => KeySource::JwksFile(file.clone().unwrap_or_default()),
                },
                algorithms: issuer.algorithms.clone().unwrap_or_else(|| {
                    vec![
                        JwsAlgorithm::RS256,
                        JwsAlgorithm::PS256,
                        JwsAlgorithm::ES256,
                        JwsAlgorithm::EdDSA,
                    ]
                }),
                claims: ClaimMap {
                    subject: claims
                        .subject
                        .unwrap_or_else(|| defaults::SUBJECT_CLAIM.into()),
                    tenant: claims
                        .tenant
                        .unwrap_or_else(|| defaults::TENANT_CLAIM.into()),
                    client: claims
                        .client
                        .unwrap_or_else(|| defaults::CLIENT_CLAIM.into()),
                    scopes: claims
                        .scopes
                        .unwrap_or_else(|| defaults::SCOPES_CLAIM.into()),
                },
                proof_of_possession: issuer.proof_of_possession.unwrap_or_default(),
            }
        })
        .collect()
}

fn get(d: &Option<PolicyDuration>) -> Option<Duration> {
    d.as_ref().map(PolicyDuration::get)
}

fn compile_tasks(spec: &TasksSpec) -> Option<TaskRules> {
    if spec.enabled == Some(false) {
        return None;
    }
    let retention = spec.retention.as_ref();
    let spec_default_ttl = retention.and_then(|r| get(&r.default_ttl));
    let spec_max_ttl = retention.and_then(|r| get(&r.max_ttl));
    let default_ttl = spec_default_ttl
        .unwrap_or_else(|| spec_max_ttl.map_or(defaults::TTL, |m| m.min(defaults::TTL)));
    let max_ttl = spec_max_ttl.unwrap_or(default_ttl);

    let deadline = spec.deadline.as_ref();
    let per_tool_deadline: BTreeMap<String, PolicyDuration> = deadline
        .and_then(|d| d.per_tool.clone())
        .unwrap_or_default();
    let spec_default_deadline = deadline.and_then(|d| get(&d.default));
    let max_deadline = deadline.and_then(|d| get(&d.max)).unwrap_or_else(|| {
        per_tool_deadline
            .values()
            .map(PolicyDuration::get)
            .chain(spec_default_deadline)
            .fold(defaults::MAX_DEADLINE, Duration::max)
    });
    let default_deadline =
        spec_default_deadline.unwrap_or_else(|| defaults::DEADLINE.min(max_deadline));

    let concurrency = spec.concurrency.as_ref();
    Some(TaskRules {
        tools: match &spec.tools {
            None => ToolSet::All,
            Some(tools) => ToolSet::Only(tools.iter().cloned().collect()),
        },
        required_scopes: spec
            .required_scopes
            .iter()
            .flatten()
            .map(|(tool, scopes)| (tool.clone(), scopes.iter().cloned().collect()))
            .collect(),
        default_ttl: default_ttl.into(),
        max_ttl: max_ttl.into(),
        delete_result_after_retrieval: retention
            .and_then(|r| r.delete_result_after_retrieval)
            .unwrap_or(false),
        default_deadline: default_deadline.into(),
        max_deadline: max_deadline.into(),
        per_tool_deadline,
        min_poll_interval: get(&spec.min_poll_interval)
            .unwrap_or(defaults::MIN_POLL_INTERVAL)
            .into(),
        concurrency: ConcurrencyLimits {
            per_principal: concurrency
                .and_then(|c| c.per_principal)
                .unwrap_or(defaults::PER_PRINCIPAL),
            per_tenant: concurrency
                .and_then(|c| c.per_tenant)
                .unwrap_or(defaults::PER_TENANT),
            per_client: concurrency
                .and_then(|c| c.per_client)
                .unwrap_or(defaults::PER_CLIENT),
            per_server: concurrency
                .and_then(|c| c.per_server)
                .unwrap_or(defaults::PER_SERVER),
        },
        idempotency_window: spec
            .idempotency
            .as_ref()
            .and_then(|i| get(&i.window))
            .unwrap_or(defaults::IDEMPOTENCY_WINDOW)
            .into(),
        derive_idempotency_key: spec
            .idempotency
            .as_ref()
            .and_then(|i| i.derive_from_request)
            .unwrap_or(false),
        admin_cancel_scope: spec.admin_cancel_scope.clone(),
        results: compile_results(spec.results.as_ref()),
        identity_lease: spec.identity_lease.clone(),
        objects: spec.objects.as_ref().map(compile_objects),
    })
}

fn compile_objects(spec: &crate::api::ObjectsSpec) -> ObjectRules {
    let a = &spec.authorizer;
    ObjectRules {
        authorizer: AuthorizerRules {
            url: a.url.clone(),
            format: a.format.unwrap_or_default(),
            timeout: get(&a.timeout)
                .unwrap_or(defaults::AUTHORIZER_TIMEOUT)
                .into(),
            cache_ttl: get(&a.cache_ttl)
                .unwrap_or(defaults::AUTHORIZER_CACHE_TTL)
                .into(),
            cache_size: a.cache_size.unwrap_or(defaults::AUTHORIZER_CACHE_SIZE),
            ca_file: a.ca_file.clone(),
            token_file: a.token_file.clone(),
        },
        tools: spec
            .tools
            .iter()
            .map(|(tool, object)| {
                let resource_type = object.r#type.clone().unwrap_or_else(|| tool.clone());
                let pointer = object.pointer.clone();
                (
                    tool.clone(),
                    ObjectPointer {
                        pointer,
                        resource_type,
                    },
                )
            })
            .collect(),
    }
}

fn compile_results(spec: Option<&crate::api::ResultsSpec>) -> ResultRules {
    let Some(spec) = spec else {
        return ResultRules::default();
    };
    let redact = spec.redact.as_ref();
    ResultRules {
        mode: spec.mode.unwrap_or_default(),
        max_bytes: spec.max_bytes,
        drop: redact
            .and_then(|r| r.drop.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p.starts_with('/'))
            .collect(),
        // Invalid patterns are errors (validate.rs): a policy with one does not compile.
        mask: redact.and_then(|r| r.mask.clone()).unwrap_or_default(),
    }
}

fn compile_listen(spec: &crate::api::ListenSpec) -> ListenRules {
    let notifications: BTreeSet<ListenNotification> = match &spec.notifications {
        Some(n) => n.iter().copied().collect(),
        None => [
            ListenNotification::ToolsListChanged,
            ListenNotification::PromptsListChanged,
            ListenNotification::ResourcesListChanged,
            ListenNotification::TaskIds,
        ]
        .into_iter()
        .collect(),
    };
    ListenRules {
        notifications,
        // Invalid patterns make the policy fail validation, so none are dropped here.
        resource_patterns: spec
            .resource_subscriptions
            .iter()
            .flat_map(|r| r.allow.iter())
            .filter_map(|p| UriPattern::new(p).ok())
            .collect(),
        max_streams_per_principal: spec
            .max_streams_per_principal
            .unwrap_or(defaults::MAX_STREAMS_PER_PRINCIPAL),
        max_stream_duration: get(&spec.max_stream_duration)
            .unwrap_or(defaults::MAX_STREAM_DURATION)
            .into(),
    }
}

fn compile_capabilities(policy: &McpServerPolicy) -> CapabilityRules {
    let caps = policy.spec.capabilities.as_ref();
    CapabilityRules {
        sampling: caps
            .and_then(|c| c.sampling)
            .unwrap_or(CapabilityMode::Deny),
        roots: caps.and_then(|c| c.roots).unwrap_or(CapabilityMode::Deny),
        logging: caps.and_then(|c| c.logging).unwrap_or(CapabilityMode::Deny),
        secret_patterns: caps.map(|c| c.secret_patterns.clone()).unwrap_or_default(),
    }
}
