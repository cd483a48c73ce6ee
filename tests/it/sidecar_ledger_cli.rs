//! The sidecar's ledger flags, black box: a PostgreSQL password never appears in what the
//! sidecar prints, whether the URL is malformed or the database unreachable; flags that only
//! make sense with a shared ledger are refused without one.

use crate::support;

use std::process::Command;
use std::time::Duration;

use support::process::run_to_completion;

const SECRET: &str = "hunter2-do-not-print";

fn sidecar(args: &[&str]) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    std::fs::copy(support::fixture("keys/issuer-jwks.json"), &jwks).unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, support::policy_yaml(&jwks, "")).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_lifeguard"));
    command
        .arg("sidecar")
        .arg("--policy")
        .arg(&policy)
        .args([
            "--upstream",
            "http://127.0.0.1:9/mcp",
            "--listen",
            "127.0.0.1:0",
        ])
        .args(args)
        .env_remove("PGPASSWORD")
        .env_remove("LIFEGUARD_LEDGER");
    let output = run_to_completion(command, "the sidecar", Duration::from_secs(60));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

#[test]
fn a_malformed_postgres_url_is_refused_without_echoing_its_password() {
    let url = format!("postgres://lifeguard:{SECRET}@db.internal:notaport/ledger");
    let (ok, text) = sidecar(&["--ledger", &url]);
    assert!(!ok, "{text}");
    assert!(text.contains("--ledger"), "{text}");
    assert!(!text.contains(SECRET), "the password leaked: {text}");
}

#[test]
fn an_unreachable_database_fails_the_start_without_printing_its_password() {
    // Port 1 on loopback: nothing listens there.
    let url = format!("postgres://lifeguard:{SECRET}@127.0.0.1:1/ledger?connect_timeout=2");
    let (ok, text) = sidecar(&["--ledger", &url, "--ledger-scope", "tests/policy"]);
    assert!(!ok, "{text}");
    assert!(text.contains("opening the task ledger"), "{text}");
    assert!(
        text.contains("postgres://lifeguard@127.0.0.1:1/ledger"),
        "{text}"
    );
    assert!(!text.contains(SECRET), "the password leaked: {text}");
}

#[test]
fn the_internal_hop_needs_a_shared_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.db");
    let (ok, text) = sidecar(&[
        "--ledger",
        ledger.to_str().unwrap(),
        "--internal-listen",
        "127.0.0.1:0",
    ]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("--internal-listen needs a ledger shared"),
        "{text}"
    );
}
