//! One benchmark run: the processes, the phases in order, and the results they add up to.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use jsonwebtoken::Algorithm;
use serde_json::{Value, json};

use crate::bench_support::procs::{MachineTicks, clock_ticks_per_sec, preflight_noise};
use crate::client::{self, Conn, Endpoint, Template};
use crate::components;
use crate::exhaustion::{self, ExhaustionPlan};
use crate::listen::{self, LaneTarget, ListenPlan, ListenResult};
use crate::phases::{self, Lane, Load, latency_rounds, settle, throughput_rounds};
use crate::procs::{self, Keys, Server, Sidecar, TASK_TOOL, running_task};
use crate::report::{LaneResult, LoadResult, Machine, Results, targets};
use crate::stats::{Added, Errors, Summary};

/// Sizes of one run.
pub struct Plan {
    pub warmup: usize,
    pub warmup_load: Duration,
    pub latency: usize,
    pub latency_rounds: usize,
    pub create: usize,
    pub create_rounds: usize,
    pub load: Duration,
    pub load_rounds: usize,
    pub connections: usize,
    pub rows: u64,
    pub fill_principals: usize,
    pub reads: usize,
    pub component_iterations: usize,
    /// Pause before memory readings and for the preflight noise reading.
    pub rest: Duration,
    pub listen: ListenPlan,
    pub exhaustion: ExhaustionPlan,
    /// Measured seconds per lane of the in-process hot path.
    pub hot_path: Duration,
    /// An earlier run's results, for the targets that are reductions.
    pub baseline: Option<PathBuf>,
}

impl Plan {
    pub fn new(args: &crate::Args) -> Self {
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
            rest: Duration::from_secs_f64(secs(2.0, 0.3)),
            listen: ListenPlan {
                streams: args.listen_streams.unwrap_or(pick(1_000, 20)).max(1),
                groups: 0,
                deliveries_per_sec: args.listen_deliveries.unwrap_or(if smoke {
                    100
                } else {
                    1_000
                }),
                warmup: Duration::from_secs_f64(secs(2.0, 0.3)),
                duration: Duration::from_secs_f64(args.listen_secs.unwrap_or(secs(20.0, 1.0))),
            },
            exhaustion: ExhaustionPlan::new(smoke),
            hot_path: Duration::from_secs_f64(args.hot_path_secs.unwrap_or(secs(5.0, 0.5))),
            baseline: args.baseline.clone(),
        }
        .with_listen_groups()
    }

    /// Fan-out 10 (each event reaches ten streams) when there are enough streams.
    fn with_listen_groups(mut self) -> Self {
        self.listen.groups = (self.listen.streams / 10).max(1);
        self
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
            "rest_seconds": self.rest.as_secs_f64(),
            "listen": self.listen.to_json(),
            "exhaustion": self.exhaustion.to_json(),
            "hot_path_seconds_per_lane": self.hot_path.as_secs_f64(),
        })
    }
}

/// Names of the throughput lanes (the report finds them by these).
pub const GREET_DIRECT: &str = "greet direct";
pub const GREET_VIA: &str = "greet via sidecar";
pub const POLL_DIRECT: &str = "tasks/get direct (running task)";
pub const POLL_VIA: &str = "tasks/get via sidecar (running task)";

/// The programs under test and how the sidecar is started.
pub struct Binaries {
    pub lifeguard: PathBuf,
    pub example: PathBuf,
    pub sidecar_env: Vec<(String, String)>,
}

/// Counts of the ledger's rows (all, active), read with a separate read-only connection.
fn ledger_rows(path: &Path) -> Result<(u64, u64)> {
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY;
    let conn = rusqlite::Connection::open_with_flags(path, flags)
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

/// The running processes and what the phases have gathered so far.
struct Bench<'a> {
    plan: &'a Plan,
    server: Server,
    sidecar: Sidecar,
    direct: Endpoint,
    via: Endpoint,
    owner: String,
    owner_ed: String,
    errors: Errors,
    latency: Vec<LaneResult>,
    added: Vec<(String, Added)>,
}

