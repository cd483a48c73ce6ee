//! The machine, the targets, the human-readable table and the JSON file.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::{Value, json};

use crate::bench_support::machine::{self, Disk};
use crate::bench_support::procs::Memory;
use crate::bench_support::report::{errors_section, heading, mib};
use crate::components::{self, Components};
use crate::exhaustion::ExhaustionResult;
use crate::hot_path::{CONNECTIONS_PER_WORKER, HotLane};
use crate::listen::ListenResult;
use crate::phases::Usage;
use crate::run::{GREET_DIRECT, GREET_VIA, POLL_DIRECT, POLL_VIA};
use crate::stats::{Added, Errors, Summary, us, us_signed};

/// A target of the issue; the report prints its numbers with two decimals.
pub type Target = crate::bench_support::report::Target<2>;

/// Where the bench ran, and the disk under the ledger.
pub struct Machine {
    pub host: machine::Machine,
    pub ledger: Disk,
}

impl Machine {
    pub fn probe(ledger_dir: &Path, repo: &Path) -> Self {
        Self {
            host: machine::Machine::probe(repo),
            ledger: Disk::of(ledger_dir),
        }
    }

    pub fn to_json(&self) -> Value {
        let mut json = self.host.to_json();
        json["ledger_filesystem"] = json!(self.ledger.fs);
        json["ledger_device"] = json!(self.ledger.device);
        json["ledger_dir"] = json!(self.ledger.path);
        json
    }
}

/// One latency lane's outcome.
pub struct LaneResult {
    pub name: String,
    pub summary: Summary,
    pub usage: Usage,
    /// Wall time of the measured requests.
    pub secs: f64,
}

/// One throughput endpoint's outcome.
pub struct LoadResult {
    pub name: String,
    pub rps: f64,
    pub summary: Summary,
    pub usage: Usage,
    pub requests: u64,
    pub secs: f64,
}

/// Everything one run produced.
pub struct Results {
    pub mode: &'static str,
    pub machine: Machine,
    pub config: Value,
    pub ticks_per_sec: u64,
    pub latency: Vec<LaneResult>,
    pub added: Vec<(String, Added)>,
    pub throughput: Vec<LoadResult>,
    pub memory: Vec<(String, Memory)>,
    pub ledger: Value,
    pub read_pass: Option<Summary>,
    pub components: Components,
    pub targets: Vec<Target>,
    pub errors: Errors,
    pub listen: ListenResult,
    pub exhaustion: ExhaustionResult,
    /// Cores' worth of CPU other processes used in the second before the run.
    pub preflight_other_cores: f64,
    pub hot_path: Vec<HotLane>,
    pub baseline: Option<Baseline>,
}

fn cpu_us_per_request(ticks: u64, ticks_per_sec: u64, requests: u64) -> f64 {
    if requests == 0 {
        return 0.0;
    }
    ticks as f64 * 1e6 / ticks_per_sec.max(1) as f64 / requests as f64
}

/// Cores' worth of CPU used by other processes while a lane ran (noise indicator).
fn cores(ticks: u64, ticks_per_sec: u64, secs: f64) -> f64 {
    ticks as f64 / ticks_per_sec.max(1) as f64 / secs.max(1e-9)
}

fn mean_us(total_secs: f64, count: f64) -> String {
    if count <= 0.0 {
        "-".into()
    } else {
        format!("{:.1}", total_secs * 1e6 / count)
    }
}

