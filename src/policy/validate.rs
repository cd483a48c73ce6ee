//! Semantic validation of each kind, one object at a time.
//!
//! These checks are a superset of the CRD's CEL rules (same messages, see [`crate::api::rules`])
//! plus what CEL cannot express: URL syntax, pattern syntax, signature structure, protocol
//! versions. They run in standalone mode, in `lifeguard policy check`, and in the operator.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::api::{
    AuditSink, CapabilityException, ExceptionCapability, ListenNotification, McpServerPolicy,
    PolicyDuration, PrincipalRevocation, RevocationSourceKind, SecretKeySelector,
    UpstreamTaskState, rules,
};

use super::jws_shape::parse_detached_jws;
use super::problem::Problems;
use super::uri_pattern::UriPattern;

/// MCP protocol versions this Lifeguard release can enforce.
pub const SUPPORTED_PROTOCOL_VERSIONS: &[&str] = &["2026-07-28"];
/// First protocol version whose requests carry validated `Mcp-Method`/`Mcp-Name` headers and
/// no sessions. Anything older would let a client downgrade a dual-era server.
pub const FIRST_STATELESS_PROTOCOL_VERSION: &str = "2026-07-28";

/// Exceptions valid for longer than this get a warning: deprecated capabilities should be
/// granted for the shortest useful time.
const LONG_EXCEPTION_WARNING: Duration = Duration::from_secs(90 * 24 * 3600);

/// Where the policy is meant to run; decides whether local key files are allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CompileMode {
    /// Compiled by the operator for sidecars in a cluster. `jwksFile` is refused: a path in a
    /// cluster-wide object would name a file in some container nobody controls.
    #[default]
    Cluster,
    /// `lifeguard sidecar --policy FILE`: local files are fine.
    Standalone,
}

pub(crate) fn check_metadata(name: Option<&str>, namespace: Option<&str>, p: &mut Problems) {
    match name {
        None | Some("") => p.error("metadata.name", "is required"),
        Some(name) if !is_dns_subdomain(name) => p.error(
            "metadata.name",
            "must be a lowercase RFC 1123 subdomain (a-z, 0-9, '-', '.'; at most 253 characters)",
        ),
        Some(_) => {}
    }
    if let Some(ns) = namespace
        && !is_dns_label(ns)
    {
        p.error("metadata.namespace", "must be a lowercase RFC 1123 label");
    }
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

fn is_loopback_host(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// An `https` URL, or `http` on a loopback host. Returns the reason when it is not.
fn check_secure_url(text: &str) -> Result<url::Url, String> {
    let url = url::Url::parse(text).map_err(|e| format!("is not an absolute URL ({e})"))?;
    match url.scheme() {
        "https" => {}
        "http" if is_loopback_host(&url) => {}
        "http" => return Err("must use https (http is allowed only for loopback hosts)".into()),
        other => return Err(format!("must use https, not `{other}`")),
    }
    if url.host().is_none() {
        return Err("must name a host".into());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("must not carry credentials".into());
    }
    Ok(url)
}

fn check_positive(d: Option<&PolicyDuration>, path: &str, p: &mut Problems) {
    if let Some(d) = d
        && d.get().is_zero()
    {
        p.error(path, rules::DURATION_POSITIVE);
    }
}

fn check_scope_token(scope: &str, path: &str, p: &mut Problems) {
    // RFC 6749 §3.3: scope tokens are printable ASCII without space, `"` or `\`.
    let ok = !scope.is_empty()
        && scope
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b) && b != b'"' && b != b'\\');
    if !ok {
        p.error(
            path,
            "is not a valid OAuth scope (printable ASCII, no spaces, quotes or backslashes)",
        );
    }
}

fn check_unique<'a>(items: impl IntoIterator<Item = &'a str>, path: &str, p: &mut Problems) {
    let mut seen = BTreeSet::new();
    for (i, item) in items.into_iter().enumerate() {
        if item.trim().is_empty() {
            p.error(format!("{path}[{i}]"), "must not be empty");
        } else if !seen.insert(item) {
            p.error(format!("{path}[{i}]"), format!("`{item}` is listed twice"));
        }
    }
}

