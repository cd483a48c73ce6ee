//! Performance benchmark of the Lifeguard sidecar: the bundled example MCP server measured
//! directly and through the sidecar (JWT validation on every request, SQLite ledger on disk),
//! side by side in one run. Reports, never asserts, the targets; exits non-zero only when
//! requests failed (1) or the processes could not be set up (2).
//!
//! Full run: `scripts/bench.sh` (release build). CI: `sidecar_bench --smoke` (seconds).
//! Methodology and results: docs/performance.md.

/// The allocator of the `lifeguard` binary, so the in-process hot path runs the sidecar's code
/// as the binary does (with glibc malloc, the audit writer freeing the workers' events waited
/// on the allocator's arena lock: a context switch per few polls that production never sees).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod bare_hop;
#[path = "../bench_support/mod.rs"]
mod bench_support;
mod client;
mod components;
mod dpop;
mod dpop_report;
mod exhaustion;
mod hot_path;
mod in_process;
mod listen;
mod phases;
mod procs;
mod rate_limit_report;
mod rate_limits;
mod report;
mod run;
mod soak;
mod stats;
mod trace_export;
mod trace_report;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::Parser;

use bench_support::cli::{self, Dirs};
use report::Machine;
use run::{Binaries, Plan};

/// Lifeguard sidecar benchmark: direct vs. through the sidecar, side by side.
#[derive(Debug, Parser)]
#[command(name = "sidecar_bench")]
struct Args {
    /// Run every phase tiny (seconds, for CI); exits non-zero only on errors.
    #[arg(long)]
    smoke: bool,
    /// The lifeguard binary [default: target/<profile>/lifeguard next to this program].
    #[arg(long)]
    lifeguard: Option<PathBuf>,
    /// The example server [default: target/<profile>/examples/example_server].
    #[arg(long)]
    example_server: Option<PathBuf>,
    /// Directory for the ledger, policy and logs; must be on disk [default: target/bench-tmp].
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Results file [default: target/bench/results.json, or results-smoke.json].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Sequential requests per lane in each latency phase.
    #[arg(long)]
    latency_samples: Option<usize>,
    /// Task creations per lane.
    #[arg(long)]
    create_samples: Option<usize>,
    /// Seconds of closed-loop load per endpoint.
    #[arg(long)]
    throughput_secs: Option<f64>,
    /// Concurrent connections of the throughput phase.
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Ledger rows to reach before measuring memory.
    #[arg(long)]
    rows: Option<u64>,
    /// Concurrent listen streams of the listen phase.
    #[arg(long)]
    listen_streams: Option<usize>,
    /// Events delivered per second over all listen streams.
    #[arg(long)]
    listen_deliveries: Option<u32>,
    /// Seconds of measured event emission per listen lane.
    #[arg(long)]
    listen_secs: Option<f64>,
    /// Extra environment for the sidecar process, KEY=VALUE (repeatable), for experiments
    /// such as TOKIO_WORKER_THREADS=1. Recorded in the results.
    #[arg(long = "sidecar-env", value_name = "KEY=VALUE")]
    sidecar_env: Vec<String>,
    /// How the sidecar reaches the example server (which speaks HTTP/1.1 and HTTP/2
    /// cleartext): the sidecar's `--upstream-http2`, passed as $LIFEGUARD_UPSTREAM_HTTP2 so
    /// that builds older than the flag ignore it. Recorded in the results.
    #[arg(long, value_name = "never|listen|always", default_value = "listen")]
    upstream_http2: String,
    /// Keep the work directory (ledger, audit trail, logs) after the run.
    #[arg(long)]
    keep: bool,
    /// Seconds measured per lane of the in-process hot path (per worker count).
    #[arg(long)]
    hot_path_secs: Option<f64>,
    /// Instead of the run: only the in-process hot path (results: target/bench/hot-path.json,
    /// hot-path-smoke.json with --smoke, or --out), e.g. to profile it or to compare worker
    /// counts quickly.
    #[arg(long, conflicts_with = "soak")]
    hot_path_only: bool,
    /// results.json of an earlier run (e.g. `--lifeguard` of an older build): the targets
    /// that are reductions compare with it.
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// Instead of the run: hold the sidecar at --soak-fraction of its measured maximum
    /// throughput for --soak-secs, reading its RSS every second (results: target/bench/soak.json).
    #[arg(long)]
    soak: bool,
    /// Seconds of the soak.
    #[arg(long, default_value_t = 600.0)]
    soak_secs: f64,
    /// Fraction of the measured maximum throughput the soak holds.
    #[arg(long, default_value_t = 0.8)]
    soak_fraction: f64,
    /// Instead of the run: what exporting traces costs (issue 32). Sidecars with export off
    /// and with export on (OTLP, gRPC or --tracing-protocol, to a receiver in this process,
    /// every trace sampled) take `greet` and `tasks/get`, paced (--tracing-rate) and in a
    /// closed loop (--connections), in interleaved rounds; reports each one's CPU per call and
    /// the spans received (results: target/bench/tracing.json, tracing-smoke.json with --smoke,
    /// or --out).
    #[arg(long, conflicts_with_all = ["soak", "hot_path_only"])]
    tracing: bool,
    /// Seconds measured per sidecar and method of --tracing.
    #[arg(long, requires = "tracing")]
    tracing_secs: Option<f64>,
    /// How --tracing's exporting sidecar sends its spans to the bench's receiver: grpc or
    /// http/protobuf (the protocol's default).
    #[arg(long, requires = "tracing", default_value = "grpc", value_parser = bench_support::otlp::parse_protocol)]
    tracing_protocol: lifeguard::telemetry::otel_config::OtlpProtocol,
    /// Calls per second of --tracing's paced load (8 connections).
    #[arg(long, requires = "tracing")]
    tracing_rate: Option<f64>,
    /// A lifeguard binary built before tracing existed, measured by --tracing as a third
    /// sidecar with export off: does export off cost anything?
    #[arg(long, value_name = "FILE", requires = "tracing")]
    tracing_before: Option<PathBuf>,
    /// Instead of the run: what request-rate limits do (issue 33). A quiet principal alone
    /// and beside one flooding at ten times its limit; the CPU of an allowed and a refused
    /// call; three replicas on PostgreSQL (--postgres) holding one limit together (results:
    /// target/bench/rate-limits.json, rate-limits-smoke.json with --smoke, or --out).
    #[arg(long, conflicts_with_all = ["soak", "hot_path_only", "tracing"])]
    rate_limits: bool,
    /// Instead of the run: the CPU a DPoP-verified call adds (issue 34). One sidecar takes
    /// `greet` with a bearer token and with a DPoP-bound token and a fresh proof per call,
    /// paced (--dpop-rate) and in a closed loop (--connections), in interleaved rounds, every
    /// request built before its round; and `verify_proof` is timed in process (results:
    /// target/bench/dpop.json, dpop-ps256.json or dpop-eddsa.json by --dpop-alg, -smoke before
    /// .json with --smoke, or --out).
    #[arg(long, conflicts_with_all = ["soak", "hot_path_only", "tracing", "rate_limits"])]
    dpop: bool,
    /// Instead of the run: the sidecar against a bare proxy hop (issue 35). `greet` directly,
    /// through nginx (nginx-light, installed with apt-get when missing and run as root),
    /// through a minimal hyper proxy (examples/bare_proxy) and through the sidecar, and a
    /// forwarded `tasks/get` through the sidecar, in interleaved closed-loop rounds on
    /// --connections connections; CPU per request of each proxy and every ratio (results:
    /// target/bench/bare-hop.json, bare-hop-smoke.json with --smoke, or --out).
    #[arg(long, conflicts_with_all = ["soak", "hot_path_only", "tracing", "rate_limits", "dpop"])]
    bare_hop: bool,
    /// The minimal hyper proxy of --bare-hop [default: target/<profile>/examples/bare_proxy].
    #[arg(long, requires = "bare_hop")]
    bare_proxy: Option<PathBuf>,
    /// Seconds of paced load measured per variant of --dpop.
    #[arg(long, requires = "dpop")]
    dpop_secs: Option<f64>,
    /// Calls per second of --dpop's paced load (8 connections).
    #[arg(long, requires = "dpop")]
    dpop_rate: Option<f64>,
    /// The algorithm of --dpop's proofs: ES256 (the default), EdDSA or PS256.
    #[arg(long, requires = "dpop", value_parser = parse_dpop_alg)]
    dpop_alg: Option<lifeguard::api::JwsAlgorithm>,
    /// PostgreSQL server where --rate-limits creates (and drops) a database of its own.
    #[arg(
        long,
        env = "LIFEGUARD_BENCH_POSTGRES",
        default_value = bench_support::postgres::DEFAULT_SERVER
    )]
    postgres: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    cli::main(
        tokio::runtime::Builder::new_current_thread(),
        "request(s) failed",
        run(args),
    )
}

