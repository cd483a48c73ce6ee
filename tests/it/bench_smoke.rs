//! The performance benchmarks (`examples/sidecar_bench`, `examples/operator_bench`, `examples/scale_out_bench`,
//! `examples/admission_bench`, docs/performance.md) in smoke mode: every phase runs, tiny, against the binaries of this
//! build profile. They fail only when a request fails or a process does not start — never on
//! timing, which is the full run's job.

use crate::support;

use std::process::Command;
use std::time::Duration;

use support::process::{example_binary, profile_dir, run_to_completion};

/// When a smoke run counts as hung: a guard so a hang fails with the output so far instead of
/// blocking the suite, far above any plausible run time on a slow machine (not a performance
/// check).
const HANG_GUARD: Duration = Duration::from_secs(15 * 60);

#[test]
fn benchmark_smoke_run_has_no_errors() {
    let bench = example_binary("sidecar_bench");
    let server = example_binary("example_server");
    let mut command = Command::new(&bench);
    command
        .arg("--smoke")
        .arg("--lifeguard")
        .arg(env!("CARGO_BIN_EXE_lifeguard"))
        .arg("--example-server")
        .arg(&server);
    let output = run_to_completion(command, "the benchmark smoke run", HANG_GUARD);
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
        "exhaustion: ",
        "added (via sidecar     )",
        "added (via sidecar, h2 )",
        "targets",
        "no failed requests",
    ] {
        assert!(
            stdout.contains(section),
            "report lacks `{section}`:\n{stdout}"
        );
    }
    let results = profile_dir()
        .parent()
        .expect("target directory")
        .join("bench/results-smoke.json");
    let json: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&results).unwrap_or_else(|e| panic!("{}: {e}", results.display())),
    )
    .expect("results are JSON");
    assert_eq!(json["passed"], true);
    assert_eq!(json["targets"].as_array().map(Vec::len), Some(14));
    // The in-process hot path ran both methods at 1 and 2 workers, without failures.
    let lanes = json["hot_path"].as_array().expect("hot-path lanes");
    for method in ["greet", "tasks/get"] {
        for workers in [1, 2] {
            let lane = lanes
                .iter()
                .find(|l| l["method"] == method && l["workers"] == workers)
                .unwrap_or_else(|| panic!("no hot-path lane {method} at {workers}: {lanes:?}"));
            assert!(lane["requests"].as_u64().unwrap_or(0) > 0, "{lane}");
            assert_eq!(lane["errors"], 0, "{lane}");
        }
    }
    // Without --baseline the reduction target says why it does not apply.
    let reduction = json["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| {
            t["target"]
                .as_str()
                .is_some_and(|n| n.contains("reduction vs --baseline"))
        })
        .expect("the tasks/get CPU reduction target");
    assert_eq!(reduction["verdict"], "N/A", "{reduction}");
    // The exhaustion phase's attack was refused and the sidecar served again afterwards.
    let exhaustion = &json["exhaustion"];
    assert_eq!(exhaustion["recovered"], true, "{exhaustion}");
    assert_eq!(exhaustion["half_sent_held"], 0, "{exhaustion}");
    assert_eq!(exhaustion["greet_failures"], 0, "{exhaustion}");
    // The listen phase ran every lane (HTTP/2 on a sidecar of its own) and every delivery
    // arrived.
    for lane in ["direct", "via_sidecar", "via_sidecar_http2"] {
        let l = &json["listen"][lane];
        assert!(l["expected"].as_u64().unwrap_or(0) > 0, "{lane}: {l}");
        assert_eq!(l["delivered"], l["expected"], "{lane}: {l}");
    }
    hot_path_only_smoke_run_reports_every_lane();
}