/// Checks one McpServerPolicy.
pub fn validate_policy(policy: &McpServerPolicy, mode: CompileMode, p: &mut Problems) {
    check_metadata(
        policy.metadata.name.as_deref(),
        policy.metadata.namespace.as_deref(),
        p,
    );
    let spec = &policy.spec;

    match check_secure_url(&spec.resource) {
        Ok(url) if url.fragment().is_some() => {
            p.error("spec.resource", "must not contain a fragment (RFC 8707)")
        }
        Ok(_) => {}
        Err(why) => p.error("spec.resource", why),
    }

    validate_identity(policy, mode, p);
    validate_ledger(policy, p);

    if let Some(protocol) = &spec.protocol {
        if let Some(versions) = &protocol.versions {
            if versions.is_empty() {
                p.error("spec.protocol.versions", "must list at least one version");
            }
            for (i, v) in versions.iter().enumerate() {
                let path = format!("spec.protocol.versions[{i}]");
                if v.as_str() < FIRST_STATELESS_PROTOCOL_VERSION {
                    p.error(path, format!(
                        "`{v}` predates the stateless protocol (2026-07-28); accepting it would let clients downgrade the server into session mode, where Lifeguard cannot check headers"
                    ));
                } else if !SUPPORTED_PROTOCOL_VERSIONS.contains(&v.as_str()) {
                    p.error(path, format!(
                        "`{v}` is not a protocol version this Lifeguard release enforces (supported: {})",
                        SUPPORTED_PROTOCOL_VERSIONS.join(", ")
                    ));
                }
            }
        }
        for (i, origin) in protocol.allowed_origins.iter().flatten().enumerate() {
            let path = format!("spec.protocol.allowedOrigins[{i}]");
            if origin == "*" {
                p.error(path, "a wildcard origin would disable Origin validation (DNS rebinding protection); list the origins");
                continue;
            }
            match url::Url::parse(origin) {
                Ok(url)
                    if matches!(url.scheme(), "http" | "https")
                        && url.host().is_some()
                        && url.path() == "/"
                        && !origin.ends_with('/')
                        && url.query().is_none() => {}
                _ => p.error(
                    path,
                    "must be an origin: scheme://host[:port] without a path",
                ),
            }
        }
    }

    if let Some(rate_limits) = &spec.rate_limits {
        super::compile_rate_limits::validate_rate_limits(rate_limits, p);
    }
    if let Some(tasks) = &spec.tasks {
        validate_tasks(tasks, p);
    }
    if let Some(listen) = &spec.listen {
        validate_listen(listen, multi_tenant(spec), p);
    }
    for (i, pattern) in spec
        .capabilities
        .iter()
        .flat_map(|c| &c.secret_patterns)
        .enumerate()
    {
        let path = format!("spec.capabilities.secretPatterns[{i}]");
        if pattern.is_empty() {
            p.error(path, "must not be empty");
        } else if let Err(e) = mask_regex(pattern) {
            p.error(path, format!("is not a valid regular expression: {e}"));
        }
    }
    if let Some(audit) = &spec.audit {
        if audit.sink == Some(AuditSink::File) {
            match audit.path.as_deref() {
                None => p.error("spec.audit.path", rules::AUDIT_FILE_NEEDS_PATH),
                Some(path) if !path.starts_with('/') => {
                    p.error("spec.audit.path", "must be an absolute path")
                }
                Some(_) => {}
            }
        }
        if audit
            .status_read_sample_percent
            .is_some_and(|pct| pct > 100)
        {
            p.error(
                "spec.audit.statusReadSamplePercent",
                "must be between 0 and 100",
            );
        }
    }
}

