//! The report of `--tracing` ([`super::trace_export`]): the lane's results, their JSON and
//! Markdown, and the verdict against the target.

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::bench_support::report::{errors_section, heading};
use crate::report::{Machine, Target};
use crate::stats::{Errors, us};
use crate::trace_export::{
    ADDED_CPU_LIMIT_PERCENT, BEFORE, METHODS, OFF, ON, TraceLane, TracePlan, per_call,
};

/// Spans of one method's calls to the exporting sidecar.
pub struct SpanCheck {
    pub shape: String,
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
    fn lane(&self, shape: &str, method: &str, config: &str) -> Option<&TraceLane> {
        self.lanes
            .iter()
            .find(|l| l.shape == shape && l.method == method && l.config == config)
    }

    /// The load shapes, in the order they ran.
    fn shapes(&self) -> Vec<&str> {
        let mut shapes: Vec<&str> = Vec::new();
        for l in &self.lanes {
            if !shapes.contains(&l.shape.as_str()) {
                shapes.push(&l.shape);
            }
        }
        shapes
    }

    /// CPU per call of `config` against `base`: added µs, and added percent over the windows
    /// and the smallest and largest of the rounds' (paired by round).
    pub fn added(&self, shape: &str, method: &str, config: &str, base: &str) -> Option<Added> {
        let (c, b) = (
            self.lane(shape, method, config)?,
            self.lane(shape, method, base)?,
        );
        let t = self.ticks_per_sec;
        let (cu, bu) = (c.cpu_us_per_call(t), b.cpu_us_per_call(t));
        let rounds: Vec<f64> = c
            .round_us_per_call(t)
            .iter()
            .zip(b.round_us_per_call(t))
            .map(|(c, b)| (c / b.max(1e-9) - 1.0) * 100.0)
            .collect();
        Some(Added {
            us: cu - bu,
            percent: (cu / bu.max(1e-9) - 1.0) * 100.0,
            min: rounds.iter().copied().fold(f64::INFINITY, f64::min),
            max: rounds.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        })
    }