/// `--soak`, tiny: the paced load, the task poller and the listen stream run without a failed
/// request, and the RSS series is written.
#[test]
fn benchmark_soak_smoke_run_has_no_errors() {
    let out = profile_dir()
        .parent()
        .expect("target directory")
        .join("bench/soak-smoke.json");
    let mut command = Command::new(example_binary("sidecar_bench"));
    command
        .args(["--soak", "--smoke", "--soak-secs", "3"])
        .arg("--lifeguard")
        .arg(env!("CARGO_BIN_EXE_lifeguard"))
        .arg("--example-server")
        .arg(example_binary("example_server"))
        .arg("--out")
        .arg(&out);
    let output = run_to_completion(command, "the soak smoke run", HANG_GUARD);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "soak smoke run failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("soak: "), "{stdout}");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out).expect("soak results")).expect("JSON");
    assert_eq!(json["errors"]["count"], 0, "{json}");
    assert!(json["requests"].as_u64().unwrap_or(0) > 0, "{json}");
    assert!(json["polls"].as_u64().unwrap_or(0) > 0, "{json}");
    assert!(
        json["rss_kib"].as_array().is_some_and(|s| s.len() >= 2),
        "{json}"
    );
}

/// `--hot-path-only`, tiny: both methods and the machine reference at 1 and 2 workers, twice,
/// without a failed request, with the switches attributed to threads and both targets reported.
/// Called after the full smoke run, not as a test of its own: the hot path takes every core on
/// purpose, and the other benchmarks' tests run in parallel with their own startup deadlines.
fn hot_path_only_smoke_run_reports_every_lane() {
    let out = profile_dir()
        .parent()
        .expect("target directory")
        .join("bench/hot-path-smoke.json");
    let mut command = Command::new(example_binary("sidecar_bench"));
    command
        .args(["--hot-path-only", "--smoke", "--out"])
        .arg(&out);
    let output = run_to_completion(command, "the hot-path smoke run", HANG_GUARD);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "hot-path smoke run failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("machine reference: "), "{stdout}");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out).expect("hot-path results")).expect("JSON");
    let lanes = json["lanes"].as_array().expect("lanes");
    for method in ["greet", "tasks/get", "reference"] {
        for workers in [1, 2] {
            let matching: Vec<_> = lanes
                .iter()
                .filter(|l| l["method"] == method && l["workers"] == workers)
                .collect();
            assert_eq!(matching.len(), 2, "{method} at {workers}: {lanes:?}");
            for lane in matching {
                assert!(lane["requests"].as_u64().unwrap_or(0) > 0, "{lane}");
                assert_eq!(lane["errors"], 0, "{lane}");
                assert!(lane["switches_by_thread"].is_array(), "{lane}");
            }
        }
    }
    let targets = json["targets"].as_array().expect("targets");
    assert_eq!(targets.len(), 2, "{targets:?}");
    for target in targets {
        let verdict = target["verdict"].as_str().unwrap_or_default();
        assert!(verdict == "PASS" || verdict == "MISS", "{target}");
    }
}

/// `--tracing`, tiny: sidecars with trace export off and on take both methods under both load
/// shapes without a failed request; each reports its CPU per call, and the spans reach the
/// benchmark's OTLP receiver. Asserts outcomes, never the
/// CPU figures: a smoke run is too short for them to mean anything.
#[test]
fn benchmark_tracing_smoke_run_reports_cpu_and_spans() {
    let out = profile_dir()
        .parent()
        .expect("target directory")
        .join("bench/tracing-smoke.json");
    let mut command = Command::new(example_binary("sidecar_bench"));
    command
        .args(["--tracing", "--smoke"])
        .arg("--lifeguard")
        .arg(env!("CARGO_BIN_EXE_lifeguard"))
        .arg("--example-server")
        .arg(example_binary("example_server"))
        .arg("--out")
        .arg(&out);
    let output = run_to_completion(command, "the tracing smoke run", HANG_GUARD);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "tracing smoke run failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    for section in [
        "paced, ",
        "closed loop, ",
        "export on vs export off",
        "server spans received",
        "no failed requests",
    ] {
        assert!(
            stdout.contains(section),
            "report lacks `{section}`:\n{stdout}"
        );
    }
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out).expect("tracing results")).expect("JSON");
    assert_eq!(json["passed"], true, "{json}");
    let lanes = json["lanes"].as_array().expect("lanes");
    for shape in ["paced", "closed loop"] {
        for method in ["greet", "tasks/get"] {
            for sidecar in ["export off", "export on"] {
                let lane = lanes
                    .iter()
                    .find(|l| {
                        l["shape"].as_str().is_some_and(|s| s.starts_with(shape))
                            && l["method"] == method
                            && l["sidecar"] == sidecar
                    })
                    .unwrap_or_else(|| panic!("no lane {shape} {method} {sidecar}: {lanes:?}"));
                assert!(lane["calls"].as_u64().unwrap_or(0) > 0, "{lane}");
                assert!(lane["cpu_us_per_call"].is_f64(), "{lane}");
            }
        }
    }
    let added = json["added_by_export"].as_array().expect("added by export");
    assert_eq!(added.len(), 4, "{added:?}");
    let spans = &json["spans"];
    assert!(spans["total"].as_u64().unwrap_or(0) > 0, "{spans}");
    for lane in spans["per_lane"].as_array().expect("spans per lane") {
        let calls = lane["calls"].as_u64().unwrap_or(0);
        assert!(calls > 0, "{lane}");
        // Each call's server span, unless the exporter dropped some (a full queue on a busy
        // machine: the report then says so); never more than one per call.
        let server_spans = lane["server_spans"].as_u64().unwrap_or(0);
        assert!(server_spans > 0 && server_spans <= calls, "{lane}");
    }
    let targets = json["targets"].as_array().expect("targets");
    assert_eq!(targets.len(), 4, "{targets:?}");
    for target in targets {
        assert_eq!(
            target["verdict"], "N/A",
            "smoke runs make no claim: {target}"
        );
    }
}

