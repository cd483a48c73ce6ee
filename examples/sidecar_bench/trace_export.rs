//! `--tracing`: what exporting traces costs the sidecar (issue 32).
//!
//! The example server and, in front of it, two sidecars of the same binary that differ only in
//! their environment: *export off* (no `OTEL_*` variable: the request path only asks whether
//! spans are exported) and *export on* (`OTEL_EXPORTER_OTLP_ENDPOINT` naming an OTLP gRPC
//! receiver this benchmark runs in its own process, `OTEL_EXPORTER_OTLP_PROTOCOL=grpc`,
//! `OTEL_TRACES_SAMPLER=always_on`: every request is a sampled trace, the most export can
//! cost). With `--tracing-before FILE`, a third sidecar runs a build from before tracing
//! existed, with export off: the comparison that shows whether export off costs anything.
//!
//! For each method of the hot path (`tools/call` of `greet`, `tasks/get` of a running task)
//! every sidecar gets the same closed-loop load (`--connections` connections) in interleaved
//! rounds — off, on, then on, off, … — so drift in the machine's conditions hits all alike.
//! A sidecar's CPU per call is its process's CPU time (all threads, /proc/PID/stat) over the
//! whole method's window — from before its first round to after the receiver has every span
//! of the last one — divided by the calls it answered in its rounds: the batch exporter sends
//! spans from a thread of its own, after the request, and that work is counted too. The
//! receiver's own work is the collector's, not the sidecar's: it runs in the benchmark's
//! process.
//!
//! Every request makes one server span (`tools/call greet`, `tasks/get`) in the exporting
//! sidecar; the receiver counts them by name, so the report says how many of the calls'
//! spans arrived (all, unless the exporter's queue overflowed and it dropped some, which would
//! make the export-on figure too low). No span at all fails the run.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use jsonwebtoken::Algorithm;
use serde_json::{Value, json};

use crate::bench_support::otlp::{OtlpReceiver, SPAN_KIND_SERVER};
use crate::bench_support::procs::{MachineTicks, clock_ticks_per_sec, cpu_ticks, preflight_noise};
use crate::bench_support::report::{errors_section, heading};
use crate::client::{self, Conn, Endpoint, Template};
use crate::phases::{Load, closed_loop, task_id_of};
use crate::procs::{Keys, Server, Sidecar, TASK_TOOL};
use crate::report::{Machine, Target};
use crate::run::Binaries;
use crate::stats::{Errors, Summary, us};

/// The limit on the CPU per call export adds, in percent of export off.
pub const ADDED_CPU_LIMIT_PERCENT: f64 = 10.0;
/// How long the receiver may stay quiet before the spans still missing count as lost: longer
/// than the batch exporter's schedule (`OTEL_BSP_SCHEDULE_DELAY`, 5 s by default).
const EXPORT_QUIET: Duration = Duration::from_secs(8);
/// The longest wait for the last spans of a window.
const EXPORT_WAIT: Duration = Duration::from_secs(60);

/// The configurations' names (the report and the JSON use them).
pub const BEFORE: &str = "before tracing, export off";
pub const OFF: &str = "export off";
pub const ON: &str = "export on";

/// Sizes of the lane.
pub struct TracePlan {
    /// Unmeasured closed loop per sidecar and method before its rounds.
    pub warmup: Duration,
    /// Measured closed loop per sidecar and method, split over the rounds.
    pub measured: Duration,
    pub rounds: usize,
    pub connections: usize,
    /// A `lifeguard` binary from before tracing, measured as a third sidecar with export off.
    pub before: Option<PathBuf>,
    pub smoke: bool,
}

