//! Admission latency benchmark of `lifeguard webhook`: the release webhook, watching the
//! Python API emulator of tests/kube_emulator (an opted-in namespace, N McpServerPolicies, the
//! approver-keys Secret), answers an open-loop load of AdmissionReviews at a fixed rate —
//! mostly pod CREATEs to `/inject` (injected and skipped), plus policy and signed-exception
//! CREATEs to `/validate` — over TLS from a client that reuses connections as kube-apiserver
//! does. Every answer is checked. Reports latency percentiles per kind, per endpoint and
//! overall, the webhook's memory and CPU, and the target (p99 ≤ 5 ms at 100
//! requests/s) without ever failing on it; exits non-zero only when an answer was wrong or
//! missing (1) or the processes could not be set up (2).
//!
//! Full run: `scripts/bench-admission.sh` (release build). CI: `admission_bench --smoke`.
//! Method and results: docs/performance.md, "Admission webhook".

#[path = "../bench_support/mod.rs"]
mod bench_support;
mod components;
#[path = "../operator_bench/harness.rs"]
#[allow(dead_code)]
mod harness;
mod load;
mod report;
mod reviews;
mod run;
#[path = "../operator_bench/stats.rs"]
mod stats;
mod world;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::Parser;

use bench_support::cli::{self, Dirs};
use load::Schedule;

/// Lifeguard admission webhook benchmark: latency at a fixed request rate.
#[derive(Debug, Parser)]
#[command(name = "admission_bench")]
pub struct Args {
    /// Requests per second, scheduled at fixed instants [default: 100; smoke: 20].
    #[arg(long)]
    rate: Option<f64>,
    /// Measured seconds [default: 60; smoke: 3].
    #[arg(long)]
    duration: Option<f64>,
    /// Unmeasured seconds of load before the measured window [default: 5; smoke: 1].
    #[arg(long)]
    warmup: Option<f64>,
    /// McpServerPolicies in the namespace: `reports` plus decoys [default: 50; smoke: 10].
    #[arg(long)]
    policies: Option<usize>,
    /// Small and quick (20 req/s for 3 s, 10 policies unless given): checks that the load and
    /// every check of the answers work.
    #[arg(long)]
    smoke: bool,
    /// Per-request timeout in seconds (kube-apiserver's default webhook timeout).
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,
    /// The lifeguard binary [default: target/<profile>/lifeguard next to this program].
    #[arg(long)]
    lifeguard: Option<PathBuf>,
    /// Directory for certificates, configuration and logs [default: target/bench-tmp].
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Results file [default: target/bench/admission-results.json, or
    /// admission-results-smoke.json].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Keep the work directory (logs of the webhook and the emulator) after the run.
    #[arg(long)]
    keep: bool,
}

/// The shape of one run.
#[derive(Clone, Debug)]
pub struct Plan {
    pub mode: &'static str,
    pub schedule: Schedule,
    pub policies: usize,
    /// Calls of each component timed in process after the load.
    pub component_iterations: usize,
}

fn seconds(value: f64, flag: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(value)
        .map_err(|_| anyhow::anyhow!("{flag} {value}: not a number of seconds"))
}

impl Plan {
    fn new(args: &Args) -> Result<Self> {
        let (rate, duration, warmup, policies) = if args.smoke {
            (20.0, 3.0, 1.0, 10)
        } else {
            (100.0, 60.0, 5.0, 50)
        };
        let rate = args.rate.unwrap_or(rate);
        if !(rate.is_finite() && rate > 0.0 && rate <= 100_000.0) {
            bail!("--rate {rate}: give a rate between 0 and 100000 requests per second");
        }
        let plan = Self {
            mode: if args.smoke { "smoke" } else { "full" },
            schedule: Schedule {
                rate,
                warmup: seconds(args.warmup.unwrap_or(warmup), "--warmup")?,
                duration: seconds(args.duration.unwrap_or(duration), "--duration")?,
                timeout: seconds(args.timeout, "--timeout")?,
            },
            policies: args.policies.unwrap_or(policies),
            component_iterations: if args.smoke { 20 } else { 2000 },
        };
        if plan.policies == 0 {
            bail!("--policies must be at least 1 (the policy that selects the injected pods)");
        }
        if plan.schedule.duration.as_secs_f64() * rate < 1.0 {
            bail!("--duration × --rate must be at least one request");
        }
        if plan.schedule.timeout.is_zero() {
            bail!("--timeout must be above 0");
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
        &format!("admission-{}-{}", plan.mode, std::process::id()),
    )?;
    let out = dirs.results(args.out.clone(), "admission-results", args.smoke);
    eprintln!(
        "admission_bench: {} run: {} req/s for {:?} after {:?} of warm-up, {} policies; work dir {}",
        plan.mode,
        plan.schedule.rate,
        plan.schedule.duration,
        plan.schedule.warmup,
        plan.policies,
        work.display()
    );
    // Interrupted, the run is dropped: its processes (emulator, webhook) are killed with it.
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