/// The soak mode: one result file, exit status 1 when a request failed.
async fn soak(args: &Args, repo: &Path, work: &Path, bins: &Binaries, dirs: &Dirs) -> Result<u64> {
    if !(args.soak_fraction > 0.0 && args.soak_fraction <= 1.0) || args.soak_secs <= 0.0 {
        bail!("--soak-fraction must be in (0, 1] and --soak-secs positive");
    }
    let duration = std::time::Duration::from_secs_f64(args.soak_secs);
    let plan = soak::SoakPlan {
        duration,
        fraction: args.soak_fraction,
        probe: std::time::Duration::from_secs_f64(if args.smoke { 1.0 } else { 10.0 }),
        warmup: (duration / 5).min(std::time::Duration::from_secs(60)),
    };
    let result = soak::run(&plan, repo, work, bins).await?;
    print!("{}", result.table());
    // target/bench/soak.json, also for a smoke run
    let out = dirs.results(args.out.clone(), "soak", false);
    cli::write_results(&out, &result.to_json())?;
    if !args.keep && result.errors.count == 0 {
        let _ = std::fs::remove_dir_all(work);
    }
    Ok(result.errors.count)
}

/// The tracing-export mode: one result file, exit status 1 when a request failed.
async fn tracing(
    args: &Args,
    machine: Machine,
    repo: &Path,
    work: &Path,
    bins: &Binaries,
    dirs: &Dirs,
) -> Result<u64> {
    let plan = trace_export::TracePlan::new(args);
    if let Some(before) = &plan.before
        && !before.is_file()
    {
        bail!("--tracing-before {}: no such file", before.display());
    }
    let mode = if args.smoke { "smoke" } else { "full" };
    let result = trace_export::run(plan, mode, machine, repo, work, bins).await;
    let result = cli::logs_kept(result, work)?;
    let out = dirs.results(args.out.clone(), "tracing", args.smoke);
    cli::publish(
        &result.table(),
        &result.to_json(),
        &out,
        work,
        args.keep,
        result.errors.count,
    )
}