/// `--rate-limits`, tiny: a quiet principal beside a flooding one, the CPU of allowed and
/// refused calls, and three replicas on PostgreSQL (scripts/test.sh starts it) sharing one
/// bucket. What the limits decide is checked (the quiet principal is never refused, the flood
/// and the replicas admit no more than the buckets allow, no charge falls back to memory);
/// latency, throughput and CPU are the full run's, N/A here.
#[test]
fn benchmark_rate_limits_smoke_run_enforces_and_reports() {
    let out = profile_dir()
        .parent()
        .expect("target directory")
        .join("bench/rate-limits-smoke.json");
    let mut command = Command::new(example_binary("sidecar_bench"));
    command
        .args(["--rate-limits", "--smoke"])
        .arg("--lifeguard")
        .arg(env!("CARGO_BIN_EXE_lifeguard"))
        .arg("--example-server")
        .arg(example_binary("example_server"))
        .arg("--postgres")
        .arg(support::postgres::server_url())
        .arg("--out")
        .arg(&out);
    let output = run_to_completion(command, "the rate-limit smoke run", HANG_GUARD);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "rate-limit smoke run failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out).expect("rate-limit results")).expect("JSON");
    assert_eq!(json["passed"], true, "{json}");
    let isolation = &json["isolation"];
    assert_eq!(isolation["quiet_beside_flood"]["refused"], 0, "{isolation}");
    assert!(
        isolation["quiet_beside_flood"]["ok"].as_u64() > Some(0),
        "{isolation}"
    );
    assert!(
        isolation["flood"]["refused"].as_u64() > Some(0),
        "{isolation}"
    );
    let cpu = json["cpu"].as_array().expect("cpu lanes");
    let lane = |name: &str| {
        cpu.iter()
            .find(|l| l["sidecar"] == name)
            .unwrap_or_else(|| panic!("no CPU lane `{name}`: {cpu:?}"))
    };
    assert_eq!(lane("limit never reached")["refused"], 0);
    assert!(lane("limit exceeded")["refused"].as_u64() > Some(0));
    assert!(lane("limit exceeded")["allowed"].as_u64() <= Some(1));
    let rounds = json["shared"]["rounds"].as_array().expect("shared rounds");
    assert!(!rounds.is_empty());
    for round in rounds {
        assert!(round["refused"].as_u64() > Some(0), "{round}");
    }
    for target in json["targets"].as_array().expect("targets") {
        let name = target["target"].as_str().unwrap_or_default();
        let verdict = target["verdict"].as_str().unwrap_or_default();
        // What a limit decides is an outcome, checked even in a smoke run; what it costs in
        // time is not.
        let outcome = name.contains("refused or failed")
            || name.starts_with("flood: admitted")
            || name.contains("× (T + 0.25 s)")
            || name.contains("fell back");
        if outcome {
            assert_eq!(verdict, "PASS", "{target}");
        } else {
            assert_eq!(verdict, "N/A", "smoke runs make no claim on cost: {target}");
        }
    }
}

