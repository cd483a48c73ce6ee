//! `--rate-limits`: whether request-rate limits keep one principal's flood from another, what a
//! refusal costs, and how closely replicas on PostgreSQL hold a limit together (issue 33).
//!
//! Three parts, all on `tools/call` of `greet`, all paced (a fixed rate on a few connections,
//! whatever an answer costs):
//!
//! 1. **Isolation.** One sidecar whose policy limits each principal to `limit` calls a second
//!    (burst the same). A *quiet* principal sends half its limit; in interleaved rounds it does
//!    so alone and beside a *flooding* principal that sends ten times the limit. The quiet
//!    principal's calls must all succeed both ways, at the same rate, with the same median
//!    latency (within [`QUIET_P50_LIMIT`]); the flood's admitted calls must stay within the
//!    bucket (`burst + limit × seconds`: the memory bucket is exact).
//! 2. **CPU per refusal.** Three sidecars of the same binary that differ only in their limit:
//!    none, one no call reaches (the check runs and allows), and one every call after the first
//!    exceeds (the check refuses). The same paced load on each in interleaved rounds; the
//!    sidecar's CPU per answered call (all threads, /proc/PID/stat). A refused call must cost
//!    no more than an allowed `greet`.
//! 3. **Three replicas on PostgreSQL.** Three example servers behind three sidecars sharing one
//!    database (a database of the bench's own on `--postgres`) and one per-principal bucket; one
//!    principal sends ten times the limit spread over the three. Per round, from a full bucket,
//!    the admitted calls must stay within the accuracy docs/sidecar.md states: at most
//!    `burst + limit × (T + 0.25 s)`, and under steady traffic no fewer than
//!    [`SHARED_LOWER_FRACTION`] of `burst + limit × T`.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use jsonwebtoken::Algorithm;
use serde_json::{Value, json};

use crate::bench_support::postgres::Database;
use crate::bench_support::procs::{MachineTicks, clock_ticks_per_sec, preflight_noise};
use crate::client::Template;
use crate::phases::{Accept, Load, paced};
use crate::procs::{Keys, Server, Sidecar, replica_args};
use crate::rate_limit_report::{CpuLane, RateResult, SharedRound};
use crate::report::Machine;
use crate::run::Binaries;
use crate::stats::{Errors, Summary};

/// The quiet principal's median latency beside the flood, at most this many times its median
/// alone ("unchanged": within the round-to-round noise of this machine at such rates).
pub const QUIET_P50_LIMIT: f64 = 1.2;
/// The shared bucket admits, from a full bucket under steady traffic, at least this fraction of
/// `burst + limit × T` (the batches replicas hold unspent when a window ends are the rest).
pub const SHARED_LOWER_FRACTION: f64 = 0.95;
/// How long a replica may spend a batch it took from the shared bucket (`shared::LEASE`).
pub const LEASE_SECS: f64 = 0.25;
/// The flood's rate, in multiples of the limit.
pub const FLOOD_FACTOR: f64 = 10.0;

/// The sidecars of the CPU part.
pub const NO_LIMIT: &str = "no limit";
pub const ALLOWING: &str = "limit never reached";
pub const REFUSING: &str = "limit exceeded";

/// Sizes of the lane.
pub struct RatePlan {
    pub rounds: usize,
    /// Measured per round, per configuration.
    pub round: Duration,
    /// The per-principal limit (requests per second, and the burst) of parts 1 and 3.
    pub limit: f64,
    /// Calls per second of part 2.
    pub cpu_rate: f64,
    /// Rounds of part 3 (each from a full bucket).
    pub shared_rounds: usize,
    pub shared_round: Duration,
    /// The PostgreSQL server where part 3 creates its database.
    pub postgres: String,
    pub smoke: bool,
}

impl RatePlan {
    pub fn new(smoke: bool, postgres: String) -> Self {
        let secs = |full: f64, tiny: f64| Duration::from_secs_f64(if smoke { tiny } else { full });
        Self {
            rounds: if smoke { 2 } else { 6 },
            round: secs(5.0, 0.5),
            limit: if smoke { 20.0 } else { 100.0 },
            cpu_rate: if smoke { 200.0 } else { 2_000.0 },
            shared_rounds: if smoke { 1 } else { 3 },
            shared_round: secs(10.0, 1.0),
            postgres,
            smoke,
        }
    }

    /// The quiet principal's rate: half its limit.
    pub fn quiet_rate(&self) -> f64 {
        self.limit / 2.0
    }