fn validate_identity(policy: &McpServerPolicy, mode: CompileMode, p: &mut Problems) {
    let spec = &policy.spec;
    if spec.upstream.as_ref().and_then(|u| u.identity)
        == Some(crate::api::UpstreamIdentity::ForwardToken)
    {
        p.warning(
            "spec.upstream.identity",
            "forwardToken hands the container the user's own token, which it can keep and replay until it expires; prefer delegation (short-lived assertions bound to one task)",
        );
    }
    if spec.identity.issuers.is_empty() {
        p.error("spec.identity.issuers", "must list at least one issuer");
    }
    super::validate_pop::validate_dpop(spec.identity.dpop.as_ref(), p);
    super::validate_pop::validate_client_certificates(
        spec.identity.client_certificates.as_ref(),
        p,
    );
    let mut seen = BTreeSet::new();
    for (i, issuer) in spec.identity.issuers.iter().enumerate() {
        let base = format!("spec.identity.issuers[{i}]");
        if issuer.issuer.trim().is_empty() {
            p.error(format!("{base}.issuer"), "must not be empty");
        } else if !seen.insert(issuer.issuer.as_str()) {
            p.error(
                format!("{base}.issuer"),
                format!("`{}` is listed twice", issuer.issuer),
            );
        }
        match (&issuer.jwks_uri, &issuer.jwks_file) {
            (Some(_), Some(_)) | (None, None) => p.error(&base, rules::ISSUER_ONE_JWKS_SOURCE),
            (Some(uri), None) => {
                if let Err(why) = check_secure_url(uri) {
                    p.error(format!("{base}.jwksUri"), why);
                }
            }
            (None, Some(file)) => {
                if file.trim().is_empty() {
                    p.error(format!("{base}.jwksFile"), "must not be empty");
                } else if mode == CompileMode::Cluster {
                    p.error(
                        format!("{base}.jwksFile"),
                        "is only supported in standalone mode; in a cluster use jwksUri",
                    );
                }
            }
        }
        if let Some(audiences) = &issuer.audiences {
            if audiences.is_empty() {
                p.error(
                    format!("{base}.audiences"),
                    "must list at least one audience (omit it to use spec.resource)",
                );
            }
            check_unique(
                audiences.iter().map(String::as_str),
                &format!("{base}.audiences"),
                p,
            );
            if !audiences.is_empty() && !audiences.contains(&spec.resource) {
                p.warning(
                    format!("{base}.audiences"),
                    "does not include spec.resource: tokens issued for the server's canonical URI will be refused",
                );
            }
        }
        if issuer.algorithms.as_ref().is_some_and(Vec::is_empty) {
            p.error(
                format!("{base}.algorithms"),
                "must list at least one algorithm (omit it for the defaults)",
            );
        }
    }
}

/// Warning text for `upstream.taskState: shared` without `spec.ledger`.
pub const SHARED_TASK_STATE_WITHOUT_LEDGER: &str = "is shared but spec.ledger is not set: each pod's sidecar keeps its own SQLite ledger, so with more than one replica a task created through one pod is unknown to the others (harmless with one replica); set spec.ledger.connectionSecretRef";

fn validate_ledger(policy: &McpServerPolicy, p: &mut Problems) {
    let spec = &policy.spec;
    if let Some(ledger) = &spec.ledger {
        let secret = &ledger.connection_secret_ref;
        if !SecretKeySelector::valid_name(&secret.name) {
            p.error(
                "spec.ledger.connectionSecretRef.name",
                rules::SECRET_NAME_DNS_SUBDOMAIN,
            );
        }
        if !SecretKeySelector::valid_key(&secret.key) {
            p.error(
                "spec.ledger.connectionSecretRef.key",
                rules::SECRET_DATA_KEY,
            );
        }
    }
    let shared =
        spec.upstream.as_ref().and_then(|u| u.task_state) == Some(UpstreamTaskState::Shared);
    if shared && spec.ledger.is_none() {
        p.warning("spec.upstream.taskState", SHARED_TASK_STATE_WITHOUT_LEDGER);
    }
}

/// Most compiled size of one mask pattern: bounds the memory and time a hostile policy costs.
pub const MASK_SIZE_LIMIT: usize = 1 << 20;

