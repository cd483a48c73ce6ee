//! Scale-out benchmark: the sidecar on its embedded SQLite ledger and on a shared PostgreSQL
//! ledger, side by side in one run, with the same phases as `sidecar_bench` where they apply,
//! plus what only replicas have: a poll through a replica that is not the task's home, and
//! task-creation throughput with three replicas against one. Reports the targets, never
//! asserts them; exits non-zero only when requests failed (1) or setup failed (2).
//!
//! Full run: `scripts/bench-scale-out.sh` (release build). CI: `--smoke` (seconds).
//! Methodology and results: docs/performance.md, "Scale-out".

#[path = "../bench_support/mod.rs"]
mod bench_support;
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

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use serde_json::json;

use bench_support::cli::{self, Dirs};
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
        default_value = bench_support::postgres::DEFAULT_SERVER
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
    cli::main(
        tokio::runtime::Builder::new_current_thread(),
        "request(s) failed",
        run(args),
    )
}

async fn run(args: Args) -> Result<u64> {
    let plan = Plan::new(&args);
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dirs = Dirs::locate()?;
    let mode = if args.smoke { "smoke" } else { "full" };
    let work = dirs.work(None, &format!("scale-{mode}-{}", std::process::id()))?;
    let out = dirs.results(args.out.clone(), "scale-out", args.smoke);
    eprintln!("scale_out_bench: {mode} run; work dir {}", work.display());

    let database = bench_support::postgres::Database::create(&args.postgres, "scale").await?;
    let fleet = Fleet::start(&repo, &dirs.profile, &work, &database.url).await;
    let fleet = match cli::logs_kept(fleet, &work) {
        Ok(fleet) => fleet,
        Err(e) => {
            database.drop_now().await;
            return Err(e);
        }
    };
    let outcome = fleet.measure(&plan).await;
    drop(fleet);
    database.drop_now().await;
    let outcome: Outcome = cli::logs_kept(outcome, &work)?;
    let mut results = outcome.to_json();
    results["mode"] = json!(mode);
    cli::publish(
        &outcome.table(),
        &results,
        &out,
        &work,
        args.keep,
        outcome.errors.count,
    )
}
