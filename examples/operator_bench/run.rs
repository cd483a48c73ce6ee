//! One benchmark run, step by step: the emulator and its objects, the operator, the sidecars'
//! initial sync, the repeated measurements, and the readings around them.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use jsonwebtoken::EncodingKey;

use crate::Plan;
use crate::bench_support::machine::Machine;
use crate::bench_support::procs::{self, MachineTicks};
use crate::cluster::{self, Api, Ca, Emulator, ISSUER, OTHER_ISSUER, Operator, start_operator};
use crate::cpu::Ticks;
use crate::fleet::{self, Dial, Fleet};
use crate::measure::{AfterQuiet, Bench, Kind, Reviews, RssSampler};
use crate::report::{self, Noise, Results, Setup};
use crate::stats::{Errors, Summary, ms};

/// Waits until every McpServerPolicy has a status for its current generation.
async fn wait_policy_status(api: &Api, policies: usize, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let list = api.get(cluster::POLICIES).await?;
        let done = list["items"].as_array().map_or(0, |items| {
            items
                .iter()
                .filter(|p| {
                    p["status"]["observedGeneration"].is_i64()
                        && p["status"]["observedGeneration"] == p["metadata"]["generation"]
                })
                .count()
        });
        if done >= policies {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("only {done} of {policies} policies have a status after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Waits until every sidecar acknowledged its first snapshot; prints progress.
async fn wait_synced(fleet: &Fleet, operator: &Operator, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut report = Instant::now();
    loop {
        let synced = fleet.synced();
        if synced == fleet.size {
            return Ok(());
        }
        if report.elapsed() > Duration::from_secs(5) {
            eprintln!("  {synced} of {} sidecars synced", fleet.size);
            report = Instant::now();
        }
        if Instant::now() > deadline {
            bail!(
                "only {synced} of {} sidecars acknowledged a first snapshot within {timeout:?}; \
                 first errors: {:?}",
                fleet.size,
                fleet.first_errors()
            );
        }
        operator.proc.check_alive()?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn run(plan: &Plan, repo: &Path, work: &Path, lifeguard: &Path) -> Result<Results> {
    let machine = Machine::probe(repo);
    let ticks_per_sec = procs::clock_ticks_per_sec();
    let needed = plan.sidecars as u64 * 2 + 512;
    if let Some(limit) = procs::open_files_limit()
        && limit < needed
    {
        bail!(
            "the open files limit is {limit}; {} sidecars need about {needed} (raise it: ulimit -n)",
            plan.sidecars
        );
    }
    let load_before = procs::load_average();
    let preflight_other_cores =
        procs::preflight_noise(Duration::from_secs(1), ticks_per_sec, MachineTicks::busy).await;
    if preflight_other_cores > 0.1 {
        eprintln!("warning: other processes use {preflight_other_cores:.2} cores: expect noise");
    }
    let long = Duration::from_secs(600).max(plan.timeout);

    eprintln!("starting the API emulator and creating the objects");
    let emulator = Emulator::start(repo, work).await?;
    let t = Instant::now();
    let decoy_issuer = if plan.decoys_same_issuer {
        ISSUER
    } else {
        OTHER_ISSUER
    };
    let pods = cluster::populate(&emulator.api, plan.sidecars, plan.policies, decoy_issuer).await?;
    let objects_created = t.elapsed();

    eprintln!("starting the operator");
    let ca = Ca::mint(work)?;
    let t = Instant::now();
    let operator = start_operator(lifeguard, repo, work, &emulator, &ca, plan.sidecars).await?;
    let operator_ready = t.elapsed();
    let t = Instant::now();
    wait_policy_status(&emulator.api, plan.policies, long).await?;
    let policy_status_written = t.elapsed();

    let fleet = Fleet::new(plan.sidecars);
    let key_path = repo.join("tests/fixtures/keys/issuer-b-ed25519.pem");
    let key =
        std::fs::read(&key_path).with_context(|| format!("reading {}", key_path.display()))?;
    let tls = ca.client_config()?;
    let mut bench = Bench {
        api: &emulator.api,
        operator: &operator,
        emulator_pid: emulator.proc.pid,
        fleet: &fleet,
        ticks_per_sec,
        timeout: plan.timeout,
        rest: plan.rest,
        set_key: EncodingKey::from_ed_pem(&key).context("the transmitter key")?,
        https: reqwest::Client::builder()
            .tls_backend_preconfigured(tls.clone())
            .build()?,
        poll_index: 0,
        tag: std::process::id().to_string(),
    };
    bench.quiesce().await?;
    let mut memory = vec![(
        format!(
            "operator after start: {} policies, no sidecar",
            plan.policies
        ),
        operator.proc.memory(),
    )];

    eprintln!(
        "connecting {} sidecars, {} at a time",
        plan.sidecars, plan.connect_parallel
    );
    let launched = Instant::now();
    let dial = Dial {
        operator: operator.url.clone(),
        tls,
    };
    let tasks = fleet::launch(&fleet, &pods, &dial, plan.connect_parallel)?;
    wait_synced(&fleet, &operator, long).await?;
    let (each, last_first_ack) = fleet.initial_sync();
    let initial_sync = last_first_ack.map_or(Duration::ZERO, |l| l.duration_since(launched));
    let bench_synced = async {
        let deadline = Instant::now() + long;
        while Instant::now() < deadline {
            let o = emulator.api.get(&cluster::bench_policy_path()).await?;
            if o["status"]["sidecarsInSync"].as_u64() == Some(plan.sidecars as u64) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        bail!("the bench policy's status never counted every sidecar in sync")
    };
    bench_synced.await?;
    let mut errors = Errors::default();
    let connected = operator
        .metric("lifeguard_operator_sidecars_connected")
        .await;
    if connected as usize != plan.sidecars {
        errors.record(format!(
            "the operator counts {connected} connected sidecars, not {}",
            plan.sidecars
        ));
    }
    // Let the operator finish, then read its memory at rest.
    bench.quiesce().await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let at_rest = operator.proc.memory();
    memory.push((
        format!(
            "operator at rest: {} sidecars connected, {} policies",
            plan.sidecars, plan.policies
        ),
        at_rest,
    ));

    eprintln!("measuring: {} runs of each measurement", plan.runs);
    let memory_guard_mib = (machine.mem_total_kib as f64 / 1024.0 / 3.0).max(2048.0);
    let reviews_before = Reviews::scrape(&emulator, &operator).await?;
    let sampler = RssSampler::start(operator.proc.pid);
    let runs_start = Ticks::take(operator.proc.pid, emulator.proc.pid);
    let runs_started = Instant::now();
    let mut records = Vec::new();
    let mut consecutive_failures = 0;
    'runs: for run in 0..plan.runs {
        let mut line = format!("  run {}/{}:", run + 1, plan.runs);
        for kind in Kind::ALL {
            match bench.measure(kind, run).await {
                Ok(record) => {
                    line.push_str(&format!(" {:.1} ms", ms(record.to_last_ack)));
                    records.push(record);
                    consecutive_failures = 0;
                }
                Err(e) => {
                    errors.record(format!("run {run}, {}: {e:#}", kind.label()));
                    line.push_str(" failed");
                    consecutive_failures += 1;
                    if consecutive_failures >= 3 {
                        eprintln!("{line}\n  three failures in a row: stopping the runs");
                        break 'runs;
                    }
                    let _ = bench.quiesce().await;
                }
            }
        }
        eprintln!("{line}  (revocation, SET, spec change → last ack)");
        operator.proc.check_alive()?;
        emulator.proc.check_alive()?;
        // The emulator keeps every version of every object: a long run of status writes can
        // outgrow the machine.
        let emulator_mib = emulator.proc.memory().rss_mib();
        if emulator_mib > memory_guard_mib {
            errors.record(format!(
                "the API emulator holds {emulator_mib:.0} MiB (every object version it ever \
                 stored): stopping after run {} to spare the machine",
                run + 1
            ));
            break;
        }
    }
    let runs_cpu = runs_start.until(
        &Ticks::take(operator.proc.pid, emulator.proc.pid),
        ticks_per_sec,
    );
    let runs_secs = runs_started.elapsed().as_secs_f64();
    let peak_rss_kib = sampler.finish().await;
    let reviews = Reviews::scrape(&emulator, &operator)
        .await?
        .minus(&reviews_before);
    let after_quiet = if plan.quiet.is_zero() {
        None
    } else {
        eprintln!(
            "quiet: {} s without a change, then one more revocation",
            plan.quiet.as_secs()
        );
        tokio::time::sleep(plan.quiet).await;
        let before = Reviews::scrape(&emulator, &operator).await?;
        match bench.measure(Kind::Revocation, plan.runs).await {
            Ok(record) => Some(AfterQuiet {
                quiet: plan.quiet,
                to_last_ack: record.to_last_ack,
                reviews: Reviews::scrape(&emulator, &operator).await?.minus(&before),
            }),
            Err(e) => {
                errors.record(format!("the revocation after the quiet spell: {e:#}"));
                None
            }
        }
    };
    memory.push(("operator at the end".into(), operator.proc.memory()));
    memory.push((
        "API emulator (Python) at the end".into(),
        emulator.proc.memory(),
    ));
    for task in &tasks {
        task.abort();
    }
    let noise = Noise {
        load_before,
        load_after: procs::load_average(),
        preflight_other_cores,
        runs_other_cores: runs_cpu.other / runs_secs.max(1e-9),
    };
    let setup = Setup {
        sidecars: plan.sidecars,
        policies: plan.policies,
        runs: plan.runs,
        connect_parallel: plan.connect_parallel,
        decoys_same_issuer: plan.decoys_same_issuer,
        timeout: plan.timeout,
        objects_created,
        operator_ready,
        policy_status_written,
        initial_sync,
        dial_to_first_ack: Summary::of(&each),
    };
    let targets = report::targets(
        &records,
        &setup,
        &at_rest,
        peak_rss_kib,
        after_quiet.as_ref(),
    );
    let fleet_counters = fleet.counters();
    Ok(Results {
        mode: plan.mode,
        machine,
        setup,
        noise,
        records,
        memory,
        peak_rss_kib,
        fleet: fleet_counters,
        reviews,
        after_quiet,
        targets,
        errors,
    })
}