/// A mask pattern of `tasks.results.redact.mask`, compiled as the sidecar compiles it.
pub fn mask_regex(pattern: &str) -> Result<regex::Regex, regex::Error> {
    regex::RegexBuilder::new(pattern)
        .size_limit(MASK_SIZE_LIMIT)
        .build()
}

fn validate_results(results: &crate::api::ResultsSpec, p: &mut Problems) {
    if results.max_bytes == Some(0) {
        p.error("spec.tasks.results.maxBytes", "must be at least 1");
    }
    let redact = results.redact.as_ref();
    for (i, pointer) in redact
        .and_then(|r| r.drop.as_ref())
        .into_iter()
        .flatten()
        .enumerate()
    {
        if !pointer.starts_with('/') {
            p.error(
                format!("spec.tasks.results.redact.drop[{i}]"),
                rules::REDACT_DROP_POINTER,
            );
        }
    }
    for (i, pattern) in redact
        .and_then(|r| r.mask.as_ref())
        .into_iter()
        .flatten()
        .enumerate()
    {
        if pattern.is_empty() {
            p.error(
                format!("spec.tasks.results.redact.mask[{i}]"),
                "must not be empty",
            );
        } else if let Err(e) = mask_regex(pattern) {
            p.error(
                format!("spec.tasks.results.redact.mask[{i}]"),
                format!("is not a valid regular expression: {e}"),
            );
        }
    }
    if results.mode == Some(crate::api::ResultMode::StatusOnly)
        && (results.max_bytes.is_some() || redact.is_some())
    {
        p.warning(
            "spec.tasks.results",
            "maxBytes and redact have no effect with mode statusOnly: no result is kept",
        );
    }
}

/// Whether `pointer` is a JSON pointer (RFC 6901) naming something below the root: it starts
/// with `/` and every `~` is followed by `0` or `1`.
pub fn is_json_pointer(pointer: &str) -> bool {
    pointer.starts_with('/')
        && pointer
            .split('~')
            .skip(1)
            .all(|rest| rest.starts_with('0') || rest.starts_with('1'))
}

fn validate_objects(objects: &crate::api::ObjectsSpec, p: &mut Problems) {
    let a = &objects.authorizer;
    let base = "spec.tasks.objects.authorizer";
    if let Err(reason) = check_secure_url(&a.url) {
        p.error(format!("{base}.url"), reason);
    }
    if let Some(t) = &a.timeout
        && (t.get().is_zero() || t.get() > std::time::Duration::from_secs(30))
    {
        p.error(format!("{base}.timeout"), rules::AUTHORIZER_TIMEOUT);
    }
    if let Some(t) = &a.cache_ttl
        && t.get() > std::time::Duration::from_secs(600)
    {
        p.error(format!("{base}.cacheTtl"), rules::AUTHORIZER_CACHE_TTL);
    }
    if a.cache_size == Some(0) {
        p.error(format!("{base}.cacheSize"), "must be at least 1");
    }
    for (field, path) in [("caFile", &a.ca_file), ("tokenFile", &a.token_file)] {
        if path.as_ref().is_some_and(|f| f.trim().is_empty()) {
            p.error(format!("{base}.{field}"), "must not be empty");
        }
    }
    if objects.tools.is_empty() {
        p.warning(
            "spec.tasks.objects.tools",
            "names no tool, so the authorizer is never asked",
        );
    }
    for (tool, object) in &objects.tools {
        if !is_json_pointer(&object.pointer) {
            p.error(
                format!("spec.tasks.objects.tools.{tool}.pointer"),
                rules::OBJECT_POINTER,
            );
        }
        if object.r#type.as_ref().is_some_and(|t| t.trim().is_empty()) {
            p.error(
                format!("spec.tasks.objects.tools.{tool}.type"),
                "must not be empty",
            );
        }
    }
}

