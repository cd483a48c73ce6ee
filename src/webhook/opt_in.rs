//! Who asked for a sidecar: the precedence of the `lifeguard.dev/inject` label and annotation,
//! as one function. docs/admission.md shows the same table.
//!
//! | pod label | pod annotation | namespace label | result |
//! |---|---|---|---|
//! | `disabled` | any | any | opted out |
//! | any | `disabled` | any | opted out |
//! | `enabled` | not `disabled` | any | opted in (pod) |
//! | absent/other | not `disabled` | `enabled` | opted in (namespace) |
//! | absent/other | not `disabled` | absent/other | not opted in |
//!
//! Opting out always wins: the person closest to the workload has the last word (a required
//! policy then refuses the pod instead of running it unprotected). Only a label opts in,
//! because webhook selectors can see labels but not annotations; an annotation can opt out.
//! Values other than `enabled` and `disabled` are ignored.

use std::collections::BTreeMap;

use super::reasons::SkipReason;

/// The label (namespace or pod) and annotation (pod) key.
pub const INJECT_KEY: &str = "lifeguard.dev/inject";
pub const ENABLED: &str = "enabled";
pub const DISABLED: &str = "disabled";

/// Where an opt-in came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptedIn {
    Pod,
    Namespace,
}

/// Applies the precedence table.
pub fn opt_in(
    pod_labels: Option<&BTreeMap<String, String>>,
    pod_annotations: Option<&BTreeMap<String, String>>,
    namespace_labels: Option<&BTreeMap<String, String>>,
) -> Result<OptedIn, SkipReason> {
    fn value(map: Option<&BTreeMap<String, String>>) -> Option<&str> {
        map.and_then(|m| m.get(INJECT_KEY)).map(String::as_str)
    }
    let pod_label = value(pod_labels);
    if pod_label == Some(DISABLED) || value(pod_annotations) == Some(DISABLED) {
        return Err(SkipReason::OptedOut);
    }
    if pod_label == Some(ENABLED) {
        return Ok(OptedIn::Pod);
    }
    if value(namespace_labels) == Some(ENABLED) {
        return Ok(OptedIn::Namespace);
    }
    Err(SkipReason::NotOptedIn)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(value: Option<&str>) -> Option<BTreeMap<String, String>> {
        value.map(|v| BTreeMap::from([(INJECT_KEY.to_owned(), v.to_owned())]))
    }

    type Case<'a> = (
        Option<&'a str>,
        Option<&'a str>,
        Option<&'a str>,
        Result<OptedIn, SkipReason>,
    );

    #[test]
    fn the_documented_table() {
        use SkipReason::*;
        let cases: [Case; 12] = [
            (Some("disabled"), None, Some("enabled"), Err(OptedOut)),
            (Some("disabled"), None, None, Err(OptedOut)),
            (
                Some("enabled"),
                Some("disabled"),
                Some("enabled"),
                Err(OptedOut),
            ),
            (None, Some("disabled"), Some("enabled"), Err(OptedOut)),
            (Some("enabled"), None, None, Ok(OptedIn::Pod)),
            (Some("enabled"), None, Some("enabled"), Ok(OptedIn::Pod)),
            (
                Some("enabled"),
                Some("enabled"),
                Some("disabled"),
                Ok(OptedIn::Pod),
            ),
            (None, None, Some("enabled"), Ok(OptedIn::Namespace)),
            (Some("yes"), None, Some("enabled"), Ok(OptedIn::Namespace)),
            (None, Some("enabled"), None, Err(NotOptedIn)),
            (None, None, Some("disabled"), Err(NotOptedIn)),
            (None, None, None, Err(NotOptedIn)),
        ];
        for (pod_label, pod_annotation, namespace_label, expected) in cases {
            assert_eq!(
                opt_in(
                    map(pod_label).as_ref(),
                    map(pod_annotation).as_ref(),
                    map(namespace_label).as_ref()
                ),
                expected,
                "pod label {pod_label:?}, annotation {pod_annotation:?}, namespace {namespace_label:?}"
            );
        }
    }
}