    pub fn flood_rate(&self) -> f64 {
        self.limit * FLOOD_FACTOR
    }

    pub(crate) fn to_json(&self) -> Value {
        json!({
            "rounds": self.rounds, "round_seconds": self.round.as_secs_f64(),
            "limit_per_second": self.limit, "burst": self.limit,
            "quiet_rate_per_second": self.quiet_rate(), "flood_rate_per_second": self.flood_rate(),
            "cpu_rate_per_second": self.cpu_rate, "cpu_connections": CPU_CONNECTIONS,
            "shared_rounds": self.shared_rounds,
            "shared_round_seconds": self.shared_round.as_secs_f64(),
        })
    }
}

/// Connections of each load.
const QUIET_CONNECTIONS: usize = 2;
const FLOOD_CONNECTIONS: usize = 8;
const CPU_CONNECTIONS: usize = 8;
/// Connections per replica of part 3.
const SHARED_CONNECTIONS: usize = 4;

/// `rateLimits` of a policy limiting each principal to `rate` calls a second, burst the same
/// (rounded up to a whole call).
fn per_principal(rate: f64) -> String {
    let burst = rate.ceil().max(1.0);
    format!("  rateLimits:\n    perPrincipal: {{requestsPerSecond: {rate}, burst: {burst}}}\n")
}

fn greet(sidecar: &Sidecar, token: &str) -> Template {
    Template::tool_call(
        &sidecar.endpoint,
        token,
        "greet",
        json!({"name": "bench"}),
        false,
    )
}

/// Moves `load`'s failures to `errors`, each named after `what`; returns how many there were.
fn collect(errors: &mut Errors, what: &str, load: &mut Load) -> u64 {
    let errs = std::mem::take(&mut load.errors);
    let count = errs.count;
    if errs.count > 0 {
        let mut named = Errors::default();
        for e in &errs.examples {
            named.record(format!("{what}: {e}"));
        }
        named.count = errs.count;
        errors.merge(named);
    }
    count
}

fn dir(work: &std::path::Path, name: &str) -> Result<std::path::PathBuf> {
    let d = work.join(name);
    std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    Ok(d)
}

/// What part 1 measured.
pub struct Isolation {
    pub quiet_alone: Load,
    pub quiet_beside: Load,
    /// The flood: successes are the admitted calls, `refused` the 429s.
    pub flood: Load,
    /// The flood's admitted calls at most: `burst + limit × its seconds`, over its rounds.
    pub flood_bound: f64,
    /// The quiet principal's latency alone and beside the flood.
    pub quiet_alone_latency: Summary,
    pub quiet_beside_latency: Summary,
}

async fn isolation(
    plan: &RatePlan,
    binary_dirs: (&Binaries, &std::path::Path),
    keys: &Keys,
    server: &Server,
    errors: &mut Errors,
) -> Result<Isolation> {
    let (bins, work) = binary_dirs;
    eprintln!("phase: rate limits, isolation");
    let sidecar = Sidecar::start_with(
        &bins.lifeguard,
        &dir(work, "rates-isolation")?,
        &server.endpoint,
        keys,
        &bins.sidecar_env,
        &[],
        &per_principal(plan.limit),
    )
    .await
    .context("starting the rate-limited sidecar")?;
    let quiet = greet(
        &sidecar,
        &keys.token(Algorithm::EdDSA, "bench-quiet", "t", "c")?,
    );
    let flood = greet(
        &sidecar,
        &keys.token(Algorithm::EdDSA, "bench-flood", "t", "c")?,
    );
    let e = &sidecar.endpoint;
    let (mut alone, mut beside, mut flooded) = (Load::default(), Load::default(), Load::default());
    let mut flood_secs = 0.0;
    let mut flood_rounds = 0;
    // A warm-up round of each, unmeasured.
    let warm = plan.round.min(Duration::from_secs(1));
    for (round, measured) in (0..=plan.rounds).map(|r| (r, r > 0)) {
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        let span = if measured { plan.round } else { warm };
        for with_flood in order {
            let (mut q, mut f) = (Load::default(), Load::default());
            let accept = Accept::RateLimited;
            let quiet_run = paced(
                e,
                &quiet,
                QUIET_CONNECTIONS,
                plan.quiet_rate(),
                span,
                accept,
                &mut q,
            );
            if with_flood {
                let flood_run = paced(
                    e,
                    &flood,
                    FLOOD_CONNECTIONS,
                    plan.flood_rate(),
                    span,
                    accept,
                    &mut f,
                );
                let (a, b) = tokio::join!(quiet_run, flood_run);
                a?;
                b?;
                let _ = collect(errors, "flood", &mut f);
                if measured {
                    flood_secs += f.elapsed.as_secs_f64();
                    flood_rounds += 1;
                    flooded.add_round(&mut f);
                }
            } else {
                quiet_run.await?;
            }
            let failed = collect(errors, "quiet", &mut q);
            if measured {
                let into = if with_flood { &mut beside } else { &mut alone };
                into.errors.count += failed;
                into.add_round(&mut q);
            }
        }
        // The flood's bucket refills before the next round: each round starts from the same
        // state (a full bucket), so its bound is exact.
        tokio::time::sleep(Duration::from_secs_f64(
            plan.limit.ceil() / plan.limit + 0.1,
        ))
        .await;
    }
    sidecar.proc.check_alive()?;
    Ok(Isolation {
        quiet_alone_latency: Summary::of(&mut alone.samples),
        quiet_beside_latency: Summary::of(&mut beside.samples),
        flood_bound: plan.limit.ceil() * flood_rounds as f64 + plan.limit * flood_secs,
        quiet_alone: alone,
        quiet_beside: beside,
        flood: flooded,
    })
}

