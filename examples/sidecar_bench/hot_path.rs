//! The hot path in one process, per worker count: is there a point where the sidecar's
//! workers wait for each other?
//!
//! For each worker count W (1, then 2) the phase starts exactly W connection workers
//! (`lifeguard::runtime::workers::Workers`, the threads `lifeguard sidecar` serves its
//! connections on) and runs all the request work on them: the sidecar itself
//! (`lifeguard::sidecar::run`, the library code of the binary, with the bench policy, an SQLite
//! ledger and the audit file), a minimal MCP server that answers from memory (so the server
//! costs next to nothing and scales with the workers; served on the same workers), and 8 × W
//! closed-loop client connections spread over the workers. Accept loops and the sidecar's
//! background work run on a one-thread main runtime, as in the binary. Nothing else runs: the
//! example server and the sidecar processes of the other phases are stopped. If nothing on the
//! request path serializes the workers (a lock, a single-threaded stage, a shared pool), the
//! throughput per worker stays flat from 1 to 2 workers; on two cores W = 2 uses the whole
//! machine, so anything else running on it shows up as a lower ratio.
//!
//! Recorded per lane: requests per second per worker, CPU per request of the whole process
//! (all its threads, including the sidecar's ledger and audit threads), and context switches
//! per request (voluntary + involuntary over all threads: the wake-up profile).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use jsonwebtoken::Algorithm;
use lifeguard::runtime::workers::Workers;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::bench_support::procs::{clock_ticks_per_sec, cpu_ticks};
use crate::client::{Conn, Endpoint, Template, is_success};
use crate::in_process::{self, MemoryServer};
use crate::procs::{self, Keys};

/// Client connections per worker.
pub const CONNECTIONS_PER_WORKER: usize = 8;

/// One lane: a method at a worker count.
#[derive(Clone, Debug)]
pub struct HotLane {
    pub workers: usize,
    pub method: &'static str,
    pub requests: u64,
    pub errors: u64,
    pub secs: f64,
    /// CPU of the whole process over the lane, seconds.
    pub cpu_secs: f64,
    pub context_switches: u64,
    /// Context switches by thread name (numbers in names folded: `hot-path-0` and
    /// `hot-path-1` count as `hot-path-N`), most first: which threads were woken.
    pub switches_by_thread: Vec<(String, u64)>,
}

impl HotLane {
    pub fn per_worker_rps(&self) -> f64 {
        self.requests as f64 / self.secs / self.workers as f64
    }

    pub fn cpu_us_per_request(&self) -> f64 {
        self.cpu_secs * 1e6 / self.requests.max(1) as f64
    }

    pub fn switches_per_request(&self) -> f64 {
        self.context_switches as f64 / self.requests.max(1) as f64
    }

    pub fn to_json(&self) -> Value {
        json!({
            "workers": self.workers, "method": self.method, "requests": self.requests,
            "errors": self.errors, "secs": self.secs, "cpu_secs": self.cpu_secs,
            "context_switches": self.context_switches,
            "per_worker_rps": self.per_worker_rps(),
            "cpu_us_per_request": self.cpu_us_per_request(),
            "switches_per_request": self.switches_per_request(),
            "switches_by_thread": self.switches_by_thread.iter()
                .map(|(name, n)| json!({"thread": name, "switches": n}))
                .collect::<Vec<_>>(),
        })
    }
}

/// The worker counts of the phase, in the order they run: two rounds of 1 then 2, so that a
/// disturbance of the machine during one lane does not decide the ratio alone.
pub const WORKER_COUNTS: [usize; 4] = [1, 2, 1, 2];

/// Per-worker throughput of `method` at `workers`, over every lane of it.
pub fn per_worker_rps(lanes: &[HotLane], method: &str, workers: usize) -> Option<f64> {
    let matching: Vec<&HotLane> = lanes
        .iter()
        .filter(|l| l.method == method && l.workers == workers)
        .collect();
    if matching.is_empty() {
        return None;
    }
    let requests: u64 = matching.iter().map(|l| l.requests).sum();
    let secs: f64 = matching.iter().map(|l| l.secs).sum();
    Some(requests as f64 / secs.max(1e-9) / workers as f64)
}