fn validate_tasks(tasks: &crate::api::TasksSpec, p: &mut Problems) {
    if let Some(results) = &tasks.results {
        validate_results(results, p);
    }
    if let Some(objects) = &tasks.objects {
        validate_objects(objects, p);
    }
    check_positive(tasks.identity_lease.as_ref(), "spec.tasks.identityLease", p);
    if let Some(lease) = &tasks.identity_lease
        && !lease.get().is_zero()
        && lease.get() < std::time::Duration::from_secs(60)
    {
        p.warning(
            "spec.tasks.identityLease",
            "a lease under 1m cancels tasks whose owners merely pause polling; leave room for token refreshes",
        );
    }
    let tools: Option<BTreeSet<&str>> = tasks
        .tools
        .as_ref()
        .map(|t| t.iter().map(String::as_str).collect());
    if let Some(list) = &tasks.tools {
        check_unique(list.iter().map(String::as_str), "spec.tasks.tools", p);
    }
    let unknown_tool = |tool: &str| tools.as_ref().is_some_and(|t| !t.contains(tool));

    for (tool, scopes) in tasks.required_scopes.iter().flatten() {
        let base = format!("spec.tasks.requiredScopes.{tool}");
        if unknown_tool(tool) {
            p.warning(
                &base,
                format!("tool `{tool}` is not in spec.tasks.tools, so it never runs as a task"),
            );
        }
        for (i, scope) in scopes.iter().enumerate() {
            check_scope_token(scope, &format!("{base}[{i}]"), p);
        }
    }

    if let Some(r) = &tasks.retention {
        check_positive(r.default_ttl.as_ref(), "spec.tasks.retention.defaultTtl", p);
        check_positive(r.max_ttl.as_ref(), "spec.tasks.retention.maxTtl", p);
        if let (Some(d), Some(m)) = (&r.default_ttl, &r.max_ttl)
            && m.get() < d.get()
        {
            p.error(
                "spec.tasks.retention.maxTtl",
                rules::MAX_TTL_AT_LEAST_DEFAULT,
            );
        }
    }
    if let Some(d) = &tasks.deadline {
        check_positive(d.default.as_ref(), "spec.tasks.deadline.default", p);
        check_positive(d.max.as_ref(), "spec.tasks.deadline.max", p);
        if let (Some(def), Some(max)) = (&d.default, &d.max)
            && max.get() < def.get()
        {
            p.error(
                "spec.tasks.deadline.max",
                rules::DEADLINE_MAX_AT_LEAST_DEFAULT,
            );
        }
        for (tool, deadline) in d.per_tool.iter().flatten() {
            let path = format!("spec.tasks.deadline.perTool.{tool}");
            check_positive(Some(deadline), &path, p);
            if unknown_tool(tool) {
                p.warning(
                    &path,
                    format!("tool `{tool}` is not in spec.tasks.tools, so it never runs as a task"),
                );
            }
        }
        if let (Some(max), Some(per_tool)) = (&d.max, &d.per_tool)
            && per_tool.values().any(|t| t.get() > max.get())
        {
            p.error(
                "spec.tasks.deadline.perTool",
                rules::DEADLINE_PER_TOOL_WITHIN_MAX,
            );
        }
    }
    check_positive(
        tasks.min_poll_interval.as_ref(),
        "spec.tasks.minPollInterval",
        p,
    );
    if let Some(c) = &tasks.concurrency {
        let limits = [
            ("perPrincipal", c.per_principal),
            ("perTenant", c.per_tenant),
            ("perClient", c.per_client),
            ("perServer", c.per_server),
        ];
        for (field, value) in limits {
            if value == Some(0) {
                p.error(
                    format!("spec.tasks.concurrency.{field}"),
                    "must be at least 1",
                );
            }
        }
        if let (Some(principal), Some(tenant)) = (c.per_principal, c.per_tenant)
            && principal > tenant
        {
            p.warning(
                "spec.tasks.concurrency.perPrincipal",
                "exceeds perTenant, so the tenant quota is reached first",
            );
        }
    }
    if let Some(i) = &tasks.idempotency {
        check_positive(i.window.as_ref(), "spec.tasks.idempotency.window", p);
    }
    if let Some(scope) = &tasks.admin_cancel_scope {
        check_scope_token(scope, "spec.tasks.adminCancelScope", p);
    }
}

