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

mod components;
#[path = "../operator_bench/harness.rs"]
#[allow(dead_code)]
mod harness;
mod load;
#[path = "../operator_bench/machine.rs"]
mod machine;
#[path = "../operator_bench/procs.rs"]
#[allow(dead_code)]
mod procs;
mod report;
mod reviews;
mod run;
#[path = "../operator_bench/stats.rs"]
mod stats;
mod world;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;

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
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("admission_bench: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(main_async(args)) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(failed) => {
            eprintln!("admission_bench: FAILED, {failed} error(s)");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("admission_bench: setup failed: {e:#}");
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
        .join(format!("admission-{}-{}", plan.mode, std::process::id()));
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let out = args.out.clone().unwrap_or_else(|| {
        target.join("bench").join(if args.smoke {
            "admission-results-smoke.json"
        } else {
            "admission-results.json"
        })
    });
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
            eprintln!("admission_bench: logs kept in {}", work.display());
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