/// `--dpop`, tiny: one sidecar takes `greet` with a bearer token and with a DPoP-bound token
/// and a fresh proof per call, paced and in a closed loop, and every call succeeds (a proof the
/// sidecar refused would fail the run); proof verification is timed in process. Asserts
/// outcomes, never the CPU figures: a smoke run is too short for them to mean anything.
#[test]
fn benchmark_dpop_smoke_run_verifies_every_proof() {
    let out = profile_dir()
        .parent()
        .expect("target directory")
        .join("bench/dpop-smoke.json");
    let mut command = Command::new(example_binary("sidecar_bench"));
    command
        .args(["--dpop", "--smoke"])
        .arg("--lifeguard")
        .arg(env!("CARGO_BIN_EXE_lifeguard"))
        .arg("--example-server")
        .arg(example_binary("example_server"))
        .arg("--out")
        .arg(&out);
    let output = run_to_completion(command, "the DPoP smoke run", HANG_GUARD);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "DPoP smoke run failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    for section in [
        "paced, ",
        "closed loop, ",
        "DPoP vs bearer",
        "verify_proof",
        "no failed requests",
    ] {
        assert!(
            stdout.contains(section),
            "report lacks `{section}`:\n{stdout}"
        );
    }
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out).expect("DPoP results")).expect("JSON");
    assert_eq!(json["passed"], true, "{json}");
    let lanes = json["lanes"].as_array().expect("lanes");
    for shape in ["paced", "closed loop"] {
        for variant in ["bearer", "DPoP"] {
            let lane = lanes
                .iter()
                .find(|l| {
                    l["shape"].as_str().is_some_and(|s| s.starts_with(shape))
                        && l["variant"] == variant
                })
                .unwrap_or_else(|| panic!("no lane {shape} {variant}: {lanes:?}"));
            assert!(lane["calls"].as_u64().unwrap_or(0) > 0, "{lane}");
            assert_eq!(lane["failed"], 0, "{lane}");
            assert!(lane["cpu_us_per_call"].is_f64(), "{lane}");
        }
    }
    let added = json["added_by_dpop"].as_array().expect("added by DPoP");
    assert_eq!(added.len(), 2, "{added:?}");
    let verify = &json["in_process"]["verify_proof"];
    assert!(verify["wall_us_per_call"].as_f64() > Some(0.0), "{verify}");
    let targets = json["targets"].as_array().expect("targets");
    assert_eq!(targets.len(), 1, "{targets:?}");
    assert_eq!(
        targets[0]["verdict"], "N/A",
        "smoke runs make no claim: {}",
        targets[0]
    );
}

/// `--dpop --dpop-alg PS256`, tiny: the same lane with RSA keys and PS256 proofs, every proof
/// verified (the default algorithm list accepts PS256).
#[test]
fn benchmark_dpop_smoke_run_with_ps256_proofs_verifies_every_proof() {
    let out = profile_dir()
        .parent()
        .expect("target directory")
        .join("bench/dpop-ps256-smoke.json");
    let mut command = Command::new(example_binary("sidecar_bench"));
    command
        .args(["--dpop", "--smoke", "--dpop-alg", "PS256"])
        .arg("--lifeguard")
        .arg(env!("CARGO_BIN_EXE_lifeguard"))
        .arg("--example-server")
        .arg(example_binary("example_server"))
        .arg("--out")
        .arg(&out);
    let output = run_to_completion(command, "the PS256 DPoP smoke run", HANG_GUARD);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "PS256 DPoP smoke run failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("fresh PS256 proofs"), "{stdout}");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out).expect("DPoP results")).expect("JSON");
    assert_eq!(json["passed"], true, "{json}");
    assert_eq!(json["plan"]["proof_algorithm"], "PS256", "{json}");
    let lanes = json["lanes"].as_array().expect("lanes");
    let dpop_calls: u64 = lanes
        .iter()
        .filter(|l| l["variant"] == "DPoP")
        .map(|l| l["calls"].as_u64().unwrap_or(0))
        .sum();
    assert!(dpop_calls > 0, "{lanes:?}");
    assert!(lanes.iter().all(|l| l["failed"] == 0), "{lanes:?}");
}

