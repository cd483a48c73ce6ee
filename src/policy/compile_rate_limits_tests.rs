//! `spec.rateLimits` through the compiler and `policy check`: the contract's shape, burst
//! defaults, fractional rates, the problems and their field paths.

use std::collections::BTreeMap;

use super::*;
use crate::api::McpServerPolicy;
use crate::policy::problem::{Problem, Severity};
use crate::policy::{CompileInput, CompileMode, ManifestFile, check_files, compile};

const HEADER: &str = r#"
apiVersion: lifeguard.dev/v1alpha1
kind: McpServerPolicy
metadata: {name: reports, namespace: team-a}
spec:
  selector: {}
  resource: https://reports.example.com/mcp
  identity:
    issuers: [{issuer: "https://idp.example.com", jwksUri: "https://idp.example.com/jwks"}]
"#;

/// The contract's example, verbatim.
const CONTRACT: &str = "  rateLimits:
    perPrincipal: {requestsPerSecond: 10, burst: 20}
    perTenant:    {requestsPerSecond: 100, burst: 200}
    perClient:    {requestsPerSecond: 50, burst: 100}
    perServer:    {requestsPerSecond: 1000, burst: 2000}
    tools:
      generate_report: {perPrincipal: {requestsPerSecond: 1, burst: 2}}
";

fn policy(extra: &str) -> McpServerPolicy {
    serde_saphyr::from_str(&format!("{HEADER}{extra}")).unwrap()
}

/// The compiled limits (`Err` with the problems when the policy does not compile) and every
/// problem found.
fn compiled(extra: &str) -> (Option<RateLimitRules>, Vec<Problem>) {
    let policy = policy(extra);
    let c = compile(CompileInput {
        policy: &policy,
        exceptions: &[],
        revocations: &[],
        mode: CompileMode::Cluster,
        now: "2026-11-30T12:00:00Z".parse().unwrap(),
    });
    let problems: Vec<Problem> = c.problems.into_iter().map(|p| p.problem).collect();
    match c.effective {
        Some(effective) => (effective.rate_limits, problems),
        None => panic!("does not compile: {problems:#?}"),
    }
}

/// The problems of a policy that must not compile.
fn refused(extra: &str) -> Vec<(Severity, String, String)> {
    let policy = policy(extra);
    let c = compile(CompileInput {
        policy: &policy,
        exceptions: &[],
        revocations: &[],
        mode: CompileMode::Cluster,
        now: "2026-11-30T12:00:00Z".parse().unwrap(),
    });
    assert!(c.effective.is_none(), "{extra} compiled");
    c.problems
        .into_iter()
        .map(|p| (p.problem.severity, p.problem.path, p.problem.message))
        .collect()
}

fn b(requests_per_second: f64, burst: u32) -> Option<Bucket> {
    Some(Bucket {
        requests_per_second,
        burst,
    })
}

#[test]
fn the_contract_compiles_to_its_buckets_without_a_warning() {
    let (rules, problems) = compiled(CONTRACT);
    assert_eq!(problems, vec![]);
    assert_eq!(
        rules.unwrap(),
        RateLimitRules {
            all: ScopedBuckets {
                per_principal: b(10.0, 20),
                per_tenant: b(100.0, 200),
                per_client: b(50.0, 100),
                per_server: b(1000.0, 2000),
            },
            methods: BTreeMap::new(),
            tools: BTreeMap::from([(
                "generate_report".to_owned(),
                ScopedBuckets {
                    per_principal: b(1.0, 2),
                    ..ScopedBuckets::default()
                }
            )]),
        }
    );
}