/// Whether the policy serves several tenants, as far as it says: it trusts more than one
/// issuer, names the tenant claim explicitly, or sets a per-tenant quota.
fn multi_tenant(spec: &crate::api::McpServerPolicySpec) -> bool {
    spec.identity.issuers.len() > 1
        || spec
            .identity
            .issuers
            .iter()
            .any(|i| i.claims.as_ref().is_some_and(|c| c.tenant.is_some()))
        || spec
            .tasks
            .as_ref()
            .and_then(|t| t.concurrency.as_ref())
            .is_some_and(|c| c.per_tenant.is_some())
}

fn validate_listen(listen: &crate::api::ListenSpec, multi_tenant: bool, p: &mut Problems) {
    if let Some(n) = &listen.notifications {
        let mut seen = BTreeSet::new();
        for (i, kind) in n.iter().enumerate() {
            if !seen.insert(kind) {
                p.warning(format!("spec.listen.notifications[{i}]"), "is listed twice");
            }
        }
    }
    let subscribes = listen
        .notifications
        .as_ref()
        .is_some_and(|n| n.contains(&ListenNotification::ResourceSubscriptions));
    let patterns = listen
        .resource_subscriptions
        .as_ref()
        .map(|r| r.allow.as_slice())
        .unwrap_or_default();
    for (i, pattern) in patterns.iter().enumerate() {
        match UriPattern::new(pattern) {
            Err(why) => p.error(format!("spec.listen.resourceSubscriptions.allow[{i}]"), why),
            Ok(pattern) if multi_tenant && !pattern.is_templated() => p.warning(
                format!("spec.listen.resourceSubscriptions.allow[{i}]"),
                "is the same for every tenant of this multi-tenant policy: any tenant's listener may subscribe to what it matches; partition it with {tenant} (or {subject}, {client})",
            ),
            Ok(_) => {}
        }
    }
    if subscribes && patterns.is_empty() {
        p.warning(
            "spec.listen.resourceSubscriptions.allow",
            "resourceSubscriptions is enabled but no URI is allowed, so every subscription is dropped",
        );
    }
    if !subscribes && !patterns.is_empty() {
        p.warning(
            "spec.listen.resourceSubscriptions",
            "has no effect: resourceSubscriptions is not in spec.listen.notifications",
        );
    }
    if listen.max_streams_per_principal == Some(0) {
        p.error("spec.listen.maxStreamsPerPrincipal", "must be at least 1");
    }
    check_positive(
        listen.max_stream_duration.as_ref(),
        "spec.listen.maxStreamDuration",
        p,
    );
}

