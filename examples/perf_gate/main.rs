//! The instruction-count gate: how many instructions the sidecar adds per request of each kind
//! (`greet`, a forwarded `tasks/get`, a task creation, a refusal, a listen delivery), counted
//! by valgrind's callgrind and compared with the committed baseline
//! (`perf/instruction-counts.json`). Instruction counts do not depend on how busy the machine
//! is, so the gate cannot flake the way a timing would.
//!
//! `scripts/perf-gate.sh` runs it (`.ci/run` does, and fails on more than 10 % growth):
//! - `perf_gate measure --work DIR` is the process callgrind runs (see `workload`);
//! - `perf_gate check --work DIR --baseline FILE` reads the dumps, prints each kind against the
//!   baseline and exits 1 on a regression (`--update` writes the baseline instead,
//!   `--expect-regression KIND` passes only if KIND regressed: the planted-regression check).
//!
//! Methodology and numbers: docs/performance.md, "Instruction-count gate".

/// The allocator of the `lifeguard` binary: the counts are of the code production runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "../bench_support/mod.rs"]
mod bench_support;
#[path = "../sidecar_bench/client.rs"]
#[allow(dead_code)]
mod client;
mod counts;
#[path = "../sidecar_bench/in_process.rs"]
mod in_process;
#[path = "../sidecar_bench/procs.rs"]
#[allow(dead_code)]
mod procs;
mod sse;
mod workload;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use lifeguard::runtime::workers::Workers;

use counts::{Baseline, Comparison, Verdict};
use workload::{Kind, Plan, Plant};

/// Growth of a kind's added instructions per request beyond which the gate fails, percent.
const THRESHOLD_PERCENT: u64 = 10;
/// The prefix of callgrind's dump files in the work directory.
const DUMP_PREFIX: &str = "callgrind.out";

#[derive(Parser)]
#[command(about = "Instruction counts of the sidecar's hot path, against a committed baseline")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The measured process (run under callgrind by scripts/perf-gate.sh).
    Measure {
        /// Directory for the sidecar's files and phases.json.
        #[arg(long)]
        work: PathBuf,
        /// The repository (for the test issuer's keys).
        #[arg(long, default_value = ".")]
        repo: PathBuf,
        /// Warm-up requests per kind and lane.
        #[arg(long, default_value_t = 20)]
        warmup: u64,
        /// Measured requests per kind and lane.
        #[arg(long, default_value_t = 100)]
        requests: u64,
        /// Plant a 20 % regression in KIND: every fifth measured request through the sidecar
        /// is sent twice.
        #[arg(long, value_name = "KIND", value_parser = parse_kind)]
        plant: Option<Kind>,
    },
    /// Reads the dumps in --work and compares them with the baseline.
    Check {
        #[arg(long)]
        work: PathBuf,
        #[arg(long)]
        baseline: PathBuf,
        /// Write the measured counts as the new baseline instead of comparing.
        #[arg(long, conflicts_with = "expect_regression")]
        update: bool,
        /// Pass only if KIND regressed (and report it): the check that the gate has teeth.
        #[arg(long, value_name = "KIND", value_parser = parse_kind)]
        expect_regression: Option<Kind>,
    },
}

fn parse_kind(name: &str) -> Result<Kind, String> {
    Kind::parse(name).ok_or_else(|| {
        let names: Vec<&str> = workload::KINDS.iter().map(|k| k.name()).collect();
        format!(
            "unknown request kind {name:?}; one of: {}",
            names.join(", ")
        )
    })
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("perf_gate: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Measure {
            work,
            repo,
            warmup,
            requests,
            plant,
        } => {
            let plan = Plan {
                warmup,
                requests,
                plant: plant.map(|kind| Plant { kind, every: 5 }),
            };
            measure(&repo, &work, plan)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Check {
            work,
            baseline,
            update,
            expect_regression,
        } => check(&work, &baseline, update, expect_regression),
    }
}