impl TracePlan {
    pub fn new(args: &crate::Args) -> Self {
        let smoke = args.smoke;
        let secs = |full: f64, tiny: f64| if smoke { tiny } else { full };
        Self {
            warmup: Duration::from_secs_f64(secs(2.0, 0.2)),
            measured: Duration::from_secs_f64(args.tracing_secs.unwrap_or(secs(10.0, 0.5))),
            rounds: if smoke { 2 } else { 6 },
            connections: args.connections.max(1),
            before: args.tracing_before.clone(),
            smoke,
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "warmup_seconds_per_sidecar_and_method": self.warmup.as_secs_f64(),
            "measured_seconds_per_sidecar_and_method": self.measured.as_secs_f64(),
            "rounds": self.rounds, "connections": self.connections,
            "before": self.before.as_ref().map(|p| p.display().to_string()),
        })
    }
}

/// A method of the hot path and the name of the server span each of its requests makes.
#[derive(Clone, Copy)]
struct Method {
    name: &'static str,
    span: &'static str,
}

const METHODS: [Method; 2] = [
    Method {
        name: "greet",
        span: "tools/call greet",
    },
    Method {
        name: "tasks/get",
        span: "tasks/get",
    },
];

/// One sidecar under test.
struct Config {
    name: &'static str,
    sidecar: Sidecar,
    exports: bool,
    /// A running task of the owner's, created through this sidecar.
    task: String,
    /// Requests sent per method (warm-up included): how many server spans to expect.
    sent: BTreeMap<&'static str, u64>,
}

/// One sidecar's outcome for one method.
pub struct TraceLane {
    pub method: &'static str,
    pub config: &'static str,
    /// Calls answered in the measured rounds.
    pub requests: u64,
    pub secs: f64,
    /// The sidecar's CPU over the method's whole window (ticks).
    pub window_ticks: u64,
    /// Per round: (calls answered, the sidecar's CPU ticks during the round).
    pub rounds: Vec<(u64, u64)>,
    pub latency: Summary,
}

impl TraceLane {
    pub fn cpu_us_per_call(&self, ticks_per_sec: u64) -> f64 {
        per_call(self.window_ticks, self.requests, ticks_per_sec)
    }

    fn round_us_per_call(&self, ticks_per_sec: u64) -> Vec<f64> {
        self.rounds
            .iter()
            .map(|&(n, ticks)| per_call(ticks, n, ticks_per_sec))
            .collect()
    }
}

fn per_call(ticks: u64, calls: u64, ticks_per_sec: u64) -> f64 {
    ticks as f64 * 1e6 / ticks_per_sec.max(1) as f64 / calls.max(1) as f64
}

/// Spans of one method's calls to the exporting sidecar.
pub struct SpanCheck {
    pub method: &'static str,
    /// Requests sent to the exporting sidecar, warm-up included.
    pub calls: u64,
    /// Server spans of the method that reached the receiver.
    pub server_spans: u64,
    /// Spans of any name that arrived during the method's measured window, per measured call.
    pub spans_per_call: f64,
}

/// Everything the lane produced.
pub struct TraceResult {
    pub mode: &'static str,
    pub machine: Machine,
    pub plan: TracePlan,
    pub ticks_per_sec: u64,
    pub preflight_other_cores: f64,
    /// Cores' worth of CPU other processes used over the measured windows.
    pub other_cores: f64,
    pub lanes: Vec<TraceLane>,
    pub spans: Vec<SpanCheck>,
    pub receiver: Value,
    pub spans_total: u64,
    pub errors: Errors,
    pub sidecar_env: Vec<String>,
}

impl TraceResult {
    fn lane(&self, method: &str, config: &str) -> Option<&TraceLane> {
        self.lanes
            .iter()
            .find(|l| l.method == method && l.config == config)
    }

    /// CPU per call of `config` over `base`, minus one, in percent: over the windows, and the
    /// smallest and largest of the rounds' (paired by round).
    pub fn added_percent(&self, method: &str, config: &str, base: &str) -> Option<Added> {
        let (c, b) = (self.lane(method, config)?, self.lane(method, base)?);
        let t = self.ticks_per_sec;
        let window = (c.cpu_us_per_call(t) / b.cpu_us_per_call(t).max(1e-9) - 1.0) * 100.0;
        let rounds: Vec<f64> = c
            .round_us_per_call(t)
            .iter()
            .zip(b.round_us_per_call(t))
            .map(|(c, b)| (c / b.max(1e-9) - 1.0) * 100.0)
            .collect();
        let min = rounds.iter().copied().fold(f64::INFINITY, f64::min);
        let max = rounds.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some(Added { window, min, max })
    }

