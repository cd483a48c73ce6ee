//! Performance benchmark of the Lifeguard sidecar: the bundled example MCP server measured
//! directly and through the sidecar (JWT validation on every request, SQLite ledger on disk),
//! side by side in one run. Reports, never asserts, the targets; exits non-zero only when
//! requests failed (1) or the processes could not be set up (2).
//!
//! Full run: `scripts/bench.sh` (release build). CI: `sidecar_bench --smoke` (seconds).
//! Methodology and results: docs/performance.md.

mod client;
mod components;
mod phases;
mod procs;
mod report;
mod stats;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use jsonwebtoken::Algorithm;
use serde_json::{Value, json};

use client::{Conn, Endpoint, Template};
use phases::{Lane, Load, latency_rounds, settle, task_id_of, throughput_rounds};
use procs::{Server, Sidecar, TASK_TOOL};
use report::{LaneResult, LoadResult, Machine, Results, Target};
use stats::{Added, Errors, Summary};

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
    /// Extra environment for the sidecar process, KEY=VALUE (repeatable), for experiments
    /// such as TOKIO_WORKER_THREADS=1. Recorded in the results.
    #[arg(long = "sidecar-env", value_name = "KEY=VALUE")]
    sidecar_env: Vec<String>,
    /// Keep the work directory (ledger, audit trail, logs) after the run.
    #[arg(long)]
    keep: bool,
}

/// Sizes of one run.
struct Plan {
    warmup: usize,
    warmup_load: Duration,
    latency: usize,
    latency_rounds: usize,
    create: usize,
    create_rounds: usize,
    load: Duration,
    load_rounds: usize,
    connections: usize,
    rows: u64,
    fill_principals: usize,
    reads: usize,
    component_iterations: usize,
}

impl Plan {
    fn new(args: &Args) -> Self {
        let smoke = args.smoke;
        let pick = |full: usize, tiny: usize| if smoke { tiny } else { full };
        let secs = |full: f64, tiny: f64| if smoke { tiny } else { full };
        Self {
            warmup: pick(2_000, 50),
            warmup_load: Duration::from_secs_f64(secs(1.0, 0.2)),
            latency: args.latency_samples.unwrap_or(pick(20_000, 300)),
            latency_rounds: pick(10, 2),
            create: args.create_samples.unwrap_or(pick(10_000, 100)),
            create_rounds: pick(20, 2),
            load: Duration::from_secs_f64(args.throughput_secs.unwrap_or(secs(10.0, 1.0))),
            load_rounds: pick(4, 2),
            connections: args.connections.max(1),
            rows: args.rows.unwrap_or(if smoke { 300 } else { 100_000 }),
            fill_principals: 64,
            reads: pick(5_000, 50),
            component_iterations: pick(500, 20),
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "warmup_requests_per_lane": self.warmup, "warmup_load_seconds": self.warmup_load.as_secs_f64(),
            "latency_samples_per_lane": self.latency, "latency_rounds": self.latency_rounds,
            "create_samples_per_lane": self.create, "create_rounds": self.create_rounds,
            "throughput_seconds_per_endpoint": self.load.as_secs_f64(), "throughput_rounds": self.load_rounds,
            "connections": self.connections, "ledger_rows_target": self.rows,
            "fill_principals": self.fill_principals, "completed_task_reads": self.reads,
            "component_iterations": self.component_iterations,
        })
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
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
    let example = binary(args.example_server.clone(), profile_dir.join("examples/example_server"))?;
    let mode = if args.smoke { "smoke" } else { "full" };
    let base = args.work_dir.clone().unwrap_or_else(|| target.join("bench-tmp"));
    let work = base.join(format!("{mode}-{}", std::process::id()));
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let out = args.out.clone().unwrap_or_else(|| {
        target.join("bench").join(if args.smoke { "results-smoke.json" } else { "results.json" })
    });

