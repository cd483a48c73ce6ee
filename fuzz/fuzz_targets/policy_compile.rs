//! Fuzz target: the policy YAML → compiler path (`policy::check::ManifestFile::parse`,
//! `policy::check::check_files` in both modes, `policy::load_standalone`).
//!
//! Input: a file of YAML manifests (any bytes; non-UTF-8 is read lossily, as a file would be
//! refused before).
//!
//! Asserts: every finding renders with the file's name and a line inside the file; every
//! compiled policy is what the operator sends a sidecar, so it survives the JSON round trip
//! (and hashes the same after it); `load_standalone` agrees with `check_files` on whether the
//! file has errors, and its refusal says what is wrong.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lifeguard::policy::check::{ManifestFile, StandaloneError, check_files};
use lifeguard::policy::{CompileMode, EffectivePolicy, Severity, load_standalone};
use lifeguard_fuzz::NOW;

const FILE: &str = "fuzz.yaml";

/// Lines as YAML counts them: `\r\n`, `\r` and `\n` each end one.
fn yaml_lines(text: &str) -> u32 {
    let breaks = text.replace("\r\n", "\n").matches(['\r', '\n']).count();
    breaks as u32 + 1
}

fn round_trips(policy: &EffectivePolicy) {
    let wire = serde_json::to_vec(policy).expect("a compiled policy serializes");
    let back: EffectivePolicy =
        serde_json::from_slice(&wire).expect("a compiled policy deserializes");
    assert_eq!(
        &back, policy,
        "the policy a sidecar receives is the one compiled"
    );
    assert_eq!(back.hash(), policy.hash());
}

fuzz_target!(|data: &[u8]| {
    // The CLI reads files as UTF-8 text; keep inputs small so each run stays fast.
    if data.len() > 64 * 1024 {
        return;
    }
    let text = String::from_utf8_lossy(data);
    let now = jiff::Timestamp::from_second(NOW).unwrap();
    let lines = yaml_lines(&text);
    let file = ManifestFile::parse(FILE, &text);
    let mut standalone_errors = 0;
    for mode in [CompileMode::Cluster, CompileMode::Standalone] {
        let report = check_files(std::slice::from_ref(&file), mode, now);
        for finding in &report.findings {
            let rendered = finding.to_string();
            assert!(rendered.starts_with(FILE), "{rendered}");
            if let Some(line) = finding.line {
                assert!(
                    (1..=lines).contains(&line),
                    "line {line} of {lines}: {rendered}"
                );
            }
        }
        for policy in &report.policies {
            round_trips(policy);
        }
        if mode == CompileMode::Standalone {
            standalone_errors = report.errors();
        }
    }
    match load_standalone(FILE, &text, now) {
        Ok((policy, warnings)) => {
            assert_eq!(standalone_errors, 0);
            assert!(
                warnings
                    .iter()
                    .all(|w| w.problem.severity != Severity::Error)
            );
            round_trips(&policy);
        }
        Err(error) => {
            if let StandaloneError::Invalid(errors) = &error {
                assert_eq!(errors.len(), standalone_errors);
            }
            assert!(!error.to_string().is_empty());
        }
    }
});
