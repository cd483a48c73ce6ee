//! Compiler behaviour: defaults, clamping, exception targeting, revocation semantics, hashing,
//! and the standalone loader's all-or-nothing rule.

use std::time::Duration;

use jiff::Timestamp;

use super::*;
use crate::api::{
    CapabilityException, CapabilityMode, ListenNotification, McpServerPolicy, PrincipalRevocation,
    RevocationReason,
};

fn now() -> Timestamp {
    "2026-11-30T12:00:00Z".parse().unwrap()
}

fn policy(extra: &str) -> McpServerPolicy {
    let yaml = format!(
        r#"
apiVersion: lifeguard.dev/v1alpha1
kind: McpServerPolicy
metadata: {{name: reports, namespace: team-a, generation: 3}}
spec:
  selector: {{}}
  resource: https://reports.example.com/mcp
  identity:
    issuers: [{{issuer: "https://idp.example.com", jwksUri: "https://idp.example.com/jwks"}}]
{extra}"#
    );
    serde_saphyr::from_str(&yaml).unwrap()
}

fn exception(namespace: &str, policy_ref: &str, extra: &str) -> CapabilityException {
    let header =
        "eyJhbGciOiJFZERTQSIsInR5cCI6ImxpZmVndWFyZC1leGNlcHRpb24randzIiwia2lkIjoiYXBwcm92ZXIifQ";
    let signature = "A".repeat(86);
    let yaml = format!(
        r#"
apiVersion: lifeguard.dev/v1alpha1
kind: CapabilityException
metadata: {{name: ex-{policy_ref}, namespace: {namespace}}}
spec:
  policyRef: {{name: {policy_ref}}}
  capability: sampling
  clients: [console]
  purpose: summaries
  modelRoute: gateway/summaries
  limits: {{maxTokens: 100, maxIterationsPerTask: 2, maxRequestsPerMinute: 10}}
  notBefore: "2026-11-29T00:00:00Z"
  expiresAt: "2026-12-05T00:00:00Z"
  approvalId: CHG-1
  signature: "{header}..{signature}"
{extra}"#
    );
    serde_saphyr::from_str(&yaml).unwrap()
}

fn revocation(name: &str, reason: &str, extra: &str) -> PrincipalRevocation {
    let yaml = format!(
        r#"
apiVersion: lifeguard.dev/v1alpha1
kind: PrincipalRevocation
metadata: {{name: {name}}}
spec:
  issuer: https://idp.example.com
  subject: alice
  revokedBefore: "2026-11-30T09:00:00Z"
  reason: {reason}
  source: {{kind: manual}}
{extra}"#
    );
    serde_saphyr::from_str(&yaml).unwrap()
}

