//! Scale-out benchmark: the sidecar on its embedded SQLite ledger and on a shared PostgreSQL
//! ledger, side by side in one run, with the same phases as `sidecar_bench` where they apply,
//! plus what only replicas have: a poll through a replica that is not the task's home, and
//! task-creation throughput with three replicas against one. Reports the targets, never
//! asserts them; exits non-zero only when requests failed (1) or setup failed (2).
//!
//! Full run: `scripts/bench-scale-out.sh` (release build). CI: `--smoke` (seconds).
//! Methodology and results: docs/performance.md, "Scale-out".

#[allow(dead_code)]
#[path = "../sidecar_bench/client.rs"]
mod client;
#[allow(dead_code)]
#[path = "../sidecar_bench/procs.rs"]
mod procs;
#[allow(dead_code)]
#[path = "../sidecar_bench/stats.rs"]
mod stats;

mod lanes;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use serde_json::json;

use lanes::{Fleet, Outcome};

/// Scale-out benchmark: SQLite vs PostgreSQL, one replica vs three.
#[derive(Debug, Parser)]
#[command(name = "scale_out_bench")]
pub struct Args {
    /// Every phase tiny (seconds, for CI); exits non-zero only on errors.
    #[arg(long)]
    pub smoke: bool,
    /// PostgreSQL server where the bench creates (and drops) its own database.
    #[arg(
        long,
        env = "LIFEGUARD_BENCH_POSTGRES",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    pub postgres: String,
    /// Sequential task creations per lane.
    #[arg(long)]
    pub create_samples: Option<usize>,
    /// Sequential `tasks/get` per lane.
    #[arg(long)]
    pub poll_samples: Option<usize>,
    /// Seconds of closed-loop creation per round and fleet (4 alternating rounds).
    #[arg(long)]
    pub throughput_secs: Option<f64>,
    /// Concurrent connections of the throughput phase.
    #[arg(long, default_value_t = 32)]
    pub connections: usize,
    /// Results file [default: target/bench/scale-out.json, or scale-out-smoke.json].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Keep the work directory (ledgers, logs) after the run.
    #[arg(long)]
    pub keep: bool,
}

/// How much of each phase a run does.
pub struct Plan {
    pub create_samples: usize,
    pub poll_samples: usize,
    pub rounds: usize,
    pub throughput: Duration,
    pub connections: usize,
}

impl Plan {
    fn new(args: &Args) -> Self {
        let smoke = args.smoke;
        Self {
            create_samples: args
                .create_samples
                .unwrap_or(if smoke { 40 } else { 4_000 }),
            poll_samples: args.poll_samples.unwrap_or(if smoke { 40 } else { 20_000 }),
            rounds: if smoke { 2 } else { 10 },
            throughput: Duration::from_secs_f64(args.throughput_secs.unwrap_or(if smoke {
                0.3
            } else {
                5.0
            })),
            connections: if smoke { 4 } else { args.connections },
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("scale_out_bench: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run(args)) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(failed) => {
            eprintln!("scale_out_bench: FAILED, {failed} request(s) failed");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("scale_out_bench: setup failed: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(args: Args) -> Result<u64> {
    let plan = Plan::new(&args);
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let exe = std::env::current_exe().context("locating this program")?;
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .map(Path::to_owned)
        .context("this program is not inside target/<profile>/examples/")?;
    let target = profile.parent().context("target directory")?.to_owned();
    let mode = if args.smoke { "smoke" } else { "full" };
    let work = target
        .join("bench-tmp")
        .join(format!("scale-{mode}-{}", std::process::id()));
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let out = args.out.clone().unwrap_or_else(|| {
        target.join("bench").join(if args.smoke {
            "scale-out-smoke.json"
        } else {
            "scale-out.json"
        })
    });
    eprintln!("scale_out_bench: {mode} run; work dir {}", work.display());

    let database = lanes::Database::create(&args.postgres).await?;
    let fleet = Fleet::start(&repo, &profile, &work, &database.url).await;
    let fleet = match fleet {
        Ok(fleet) => fleet,
        Err(e) => {
            eprintln!("scale_out_bench: logs kept in {}", work.display());
            database.drop_now().await;
            return Err(e);
        }
    };
    let outcome = fleet.measure(&plan).await;
    drop(fleet);
    database.drop_now().await;
    let outcome: Outcome = match outcome {
        Ok(o) => o,
        Err(e) => {
            eprintln!("scale_out_bench: logs kept in {}", work.display());
            return Err(e);
        }
    };
    print!("{}", outcome.table());
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut results = outcome.to_json();
    results["mode"] = json!(mode);
    std::fs::write(&out, serde_json::to_string_pretty(&results)?)
        .with_context(|| format!("writing {}", out.display()))?;
    println!("results: {}", out.display());
    if args.keep || outcome.errors.count > 0 {
        println!("work dir kept: {}", work.display());
    } else {
        let _ = std::fs::remove_dir_all(&work);
    }
    Ok(outcome.errors.count)
}
