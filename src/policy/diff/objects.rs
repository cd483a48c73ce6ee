//! Changes of the parts of a policy that are lists of named things: trusted issuers,
//! exceptions, revocations.

use super::super::effective::{EffectivePolicy, GrantedException, RevocationRule};
use super::{Change, Effect, compare, set, set_change, text};

/// Trusted issuers by URL: a new one loosens, a removed one tightens, a changed one is judged
/// field by field (a new audience, algorithm or key source loosens).
pub(super) fn issuers(old: &EffectivePolicy, new: &EffectivePolicy, changes: &mut Vec<Change>) {
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
                    let (words, effect) = set_change(&old_set, &new_set, true);
                    (format!("{field}: {words}"), effect)
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
pub(super) fn capability_exceptions(change: &Change, new: &EffectivePolicy) -> Option<String> {
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
    serde_json::to_value(exception.spec.capability)
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
pub(super) fn exceptions(
    old: &[GrantedException],
    new: &[GrantedException],
    changes: &mut Vec<Change>,
) {
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
            None => Some((
                Effect::Loosens,
                format!("exception {} granted", describe(after)),
            )),
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
pub(super) fn revocations(
    old: &[RevocationRule],
    new: &[RevocationRule],
    changes: &mut Vec<Change>,
) {
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
        format!(
            "{} ({} of {}, tokens before {})",
            r.name, who, r.issuer, r.revoked_before
        )
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
                summary: format!("revocation {} → {}", describe(before), describe(after)),
            }),
            Some(_) => {}
        }
    }
}
