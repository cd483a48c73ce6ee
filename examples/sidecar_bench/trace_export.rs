//! `--tracing`: what exporting traces costs the sidecar (issue 32).
//!
//! The example server and, in front of it, two sidecars of the same binary that differ only in
//! their environment: *export off* (no `OTEL_*` variable: the request path only asks whether
//! spans are exported) and *export on* (`OTEL_EXPORTER_OTLP_ENDPOINT` naming an OTLP
//! receiver this benchmark runs in its own process, `OTEL_EXPORTER_OTLP_PROTOCOL=grpc` or, with
//! `--tracing-protocol`, `http/protobuf`, and `OTEL_TRACES_SAMPLER=always_on`: every request is
//! a sampled trace, the most export can cost). With `--tracing-before FILE`, a third sidecar
//! runs a build from before tracing existed, with export off: the comparison that shows whether
//! export off costs anything.
//!
//! For each method of the hot path (`tools/call` of `greet`, `tasks/get` of a running task)
//! every sidecar gets the same load in interleaved rounds — off, on, then on, off, … — so
//! drift in the machine's conditions hits all alike, under two load shapes: *paced* (a fixed
//! rate every sidecar keeps up with, `--tracing-rate`, on 8 connections: the same calls per
//! second whatever a call costs, with cores to spare) and *closed loop* (`--connections`
//! connections, each sending as soon as its answer arrived: the sidecar's maximum, where the
//! cores are the limit and everything on them competes, the receiver included).
//!
//! A sidecar's CPU per call is its process's CPU time (all threads, /proc/PID/stat) over the
//! whole method's window — from before its first round to after the receiver has every span
//! of the last one — divided by the calls it answered in its rounds: the batch exporter sends
//! spans from a thread of its own, after the request, and that work is counted too. The
//! receiver's own work is the collector's, not the sidecar's: it runs in the benchmark's
//! process.
//!
//! Every request makes one server span (`tools/call greet`, `tasks/get`) in the exporting
//! sidecar; the receiver counts them by name, so the report says how many of the calls'
//! spans arrived (all, unless the exporter's queue overflowed and it dropped some, which makes
//! the export-on figure too low). No span at all fails the run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use jsonwebtoken::Algorithm;
use serde_json::{Value, json};

use crate::bench_support::otlp::{OtlpReceiver, SPAN_KIND_SERVER};
use crate::bench_support::procs::{MachineTicks, clock_ticks_per_sec, cpu_ticks, preflight_noise};
use crate::client::Template;
use crate::phases::{Accept, Load, closed_loop, paced};
use crate::procs::{Keys, Server, Sidecar, running_task};
use crate::report::Machine;
use crate::run::Binaries;
use crate::stats::{Errors, Summary};
use crate::trace_report::{SpanCheck, TraceResult};

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
    /// Connections of the closed loop.
    pub connections: usize,
    /// Calls per second of the paced load.
    pub rate: f64,
    /// A `lifeguard` binary from before tracing, measured as a third sidecar with export off.
    pub before: Option<PathBuf>,
    /// How the exporting sidecar sends its spans (`--tracing-protocol`).
    pub protocol: lifeguard::telemetry::otel_config::OtlpProtocol,
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
            rate: args
                .tracing_rate
                .unwrap_or(if smoke { 200.0 } else { 2_000.0 }),
            before: args.tracing_before.clone(),
            protocol: args.tracing_protocol,
            smoke,
        }
    }

    pub(crate) fn to_json(&self) -> Value {
        json!({
            "warmup_seconds_per_sidecar_and_method": self.warmup.as_secs_f64(),
            "measured_seconds_per_sidecar_and_method": self.measured.as_secs_f64(),
            "rounds": self.rounds, "closed_loop_connections": self.connections,
            "paced_rate_per_second": self.rate, "paced_connections": PACED_CONNECTIONS,
            "before": self.before.as_ref().map(|p| p.display().to_string()),
            "protocol": self.protocol.to_string(),
        })
    }
}

