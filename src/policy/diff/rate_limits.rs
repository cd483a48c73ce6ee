//! Changes of `rateLimits`, bucket by bucket: a higher rate or burst, a removed bucket, a
//! removed method class or tool entry, or no limits at all loosens; the opposite tightens.
//!
//! Compared on the compiled rules (bursts made explicit), so writing out a default burst is no
//! change. Tool names are map keys that may contain dots, which is why this family is not
//! judged through the path rules of [`super::rules`].

use std::collections::BTreeSet;

use super::super::rate_limits::{Bucket, MethodClass, RateLimitRules, ScopedBuckets};
use super::{Change, Effect, compare};

/// The changes from `old` to `new` limits (`None`: no limit at all).
pub(super) fn rate_limits(
    old: Option<&RateLimitRules>,
    new: Option<&RateLimitRules>,
    changes: &mut Vec<Change>,
) {
    match (old, new) {
        (None, None) => {}
        (Some(old), None) => changes.push(Change {
            field: "rateLimits".into(),
            before: Some(describe_rules(old)),
            after: None,
            effect: Effect::Loosens,
            summary: "rateLimits: removed, requests are no longer rate-limited".into(),
        }),
        (None, Some(new)) => {
            let text = describe_rules(new);
            changes.push(Change {
                field: "rateLimits".into(),
                before: None,
                summary: format!("rateLimits: added {text}"),
                after: Some(text),
                effect: Effect::Tightens,
            });
        }
        (Some(old), Some(new)) => {
            scoped("rateLimits", Some(&old.all), Some(&new.all), false, changes);
            let classes: BTreeSet<&MethodClass> =
                old.methods.keys().chain(new.methods.keys()).collect();
            for class in classes {
                scoped(
                    &format!("rateLimits.methods.{}", class_name(*class)),
                    old.methods.get(class),
                    new.methods.get(class),
                    true,
                    changes,
                );
            }
            let tools: BTreeSet<&String> = old.tools.keys().chain(new.tools.keys()).collect();
            for tool in tools {
                scoped(
                    &format!("rateLimits.tools.{tool}"),
                    old.tools.get(tool),
                    new.tools.get(tool),
                    true,
                    changes,
                );
            }
        }
    }
}

/// The spec name of a method class (`toolsCall`, `taskReads`, `listenOpens`).
fn class_name(class: MethodClass) -> &'static str {
    match class {
        MethodClass::ToolsCall => "toolsCall",
        MethodClass::TaskReads => "taskReads",
        MethodClass::ListenOpens => "listenOpens",
    }
}

fn buckets(scoped: &ScopedBuckets) -> [(&'static str, Option<Bucket>); 4] {
    [
        ("perPrincipal", scoped.per_principal),
        ("perTenant", scoped.per_tenant),
        ("perClient", scoped.per_client),
        ("perServer", scoped.per_server),
    ]
}

fn describe(bucket: Bucket) -> String {
    format!("{}/s, burst {}", bucket.requests_per_second, bucket.burst)
}

/// `perPrincipal 10/s, burst 20; perServer …` (with `prefix.` before each scope).
fn describe_scoped(prefix: &str, scoped: &ScopedBuckets) -> Vec<String> {
    buckets(scoped)
        .into_iter()
        .filter_map(|(scope, bucket)| Some(format!("{prefix}{scope} {}", describe(bucket?))))
        .collect()
}

fn describe_rules(rules: &RateLimitRules) -> String {
    let mut parts = describe_scoped("", &rules.all);
    for (class, scoped) in &rules.methods {
        parts.extend(describe_scoped(
            &format!("methods.{}.", class_name(*class)),
            scoped,
        ));
    }
    for (tool, scoped) in &rules.tools {
        parts.extend(describe_scoped(&format!("tools.{tool}."), scoped));
    }
    parts.join("; ")
}

/// One family of buckets. A method class or tool entry (`entry`) that appears or disappears
/// whole is one change; otherwise each bucket is compared.
fn scoped(
    field: &str,
    old: Option<&ScopedBuckets>,
    new: Option<&ScopedBuckets>,
    entry: bool,
    changes: &mut Vec<Change>,
) {
    match (old, new) {
        (Some(old), None) if entry => changes.push(Change {
            field: field.to_owned(),
            before: Some(describe_scoped("", old).join("; ")),
            after: None,
            effect: Effect::Loosens,
            summary: format!("{field}: removed {}", describe_scoped("", old).join("; ")),
        }),
        (None, Some(new)) if entry => changes.push(Change {
            field: field.to_owned(),
            before: None,
            after: Some(describe_scoped("", new).join("; ")),
            effect: Effect::Tightens,
            summary: format!("{field}: added {}", describe_scoped("", new).join("; ")),
        }),
        _ => {
            let (old, new) = (
                old.cloned().unwrap_or_default(),
                new.cloned().unwrap_or_default(),
            );
            for ((scope, before), (_, after)) in buckets(&old).into_iter().zip(buckets(&new)) {
                bucket(&format!("{field}.{scope}"), before, after, changes);
            }
        }
    }
}

fn bucket(field: &str, old: Option<Bucket>, new: Option<Bucket>, changes: &mut Vec<Change>) {
    match (old, new) {
        (None, None) => {}
        (Some(old), None) => changes.push(Change {
            field: field.to_owned(),
            before: Some(describe(old)),
            after: None,
            effect: Effect::Loosens,
            summary: format!("{field}: removed {}", describe(old)),
        }),
        (None, Some(new)) => changes.push(Change {
            field: field.to_owned(),
            before: None,
            after: Some(describe(new)),
            effect: Effect::Tightens,
            summary: format!("{field}: added {}", describe(new)),
        }),
        (Some(old), Some(new)) => {
            let quantities = [
                (
                    "requestsPerSecond",
                    old.requests_per_second,
                    new.requests_per_second,
                ),
                ("burst", f64::from(old.burst), f64::from(new.burst)),
            ];
            for (name, before, after) in quantities {
                if before == after {
                    continue;
                }
                changes.push(Change {
                    field: format!("{field}.{name}"),
                    before: Some(before.to_string()),
                    after: Some(after.to_string()),
                    effect: compare(Some(before), Some(after), true),
                    summary: format!("{field}.{name} {before} → {after}"),
                });
            }
        }
    }
}
