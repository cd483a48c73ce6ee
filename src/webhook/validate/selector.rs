//! Label selectors as sets of label sets: whether two can select the same pod, and which
//! selectors Kubernetes itself would refuse.
//!
//! A selector is parsed exactly as the operator parses it (kube's `Selector::try_from`): one
//! that does not parse selects no pod there, so here it matches nothing and overlaps nothing.
//! Requirements on different keys are independent, so two selectors overlap exactly when, key by
//! key, the conjunction of their requirements on that key can be met by some value or by the
//! key's absence.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Expression, Selector};

/// Whether some label set satisfies both `a` and `b`. An empty selector matches everything; a
/// selector that contradicts itself (`In []`, `Exists` and `DoesNotExist` on one key,
/// `matchLabels k=v` with `NotIn [v]`, …) or does not parse matches nothing and overlaps
/// nothing. Symmetric; `selectors_overlap(s, s)` says whether `s` can match anything at all.
pub fn selectors_overlap(a: &LabelSelector, b: &LabelSelector) -> bool {
    overlap_witness(a, b).is_some()
}

/// A label set that satisfies both `a` and `b` (keys that must be absent are left out), or
/// `None` when there is none. See [`selectors_overlap`].
pub fn overlap_witness(a: &LabelSelector, b: &LabelSelector) -> Option<BTreeMap<String, String>> {
    let mut keys: BTreeMap<String, KeyConstraint> = BTreeMap::new();
    for selector in [a, b] {
        let parsed = Selector::try_from(selector.clone()).ok()?;
        for expression in parsed {
            match expression {
                Expression::In(key, values) => keys.entry(key).or_default().only(values),
                Expression::Equal(key, value) => {
                    keys.entry(key).or_default().only(BTreeSet::from([value]));
                }
                Expression::NotIn(key, values) => {
                    keys.entry(key).or_default().excluded.extend(values)
                }
                Expression::NotEqual(key, value) => {
                    keys.entry(key).or_default().excluded.insert(value);
                }
                Expression::Exists(key) => keys.entry(key).or_default().present = true,
                Expression::DoesNotExist(key) => keys.entry(key).or_default().absent = true,
            }
        }
    }
    let mut witness = BTreeMap::new();
    for (key, constraint) in keys {
        if let Some(value) = constraint.solve()? {
            witness.insert(key, value);
        }
    }
    Some(witness)
}

/// The conjunction of every requirement on one key.
#[derive(Debug, Default)]
struct KeyConstraint {
    /// The key must be present (`Exists`, `In`, `matchLabels`).
    present: bool,
    /// The key must be absent (`DoesNotExist`).
    absent: bool,
    /// The value must be one of these (`In`, `matchLabels`); `None` when unconstrained.
    allowed: Option<BTreeSet<String>>,
    /// The value, when present, must not be one of these (`NotIn`).
    excluded: BTreeSet<String>,
}

impl KeyConstraint {
    fn only(&mut self, values: BTreeSet<String>) {
        self.present = true;
        self.allowed = Some(match self.allowed.take() {
            Some(allowed) => allowed.intersection(&values).cloned().collect(),
            None => values,
        });
    }

    /// `Some(None)`: satisfied by the key's absence; `Some(Some(v))`: by the value `v`;
    /// `None`: not satisfiable.
    fn solve(self) -> Option<Option<String>> {
        if self.absent {
            return (!self.present).then_some(None);
        }
        if let Some(allowed) = self.allowed {
            return allowed
                .into_iter()
                .find(|v| !self.excluded.contains(v))
                .map(Some);
        }
        if !self.present {
            return Some(None);
        }
        // Any value outside the excluded ones: label values are unbounded, so one exists.
        (0..)
            .map(|i| {
                if i == 0 {
                    "x".to_owned()
                } else {
                    format!("x{i}")
                }
            })
            .find(|v| !self.excluded.contains(v))
            .map(Some)
    }
}

/// The operators Kubernetes defines for `matchExpressions`.
const OPERATORS: [&str; 4] = ["In", "NotIn", "Exists", "DoesNotExist"];

/// What Kubernetes' own selector validation (as applied to built-in workloads) would refuse in
/// `selector`, as `(field path below spec.selector, message)`: an unknown operator, `In`/`NotIn`
/// without values, `Exists`/`DoesNotExist` with values. CRDs get no such validation from the
/// API server, and the operator would silently select no pod with such a selector.
pub fn selector_problems(selector: &LabelSelector) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    for (i, requirement) in selector.match_expressions.iter().flatten().enumerate() {
        let base = format!("matchExpressions[{i}]");
        let values = requirement.values.as_deref().unwrap_or_default();
        match requirement.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => problems.push((
                format!("{base}.values"),
                format!(
                    "must list at least one value for operator `{}`",
                    requirement.operator
                ),
            )),
            "Exists" | "DoesNotExist" if !values.is_empty() => problems.push((
                format!("{base}.values"),
                format!("must be empty for operator `{}`", requirement.operator),
            )),
            op if !OPERATORS.contains(&op) => problems.push((
                format!("{base}.operator"),
                format!("`{op}` is not one of {}", OPERATORS.join(", ")),
            )),
            _ => {}
        }
    }
    problems
}