#[test]
fn bursts_default_to_the_rate_rounded_up_and_rates_may_be_fractions() {
    let (rules, problems) = compiled(
        "  rateLimits:
    perPrincipal: {requestsPerSecond: 2.5}
    methods:
      taskReads: {perPrincipal: {requestsPerSecond: 0.5}}
      listenOpens: {perClient: {requestsPerSecond: 0.001}}
      toolsCall: {perServer: {requestsPerSecond: 1000000}}
",
    );
    assert_eq!(problems, vec![]);
    let rules = rules.unwrap();
    assert_eq!(rules.all.per_principal, b(2.5, 3));
    assert_eq!(
        rules.methods[&MethodClass::TaskReads].per_principal,
        b(0.5, 1)
    );
    assert_eq!(
        rules.methods[&MethodClass::ListenOpens].per_client,
        b(0.001, 1)
    );
    assert_eq!(
        rules.methods[&MethodClass::ToolsCall].per_server,
        b(1_000_000.0, 1_000_000)
    );
    assert_eq!(default_burst(10.0), 10);
    assert_eq!(default_burst(10.01), 11);
}

#[test]
fn no_limits_compile_to_none_and_keep_the_policy_hash() {
    let hash = |extra: &str| {
        let policy = policy(extra);
        compile(CompileInput {
            policy: &policy,
            exceptions: &[],
            revocations: &[],
            mode: CompileMode::Cluster,
            now: "2026-11-30T12:00:00Z".parse().unwrap(),
        })
        .effective
        .unwrap()
        .hash()
    };
    let (rules, problems) = compiled("");
    assert_eq!((rules, problems), (None, vec![]));

    let (rules, problems) = compiled("  rateLimits: {}\n");
    assert_eq!(rules, None);
    assert_eq!(
        problems,
        vec![Problem {
            severity: Severity::Warning,
            path: "spec.rateLimits".into(),
            message: "names no bucket, so no request is limited".into(),
        }]
    );
    assert_eq!(hash("  rateLimits: {}\n"), hash(""));

    // Empty method and tool entries limit nothing either.
    let (rules, problems) =
        compiled("  rateLimits: {methods: {taskReads: {}}, tools: {generate_report: {}}}\n");
    assert_eq!(rules, None);
    let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "spec.rateLimits.methods.taskReads",
            "spec.rateLimits.tools.generate_report",
            "spec.rateLimits"
        ]
    );
    assert!(problems.iter().all(|p| p.severity == Severity::Warning));
    assert_ne!(hash(CONTRACT), hash(""));
}

#[test]
fn rates_and_bursts_out_of_range_are_errors_at_their_field() {
    for (rate, burst) in [
        ("0", "1"),
        ("-1", "1"),
        ("0.0009", "1"),
        ("1000001", "1"),
        (".nan", "1"),
        (".inf", "1"),
    ] {
        let problems = refused(&format!(
            "  rateLimits:\n    tools:\n      generate_report: {{perPrincipal: {{requestsPerSecond: {rate}, burst: {burst}}}}}\n"
        ));
        assert_eq!(
            problems,
            vec![(
                Severity::Error,
                "spec.rateLimits.tools.generate_report.perPrincipal.requestsPerSecond".into(),
                RATE_OUT_OF_RANGE.into()
            )],
            "rate {rate}"
        );
    }
    for burst in ["0", "1000001"] {
        let problems = refused(&format!(
            "  rateLimits:\n    methods:\n      toolsCall: {{perTenant: {{requestsPerSecond: 5, burst: {burst}}}}}\n"
        ));
        assert_eq!(
            problems,
            vec![(
                Severity::Error,
                "spec.rateLimits.methods.toolsCall.perTenant.burst".into(),
                BURST_OUT_OF_RANGE.into()
            )],
            "burst {burst}"
        );
    }
    let problems = refused("  rateLimits: {perServer: {requestsPerSecond: 0}}\n");
    assert_eq!(problems[0].1, "spec.rateLimits.perServer.requestsPerSecond");
}