    pub fn targets(&self) -> Vec<Target> {
        METHODS
            .iter()
            .filter_map(|m| {
                let added = self.added_percent(m.name, ON, OFF)?;
                Some(Target {
                    name: format!(
                        "tracing: sidecar CPU per {} added by export (grpc, always_on) over export off",
                        m.name
                    ),
                    measured: added.window,
                    limit: ADDED_CPU_LIMIT_PERCENT,
                    unit: "%",
                    at_least: false,
                    not_applicable: self
                        .plan
                        .smoke
                        .then(|| "smoke run: too short to measure".to_owned()),
                })
            })
            .collect()
    }

    pub fn table(&self) -> String {
        let mut o = String::new();
        heading(
            &mut o,
            "sidecar tracing-export",
            self.mode,
            &self.machine.host,
            "export on and off both work and spans arrive",
        );
        let p = &self.plan;
        let _ = writeln!(
            o,
            "noise:   other processes used {:.2} cores before the run, {:.2} during it\n",
            self.preflight_other_cores, self.other_cores
        );
        let _ = writeln!(
            o,
            "tracing export (issue 32): closed loop, {} connections, {:.1} s per sidecar and method in {} interleaved rounds",
            p.connections,
            p.measured.as_secs_f64(),
            p.rounds
        );
        let _ = writeln!(
            o,
            "  export on: OTLP gRPC to a receiver in the bench process, OTEL_TRACES_SAMPLER=always_on\n"
        );
        let _ = writeln!(
            o,
            "{:<10} {:<27} {:>9} {:>8} {:>8} {:>8} | {:>12} {:>22}",
            "method",
            "sidecar",
            "calls",
            "req/s",
            "p50 µs",
            "p99 µs",
            "cpu µs/call",
            "rounds (cpu µs/call)"
        );
        for l in &self.lanes {
            let rounds: Vec<String> = l
                .round_us_per_call(self.ticks_per_sec)
                .iter()
                .map(|v| format!("{v:.1}"))
                .collect();
            let _ = writeln!(
                o,
                "{:<10} {:<27} {:>9} {:>8.0} {:>8} {:>8} | {:>12.2} {:>22}",
                l.method,
                l.config,
                l.requests,
                l.requests as f64 / l.secs.max(1e-9),
                us(l.latency.p50),
                us(l.latency.p99),
                l.cpu_us_per_call(self.ticks_per_sec),
                rounds.join(" ")
            );
        }
        let _ = writeln!(
            o,
            "  (cpu µs/call: the sidecar process's CPU over the method's window, export included, \
             per call answered; rounds: its CPU during each of its rounds, per call)"
        );
        for m in &METHODS {
            let mut pairs = vec![(ON, OFF)];
            if self.lane(m.name, BEFORE).is_some() {
                pairs.push((OFF, BEFORE));
            }
            for (config, base) in pairs {
                if let Some(a) = self.added_percent(m.name, config, base) {
                    let _ = writeln!(
                        o,
                        "  {}: {config} vs {base}: {:+.1} % CPU per call (rounds {:+.1} … {:+.1} %)",
                        m.name, a.window, a.min, a.max
                    );
                }
            }
        }
        let _ = writeln!(
            o,
            "\nspans received: {} in all",
            self.spans_total
        );
        for s in &self.spans {
            let lost = s.calls.saturating_sub(s.server_spans);
            let _ = writeln!(
                o,
                "  {}: {} server spans for {} calls to the exporting sidecar{}; {:.2} spans per call",
                s.method,
                s.server_spans,
                s.calls,
                if lost > 0 {
                    format!(" — WARNING: {lost} missing (dropped by a full export queue?)")
                } else {
                    " (all)".to_owned()
                },
                s.spans_per_call
            );
        }
        let _ = writeln!(o, "\ntargets");
        for t in self.targets() {
            let _ = writeln!(o, "{}", t.line());
        }
        errors_section(&mut o, &self.errors, "request(s) failed", "no failed requests");
        o
    }