/// The rate-limit mode: one result file, exit status 1 when a request failed.
async fn rate_limits(
    args: &Args,
    machine: Machine,
    repo: &Path,
    work: &Path,
    bins: &Binaries,
    dirs: &Dirs,
) -> Result<u64> {
    let plan = rate_limits::RatePlan::new(args.smoke, args.postgres.clone());
    let mode = if args.smoke { "smoke" } else { "full" };
    let result = rate_limits::run(plan, mode, machine, repo, work, bins).await;
    let result = cli::logs_kept(result, work)?;
    let out = dirs.results(args.out.clone(), "rate-limits", args.smoke);
    cli::publish(
        &result.table(),
        &result.to_json(),
        &out,
        work,
        args.keep,
        result.errors.count,
    )
}

/// The bare-hop mode: one result file, exit status 1 when a request failed.
async fn bare_hop(
    args: &Args,
    machine: Machine,
    repo: &Path,
    work: &Path,
    bins: &Binaries,
    dirs: &Dirs,
    bare_proxy: &Path,
) -> Result<u64> {
    let plan = bare_hop::BareHopPlan::new(args);
    let mode = if args.smoke { "smoke" } else { "full" };
    let result = bare_hop::run(plan, mode, machine, repo, work, bins, bare_proxy).await;
    let result = cli::logs_kept(result, work)?;
    let out = dirs.results(args.out.clone(), "bare-hop", args.smoke);
    cli::publish(
        &result.table(),
        &result.to_json(),
        &out,
        work,
        args.keep,
        result.errors.count,
    )
}

/// The DPoP mode: one result file, exit status 1 when a request failed.
async fn dpop(
    args: &Args,
    machine: Machine,
    repo: &Path,
    work: &Path,
    bins: &Binaries,
    dirs: &Dirs,
) -> Result<u64> {
    let plan = dpop::DpopPlan::new(args);
    if !(plan.rate > 0.0 && plan.measured.as_secs_f64() > 0.0) {
        bail!("--dpop-rate and --dpop-secs must be positive");
    }
    // dpop.json for ES256 proofs, dpop-ps256.json and dpop-eddsa.json for the others.
    let stem = match plan.alg {
        lifeguard::api::JwsAlgorithm::ES256 => "dpop".to_owned(),
        other => format!("dpop-{}", other.as_str().to_lowercase()),
    };
    let mode = if args.smoke { "smoke" } else { "full" };
    let result = dpop::run(plan, mode, machine, repo, work, bins).await;
    let result = cli::logs_kept(result, work)?;
    let out = dirs.results(args.out.clone(), &stem, args.smoke);
    cli::publish(
        &result.table(),
        &result.to_json(),
        &out,
        work,
        args.keep,
        result.errors.count,
    )
}

/// The hot-path mode: the lanes, their two targets and a result file.
fn hot_path_only(plan: &Plan, repo: &Path, work: &Path, out: &Path) -> Result<u64> {
    let lanes = hot_path::measure(
        repo,
        work,
        &hot_path::WORKER_COUNTS,
        plan.hot_path.as_secs_f64(),
    )?;
    let targets = report::hot_path_targets(&lanes);
    print!("{}", report::hot_path_table(&lanes));
    for t in &targets {
        println!("{}", t.line());
    }
    let json = serde_json::json!({
        "lanes": lanes.iter().map(hot_path::HotLane::to_json).collect::<Vec<_>>(),
        "targets": targets.iter().map(report::Target::to_json).collect::<Vec<_>>(),
    });
    cli::write_results(out, &json)?;
    let _ = std::fs::remove_dir_all(work);
    Ok(lanes.iter().map(|l| l.errors).sum())
}