#[test]
fn tool_names_are_checked_for_length_and_characters() {
    let long = "t".repeat(129);
    for name in ["\"\"", long.as_str()] {
        let problems = refused(&format!(
            "  rateLimits:\n    tools:\n      {name}: {{perPrincipal: {{requestsPerSecond: 1}}}}\n"
        ));
        assert_eq!(
            problems,
            vec![(
                Severity::Error,
                "spec.rateLimits.tools".into(),
                rules::RATE_LIMIT_TOOL_NAME.into()
            )],
            "{name}"
        );
    }
    let problems = refused(
        "  rateLimits:\n    tools:\n      \"generate report\": {perPrincipal: {requestsPerSecond: 1}}\n",
    );
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].1, "spec.rateLimits.tools.generate report");

    // The specification's characters (and 128 of them) are fine; others only warned about.
    let longest = "t".repeat(128);
    let (rules, problems) = compiled(&format!(
        "  rateLimits:\n    tools:\n      admin.tools-list_v2: {{perPrincipal: {{requestsPerSecond: 1}}}}\n      {longest}: {{perPrincipal: {{requestsPerSecond: 1}}}}\n      files/read: {{perPrincipal: {{requestsPerSecond: 1}}}}\n"
    ));
    assert_eq!(rules.unwrap().tools.len(), 3);
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert_eq!(problems[0].severity, Severity::Warning);
    assert_eq!(problems[0].path, "spec.rateLimits.tools.files/read");
}

#[test]
fn buckets_that_a_wider_one_always_outruns_are_warned_about() {
    let (rules, problems) = compiled(
        "  rateLimits:
    perPrincipal: {requestsPerSecond: 2000, burst: 4000}
    perServer: {requestsPerSecond: 1000, burst: 2000}
    perTenant: {requestsPerSecond: 100}
    methods:
      toolsCall: {perTenant: {requestsPerSecond: 100, burst: 100}}
    tools:
      generate_report:
        perTenant: {requestsPerSecond: 200, burst: 50}
        perClient: {requestsPerSecond: 1}
",
    );
    assert!(rules.is_some(), "warnings do not stop the policy");
    let warned: Vec<(&str, &str)> = problems
        .iter()
        .map(|p| {
            assert_eq!(p.severity, Severity::Warning, "{p}");
            (p.path.as_str(), p.message.as_str())
        })
        .collect();
    assert_eq!(
        warned,
        [
            (
                "spec.rateLimits.perPrincipal",
                "never refuses a request on its own: perServer (1000/s, burst 2000) is charged for every request this bucket is and is at least as tight"
            ),
            (
                "spec.rateLimits.methods.toolsCall.perTenant",
                "never refuses a request on its own: perTenant (100/s, burst 100) is charged for every request this bucket is and is at least as tight"
            ),
        ],
        "a bucket with a higher rate but a smaller burst still refuses bursts"
    );
}

#[test]
fn policy_check_reports_the_cel_rule_and_the_compiler_once() {
    let long = "t".repeat(129);
    let text = format!(
        "{HEADER}  rateLimits:\n    perPrincipal: {{requestsPerSecond: 0}}\n    tools:\n      {long}: {{perPrincipal: {{requestsPerSecond: 1}}}}\n"
    );
    let report = check_files(
        &[ManifestFile::parse("p.yaml", &text)],
        CompileMode::Cluster,
        "2026-11-30T12:00:00Z".parse().unwrap(),
    );
    let found: Vec<(String, String)> = report
        .findings
        .iter()
        .map(|f| (f.problem.path.clone(), f.problem.message.clone()))
        .collect();
    assert_eq!(
        found,
        [
            (
                "spec.rateLimits.tools".to_owned(),
                rules::RATE_LIMIT_TOOL_NAME.to_owned()
            ),
            (
                "spec.rateLimits.perPrincipal.requestsPerSecond".to_owned(),
                RATE_OUT_OF_RANGE.to_owned()
            ),
        ]
    );
    assert!(report.policies.is_empty());

    let report = check_files(
        &[ManifestFile::parse(
            "p.yaml",
            &format!("{HEADER}{CONTRACT}"),
        )],
        CompileMode::Cluster,
        "2026-11-30T12:00:00Z".parse().unwrap(),
    );
    assert_eq!(report.errors(), 0, "{:#?}", report.findings);
    assert!(report.findings.is_empty(), "{:#?}", report.findings);
    assert!(report.policies[0].rate_limits.is_some());
}
