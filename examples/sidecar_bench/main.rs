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

mod client;
mod components;
mod exhaustion;
mod hot_path;
mod listen;
mod phases;
mod procs;
mod report;
mod run;
mod soak;
mod stats;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::Parser;

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
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sidecar_bench: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run(args)) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(failed) => {
            eprintln!("sidecar_bench: FAILED, {failed} request(s) failed");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("sidecar_bench: setup failed: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// The soak mode: one result file, exit status 1 when a request failed.
async fn soak(
    args: &Args,
    repo: &Path,
    work: &Path,
    bins: &Binaries,
    target: &Path,
) -> Result<u64> {
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
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| target.join("bench").join("soak.json"));
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(&result.to_json()).context("serializing results")?;
    std::fs::write(&out, text).with_context(|| format!("writing {}", out.display()))?;
    println!("results: {}", out.display());
    if !args.keep && result.errors.count == 0 {
        let _ = std::fs::remove_dir_all(work);
    }
    Ok(result.errors.count)
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
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let json = serde_json::json!({
        "lanes": lanes.iter().map(hot_path::HotLane::to_json).collect::<Vec<_>>(),
        "targets": targets.iter().map(report::Target::to_json).collect::<Vec<_>>(),
    });
    std::fs::write(out, serde_json::to_string_pretty(&json)?)
        .with_context(|| format!("writing {}", out.display()))?;
    println!("results: {}", out.display());
    let _ = std::fs::remove_dir_all(work);
    Ok(lanes.iter().map(|l| l.errors).sum())
}

/// target/ (this program runs from target/<profile>/examples/).
fn target_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating this program")?;
    exe.ancestors()
        .nth(3)
        .map(Path::to_owned)
        .context("this program is not inside target/<profile>/examples/")
}

fn binary(given: Option<PathBuf>, default: PathBuf) -> Result<PathBuf> {
    let path = given.unwrap_or(default);
    if !path.is_file() {
        bail!(
            "{} is missing: build it first (cargo build --release --bin lifeguard --example example_server)",
            path.display()
        );
    }
    Ok(path)
}

async fn run(args: Args) -> Result<u64> {
    let plan = Plan::new(&args);
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let target = target_dir()?;
    let profile_dir = std::env::current_exe()?
        .parent()
        .and_then(Path::parent)
        .map(Path::to_owned)
        .context("profile directory")?;
    let lifeguard = binary(args.lifeguard.clone(), profile_dir.join("lifeguard"))?;
    let example = binary(
        args.example_server.clone(),
        profile_dir.join("examples/example_server"),
    )?;
    let mode = match (args.soak, args.smoke) {
        (true, true) => "soak-smoke",
        (true, false) => "soak",
        (false, true) => "smoke",
        (false, false) => "full",
    };
    let base = args
        .work_dir
        .clone()
        .unwrap_or_else(|| target.join("bench-tmp"));
    let work = base.join(format!("{mode}-{}", std::process::id()));
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let out = args.out.clone().unwrap_or_else(|| {
        target.join("bench").join(if args.smoke {
            "results-smoke.json"
        } else {
            "results.json"
        })
    });

    let machine = Machine::probe(&work, &repo);
    if machine.ledger_in_memory() {
        eprintln!(
            "warning: {} is on {}: the ledger is not on disk",
            work.display(),
            machine.ledger_fs
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
    if args.soak {
        return soak(&args, &repo, &work, &bins, &target).await;
    }
    if args.hot_path_only {
        let out = args.out.clone().unwrap_or_else(|| {
            target.join("bench").join(if args.smoke {
                "hot-path-smoke.json"
            } else {
                "hot-path.json"
            })
        });
        return hot_path_only(&plan, &repo, &work, &out);
    }
    let results = run::measure(&plan, mode, machine, &repo, &work, &bins).await;
    let results = match results {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sidecar_bench: logs kept in {}", work.display());
            return Err(e);
        }
    };
    print!("{}", results.table());
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(&results.to_json()).context("serializing results")?;
    std::fs::write(&out, text).with_context(|| format!("writing {}", out.display()))?;
    println!("results: {}", out.display());
    if args.keep || results.errors.count > 0 {
        println!("work dir kept: {}", work.display());
    } else {
        let _ = std::fs::remove_dir_all(&work);
    }
    Ok(results.errors.count)
}
