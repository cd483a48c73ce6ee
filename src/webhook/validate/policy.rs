//! McpServerPolicy: the policy compiler's verdict and selectors that overlap another policy's.

use std::collections::BTreeMap;
use std::sync::Arc;

use jiff::Timestamp;

use crate::api::McpServerPolicy;
use crate::policy::{CompileInput, CompileMode, Severity, compile};

use super::selector::{overlap_witness, selector_problems, selectors_overlap};
use super::{Findings, Verdict, reasons};

/// Denies a policy the compiler refuses (the errors `lifeguard policy check` reports, in
/// cluster mode), a selector Kubernetes would refuse, and a selector that overlaps another
/// policy's in the namespace (`others_in_namespace`; the policy itself, by name, is skipped).
/// Warns about the compiler's warnings and a selector that can match no pod.
///
/// On UPDATE only what the update introduces is denied: compile errors when the spec is
/// unchanged, selector problems when the selector is unchanged, and overlaps the old selector
/// already had are warnings.
pub fn validate_policy(
    new: &McpServerPolicy,
    old: Option<&McpServerPolicy>,
    others_in_namespace: &[Arc<McpServerPolicy>],
) -> Verdict {
    let mut findings = Findings::default();

    let mut compiled = Findings::default();
    let compilation = compile(CompileInput {
        policy: new,
        exceptions: &[],
        revocations: &[],
        mode: CompileMode::Cluster,
        // Only dates warnings about exceptions, and none are compiled here.
        now: Timestamp::UNIX_EPOCH,
    });
    for problem in compilation.problems {
        let message = if problem.problem.path.is_empty() {
            problem.problem.message
        } else {
            format!("{}: {}", problem.problem.path, problem.problem.message)
        };
        match problem.problem.severity {
            Severity::Error => compiled.deny(reasons::INVALID_SPEC, message),
            Severity::Warning => compiled.warn(reasons::SPEC_WARNING, message),
        }
    }
    findings.extend(compiled.introduced_unless(old.is_some_and(|o| o.spec == new.spec)));

    let selector = &new.spec.selector;
    let mut syntax = Findings::default();
    let problems = selector_problems(selector);
    for (path, message) in &problems {
        syntax.deny(
            reasons::INVALID_SELECTOR,
            format!("spec.selector.{path}: {message}"),
        );
    }
    if problems.is_empty() && !selectors_overlap(selector, selector) {
        syntax.warn(
            reasons::SELECTOR_MATCHES_NOTHING,
            "spec.selector: its requirements contradict each other, so it selects no pod",
        );
    }
    let selector_unchanged = old.is_some_and(|o| &o.spec.selector == selector);
    findings.extend(syntax.introduced_unless(selector_unchanged));

    let name = new.metadata.name.as_deref();
    let mut others: Vec<&McpServerPolicy> = others_in_namespace
        .iter()
        .map(|p| &**p)
        .filter(|p| p.metadata.name.as_deref() != name)
        .collect();
    others.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for other in others {
        let Some(witness) = overlap_witness(selector, &other.spec.selector) else {
            continue;
        };
        let other_name = other.metadata.name.as_deref().unwrap_or_default();
        if old.is_some_and(|o| selectors_overlap(&o.spec.selector, &other.spec.selector)) {
            findings.warn(
                reasons::SELECTOR_OVERLAP,
                format!(
                    "spec.selector: overlaps McpServerPolicy `{other_name}`'s selector ({} would be selected by both); the overlap predates this update, and the older policy wins the pods both select",
                    describe(&witness)
                ),
            );
        } else {
            findings.deny(
                reasons::SELECTOR_OVERLAP,
                format!(
                    "spec.selector: overlaps McpServerPolicy `{other_name}`'s selector: {} would be selected by both, and at most one policy may select a pod",
                    describe(&witness)
                ),
            );
        }
    }
    findings.verdict()
}

fn describe(labels: &BTreeMap<String, String>) -> String {
    if labels.is_empty() {
        return "a pod without labels".into();
    }
    let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("a pod labelled {}", labels.join(","))
}
