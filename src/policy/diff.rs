//! What a change of manifests does to each server's *effective* policy (defaults applied,
//! exceptions and revocations folded in), in words a reviewer reads, and whether it loosens
//! security (`lifeguard policy diff`).
//!
//! Both sides are compiled policies ([`EffectivePolicy`]); they are compared as their
//! serialized trees, field by field, and each changed field is judged by the rule of its path
//! ([`RULES`]): a longer TTL, a raised quota, a wider tool list, a removed scope, a new trusted
//! issuer, a new exception or a withdrawn revocation loosens; the opposite tightens; a field with
//! no security meaning (audit file path, idempotency window) is neutral. A field that no rule
//! names is reported as changed and judged neutral, so a new policy field shows up in every
//! diff before it has a rule.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;
use serde_json::Value;

use super::effective::{EffectivePolicy, GrantedException, ObjectKey, RevocationRule};
use crate::api::PolicyDuration;

/// Which way a change moves security.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Effect {
    Loosens,
    Tightens,
    Neutral,
}

/// One changed field of one policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Change {
    /// The field, named as in the McpServerPolicy spec where it has a spec name
    /// (`tasks.retention.maxTtl`), else as in the effective policy.
    pub field: String,
    /// The value before and after, as text; `None` when absent on that side.
    pub before: Option<String>,
    pub after: Option<String>,
    pub effect: Effect,
    /// The change in words: `tasks.retention.maxTtl 1h → 30m`.
    pub summary: String,
}

/// What happened to one policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyChange {
    /// New: its pods now get tasks and listen streams where they had none (fail closed).
    Added,
    /// Gone: its pods fail closed.
    Removed,
    Changed,
    Unchanged,
}

/// One McpServerPolicy's diff.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PolicyDiff {
    /// `namespace/name`.
    pub policy: String,
    pub change: PolicyChange,
    pub changes: Vec<Change>,
}

impl PolicyDiff {
    /// Whether anything in it loosens security (an added policy does).
    pub fn loosens(&self) -> bool {
        self.change == PolicyChange::Added
            || self.changes.iter().any(|c| c.effect == Effect::Loosens)
    }
}