/// Checks one CapabilityException on its own (not its signature's validity).
pub fn validate_exception(exception: &CapabilityException, p: &mut Problems) {
    check_metadata(
        exception.metadata.name.as_deref(),
        exception.metadata.namespace.as_deref(),
        p,
    );
    let spec = &exception.spec;
    if spec.policy_ref.name.trim().is_empty() {
        p.error("spec.policyRef.name", "must not be empty");
    }
    if spec.clients.is_empty() {
        p.error("spec.clients", "must list at least one client id");
    }
    check_unique(spec.clients.iter().map(String::as_str), "spec.clients", p);
    for (i, principal) in spec.principals.iter().flatten().enumerate() {
        if principal.issuer.trim().is_empty() {
            p.error(format!("spec.principals[{i}].issuer"), "must not be empty");
        }
        if principal.subject.trim().is_empty() {
            p.error(format!("spec.principals[{i}].subject"), "must not be empty");
        }
    }
    if let Some(tenants) = &spec.tenants {
        let keys: Vec<String> = tenants
            .iter()
            .map(|t| format!("{} {}", t.issuer, t.tenant))
            .collect();
        check_unique(keys.iter().map(String::as_str), "spec.tenants", p);
    }
    if spec.purpose.trim().is_empty() {
        p.error("spec.purpose", "must say why the capability is needed");
    }
    if spec.approval_id.trim().is_empty() {
        p.error("spec.approvalId", "must not be empty");
    }
    let limits = [
        ("maxTokens", u64::from(spec.limits.max_tokens)),
        (
            "maxIterationsPerTask",
            u64::from(spec.limits.max_iterations_per_task),
        ),
        (
            "maxRequestsPerMinute",
            u64::from(spec.limits.max_requests_per_minute),
        ),
        (
            "maxSystemPromptBytes",
            spec.limits.max_system_prompt_bytes.map_or(1, u64::from),
        ),
        (
            "maxMessageBytes",
            spec.limits.max_message_bytes.map_or(1, u64::from),
        ),
    ];
    if spec.limits.max_cost_units == Some(0) {
        p.error("spec.limits.maxCostUnits", "must be at least 1");
    }
    if spec.capability == ExceptionCapability::Sampling
        && spec
            .model_route
            .as_deref()
            .is_none_or(|r| r.trim().is_empty())
    {
        p.error("spec.modelRoute", rules::SAMPLING_NEEDS_MODEL_ROUTE);
    }
    for (field, value) in limits {
        if value == 0 {
            p.error(format!("spec.limits.{field}"), "must be at least 1");
        }
    }
    if spec.capability != ExceptionCapability::Sampling {
        let name = match spec.capability {
            ExceptionCapability::Roots => "roots",
            _ => "logging",
        };
        if spec.model_route.is_some() {
            p.warning("spec.modelRoute", format!("has no meaning for {name}"));
        }
        if !spec.allowed_tools.is_empty() {
            p.warning("spec.allowedTools", format!("has no meaning for {name}"));
        }
        if spec.include_context.is_some() {
            p.warning("spec.includeContext", format!("has no meaning for {name}"));
        }
        if spec.limits.max_cost_units.is_some() {
            p.warning(
                "spec.limits.maxCostUnits",
                format!("has no meaning for {name}"),
            );
        }
    }
    check_unique(
        spec.allowed_tools.iter().map(String::as_str),
        "spec.allowedTools",
        p,
    );
    let not_before = spec.not_before.0;
    let expires_at = spec.expires_at.0;
    if expires_at <= not_before {
        p.error("spec.expiresAt", rules::EXCEPTION_EXPIRES_AFTER_NOT_BEFORE);
    } else if expires_at.duration_since(not_before).unsigned_abs() > LONG_EXCEPTION_WARNING {
        p.warning(
            "spec.expiresAt",
            "the exception is valid for more than 90 days; deprecated capabilities should be granted briefly",
        );
    }
    if let Err(why) = parse_detached_jws(&spec.signature) {
        p.error("spec.signature", why);
    }
}

/// Checks one PrincipalRevocation.
pub fn validate_revocation(revocation: &PrincipalRevocation, p: &mut Problems) {
    check_metadata(revocation.metadata.name.as_deref(), None, p);
    if revocation.metadata.namespace.is_some() {
        p.warning(
            "metadata.namespace",
            "is ignored: PrincipalRevocation is cluster-scoped",
        );
    }
    let spec = &revocation.spec;
    if spec.issuer.trim().is_empty() {
        p.error("spec.issuer", "must not be empty");
    }
    if spec.subject.is_none() && spec.tenant.is_none() && spec.client.is_none() {
        p.error("spec", rules::REVOCATION_NAMES_SOMEONE);
    }
    for (field, value) in [
        ("subject", &spec.subject),
        ("tenant", &spec.tenant),
        ("client", &spec.client),
    ] {
        if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
            p.error(format!("spec.{field}"), "must not be empty when set");
        }
    }
    let source = &spec.source;
    if source.kind == RevocationSourceKind::SecurityEvent
        && (source.event_type.is_none() || source.issuer.is_none() || source.jti.is_none())
    {
        p.error("spec.source", rules::SECURITY_EVENT_SOURCE_FIELDS);
    }
    if let Some(expires) = &spec.expires_at
        && expires.0 <= spec.revoked_before.0
    {
        p.warning(
            "spec.expiresAt",
            "is not after revokedBefore; the object may be collected while tokens it refuses are still valid",
        );
    }
}