    let machine = Machine::probe(&work, &repo);
    if machine.ledger_in_memory() {
        eprintln!("warning: {} is on {}: the ledger is not on disk", work.display(), machine.ledger_fs);
    }
    eprintln!("sidecar_bench: {mode} run; work dir {}", work.display());
    let mut sidecar_env = Vec::new();
    for pair in &args.sidecar_env {
        let (k, v) = pair
            .split_once('=')
            .with_context(|| format!("--sidecar-env takes KEY=VALUE, got {pair}"))?;
        sidecar_env.push((k.to_owned(), v.to_owned()));
    }
    let bins = Binaries { lifeguard, example, sidecar_env };
    let results = measure(&plan, mode, machine, &repo, &work, &bins).await;
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

/// Counts of the ledger's rows, read with a separate read-only SQLite connection.
fn ledger_rows(path: &Path) -> Result<(u64, u64)> {
    let conn = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .context("opening the ledger read-only")?;
    conn.query_row(
        "SELECT COUNT(*), COALESCE(SUM(ended_at IS NULL), 0) FROM tasks",
        [],
        |row| Ok((row.get::<_, i64>(0)? as u64, row.get::<_, i64>(1)? as u64)),
    )
    .context("counting ledger rows")
}

fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// Creates one long-running task (for the tasks/get phase) and returns its id.
async fn running_task(endpoint: &Endpoint, token: &str) -> Result<String> {
    let mut conn = Conn::connect(endpoint.addr).await?;
    let template = Template::tool_call(endpoint, token, TASK_TOOL, json!({"seconds": 86_400}), true);
    let status = conn.send(template.bytes()).await?;
    conn.body_json()
        .filter(|_| status == 200)
        .and_then(|v| task_id_of(&v))
        .with_context(|| format!("creating a running task: {}", client::describe_failure(status, conn.body())))
}

fn lane_result(lane: &mut Lane) -> LaneResult {
    LaneResult {
        name: lane.name.to_owned(),
        summary: Summary::of(&mut lane.samples),
        usage: lane.usage,
    }
}

/// The programs under test and how the sidecar is started.
struct Binaries {
    lifeguard: PathBuf,
    example: PathBuf,
    sidecar_env: Vec<(String, String)>,
}

async fn measure(
    plan: &Plan,
    mode: &'static str,
    machine: Machine,
    repo: &Path,
    work: &Path,
    bins: &Binaries,
) -> Result<Results> {
    let keys = procs::Keys::load(repo)?;
    let owner = keys.token(Algorithm::RS256, "bench-owner", "tenant-0", "client-0")?;
    let owner_ed = keys.token(Algorithm::EdDSA, "bench-owner", "tenant-0", "client-0")?;
    let fill_tokens = (0..plan.fill_principals)
        .map(|i| keys.token(Algorithm::RS256, &format!("bench-user-{i}"), &format!("tenant-{}", i % 8), &format!("client-{}", i % 4)))
        .collect::<Result<Vec<_>>>()?;

    let mut server = Server::start(&bins.example, work)?;
    let mut sidecar = Sidecar::start(&bins.lifeguard, work, &server.endpoint, &keys, &bins.sidecar_env).await?;
    let (direct, via) = (server.endpoint.clone(), sidecar.endpoint.clone());
    let mut errors = Errors::default();
    let mut memory = Vec::new();
    tokio::time::sleep(Duration::from_secs(1)).await;
    memory.push(("idle, after start (no request yet)".to_owned(), sidecar.proc.status()?));

    // Synchronous tools/call (greet): direct, through the sidecar, and with an EdDSA token.
    eprintln!("phase: greet latency");
    let greet = |e: &Endpoint, t: &str| Template::tool_call(e, t, "greet", json!({"name": "bench"}), false);
    let mut lanes = vec![
        Lane::new("greet direct", false, &direct, greet(&direct, &owner)),
        Lane::new("greet via sidecar", true, &via, greet(&via, &owner)),
        Lane::new("greet via sidecar, EdDSA token", true, &via, greet(&via, &owner_ed)),
    ];
    for lane in &mut lanes {
        lane.run(plan.warmup, false).await?;
    }
    let mut warm = [(direct.clone(), greet(&direct, &owner), Load::default()), (via.clone(), greet(&via, &owner), Load::default())];
    throughput_rounds(&server, &sidecar, &mut warm, plan.connections, plan.warmup_load * 2, 2).await?;
    for (_, _, load) in warm {
        errors.merge(load.errors);
    }
    latency_rounds(&server, &sidecar, &mut lanes, plan.latency, plan.latency_rounds, async |_: &mut [Lane]| Ok(())).await?;
    let mut latency: Vec<LaneResult> = Vec::new();
    let mut added = Vec::new();
    let greet_results: Vec<LaneResult> = lanes.iter_mut().map(lane_result).collect();
    for lane in &mut lanes {
        errors.merge(std::mem::take(&mut lane.errors));
    }
    for r in &greet_results[1..] {
        added.push((r.name.clone(), Added::between(&greet_results[0].summary, &r.summary)));
    }
    latency.extend(greet_results);

    // tasks/get of a running task: the upstream id directly, the sidecar's id through it.
    eprintln!("phase: tasks/get latency");
    let upstream_task = running_task(&direct, &owner).await?;
    let sidecar_task = running_task(&via, &owner).await?;
    let mut lanes = vec![
        Lane::new("tasks/get direct (running task)", false, &direct, Template::task_get(&direct, &owner, &upstream_task)),
        Lane::new("tasks/get via sidecar (running task)", true, &via, Template::task_get(&via, &owner, &sidecar_task)),
    ];
    for lane in &mut lanes {
        lane.run(plan.warmup / 4, false).await?;
    }
    latency_rounds(&server, &sidecar, &mut lanes, plan.latency, plan.latency_rounds, async |_: &mut [Lane]| Ok(())).await?;
    let results: Vec<LaneResult> = lanes.iter_mut().map(lane_result).collect();
    for lane in &mut lanes {
        errors.merge(std::mem::take(&mut lane.errors));
    }
    added.push((results[1].name.clone(), Added::between(&results[0].summary, &results[1].summary)));
    latency.extend(results);

    // Task creation: slow_compute with seconds 0. Through the sidecar each creation reserves a
    // slot and commits the row durably; after each round the new tasks are polled to completion
    // (unmeasured), so at most one round's tasks are active in the ledger.
    eprintln!("phase: task creation latency");
    let create = |e: &Endpoint| Template::tool_call(e, &owner, TASK_TOOL, json!({"seconds": 0}), true);
    let mut lanes = vec![
        Lane::new("task creation direct", false, &direct, create(&direct)),
        Lane::new("task creation via sidecar (durable)", true, &via, create(&via)),
    ];
    lanes[1].collect_task_ids = true;
    let mut settle_errors = Errors::default();
    let mut settle_round = async |lanes: &mut [Lane]| {
        let ids = std::mem::take(&mut lanes[1].task_ids);
        settle(&via, &owner, &ids, &mut settle_errors).await
    };
    for lane in lanes.iter_mut() {
        lane.run(plan.warmup / 10, false).await?;
    }
    settle_round(&mut lanes).await?;
    latency_rounds(&server, &sidecar, &mut lanes, plan.create, plan.create_rounds, &mut settle_round).await?;
    errors.merge(settle_errors);
    let results: Vec<LaneResult> = lanes.iter_mut().map(lane_result).collect();
    for lane in &mut lanes {
        errors.merge(std::mem::take(&mut lane.errors));
    }
    added.push((results[1].name.clone(), Added::between(&results[0].summary, &results[1].summary)));
    latency.extend(results);

    // Throughput: closed loop on `connections` connections, alternating endpoints.
    eprintln!("phase: throughput");
    let mut loads = [
        (direct.clone(), greet(&direct, &owner), Load { name: "greet direct", ..Load::default() }),
        (via.clone(), greet(&via, &owner), Load { name: "greet via sidecar", ..Load::default() }),
    ];
    throughput_rounds(&server, &sidecar, &mut loads, plan.connections, plan.load, plan.load_rounds).await?;
    let mut throughput = Vec::new();
    for (_, _, mut load) in loads {
        throughput.push(LoadResult {
            name: format!("{} ({} conns)", load.name, plan.connections),
            rps: load.rps(),
            summary: Summary::of(&mut load.samples),
            usage: load.usage,
            requests: load.requests,
            secs: load.elapsed.as_secs_f64(),
        });
        errors.merge(load.errors);
    }

    tokio::time::sleep(Duration::from_secs(2)).await;
    memory.push(("idle, after the latency and throughput phases".to_owned(), sidecar.proc.status()?));

    // Fill the ledger to the row target with completed tasks of many principals.
    eprintln!("phase: ledger fill to {} rows", plan.rows);
    let (rows_before, _) = ledger_rows(&sidecar.ledger)?;
    let fill = phases::fill(&via, &fill_tokens, plan.rows.saturating_sub(rows_before), plan.connections).await?;
    errors.merge(fill.errors);
    // Random reads of completed tasks across the whole ledger, as their owners.
    let mut read_samples = Vec::new();
    let mut conn = Conn::connect(via.addr).await?;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..plan.reads.min(fill.sample.len() * 4) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let (principal, id) = &fill.sample[(rng % fill.sample.len() as u64) as usize];
        let mut t = Template::task_get(&via, &fill_tokens[*principal], id);
        t.set_id(i as u64);
        let (status, ns) = client::timed(&mut conn, t.bytes()).await?;
        if client::is_success(status, conn.body()) {
            read_samples.push(ns);
        } else {
            errors.record(format!("completed read: {}", client::describe_failure(status, conn.body())));
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (rows, active) = ledger_rows(&sidecar.ledger)?;
    memory.push((format!("with {rows} ledger rows ({active} active), at rest"), sidecar.proc.status()?));
    let ledger_path = sidecar.ledger.clone();
    let wal = PathBuf::from(format!("{}-wal", ledger_path.display()));
    let ledger = json!({
        "rows": rows, "active_rows": active, "db_bytes": file_size(&ledger_path), "wal_bytes": file_size(&wal),
        "filled_rows": fill.created, "fill_seconds": fill.elapsed.as_secs_f64(),
        "fill_rows_per_second": fill.created as f64 / fill.elapsed.as_secs_f64().max(1e-9),
        "content": "completed slow_compute tasks with their results, 64 principals in 8 tenants and 4 clients, plus the bench owner's tasks",
    });
    let server_memory = server.proc.status()?;
    sidecar.proc.check_alive()?;
    server.proc.check_alive()?;
    drop(sidecar);
    drop(server);

    eprintln!("phase: components");
    let components = components::measure(&keys, &work.join("components"), plan.component_iterations).await?;

    let read_pass = (!read_samples.is_empty()).then(|| Summary::of(&mut read_samples));
    let added_of = |name: &str| added.iter().find(|(n, _)| n == name).map(|(_, a)| a.clone()).unwrap_or_default();
    let lat = |name: &str| latency.iter().find(|l| l.name == name).map(|l| l.summary.clone()).unwrap_or_default();
    let greet_added = added_of("greet via sidecar");
    let get_added = added_of("tasks/get via sidecar (running task)");
    let create_sidecar = lat("task creation via sidecar (durable)");
    let ratio = throughput[1].rps / throughput[0].rps.max(1e-9);
    let few_rows = (rows < 100_000).then(|| format!("only {rows} rows in this run"));
    let t = |name, measured: f64, limit, unit, at_least| Target { name, measured, limit, unit, at_least, not_applicable: None };
    let targets = vec![
        t("greet added latency p50", greet_added.p50 as f64 / 1e3, 100.0, "µs", false),
        t("greet added latency p99", greet_added.p99 as f64 / 1e3, 1000.0, "µs", false),
        t("throughput via sidecar / direct (32 conns)", ratio, 0.6, "×", true),
        t("tasks/get added latency p50", get_added.p50 as f64 / 1e3, 150.0, "µs", false),
        t("durable task creation p99 (absolute, via sidecar)", create_sidecar.p99 as f64 / 1e6, 5.0, "ms", false),
        t("sidecar VmRSS idle (after start)", memory[0].1.rss_kib as f64 / 1024.0, 20.0, "MiB", false),
        Target {
            not_applicable: few_rows,
            ..t("sidecar VmRSS with 100,000 ledger rows", memory[2].1.rss_kib as f64 / 1024.0, 64.0, "MiB", false)
        },
    ];
    memory.push(("(example server, for comparison, at the end)".to_owned(), server_memory));
    Ok(Results {
        mode,
        machine,
        config: json!({"plan": plan.to_json(), "sidecar_env": bins.sidecar_env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>()}),
        ticks_per_sec: procs::clock_ticks_per_sec(),
        latency,
        added,
        throughput,
        memory,
        ledger,
        read_pass,
        components,
        targets,
        errors,
    })
}
