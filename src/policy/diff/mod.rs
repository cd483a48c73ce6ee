//! What a change of manifests does to each server's *effective* policy (defaults applied,
//! exceptions and revocations folded in), in words a reviewer reads, and whether it loosens
//! security (`lifeguard policy diff`).
//!
//! Both sides are compiled policies ([`EffectivePolicy`]); they are compared as their
//! serialized trees, field by field, and each changed field is judged by the rule of its path
//! ([`RULES`]): a longer TTL, a raised quota or rate limit, a wider tool list, a removed scope, a
//! new trusted issuer, a new exception or a withdrawn revocation loosens; the opposite
//! tightens; a field with no security meaning (audit file path, idempotency window) is neutral.
//! A field that no rule names is reported as changed and judged neutral, so a new policy field
//! shows up in every diff before it has a rule.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;
use serde_json::Value;

use super::effective::{EffectivePolicy, ObjectKey};
use crate::api::PolicyDuration;

mod objects;
mod rate_limits;
mod rules;

use objects::{capability_exceptions, exceptions, issuers, revocations};
use rules::{Rule, compares_whole, is_known, rule_for};

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
            for key in [
                "policy",
                "generation",
                "exceptions",
                "revocations",
                "issuers",
                // Judged bucket by bucket below (tool names may contain dots).
                "rateLimits",
            ] {
                map.remove(key);
            }
        }
    }
    issuers(old, new, &mut changes);
    walk("", &before, &after, &mut changes);
    rate_limits::rate_limits(
        old.rate_limits.as_ref(),
        new.rate_limits.as_ref(),
        &mut changes,
    );
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
        let (words, effect) = set_change(&old, &new, matches!(rule, Rule::AddedLoosens));
        return Change {
            summary: format!("{field}: {words}"),
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
pub(super) fn compare<T: PartialOrd>(
    before: Option<T>,
    after: Option<T>,
    higher_loosens: bool,
) -> Effect {
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
pub(super) fn set(value: &Value) -> Option<Vec<String>> {
    match value {
        Value::Array(items) => Some(items.iter().filter_map(text).collect()),
        Value::Object(map) if map.len() == 1 && map.contains_key("only") => set(&map["only"]),
        Value::Null => Some(Vec::new()),
        _ => None,
    }
}

pub(super) fn text(value: &Value) -> Option<String> {
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

/// A list read as a set, before and after: what was added and removed, in words, and whether
/// that loosens (additions loosen when `added_loosens`, else removals do).
pub(super) fn set_change(old: &[String], new: &[String], added_loosens: bool) -> (String, Effect) {
    let added: Vec<&String> = new.iter().filter(|x| !old.contains(x)).collect();
    let removed: Vec<&String> = old.iter().filter(|x| !new.contains(x)).collect();
    let loosening = if added_loosens { &added } else { &removed };
    let effect = if !loosening.is_empty() {
        Effect::Loosens
    } else if added.is_empty() && removed.is_empty() {
        Effect::Neutral
    } else {
        Effect::Tightens
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
    (words.join("; "), effect)
}

pub(super) fn join(items: &[&String]) -> String {
    items
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(", ")
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
mod tests;