impl Results {
    /// The human-readable report.
    pub fn table(&self) -> String {
        let m = &self.machine;
        let mut o = String::new();
        heading(&mut o, "sidecar", self.mode, &m.host, "every phase works");
        let _ = writeln!(
            o,
            "ledger:  {} on {} ({})",
            m.ledger.path, m.ledger.fs, m.ledger.device
        );
        let _ = writeln!(
            o,
            "tokens:  RS256 unless noted; JWT validation on every request"
        );
        let _ = writeln!(
            o,
            "noise:   other processes used {:.2} cores in the second before the run\n",
            self.preflight_other_cores
        );

        let _ = writeln!(
            o,
            "latency, sequential requests on one keep-alive connection (µs)"
        );
        let _ = writeln!(
            o,
            "{:<44} {:>6} {:>8} {:>8} {:>8} {:>8} {:>9} {:>8} | {:>7} {:>7} {:>7} {:>7} {:>7} {:>6}",
            "phase",
            "n",
            "p50",
            "p90",
            "p99",
            "p99.9",
            "max",
            "mean",
            "cpu sc",
            "cpu srv",
            "cpu cli",
            "ups rt",
            "ledg w",
            "other"
        );
        for lane in &self.latency {
            let s = &lane.summary;
            let n = s.n as u64;
            let u = &lane.usage;
            let _ = writeln!(
                o,
                "{:<44} {:>6} {:>8} {:>8} {:>8} {:>8} {:>9} {:>8} | {:>7.1} {:>7.1} {:>7.1} {:>7} {:>7} {:>6.2}",
                lane.name,
                s.n,
                us(s.p50),
                us(s.p90),
                us(s.p99),
                us(s.p999),
                us(s.max),
                us(s.mean),
                cpu_us_per_request(u.sidecar_ticks, self.ticks_per_sec, n),
                cpu_us_per_request(u.server_ticks, self.ticks_per_sec, n),
                cpu_us_per_request(u.client_ticks, self.ticks_per_sec, n),
                mean_us(u.upstream.0, u.upstream.1),
                mean_us(u.ledger.0, u.ledger.1),
                cores(u.other_ticks, self.ticks_per_sec, lane.secs),
            );
            if let Some((_, added)) = self.added.iter().find(|(l, _)| *l == lane.name) {
                let _ = writeln!(
                    o,
                    "{:<44} {:>6} {:>8} {:>8} {:>8} {:>8} {:>9} {:>8}",
                    "  = added by the sidecar",
                    "",
                    us_signed(added.p50),
                    us_signed(added.p90),
                    us_signed(added.p99),
                    us_signed(added.p999),
                    "",
                    us_signed(added.mean)
                );
            }
        }
        let _ = writeln!(
            o,
            "  (cpu sc/srv/cli: CPU µs per request of sidecar/example server/bench client; \
             ups rt: mean upstream round trip and ledg w: mean durable ledger write, both as \
             timed by the sidecar's own /metrics, µs; other: cores used by other processes \
             meanwhile, i.e. noise)\n"
        );

        let _ = writeln!(o, "throughput, closed loop, greet (µs latency under load)");
        let _ = writeln!(
            o,
            "{:<30} {:>10} {:>9} {:>8} {:>8} {:>8} {:>8} | {:>7} {:>7} {:>7} {:>6}",
            "endpoint",
            "req/s",
            "requests",
            "secs",
            "p50",
            "p99",
            "p99.9",
            "cpu sc",
            "cpu srv",
            "cpu cli",
            "other"
        );
        for l in &self.throughput {
            let u = &l.usage;
            let _ = writeln!(
                o,
                "{:<30} {:>10.0} {:>9} {:>8.1} {:>8} {:>8} {:>8} | {:>7.1} {:>7.1} {:>7.1} {:>6.2}",
                l.name,
                l.rps,
                l.requests,
                l.secs,
                us(l.summary.p50),
                us(l.summary.p99),
                us(l.summary.p999),
                cpu_us_per_request(u.sidecar_ticks, self.ticks_per_sec, l.requests),
                cpu_us_per_request(u.server_ticks, self.ticks_per_sec, l.requests),
                cpu_us_per_request(u.client_ticks, self.ticks_per_sec, l.requests),
                cores(u.other_ticks, self.ticks_per_sec, l.secs),
            );
        }
        let _ = writeln!(
            o,
            "  ratio via sidecar / direct: greet {:.3}, tasks/get {:.3}",
            load_ratio(&self.throughput, GREET_DIRECT, GREET_VIA),
            load_ratio(&self.throughput, POLL_DIRECT, POLL_VIA),
        );
        let cpu_ratio = |via: &str| {
            load_named(&self.throughput, via).map_or(0.0, |l| {
                l.usage.sidecar_ticks as f64 / l.usage.server_ticks.max(1) as f64
            })
        };
        let _ = writeln!(
            o,
            "  sidecar CPU / server CPU per request under load: greet {:.2}, tasks/get {:.2}\n",
            cpu_ratio(GREET_VIA),
            cpu_ratio(POLL_VIA),
        );

        let _ = writeln!(o, "memory of the sidecar (/proc/PID/status)");
        for (state, s) in &self.memory {
            let _ = writeln!(
                o,
                "  {:<58} VmRSS {:>10}   VmHWM {:>10}",
                state,
                mib(s.rss_kib),
                mib(s.hwm_kib)
            );
        }
        let l = &self.ledger;
        let num = |k: &str| l[k].as_f64().unwrap_or(0.0);
        let _ = writeln!(
            o,
            "  ledger: {} rows ({} active), {:.1} MB database + {:.1} MB WAL; {} rows filled in \
             {:.1} s ({:.0} rows/s): {}\n",
            num("rows"),
            num("active_rows"),
            num("db_bytes") / 1e6,
            num("wal_bytes") / 1e6,
            num("filled_rows"),
            num("fill_seconds"),
            num("fill_rows_per_second"),
            l["content"].as_str().unwrap_or_default()
        );
        if let Some(s) = &self.read_pass {
            let _ = writeln!(
                o,
                "tasks/get of completed tasks at full ledger (answered from the ledger): \
                 n {} p50 {} p99 {} p99.9 {} µs\n",
                s.n,
                us(s.p50),
                us(s.p99),
                us(s.p999)
            );
        }

        o.push_str(&hot_path_table(&self.hot_path));
        o.push_str(&self.listen.table());
        o.push_str(&self.exhaustion.table());
        let _ = writeln!(o, "components, in process (µs)");
        for (name, s) in &self.components {
            let _ = writeln!(
                o,
                "  {:<42} n {:>6}  p50 {:>8}  p99 {:>8}  p99.9 {:>8}",
                name,
                s.n,
                us(s.p50),
                us(s.p99),
                us(s.p999)
            );
        }
        let _ = writeln!(o, "\ntargets");
        for t in &self.targets {
            let _ = writeln!(o, "{}", t.line());
        }
        errors_section(
            &mut o,
            &self.errors,
            "request(s) failed",
            "no failed requests",
        );
        o
    }