/// The operator benchmark: 20 light sidecars, 20 policies, 3 runs of each measurement, against
/// the API emulator (it needs the Python venv of scripts/test.sh, like the other operator
/// tests).
#[test]
fn operator_benchmark_smoke_run_has_no_errors() {
    let bench = example_binary("operator_bench");
    let mut command = Command::new(&bench);
    command
        .arg("--smoke")
        .arg("--lifeguard")
        .arg(env!("CARGO_BIN_EXE_lifeguard"));
    let output = run_to_completion(command, "the operator benchmark smoke run", HANG_GUARD);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "operator smoke run failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    for section in [
        "PrincipalRevocation created → last ack",
        "SET received (push) → last ack",
        "policy spec change → last ack",
        "operator work per cycle",
        "operator at rest",
        "token reviews during the runs",
        "noise:",
        "anchors",
        "targets",
        "no errors",
    ] {
        assert!(
            stdout.contains(section),
            "report lacks `{section}`:\n{stdout}"
        );
    }
    let results = profile_dir()
        .parent()
        .expect("target directory")
        .join("bench/operator-results-smoke.json");
    let json: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&results).unwrap_or_else(|e| panic!("{}: {e}", results.display())),
    )
    .expect("results are JSON");
    assert_eq!(json["passed"], true, "{json}");
    assert_eq!(json["targets"].as_array().map(Vec::len), Some(6));
    // Every acknowledgement of the runs rode on its stream's review: none was a TokenReview.
    let reviews = &json["token_reviews"];
    assert!(
        reviews["acks_by_stream_token"].as_f64() > Some(0.0),
        "{reviews}"
    );
    assert_eq!(reviews["acks_by_review"].as_f64(), Some(0.0), "{reviews}");
    // So did the acknowledgements of the revocation after the (here one-second) quiet spell.
    let quiet = &json["after_quiet"];
    assert!(
        quiet["acks_by_stream_token"].as_f64() > Some(0.0),
        "{quiet}"
    );
    assert_eq!(quiet["acks_by_review"].as_f64(), Some(0.0), "{quiet}");
    assert_eq!(quiet["token_reviews_answered"], 0, "{quiet}");
    for measurement in [
        "revocation_created",
        "security_event_pushed",
        "policy_spec_changed",
    ] {
        let m = &json["measurements"][measurement];
        assert_eq!(m["to_last_ack"]["n"], 3, "{measurement}: {m}");
        for run in m["runs"].as_array().expect("runs") {
            assert!(run["timed_out_with_acknowledged"].is_null(), "{run}");
        }
    }
}

/// The admission benchmark: the webhook against the API emulator (10 policies), 20 requests/s
/// for 3 s after 1 s of warm-up, every answer checked. Asserts that it ran and that every
/// answer was right — never the latencies.
#[test]
fn admission_benchmark_smoke_run_checks_every_answer() {
    let bench = example_binary("admission_bench");
    let mut command = Command::new(&bench);
    command
        .arg("--smoke")
        .arg("--lifeguard")
        .arg(env!("CARGO_BIN_EXE_lifeguard"));
    let output = run_to_completion(command, "the admission benchmark smoke run", HANG_GUARD);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "admission smoke run failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    for section in [
        "pod CREATE, injected",
        "pod CREATE, skipped (NoPolicy)",
        "pod CREATE, skipped (OptedOut)",
        "policy CREATE, overlap (denied)",
        "signed exception CREATE (allowed)",
        "all requests",
        "webhook: VmRSS",
        "noise:",
        "targets",
        "no errors",
    ] {
        assert!(
            stdout.contains(section),
            "report lacks `{section}`:\n{stdout}"
        );
    }
    let results = profile_dir()
        .parent()
        .expect("target directory")
        .join("bench/admission-results-smoke.json");
    let json: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&results).unwrap_or_else(|e| panic!("{}: {e}", results.display())),
    )
    .expect("results are JSON");
    assert_eq!(json["passed"], true, "{json}");
    assert_eq!(json["errors"]["count"], 0, "{json}");
    let sent = json["sent"].as_u64().expect("sent");
    // 20 requests/s for 1 s of warm-up and 3 s measured.
    assert_eq!(sent, 80, "{json}");
    assert_eq!(json["checked"], sent, "every answer was checked: {json}");
    assert_eq!(json["measured"], 60, "{json}");
    for (kind, latency) in json["latency"]["per_kind"].as_object().expect("per kind") {
        assert!(latency["n"].as_u64().unwrap_or(0) > 0, "{kind}: {latency}");
    }
    assert_eq!(json["targets"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        json["targets"][0]["verdict"], "N/A",
        "smoke runs make no claim"
    );
}