async fn cpu(
    plan: &RatePlan,
    binary_dirs: (&Binaries, &std::path::Path),
    keys: &Keys,
    server: &Server,
    errors: &mut Errors,
) -> Result<Vec<CpuLane>> {
    let (bins, work) = binary_dirs;
    eprintln!("phase: rate limits, CPU per allowed and refused call");
    let configs = [
        (NO_LIMIT, String::new()),
        (ALLOWING, per_principal(1_000_000.0)),
        (REFUSING, per_principal(0.001)),
    ];
    let token = keys.token(Algorithm::EdDSA, "bench-cpu", "t", "c")?;
    let mut sidecars = Vec::new();
    for (i, (name, spec)) in configs.iter().enumerate() {
        let sidecar = Sidecar::start_with(
            &bins.lifeguard,
            &dir(work, &format!("rates-cpu-{i}"))?,
            &server.endpoint,
            keys,
            &bins.sidecar_env,
            &[],
            spec,
        )
        .await
        .with_context(|| format!("starting the sidecar `{name}`"))?;
        sidecars.push((*name, sidecar));
    }
    let mut lanes: Vec<CpuLane> = configs
        .iter()
        .map(|(name, _)| CpuLane {
            config: name,
            load: Load::default(),
            ticks: 0,
            rounds: Vec::new(),
        })
        .collect();
    let warm = plan.round.min(Duration::from_secs(1));
    for round in 0..=plan.rounds {
        let measured = round > 0;
        let order: Vec<usize> = if round % 2 == 0 {
            (0..sidecars.len()).collect()
        } else {
            (0..sidecars.len()).rev().collect()
        };
        for i in order {
            let (name, sidecar) = &sidecars[i];
            let template = greet(sidecar, &token);
            let span = if measured { plan.round } else { warm };
            let before = sidecar.proc.cpu_ticks();
            let mut l = Load::default();
            let (e, rate, accept) = (&sidecar.endpoint, plan.cpu_rate, Accept::RateLimited);
            paced(e, &template, CPU_CONNECTIONS, rate, span, accept, &mut l).await?;
            let ticks = sidecar.proc.cpu_ticks().saturating_sub(before);
            let _ = collect(errors, name, &mut l);
            if measured {
                let lane = &mut lanes[i];
                lane.ticks += ticks;
                lane.rounds.push((l.answered(), ticks));
                lane.load.add_round(&mut l);
            }
        }
    }
    for (name, sidecar) in &sidecars {
        sidecar.proc.check_alive()?;
        let lane = lanes.iter().find(|l| l.config == *name).expect("a lane");
        // Each sidecar answered as its limit says, or its CPU is not what the lane is about.
        let wrong = match *name {
            REFUSING => lane.load.requests > 1,
            _ => !lane.load.refused.is_empty(),
        };
        if wrong {
            bail!(
                "the sidecar `{name}` admitted {} and refused {} calls: not what its limit says",
                lane.load.requests,
                lane.load.refused.len()
            );
        }
    }
    Ok(lanes)
}

