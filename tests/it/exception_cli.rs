//! `lifeguard exception sign | verify | payload`, and the documented OpenSSL recipe
//! (docs/capability-exceptions.md) producing the very same signature: approvers are not locked
//! into our binary.

use crate::support;

use std::path::Path;
use std::process::Command;

use support::repo;

const KID: &str = "security-approver-1";

fn lifeguard(args: &[&str], dir: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lifeguard"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run lifeguard");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// `lifeguard exception sign --in-place` with the example approver key.
fn sign_in_place(file: &Path, dir: &Path) {
    let key = repo().join("examples/approvers/example-approver.pem");
    let (ok, out) = lifeguard(
        &[
            "exception",
            "sign",
            "--key",
            key.to_str().unwrap(),
            "--kid",
            KID,
            "--in-place",
            file.to_str().unwrap(),
        ],
        dir,
    );
    assert!(ok, "{out}");
}

/// `lifeguard exception verify` against the example approver keys.
fn verify(file: &Path, dir: &Path) -> (bool, String) {
    let keys = repo().join("examples/approvers/approvers.jwks.json");
    lifeguard(
        &[
            "exception",
            "verify",
            "--keys",
            keys.to_str().unwrap(),
            file.to_str().unwrap(),
        ],
        dir,
    )
}

/// The valid example, re-dated so it is in force now.
fn active_exception(dir: &Path) -> std::path::PathBuf {
    let text =
        std::fs::read_to_string(repo().join("examples/policies/valid/capabilityexception.yaml"))
            .unwrap();
    let now = jiff::Timestamp::now();
    let text = text
        .replace(
            "notBefore: \"2026-12-01T00:00:00Z\"",
            &format!(
                "notBefore: \"{}\"",
                now - jiff::SignedDuration::from_hours(1)
            ),
        )
        .replace(
            "expiresAt: \"2026-12-15T00:00:00Z\"",
            &format!(
                "expiresAt: \"{}\"",
                now + jiff::SignedDuration::from_hours(1)
            ),
        );
    assert!(text.contains(&(now.to_string()[..4])), "dates replaced");
    let path = dir.join("exception.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

fn signature_line(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .find_map(|l| l.trim().strip_prefix("signature: ").map(str::to_owned))
        .expect("signature line")
}

#[test]
fn sign_then_verify_explains_every_check_and_catches_an_edit() {
    let dir = tempfile::tempdir().unwrap();
    let file = active_exception(dir.path());
    sign_in_place(&file, dir.path());
    let (ok, out) = verify(&file, dir.path());
    assert!(ok, "{out}");
    for check in [
        "ok    structure",
        "ok    approver key",
        "ok    signature",
        "ok    binding: policy `reports` in namespace `team-a`",
        "ok    valid now",
        "state: Active",
    ] {
        assert!(out.contains(check), "missing `{check}` in:\n{out}");
    }

    // Raising a budget after approval breaks the signature; verify says so and fails.
    let edited = std::fs::read_to_string(&file)
        .unwrap()
        .replace("maxTokens: 2000", "maxTokens: 200000");
    std::fs::write(&file, edited).unwrap();
    let (ok, out) = verify(&file, dir.path());
    assert!(!ok, "{out}");
    assert!(out.contains("FAIL  signature"), "{out}");
    assert!(out.contains("state: Invalid"), "{out}");
}

/// Runs the recipe of docs/capability-exceptions.md in `sh`. OpenSSL ≥ 3.0 is required.
const OPENSSL_RECIPE: &str = r#"
set -eu
b64url() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }
HEADER=$(printf '{"alg":"EdDSA","kid":"%s","lifeguard.dev/binding":"%s/%s","typ":"lifeguard-exception+jws"}' \
  "$KID" "$NS" "$POLICY" | b64url)
"$LIFEGUARD" exception payload "$FILE" > payload.json
PAYLOAD=$(b64url < payload.json)
printf '%s.%s' "$HEADER" "$PAYLOAD" > signing-input
openssl pkeyutl -sign -inkey "$KEY" -rawin -in signing-input | b64url > sig
printf '%s..%s' "$HEADER" "$(cat sig)"
"#;

#[test]
fn the_documented_openssl_recipe_produces_the_same_signature() {
    let openssl = Command::new("openssl").arg("version").output();
    let version = match openssl {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).to_string(),
        _ => panic!(
            "this test needs the `openssl` command (OpenSSL 3): install it (apt-get install openssl)"
        ),
    };
    let dir = tempfile::tempdir().unwrap();
    let file = active_exception(dir.path());
    let key = repo().join("examples/approvers/example-approver.pem");
    let out = Command::new("sh")
        .arg("-c")
        .arg(OPENSSL_RECIPE)
        .current_dir(dir.path())
        .env("LIFEGUARD", env!("CARGO_BIN_EXE_lifeguard"))
        .env("FILE", &file)
        .env("KEY", &key)
        .env("KID", KID)
        .env("NS", "team-a")
        .env("POLICY", "reports")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "recipe failed with {version}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let by_openssl = String::from_utf8(out.stdout).unwrap();

    sign_in_place(&file, dir.path());
    // Ed25519 is deterministic and both produce the same header bytes: identical signatures.
    assert_eq!(by_openssl, signature_line(&file));
}

