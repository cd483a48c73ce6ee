//! `--soak`: does the sidecar's memory stay flat under sustained load?
//!
//! The example server and a sidecar in front of it, as in the main run. First the maximum
//! throughput through the sidecar is measured (closed loop, 32 connections, 10 s of `greet`);
//! then the sidecar is held at a fraction of it (80 % by default) for the soak duration (10
//! minutes by default) by 32 connections that each send on a fixed schedule, while a task's
//! owner polls a running task every 10 ms and a listen stream stays open. The sidecar's VmRSS
//! is read every second. The soak passes when no request failed and RSS stayed flat: after the
//! first minute (allocator and pools warming up) it never rises more than [`FLAT_BOUND_MIB`]
//! above the first minute's peak.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use jsonwebtoken::Algorithm;
use serde_json::{Value, json};

use crate::client::{Conn, Endpoint, Template, describe_failure, is_success};
use crate::phases::{Load, closed_loop};
use crate::procs::{Keys, Server, Sidecar, TASK_TOOL};
use crate::report::Target;
use crate::run::Binaries;
use crate::stats::Errors;

/// How far RSS may rise above the first minute's peak and still be "flat".
pub const FLAT_BOUND_MIB: f64 = 4.0;
/// Connections of the paced load (and of the maximum-throughput measurement).
const CONNECTIONS: usize = 32;

pub struct SoakPlan {
    pub duration: Duration,
    pub fraction: f64,
    /// Closed-loop seconds that measure the maximum.
    pub probe: Duration,
    /// The warm-up excluded from the flatness check.
    pub warmup: Duration,
}

pub struct SoakResult {
    pub plan_fraction: f64,
    pub max_rps: f64,
    pub target_rps: f64,
    pub achieved_rps: f64,
    pub requests: u64,
    pub polls: u64,
    pub errors: Errors,
    /// (seconds since the soak started, VmRSS KiB)
    pub rss: Vec<(f64, u64)>,
    pub warmup_secs: f64,
}

impl SoakResult {
    fn mib(kib: u64) -> f64 {
        kib as f64 / 1024.0
    }

    /// Peak RSS of the warm-up minute and after it, MiB.
    pub fn peaks(&self) -> (f64, f64) {
        let peak = |after_warmup: bool| {
            self.rss
                .iter()
                .filter(|(t, _)| (*t >= self.warmup_secs) == after_warmup)
                .map(|(_, kib)| Self::mib(*kib))
                .fold(0.0, f64::max)
        };
        (peak(false), peak(true))
    }

    pub fn targets(&self) -> Vec<Target> {
        let (warm, after) = self.peaks();
        vec![
            Target {
                name: "soak: sidecar VmRSS rise after the first minute".into(),
                measured: after - warm,
                limit: FLAT_BOUND_MIB,
                unit: "MiB",
                at_least: false,
                not_applicable: None,
            },
            Target {
                name: "soak: failed requests".into(),
                measured: self.errors.count as f64,
                limit: 0.0,
                unit: "",
                at_least: false,
                not_applicable: None,
            },
            Target {
                name: "soak: achieved rate / planned rate".into(),
                measured: self.achieved_rps / self.target_rps.max(1e-9),
                limit: 0.95,
                unit: "×",
                at_least: true,
                not_applicable: None,
            },
        ]
    }

    pub fn table(&self) -> String {
        let (warm, after) = self.peaks();
        let last = self.rss.last().map_or(0.0, |(_, k)| Self::mib(*k));
        let mut o = format!(
            "soak: {:.0} s at {:.0} % of the maximum ({:.0} req/s measured, {:.0} planned, {:.0} achieved)\n\
             \x20 requests {} + task polls {}; failed {}\n\
             \x20 sidecar VmRSS: peak {warm:.1} MiB in the first {:.0} s, peak {after:.1} MiB after, {last:.1} MiB at the end\n",
            self.rss.last().map_or(0.0, |(t, _)| *t),
            self.plan_fraction * 100.0,
            self.max_rps,
            self.target_rps,
            self.achieved_rps,
            self.requests,
            self.polls,
            self.errors.count,
            self.warmup_secs,
        );
        for e in &self.errors.examples {
            o.push_str(&format!("  failure: {e}\n"));
        }
        o.push_str("\ntargets\n");
        for t in self.targets() {
            o.push_str(&t.line());
            o.push('\n');
        }
        o
    }

    pub fn to_json(&self) -> Value {
        json!({
            "fraction": self.plan_fraction, "max_rps": self.max_rps,
            "target_rps": self.target_rps, "achieved_rps": self.achieved_rps,
            "requests": self.requests, "polls": self.polls,
            "errors": {"count": self.errors.count, "examples": self.errors.examples},
            "warmup_seconds": self.warmup_secs,
            "rss_kib": self.rss.iter().map(|(t, k)| json!([t, k])).collect::<Vec<_>>(),
            "flat_bound_mib": FLAT_BOUND_MIB,
            "targets": self.targets().iter().map(Target::to_json).collect::<Vec<_>>(),
        })
    }
}

