//! `lifeguard evidence`, black box: the pack passes against a sidecar enforcing the evidence
//! policy, and fails when pointed past the sidecar at the unprotected server, so a green report
//! means something.

use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use support::process::run_to_completion;
use support::{ExampleServer, Sidecar, SidecarOptions};

/// Every check the pack has; a new one must be added here, and must pass.
const CHECKS: &[&str] = &[
    "policy-hash",
    "cross-principal",
    "guessed-ids",
    "tokens",
    "token-expires-mid-task",
    "envelope",
    "cancel-then-writes",
    "read-once",
    "deadline",
    "quota",
    "idempotency",
    "listen",
    "tool-removed-mid-run",
    "user-disabled-mid-run",
];

/// `spec:` of examples/evidence/policy.yaml from `tasks:` on, for the harness's test policy
/// (which brings its own resource and issuer).
fn evidence_spec() -> String {
    let text = std::fs::read_to_string(support::repo().join("examples/evidence/policy.yaml"))
        .expect("examples/evidence/policy.yaml");
    let start = text.find("\n  tasks:\n").expect("a tasks section") + 1;
    text[start..].to_owned()
}

fn lifeguard_evidence(args: &[String]) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lifeguard"));
    command.arg("evidence").args(args);
    run_to_completion(command, "lifeguard evidence", Duration::from_secs(300))
}

/// The one JSON report in `dir`.
fn report(dir: &Path) -> Value {
    let json: Vec<_> = std::fs::read_dir(dir)
        .expect("report directory")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    assert_eq!(json.len(), 1, "one JSON report in {}", dir.display());
    let md = json[0].with_extension("md");
    assert!(md.is_file(), "the Markdown report beside it");
    serde_json::from_str(&std::fs::read_to_string(&json[0]).unwrap()).unwrap()
}

fn key_args() -> Vec<String> {
    vec![
        "--key".into(),
        support::fixture("keys/issuer-ed25519.pem")
            .display()
            .to_string(),
        "--kid".into(),
        "test-ed-1".into(),
    ]
}

#[tokio::test]
async fn the_pack_passes_against_a_sidecar_and_records_every_check() {
    let server = ExampleServer::start();
    let sidecar = Sidecar::start(
        &server.url,
        SidecarOptions {
            spec: evidence_spec(),
            ..Default::default()
        },
    )
    .await;
    let out = tempfile::tempdir().unwrap();
    let mut args = vec![
        "--target".into(),
        sidecar.url.clone(),
        "--admin".into(),
        sidecar.admin.clone(),
        "--policy".into(),
        sidecar.policy_path.display().to_string(),
        "--audit-file".into(),
        sidecar.audit_path.display().to_string(),
        "--upstream-debug".into(),
        server.base.clone(),
        "--out".into(),
        out.path().display().to_string(),
    ];
    args.extend(key_args());
    let policy_before = std::fs::read_to_string(&sidecar.policy_path).unwrap();
    let output = lifeguard_evidence(&args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let report = report(out.path());
    let checks = report["checks"].as_array().expect("checks");
    let ids: Vec<&str> = checks.iter().filter_map(|c| c["id"].as_str()).collect();
    assert_eq!(ids, CHECKS, "every check, in order");
    for check in checks {
        assert_eq!(
            check["verdict"],
            "pass",
            "{}: {}\nfailures: {}\n{stderr}\nsidecar:\n{}",
            check["id"],
            check["reason"],
            check["failures"],
            sidecar.logs()
        );
        assert!(
            !check["exchanges"].as_array().unwrap().is_empty(),
            "{}: records its requests",
            check["id"]
        );
        assert!(
            !check["audit"].as_array().unwrap().is_empty(),
            "{}: quotes the audit lines it caused",
            check["id"]
        );
    }
    assert!(output.status.success(), "{stderr}");
    assert_eq!(report["summary"]["failed"], 0);
    assert_eq!(
        report["policy"]["hashesAgree"], true,
        "{}",
        report["policy"]
    );
    assert_eq!(
        std::fs::read_to_string(&sidecar.policy_path).unwrap(),
        policy_before,
        "the reload and revocation checks restore the policy file"
    );
    // Tokens never reach the report: only their labels.
    let raw = serde_json::to_string(&report).unwrap();
    assert!(raw.contains("Bearer <alice token>"));
    assert!(!raw.contains("Bearer ey"), "a token in the report");
}

#[tokio::test]
async fn the_pack_fails_against_the_unprotected_server() {
    let server = ExampleServer::start();
    let out = tempfile::tempdir().unwrap();
    let mut args = vec![
        "--target".into(),
        server.url.clone(),
        "--issuer".into(),
        support::ISSUER.into(),
        "--audience".into(),
        support::RESOURCE.into(),
        "--check".into(),
        "cross-principal".into(),
        "--check".into(),
        "tokens".into(),
        "--check".into(),
        "token-expires-mid-task".into(),
        "--upstream-debug".into(),
        server.base.clone(),
        "--out".into(),
        out.path().display().to_string(),
    ];
    args.extend(key_args());
    let output = lifeguard_evidence(&args);
    assert_eq!(
        output.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report = report(out.path());
    for check in report["checks"].as_array().unwrap() {
        assert_eq!(
            check["verdict"], "fail",
            "{}: {}",
            check["id"], check["reason"]
        );
    }
    let cross = &report["checks"][0];
    assert_eq!(cross["id"], "cross-principal");
    let failures = cross["failures"].to_string();
    assert!(
        failures.contains("bob (same tenant): tasks/get of alice's task"),
        "bob reads alice's task straight from the server: {failures}"
    );
    let tokens = report["checks"][1]["failures"].to_string();
    assert!(
        tokens.contains("refused tools/call requests reached the server"),
        "the server's own log shows what got through: {tokens}"
    );
    let expiry = &report["checks"][2];
    assert_eq!(expiry["id"], "token-expires-mid-task");
    assert!(
        expiry["failures"]
            .to_string()
            .contains("the expired token: expected HTTP 401"),
        "the server keeps answering an expired token: {}",
        expiry["failures"]
    );
}

#[test]
fn an_unreachable_target_is_a_clear_error() {
    let out = tempfile::tempdir().unwrap();
    let mut args = vec![
        "--target".into(),
        "http://127.0.0.1:9/mcp".into(),
        "--issuer".into(),
        support::ISSUER.into(),
        "--out".into(),
        out.path().display().to_string(),
    ];
    args.extend(key_args());
    let output = lifeguard_evidence(&args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("cannot reach --target http://127.0.0.1:9/mcp"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// A check's old name is refused with its new one (the names are the report's contract), and
/// `--list` names the checks of the security review's seed.
#[test]
fn a_renamed_check_is_refused_with_its_new_name() {
    let out = tempfile::tempdir().unwrap();
    let mut args = vec![
        "--target".into(),
        "http://127.0.0.1:9/mcp".into(),
        "--issuer".into(),
        support::ISSUER.into(),
        "--check".into(),
        "disable-mid-run".into(),
        "--out".into(),
        out.path().display().to_string(),
    ];
    args.extend(key_args());
    let output = lifeguard_evidence(&args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("\"disable-mid-run\" is now called \"tool-removed-mid-run\""),
        "{stderr}"
    );
    let listed = lifeguard_evidence(&["--list".into()]);
    let stdout = String::from_utf8_lossy(&listed.stdout);
    let names: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(names, CHECKS, "{stdout}");
}