/// Every policy of either side, by name: added, removed, changed or unchanged.
pub fn diff_policies(old: &[EffectivePolicy], new: &[EffectivePolicy]) -> Vec<PolicyDiff> {
    let by_key = |list: &[EffectivePolicy]| -> BTreeMap<ObjectKey, EffectivePolicy> {
        list.iter().map(|p| (p.policy.clone(), p.clone())).collect()
    };
    let (old, new) = (by_key(old), by_key(new));
    let mut keys: Vec<&ObjectKey> = old.keys().chain(new.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .map(|key| {
            let (change, changes) = match (old.get(key), new.get(key)) {
                (Some(before), Some(after)) => {
                    let changes = diff_policy(before, after);
                    let change = if changes.is_empty() {
                        PolicyChange::Unchanged
                    } else {
                        PolicyChange::Changed
                    };
                    (change, changes)
                }
                (None, Some(_)) => (PolicyChange::Added, Vec::new()),
                _ => (PolicyChange::Removed, Vec::new()),
            };
            PolicyDiff {
                policy: key.to_string(),
                change,
                changes,
            }
        })
        .collect()
}

/// The changes from `old` to `new`, in field order.
pub fn diff_policy(old: &EffectivePolicy, new: &EffectivePolicy) -> Vec<Change> {
    let mut changes = Vec::new();
    let (mut before, mut after) = (tree(old), tree(new));
    for side in [&mut before, &mut after] {
        if let Some(map) = side.as_object_mut() {
            // Who the policy is and which generation: not a change of what it enforces.
            for key in ["policy", "generation", "exceptions", "revocations", "issuers"] {
                map.remove(key);
            }
        }
    }
    issuers(old, new, &mut changes);
    walk("", &before, &after, &mut changes);
    for change in &mut changes {
        if let Some(suffix) = capability_exceptions(change, new) {
            change.summary.push_str(&suffix);
        }
    }
    exceptions(&old.exceptions, &new.exceptions, &mut changes);
    revocations(&old.revocations, &new.revocations, &mut changes);
    changes
}

fn tree(policy: &EffectivePolicy) -> Value {
    serde_json::to_value(policy).unwrap_or(Value::Null)
}

/// How a change of one field is judged.
#[derive(Clone, Copy, Debug)]
enum Rule {
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
    ("protocol.allowedOrigins", "protocol.allowedOrigins", Rule::AddedLoosens),
    (
        "protocol.allowMissingNameHeader",
        "protocol.allowMissingNameHeader",
        Rule::TrueLoosens,
    ),
    ("tasks.tools", "tasks.tools", Rule::AddedLoosens),
    ("tasks.requiredScopes.*", "tasks.requiredScopes.*", Rule::RemovedLoosens),
    ("tasks.defaultTtl", "tasks.retention.defaultTtl", Rule::LongerLoosens),
    ("tasks.maxTtl", "tasks.retention.maxTtl", Rule::LongerLoosens),
    (
        "tasks.deleteResultAfterRetrieval",
        "tasks.retention.deleteResultAfterRetrieval",
        Rule::FalseLoosens,
    ),
    ("tasks.defaultDeadline", "tasks.deadline.default", Rule::LongerLoosens),
    ("tasks.maxDeadline", "tasks.deadline.max", Rule::LongerLoosens),
    ("tasks.perToolDeadline.*", "tasks.deadline.perTool.*", Rule::LongerLoosens),
    ("tasks.minPollInterval", "tasks.minPollInterval", Rule::ShorterLoosens),
    ("tasks.concurrency.*", "tasks.concurrency.*", Rule::HigherLoosens),
    ("tasks.idempotencyWindow", "tasks.idempotency.window", Rule::Neutral),
    (
        "tasks.deriveIdempotencyKey",
        "tasks.idempotency.deriveFromRequest",
        Rule::Neutral,
    ),
    ("tasks.adminCancelScope", "tasks.adminCancelScope", Rule::AnyLoosens),
    (
        "tasks.results.mode",
        "tasks.results.mode",
        Rule::Ordered(&["statusOnly", "full"]),
    ),
    ("tasks.results.maxBytes", "tasks.results.maxBytes", Rule::HigherLoosens),
    ("tasks.results.drop", "tasks.results.drop", Rule::RemovedLoosens),
    ("tasks.results.mask", "tasks.results.mask", Rule::RemovedLoosens),
    ("tasks.identityLease", "tasks.identityLease", Rule::LongerLoosens),
    ("tasks.objects.tools.*", "tasks.objects.tools.*", Rule::PresenceTightens),
    ("tasks.objects.authorizer.url", "tasks.objects.authorizer.url", Rule::AnyLoosens),
    (
        "tasks.objects.authorizer.cacheTtl",
        "tasks.objects.authorizer.cacheTtl",
        Rule::LongerLoosens,
    ),
    ("tasks.objects.authorizer.*", "tasks.objects.authorizer.*", Rule::Neutral),
    ("listen.notifications", "listen.notifications", Rule::AddedLoosens),
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
    ("listen.maxStreamDuration", "listen.maxStreamDuration", Rule::LongerLoosens),
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
fn rule_for(path: &str) -> (String, Rule) {
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
fn compares_whole(rule: Rule) -> bool {
    matches!(
        rule,
        Rule::AddedLoosens | Rule::RemovedLoosens | Rule::AnyLoosens
    )
}

fn walk(path: &str, before: &Value, after: &Value, changes: &mut Vec<Change>) {
    if before == after {
        return;
    }
    let (_, rule) = rule_for(path);
    if let (Value::Object(b), Value::Object(a)) = (before, after)
        && !(compares_whole(rule) && !path.is_empty() && is_known(path))
    {
        let mut seen = std::collections::BTreeSet::new();
        for key in b.keys().chain(a.keys()) {
            if !seen.insert(key) {
                continue;
            }
            let child = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            walk(
                &child,
                b.get(key).unwrap_or(&Value::Null),
                a.get(key).unwrap_or(&Value::Null),
                changes,
            );
        }
        return;
    }
    // A section switched on or off (`tasks`, `listen`, `tasks.objects`).
    if path_is_section(path) && (before.is_null() || after.is_null()) {
        let (name, effect) = if before.is_null() {
            ("enabled", Effect::Loosens)
        } else {
            ("disabled", Effect::Tightens)
        };
        // Turning object-level permission off loosens; on tightens.
        let effect = if path == "tasks.objects" {
            flip(effect)
        } else {
            effect
        };
        changes.push(Change {
            field: path.to_owned(),
            before: (!before.is_null()).then(|| "on".to_owned()),
            after: (!after.is_null()).then(|| "on".to_owned()),
            effect,
            summary: format!("{path}: {name}"),
        });
        return;
    }
    changes.push(judge(path, before, after));
}

fn is_known(path: &str) -> bool {
    RULES.iter().any(|(pattern, ..)| matches(pattern, path).is_some())
}

fn path_is_section(path: &str) -> bool {
    matches!(path, "tasks" | "listen" | "tasks.objects")
}

fn flip(effect: Effect) -> Effect {
    match effect {
        Effect::Loosens => Effect::Tightens,
        Effect::Tightens => Effect::Loosens,
        Effect::Neutral => Effect::Neutral,
    }
}

/// One changed field, judged by its rule.
fn judge(path: &str, before: &Value, after: &Value) -> Change {
    let (field, rule) = rule_for(path);
    let (b, a) = (text(before), text(after));
    // Every tool against a list of tools.
    let all = |v: &Value| v.as_str() == Some("all");
    if all(before) != all(after) && path == "tasks.tools" {
        let effect = if all(after) {
            Effect::Loosens
        } else {
            Effect::Tightens
        };
        let words = |v: &Value| {
            if all(v) {
                "every tool".to_owned()
            } else {
                text(v).unwrap_or_default()
            }
        };
        return Change {
            summary: format!("{field} {} → {}", words(before), words(after)),
            field,
            before: b,
            after: a,
            effect,
        };
    }
    if let (Some(old), Some(new)) = (set(before), set(after))
        && matches!(rule, Rule::AddedLoosens | Rule::RemovedLoosens)
    {
        let added: Vec<&String> = new.iter().filter(|x| !old.contains(x)).collect();
        let removed: Vec<&String> = old.iter().filter(|x| !new.contains(x)).collect();
        let effect = match rule {
            Rule::AddedLoosens if !added.is_empty() => Effect::Loosens,
            Rule::RemovedLoosens if !removed.is_empty() => Effect::Loosens,
            _ if added.is_empty() && removed.is_empty() => Effect::Neutral,
            _ => Effect::Tightens,
        };
        let mut words = Vec::new();
        if !added.is_empty() {
            words.push(format!("added {}", join(&added)));
        }
        if !removed.is_empty() {
            words.push(format!("removed {}", join(&removed)));
        }
        if words.is_empty() {
            words.push("reordered".to_owned());
        }
        return Change {
            summary: format!("{field}: {}", words.join("; ")),
            field,
            before: b,
            after: a,
            effect,
        };
    }
    let effect = match rule {
        Rule::LongerLoosens => compare(duration(before), duration(after), true),
        Rule::ShorterLoosens => flip(compare(duration(before), duration(after), true)),
        Rule::HigherLoosens => compare(number(before), number(after), true),
        Rule::LowerLoosens => compare(number(before), number(after), false),
        Rule::Ordered(order) => {
            let rank = |v: &Value| v.as_str().and_then(|s| order.iter().position(|o| *o == s));
            match (rank(before), rank(after)) {
                (Some(x), Some(y)) if y > x => Effect::Loosens,
                (Some(x), Some(y)) if y < x => Effect::Tightens,
                _ => Effect::Neutral,
            }
        }
        Rule::TrueLoosens => bool_effect(before, after, true),
        Rule::FalseLoosens => bool_effect(before, after, false),
        Rule::AnyLoosens => Effect::Loosens,
        Rule::PresenceTightens if before.is_null() => Effect::Tightens,
        Rule::PresenceTightens => Effect::Loosens,
        Rule::AddedLoosens | Rule::RemovedLoosens | Rule::Neutral => Effect::Neutral,
    };
    let unset = || "unset".to_owned();
    Change {
        summary: format!(
            "{field} {} → {}",
            b.clone().unwrap_or_else(unset),
            a.clone().unwrap_or_else(unset)
        ),
        field,
        before: b,
        after: a,
        effect,
    }
}

/// Orders two optional quantities where "absent" means "no limit": `higher_loosens` says
/// which direction loosens.
fn compare<T: PartialOrd>(before: Option<T>, after: Option<T>, higher_loosens: bool) -> Effect {
    let up = match (before, after) {
        (Some(b), Some(a)) if a > b => true,
        (Some(b), Some(a)) if a < b => false,
        (Some(_), None) => true,
        (None, Some(_)) => false,
        _ => return Effect::Neutral,
    };
    if up == higher_loosens {
        Effect::Loosens
    } else {
        Effect::Tightens
    }
}

fn bool_effect(before: &Value, after: &Value, true_loosens: bool) -> Effect {
    match (before.as_bool(), after.as_bool()) {
        (Some(b), Some(a)) if a != b => {
            if a == true_loosens {
                Effect::Loosens
            } else {
                Effect::Tightens
            }
        }
        _ => Effect::Neutral,
    }
}

fn duration(value: &Value) -> Option<std::time::Duration> {
    value
        .as_str()
        .and_then(|s| s.parse::<PolicyDuration>().ok())
        .map(|d| d.get())
}

fn number(value: &Value) -> Option<f64> {
    value.as_f64()
}

/// A list of scalars (or `all`/`{only: […]}` tool sets) as a set of texts.
fn set(value: &Value) -> Option<Vec<String>> {
    match value {
        Value::Array(items) => Some(items.iter().filter_map(text).collect()),
        Value::Object(map) if map.len() == 1 && map.contains_key("only") => set(&map["only"]),
        Value::Null => Some(Vec::new()),
        _ => None,
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        Value::Array(items) => Some(format!(
            "[{}]",
            items.iter().filter_map(text).collect::<Vec<_>>().join(", ")
        )),
        Value::Object(map) if map.len() == 1 && map.contains_key("only") => text(&map["only"]),
        other => Some(other.to_string()),
    }
}

fn join(items: &[&String]) -> String {
    items
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Trusted issuers by URL: a new one loosens, a removed one tightens, a changed one is judged
/// field by field (a new audience, algorithm or key source loosens).
fn issuers(old: &EffectivePolicy, new: &EffectivePolicy, changes: &mut Vec<Change>) {
    for before in &old.issuers {
        if new.issuer(&before.issuer).is_none() {
            changes.push(Change {
                field: "identity.issuers".into(),
                before: Some(before.issuer.clone()),
                after: None,
                effect: Effect::Tightens,
                summary: format!("identity.issuers: no longer trusts {}", before.issuer),
            });
        }
    }
    for after in &new.issuers {
        let Some(before) = old.issuer(&after.issuer) else {
            changes.push(Change {
                field: "identity.issuers".into(),
                before: None,
                after: Some(after.issuer.clone()),
                effect: Effect::Loosens,
                summary: format!("identity.issuers: trusts {}", after.issuer),
            });
            continue;
        };
        let (b, a) = (
            serde_json::to_value(before).unwrap_or_default(),
            serde_json::to_value(after).unwrap_or_default(),
        );
        for key in ["audiences", "algorithms", "keys", "claims"] {
            if b.get(key) == a.get(key) {
                continue;
            }
            let field = format!("identity.issuers[{}].{key}", after.issuer);
            let (before_text, after_text) = (text(&b[key]), text(&a[key]));
            let (summary, effect) = match (set(&b[key]), set(&a[key])) {
                (Some(old_set), Some(new_set)) => {
                    let added: Vec<&String> =
                        new_set.iter().filter(|x| !old_set.contains(x)).collect();
                    let removed: Vec<&String> =
                        old_set.iter().filter(|x| !new_set.contains(x)).collect();
                    let mut words = Vec::new();
                    if !added.is_empty() {
                        words.push(format!("added {}", join(&added)));
                    }
                    if !removed.is_empty() {
                        words.push(format!("removed {}", join(&removed)));
                    }
                    let effect = if added.is_empty() {
                        Effect::Tightens
                    } else {
                        Effect::Loosens
                    };
                    (format!("{field}: {}", words.join("; ")), effect)
                }
                // Where keys come from or which claims name the owner: new trust.
                _ => (
                    format!(
                        "{field} {} → {}",
                        before_text.clone().unwrap_or_default(),
                        after_text.clone().unwrap_or_default()
                    ),
                    Effect::Loosens,
                ),
            };
            changes.push(Change {
                field,
                before: before_text,
                after: after_text,
                effect,
                summary,
            });
        }
    }
}

/// `(name, until date)` of the new side's exceptions for a capability that changed mode.
fn capability_exceptions(change: &Change, new: &EffectivePolicy) -> Option<String> {
    let capability = change.field.strip_prefix("capabilities.")?;
    if change.after.as_deref() != Some("exception") {
        return None;
    }
    let granted: Vec<String> = new
        .exceptions
        .iter()
        .filter(|e| capability_name(e) == capability)
        .map(|e| format!("{}, until {}", e.exception.name, date(e)))
        .collect();
    Some(if granted.is_empty() {
        " (no exception grants it yet)".to_owned()
    } else {
        format!(" ({})", granted.join("; "))
    })
}

fn capability_name(exception: &GrantedException) -> String {
    serde_json::to_value(&exception.spec.capability)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn date(exception: &GrantedException) -> String {
    exception
        .expires_at
        .strftime("%Y-%m-%d %H:%M UTC")
        .to_string()
}

/// Exceptions by name: a new one, a later expiry or any other change of what it grants loosens;
/// a withdrawn one tightens.
fn exceptions(old: &[GrantedException], new: &[GrantedException], changes: &mut Vec<Change>) {
    let describe = |e: &GrantedException| {
        format!(
            "{} for {} until {}",
            e.exception.name,
            capability_name(e),
            date(e)
        )
    };
    for before in old {
        if !new.iter().any(|e| e.exception == before.exception) {
            changes.push(Change {
                field: "exceptions".into(),
                before: Some(describe(before)),
                after: None,
                effect: Effect::Tightens,
                summary: format!("exception {} withdrawn", describe(before)),
            });
        }
    }
    for after in new {
        let effect_and_words = match old.iter().find(|e| e.exception == after.exception) {
            None => Some((Effect::Loosens, format!("exception {} granted", describe(after)))),
            Some(before) if before == after => None,
            Some(before) if before.spec == after.spec => Some((
                compare(Some(before.expires_at), Some(after.expires_at), true),
                format!(
                    "exception {}: valid until {} → {}",
                    after.exception.name,
                    date(before),
                    date(after)
                ),
            )),
            Some(_) => Some((
                Effect::Loosens,
                format!("exception {} changed (re-signed grant)", describe(after)),
            )),
        };
        if let Some((effect, summary)) = effect_and_words {
            changes.push(Change {
                field: "exceptions".into(),
                before: old
                    .iter()
                    .find(|e| e.exception == after.exception)
                    .map(describe),
                after: Some(describe(after)),
                effect,
                summary,
            });
        }
    }
}

/// Revocations by name: a withdrawn one loosens (the principal's tokens work again), a new one
/// tightens.
fn revocations(old: &[RevocationRule], new: &[RevocationRule], changes: &mut Vec<Change>) {
    let describe = |r: &RevocationRule| {
        let who = [
            r.subject.as_deref().map(|s| format!("subject {s}")),
            r.tenant.as_deref().map(|t| format!("tenant {t}")),
            r.client.as_deref().map(|c| format!("client {c}")),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(", ");
        format!("{} ({} of {}, tokens before {})", r.name, who, r.issuer, r.revoked_before)
    };
    for before in old {
        if !new.iter().any(|r| r.name == before.name) {
            changes.push(Change {
                field: "revocations".into(),
                before: Some(describe(before)),
                after: None,
                effect: Effect::Loosens,
                summary: format!("revocation {} withdrawn", describe(before)),
            });
        }
    }
    for after in new {
        match old.iter().find(|r| r.name == after.name) {
            None => changes.push(Change {
                field: "revocations".into(),
                before: None,
                after: Some(describe(after)),
                effect: Effect::Tightens,
                summary: format!("revocation {} added", describe(after)),
            }),
            Some(before) if before != after => changes.push(Change {
                field: "revocations".into(),
                before: Some(describe(before)),
                after: Some(describe(after)),
                effect: compare(
                    Some(before.revoked_before),
                    Some(after.revoked_before),
                    false,
                ),
                summary: format!(
                    "revocation {} → {}",
                    describe(before),
                    describe(after)
                ),
            }),
            Some(_) => {}
        }
    }
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mark = match self.effect {
            Effect::Loosens => "LOOSENS ",
            Effect::Tightens => "tightens",
            Effect::Neutral => "        ",
        };
        write!(f, "{mark} {}", self.summary)
    }
}

#[cfg(test)]
#[path = "diff_tests.rs"]
mod tests;
