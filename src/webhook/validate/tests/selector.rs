use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::core::{Selector, SelectorExt};
use serde_json::{Value, json};

use crate::webhook::validate::{overlap_witness, selector_problems, selectors_overlap};

fn sel(value: Value) -> LabelSelector {
    serde_json::from_value(value).unwrap()
}

fn overlap(a: Value, b: Value) -> bool {
    let (a, b) = (sel(a), sel(b));
    let forward = selectors_overlap(&a, &b);
    assert_eq!(
        forward,
        selectors_overlap(&b, &a),
        "not symmetric: {a:?} {b:?}"
    );
    forward
}

#[test]
fn named_cases() {
    let app = |v: &str| json!({"matchLabels": {"app": v}});
    let expr = |key: &str, op: &str, values: &[&str]| json!({"matchExpressions": [{"key": key, "operator": op, "values": values}]});
    let exists = |key: &str, op: &str| json!({"matchExpressions": [{"key": key, "operator": op}]});

    // An empty selector matches everything, itself included.
    assert!(overlap(json!({}), json!({})));
    assert!(overlap(json!({}), app("a")));
    // Equal labels overlap, different values do not, different keys do.
    assert!(overlap(app("a"), app("a")));
    assert!(!overlap(app("a"), app("b")));
    assert!(overlap(app("a"), json!({"matchLabels": {"tier": "web"}})));
    // In sets overlap when they intersect outside any NotIn.
    assert!(overlap(
        expr("app", "In", &["a", "b"]),
        expr("app", "In", &["b", "c"])
    ));
    assert!(!overlap(
        expr("app", "In", &["a"]),
        expr("app", "In", &["b"])
    ));
    assert!(!overlap(
        expr("app", "In", &["a", "b"]),
        json!({"matchExpressions": [
        {"key": "app", "operator": "NotIn", "values": ["a", "b"]}]})
    ));
    assert!(overlap(
        expr("app", "In", &["a", "b"]),
        expr("app", "NotIn", &["a"])
    ));
    // NotIn is satisfied by the key's absence; Exists needs a value outside the NotIn set.
    assert!(overlap(
        expr("app", "NotIn", &["a"]),
        exists("app", "DoesNotExist")
    ));
    assert!(overlap(
        expr("app", "NotIn", &["x", "x1"]),
        exists("app", "Exists")
    ));
    assert!(!overlap(
        exists("app", "Exists"),
        exists("app", "DoesNotExist")
    ));
    assert!(!overlap(app("a"), exists("app", "DoesNotExist")));
    // Contradictions match nothing, so overlap nothing, not even the empty selector.
    let in_nothing = expr("app", "In", &[]);
    let both = json!({"matchExpressions": [
        {"key": "app", "operator": "Exists"}, {"key": "app", "operator": "DoesNotExist"}]});
    let label_and_not = json!({"matchLabels": {"app": "a"},
        "matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["a"]}]});
    for nothing in [in_nothing, both, label_and_not] {
        assert!(!overlap(nothing.clone(), json!({})), "{nothing}");
        assert!(!overlap(nothing.clone(), nothing.clone()), "{nothing}");
    }
    // Selectors that do not parse (as the operator reads them) select nothing.
    let unknown_op =
        json!({"matchExpressions": [{"key": "app", "operator": "Equals", "values": ["a"]}]});
    let in_without_values = exists("app", "In");
    assert!(!overlap(unknown_op, json!({})));
    assert!(!overlap(in_without_values, json!({})));
}

#[test]
fn the_witness_names_a_label_set_both_select() {
    let a = sel(
        json!({"matchLabels": {"app": "reports"}, "matchExpressions": [
        {"key": "tier", "operator": "Exists"}, {"key": "legacy", "operator": "DoesNotExist"}]}),
    );
    let b = sel(json!({"matchExpressions": [
        {"key": "tier", "operator": "NotIn", "values": ["x", "x1"]},
        {"key": "app", "operator": "In", "values": ["reports", "billing"]}]}));
    let witness = overlap_witness(&a, &b).unwrap();
    assert_eq!(
        witness,
        BTreeMap::from([
            ("app".to_owned(), "reports".to_owned()),
            ("tier".to_owned(), "x2".to_owned())
        ])
    );
}

/// Every requirement over keys `a`, `b` and values `x`, `y` (plus two that do not parse).
fn atoms() -> Vec<LabelSelector> {
    let mut atoms = Vec::new();
    for key in ["a", "b"] {
        for value in ["x", "y"] {
            atoms.push(LabelSelector {
                match_labels: Some([(key.to_owned(), value.to_owned())].into()),
                ..LabelSelector::default()
            });
        }
        let requirement = |op: &str, values: Option<&[&str]>| LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.to_owned(),
                operator: op.to_owned(),
                values: values.map(|v| v.iter().map(|s| s.to_string()).collect()),
            }]),
            ..LabelSelector::default()
        };
        for values in [&[][..], &["x"], &["y"], &["x", "y"]] {
            atoms.push(requirement("In", Some(values)));
            atoms.push(requirement("NotIn", Some(values)));
        }
        atoms.push(requirement("Exists", None));
        atoms.push(requirement("DoesNotExist", None));
    }
    let unparsable = |op: &str, values: Option<Vec<String>>| LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: "a".into(),
            operator: op.into(),
            values,
        }]),
        ..LabelSelector::default()
    };
    atoms.push(unparsable("Equals", Some(vec!["x".into()])));
    atoms.push(unparsable("NotIn", None));
    atoms
}

