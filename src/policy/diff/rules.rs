//! The rule of each effective-policy path: its spec name and how a change of it is judged.

/// How a change of one field is judged.
#[derive(Clone, Copy, Debug)]
pub(super) enum Rule {
    /// Durations: a longer one (or none at all) loosens.
    LongerLoosens,
    /// Durations: a shorter one loosens (poll intervals).
    ShorterLoosens,
    /// Numbers: a higher one (or none at all) loosens.
    HigherLoosens,
    /// Numbers: a lower one loosens.
    LowerLoosens,
    /// Lists read as sets: an added entry loosens, a removed one tightens.
    AddedLoosens,
    /// Lists read as sets: a removed entry loosens (scopes, redactions).
    RemovedLoosens,
    /// Strings ordered from the tightest to the loosest value.
    Ordered(&'static [&'static str]),
    /// Booleans: becoming true loosens.
    TrueLoosens,
    /// Booleans: becoming false loosens.
    FalseLoosens,
    /// Any change loosens (what tokens are trusted, who may act as admin).
    AnyLoosens,
    /// Becoming present tightens (a new object check); a removal or change loosens.
    PresenceTightens,
    Neutral,
}

/// Effective-policy paths (`*` stands for one map key), their spec names and rules.
const RULES: &[(&str, &str, Rule)] = &[
    ("resource", "resource", Rule::AnyLoosens),
    (
        "upstreamIdentity",
        "upstream.identity",
        Rule::Ordered(&["identityHeaders", "delegation", "forwardToken"]),
    ),
    ("upstreamTaskState", "upstream.taskState", Rule::Neutral),
    ("protocol.versions", "protocol.versions", Rule::AddedLoosens),
    (
        "protocol.allowedOrigins",
        "protocol.allowedOrigins",
        Rule::AddedLoosens,
    ),
    (
        "protocol.allowMissingNameHeader",
        "protocol.allowMissingNameHeader",
        Rule::TrueLoosens,
    ),
    ("tasks.tools", "tasks.tools", Rule::AddedLoosens),
    (
        "tasks.requiredScopes.*",
        "tasks.requiredScopes.*",
        Rule::RemovedLoosens,
    ),
    (
        "tasks.defaultTtl",
        "tasks.retention.defaultTtl",
        Rule::LongerLoosens,
    ),
    (
        "tasks.maxTtl",
        "tasks.retention.maxTtl",
        Rule::LongerLoosens,
    ),
    (
        "tasks.deleteResultAfterRetrieval",
        "tasks.retention.deleteResultAfterRetrieval",
        Rule::FalseLoosens,
    ),
    (
        "tasks.defaultDeadline",
        "tasks.deadline.default",
        Rule::LongerLoosens,
    ),
    (
        "tasks.maxDeadline",
        "tasks.deadline.max",
        Rule::LongerLoosens,
    ),
    (
        "tasks.perToolDeadline.*",
        "tasks.deadline.perTool.*",
        Rule::LongerLoosens,
    ),
    (
        "tasks.minPollInterval",
        "tasks.minPollInterval",
        Rule::ShorterLoosens,
    ),
    (
        "tasks.concurrency.*",
        "tasks.concurrency.*",
        Rule::HigherLoosens,
    ),
    (
        "tasks.idempotencyWindow",
        "tasks.idempotency.window",
        Rule::Neutral,
    ),
    (
        "tasks.deriveIdempotencyKey",
        "tasks.idempotency.deriveFromRequest",
        Rule::Neutral,
    ),
    (
        "tasks.adminCancelScope",
        "tasks.adminCancelScope",
        Rule::AnyLoosens,
    ),
    (
        "tasks.results.mode",
        "tasks.results.mode",
        Rule::Ordered(&["statusOnly", "full"]),
    ),
    (
        "tasks.results.maxBytes",
        "tasks.results.maxBytes",
        Rule::HigherLoosens,
    ),
    (
        "tasks.results.drop",
        "tasks.results.drop",
        Rule::RemovedLoosens,
    ),
    (
        "tasks.results.mask",
        "tasks.results.mask",
        Rule::RemovedLoosens,
    ),
    (
        "tasks.identityLease",
        "tasks.identityLease",
        Rule::LongerLoosens,
    ),
    (
        "tasks.objects.tools.*",
        "tasks.objects.tools.*",
        Rule::PresenceTightens,
    ),
    (
        "tasks.objects.authorizer.url",
        "tasks.objects.authorizer.url",
        Rule::AnyLoosens,
    ),
    (
        "tasks.objects.authorizer.cacheTtl",
        "tasks.objects.authorizer.cacheTtl",
        Rule::LongerLoosens,
    ),
    (
        "tasks.objects.authorizer.*",
        "tasks.objects.authorizer.*",
        Rule::Neutral,
    ),
    (
        "listen.notifications",
        "listen.notifications",
        Rule::AddedLoosens,
    ),
    (
        "listen.resourcePatterns",
        "listen.resourceSubscriptions.allow",
        Rule::AddedLoosens,
    ),
    (
        "listen.maxStreamsPerPrincipal",
        "listen.maxStreamsPerPrincipal",
        Rule::HigherLoosens,
    ),
    (
        "listen.maxStreamDuration",
        "listen.maxStreamDuration",
        Rule::LongerLoosens,
    ),
    (
        "capabilities.secretPatterns",
        "capabilities.secretPatterns",
        Rule::RemovedLoosens,
    ),
    (
        "capabilities.*",
        "capabilities.*",
        Rule::Ordered(&["deny", "exception"]),
    ),
    (
        "audit.statusReadSamplePercent",
        "audit.statusReadSamplePercent",
        Rule::LowerLoosens,
    ),
    (
        "audit.onFailure",
        "audit.onFailure",
        Rule::Ordered(&["failClosed", "failOpen"]),
    ),
    ("audit.*", "audit.*", Rule::Neutral),
];

/// The rule and spec name of an effective path; the most specific entry wins (exact paths are
/// listed before wildcards of the same parent).
pub(super) fn rule_for(path: &str) -> (String, Rule) {
    for (pattern, name, rule) in RULES {
        if let Some(key) = matches(pattern, path) {
            return (name.replace('*', &key), *rule);
        }
    }
    (path.to_owned(), Rule::Neutral)
}

/// Whether `path` matches `pattern`; the text `*` stood for (empty without a wildcard).
fn matches(pattern: &str, path: &str) -> Option<String> {
    match pattern.strip_suffix('*') {
        None => (pattern == path).then(String::new),
        Some(prefix) => path
            .strip_prefix(prefix)
            .filter(|key| !key.is_empty() && !key.contains('.'))
            .map(str::to_owned),
    }
}

/// Whether a rule compares whole values at this path (lists, and maps of scopes) instead of
/// descending into them.
pub(super) fn compares_whole(rule: Rule) -> bool {
    matches!(
        rule,
        Rule::AddedLoosens | Rule::RemovedLoosens | Rule::AnyLoosens
    )
}

/// Whether some rule names `path`.
pub(super) fn is_known(path: &str) -> bool {
    RULES
        .iter()
        .any(|(pattern, ..)| matches(pattern, path).is_some())
}
