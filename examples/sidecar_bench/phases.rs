//! The measured phases: sequential latency in alternating rounds, closed-loop throughput in
//! alternating rounds, and the ledger fill. Every lane records raw samples, errors, and the CPU
//! time the processes spent while it ran.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::bench_support::procs::{MachineTicks, cpu_ticks};
use crate::client::{
    Conn, Endpoint, Requests, Template, describe_failure, is_rate_limited, is_success, timed,
};
use crate::procs::{Server, Sidecar, TASK_TOOL};
use crate::stats::Errors;

/// CPU ticks and sidecar histogram totals at one moment.
#[derive(Clone, Copy, Default)]
pub struct Snapshot {
    sidecar: u64,
    server: u64,
    client: u64,
    /// user + nice + system ticks of all CPUs, and steal ticks (/proc/stat).
    machine: (u64, u64),
    upstream: (f64, f64),
    ledger: (f64, f64),
}

/// Busy (user + nice + system) and steal ticks of the whole machine.
fn machine_ticks() -> (u64, u64) {
    let t = MachineTicks::read();
    (t.busy_without_irq(), t.steal)
}

impl Snapshot {
    pub async fn take(server: &Server, sidecar: &Sidecar, with_metrics: bool) -> Self {
        let mut s = Self {
            sidecar: sidecar.proc.cpu_ticks(),
            server: server.proc.cpu_ticks(),
            client: cpu_ticks("/proc/self/stat"),
            machine: machine_ticks(),
            ..Self::default()
        };
        if with_metrics {
            s.upstream = sidecar
                .histogram("upstream_request_seconds")
                .await
                .unwrap_or_default();
            s.ledger = sidecar
                .histogram("ledger_write_seconds")
                .await
                .unwrap_or_default();
        }
        s
    }
}

/// Resource use accumulated over a lane's measured runs.
#[derive(Clone, Copy, Default, Debug)]
pub struct Usage {
    pub sidecar_ticks: u64,
    pub server_ticks: u64,
    pub client_ticks: u64,
    /// CPU of everything else on the machine (other processes: noise), and hypervisor steal.
    pub other_ticks: u64,
    pub steal_ticks: u64,
    /// Upstream round trips seen by the sidecar: total seconds, count.
    pub upstream: (f64, f64),
    /// Durable ledger writes timed by the sidecar: total seconds, count.
    pub ledger: (f64, f64),
}

impl Usage {
    fn add(&mut self, before: &Snapshot, after: &Snapshot) {
        self.sidecar_ticks += after.sidecar.saturating_sub(before.sidecar);
        self.server_ticks += after.server.saturating_sub(before.server);
        let (client, sidecar, server) = (
            after.client.saturating_sub(before.client),
            after.sidecar.saturating_sub(before.sidecar),
            after.server.saturating_sub(before.server),
        );
        self.client_ticks += client;
        let busy = after.machine.0.saturating_sub(before.machine.0);
        self.other_ticks += busy.saturating_sub(client + sidecar + server);
        self.steal_ticks += after.machine.1.saturating_sub(before.machine.1);
        self.upstream.0 += after.upstream.0 - before.upstream.0;
        self.upstream.1 += after.upstream.1 - before.upstream.1;
        self.ledger.0 += after.ledger.0 - before.ledger.0;
        self.ledger.1 += after.ledger.1 - before.ledger.1;
    }
}

/// One stream of requests to one endpoint, measured over several rounds.
pub struct Lane {
    pub name: &'static str,
    pub through_sidecar: bool,
    endpoint: Endpoint,
    template: Template,
    conn: Option<Conn>,
    /// Collect the `taskId` of every successful response (task creation lanes).
    pub collect_task_ids: bool,
    pub task_ids: Vec<String>,
    pub samples: Vec<u64>,
    pub errors: Errors,
    pub elapsed: Duration,
    pub usage: Usage,
    next_id: u64,
}

impl Lane {
    pub fn new(
        name: &'static str,
        through_sidecar: bool,
        endpoint: &Endpoint,
        template: Template,
    ) -> Self {
        Self {
            name,
            through_sidecar,
            endpoint: endpoint.clone(),
            template,
            conn: None,
            collect_task_ids: false,
            task_ids: Vec::new(),
            samples: Vec::new(),
            errors: Errors::default(),
            elapsed: Duration::ZERO,
            usage: Usage::default(),
            next_id: 0,
        }
    }