fn compile_one(
    policy: &McpServerPolicy,
    exceptions: &[CapabilityException],
    revocations: &[PrincipalRevocation],
) -> Compilation {
    compile(CompileInput {
        policy,
        exceptions,
        revocations,
        mode: CompileMode::Cluster,
        now: now(),
    })
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn omitted_sections_fail_closed() {
    let c = compile_one(&policy(""), &[], &[]);
    let p = c.effective.expect("compiles");
    assert!(p.tasks.is_none(), "no tasks section means no tasks");
    assert!(p.listen.is_none(), "no listen section means no listen");
    assert_eq!(p.capabilities.sampling, CapabilityMode::Deny);
    assert_eq!(p.capabilities.roots, CapabilityMode::Deny);
    assert_eq!(p.protocol.versions, vec!["2026-07-28".to_owned()]);
    assert!(p.protocol.allowed_origins.is_empty());
    assert_eq!(p.generation, Some(3));
}

#[test]
fn empty_sections_get_the_documented_defaults() {
    let c = compile_one(&policy("  tasks: {}\n  listen: {}\n"), &[], &[]);
    let p = c.effective.unwrap();
    let t = p.tasks.unwrap();
    assert_eq!(t.tools, ToolSet::All);
    assert_eq!(t.default_ttl.get(), secs(15 * 60));
    assert_eq!(t.max_ttl.get(), secs(15 * 60));
    assert_eq!(t.default_deadline.get(), secs(30 * 60));
    assert_eq!(t.max_deadline.get(), secs(2 * 3600));
    assert_eq!(t.min_poll_interval.get(), secs(2));
    assert_eq!(
        t.concurrency,
        ConcurrencyLimits {
            per_principal: 5,
            per_tenant: 50,
            per_client: 20,
            per_server: 500
        }
    );
    assert_eq!(t.idempotency_window.get(), secs(600));
    assert!(!t.derive_idempotency_key);
    assert!(t.admin_cancel_scope.is_none());
    let l = p.listen.unwrap();
    assert_eq!(l.max_streams_per_principal, 4);
    assert_eq!(l.max_stream_duration.get(), secs(3600));
    assert!(l.notifications.contains(&ListenNotification::TaskIds));
    assert!(
        !l.notifications
            .contains(&ListenNotification::ResourceSubscriptions)
    );
    let issuer = &p.issuers[0];
    assert_eq!(
        issuer.audiences,
        vec!["https://reports.example.com/mcp".to_owned()]
    );
    assert_eq!(issuer.claims.subject, "sub");
    assert_eq!(issuer.claims.tenant, "tid");
    assert_eq!(issuer.claims.client, "client_id");
    assert_eq!(issuer.claims.scopes, "scope");
}

#[test]
fn ttl_defaults_follow_the_configured_bound_and_clamp() {
    let p = compile_one(&policy("  tasks: {retention: {maxTtl: 5m}}\n"), &[], &[])
        .effective
        .unwrap();
    let t = p.tasks.unwrap();
    assert_eq!(t.default_ttl.get(), secs(300), "default shrinks to the cap");
    assert_eq!(t.effective_ttl(None), secs(300));
    assert_eq!(t.effective_ttl(Some(secs(60))), secs(60));
    assert_eq!(
        t.effective_ttl(Some(secs(3600))),
        secs(300),
        "server TTL is clamped"
    );
}

#[test]
fn deadlines_use_per_tool_values_and_a_max_that_covers_them() {
    let p = compile_one(
        &policy("  tasks: {deadline: {default: 3h, perTool: {export: 4h}}}\n"),
        &[],
        &[],
    )
    .effective
    .unwrap();
    let t = p.tasks.unwrap();
    assert_eq!(t.max_deadline.get(), secs(4 * 3600));
    assert_eq!(t.deadline_for("export"), secs(4 * 3600));
    assert_eq!(t.deadline_for("anything-else"), secs(3 * 3600));
}

#[test]
fn tool_allow_list_and_scopes() {
    let p = compile_one(
        &policy("  tasks:\n    tools: [generate_report]\n    requiredScopes: {generate_report: [reports:run, reports:read]}\n"),
        &[],
        &[],
    )
    .effective
    .unwrap();
    let t = p.tasks.unwrap();
    assert!(t.allows_tool("generate_report"));
    assert!(!t.allows_tool("drop_tables"));
    let scopes: Vec<&str> = t.scopes_for("generate_report").collect();
    assert_eq!(scopes, vec!["reports:read", "reports:run"]);
    assert_eq!(t.scopes_for("other").count(), 0);
}

#[test]
fn disabled_tasks_compile_to_none() {
    let p = compile_one(&policy("  tasks: {enabled: false}\n"), &[], &[])
        .effective
        .unwrap();
    assert!(p.tasks.is_none());
}

#[test]
fn policy_errors_produce_no_policy_and_name_the_field() {
    let c = compile_one(
        &policy("  tasks: {retention: {defaultTtl: 1h, maxTtl: 1m}}\n"),
        &[],
        &[],
    );
    assert!(c.effective.is_none());
    assert!(c.has_errors());
    let problem = &c.problems[0];
    assert_eq!(problem.object.to_string(), "McpServerPolicy team-a/reports");
    assert_eq!(problem.problem.path, "spec.tasks.retention.maxTtl");
}

#[test]
fn exceptions_attach_only_to_the_policy_they_name_in_its_namespace() {
    let p = policy("  capabilities: {sampling: exception}\n");
    let exceptions = [
        exception("team-a", "reports", ""),
        exception("team-b", "reports", ""),
        exception("team-a", "billing", ""),
    ];
    let c = compile_one(&p, &exceptions, &[]);
    let granted = c.effective.unwrap().exceptions;
    assert_eq!(granted.len(), 1);
    assert_eq!(granted[0].exception.to_string(), "team-a/ex-reports");
    assert!(granted[0].window_contains(now()));
    assert!(!granted[0].window_contains("2026-12-05T00:00:00Z".parse().unwrap()));
}

#[test]
fn invalid_exceptions_are_left_out_but_the_policy_still_compiles() {
    let p = policy("  capabilities: {sampling: exception}\n");
    let broken = exception(
        "team-a",
        "reports",
        "  tenants: [{issuer: \"https://i\", tenant: a}, {issuer: \"https://i\", tenant: a}]\n",
    );
    let c = compile_one(&p, &[broken], &[]);
    assert!(c.has_errors());
    let effective = c.effective.expect("policy itself is fine");
    assert!(effective.exceptions.is_empty());
    assert!(
        c.problems
            .iter()
            .any(|p| p.problem.path == "spec.tenants[1]")
    );
}

#[test]
fn exceptions_for_a_denied_capability_and_expired_ones_warn() {
    let p = policy("");
    let expired = {
        let mut e = exception("team-a", "reports", "");
        e.spec.expires_at.0 = "2026-11-29T12:00:00Z".parse().unwrap();
        e
    };
    let c = compile_one(&p, &[expired], &[]);
    assert!(!c.has_errors());
    let messages: Vec<&str> = c
        .problems
        .iter()
        .map(|p| p.problem.message.as_str())
        .collect();
    assert!(
        messages
            .iter()
            .any(|m| m.contains("spec.capabilities.sampling is deny")),
        "{messages:?}"
    );
    assert!(
        messages.iter().any(|m| m.contains("expired")),
        "{messages:?}"
    );
}

#[test]
fn revocations_refuse_old_tokens_or_all_tokens_by_reason() {
    let revocations = [
        revocation("session", "sessionRevoked", ""),
        revocation("disabled", "accountDisabled", "  tenant: t1\n"),
    ];
    let p = compile_one(&policy(""), &[], &revocations)
        .effective
        .unwrap();
    let disabled = p.revocations.iter().find(|r| r.name == "disabled").unwrap();
    let session = p.revocations.iter().find(|r| r.name == "session").unwrap();
    assert_eq!(session.reason, RevocationReason::SessionRevoked);

    let before: Timestamp = "2026-11-30T08:59:59Z".parse().unwrap();
    let at: Timestamp = "2026-11-30T09:00:00Z".parse().unwrap();
    let after: Timestamp = "2026-11-30T09:00:01Z".parse().unwrap();
    assert!(session.covers(
        "https://idp.example.com",
        "alice",
        "any-tenant",
        "any-client"
    ));
    assert!(!session.covers("https://idp.example.com", "bob", "t", "c"));
    assert!(!session.covers("https://other-idp", "alice", "t", "c"));
    assert!(session.refuses_token_issued_at(Some(before)));
    assert!(
        session.refuses_token_issued_at(Some(at)),
        "at revokedBefore is refused"
    );
    assert!(
        !session.refuses_token_issued_at(Some(after)),
        "fresh tokens work again"
    );
    assert!(
        session.refuses_token_issued_at(None),
        "tokens without iat are refused"
    );

    assert!(disabled.covers("https://idp.example.com", "alice", "t1", "c"));
    assert!(!disabled.covers("https://idp.example.com", "alice", "t2", "c"));
    assert!(
        disabled.refuses_token_issued_at(Some(after)),
        "account disabled refuses all"
    );
}

#[test]
fn hash_is_stable_and_changes_with_the_policy() {
    let a = compile_one(&policy("  tasks: {}\n"), &[], &[])
        .effective
        .unwrap();
    let b = compile_one(&policy("  tasks: {}\n"), &[], &[])
        .effective
        .unwrap();
    let c = compile_one(&policy("  tasks: {minPollInterval: 3s}\n"), &[], &[])
        .effective
        .unwrap();
    assert_eq!(a.hash(), b.hash());
    assert_ne!(a.hash(), c.hash());
    let round_trip: EffectivePolicy =
        serde_json::from_str(&serde_json::to_string(&a).unwrap()).unwrap();
    assert_eq!(round_trip, a);
    assert_eq!(round_trip.hash(), a.hash());
}

const STANDALONE: &str = r#"
apiVersion: lifeguard.dev/v1alpha1
kind: McpServerPolicy
metadata: {name: demo}
spec:
  selector: {}
  resource: http://127.0.0.1:8080/mcp
  identity:
    issuers: [{issuer: "http://127.0.0.1:8080/dev-idp", jwksFile: dev-jwks.json}]
  tasks: {}
"#;

#[test]
fn standalone_loader_accepts_one_policy_and_local_key_files() {
    let (policy, warnings) = load_standalone("demo.yaml", STANDALONE, now()).unwrap();
    assert_eq!(policy.policy.to_string(), "default/demo");
    assert_eq!(
        policy.issuers[0].keys,
        KeySource::JwksFile("dev-jwks.json".into())
    );
    assert!(warnings.is_empty());
}

#[test]
fn standalone_loader_refuses_any_error_and_wrong_policy_counts() {
    let with_typo = STANDALONE.replace("tasks: {}", "tasks: {minPollIntervall: 1s}");
    match load_standalone("demo.yaml", &with_typo, now()) {
        Err(StandaloneError::Invalid(findings)) => {
            assert_eq!(findings[0].problem.path, "spec.tasks.minPollIntervall");
            assert_eq!(findings[0].document, Some(1));
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
    let two = format!(
        "{STANDALONE}---\n{}",
        STANDALONE.replace("name: demo", "name: demo2")
    );
    assert_eq!(
        load_standalone("demo.yaml", &two, now()).unwrap_err(),
        StandaloneError::PolicyCount(2)
    );
    let none = "apiVersion: lifeguard.dev/v1alpha1\nkind: PrincipalRevocation\nmetadata: {name: r}\nspec: {issuer: i, subject: s, revokedBefore: \"2026-11-30T09:00:00Z\", reason: adminAction, source: {kind: manual}}\n";
    assert_eq!(
        load_standalone("demo.yaml", none, now()).unwrap_err(),
        StandaloneError::PolicyCount(0)
    );
    assert!(matches!(
        load_standalone("demo.yaml", "{{{", now()),
        Err(StandaloneError::Invalid(_))
    ));
}

#[test]
fn upstream_task_state_defaults_to_per_replica_and_compiles_through() {
    let default = compile_one(&policy(""), &[], &[]).effective.unwrap();
    assert_eq!(default.upstream_task_state, UpstreamTaskState::PerReplica);
    let shared = compile_one(
        &policy(
            "  upstream: {taskState: shared}\n  ledger: {connectionSecretRef: {name: reports-ledger, key: url}}\n",
        ),
        &[],
        &[],
    );
    assert!(shared.problems.is_empty(), "{:?}", shared.problems);
    let shared = shared.effective.unwrap();
    assert_eq!(shared.upstream_task_state, UpstreamTaskState::Shared);
    assert_ne!(shared.hash(), default.hash());

    // Snapshots from operators that predate the field still deserialize.
    let mut old = serde_json::to_value(&default).unwrap();
    old.as_object_mut().unwrap().remove("upstreamTaskState");
    let read: EffectivePolicy = serde_json::from_value(old).unwrap();
    assert_eq!(read.upstream_task_state, UpstreamTaskState::PerReplica);
}

#[test]
fn the_ledger_is_wiring_not_part_of_the_effective_policy() {
    let without = compile_one(&policy(""), &[], &[]).effective.unwrap();
    let with = compile_one(
        &policy("  ledger: {connectionSecretRef: {name: reports-ledger, key: url}}\n"),
        &[],
        &[],
    );
    assert!(with.problems.is_empty(), "{:?}", with.problems);
    let with = with.effective.unwrap();
    assert_eq!(with, without);
    assert_eq!(with.hash(), without.hash());
}

#[test]
fn shared_task_state_without_a_ledger_warns() {
    let c = compile_one(&policy("  upstream: {taskState: shared}\n"), &[], &[]);
    assert!(!c.has_errors());
    assert!(c.effective.is_some());
    let warnings: Vec<_> = c
        .problems
        .iter()
        .map(|p| (p.problem.severity, p.problem.path.as_str()))
        .collect();
    assert_eq!(
        warnings,
        vec![(Severity::Warning, "spec.upstream.taskState")],
        "{:?}",
        c.problems
    );
    assert!(
        c.problems[0].problem.message.contains("spec.ledger"),
        "{}",
        c.problems[0].problem.message
    );
    let per_replica = compile_one(&policy("  upstream: {taskState: perReplica}\n"), &[], &[]);
    assert!(
        per_replica.problems.is_empty(),
        "{:?}",
        per_replica.problems
    );
}

#[test]
fn ledger_secret_references_are_checked_with_the_cel_messages() {
    let c = compile_one(
        &policy("  ledger: {connectionSecretRef: {name: Reports_Ledger, key: \"pg/url\"}}\n"),
        &[],
        &[],
    );
    assert!(c.effective.is_none());
    let errors: Vec<(&str, &str)> = c
        .problems
        .iter()
        .map(|p| (p.problem.path.as_str(), p.problem.message.as_str()))
        .collect();
    assert_eq!(
        errors,
        vec![
            (
                "spec.ledger.connectionSecretRef.name",
                crate::api::rules::SECRET_NAME_DNS_SUBDOMAIN
            ),
            (
                "spec.ledger.connectionSecretRef.key",
                crate::api::rules::SECRET_DATA_KEY
            ),
        ]
    );
}

#[test]
fn revocations_of_a_whole_tenant_or_client_cover_every_subject_and_one_naming_nobody_none() {
    let scoped = |name: &str, scope: &str| -> PrincipalRevocation {
        let yaml = format!(
            "apiVersion: lifeguard.dev/v1alpha1\nkind: PrincipalRevocation\nmetadata: {{name: {name}}}\nspec:\n  issuer: https://idp.example.com\n{scope}  revokedBefore: \"2026-11-30T09:00:00Z\"\n  reason: adminAction\n  source: {{kind: manual}}\n"
        );
        serde_saphyr::from_str(&yaml).unwrap()
    };
    let revocations = [
        scoped("tenant", "  tenant: t1\n"),
        scoped("client", "  client: console\n"),
        scoped("nobody", ""),
    ];
    let compiled = compile_one(&policy(""), &[], &revocations);
    let named: Vec<&ObjectProblem> = compiled
        .problems
        .iter()
        .filter(|p| p.object.name == "nobody")
        .collect();
    assert!(
        named.iter().any(|p| p.problem.path == "spec"
            && p.problem.message == crate::api::rules::REVOCATION_NAMES_SOMEONE),
        "{named:?}"
    );
    assert!(
        compiled.problems.iter().all(|p| p.object.name == "nobody"),
        "{:?}",
        compiled.problems
    );
    let p = compiled.effective.unwrap();
    let rule = |name: &str| p.revocations.iter().find(|r| r.name == name).unwrap();
    let idp = "https://idp.example.com";
    assert!(rule("tenant").covers(idp, "alice", "t1", "console"));
    assert!(rule("tenant").covers(idp, "bob", "t1", "cli"));
    assert!(!rule("tenant").covers(idp, "alice", "t2", "console"));
    assert!(!rule("tenant").covers("https://other-idp", "alice", "t1", "console"));
    assert!(rule("client").covers(idp, "alice", "t1", "console"));
    assert!(rule("client").covers(idp, "carol", "t9", "console"));
    assert!(!rule("client").covers(idp, "alice", "t1", "cli"));
    // Applied (refusing it would fail open) but covering nobody: never a whole issuer.
    assert!(!rule("nobody").covers(idp, "alice", "t1", "console"));
}

#[test]
fn multi_tenant_policies_are_warned_about_subscription_patterns_shared_by_every_tenant() {
    let listen = |allow: &str| {
        format!(
            "  tasks: {{concurrency: {{perTenant: 10}}}}\n  listen:\n    notifications: [resourceSubscriptions]\n    resourceSubscriptions: {{allow: [{allow}]}}\n"
        )
    };
    let warned = |c: &Compilation| -> Vec<String> {
        c.problems
            .iter()
            .filter(|p| {
                p.problem
                    .path
                    .starts_with("spec.listen.resourceSubscriptions.allow")
            })
            .map(|p| p.problem.to_string())
            .collect()
    };
    let shared = compile_one(&policy(&listen("\"reports://team-a/*\"")), &[], &[]);
    let found = warned(&shared);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("partition it with {tenant}"), "{found:?}");
    assert!(shared.effective.is_some(), "a warning, not an error");
    let partitioned = compile_one(
        &policy(&listen("\"reports://{tenant}/*\", \"files://{subject}/*\"")),
        &[],
        &[],
    );
    assert_eq!(warned(&partitioned), Vec::<String>::new());
    // One tenant (no tenant claim named, no per-tenant quota, one issuer): no warning.
    let single = compile_one(
        &policy(
            "  listen:\n    notifications: [resourceSubscriptions]\n    resourceSubscriptions: {allow: [\"reports://team-a/*\"]}\n",
        ),
        &[],
        &[],
    );
    assert_eq!(warned(&single), Vec::<String>::new());
}

#[test]
fn result_rules_compile_with_their_patterns_checked() {
    let c = compile_one(
        &policy(
            "  tasks:\n    results:\n      maxBytes: 4096\n      redact: {drop: [/structuredContent/ssn], mask: ['\\d{3}-\\d{2}-\\d{4}']}\n",
        ),
        &[],
        &[],
    );
    assert!(c.problems.is_empty(), "{:?}", c.problems);
    let results = &c.effective.unwrap().tasks.unwrap().results;
    assert_eq!(results.max_bytes, Some(4096));
    assert_eq!(results.drop, ["/structuredContent/ssn"]);
    assert_eq!(results.mask, ["\\d{3}-\\d{2}-\\d{4}"]);
    assert!(!results.keeps_everything());

    let bad = compile_one(
        &policy(
            "  tasks:\n    results:\n      maxBytes: 0\n      redact: {drop: [ssn], mask: ['(unclosed', '']}\n",
        ),
        &[],
        &[],
    );
    let found: Vec<String> = bad.problems.iter().map(|p| p.problem.to_string()).collect();
    assert!(bad.effective.is_none(), "{found:?}");
    for expected in [
        "spec.tasks.results.maxBytes: must be at least 1",
        "spec.tasks.results.redact.drop[0]",
        "spec.tasks.results.redact.mask[0]: is not a valid regular expression",
        "spec.tasks.results.redact.mask[1]: must not be empty",
    ] {
        assert!(
            found.iter().any(|f| f.contains(expected)),
            "{expected} in {found:?}"
        );
    }
    let status_only = compile_one(
        &policy("  tasks:\n    results: {mode: statusOnly, maxBytes: 10}\n"),
        &[],
        &[],
    );
    assert!(
        status_only
            .problems
            .iter()
            .any(|p| p.problem.message.contains("no effect with mode statusOnly")),
        "{:?}",
        status_only.problems
    );
}

#[test]
fn object_rules_compile_with_defaults_and_their_pointers_checked() {
    let c = compile_one(
        &policy(
            "  tasks:\n    objects:\n      authorizer: {url: 'https://authz.example/access/v1/evaluation'}\n      tools:\n        report: {pointer: /projectId, type: project}\n        export: {pointer: '/target/a~1b'}\n",
        ),
        &[],
        &[],
    );
    assert!(c.problems.is_empty(), "{:?}", c.problems);
    let hash_with_objects = c.effective.as_ref().unwrap().hash();
    let objects = c.effective.unwrap().tasks.unwrap().objects.unwrap();
    use crate::policy::compile::defaults;
    let a = &objects.authorizer;
    assert_eq!(a.format, crate::api::AuthorizerFormat::Authzen);
    assert_eq!(a.timeout.get(), defaults::AUTHORIZER_TIMEOUT);
    assert_eq!(a.cache_ttl.get(), defaults::AUTHORIZER_CACHE_TTL);
    assert_eq!(a.cache_size, defaults::AUTHORIZER_CACHE_SIZE);
    let report = objects.for_tool("report").unwrap();
    assert_eq!(
        (report.pointer.as_str(), report.resource_type.as_str()),
        ("/projectId", "project")
    );
    // Without a type, the authorizer is told the tool's name.
    assert_eq!(objects.for_tool("export").unwrap().resource_type, "export");
    assert!(objects.for_tool("greet").is_none());

    // A policy without objects hashes as it did before the field existed.
    let plain = compile_one(&policy("  tasks: {}\n"), &[], &[]);
    let plain_json = serde_json::to_value(plain.effective.as_ref().unwrap()).unwrap();
    assert!(plain_json["tasks"].get("objects").is_none(), "{plain_json}");
    assert_ne!(plain.effective.unwrap().hash(), hash_with_objects);

    let bad = compile_one(
        &policy(
            "  tasks:\n    objects:\n      authorizer: {url: 'http://authz.svc/e', timeout: 0s, cacheTtl: 1h, cacheSize: 0, caFile: ' '}\n      tools:\n        report: {pointer: projectId}\n        export: {pointer: '/a~2b'}\n",
        ),
        &[],
        &[],
    );
    let found: Vec<String> = bad.problems.iter().map(|p| p.problem.to_string()).collect();
    assert!(bad.effective.is_none(), "{found:?}");
    for expected in [
        "spec.tasks.objects.authorizer.url: must use https",
        "spec.tasks.objects.authorizer.timeout",
        "spec.tasks.objects.authorizer.cacheTtl",
        "spec.tasks.objects.authorizer.cacheSize: must be at least 1",
        "spec.tasks.objects.authorizer.caFile: must not be empty",
        "spec.tasks.objects.tools.report.pointer",
        "spec.tasks.objects.tools.export.pointer",
    ] {
        assert!(
            found.iter().any(|f| f.contains(expected)),
            "{expected} in {found:?}"
        );
    }
}

#[test]
fn identity_lease_and_delegation_compile_and_forward_token_is_warned_about() {
    let c = compile_one(
        &policy("  upstream: {identity: delegation}\n  tasks: {identityLease: 30m}\n"),
        &[],
        &[],
    );
    assert!(c.problems.is_empty(), "{:?}", c.problems);
    let effective = c.effective.unwrap();
    assert_eq!(
        effective.upstream_identity,
        crate::api::UpstreamIdentity::Delegation
    );
    let lease = effective.tasks.unwrap().identity_lease.unwrap();
    assert_eq!(lease.get(), Duration::from_secs(1800));

    let short = compile_one(&policy("  tasks: {identityLease: 10s}\n"), &[], &[]);
    assert!(short.effective.is_some());
    assert!(
        short
            .problems
            .iter()
            .any(|p| p.problem.path == "spec.tasks.identityLease"),
        "{:?}",
        short.problems
    );
    let forwarding = compile_one(&policy("  upstream: {identity: forwardToken}\n"), &[], &[]);
    assert!(forwarding.effective.is_some(), "a warning, not an error");
    assert!(
        forwarding
            .problems
            .iter()
            .any(|p| p.problem.path == "spec.upstream.identity"
                && p.problem.message.contains("prefer delegation")),
        "{:?}",
        forwarding.problems
    );
}