    pub fn to_json(&self) -> Value {
        let usage = |u: &Usage, n: u64, secs: f64| {
            json!({
                "other_processes_cores": cores(u.other_ticks, self.ticks_per_sec, secs),
                "steal_cores": cores(u.steal_ticks, self.ticks_per_sec, secs),
                "sidecar_cpu_us_per_request": cpu_us_per_request(u.sidecar_ticks, self.ticks_per_sec, n),
                "server_cpu_us_per_request": cpu_us_per_request(u.server_ticks, self.ticks_per_sec, n),
                "client_cpu_us_per_request": cpu_us_per_request(u.client_ticks, self.ticks_per_sec, n),
                "sidecar_upstream_round_trips": u.upstream.1,
                "sidecar_upstream_seconds_total": u.upstream.0,
                "sidecar_ledger_writes": u.ledger.1,
                "sidecar_ledger_write_seconds_total": u.ledger.0,
            })
        };
        json!({
            "mode": self.mode,
            "machine": self.machine.to_json(),
            "config": self.config,
            "preflight_other_processes_cores": self.preflight_other_cores,
            "latency": self.latency.iter().map(|l| json!({
                "phase": l.name, "latency": l.summary.to_json(),
                "seconds": l.secs, "usage": usage(&l.usage, l.summary.n as u64, l.secs),
            })).collect::<Vec<_>>(),
            "added": self.added.iter().map(|(name, a)| json!({"phase": name, "added": a.to_json()}))
                .collect::<Vec<_>>(),
            "throughput": self.throughput.iter().map(|l| json!({
                "endpoint": l.name, "requests_per_second": l.rps, "requests": l.requests,
                "seconds": l.secs, "latency": l.summary.to_json(), "usage": usage(&l.usage, l.requests, l.secs),
            })).collect::<Vec<_>>(),
            "memory": self.memory.iter().map(|(state, s)| json!({"state": state, "status": s.to_json()}))
                .collect::<Vec<_>>(),
            "ledger": self.ledger,
            "completed_task_reads": self.read_pass.as_ref().map(Summary::to_json),
            "listen": self.listen.to_json(),
            "exhaustion": self.exhaustion.to_json(),
            "components": components::to_json(&self.components),
            "hot_path": self.hot_path.iter().map(HotLane::to_json).collect::<Vec<_>>(),
            "baseline": self.baseline.as_ref().map(Baseline::to_json),
            "targets": self.targets.iter().map(Target::to_json).collect::<Vec<_>>(),
            "errors": {"count": self.errors.count, "examples": self.errors.examples},
            "passed": self.errors.count == 0,
        })
    }
}

/// The throughput lane whose name starts with `name`.
pub fn load_named<'a>(loads: &'a [LoadResult], name: &str) -> Option<&'a LoadResult> {
    loads.iter().find(|l| {
        l.name
            .strip_prefix(name)
            .is_some_and(|rest| rest.starts_with(" ("))
    })
}

