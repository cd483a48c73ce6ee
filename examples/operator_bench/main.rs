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

#[path = "../bench_support/mod.rs"]
mod bench_support;
mod cluster;
mod cpu;
mod fleet;
mod harness;
mod measure;
mod report;
mod run;
mod stats;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::Parser;

use bench_support::cli::{self, Dirs};

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
    /// After the runs, this long without any change, then one more revocation: what
    /// acknowledging it costs the API server after a quiet spell (every review cache expired)
    /// [default: 65; smoke: 1]. 0 skips it.
    #[arg(long)]
    quiet_secs: Option<u64>,
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
    /// The quiet spell before the last revocation (zero: none).
    pub quiet: Duration,
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
            quiet: Duration::from_secs(args.quiet_secs.unwrap_or(if args.smoke { 1 } else { 65 })),
        };
        if plan.sidecars == 0 || plan.policies == 0 || plan.runs == 0 {
            bail!("--sidecars, --policies and --runs must be at least 1");
        }
        Ok(plan)
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    cli::main(
        tokio::runtime::Builder::new_multi_thread(),
        "error(s)",
        main_async(args),
    )
}

async fn main_async(args: Args) -> Result<u64> {
    let plan = Plan::new(&args)?;
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dirs = Dirs::locate()?;
    let lifeguard = dirs.lifeguard(args.lifeguard.clone())?;
    let work = dirs.work(
        args.work_dir.clone(),
        &format!("operator-{}-{}", plan.mode, std::process::id()),
    )?;
    let out = dirs.results(args.out.clone(), "operator-results", args.smoke);
    eprintln!(
        "operator_bench: {} run: {} sidecars, {} policies, {} runs; work dir {}",
        plan.mode,
        plan.sidecars,
        plan.policies,
        plan.runs,
        work.display()
    );
    // Interrupted, the run is dropped: its processes (emulator, operator) are killed with it.
    let outcome = cli::unless_interrupted(run::run(&plan, &repo, &work, &lifeguard)).await;
    let results = cli::logs_kept(outcome, &work)?;
    cli::publish(
        &results.table(),
        &results.to_json(),
        &out,
        &work,
        args.keep,
        results.errors.count,
    )
}