/// The binaries under test: `given`, else `default`.
/// `--dpop-alg`: one of the algorithms the bench can make DPoP keys for.
fn parse_dpop_alg(name: &str) -> Result<lifeguard::api::JwsAlgorithm, String> {
    use lifeguard::api::JwsAlgorithm::{ES256, EdDSA, PS256};
    [ES256, EdDSA, PS256]
        .into_iter()
        .find(|alg| alg.as_str() == name)
        .ok_or_else(|| format!("`{name}` is not one of ES256, EdDSA, PS256"))
}

fn binary(given: Option<PathBuf>, default: PathBuf) -> Result<PathBuf> {
    cli::binary(
        given,
        default,
        "cargo build --release --bin lifeguard --example example_server",
    )
}

async fn run(args: Args) -> Result<u64> {
    let plan = Plan::new(&args);
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dirs = Dirs::locate()?;
    let lifeguard = binary(args.lifeguard.clone(), dirs.profile.join("lifeguard"))?;
    let example = binary(
        args.example_server.clone(),
        dirs.profile.join("examples/example_server"),
    )?;
    let mode = match (
        args.bare_hop,
        args.soak,
        args.tracing,
        args.rate_limits,
        args.dpop,
        args.smoke,
    ) {
        (true, _, _, _, _, true) => "bare-hop-smoke",
        (true, _, _, _, _, false) => "bare-hop",
        (_, true, _, _, _, true) => "soak-smoke",
        (_, true, _, _, _, false) => "soak",
        (_, _, true, _, _, true) => "tracing-smoke",
        (_, _, true, _, _, false) => "tracing",
        (_, _, _, true, _, true) => "rate-limits-smoke",
        (_, _, _, true, _, false) => "rate-limits",
        (_, _, _, _, true, true) => "dpop-smoke",
        (_, _, _, _, true, false) => "dpop",
        (false, false, false, false, false, true) => "smoke",
        (false, false, false, false, false, false) => "full",
    };
    let work = dirs.work(
        args.work_dir.clone(),
        &format!("{mode}-{}", std::process::id()),
    )?;
    let out = dirs.results(args.out.clone(), "results", args.smoke);

    let machine = Machine::probe(&work, &repo);
    if machine.ledger.in_memory() {
        eprintln!(
            "warning: {} is on {}: the ledger is not on disk",
            work.display(),
            machine.ledger.fs
        );
    }
    eprintln!("sidecar_bench: {mode} run; work dir {}", work.display());
    let mut sidecar_env = Vec::new();
    for pair in &args.sidecar_env {
        let (k, v) = pair
            .split_once('=')
            .with_context(|| format!("--sidecar-env takes KEY=VALUE, got {pair}"))?;
        sidecar_env.push((k.to_owned(), v.to_owned()));
    }
    if !sidecar_env
        .iter()
        .any(|(k, _)| k == "LIFEGUARD_UPSTREAM_HTTP2")
    {
        sidecar_env.push((
            "LIFEGUARD_UPSTREAM_HTTP2".to_owned(),
            args.upstream_http2.clone(),
        ));
    }
    let bins = Binaries {
        lifeguard,
        example,
        sidecar_env,
    };
    if args.bare_hop {
        let bare_proxy = cli::binary(
            args.bare_proxy.clone(),
            dirs.profile.join("examples/bare_proxy"),
            "cargo build --release --example bare_proxy",
        )?;
        return bare_hop(&args, machine, &repo, &work, &bins, &dirs, &bare_proxy).await;
    }
    if args.soak {
        return soak(&args, &repo, &work, &bins, &dirs).await;
    }
    if args.tracing {
        return tracing(&args, machine, &repo, &work, &bins, &dirs).await;
    }
    if args.rate_limits {
        return rate_limits(&args, machine, &repo, &work, &bins, &dirs).await;
    }
    if args.dpop {
        return dpop(&args, machine, &repo, &work, &bins, &dirs).await;
    }
    if args.hot_path_only {
        let out = dirs.results(args.out.clone(), "hot-path", args.smoke);
        return hot_path_only(&plan, &repo, &work, &out);
    }
    let results = run::measure(&plan, mode, machine, &repo, &work, &bins).await;
    let results = cli::logs_kept(results, &work)?;
    cli::publish(
        &results.table(),
        &results.to_json(),
        &out,
        &work,
        args.keep,
        results.errors.count,
    )
}