    pub fn targets(&self) -> Vec<Target> {
        let mut targets = Vec::new();
        for shape in self.shapes() {
            for m in &METHODS {
                let Some(added) = self.added(shape, m.name, ON, OFF) else {
                    continue;
                };
                let complete = self
                    .spans
                    .iter()
                    .find(|s| s.shape == shape && s.method == m.name)
                    .is_some_and(|s| s.server_spans >= s.calls);
                targets.push(Target {
                    name: format!(
                        "tracing export ({}, always_on): sidecar CPU per {} added over export off, {shape}",
                        self.plan.protocol,
                        m.name
                    ),
                    measured: added.percent,
                    limit: ADDED_CPU_LIMIT_PERCENT,
                    unit: "%",
                    at_least: false,
                    not_applicable: if self.plan.smoke {
                        Some("smoke run: too short to measure".to_owned())
                    } else if !complete {
                        Some(format!(
                            "measured {:.1} %, but the exporter dropped spans: the cost of \
                             exporting them all is higher",
                            added.percent
                        ))
                    } else {
                        None
                    },
                });
            }
        }
        targets
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
            "tracing export (issue 32): {:.1} s per sidecar, method and load shape in {} interleaved rounds",
            p.measured.as_secs_f64(),
            p.rounds
        );
        let _ = writeln!(
            o,
            "  export on: OTLP {} to a receiver in the bench process, OTEL_TRACES_SAMPLER=always_on\n",
            p.protocol
        );
        for shape in self.shapes() {
            let _ = writeln!(o, "{shape}");
            let _ = writeln!(
                o,
                "{:<10} {:<27} {:>9} {:>8} {:>8} {:>8} | {:>11} {:>10}  rounds (cpu µs/call)",
                "method",
                "sidecar",
                "calls",
                "calls/s",
                "p50 µs",
                "p99 µs",
                "cpu µs/call",
                "spans/call"
            );
            for l in self.lanes.iter().filter(|l| l.shape == shape) {
                let rounds: Vec<String> = l
                    .round_us_per_call(self.ticks_per_sec)
                    .iter()
                    .map(|v| format!("{v:.1}"))
                    .collect();
                let spans = if l.config == ON {
                    self.spans
                        .iter()
                        .find(|s| s.shape == shape && s.method == l.method)
                        .map_or("-".to_owned(), |s| format!("{:.2}", s.spans_per_call))
                } else {
                    "-".to_owned()
                };
                let _ = writeln!(
                    o,
                    "{:<10} {:<27} {:>9} {:>8.0} {:>8} {:>8} | {:>11.2} {:>10}  {}",
                    l.method,
                    l.config,
                    l.requests,
                    l.requests as f64 / l.secs.max(1e-9),
                    us(l.latency.p50),
                    us(l.latency.p99),
                    l.cpu_us_per_call(self.ticks_per_sec),
                    spans,
                    rounds.join(" ")
                );
            }
            for m in &METHODS {
                let mut pairs = vec![(ON, OFF)];
                if self.lane(shape, m.name, BEFORE).is_some() {
                    pairs.push((OFF, BEFORE));
                }
                for (config, base) in pairs {
                    if let Some(a) = self.added(shape, m.name, config, base) {
                        let _ = writeln!(
                            o,
                            "  {}: {config} vs {base}: {:+.2} µs = {:+.1} % CPU per call (rounds {:+.1} … {:+.1} %)",
                            m.name, a.us, a.percent, a.min, a.max
                        );
                    }
                }
            }
            for s in self.spans.iter().filter(|s| s.shape == shape) {
                let lost = s.calls.saturating_sub(s.server_spans);
                let _ = writeln!(
                    o,
                    "  {}: {} server spans received for {} calls to the exporting sidecar{}",
                    s.method,
                    s.server_spans,
                    s.calls,
                    if lost > 0 {
                        format!(
                            " — WARNING: {lost} missing, dropped by the exporter's full queue: \
                             export on is cheaper than exporting them all"
                        )
                    } else {
                        " (all)".to_owned()
                    },
                );
            }
            o.push('\n');
        }
        let _ = writeln!(
            o,
            "  (cpu µs/call: the sidecar process's CPU over the method's window, export included, \
             per call answered; spans/call: spans of any name received per call in that window; \
             rounds: the sidecar's CPU during each of its rounds, per call)"
        );
        let _ = writeln!(o, "spans received: {} in all", self.spans_total);
        let _ = writeln!(o, "\ntargets");
        for t in self.targets() {
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
        let t = self.ticks_per_sec;
        let added = |config, base| {
            let mut rows = Vec::new();
            for shape in self.shapes() {
                for m in &METHODS {
                    if let Some(a) = self.added(shape, m.name, config, base) {
                        rows.push(json!({"shape": shape, "method": m.name, "us": a.us,
                            "percent": a.percent, "rounds_min_percent": a.min,
                            "rounds_max_percent": a.max}));
                    }
                }
            }
            rows
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
                "shape": l.shape, "method": l.method, "sidecar": l.config,
                "calls": l.requests, "secs": l.secs,
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
                "per_lane": self.spans.iter().map(|s| json!({
                    "shape": s.shape, "method": s.method, "calls": s.calls,
                    "server_spans": s.server_spans, "spans_per_call": s.spans_per_call,
                    "complete": s.server_spans >= s.calls,
                })).collect::<Vec<_>>(),
                "receiver": self.receiver,
            },
            "targets": self.targets().iter().map(Target::to_json).collect::<Vec<_>>(),
            "errors": {"count": self.errors.count, "examples": self.errors.examples},
            "passed": self.errors.count == 0,
        })
    }
}

/// CPU per call added: µs, percent over the windows, and the rounds' smallest and largest
/// percent.
pub struct Added {
    pub us: f64,
    pub percent: f64,
    pub min: f64,
    pub max: f64,
}