pub async fn run(
    plan: &SoakPlan,
    repo: &std::path::Path,
    work: &std::path::Path,
    bins: &Binaries,
) -> Result<SoakResult> {
    let keys = Keys::load(repo)?;
    let server = Server::start(&bins.example, work)?;
    let sidecar = Sidecar::start(
        &bins.lifeguard,
        work,
        &server.endpoint,
        &keys,
        &bins.sidecar_env,
        &[],
    )
    .await?;
    let via = sidecar.endpoint.clone();
    let token = keys.token(Algorithm::RS256, "soak-owner", "tenant-0", "client-0")?;
    let greet = Template::tool_call(&via, &token, "greet", json!({"name": "soak"}), false);

    eprintln!("soak: measuring the maximum throughput");
    let mut probe = Load::default();
    closed_loop(&via, &greet, CONNECTIONS, plan.probe / 5, &mut probe).await?;
    let mut probe = Load::default();
    closed_loop(&via, &greet, CONNECTIONS, plan.probe, &mut probe).await?;
    let max_rps = probe.rps();
    let target_rps = max_rps * plan.fraction;
    eprintln!(
        "soak: {max_rps:.0} req/s at most; holding {target_rps:.0} req/s for {:.0} s",
        plan.duration.as_secs_f64()
    );

    let stop = Arc::new(AtomicBool::new(false));
    let requests = Arc::new(AtomicU64::new(0));
    let polls = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(std::sync::Mutex::new(Errors::default()));
    let started = Instant::now();
    let mut workers = Vec::new();
    let interval = Duration::from_secs_f64(CONNECTIONS as f64 / target_rps.max(1.0));
    for c in 0..CONNECTIONS {
        let conn = Conn::connect(via.addr).await?;
        // Spread the connections' schedules over one interval.
        let first = tokio::time::Instant::now() + interval.mul_f64(c as f64 / CONNECTIONS as f64);
        workers.push(tokio::spawn(paced(
            conn,
            greet.clone(),
            tokio::time::interval_at(first, interval),
            (c as u64) << 32,
            Counters {
                stop: stop.clone(),
                done: requests.clone(),
                errors: errors.clone(),
            },
        )));
    }
    let poll_counters = Counters {
        stop: stop.clone(),
        done: polls.clone(),
        errors: errors.clone(),
    };
    workers.push(spawn_poller(&via, &token, poll_counters).await?);
    let _listener = open_listen(&via, &token).await?;

    let mut rss = Vec::new();
    let mut second = tokio::time::interval(Duration::from_secs(1));
    while started.elapsed() < plan.duration {
        second.tick().await;
        let status = sidecar
            .proc
            .try_memory()
            .context("reading the sidecar's /proc status")?;
        rss.push((started.elapsed().as_secs_f64(), status.rss_kib));
    }
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    for worker in workers {
        let _ = worker.await;
    }
    let errors = std::mem::take(&mut *lock(&errors));
    let requests = requests.load(Ordering::Relaxed);
    Ok(SoakResult {
        plan_fraction: plan.fraction,
        max_rps,
        target_rps,
        achieved_rps: requests as f64 / elapsed,
        requests,
        polls: polls.load(Ordering::Relaxed),
        errors,
        rss,
        warmup_secs: plan.warmup.as_secs_f64(),
    })
}

fn lock(errors: &std::sync::Mutex<Errors>) -> std::sync::MutexGuard<'_, Errors> {
    errors.lock().unwrap_or_else(|e| e.into_inner())
}

/// The owner of a running task polls it every 10 ms.
async fn spawn_poller(
    via: &Endpoint,
    token: &str,
    counters: Counters,
) -> Result<tokio::task::JoinHandle<()>> {
    let mut conn = Conn::connect(via.addr).await?;
    let create = Template::tool_call(via, token, TASK_TOOL, json!({"seconds": 86_400}), true);
    let status = conn.send(create.bytes()).await?;
    let task_id = conn
        .body_json()
        .filter(|_| status == 200)
        .and_then(|v| v.pointer("/result/taskId")?.as_str().map(str::to_owned))
        .with_context(|| {
            format!(
                "creating the soak's task: {}",
                describe_failure(status, conn.body())
            )
        })?;
    let poll = Template::task_get(via, token, &task_id);
    let ticks = tokio::time::interval(Duration::from_millis(10));
    Ok(tokio::spawn(paced(conn, poll, ticks, 1u64 << 40, counters)))
}

/// What a paced sender reports to.
struct Counters {
    stop: Arc<AtomicBool>,
    /// Requests answered successfully.
    done: Arc<AtomicU64>,
    errors: Arc<std::sync::Mutex<Errors>>,
}

/// Sends `template` on `conn` at every tick until `stop` (ids from `first_id` on); a broken
/// connection ends it.
async fn paced(
    mut conn: Conn,
    mut template: Template,
    mut ticks: tokio::time::Interval,
    first_id: u64,
    counters: Counters,
) {
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut n = first_id;
    while !counters.stop.load(Ordering::Relaxed) {
        ticks.tick().await;
        n += 1;
        template.set_id(n);
        match conn.send(template.bytes()).await {
            Ok(status) if is_success(status, conn.body()) => {
                counters.done.fetch_add(1, Ordering::Relaxed);
            }
            Ok(status) => lock(&counters.errors).record(describe_failure(status, conn.body())),
            Err(e) => {
                lock(&counters.errors).record(format!("{e:#}"));
                return;
            }
        }
    }
}

/// A listen stream held open for the whole soak (its head read, its body left to flow).
async fn open_listen(via: &Endpoint, token: &str) -> Result<tokio::net::TcpStream> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let params = json!({"notifications": {"resourceSubscriptions": ["example://bench/soak"]}});
    let template = Template::mcp(via, token, "subscriptions/listen", None, params, false);
    let mut stream = tokio::net::TcpStream::connect(via.addr).await?;
    stream.write_all(template.bytes()).await?;
    let mut head = [0u8; 512];
    let n = stream.read(&mut head).await?;
    let text = String::from_utf8_lossy(&head[..n]);
    anyhow::ensure!(
        text.starts_with("HTTP/1.1 200"),
        "the soak's listen stream was refused: {text}"
    );
    Ok(stream)
}