fn merge(a: &LabelSelector, b: &LabelSelector) -> Option<LabelSelector> {
    let mut labels = a.match_labels.clone().unwrap_or_default();
    for (k, v) in b.match_labels.iter().flatten() {
        if labels.insert(k.clone(), v.clone()).is_some() {
            return None; // a map holds one value per key
        }
    }
    let expressions: Vec<_> = a
        .match_expressions
        .iter()
        .chain(b.match_expressions.iter())
        .flatten()
        .cloned()
        .collect();
    Some(LabelSelector {
        match_labels: (!labels.is_empty()).then_some(labels),
        match_expressions: (!expressions.is_empty()).then_some(expressions),
    })
}

/// Every label set over keys `a`, `b` whose values are absent, `x`, `y` or something else.
fn universe() -> Vec<BTreeMap<String, String>> {
    let values = [None, Some("x"), Some("y"), Some("z")];
    let mut sets = Vec::new();
    for a in values {
        for b in values {
            let mut set = BTreeMap::new();
            for (key, value) in [("a", a), ("b", b)] {
                if let Some(v) = value {
                    set.insert(key.to_owned(), v.to_owned());
                }
            }
            sets.push(set);
        }
    }
    sets
}

fn matches(selector: &Option<Selector>, labels: &BTreeMap<String, String>) -> bool {
    selector.as_ref().is_some_and(|s| s.matches(labels))
}

/// Every pair of selectors of up to two requirements each, against a brute-force search of
/// every label set that can tell them apart, with kube's own matcher (the operator's).
#[test]
fn exhaustively_agrees_with_brute_force_over_small_selectors() {
    let atoms = atoms();
    let mut selectors = vec![LabelSelector::default()];
    for (i, a) in atoms.iter().enumerate() {
        selectors.push(a.clone());
        for b in &atoms[i + 1..] {
            selectors.extend(merge(a, b));
        }
    }
    let parsed: Vec<Option<Selector>> = selectors
        .iter()
        .map(|s| Selector::try_from(s.clone()).ok())
        .collect();
    let universe = universe();
    let mut overlapping = 0;
    for (i, a) in selectors.iter().enumerate() {
        for (j, b) in selectors.iter().enumerate() {
            let brute = universe
                .iter()
                .any(|labels| matches(&parsed[i], labels) && matches(&parsed[j], labels));
            let witness = overlap_witness(a, b);
            assert_eq!(witness.is_some(), brute, "{a:?} vs {b:?}");
            if let Some(witness) = witness {
                overlapping += 1;
                assert!(
                    matches(&parsed[i], &witness) && matches(&parsed[j], &witness),
                    "witness {witness:?} does not satisfy {a:?} and {b:?}"
                );
            }
        }
    }
    // The enumeration is not vacuous either way.
    let pairs = selectors.len() * selectors.len();
    assert!(selectors.len() > 200, "{}", selectors.len());
    assert!(
        overlapping > pairs / 10 && overlapping < pairs * 9 / 10,
        "{overlapping} of {pairs}"
    );
}

#[test]
fn problems_name_the_requirement_kubernetes_would_refuse() {
    let s = sel(json!({"matchExpressions": [
        {"key": "a", "operator": "In", "values": ["x"]},
        {"key": "b", "operator": "Exists"},
        {"key": "c", "operator": "in", "values": ["x"]},
        {"key": "d", "operator": "NotIn"}]}));
    assert_eq!(
        selector_problems(&s),
        vec![
            (
                "matchExpressions[2].operator".to_owned(),
                "`in` is not one of In, NotIn, Exists, DoesNotExist".to_owned()
            ),
            (
                "matchExpressions[3].values".to_owned(),
                "must list at least one value for operator `NotIn`".to_owned()
            ),
        ]
    );
    assert!(selector_problems(&LabelSelector::default()).is_empty());
}
