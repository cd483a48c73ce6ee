//! `diff_policies` on the example manifests and edits of them.

use super::*;
use crate::policy::{CompileMode, ManifestFile, check_files};

const POLICY: &str = include_str!("../../../examples/policies/valid/mcpserverpolicy.yaml");
const EXCEPTION: &str = include_str!("../../../examples/policies/valid/capabilityexception.yaml");
const REVOCATION: &str = include_str!("../../../examples/policies/valid/principalrevocation.yaml");

fn compile(texts: &[&str]) -> Vec<EffectivePolicy> {
    let files: Vec<ManifestFile> = texts
        .iter()
        .enumerate()
        .map(|(i, text)| ManifestFile::parse(format!("file-{i}.yaml"), text))
        .collect();
    // Inside the example exception's window and before the example revocation expires.
    let now = "2026-12-01T06:00:00Z".parse().unwrap();
    let report = check_files(&files, CompileMode::Cluster, now);
    assert_eq!(report.errors(), 0, "{:#?}", report.findings);
    report.policies
}

fn edited(from: &str, to: &str) -> String {
    assert!(POLICY.contains(from), "the example policy has no {from:?}");
    POLICY.replacen(from, to, 1)
}

/// The one policy's changes from `old` to `new`.
fn changes(old: &[&str], new: &[&str]) -> Vec<Change> {
    let diffs = diff_policies(&compile(old), &compile(new));
    assert_eq!(diffs.len(), 1, "{diffs:#?}");
    diffs.into_iter().next().unwrap().changes
}

fn only(changes: &[Change]) -> &Change {
    assert_eq!(changes.len(), 1, "{changes:#?}");
    &changes[0]
}

#[test]
fn the_same_manifests_are_unchanged_and_loosen_nothing() {
    let diffs = diff_policies(
        &compile(&[POLICY, EXCEPTION]),
        &compile(&[POLICY, EXCEPTION]),
    );
    assert_eq!(diffs.len(), 1);
    assert_eq!(diffs[0].policy, "team-a/reports");
    assert_eq!(diffs[0].change, PolicyChange::Unchanged);
    assert!(!diffs[0].loosens());
}

#[test]
fn a_shorter_ttl_tightens_and_a_longer_one_loosens() {
    let shorter = edited("maxTtl: 1h", "maxTtl: 30m");
    let change = only(&changes(&[POLICY], &[&shorter])).clone();
    assert_eq!(change.summary, "tasks.retention.maxTtl 1h → 30m");
    assert_eq!(change.field, "tasks.retention.maxTtl");
    assert_eq!(change.effect, Effect::Tightens);
    let back = only(&changes(&[&shorter], &[POLICY])).clone();
    assert_eq!(back.summary, "tasks.retention.maxTtl 30m → 1h");
    assert_eq!(back.effect, Effect::Loosens);
}

#[test]
fn a_wider_tool_list_a_raised_quota_and_a_removed_scope_loosen() {
    let wider = edited(
        "tools: [generate_report, bulk_update]",
        "tools: [generate_report, bulk_update, export_all]",
    );
    let change = only(&changes(&[POLICY], &[&wider])).clone();
    assert_eq!(change.summary, "tasks.tools: added export_all");
    assert_eq!(change.effect, Effect::Loosens);

    let every_tool = edited("    tools: [generate_report, bulk_update]\n", "");
    let change = only(&changes(&[POLICY], &[&every_tool])).clone();
    assert_eq!(change.effect, Effect::Loosens, "{change:?}");
    let back = only(&changes(&[&every_tool], &[POLICY])).clone();
    assert_eq!(back.effect, Effect::Tightens, "{back:?}");

    let raised = edited("perPrincipal: 5", "perPrincipal: 8");
    let change = only(&changes(&[POLICY], &[&raised])).clone();
    assert_eq!(change.summary, "tasks.concurrency.perPrincipal 5 → 8");
    assert_eq!(change.effect, Effect::Loosens);

    let no_scope = edited("      bulk_update: [reports:write]\n", "");
    let change = only(&changes(&[POLICY], &[&no_scope])).clone();
    assert_eq!(
        change.summary,
        "tasks.requiredScopes.bulk_update: removed reports:write"
    );
    assert_eq!(change.effect, Effect::Loosens);
}