/// Connections of the paced load.
pub const PACED_CONNECTIONS: usize = 8;

/// How calls are sent.
#[derive(Clone, Copy)]
enum Shape {
    /// A fixed rate (calls per second), on [`PACED_CONNECTIONS`] connections.
    Paced(f64),
    /// Connections each sending as soon as the previous answer arrived.
    Closed(usize),
}

impl Shape {
    fn name(self) -> String {
        match self {
            Self::Paced(rate) => format!("paced, {rate:.0} calls/s"),
            Self::Closed(connections) => format!("closed loop, {connections} connections"),
        }
    }
}

/// A method of the hot path and the name of the server span each of its requests makes.
#[derive(Clone, Copy)]
pub(crate) struct Method {
    pub(crate) name: &'static str,
    pub(crate) span: &'static str,
}

pub(crate) const METHODS: [Method; 2] = [
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
    pub shape: String,
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

    pub(crate) fn round_us_per_call(&self, ticks_per_sec: u64) -> Vec<f64> {
        self.rounds
            .iter()
            .map(|&(n, ticks)| per_call(ticks, n, ticks_per_sec))
            .collect()
    }
}

pub(crate) fn per_call(ticks: u64, calls: u64, ticks_per_sec: u64) -> f64 {
    ticks as f64 * 1e6 / ticks_per_sec.max(1) as f64 / calls.max(1) as f64
}