    /// Sends `n` requests one after another on the lane's keep-alive connection.
    pub async fn run(&mut self, n: usize, record: bool) -> Result<()> {
        let started = Instant::now();
        for _ in 0..n {
            let conn = match self.conn.as_mut() {
                Some(c) => c,
                None => self.conn.insert(Conn::connect(self.endpoint.addr).await?),
            };
            self.next_id += 1;
            self.template.set_id(self.next_id);
            match timed(conn, self.template.bytes()).await {
                Ok((status, ns)) => {
                    if !is_success(status, conn.body()) {
                        self.errors.record(format!(
                            "{}: {}",
                            self.name,
                            describe_failure(status, conn.body())
                        ));
                        continue;
                    }
                    if record {
                        self.samples.push(ns);
                    }
                    if self.collect_task_ids {
                        match conn.body_json().and_then(|v| task_id_of(&v)) {
                            Some(id) => self.task_ids.push(id),
                            None => self
                                .errors
                                .record(format!("{}: no taskId in the answer", self.name)),
                        }
                    }
                }
                Err(e) => {
                    self.errors.record(format!("{}: {e:#}", self.name));
                    self.conn = None;
                }
            }
        }
        if record {
            self.elapsed += started.elapsed();
        }
        Ok(())
    }
}

/// `result.taskId` of a response.
pub fn task_id_of(message: &Value) -> Option<String> {
    message
        .pointer("/result/taskId")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// `result.status` of a response.
fn status_of(message: &Value) -> Option<String> {
    message
        .pointer("/result/status")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// Runs `per_lane` requests on every lane, split into `rounds` rounds; the order of the lanes
/// alternates between rounds so all lanes see the same machine conditions. `between_rounds`
/// runs after each round, unmeasured.
pub async fn latency_rounds(
    server: &Server,
    sidecar: &Sidecar,
    lanes: &mut [Lane],
    per_lane: usize,
    rounds: usize,
    mut between_rounds: impl AsyncFnMut(&mut [Lane]) -> Result<()>,
) -> Result<()> {
    let rounds = rounds.max(1);
    for round in 0..rounds {
        let n = per_lane / rounds + usize::from(round < per_lane % rounds);
        let order: Vec<usize> = if round % 2 == 0 {
            (0..lanes.len()).collect()
        } else {
            (0..lanes.len()).rev().collect()
        };
        for i in order {
            let lane = &mut lanes[i];
            let before = Snapshot::take(server, sidecar, lane.through_sidecar).await;
            lane.run(n, true).await?;
            let after = Snapshot::take(server, sidecar, lane.through_sidecar).await;
            lane.usage.add(&before, &after);
        }
        between_rounds(lanes).await?;
    }
    Ok(())
}

/// Polls `tasks/get` of each task until it is terminal (unmeasured): tasks of `slow_compute`
/// with `seconds: 0` finish at once, so this frees their quota slots and leaves completed rows.
pub async fn settle(
    endpoint: &Endpoint,
    token: &str,
    ids: &[String],
    errors: &mut Errors,
) -> Result<()> {
    let mut conn = Conn::connect(endpoint.addr).await?;
    settle_on(&mut conn, endpoint, token, ids, errors).await
}

async fn settle_on(
    conn: &mut Conn,
    endpoint: &Endpoint,
    token: &str,
    ids: &[String],
    errors: &mut Errors,
) -> Result<()> {
    for (i, id) in ids.iter().enumerate() {
        let mut template = Template::task_get(endpoint, token, id);
        template.set_id(i as u64);
        let mut attempts = 0;
        loop {
            let status = conn.send(template.bytes()).await?;
            let body = conn.body_json();
            if status != 200 {
                errors.record(format!("settle: {}", describe_failure(status, conn.body())));
                break;
            }
            let s = body.as_ref().and_then(status_of).unwrap_or_default();
            if ["completed", "failed", "cancelled"].contains(&s.as_str()) {
                break;
            }
            attempts += 1;
            if attempts > 1000 {
                errors.record(format!("settle: task still `{s}` after 1000 polls"));
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    Ok(())
}

/// Result of one endpoint's throughput rounds.
#[derive(Default)]
pub struct Load {
    pub name: &'static str,
    /// Latencies of the successes.
    pub samples: Vec<u64>,
    pub errors: Errors,
    /// Successes.
    pub requests: u64,
    /// Latencies of the rate-limit refusals, when the load accepts them ([`Accept`]).
    pub refused: Vec<u64>,
    pub elapsed: Duration,
    pub usage: Usage,
}

impl Load {
    pub fn rps(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Answers of every kind counted (successes, refusals, failures).
    pub fn answered(&self) -> u64 {
        self.requests + self.refused.len() as u64 + self.errors.count
    }

    /// Adds `round`'s answers (successes, refusals, their latencies and time) to this total;
    /// its failures stay with `round`.
    pub fn add_round(&mut self, round: &mut Load) {
        self.requests += round.requests;
        self.samples.append(&mut round.samples);
        self.refused.append(&mut round.refused);
        self.elapsed += round.elapsed;
    }

    fn absorb(&mut self, tally: Tally) {
        self.requests += tally.samples.len() as u64;
        self.samples.extend(tally.samples);
        self.refused.extend(tally.refused);
        self.errors.merge(tally.errors);
    }
}

/// What a load accepts as an answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Accept {
    /// JSON-RPC successes only; anything else is a failure.
    #[default]
    Successes,
    /// Successes, and rate-limit refusals (HTTP 429, `reason: rate_limited`) counted apart.
    RateLimited,
}

/// One connection's answers.
#[derive(Default)]
struct Tally {
    samples: Vec<u64>,
    refused: Vec<u64>,
    errors: Errors,
}

impl Tally {
    /// Sends `request` on `conn` and sorts the answer; `false` when the connection broke (the
    /// worker stops).
    async fn send(&mut self, conn: &mut Conn, request: &[u8], accept: Accept) -> bool {
        match timed(conn, request).await {
            Ok((status, ns)) if is_success(status, conn.body()) => self.samples.push(ns),
            Ok((status, ns))
                if accept == Accept::RateLimited && is_rate_limited(status, conn.body()) =>
            {
                self.refused.push(ns)
            }
            Ok((status, _)) => self.errors.record(describe_failure(status, conn.body())),
            Err(e) => {
                self.errors.record(format!("{e:#}"));
                return false;
            }
        }
        true
    }
}

/// Closed loop: `connections` keep-alive connections, each sending its next request as soon
/// as the previous answer arrived, for `duration`.
pub async fn closed_loop(
    endpoint: &Endpoint,
    template: &Template,
    connections: usize,
    duration: Duration,
    load: &mut Load,
) -> Result<()> {
    let each = vec![template.clone(); connections];
    closed_loop_each(endpoint, each, duration, load).await
}

/// [`closed_loop`] with one connection per element of `each`, which says what it sends; a
/// connection stops at the end of `duration` or when its requests run out.
pub async fn closed_loop_each<R: Requests>(
    endpoint: &Endpoint,
    each: Vec<R>,
    duration: Duration,
    load: &mut Load,
) -> Result<()> {
    let started = Instant::now();
    let deadline = started + duration;
    let mut workers = Vec::with_capacity(each.len());
    for (w, mut requests) in each.into_iter().enumerate() {
        let mut conn = Conn::connect(endpoint.addr).await?;
        workers.push(tokio::spawn(async move {
            let mut tally = Tally {
                samples: Vec::with_capacity(64 * 1024),
                ..Tally::default()
            };
            let mut n = (w as u64) << 32;
            while Instant::now() < deadline {
                n += 1;
                let Some(request) = requests.next(n) else {
                    break;
                };
                if !tally.send(&mut conn, request, Accept::Successes).await {
                    break;
                }
            }
            tally
        }));
    }
    for worker in workers {
        load.absorb(worker.await.context("load worker panicked")?);
    }
    load.elapsed += started.elapsed();
    Ok(())
}

/// Paced load: `connections` connections that together send `rate` calls per second for
/// `duration`, each on a fixed schedule (a late answer delays that connection's next call,
/// never makes it send a burst).
pub async fn paced(
    endpoint: &Endpoint,
    template: &Template,
    connections: usize,
    rate: f64,
    duration: Duration,
    accept: Accept,
    load: &mut Load,
) -> Result<()> {
    let each = vec![template.clone(); connections.max(1)];
    paced_each(endpoint, each, rate, duration, accept, load).await
}

/// [`paced`] with one connection per element of `each`, which says what it sends; a connection
/// stops at the end of `duration` or when its requests run out.
pub async fn paced_each<R: Requests>(
    endpoint: &Endpoint,
    each: Vec<R>,
    rate: f64,
    duration: Duration,
    accept: Accept,
    load: &mut Load,
) -> Result<()> {
    let connections = each.len().max(1);
    let started = Instant::now();
    let deadline = started + duration;
    let period = paced_period(connections, rate);
    let mut workers = Vec::with_capacity(connections);
    for (w, mut requests) in each.into_iter().enumerate() {
        let mut conn = Conn::connect(endpoint.addr).await?;
        let first =
            tokio::time::Instant::from_std(started) + period * w as u32 / connections as u32;
        workers.push(tokio::spawn(async move {
            let mut ticks = tokio::time::interval_at(first, period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut tally = Tally::default();
            let mut n = (w as u64) << 32;
            loop {
                ticks.tick().await;
                if Instant::now() >= deadline {
                    break;
                }
                n += 1;
                let Some(request) = requests.next(n) else {
                    break;
                };
                if !tally.send(&mut conn, request, accept).await {
                    break;
                }
            }
            tally
        }));
    }
    for worker in workers {
        load.absorb(worker.await.context("paced worker panicked")?);
    }
    load.elapsed += started.elapsed();
    Ok(())
}

/// The interval between one paced connection's calls.
pub fn paced_period(connections: usize, rate: f64) -> Duration {
    Duration::from_secs_f64(connections.max(1) as f64 / rate.max(1e-3))
}

/// Alternating throughput rounds for the direct and the sidecar endpoint.
pub async fn throughput_rounds(
    server: &Server,
    sidecar: &Sidecar,
    loads: &mut [(Endpoint, Template, Load)],
    connections: usize,
    per_load: Duration,
    rounds: usize,
) -> Result<()> {
    let rounds = rounds.max(1);
    for round in 0..rounds {
        let order: Vec<usize> = if round % 2 == 0 {
            (0..loads.len()).collect()
        } else {
            (0..loads.len()).rev().collect()
        };
        for i in order {
            let (endpoint, template, load) = &mut loads[i];
            let with_metrics = endpoint.addr == sidecar.endpoint.addr;
            let before = Snapshot::take(server, sidecar, with_metrics).await;
            closed_loop(
                endpoint,
                template,
                connections,
                per_load / rounds as u32,
                load,
            )
            .await?;
            let after = Snapshot::take(server, sidecar, with_metrics).await;
            load.usage.add(&before, &after);
        }
    }
    Ok(())
}

/// What filling the ledger did.
#[derive(Default)]
pub struct Fill {
    pub created: u64,
    pub elapsed: Duration,
    pub errors: Errors,
    /// (principal index, task id) of a sample of the created tasks, for the read pass.
    pub sample: Vec<(usize, String)>,
}

/// Fills the ledger through the sidecar until it holds `tasks` more rows: `connections`
/// workers, each creating `slow_compute` tasks (seconds 0) as one of `tokens`' principals and
/// polling each to completion, so every row ends up a completed task with its result stored.
pub async fn fill(
    endpoint: &Endpoint,
    tokens: &[String],
    tasks: u64,
    connections: usize,
) -> Result<Fill> {
    let started = Instant::now();
    let remaining = Arc::new(AtomicU64::new(tasks));
    let shared = Arc::new(Mutex::new(Fill::default()));
    let mut workers = Vec::new();
    for w in 0..connections {
        let principal = w % tokens.len().max(1);
        let token = tokens.get(principal).cloned().unwrap_or_default();
        let endpoint = endpoint.clone();
        let remaining = remaining.clone();
        let shared = shared.clone();
        workers.push(tokio::spawn(async move {
            let mut errors = Errors::default();
            let mut created = 0u64;
            let mut sample = Vec::new();
            let outcome = fill_worker(
                &endpoint,
                &token,
                principal,
                &remaining,
                &mut created,
                &mut sample,
                &mut errors,
            )
            .await;
            if let Err(e) = outcome {
                errors.record(format!("fill: {e:#}"));
            }
            let mut fill = shared.lock().await;
            fill.created += created;
            fill.errors.merge(errors);
            fill.sample.extend(sample);
        }));
    }
    for worker in workers {
        worker.await.context("fill worker panicked")?;
    }
    let mut fill = std::mem::take(&mut *shared.lock().await);
    fill.elapsed = started.elapsed();
    Ok(fill)
}

async fn fill_worker(
    endpoint: &Endpoint,
    token: &str,
    principal: usize,
    remaining: &AtomicU64,
    created: &mut u64,
    sample: &mut Vec<(usize, String)>,
    errors: &mut Errors,
) -> Result<()> {
    let mut conn = Conn::connect(endpoint.addr).await?;
    let mut create = Template::tool_call(endpoint, token, TASK_TOOL, json!({"seconds": 0}), true);
    let mut n = 0u64;
    while remaining
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| r.checked_sub(1))
        .is_ok()
    {
        n += 1;
        create.set_id(n);
        let status = conn.send(create.bytes()).await?;
        let Some(id) = conn
            .body_json()
            .filter(|_| status == 200)
            .and_then(|v| task_id_of(&v))
        else {
            errors.record(format!(
                "fill create: {}",
                describe_failure(status, conn.body())
            ));
            if errors.count > 100 {
                anyhow::bail!("too many failures");
            }
            continue;
        };
        *created += 1;
        if created.is_multiple_of(10) {
            sample.push((principal, id.clone()));
        }
        settle_on(
            &mut conn,
            endpoint,
            token,
            std::slice::from_ref(&id),
            errors,
        )
        .await?;
    }
    Ok(())
}