#[test]
fn scale_out_benchmark_smoke_run_has_no_errors() {
    let mut command = Command::new(example_binary("scale_out_bench"));
    command
        .arg("--smoke")
        .env("LIFEGUARD_BENCH_POSTGRES", support::postgres::server_url());
    let output = run_to_completion(command, "the scale-out benchmark smoke run", HANG_GUARD);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "smoke run failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    for section in [
        "creation latency",
        "PostgreSQL, other",
        "creation throughput: one replica",
        "poll through a non-home replica added p50",
        "errors: 0",
    ] {
        assert!(
            stdout.contains(section),
            "report lacks `{section}`:\n{stdout}"
        );
    }
    let results = profile_dir()
        .parent()
        .expect("target directory")
        .join("bench/scale-out-smoke.json");
    let json: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&results).unwrap_or_else(|e| panic!("{}: {e}", results.display())),
    )
    .expect("results are JSON");
    assert_eq!(json["errors"], 0);
    assert_eq!(json["targets"].as_array().map(Vec::len), Some(4));
    assert!(json["creation"]["postgres"]["n"].as_u64() > Some(0));
    assert!(json["polls"]["postgres_other"]["n"].as_u64() > Some(0));
}

/// `--bare-hop`, tiny: `greet` directly, through the minimal hyper proxy, through nginx when it
/// is installed (a smoke run never installs it, and says so) and through the sidecar, and a
/// forwarded `tasks/get` through the sidecar, in interleaved rounds; every request succeeds and
/// every lane reports each round. Asserts outcomes, never the CPU figures.
#[test]
fn benchmark_bare_hop_smoke_run_measures_every_lane_in_every_round() {
    let out = profile_dir()
        .parent()
        .expect("target directory")
        .join("bench/bare-hop-smoke.json");
    let mut command = Command::new(example_binary("sidecar_bench"));
    command
        .args(["--bare-hop", "--smoke"])
        .arg("--lifeguard")
        .arg(env!("CARGO_BIN_EXE_lifeguard"))
        .arg("--example-server")
        .arg(example_binary("example_server"))
        .arg("--bare-proxy")
        .arg(example_binary("bare_proxy"))
        .arg("--out")
        .arg(&out);
    let output = run_to_completion(command, "the bare-hop smoke run", HANG_GUARD);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "bare-hop smoke run failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out).expect("bare-hop results")).expect("JSON");
    assert_eq!(json["passed"], true, "{json}");
    let lanes: Vec<String> = json["lanes"]
        .as_array()
        .expect("lanes")
        .iter()
        .map(|l| l["lane"].as_str().unwrap().to_owned())
        .collect();
    let mut expected = vec![
        "greet direct",
        "greet via hyper",
        "greet via sidecar",
        "tasks/get via sidecar",
    ];
    if json["nginx_missing"].is_null() {
        expected.insert(1, "greet via nginx");
    } else {
        assert!(stdout.contains("NO NGINX LANE"), "{stdout}");
    }
    assert_eq!(lanes, expected, "{json}");
    for lane in json["lanes"].as_array().unwrap() {
        let rounds = lane["rounds"].as_array().expect("rounds");
        assert_eq!(
            rounds.len(),
            json["plan"]["rounds"].as_u64().unwrap() as usize,
            "{lane}"
        );
        assert!(
            rounds.iter().all(|r| r["requests"].as_u64() > Some(0)),
            "{lane}"
        );
    }
    assert_eq!(json["targets"].as_array().map(Vec::len), Some(3), "{json}");
}
