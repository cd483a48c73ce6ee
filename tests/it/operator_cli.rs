//! `lifeguard operator`'s command line: bad inputs stop it with an error that names the
//! problem, before it talks to any API server.

use crate::support;

use std::process::Command;
use std::time::Duration;

use support::operator::TestCa;
use support::process::run_to_completion;

fn operator(args: &[&str]) -> (bool, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lifeguard"));
    command.arg("operator").args(args);
    let output = run_to_completion(command, "lifeguard operator", Duration::from_secs(30));
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_configuration_with_an_unknown_key_is_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path());
    let config = dir.path().join("operator.yaml");
    std::fs::write(
        &config,
        "securityEvents:\n  audience: https://a\n  transmitters:\n    - {issuer: https://i, jwksUri: https://i/jwks, delivery: push, pollEndpont: https://i/poll}\n",
    )
    .unwrap();
    let (ok, stderr) = operator(&[
        "--config",
        config.to_str().unwrap(),
        "--tls-cert",
        ca.cert_path.to_str().unwrap(),
        "--tls-key",
        ca.key_path.to_str().unwrap(),
        "--kubeconfig",
        "/nonexistent/kubeconfig",
    ]);
    assert!(!ok);
    assert!(stderr.contains("pollEndpont"), "{stderr}");
    assert!(stderr.contains("transmitters[0]"), "{stderr}");
}

#[test]
fn a_missing_or_mismatched_serving_certificate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path());
    let (ok, stderr) = operator(&[
        "--tls-cert",
        dir.path().join("absent.crt").to_str().unwrap(),
        "--tls-key",
        ca.key_path.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(
        stderr.contains("serving certificate") && stderr.contains("absent.crt"),
        "{stderr}"
    );
    // The CA's certificate with the leaf's key: they do not match.
    let (ok, stderr) = operator(&[
        "--tls-cert",
        ca.ca_path.to_str().unwrap(),
        "--tls-key",
        ca.key_path.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(stderr.contains("does not match"), "{stderr}");
}

#[test]
fn the_tls_flags_are_required() {
    let (ok, stderr) = operator(&[]);
    assert!(!ok);
    assert!(stderr.contains("--tls-cert"), "{stderr}");
}