fn measure(repo: &Path, work: &Path, plan: Plan) -> Result<()> {
    std::fs::create_dir_all(work).with_context(|| format!("creating {}", work.display()))?;
    // As in the binary: the connections on the workers, accept loops and background work on a
    // one-thread main runtime.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("perf-gate-main")
        .enable_all()
        .build()
        .context("building the runtime")?;
    let workers = Workers::start(1, "perf-gate").context("starting the workers")?;
    let phases = runtime.block_on(workload::run(repo, work, &workers, &plan))?;
    drop(runtime);
    workers.stop();
    let path = work.join("phases.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&phases)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn check(
    work: &Path,
    baseline_path: &Path,
    update: bool,
    expect_regression: Option<Kind>,
) -> Result<ExitCode> {
    let phases_path = work.join("phases.json");
    let phases: Vec<workload::Phase> = serde_json::from_slice(
        &std::fs::read(&phases_path)
            .with_context(|| format!("reading {}", phases_path.display()))?,
    )
    .with_context(|| format!("parsing {}", phases_path.display()))?;
    let costs = counts::dump_costs(work, DUMP_PREFIX)?;
    let measured = counts::per_kind(&phases, &costs)?;
    let requests = phases.iter().find(|p| p.measured).map_or(0, |p| p.counted);
    let toolchain = rustc_version();
    std::fs::write(
        work.join("counts.json"),
        serde_json::to_vec_pretty(&measured)?,
    )?;

    if update {
        let baseline = Baseline {
            about: "Instructions per request (valgrind callgrind, the test profile's build) that \
                    the sidecar adds, per request kind: written by `scripts/perf-gate.sh --update`, \
                    checked by `scripts/perf-gate.sh` in .ci/run (fails beyond +10 %). See \
                    docs/performance.md, \"Instruction-count gate\"."
                .into(),
            toolchain,
            requests,
            kinds: measured,
        };
        let mut text = serde_json::to_string_pretty(&baseline)?;
        text.push('\n');
        std::fs::write(baseline_path, text)
            .with_context(|| format!("writing {}", baseline_path.display()))?;
        println!("perf gate: baseline written to {}", baseline_path.display());
        for k in &baseline.kinds {
            println!("  {:<16} {:>12} added per request", k.kind, k.added);
        }
        return Ok(ExitCode::SUCCESS);
    }

    let text = std::fs::read_to_string(baseline_path)
        .with_context(|| format!("reading {}", baseline_path.display()))?;
    let baseline: Baseline = serde_json::from_str(&text)
        .with_context(|| format!("parsing {}", baseline_path.display()))?;
    if baseline.toolchain != toolchain {
        println!(
            "perf gate: the baseline was recorded with {} and this build is {}: counts move \
             with the compiler; after a toolchain change, update the baseline on purpose \
             (scripts/perf-gate.sh --update)",
            baseline.toolchain, toolchain
        );
    }
    if baseline.requests != requests {
        bail!(
            "the baseline counted {} requests per phase and this run {requests}: run both alike",
            baseline.requests
        );
    }
    let comparisons = counts::compare(&baseline, &measured, THRESHOLD_PERCENT);
    print_table(&measured, &comparisons);
    let passed = counts::passes(&comparisons);
    match expect_regression {
        None if passed => {
            println!("perf gate: PASS (no kind grew more than {THRESHOLD_PERCENT} %)");
            if comparisons.iter().any(|c| c.verdict == Verdict::Improved) {
                println!(
                    "perf gate: a kind shrank more than {THRESHOLD_PERCENT} %: update the \
                     baseline (scripts/perf-gate.sh --update) so the gain cannot be given back \
                     unnoticed"
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        None => {
            println!(
                "perf gate: FAIL: a kind grew more than {THRESHOLD_PERCENT} % (or is not in the \
                 baseline). If the growth is deliberate, update the baseline with \
                 scripts/perf-gate.sh --update and say why in the commit"
            );
            Ok(ExitCode::from(1))
        }
        Some(kind) => {
            let planted = comparisons.iter().find(|c| c.kind == kind.name());
            let caught = planted.is_some_and(|c| c.verdict == Verdict::Regressed);
            let others_hold = comparisons
                .iter()
                .filter(|c| c.kind != kind.name())
                .all(|c| c.verdict != Verdict::Regressed);
            if caught && others_hold {
                println!(
                    "perf gate: the regression planted in {} was caught, and only there",
                    kind.name()
                );
                Ok(ExitCode::SUCCESS)
            } else {
                println!(
                    "perf gate: FAIL: the regression planted in {} was {}",
                    kind.name(),
                    if caught {
                        "caught, but another kind failed too"
                    } else {
                        "not caught"
                    }
                );
                Ok(ExitCode::from(1))
            }
        }
    }
}

fn print_table(measured: &[counts::KindCounts], comparisons: &[Comparison]) {
    println!(
        "{:<16} {:>14} {:>12} {:>14} {:>14} {:>9}  verdict",
        "kind", "via sidecar", "direct", "added", "baseline", "change"
    );
    for (m, c) in measured.iter().zip(comparisons) {
        let verdict = match c.verdict {
            Verdict::Holds => "holds",
            Verdict::Regressed => "REGRESSED",
            Verdict::Improved => "improved",
            Verdict::NotInBaseline => "NOT IN BASELINE",
        };
        println!(
            "{:<16} {:>14} {:>12} {:>14} {:>14} {:>8}  {verdict}",
            m.kind,
            m.through_sidecar,
            m.direct.map_or("-".into(), |d| d.to_string()),
            m.added,
            c.baseline.map_or("-".into(), |b| b.to_string()),
            c.change_percent()
                .map_or("-".into(), |p| format!("{p:+.1}%")),
        );
    }
}

/// `rustc --version`, or `unknown` when rustc cannot be run.
fn rustc_version() -> String {
    std::process::Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or_else(
            || "unknown".into(),
            |o| String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        )
}