/// The sidecar's environment without any `OTEL_*` variable.
fn without_otel(env: &[(String, String)]) -> Vec<(String, String)> {
    env.iter()
        .filter(|(k, _)| !k.starts_with("OTEL_"))
        .cloned()
        .collect()
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

/// `method` on `config` in `shape` for `duration`; counts what was sent.
async fn load(
    config: &mut Config,
    shape: Shape,
    method: Method,
    token: &str,
    duration: Duration,
    errors: &mut Errors,
) -> Result<Load> {
    let template = template(config, method, token);
    let mut load = Load::default();
    let endpoint = &config.sidecar.endpoint;
    match shape {
        Shape::Paced(rate) => {
            let (n, accept) = (PACED_CONNECTIONS, Accept::Successes);
            paced(endpoint, &template, n, rate, duration, accept, &mut load).await?;
        }
        Shape::Closed(connections) => {
            closed_loop(endpoint, &template, connections, duration, &mut load).await?;
        }
    }
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

/// The running sidecars, the receiver and what the windows gathered.
struct Lane<'a> {
    plan: &'a TracePlan,
    token: String,
    receiver: OtlpReceiver,
    server: Server,
    configs: Vec<Config>,
    errors: Errors,
    lanes: Vec<TraceLane>,
    spans: Vec<SpanCheck>,
    other_ticks: u64,
    window_secs: f64,
}

impl Lane<'_> {
    /// One method in one load shape: warm-up, then the interleaved rounds, then the wait for
    /// the last spans.
    async fn window(&mut self, shape: Shape, method: Method) -> Result<()> {
        eprintln!("phase: tracing export, {}, {}", shape.name(), method.name);
        let plan = self.plan;
        for config in self.configs.iter_mut() {
            load(
                config,
                shape,
                method,
                &self.token,
                plan.warmup,
                &mut self.errors,
            )
            .await?;
        }
        // The warm-up's spans first: the measured window starts with an empty export queue.
        exported(&self.receiver, &self.configs, method).await;
        if self.receiver.spans_named(method.span, SPAN_KIND_SERVER) == 0 {
            let on = self.configs.iter().find(|c| c.exports);
            bail!(
                "export on: no `{}` span reached the OTLP receiver at {} (spans in all: {})\n{}",
                method.span,
                self.receiver.addr,
                self.receiver.spans(),
                on.map(|c| c.sidecar.proc.logs()).unwrap_or_default()
            );
        }
        let spans_before = self.receiver.spans();
        let started = Instant::now();
        let machine0 = MachineTicks::read().busy_without_irq();
        let ours0 = ours(&self.configs, &self.server);
        let start_ticks: Vec<u64> = self
            .configs
            .iter()
            .map(|c| c.sidecar.proc.cpu_ticks())
            .collect();
        let mut measured: Vec<(Load, Vec<(u64, u64)>)> = self
            .configs
            .iter()
            .map(|_| (Load::default(), Vec::new()))
            .collect();
        let rounds = plan.rounds.max(1);
        let per_round = plan.measured / rounds as u32;
        for round in 0..rounds {
            let n = self.configs.len();
            let order: Vec<usize> = if round % 2 == 0 {
                (0..n).collect()
            } else {
                (0..n).rev().collect()
            };
            for i in order {
                let config = &mut self.configs[i];
                let before = config.sidecar.proc.cpu_ticks();
                let mut l = load(
                    config,
                    shape,
                    method,
                    &self.token,
                    per_round,
                    &mut self.errors,
                )
                .await?;
                let ticks = config.sidecar.proc.cpu_ticks().saturating_sub(before);
                let (total, per) = &mut measured[i];
                per.push((l.requests, ticks));
                total.requests += l.requests;
                total.elapsed += l.elapsed;
                total.samples.append(&mut l.samples);
            }
        }
        let complete = exported(&self.receiver, &self.configs, method).await;
        let busy = MachineTicks::read()
            .busy_without_irq()
            .saturating_sub(machine0);
        let ours = ours(&self.configs, &self.server).saturating_sub(ours0);
        self.other_ticks += busy.saturating_sub(ours);
        self.window_secs += started.elapsed().as_secs_f64();
        let mut measured_calls_on = 0;
        for ((config, (mut total, per)), start) in
            self.configs.iter().zip(measured).zip(start_ticks)
        {
            if config.exports {
                measured_calls_on += total.requests;
            }
            self.lanes.push(TraceLane {
                shape: shape.name(),
                method: method.name,
                config: config.name,
                requests: total.requests,
                secs: total.elapsed.as_secs_f64(),
                window_ticks: config.sidecar.proc.cpu_ticks().saturating_sub(start),
                rounds: per,
                latency: Summary::of(&mut total.samples),
            });
        }
        let calls: u64 = self
            .configs
            .iter()
            .filter(|c| c.exports)
            .map(|c| c.sent.get(method.name).copied().unwrap_or(0))
            .sum();
        let server_spans = self.receiver.spans_named(method.span, SPAN_KIND_SERVER);
        if !complete {
            eprintln!(
                "warning: {server_spans} of {calls} `{}` server spans arrived",
                method.span
            );
        }
        self.spans.push(SpanCheck {
            shape: shape.name(),
            method: method.name,
            calls,
            server_spans,
            spans_per_call: self.receiver.spans().saturating_sub(spans_before) as f64
                / measured_calls_on.max(1) as f64,
        });
        Ok(())
    }
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
    on_env.extend(receiver.env(plan.protocol));
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

    let mut lane = Lane {
        plan: &plan,
        token,
        receiver,
        server,
        configs,
        errors: Errors::default(),
        lanes: Vec::new(),
        spans: Vec::new(),
        other_ticks: 0,
        window_secs: 0.0,
    };
    for shape in [Shape::Paced(plan.rate), Shape::Closed(plan.connections)] {
        for method in METHODS {
            lane.window(shape, method).await?;
        }
    }
    for config in &lane.configs {
        config.sidecar.proc.check_alive()?;
    }
    lane.server.proc.check_alive()?;
    let spans_total = lane.receiver.spans();
    if spans_total == 0 {
        bail!("export on: no span reached the OTLP receiver");
    }
    let Lane {
        receiver,
        errors,
        lanes,
        spans,
        other_ticks,
        window_secs,
        ..
    } = lane;
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
