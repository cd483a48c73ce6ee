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

/// The example policy with `rateLimits` (indented as under `spec`) before its tasks.
fn limited(rate_limits: &str) -> String {
    edited(
        "  tasks:\n",
        &format!("  rateLimits:\n{rate_limits}  tasks:\n"),
    )
}

const LIMITS: &str = "    perPrincipal: {requestsPerSecond: 10, burst: 20}
    perServer: {requestsPerSecond: 1000, burst: 2000}
    methods:
      taskReads: {perPrincipal: {requestsPerSecond: 5}}
    tools:
      generate_report: {perPrincipal: {requestsPerSecond: 1, burst: 2}}
";

#[test]
fn raising_or_removing_a_rate_limit_loosens_and_lowering_or_adding_one_tightens() {
    let base = limited(LIMITS);
    assert!(changes(&[&base], &[&base]).is_empty());

    let raised = limited(&LIMITS.replace("requestsPerSecond: 10,", "requestsPerSecond: 12.5,"));
    let change = only(&changes(&[&base], &[&raised])).clone();
    assert_eq!(
        change.summary,
        "rateLimits.perPrincipal.requestsPerSecond 10 → 12.5"
    );
    assert_eq!(change.field, "rateLimits.perPrincipal.requestsPerSecond");
    assert_eq!(change.effect, Effect::Loosens);
    assert_eq!(
        only(&changes(&[&raised], &[&base])).effect,
        Effect::Tightens
    );

    let bigger_burst = limited(&LIMITS.replace("burst: 2}", "burst: 3}"));
    let change = only(&changes(&[&base], &[&bigger_burst])).clone();
    assert_eq!(
        change.summary,
        "rateLimits.tools.generate_report.perPrincipal.burst 2 → 3"
    );
    assert_eq!(change.effect, Effect::Loosens);

    // Writing out the default burst is no change; a smaller one tightens.
    let explicit =
        limited(&LIMITS.replace("{requestsPerSecond: 5}", "{requestsPerSecond: 5, burst: 5}"));
    assert!(changes(&[&base], &[&explicit]).is_empty());
    let smaller =
        limited(&LIMITS.replace("{requestsPerSecond: 5}", "{requestsPerSecond: 5, burst: 1}"));
    let change = only(&changes(&[&base], &[&smaller])).clone();
    assert_eq!(
        change.summary,
        "rateLimits.methods.taskReads.perPrincipal.burst 5 → 1"
    );
    assert_eq!(change.effect, Effect::Tightens);

    let no_server = limited(&LIMITS.replace(
        "    perServer: {requestsPerSecond: 1000, burst: 2000}\n",
        "",
    ));
    let change = only(&changes(&[&base], &[&no_server])).clone();
    assert_eq!(
        change.summary,
        "rateLimits.perServer: removed 1000/s, burst 2000"
    );
    assert_eq!(change.effect, Effect::Loosens);
    let back = only(&changes(&[&no_server], &[&base])).clone();
    assert_eq!(
        back.summary,
        "rateLimits.perServer: added 1000/s, burst 2000"
    );
    assert_eq!(back.effect, Effect::Tightens);
}

#[test]
fn removing_a_method_or_tool_entry_or_every_limit_loosens() {
    let base = limited(LIMITS);
    let no_tool = limited(&LIMITS.replace(
        "    tools:\n      generate_report: {perPrincipal: {requestsPerSecond: 1, burst: 2}}\n",
        "",
    ));
    let change = only(&changes(&[&base], &[&no_tool])).clone();
    assert_eq!(
        change.summary,
        "rateLimits.tools.generate_report: removed perPrincipal 1/s, burst 2"
    );
    assert_eq!(change.effect, Effect::Loosens);
    assert_eq!(
        only(&changes(&[&no_tool], &[&base])).effect,
        Effect::Tightens
    );

    let no_method = limited(&LIMITS.replace(
        "    methods:\n      taskReads: {perPrincipal: {requestsPerSecond: 5}}\n",
        "",
    ));
    let change = only(&changes(&[&base], &[&no_method])).clone();
    assert_eq!(
        change.summary,
        "rateLimits.methods.taskReads: removed perPrincipal 5/s, burst 5"
    );
    assert_eq!(change.effect, Effect::Loosens);

    // A tool whose name has dots is still one entry.
    let dotted = limited(&LIMITS.replace("generate_report:", "reports.generate:"));
    let found = changes(&[&base], &[&dotted]);
    assert_eq!(found.len(), 2, "{found:#?}");
    assert_eq!(
        found[1].summary,
        "rateLimits.tools.reports.generate: added perPrincipal 1/s, burst 2"
    );

    let change = only(&changes(&[&base], &[POLICY])).clone();
    assert_eq!(
        change.summary,
        "rateLimits: removed, requests are no longer rate-limited"
    );
    assert_eq!(change.effect, Effect::Loosens);
    let change = only(&changes(&[POLICY], &[&base])).clone();
    assert_eq!(
        change.summary,
        "rateLimits: added perPrincipal 10/s, burst 20; perServer 1000/s, burst 2000; methods.taskReads.perPrincipal 5/s, burst 5; tools.generate_report.perPrincipal 1/s, burst 2"
    );
    assert_eq!(change.effect, Effect::Tightens);
    // Limits that name no bucket are no limits: nothing changes.
    assert!(changes(&[POLICY], &[&limited("    tools: {}\n")]).is_empty());
}