/// `lifeguard ARGS` with stdout and stderr apart, and its exit code.
fn lifeguard_split(args: &[&str], dir: &Path) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lifeguard"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run lifeguard");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every `exception` subcommand on a file whose exception does not parse (a tenant written as
/// a string) or that the API server would refuse (an unknown field) fails with the findings `policy check` prints for that file,
/// word for word, instead of "holds 0 CapabilityExceptions".
#[test]
fn a_document_that_does_not_parse_gets_policy_checks_error_from_every_exception_command() {
    let dir = tempfile::tempdir().unwrap();
    let good = active_exception(dir.path());
    let text = std::fs::read_to_string(&good).unwrap().replace(
        "tenants: [{issuer: \"https://idp.example.com\", tenant: tenant-a}]",
        "tenants: [tenant-a]",
    );
    assert!(text.contains("tenants: [tenant-a]"), "edit applied");
    let bad_type = dir.path().join("bad-type.yaml");
    std::fs::write(&bad_type, &text).unwrap();
    let misspelled = dir.path().join("misspelled.yaml");
    std::fs::write(
        &misspelled,
        std::fs::read_to_string(&good).unwrap().replace(
            "  approvalId: CHG-2026-1187",
            "  approvalId: CHG-2026-1187\n  approvedBy: ciso",
        ),
    )
    .unwrap();
    let key = repo().join("examples/approvers/example-approver.pem");
    let keys = repo().join("examples/approvers/approvers.jwks.json");

    for (file, expected) in [
        (
            &bad_type,
            "spec.tenants[0]: invalid type: string \"tenant-a\", expected struct TenantRef",
        ),
        (&misspelled, "spec.approvedBy: unknown field"),
    ] {
        let path = file.to_str().unwrap();
        let (code, stdout, _) = lifeguard_split(&["policy", "check", path], dir.path());
        assert_eq!(code, Some(1), "policy check fails:\n{stdout}");
        // Every finding line (not the summary) of policy check.
        let findings: Vec<&str> = stdout
            .lines()
            .filter(|l| l.starts_with(path) && l.contains(" error: "))
            .collect();
        assert!(
            findings.iter().any(|l| l.contains(expected)),
            "policy check names `{expected}`:\n{stdout}"
        );
        let commands: [Vec<&str>; 4] = [
            vec![
                "exception",
                "sign",
                "--key",
                key.to_str().unwrap(),
                "--kid",
                KID,
                path,
            ],
            vec![
                "exception",
                "sign",
                "--key",
                key.to_str().unwrap(),
                "--kid",
                KID,
                "--in-place",
                path,
            ],
            vec!["exception", "payload", path],
            vec![
                "exception",
                "verify",
                "--keys",
                keys.to_str().unwrap(),
                path,
            ],
        ];
        let before = std::fs::read_to_string(file).unwrap();
        for args in commands {
            let (code, stdout, stderr) = lifeguard_split(&args, dir.path());
            assert_ne!(code, Some(0), "{args:?} must fail:\n{stdout}{stderr}");
            for finding in &findings {
                assert!(
                    stderr.contains(finding),
                    "{args:?} must say what policy check says:\n  {finding}\ngot:\n{stderr}"
                );
            }
            assert!(
                !stderr.contains("CapabilityExceptions")
                    && !stdout.contains("no CapabilityException"),
                "{args:?} miscounts instead: {stdout}{stderr}"
            );
            assert!(stdout.is_empty(), "{args:?} printed: {stdout}");
            assert_eq!(
                std::fs::read_to_string(file).unwrap(),
                before,
                "{args:?} left the file as it was"
            );
        }
    }

    // verify still reports the good file next to a bad one, and fails.
    let (code, stdout, stderr) = lifeguard_split(
        &[
            "exception",
            "verify",
            "--keys",
            keys.to_str().unwrap(),
            bad_type.to_str().unwrap(),
            good.to_str().unwrap(),
        ],
        dir.path(),
    );
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains("invalid type: string \"tenant-a\", expected struct TenantRef"),
        "{stderr}"
    );
    assert!(
        stdout.contains("CapabilityException team-a/reports-summarize-with-sampling"),
        "{stdout}"
    );
}