impl Bench<'_> {
    fn greet(&self, endpoint: &Endpoint, token: &str) -> Template {
        Template::tool_call(endpoint, token, "greet", json!({"name": "bench"}), false)
    }

    /// Collects the lanes' results; every lane after the first is compared with the first.
    fn finish_lanes(&mut self, lanes: &mut [Lane]) {
        let results: Vec<LaneResult> = lanes
            .iter_mut()
            .map(|lane| LaneResult {
                name: lane.name.to_owned(),
                summary: Summary::of(&mut lane.samples),
                usage: lane.usage,
                secs: lane.elapsed.as_secs_f64(),
            })
            .collect();
        for lane in lanes.iter_mut() {
            self.errors.merge(std::mem::take(&mut lane.errors));
        }
        for r in &results[1..] {
            let added = Added::between(&results[0].summary, &r.summary);
            self.added.push((r.name.clone(), added));
        }
        self.latency.extend(results);
    }

    /// Synchronous tools/call (greet): direct, through the sidecar, and with an EdDSA token.
    async fn greet_phase(&mut self) -> Result<()> {
        eprintln!("phase: greet latency");
        let (direct, via) = (self.direct.clone(), self.via.clone());
        let mut lanes = vec![
            Lane::new(
                "greet direct",
                false,
                &direct,
                self.greet(&direct, &self.owner),
            ),
            Lane::new(
                "greet via sidecar",
                true,
                &via,
                self.greet(&via, &self.owner),
            ),
            Lane::new(
                "greet via sidecar, EdDSA token",
                true,
                &via,
                self.greet(&via, &self.owner_ed),
            ),
        ];
        for lane in &mut lanes {
            lane.run(self.plan.warmup, false).await?;
        }
        let mut warm = [
            (
                direct.clone(),
                self.greet(&direct, &self.owner),
                Load::default(),
            ),
            (via.clone(), self.greet(&via, &self.owner), Load::default()),
        ];
        let (conns, secs) = (self.plan.connections, self.plan.warmup_load * 2);
        throughput_rounds(&self.server, &self.sidecar, &mut warm, conns, secs, 2).await?;
        for (_, _, load) in warm {
            self.errors.merge(load.errors);
        }
        let (n, rounds) = (self.plan.latency, self.plan.latency_rounds);
        let no_op = async |_: &mut [Lane]| Ok(());
        latency_rounds(&self.server, &self.sidecar, &mut lanes, n, rounds, no_op).await?;
        self.finish_lanes(&mut lanes);
        Ok(())
    }

    /// tasks/get of a running task: the upstream id directly, the sidecar's id through it.
    async fn task_get_phase(&mut self) -> Result<()> {
        eprintln!("phase: tasks/get latency");
        let (direct, via) = (self.direct.clone(), self.via.clone());
        let upstream_task = running_task(&direct, &self.owner).await?;
        let sidecar_task = running_task(&via, &self.owner).await?;
        let mut lanes = vec![
            Lane::new(
                "tasks/get direct (running task)",
                false,
                &direct,
                Template::task_get(&direct, &self.owner, &upstream_task),
            ),
            Lane::new(
                "tasks/get via sidecar (running task)",
                true,
                &via,
                Template::task_get(&via, &self.owner, &sidecar_task),
            ),
        ];
        for lane in &mut lanes {
            lane.run(self.plan.warmup / 4, false).await?;
        }
        let (n, rounds) = (self.plan.latency, self.plan.latency_rounds);
        let no_op = async |_: &mut [Lane]| Ok(());
        latency_rounds(&self.server, &self.sidecar, &mut lanes, n, rounds, no_op).await?;
        self.finish_lanes(&mut lanes);
        Ok(())
    }

    /// Task creation: slow_compute with seconds 0. Through the sidecar each creation reserves
    /// a slot and commits the row durably; after each round the new tasks are polled to
    /// completion (unmeasured), so at most one round's tasks are active in the ledger.
    async fn create_phase(&mut self) -> Result<()> {
        eprintln!("phase: task creation latency");
        let (direct, via, owner) = (self.direct.clone(), self.via.clone(), self.owner.clone());
        let create =
            |e: &Endpoint| Template::tool_call(e, &owner, TASK_TOOL, json!({"seconds": 0}), true);
        let mut lanes = vec![
            Lane::new("task creation direct", false, &direct, create(&direct)),
            Lane::new(
                "task creation via sidecar (durable)",
                true,
                &via,
                create(&via),
            ),
        ];
        lanes[1].collect_task_ids = true;
        let mut settle_errors = Errors::default();
        let mut settle_round = async |lanes: &mut [Lane]| {
            let ids = std::mem::take(&mut lanes[1].task_ids);
            settle(&via, &owner, &ids, &mut settle_errors).await
        };
        for lane in lanes.iter_mut() {
            lane.run(self.plan.warmup / 10, false).await?;
        }
        settle_round(&mut lanes).await?;
        let (n, rounds) = (self.plan.create, self.plan.create_rounds);
        latency_rounds(
            &self.server,
            &self.sidecar,
            &mut lanes,
            n,
            rounds,
            &mut settle_round,
        )
        .await?;
        self.errors.merge(settle_errors);
        self.finish_lanes(&mut lanes);
        Ok(())
    }

    /// Closed loop on `connections` connections, alternating endpoints.
    async fn throughput_phase(&mut self) -> Result<Vec<LoadResult>> {
        eprintln!("phase: throughput");
        let (direct, via) = (self.direct.clone(), self.via.clone());
        let load = |name| Load {
            name,
            ..Load::default()
        };
        // Forwarded polls under load too: their CPU is what the wire translation saves.
        let upstream_task = running_task(&direct, &self.owner).await?;
        let sidecar_task = running_task(&via, &self.owner).await?;
        let mut loads = [
            (
                direct.clone(),
                self.greet(&direct, &self.owner),
                load(GREET_DIRECT),
            ),
            (via.clone(), self.greet(&via, &self.owner), load(GREET_VIA)),
            (
                direct.clone(),
                Template::task_get(&direct, &self.owner, &upstream_task),
                load(POLL_DIRECT),
            ),
            (
                via.clone(),
                Template::task_get(&via, &self.owner, &sidecar_task),
                load(POLL_VIA),
            ),
        ];
        let p = self.plan;
        throughput_rounds(
            &self.server,
            &self.sidecar,
            &mut loads,
            p.connections,
            p.load,
            p.load_rounds,
        )
        .await?;
        let mut throughput = Vec::new();
        for (_, _, mut load) in loads {
            throughput.push(LoadResult {
                name: format!("{} ({} conns)", load.name, p.connections),
                rps: load.rps(),
                summary: Summary::of(&mut load.samples),
                usage: load.usage,
                requests: load.requests,
                secs: load.elapsed.as_secs_f64(),
            });
            self.errors.merge(load.errors);
        }
        Ok(throughput)
    }

    /// Fills the ledger to the row target with completed tasks of many principals, then reads
    /// random completed tasks across it as their owners (timed).
    /// Listen streams directly on the server, then through the sidecar (a connection per
    /// stream), then over one HTTP/2 connection through a sidecar of its own (`listen_http2`:
    /// how to start it), so that its memory reading starts from a fresh process.
    async fn listen_phase(
        &mut self,
        keys: &Keys,
        ticks_per_sec: u64,
        listen_http2: Option<SidecarLaunch<'_>>,
    ) -> Result<ListenResult> {
        let plan = &self.plan.listen;
        eprintln!(
            "phase: listen ({} streams, {} deliveries/s)",
            plan.streams, plan.deliveries_per_sec
        );
        let principals = listen::principals_needed(plan.streams, procs::STREAMS_PER_PRINCIPAL);
        let tokens = (0..principals)
            .map(|i| {
                keys.token(
                    Algorithm::EdDSA,
                    &format!("listener-{i}"),
                    "tenant-0",
                    "client-0",
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let url = |e: &Endpoint| format!("http://{}{}", e.addr, e.path);
        let server_base = format!("http://{}", self.direct.addr);
        let lane = |name, endpoint: &Endpoint, sidecar| LaneTarget {
            name,
            url: url(endpoint),
            server_base: server_base.clone(),
            tokens: &tokens,
            sidecar,
            server: &self.server.proc,
            ticks_per_sec,
            http2: false,
        };
        let direct =
            listen::run_lane(plan, &lane("direct", &self.direct, &self.sidecar.proc)).await?;
        tokio::time::sleep(self.plan.rest).await;
        let via =
            listen::run_lane(plan, &lane("via sidecar", &self.via, &self.sidecar.proc)).await?;
        let mut via_http2 = None;
        if let Some(launch) = listen_http2 {
            tokio::time::sleep(self.plan.rest).await;
            let sidecar = launch.start(&self.server.endpoint, keys).await?;
            tokio::time::sleep(self.plan.rest).await;
            let target = LaneTarget {
                http2: true,
                ..lane("via sidecar, h2", &sidecar.endpoint, &sidecar.proc)
            };
            via_http2 = Some(listen::run_lane(plan, &target).await?);
        }
        Ok(ListenResult::new(plan.clone(), direct, via, via_http2))
    }

    async fn fill_phase(&mut self, tokens: &[String]) -> Result<(phases::Fill, Vec<u64>)> {
        eprintln!("phase: ledger fill to {} rows", self.plan.rows);
        let (rows_before, _) = ledger_rows(&self.sidecar.ledger)?;
        let missing = self.plan.rows.saturating_sub(rows_before);
        let mut fill = phases::fill(&self.via, tokens, missing, self.plan.connections).await?;
        self.errors.merge(std::mem::take(&mut fill.errors));
        let mut samples = Vec::new();
        let mut conn = Conn::connect(self.via.addr).await?;
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..self.plan.reads.min(fill.sample.len() * 4) {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let (principal, id) = &fill.sample[(rng % fill.sample.len() as u64) as usize];
            let mut t = Template::task_get(&self.via, &tokens[*principal], id);
            t.set_id(i as u64);
            let (status, ns) = client::timed(&mut conn, t.bytes()).await?;
            if client::is_success(status, conn.body()) {
                samples.push(ns);
            } else {
                let why = client::describe_failure(status, conn.body());
                self.errors.record(format!("completed read: {why}"));
            }
        }
        Ok((fill, samples))
    }
}

/// How to start one more sidecar like the bench's, in a directory of its own.
struct SidecarLaunch<'a> {
    binary: &'a Path,
    dir: &'a Path,
    env: &'a [(String, String)],
    args: &'a [String],
}

impl SidecarLaunch<'_> {
    async fn start(&self, upstream: &Endpoint, keys: &Keys) -> Result<Sidecar> {
        Sidecar::start(self.binary, self.dir, upstream, keys, self.env, self.args).await
    }
}