/// Runs the phase: every worker count in `workers`, `secs` measured per lane.
pub fn measure(repo: &Path, work: &Path, workers: &[usize], secs: f64) -> Result<Vec<HotLane>> {
    let keys = Arc::new(Keys::load(repo)?);
    let mut lanes = Vec::new();
    for (round, &count) in workers.iter().enumerate() {
        let dir = work.join(format!("hot-path-{round}-{count}"));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let keys = keys.clone();
        // A thread of its own: the runtime's workers must be the only ones doing the work.
        let measured = std::thread::spawn(move || -> Result<Vec<HotLane>> {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("hot-path-main")
                .enable_all()
                .build()
                .context("building the runtime")?;
            let workers = Workers::start(count, "hot-path").context("starting the workers")?;
            let measured = runtime.block_on(at_worker_count(&workers, &dir, &keys, secs));
            drop(runtime);
            workers.stop();
            measured
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the hot-path thread panicked"))??;
        lanes.extend(measured);
        lanes.push(machine_reference(count, secs));
    }
    Ok(lanes)
}

/// The lane of [`MACHINE_REFERENCE`]: how the machine itself scales.
pub const MACHINE_REFERENCE: &str = "reference";

/// The machine's own scaling, for comparison: `workers` threads that share nothing, each
/// parsing and writing a JSON-RPC request in a loop (allocation, parsing, memory traffic like
/// a proxied request, no I/O and no synchronisation). If this per-thread rate drops from one
/// thread to two, the cores interfere (shared caches, a host that shares them) and no program
/// can stay flat by more than this lane does.
fn machine_reference(workers: usize, secs: f64) -> HotLane {
    let request = json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "greet", "arguments": {"name": "bench"}, "_meta": {"k": "v"}},
    })
    .to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let (cpu0, switches0) = (process_cpu_secs(), context_switches());
    let started = Instant::now();
    let threads: Vec<_> = (0..workers)
        .map(|_| {
            let (stop, request) = (stop.clone(), request.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let value: Value = serde_json::from_str(&request).unwrap_or(Value::Null);
                    n += serde_json::to_vec(&value).map_or(0, |v| u64::from(!v.is_empty()));
                }
                n
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    let requests = threads.into_iter().map(|t| t.join().unwrap_or(0)).sum();
    let elapsed = started.elapsed().as_secs_f64();
    let (cpu1, switches1) = (process_cpu_secs(), context_switches());
    let switches = switches1
        .iter()
        .map(|(name, n)| n.saturating_sub(switches0.get(name).copied().unwrap_or(0)))
        .sum();
    HotLane {
        workers,
        method: MACHINE_REFERENCE,
        requests,
        errors: 0,
        secs: elapsed,
        cpu_secs: cpu1 - cpu0,
        context_switches: switches,
        switches_by_thread: Vec::new(),
    }
}

async fn at_worker_count(
    workers: &Workers,
    dir: &Path,
    keys: &Keys,
    secs: f64,
) -> Result<Vec<HotLane>> {
    let shutdown = CancellationToken::new();
    let upstream = MemoryServer::start(workers, shutdown.clone()).await?;
    let endpoint = in_process::start_sidecar(
        dir,
        keys,
        &procs::policy_yaml(),
        upstream.addr,
        workers,
        shutdown.clone(),
    )
    .await?;
    let token = keys.token(Algorithm::RS256, "hot-path", "bench", "bench-client")?;

    let greet = Template::tool_call(&endpoint, &token, "greet", json!({"name": "bench"}), false);
    let task_id = procs::running_task(&endpoint, &token).await?;
    let poll = Template::task_get(&endpoint, &token, &task_id);

    let mut lanes = Vec::new();
    for (method, template) in [("greet", greet), ("tasks/get", poll)] {
        // Warm-up: connections open, caches filled, pools grown.
        closed_loop(&endpoint, &template, workers, 0.5).await?;
        let (cpu0, switches0) = (process_cpu_secs(), context_switches());
        let (requests, errors, elapsed) = closed_loop(&endpoint, &template, workers, secs).await?;
        let (cpu1, switches1) = (process_cpu_secs(), context_switches());
        let mut by_thread: Vec<(String, u64)> = switches1
            .iter()
            .map(|(name, n)| {
                let before = switches0.get(name).copied().unwrap_or(0);
                (name.clone(), n.saturating_sub(before))
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        by_thread.sort_by_key(|b| std::cmp::Reverse(b.1));
        lanes.push(HotLane {
            workers: workers.len(),
            method,
            requests,
            errors,
            secs: elapsed,
            cpu_secs: cpu1 - cpu0,
            context_switches: by_thread.iter().map(|(_, n)| n).sum(),
            switches_by_thread: by_thread,
        });
    }
    shutdown.cancel();
    // Let the sidecar close its ledger and flush the audit trail.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(lanes)
}

/// `8 × workers` connections spread over the workers, each connecting from its worker and
/// sending its next request when the previous answer came.
async fn closed_loop(
    endpoint: &Endpoint,
    template: &Template,
    workers: &Workers,
    secs: f64,
) -> Result<(u64, u64, f64)> {
    let stop = Arc::new(AtomicBool::new(false));
    let requests = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let (connected, mut ready) = tokio::sync::mpsc::channel(1);
    let mut clients = Vec::new();
    for c in 0..CONNECTIONS_PER_WORKER * workers.len() {
        let mut template = template.clone();
        let addr = endpoint.addr;
        let (stop, requests, errors) = (stop.clone(), requests.clone(), errors.clone());
        let connected = connected.clone();
        clients.push(workers.handle(c).spawn(async move {
            let mut conn = Conn::connect(addr).await?;
            let _ = connected.send(()).await;
            drop(connected);
            let mut n = c as u64 * 1_000_000;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                template.set_id(n);
                match conn.send(template.bytes()).await {
                    Ok(status) if is_success(status, conn.body()) => {
                        requests.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                }
            }
            anyhow::Ok(())
        }));
    }
    drop(connected);
    // Measured from the moment every client is connected.
    for _ in 0..clients.len() {
        if ready.recv().await.is_none() {
            break;
        }
    }
    let (before, started) = (requests.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let done = requests.load(Ordering::Relaxed) - before;
    let elapsed = started.elapsed().as_secs_f64();
    for client in clients {
        client.await.context("a hot-path client panicked")??;
    }
    Ok((done, errors.load(Ordering::Relaxed), elapsed))
}

/// CPU time of this process (all threads), seconds.
fn process_cpu_secs() -> f64 {
    cpu_ticks("/proc/self/stat") as f64 / clock_ticks_per_sec() as f64
}

/// Voluntary + involuntary context switches of this process's threads, by thread name with
/// digits folded to `N` (threads that ended are not counted).
fn context_switches() -> std::collections::BTreeMap<String, u64> {
    let mut by_name = std::collections::BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return by_name;
    };
    for task in tasks.flatten() {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        let name: String = status
            .lines()
            .find_map(|l| l.strip_prefix("Name:"))
            .unwrap_or("?")
            .trim()
            .chars()
            .map(|c| if c.is_ascii_digit() { 'N' } else { c })
            .collect();
        let name = name.replace("NN", "N");
        let switches: u64 = status
            .lines()
            .filter(|l| {
                l.starts_with("voluntary_ctxt_switches")
                    || l.starts_with("nonvoluntary_ctxt_switches")
            })
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum();
        *by_name.entry(name).or_insert(0) += switches;
    }
    by_name
}
