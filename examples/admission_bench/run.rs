//! One benchmark run, step by step: the emulator and its objects, the webhook, the load, and
//! the readings around the measured window (the webhook's memory, everyone's CPU, the
//! webhook's own handler-time histogram).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::Plan;
use crate::bench_support::machine::Machine;
use crate::bench_support::procs::{self, MachineTicks, Memory};
use crate::components;
use crate::harness::{Ca, Emulator};
use crate::load::{self, Sample};
use crate::report::{self, Latency, Noise, Resources, Results, Setup};
use crate::reviews::{self, Endpoint, Kind};
use crate::world::{self, Webhook, start_webhook};

/// CPU ticks of the processes that matter and of the machine, and the webhook's handler
/// histogram, at one moment.
#[derive(Clone, Debug, Default)]
struct Reading {
    webhook: u64,
    emulator: u64,
    bench: u64,
    machine: u64,
    handler: BTreeMap<Endpoint, (f64, f64)>,
}

impl Reading {
    async fn take(webhook: &Webhook, emulator_pid: u32) -> Self {
        let mut handler = BTreeMap::new();
        for e in Endpoint::ALL {
            handler.insert(e, webhook.handler_seconds(e.metric_label()).await);
        }
        Self {
            webhook: webhook.proc.cpu_ticks(),
            emulator: procs::cpu_ticks(&format!("/proc/{emulator_pid}/stat")),
            bench: procs::cpu_ticks("/proc/self/stat"),
            machine: MachineTicks::read().busy(),
            handler,
        }
    }
}

/// The webhook's VmRSS every 100 ms while the load runs.
struct RssTrace {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<(Instant, u64)>>,
}

impl RssTrace {
    fn start(pid: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let halt = stop.clone();
        let task = tokio::spawn(async move {
            let mut trace = Vec::new();
            while !halt.load(Ordering::Relaxed) {
                trace.push((Instant::now(), Memory::read(pid).rss_kib));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            trace
        });
        Self { stop, task }
    }

    async fn finish(self) -> Vec<(Instant, u64)> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or_default()
    }
}