/// Runs every phase and gathers the results.
pub async fn measure(
    plan: &Plan,
    mode: &'static str,
    machine: Machine,
    repo: &Path,
    work: &Path,
    bins: &Binaries,
) -> Result<Results> {
    let keys = Keys::load(repo)?;
    let fill_tokens = (0..plan.fill_principals)
        .map(|i| {
            let (sub, tenant, client) = (
                format!("bench-user-{i}"),
                format!("tenant-{}", i % 8),
                format!("client-{}", i % 4),
            );
            keys.token(Algorithm::RS256, &sub, &tenant, &client)
        })
        .collect::<Result<Vec<_>>>()?;
    // How busy the machine is without us: a shared machine makes every number noisier.
    let ticks_per_sec = clock_ticks_per_sec();
    let preflight_other_cores =
        preflight_noise(plan.rest, ticks_per_sec, MachineTicks::busy_without_irq).await;
    if preflight_other_cores > 0.1 {
        eprintln!("warning: other processes use {preflight_other_cores:.2} cores: expect noise");
    }

    let server = Server::start(&bins.example, work)?;
    let upstream = server.endpoint.clone();
    let env = &bins.sidecar_env;
    // One client address opens the listen phase's streams: lift the connection caps for it.
    let caps = [
        "--max-connections",
        "4096",
        "--max-connections-per-peer",
        "4096",
    ];
    let args = caps.map(str::to_owned);
    let sidecar = Sidecar::start(&bins.lifeguard, work, &upstream, &keys, env, &args).await?;
    let mut bench = Bench {
        plan,
        direct: server.endpoint.clone(),
        via: sidecar.endpoint.clone(),
        server,
        sidecar,
        owner: keys.token(Algorithm::RS256, "bench-owner", "tenant-0", "client-0")?,
        owner_ed: keys.token(Algorithm::EdDSA, "bench-owner", "tenant-0", "client-0")?,
        errors: Errors::default(),
        latency: Vec::new(),
        added: Vec::new(),
    };
    let mut memory = Vec::new();
    tokio::time::sleep(plan.rest).await;
    let idle = bench.sidecar.proc.try_memory()?;
    memory.push(("idle, after start (no request yet)".to_owned(), idle));
    // Listen first: its memory reading must not inherit what the allocator keeps after the
    // throughput phase.
    let http2_dir = work.join("listen-http2");
    std::fs::create_dir_all(&http2_dir).context("creating the HTTP/2 listen lane's directory")?;
    let mut http2_args = args.to_vec();
    http2_args.extend(
        [
            "--client-http2",
            "on",
            "--http2-max-concurrent-streams",
            "4096",
        ]
        .map(str::to_owned),
    );
    let launch = SidecarLaunch {
        binary: &bins.lifeguard,
        dir: &http2_dir,
        env,
        args: &http2_args,
    };
    let listen = bench
        .listen_phase(&keys, ticks_per_sec, Some(launch))
        .await?;

    bench.greet_phase().await?;
    bench.task_get_phase().await?;
    bench.create_phase().await?;
    let throughput = bench.throughput_phase().await?;
    tokio::time::sleep(plan.rest).await;
    let after = bench.sidecar.proc.try_memory()?;
    memory.push((
        "idle, after the latency and throughput phases".to_owned(),
        after,
    ));

    let (fill, mut read_samples) = bench.fill_phase(&fill_tokens).await?;
    tokio::time::sleep(plan.rest).await;
    let (rows, active) = ledger_rows(&bench.sidecar.ledger)?;
    let full = bench.sidecar.proc.try_memory()?;
    memory.push((
        format!("with {rows} ledger rows ({active} active), at rest"),
        full,
    ));
    let ledger_path = bench.sidecar.ledger.clone();
    let wal = PathBuf::from(format!("{}-wal", ledger_path.display()));
    let fill_secs = fill.elapsed.as_secs_f64();
    let ledger = json!({
        "rows": rows, "active_rows": active,
        "db_bytes": file_size(&ledger_path), "wal_bytes": file_size(&wal),
        "filled_rows": fill.created, "fill_seconds": fill_secs,
        "fill_rows_per_second": fill.created as f64 / fill_secs.max(1e-9),
        "content": "completed slow_compute tasks with their results: 64 principals in 8 \
                    tenants and 4 clients, plus the bench owner's tasks",
    });
    let server_memory = bench.server.proc.try_memory()?;
    bench.sidecar.proc.check_alive()?;
    bench.server.proc.check_alive()?;
    let Bench {
        server,
        sidecar,
        errors,
        latency,
        added,
        owner,
        ..
    } = bench;
    let mut errors_total = errors;
    drop(sidecar);
    // A fresh sidecar of its own, so its memory is the attack's alone.
    let exhaustion = exhaustion::run(
        &plan.exhaustion,
        &bins.lifeguard,
        work,
        &server.endpoint,
        &keys,
        &owner,
    )
    .await?;
    errors_total.merge(exhaustion.errors.clone());
    drop(server);

    eprintln!("phase: components");
    let dir = work.join("components");
    let components = components::measure(&keys, &dir, plan.component_iterations).await?;

    eprintln!("phase: hot path in process (1, then 2 workers, twice)");
    let hot_path = crate::hot_path::measure(
        repo,
        work,
        &crate::hot_path::WORKER_COUNTS,
        plan.hot_path.as_secs_f64(),
    )?;
    for lane in &hot_path {
        if lane.errors > 0 {
            errors_total.record(format!(
                "hot path: {} of {} {} requests failed at {} workers",
                lane.errors,
                lane.errors + lane.requests,
                lane.method,
                lane.workers
            ));
            errors_total.count += lane.errors - 1;
        }
    }
    let baseline = match &plan.baseline {
        Some(path) => Some(crate::report::Baseline::read(path)?),
        None => None,
    };

    let mut targets = targets(
        &latency,
        &added,
        &throughput,
        &memory,
        rows,
        ticks_per_sec,
        baseline.as_ref(),
    );
    targets.extend(crate::report::listen_targets(&listen));
    targets.push(exhaustion.target());
    targets.extend(crate::report::hot_path_targets(&hot_path));
    if listen.lost() > 0 {
        errors_lost(&mut errors_total, listen.lost());
    }
    memory.push((
        "(example server, for comparison, at the end)".to_owned(),
        server_memory,
    ));
    let env: Vec<String> = bins
        .sidecar_env
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    Ok(Results {
        mode,
        machine,
        config: json!({"plan": plan.to_json(), "sidecar_env": env}),
        ticks_per_sec,
        latency,
        added,
        throughput,
        memory,
        ledger,
        read_pass: (!read_samples.is_empty()).then(|| Summary::of(&mut read_samples)),
        components,
        targets,
        errors: errors_total,
        listen,
        exhaustion,
        preflight_other_cores,
        hot_path,
        baseline,
    })
}

/// Records lost listen deliveries as failures of the run.
fn errors_lost(errors: &mut Errors, lost: u64) {
    errors.record(format!("listen phase: {lost} deliveries never arrived"));
    errors.count += lost - 1;
}