    pub fn to_json(&self) -> Value {
        let t = self.ticks_per_sec;
        let added = |config, base| {
            METHODS
                .iter()
                .filter_map(|m| {
                    let a = self.added_percent(m.name, config, base)?;
                    Some(json!({"method": m.name, "percent": a.window,
                        "rounds_min_percent": a.min, "rounds_max_percent": a.max}))
                })
                .collect::<Vec<_>>()
        };
        json!({
            "mode": self.mode,
            "machine": self.machine.to_json(),
            "plan": self.plan.to_json(),
            "sidecar_env_export_on": self.sidecar_env,
            "ticks_per_sec": t,
            "preflight_other_cores": self.preflight_other_cores,
            "other_cores": self.other_cores,
            "lanes": self.lanes.iter().map(|l| json!({
                "method": l.method, "sidecar": l.config, "calls": l.requests, "secs": l.secs,
                "window_cpu_ticks": l.window_ticks,
                "cpu_us_per_call": l.cpu_us_per_call(t),
                "rounds": l.rounds.iter().map(|&(n, ticks)| json!({
                    "calls": n, "cpu_ticks": ticks, "cpu_us_per_call": per_call(ticks, n, t),
                })).collect::<Vec<_>>(),
                "latency": l.latency.to_json(),
            })).collect::<Vec<_>>(),
            "added_by_export": added(ON, OFF),
            "export_off_vs_before": added(OFF, BEFORE),
            "spans": {
                "total": self.spans_total,
                "per_method": self.spans.iter().map(|s| json!({
                    "method": s.method, "calls": s.calls, "server_spans": s.server_spans,
                    "spans_per_call": s.spans_per_call,
                })).collect::<Vec<_>>(),
                "receiver": self.receiver,
            },
            "targets": self.targets().iter().map(Target::to_json).collect::<Vec<_>>(),
            "errors": {"count": self.errors.count, "examples": self.errors.examples},
            "passed": self.errors.count == 0,
        })
    }
}

/// Added CPU per call, percent.
pub struct Added {
    pub window: f64,
    pub min: f64,
    pub max: f64,
}

/// The sidecar's environment without any `OTEL_*` variable.
fn without_otel(env: &[(String, String)]) -> Vec<(String, String)> {
    env.iter()
        .filter(|(k, _)| !k.starts_with("OTEL_"))
        .cloned()
        .collect()
}

/// Creates one long-running task through `endpoint` and returns its id.
async fn running_task(endpoint: &Endpoint, token: &str) -> Result<String> {
    let mut conn = Conn::connect(endpoint.addr).await?;
    let template = Template::tool_call(endpoint, token, TASK_TOOL, json!({"seconds": 86_400}), true);
    let status = conn.send(template.bytes()).await?;
    conn.body_json()
        .filter(|_| status == 200)
        .and_then(|v| task_id_of(&v))
        .with_context(|| {
            let why = client::describe_failure(status, conn.body());
            format!("creating a running task: {why}")
        })
}

fn template(config: &Config, method: Method, token: &str) -> Template {
    let e = &config.sidecar.endpoint;
    match method.name {
        "greet" => Template::tool_call(e, token, "greet", json!({"name": "bench"}), false),
        _ => Template::task_get(e, token, &config.task),
    }
}

/// Waits until the receiver holds a server span for every `method` request sent to the
/// exporting sidecar, or until it has been quiet for longer than the exporter's schedule.
async fn exported(receiver: &OtlpReceiver, configs: &[Config], method: Method) -> bool {
    let sent: u64 = configs
        .iter()
        .filter(|c| c.exports)
        .map(|c| c.sent.get(method.name).copied().unwrap_or(0))
        .sum();
    receiver
        .settle(
            |r| r.spans_named(method.span, SPAN_KIND_SERVER) >= sent,
            EXPORT_QUIET,
            EXPORT_WAIT,
        )
        .await
}