pub async fn run(plan: &Plan, repo: &Path, work: &Path, lifeguard: &Path) -> Result<Results> {
    let machine = Machine::probe(repo);
    let ticks_per_sec = procs::clock_ticks_per_sec();
    let load_before = procs::load_average();
    let preflight_other_cores =
        procs::preflight_noise(Duration::from_secs(1), ticks_per_sec, MachineTicks::busy).await;
    if preflight_other_cores > 0.1 {
        eprintln!("warning: other processes use {preflight_other_cores:.2} cores: expect noise");
    }

    eprintln!("starting the API emulator and creating the objects");
    let emulator = Emulator::start(repo, work).await?;
    let t = Instant::now();
    world::populate(&emulator.api, repo, plan.policies).await?;
    let objects_created = t.elapsed();
    let exception_spec = Arc::new(world::signed_exception_spec(repo)?);

    eprintln!("starting the webhook");
    let ca = Ca::mint(work)?;
    let t = Instant::now();
    let webhook = start_webhook(lifeguard, work, &emulator, &ca).await?;
    let webhook_ready = t.elapsed();
    let port: u16 = webhook
        .url
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .context("the webhook's port")?;
    let client = load::client(ca.client_config()?, plan.schedule.timeout)?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = webhook.proc.memory();

    let schedule = &plan.schedule;
    eprintln!(
        "load: {} req/s, {:.0} s warm-up, {:.0} s measured ({} requests)",
        schedule.rate,
        schedule.warmup.as_secs_f64(),
        schedule.duration.as_secs_f64(),
        schedule.total_requests()
    );
    let start = Instant::now() + Duration::from_millis(200);
    let (measured_start, measured_end) = schedule.window(start);
    let trace = RssTrace::start(webhook.proc.pid);
    let emulator_pid = emulator.proc.pid;
    let window = async {
        tokio::time::sleep_until(measured_start.into()).await;
        let first = Reading::take(&webhook, emulator_pid).await;
        tokio::time::sleep_until(measured_end.into()).await;
        let last = Reading::take(&webhook, emulator_pid).await;
        let connections = load::established_to(port);
        (first, last, connections)
    };
    // `client` outlives the load so its idle connections are still open to be counted.
    let driving = load::drive(
        schedule,
        start,
        client.clone(),
        &webhook.url,
        exception_spec.clone(),
    );
    let (samples, (first, last, connections)) = tokio::join!(driving, window);
    let samples = samples?;
    drop(client);
    let trace = trace.finish().await;
    let end = webhook.proc.memory();
    webhook.proc.check_alive()?;
    emulator.proc.check_alive()?;

    let secs = |a: u64, b: u64| b.saturating_sub(a) as f64 / ticks_per_sec.max(1) as f64;
    let window_secs = measured_end
        .saturating_duration_since(measured_start)
        .as_secs_f64()
        .max(1e-9);
    let webhook_cpu = secs(first.webhook, last.webhook);
    let emulator_cpu = secs(first.emulator, last.emulator);
    let bench_cpu = secs(first.bench, last.bench);
    let machine_cpu = secs(first.machine, last.machine);
    let in_window: Vec<u64> = trace
        .iter()
        .filter(|(t, _)| *t >= measured_start && *t <= measured_end)
        .map(|(_, kib)| *kib)
        .collect();
    let resources = Resources {
        rss_idle_kib: idle.rss_kib,
        rss_peak_kib: trace.iter().map(|(_, k)| *k).max().unwrap_or(0),
        rss_mean_kib: in_window.iter().sum::<u64>() / (in_window.len().max(1) as u64),
        rss_end_kib: end.rss_kib,
        hwm_end_kib: end.hwm_kib,
        threads: end.threads,
        webhook_cores: webhook_cpu / window_secs,
        emulator_cores: emulator_cpu / window_secs,
        bench_cores: bench_cpu / window_secs,
        other_cores: (machine_cpu - webhook_cpu - emulator_cpu - bench_cpu).max(0.0) / window_secs,
        connections,
    };
    let handler_mean = Endpoint::ALL
        .into_iter()
        .map(|e| {
            let (s0, c0) = first.handler.get(&e).copied().unwrap_or_default();
            let (s1, c1) = last.handler.get(&e).copied().unwrap_or_default();
            let mean = if c1 > c0 { (s1 - s0) / (c1 - c0) } else { 0.0 };
            (e, Duration::from_secs_f64(mean.max(0.0)))
        })
        .collect();

    eprintln!("timing the webhook's work in process");
    let components = components::measure(
        repo,
        plan.policies,
        &exception_spec,
        plan.component_iterations,
    )?;

    let pod = reviews::pod(Kind::PodInjected, 0);
    let setup = Setup {
        rate: schedule.rate,
        warmup: schedule.warmup,
        duration: schedule.duration,
        policies: plan.policies,
        pod_bytes: serde_json::to_vec(&pod)?.len(),
        pod_review_bytes: serde_json::to_vec(&reviews::review(
            Kind::PodInjected,
            0,
            &exception_spec,
        ))?
        .len(),
        objects_created,
        webhook_ready,
    };
    Ok(results(
        plan,
        machine,
        setup,
        Noise {
            load_before,
            load_after: procs::load_average(),
            preflight_other_cores,
        },
        &samples,
        measured_start,
        handler_mean,
        resources,
        components,
    ))
}

#[allow(clippy::too_many_arguments)]
fn results(
    plan: &Plan,
    machine: Machine,
    setup: Setup,
    noise: Noise,
    samples: &[Sample],
    measured_start: Instant,
    handler_mean: BTreeMap<Endpoint, Duration>,
    resources: Resources,
    components: Vec<(&'static str, Latency)>,
) -> Results {
    let report::Summaries {
        per_kind,
        per_endpoint,
        overall,
        lag,
        sent_to_answer,
        errors,
    } = report::summarize(samples);
    let measured: Vec<&Sample> = samples.iter().filter(|s| s.measured).collect();
    let last_answer = measured
        .iter()
        .map(|s| s.finished)
        .max()
        .unwrap_or(measured_start);
    let span = last_answer
        .saturating_duration_since(measured_start)
        .as_secs_f64();
    let achieved_rate = if span > 0.0 {
        measured.len() as f64 / span
    } else {
        0.0
    };
    let target = report::target(&overall, &setup, plan.mode, machine.build);
    Results {
        mode: plan.mode,
        machine,
        setup,
        noise,
        per_kind,
        per_endpoint,
        overall,
        lag,
        sent_to_answer,
        sent: samples.len() as u64,
        checked: samples.iter().filter(|s| s.version.is_some()).count() as u64,
        measured: measured.len() as u64,
        achieved_rate,
        versions: load::versions(samples),
        handler_mean,
        resources,
        components,
        target,
        errors,
    }
}
