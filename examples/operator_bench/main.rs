//! Control-plane benchmark of the Lifeguard operator: how fast a revocation (created through
//! the API, or pushed as a security event) and a policy spec change reach 1,000 sidecars, and
//! what the operator costs in memory and CPU meanwhile. The sidecars are light in-process
//! clients of the distribution endpoint (each its own HTTPS connection, authenticated with its
//! pod's token, acknowledging every snapshot like a real sidecar); the cluster is the Python
//! API emulator of tests/kube_emulator. Reports, never asserts, the targets; exits non-zero
//! only when something failed (1) or the processes could not be set up (2).
//!
//! Full run: `scripts/bench-operator.sh` (release build). CI: `operator_bench --smoke`.
//! Method and results: docs/performance.md, "Control plane: propagation to 1,000 sidecars".

mod cluster;
mod fleet;
mod harness;
mod machine;
mod measure;
mod procs;
mod report;
mod run;
mod stats;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;

/// Lifeguard operator benchmark: propagation to many sidecars.
#[derive(Debug, Parser)]
#[command(name = "operator_bench")]
pub struct Args {
    /// Light sidecars (and pods) [default: 1000; smoke: 20].
    #[arg(long)]
    sidecars: Option<usize>,
    /// McpServerPolicies: `bench` plus decoys selecting nothing [default: 1000; smoke: 20].
    #[arg(long)]
    policies: Option<usize>,
    /// Repetitions of each measurement [default: 20; smoke: 3].
    #[arg(long)]
    runs: Option<usize>,
    /// Tiny and quick (20 sidecars, 20 policies, 3 runs unless given): checks that every
    /// measurement works.
    #[arg(long)]
    smoke: bool,
    /// Sidecars between dialling and their first acknowledgement at any one time.
    #[arg(long, default_value_t = 16)]
    connect_parallel: usize,
    /// Pause after the operator went idle, before the next measurement (ms).
    #[arg(long, default_value_t = 200)]
    rest_ms: u64,
    /// Longest wait for any one propagation or status (s); a slower propagation is reported
    /// as a timed-out run counted as this long.
    #[arg(long, default_value_t = 300)]
    timeout_secs: u64,
    /// Make the decoy policies trust another issuer than `bench` (by default they trust the
    /// same one, so every revocation changes every policy's snapshot, as in a cluster whose
    /// policies share an identity provider).
    #[arg(long)]
    decoys_other_issuer: bool,
    /// The lifeguard binary [default: target/<profile>/lifeguard next to this program].
    #[arg(long)]
    lifeguard: Option<PathBuf>,
    /// Directory for certificates, configuration and logs [default: target/bench-tmp].
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Results file [default: target/bench/operator-results.json, or
    /// operator-results-smoke.json].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Keep the work directory (logs of the operator and the emulator) after the run.
    #[arg(long)]
    keep: bool,
}

/// The sizes and pacing of one run.
#[derive(Clone, Debug)]
pub struct Plan {
    pub mode: &'static str,
    pub sidecars: usize,
    pub policies: usize,
    pub runs: usize,
    pub connect_parallel: usize,
    pub rest: Duration,
    pub timeout: Duration,
    pub decoys_same_issuer: bool,
}

impl Plan {
    fn new(args: &Args) -> Result<Self> {
        let (sidecars, policies, runs) = if args.smoke {
            (20, 20, 3)
        } else {
            (1000, 1000, 20)
        };
        let plan = Self {
            mode: if args.smoke { "smoke" } else { "full" },
            sidecars: args.sidecars.unwrap_or(sidecars),
            policies: args.policies.unwrap_or(policies),
            runs: args.runs.unwrap_or(runs),
            connect_parallel: args.connect_parallel,
            rest: Duration::from_millis(args.rest_ms),
            timeout: Duration::from_secs(args.timeout_secs),
            decoys_same_issuer: !args.decoys_other_issuer,
        };
        if plan.sidecars == 0 || plan.policies == 0 || plan.runs == 0 {
            bail!("--sidecars, --policies and --runs must be at least 1");
        }
        Ok(plan)
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("operator_bench: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(main_async(args)) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(failed) => {
            eprintln!("operator_bench: FAILED, {failed} error(s)");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("operator_bench: setup failed: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// target/<profile> (this program runs from target/<profile>/examples/).
fn profile_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating this program")?;
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_owned)
        .context("this program is not inside target/<profile>/examples/")
}

async fn main_async(args: Args) -> Result<u64> {
    let plan = Plan::new(&args)?;
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let profile = profile_dir()?;
    let target = profile
        .parent()
        .map(Path::to_owned)
        .context("target directory")?;
    let lifeguard = args
        .lifeguard
        .clone()
        .unwrap_or_else(|| profile.join("lifeguard"));
    if !lifeguard.is_file() {
        bail!(
            "{} is missing: build it first (cargo build --release --bin lifeguard)",
            lifeguard.display()
        );
    }
    let work = args
        .work_dir
        .clone()
        .unwrap_or_else(|| target.join("bench-tmp"))
        .join(format!("operator-{}-{}", plan.mode, std::process::id()));
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let out = args.out.clone().unwrap_or_else(|| {
        target.join("bench").join(if args.smoke {
            "operator-results-smoke.json"
        } else {
            "operator-results.json"
        })
    });
    eprintln!(
        "operator_bench: {} run: {} sidecars, {} policies, {} runs; work dir {}",
        plan.mode,
        plan.sidecars,
        plan.policies,
        plan.runs,
        work.display()
    );
    // Interrupted, the run is dropped: its processes (emulator, operator) are killed with it.
    let interrupted = async {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            },
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    };
    let outcome = tokio::select! {
        outcome = run::run(&plan, &repo, &work, &lifeguard) => outcome,
        _ = interrupted => Err(anyhow::anyhow!("interrupted")),
    };
    let results = match outcome {
        Ok(r) => r,
        Err(e) => {
            eprintln!("operator_bench: logs kept in {}", work.display());
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