/// req/s via the sidecar / req/s direct, for one pair of throughput lanes.
fn load_ratio(loads: &[LoadResult], direct: &str, via: &str) -> f64 {
    match (load_named(loads, direct), load_named(loads, via)) {
        (Some(d), Some(v)) => v.rps / d.rps.max(1e-9),
        _ => 0.0,
    }
}

/// The targets, checked against what was measured.
pub fn targets(
    latency: &[LaneResult],
    added: &[(String, Added)],
    throughput: &[LoadResult],
    memory: &[(String, Memory)],
    rows: u64,
    ticks_per_sec: u64,
    baseline: Option<&Baseline>,
) -> Vec<Target> {
    let added_of = |name: &str| {
        added
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| a.clone())
            .unwrap_or_default()
    };
    let p99_of = |name: &str| {
        latency
            .iter()
            .find(|l| l.name == name)
            .map_or(0, |l| l.summary.p99)
    };
    let rss_mib = |i: usize| {
        memory
            .get(i)
            .map_or(0.0, |(_, s)| s.rss_kib as f64 / 1024.0)
    };
    let greet = added_of("greet via sidecar");
    let get = added_of("tasks/get via sidecar (running task)");
    let ratio = load_ratio(throughput, GREET_DIRECT, GREET_VIA);
    let t = |name: &str, measured: f64, limit, unit, at_least| Target {
        name: name.to_owned(),
        measured,
        limit,
        unit,
        at_least,
        not_applicable: None,
    };
    let sidecar_cpu = |name: &str| {
        load_named(throughput, name).map_or(0.0, |l| {
            cpu_us_per_request(l.usage.sidecar_ticks, ticks_per_sec, l.requests)
        })
    };
    let poll_cpu = sidecar_cpu(POLL_VIA);
    let poll_saving = match baseline {
        Some(b) if b.poll_cpu_us > 0.0 => Target {
            not_applicable: None,
            ..t(
                "sidecar CPU per forwarded tasks/get under load, reduction vs --baseline",
                1.0 - poll_cpu / b.poll_cpu_us,
                0.4,
                "",
                true,
            )
        },
        _ => Target {
            not_applicable: Some("no --baseline results file given".into()),
            ..t(
                "sidecar CPU per forwarded tasks/get under load, reduction vs --baseline",
                0.0,
                0.4,
                "",
                true,
            )
        },
    };
    vec![
        t(
            "sidecar CPU per proxied greet under load (32 conns)",
            sidecar_cpu(GREET_VIA),
            20.0,
            "µs",
            false,
        ),
        poll_saving,
        t(
            "greet added latency p50",
            greet.p50 as f64 / 1e3,
            100.0,
            "µs",
            false,
        ),
        t(
            "greet added latency p99",
            greet.p99 as f64 / 1e3,
            1000.0,
            "µs",
            false,
        ),
        t(
            "throughput via sidecar / direct (32 conns)",
            ratio,
            0.6,
            "×",
            true,
        ),
        t(
            "tasks/get added latency p50",
            get.p50 as f64 / 1e3,
            150.0,
            "µs",
            false,
        ),
        t(
            "durable task creation p99 (absolute, via sidecar)",
            p99_of("task creation via sidecar (durable)") as f64 / 1e6,
            5.0,
            "ms",
            false,
        ),
        t(
            "sidecar VmRSS idle (after start)",
            rss_mib(0),
            20.0,
            "MiB",
            false,
        ),
        Target {
            not_applicable: (rows < 100_000).then(|| format!("only {rows} rows in this run")),
            ..t(
                "sidecar VmRSS with 100,000 ledger rows",
                rss_mib(2),
                64.0,
                "MiB",
                false,
            )
        },
    ]
}

/// What an earlier run (`--baseline FILE`, its results.json) measured, for the targets that
/// are reductions.
pub struct Baseline {
    pub file: String,
    pub commit: String,
    /// Sidecar CPU per forwarded `tasks/get` under load, µs.
    pub poll_cpu_us: f64,
    /// Sidecar CPU per proxied `greet` under load, µs.
    pub greet_cpu_us: f64,
}