async fn shared(
    plan: &RatePlan,
    binary_dirs: (&Binaries, &std::path::Path),
    keys: &Keys,
    errors: &mut Errors,
) -> Result<(Vec<SharedRound>, f64)> {
    let (bins, work) = binary_dirs;
    eprintln!("phase: rate limits, three replicas on PostgreSQL");
    let database = Database::create(&plan.postgres, "rates").await?;
    let outcome = shared_on(plan, bins, work, keys, &database.url, errors).await;
    database.drop_now().await;
    outcome
}

async fn shared_on(
    plan: &RatePlan,
    bins: &Binaries,
    work: &std::path::Path,
    keys: &Keys,
    ledger: &str,
    errors: &mut Errors,
) -> Result<(Vec<SharedRound>, f64)> {
    let mut servers = Vec::new();
    let mut replicas = Vec::new();
    for i in 0..3 {
        let d = dir(work, &format!("rates-r{i}"))?;
        let server = Server::start(&bins.example, &d)?;
        let sidecar = Sidecar::start_with(
            &bins.lifeguard,
            &d,
            &server.endpoint,
            keys,
            &bins.sidecar_env,
            &replica_args(ledger, i),
            &per_principal(plan.limit),
        )
        .await
        .with_context(|| format!("starting replica r{i}"))?;
        servers.push(server);
        replicas.push(sidecar);
    }
    let token = keys.token(Algorithm::EdDSA, "bench-shared", "t", "c")?;
    let templates: Vec<Template> = replicas.iter().map(|r| greet(r, &token)).collect();
    let refill = Duration::from_secs_f64(plan.limit.ceil() / plan.limit + LEASE_SECS + 0.5);
    let mut rounds = Vec::new();
    for _ in 0..plan.shared_rounds {
        // From a full bucket, with every lease of the round before ended.
        tokio::time::sleep(refill).await;
        let mut loads: Vec<Load> = (0..replicas.len()).map(|_| Load::default()).collect();
        let rate = plan.flood_rate() / replicas.len() as f64;
        let started = Instant::now();
        let sends = replicas
            .iter()
            .zip(&templates)
            .zip(loads.iter_mut())
            .map(|((r, t), l)| {
                let (n, span, accept) =
                    (SHARED_CONNECTIONS, plan.shared_round, Accept::RateLimited);
                paced(&r.endpoint, t, n, rate, span, accept, l)
            });
        for outcome in futures_util::future::join_all(sends).await {
            outcome?;
        }
        let secs = started.elapsed().as_secs_f64();
        let mut round = SharedRound {
            secs,
            admitted: 0,
            refused: 0,
            per_replica: Vec::new(),
        };
        for (i, l) in loads.iter_mut().enumerate() {
            let _ = collect(errors, &format!("replica r{i}"), l);
            round.admitted += l.requests;
            round.refused += l.refused.len() as u64;
            round.per_replica.push(l.requests);
        }
        rounds.push(round);
    }
    let mut fallbacks = 0.0;
    for r in &replicas {
        r.proc.check_alive()?;
        fallbacks += r
            .series("lifeguard_errors_total{reason=\"rate_limit_store\"}")
            .await?;
    }
    for s in &servers {
        s.proc.check_alive()?;
    }
    Ok((rounds, fallbacks))
}

/// Runs the lane.
pub async fn run(
    plan: RatePlan,
    mode: &'static str,
    machine: Machine,
    repo: &std::path::Path,
    work: &std::path::Path,
    bins: &Binaries,
) -> Result<RateResult> {
    let keys = Keys::load(repo)?;
    let ticks_per_sec = clock_ticks_per_sec();
    let rest = Duration::from_secs_f64(if plan.smoke { 0.3 } else { 2.0 });
    let preflight_other_cores =
        preflight_noise(rest, ticks_per_sec, MachineTicks::busy_without_irq).await;
    if preflight_other_cores > 0.1 {
        eprintln!("warning: other processes use {preflight_other_cores:.2} cores: expect noise");
    }
    let server = Server::start(&bins.example, &dir(work, "rates-server")?)?;
    let mut errors = Errors::default();
    let isolation = isolation(&plan, (bins, work), &keys, &server, &mut errors).await?;
    let cpu = cpu(&plan, (bins, work), &keys, &server, &mut errors).await?;
    server.proc.check_alive()?;
    let (shared, fallbacks) = shared(&plan, (bins, work), &keys, &mut errors).await?;
    Ok(RateResult {
        mode,
        machine,
        plan,
        ticks_per_sec,
        preflight_other_cores,
        isolation,
        cpu,
        shared,
        shared_fallbacks: fallbacks,
        errors,
    })
}