#[test]
fn a_faster_poll_a_lower_audit_sample_and_a_new_issuer_loosen() {
    let faster = edited("minPollInterval: 2s", "minPollInterval: 500ms");
    assert_eq!(
        only(&changes(&[POLICY], &[&faster])).effect,
        Effect::Loosens
    );

    let sampled = edited(
        "statusReadSamplePercent: 100",
        "statusReadSamplePercent: 10",
    );
    let change = only(&changes(&[POLICY], &[&sampled])).clone();
    assert_eq!(change.summary, "audit.statusReadSamplePercent 100 → 10");
    assert_eq!(change.effect, Effect::Loosens);

    let second_issuer = edited(
        "  upstream:\n",
        "      - issuer: https://partner.example.com\n        audiences: [https://reports.team-a.example.com/mcp]\n        jwksUri: https://partner.example.com/jwks.json\n  upstream:\n",
    );
    let change = only(&changes(&[POLICY], &[&second_issuer])).clone();
    assert_eq!(
        change.summary,
        "identity.issuers: trusts https://partner.example.com"
    );
    assert_eq!(change.effect, Effect::Loosens);
    let back = only(&changes(&[&second_issuer], &[POLICY])).clone();
    assert_eq!(back.effect, Effect::Tightens);
}

#[test]
fn a_new_exception_loosens_and_names_itself_on_the_capability() {
    let denied = edited("sampling: exception", "sampling: deny");
    let found = changes(&[&denied], &[POLICY, EXCEPTION]);
    assert_eq!(found.len(), 2, "{found:#?}");
    assert_eq!(
        found[0].summary,
        "capabilities.sampling deny → exception (reports-summarize-with-sampling, until 2026-12-15 00:00 UTC)"
    );
    assert_eq!(found[0].effect, Effect::Loosens);
    assert_eq!(
        found[1].summary,
        "exception reports-summarize-with-sampling for sampling until 2026-12-15 00:00 UTC granted"
    );
    assert_eq!(found[1].effect, Effect::Loosens);

    // Withdrawing it tightens; extending it loosens.
    let withdrawn = changes(&[POLICY, EXCEPTION], &[POLICY]);
    assert_eq!(only(&withdrawn).effect, Effect::Tightens);
    let longer = EXCEPTION.replace("2026-12-15T00:00:00Z", "2026-12-31T00:00:00Z");
    let extended = changes(&[POLICY, EXCEPTION], &[POLICY, &longer]);
    assert_eq!(only(&extended).effect, Effect::Loosens, "{extended:#?}");
}

#[test]
fn a_withdrawn_revocation_loosens_and_a_new_one_tightens() {
    let added = changes(&[POLICY], &[POLICY, REVOCATION]);
    assert_eq!(only(&added).effect, Effect::Tightens, "{added:#?}");
    assert!(
        only(&added).summary.starts_with("revocation "),
        "{added:#?}"
    );
    let withdrawn = changes(&[POLICY, REVOCATION], &[POLICY]);
    assert_eq!(only(&withdrawn).effect, Effect::Loosens);
}

#[test]
fn switching_listen_off_tightens_and_object_checks_off_loosens() {
    let start = POLICY.find("  listen:\n").unwrap();
    let end = POLICY.find("  capabilities:\n").unwrap();
    let no_listen = format!("{}{}", &POLICY[..start], &POLICY[end..]);
    let change = only(&changes(&[POLICY], &[&no_listen])).clone();
    assert_eq!(change.summary, "listen: disabled");
    assert_eq!(change.effect, Effect::Tightens);

    let start = POLICY.find("    objects:\n").unwrap();
    let end = POLICY.find("  listen:\n").unwrap();
    let no_objects = format!("{}{}", &POLICY[..start], &POLICY[end..]);
    let change = only(&changes(&[POLICY], &[&no_objects])).clone();
    assert_eq!(change.summary, "tasks.objects: disabled");
    assert_eq!(change.effect, Effect::Loosens);
}

#[test]
fn neutral_changes_are_reported_but_loosen_nothing() {
    let window = edited("window: 10m", "window: 20m");
    let diffs = diff_policies(&compile(&[POLICY]), &compile(&[&window]));
    assert_eq!(diffs[0].change, PolicyChange::Changed);
    assert_eq!(only(&diffs[0].changes).effect, Effect::Neutral);
    assert!(!diffs[0].loosens());
}

#[test]
fn an_added_policy_loosens_and_a_removed_one_does_not() {
    let other = POLICY.replace("name: reports\n", "name: billing\n");
    let diffs = diff_policies(&compile(&[POLICY]), &compile(&[POLICY, &other]));
    assert_eq!(diffs.len(), 2);
    assert_eq!(diffs[0].policy, "team-a/billing");
    assert_eq!(diffs[0].change, PolicyChange::Added);
    assert!(diffs[0].loosens());
    let diffs = diff_policies(&compile(&[POLICY, &other]), &compile(&[POLICY]));
    assert_eq!(diffs[0].change, PolicyChange::Removed);
    assert!(!diffs[0].loosens());
}