impl Baseline {
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the baseline {}", path.display()))?;
        let results: Value = serde_json::from_str(&text)
            .with_context(|| format!("parsing the baseline {}", path.display()))?;
        let cpu_of = |name: &str| {
            results["throughput"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|l| l["endpoint"].as_str().is_some_and(|e| e.starts_with(name)))
                .and_then(|l| l["usage"]["sidecar_cpu_us_per_request"].as_f64())
        };
        let poll_cpu_us = cpu_of(POLL_VIA).with_context(|| {
            format!(
                "{} has no \"{POLL_VIA}\" throughput lane (a run of this benchmark is needed, \
                 e.g. with --lifeguard pointing at the older binary)",
                path.display()
            )
        })?;
        Ok(Self {
            file: path.display().to_string(),
            commit: results["machine"]["git_commit"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            poll_cpu_us,
            greet_cpu_us: cpu_of(GREET_VIA).unwrap_or(0.0),
        })
    }

    fn to_json(&self) -> Value {
        json!({
            "file": self.file, "commit": self.commit,
            "poll_sidecar_cpu_us_per_request": self.poll_cpu_us,
            "greet_sidecar_cpu_us_per_request": self.greet_cpu_us,
        })
    }
}

pub fn hot_path_table(lanes: &[HotLane]) -> String {
    let mut o = String::new();
    if lanes.is_empty() {
        return o;
    }
    let _ = writeln!(
        o,
        "hot path in one process: sidecar + in-memory server + {CONNECTIONS_PER_WORKER} connections per worker, on W workers"
    );
    let _ = writeln!(
        o,
        "{:<12} {:>7} {:>12} {:>10} {:>12} {:>13} {:>7}",
        "method", "workers", "req/s/worker", "requests", "cpu µs/req", "switches/req", "errors"
    );
    for l in lanes {
        let _ = writeln!(
            o,
            "{:<12} {:>7} {:>12.0} {:>10} {:>12.1} {:>13.2} {:>7}",
            l.method,
            l.workers,
            l.per_worker_rps(),
            l.requests,
            l.cpu_us_per_request(),
            l.switches_per_request(),
            l.errors
        );
    }
    let _ = writeln!(
        o,
        "  (cpu: all threads of the process per request — sidecar, server and client together; \
         switches: voluntary + involuntary context switches of all threads per request; the \
         targets use all lanes of a worker count; `reference`: JSON parse+write loops on \
         threads that share nothing, how the machine itself scales)"
    );
    let reference =
        |w| crate::hot_path::per_worker_rps(lanes, crate::hot_path::MACHINE_REFERENCE, w);
    if let (Some(one), Some(two)) = (reference(1), reference(2)) {
        let _ = writeln!(
            o,
            "  machine reference: per-thread rate at 2 threads / 1 thread = {:.2}",
            two / one.max(1e-9)
        );
    }
    for l in lanes {
        let top: Vec<String> = l
            .switches_by_thread
            .iter()
            .take(3)
            .map(|(name, n)| format!("{name} {:.3}", *n as f64 / l.requests.max(1) as f64))
            .collect();
        if !top.is_empty() {
            let _ = writeln!(
                o,
                "  switches/req by thread, {} at {} worker(s): {}",
                l.method,
                l.workers,
                top.join(", ")
            );
        }
    }
    o.push('\n');
    o
}

/// Per-worker throughput at 2 workers over 1 worker, per method.
pub fn hot_path_targets(lanes: &[HotLane]) -> Vec<Target> {
    ["greet", "tasks/get"]
        .iter()
        .filter_map(|method| {
            // (the machine reference lane is context, not a target)
            let at = |w: usize| crate::hot_path::per_worker_rps(lanes, method, w);
            let (one, two) = (at(1)?, at(2)?);
            Some(Target {
                name: if *method == "greet" {
                    "hot path: greet throughput per worker, 2 workers / 1 worker".into()
                } else {
                    "hot path: tasks/get throughput per worker, 2 workers / 1 worker".into()
                },
                measured: two / one.max(1e-9),
                limit: 0.9,
                unit: "×",
                at_least: true,
                not_applicable: None,
            })
        })
        .collect()
}

/// The listen phase's target: sidecar memory with the streams open and events flowing.
/// One per sidecar lane: HTTP/1.1 (a connection per stream) and, when it ran, HTTP/2 (one
/// connection).
pub fn listen_targets(listen: &ListenResult) -> Vec<Target> {
    let streams = listen.plan.streams;
    listen
        .sidecar_lanes()
        .map(|(lane, _)| Target {
            name: format!(
                "sidecar VmRSS peak with 1,000 listen streams delivering ({})",
                lane.name
            ),
            measured: lane.sidecar_rss_peak.rss_kib as f64 / 1024.0,
            limit: 48.0,
            unit: "MiB",
            at_least: false,
            not_applicable: (streams < 1_000)
                .then(|| format!("only {streams} streams in this run")),
        })
        .collect()
}