/// Closed loop of `method` on `config` for `duration`; counts what was sent.
async fn load(
    config: &mut Config,
    method: Method,
    token: &str,
    connections: usize,
    duration: Duration,
    errors: &mut Errors,
) -> Result<Load> {
    let template = template(config, method, token);
    let mut load = Load::default();
    closed_loop(
        &config.sidecar.endpoint,
        &template,
        connections,
        duration,
        &mut load,
    )
    .await?;
    *config.sent.entry(method.name).or_default() += load.requests + load.errors.count;
    let errs = std::mem::take(&mut load.errors);
    if errs.count > 0 {
        let mut named = Errors::default();
        for e in &errs.examples {
            named.record(format!("{} {}: {e}", config.name, method.name));
        }
        named.count = errs.count;
        errors.merge(named);
    }
    Ok(load)
}

/// CPU ticks of the processes the machine's busy time is compared with.
fn ours(configs: &[Config], server: &Server) -> u64 {
    configs
        .iter()
        .map(|c| c.sidecar.proc.cpu_ticks())
        .sum::<u64>()
        + server.proc.cpu_ticks()
        + cpu_ticks("/proc/self/stat")
}

/// Runs the lane.
pub async fn run(
    plan: TracePlan,
    mode: &'static str,
    machine: Machine,
    repo: &Path,
    work: &Path,
    bins: &Binaries,
) -> Result<TraceResult> {
    let keys = Keys::load(repo)?;
    let token = keys.token(Algorithm::RS256, "bench-owner", "tenant-0", "client-0")?;
    let ticks_per_sec = clock_ticks_per_sec();
    let rest = Duration::from_secs_f64(if plan.smoke { 0.3 } else { 2.0 });
    let preflight_other_cores =
        preflight_noise(rest, ticks_per_sec, MachineTicks::busy_without_irq).await;
    if preflight_other_cores > 0.1 {
        eprintln!("warning: other processes use {preflight_other_cores:.2} cores: expect noise");
    }

    let receiver = OtlpReceiver::start()?;
    let server = Server::start(&bins.example, work)?;
    let off_env = without_otel(&bins.sidecar_env);
    let mut on_env = off_env.clone();
    on_env.extend(receiver.env());
    on_env.push(("OTEL_TRACES_SAMPLER".into(), "always_on".into()));
    let mut wanted = Vec::new();
    if let Some(before) = &plan.before {
        wanted.push((BEFORE, before.clone(), off_env.clone(), false));
    }
    wanted.push((OFF, bins.lifeguard.clone(), off_env.clone(), false));
    wanted.push((ON, bins.lifeguard.clone(), on_env.clone(), true));
    let mut configs = Vec::new();
    for (i, (name, binary, env, exports)) in wanted.into_iter().enumerate() {
        let dir = work.join(format!("tracing-{i}"));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let sidecar = Sidecar::start(&binary, &dir, &server.endpoint, &keys, &env, &[])
            .await
            .with_context(|| format!("starting the sidecar `{name}`"))?;
        let says_exporting = sidecar.proc.logs().contains("exporting traces over OTLP");
        if says_exporting != exports {
            bail!(
                "the sidecar `{name}` {} export traces:\n{}",
                if exports { "does not" } else { "would" },
                sidecar.proc.logs()
            );
        }
        let task = running_task(&sidecar.endpoint, &token)
            .await
            .with_context(|| format!("sidecar `{name}`"))?;
        configs.push(Config {
            name,
            sidecar,
            exports,
            task,
            sent: BTreeMap::new(),
        });
    }

    let mut errors = Errors::default();
    let mut lanes = Vec::new();
    let mut spans = Vec::new();
    let (mut other_ticks, mut window_secs) = (0u64, 0.0f64);
    for method in METHODS {
        eprintln!("phase: tracing export, {}", method.name);
        for config in configs.iter_mut() {
            load(
                config,
                method,
                &token,
                plan.connections,
                plan.warmup,
                &mut errors,
            )
            .await?;
        }
        // The warm-up's spans first: the measured window starts with an empty export queue.
        exported(&receiver, &configs, method).await;
        if receiver.spans_named(method.span, SPAN_KIND_SERVER) == 0 {
            let on = configs.iter().find(|c| c.exports).map(|c| c.sidecar.proc.logs());
            bail!(
                "export on: no `{}` span reached the OTLP receiver at {} (spans in all: {})\n{}",
                method.span,
                receiver.addr,
                receiver.spans(),
                on.unwrap_or_default()
            );
        }
        let spans_before = receiver.spans();
        let (started, machine0, ours0) = (Instant::now(), MachineTicks::read(), ours(&configs, &server));
        let start_ticks: Vec<u64> = configs.iter().map(|c| c.sidecar.proc.cpu_ticks()).collect();
        let mut measured: Vec<(Load, Vec<(u64, u64)>)> =
            configs.iter().map(|_| (Load::default(), Vec::new())).collect();
        let rounds = plan.rounds.max(1);
        let per_round = plan.measured / rounds as u32;
        for round in 0..rounds {
            let order: Vec<usize> = if round % 2 == 0 {
                (0..configs.len()).collect()
            } else {
                (0..configs.len()).rev().collect()
            };
            for i in order {
                let before = configs[i].sidecar.proc.cpu_ticks();
                let mut l = load(
                    &mut configs[i],
                    method,
                    &token,
                    plan.connections,
                    per_round,
                    &mut errors,
                )
                .await?;
                let ticks = configs[i].sidecar.proc.cpu_ticks().saturating_sub(before);
                let (total, per) = &mut measured[i];
                per.push((l.requests, ticks));
                total.requests += l.requests;
                total.elapsed += l.elapsed;
                total.samples.append(&mut l.samples);
            }
        }
        let measured_calls_on: u64 = configs
            .iter()
            .zip(&measured)
            .filter(|(c, _)| c.exports)
            .map(|(_, (l, _))| l.requests)
            .sum();
        let complete = exported(&receiver, &configs, method).await;
        let busy = MachineTicks::read()
            .busy_without_irq()
            .saturating_sub(machine0.busy_without_irq());
        other_ticks += busy.saturating_sub(ours(&configs, &server).saturating_sub(ours0));
        window_secs += started.elapsed().as_secs_f64();
        for ((config, (mut total, per)), start) in configs.iter().zip(measured).zip(&start_ticks) {
            lanes.push(TraceLane {
                method: method.name,
                config: config.name,
                requests: total.requests,
                secs: total.elapsed.as_secs_f64(),
                window_ticks: config.sidecar.proc.cpu_ticks().saturating_sub(*start),
                rounds: per,
                latency: Summary::of(&mut total.samples),
            });
        }
        let calls: u64 = configs
            .iter()
            .filter(|c| c.exports)
            .map(|c| c.sent.get(method.name).copied().unwrap_or(0))
            .sum();
        let server_spans = receiver.spans_named(method.span, SPAN_KIND_SERVER);
        if !complete {
            eprintln!(
                "warning: {} of {calls} `{}` server spans arrived",
                server_spans, method.span
            );
        }
        spans.push(SpanCheck {
            method: method.name,
            calls,
            server_spans,
            spans_per_call: receiver.spans().saturating_sub(spans_before) as f64
                / measured_calls_on.max(1) as f64,
        });
    }
    for config in &configs {
        config.sidecar.proc.check_alive()?;
    }
    server.proc.check_alive()?;
    let spans_total = receiver.spans();
    if spans_total == 0 {
        bail!("export on: no span reached the OTLP receiver");
    }
    Ok(TraceResult {
        mode,
        machine,
        ticks_per_sec,
        preflight_other_cores,
        other_cores: other_ticks as f64 / ticks_per_sec.max(1) as f64 / window_secs.max(1e-9),
        lanes,
        spans,
        receiver: receiver.to_json(),
        spans_total,
        errors,
        sidecar_env: on_env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        plan,
    })
}
