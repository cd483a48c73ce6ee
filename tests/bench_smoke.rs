//! The performance benchmark (`examples/sidecar_bench`, docs/performance.md) in smoke mode:
//! every phase runs, tiny, against the binaries of this build profile. It fails only when a
//! request fails or a process does not start — never on timing, which is the full run's job.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Builds (or confirms up to date) the examples the smoke run needs, in this test's profile.
/// A plain `cargo test` builds examples first; `cargo test --test bench_smoke` does not.
fn build_examples(profile_dir: &Path) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args([
        "build",
        "--quiet",
        "--example",
        "example_server",
        "--example",
        "sidecar_bench",
    ])
    .arg("--manifest-path")
    .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"));
    if profile_dir.file_name().is_some_and(|p| p == "release") {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("running cargo build for the examples");
    assert!(status.success(), "building the examples failed: {status}");
}

#[test]
fn benchmark_smoke_run_has_no_errors() {
    let lifeguard = PathBuf::from(env!("CARGO_BIN_EXE_lifeguard"));
    let profile_dir = lifeguard.parent().expect("binary directory").to_owned();
    build_examples(&profile_dir);
    let examples = profile_dir.join("examples");
    let bench = examples.join(format!("sidecar_bench{}", std::env::consts::EXE_SUFFIX));
    let server = examples.join(format!("example_server{}", std::env::consts::EXE_SUFFIX));

    let started = Instant::now();
    let output = Command::new(&bench)
        .arg("--smoke")
        .arg("--lifeguard")
        .arg(&lifeguard)
        .arg("--example-server")
        .arg(&server)
        .output()
        .expect("running the benchmark");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "smoke run failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    for section in [
        "greet via sidecar",
        "tasks/get via sidecar",
        "task creation via sidecar",
        "ratio via sidecar / direct",
        "listen: ",
        "added by the sidecar",
        "targets",
        "no failed requests",
    ] {
        assert!(
            stdout.contains(section),
            "report lacks `{section}`:\n{stdout}"
        );
    }
    let results = profile_dir
        .parent()
        .expect("target directory")
        .join("bench/results-smoke.json");
    let json: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&results).unwrap_or_else(|e| panic!("{}: {e}", results.display())),
    )
    .expect("results are JSON");
    assert_eq!(json["passed"], true);
    assert_eq!(json["targets"].as_array().map(Vec::len), Some(8));
    // The listen phase ran both lanes and every delivery arrived.
    for lane in ["direct", "via_sidecar"] {
        let l = &json["listen"][lane];
        assert!(l["expected"].as_u64().unwrap_or(0) > 0, "{lane}: {l}");
        assert_eq!(l["delivered"], l["expected"], "{lane}: {l}");
    }
    // Not a timing assertion: a smoke run that takes minutes is a broken smoke run.
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "the smoke run took {:?}",
        started.elapsed()
    );
}
