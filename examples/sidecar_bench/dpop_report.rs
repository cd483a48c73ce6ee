//! The report of `--dpop` ([`super::dpop`]): the lane's results, their JSON and table, and the
//! verdict against the target.

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::bench_support::report::{errors_section, heading};
use crate::dpop::{ADDED_CPU_LIMIT_US, DpopPlan, Variant};
use crate::report::{Machine, Target};
use crate::stats::{Errors, Summary, us};
use crate::trace_export::per_call;
use crate::trace_report::Added;

/// One variant's outcome in one load shape.
pub struct DpopLane {
    pub shape: String,
    pub variant: Variant,
    /// Calls answered with success in the measured rounds.
    pub calls: u64,
    /// Calls of the measured rounds that failed.
    pub failed: u64,
    pub secs: f64,
    /// The sidecar's CPU over the measured rounds (ticks).
    pub ticks: u64,
    /// Per round: (calls answered, the sidecar's CPU ticks during the round).
    pub rounds: Vec<(u64, u64)>,
    pub latency: Summary,
}

impl DpopLane {
    pub fn cpu_us_per_call(&self, ticks_per_sec: u64) -> f64 {
        per_call(self.ticks, self.calls, ticks_per_sec)
    }

    fn round_us_per_call(&self, ticks_per_sec: u64) -> Vec<f64> {
        self.rounds
            .iter()
            .map(|&(n, ticks)| per_call(ticks, n, ticks_per_sec))
            .collect()
    }
}

/// Time per call of one in-process measurement, in ns.
pub struct Timing {
    /// The thread's CPU time, when the kernel says (/proc/thread-self/schedstat).
    pub cpu_ns_per_call: Option<f64>,
    pub wall_ns_per_call: f64,
}

impl Timing {
    /// CPU per call, or wall time when CPU is unknown (one thread, no waiting: nearly equal).
    pub fn ns(&self) -> f64 {
        self.cpu_ns_per_call.unwrap_or(self.wall_ns_per_call)
    }

    fn to_json(&self) -> Value {
        json!({
            "cpu_us_per_call": self.cpu_ns_per_call.map(|ns| ns / 1000.0),
            "wall_us_per_call": self.wall_ns_per_call / 1000.0,
        })
    }

    fn text(&self) -> String {
        match self.cpu_ns_per_call {
            Some(cpu) => format!(
                "{:.1} µs CPU per call ({:.1} µs wall)",
                cpu / 1000.0,
                self.wall_ns_per_call / 1000.0
            ),
            None => format!(
                "{:.1} µs wall per call (no thread CPU time on this kernel)",
                self.wall_ns_per_call / 1000.0
            ),
        }
    }
}

/// Proof verification in the bench's own thread: no network, no sidecar.
pub struct InProcess {
    pub proofs: usize,
    /// `lifeguard::identity::dpop::verify_proof`.
    pub verify: Timing,
    /// `verify_proof` building the proof's key for every proof (no key kept).
    pub verify_key_built: Timing,
    /// The signature check alone (aws-lc-rs, the key built once).
    pub signature: Timing,
}

/// Everything the lane produced.
pub struct DpopResult {
    pub mode: &'static str,
    pub machine: Machine,
    pub plan: DpopPlan,
    pub ticks_per_sec: u64,
    pub preflight_other_cores: f64,
    /// Cores' worth of CPU other processes used over the measured rounds.
    pub other_cores: f64,
    pub lanes: Vec<DpopLane>,
    pub in_process: InProcess,
    pub errors: Errors,
    pub sidecar_env: Vec<String>,
}

impl DpopResult {
    fn lane(&self, shape: &str, variant: Variant) -> Option<&DpopLane> {
        self.lanes
            .iter()
            .find(|l| l.shape == shape && l.variant == variant)
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

    /// CPU per call DPoP adds over bearer in `shape`: µs, percent over the rounds together,
    /// and the smallest and largest percent of the rounds (paired by round; a round whose
    /// bearer CPU read zero ticks, in a run too short for the clock, is left out: NaN when
    /// all are).
    pub fn added(&self, shape: &str) -> Option<Added> {
        let (d, b) = (
            self.lane(shape, Variant::Dpop)?,
            self.lane(shape, Variant::Bearer)?,
        );
        let t = self.ticks_per_sec;
        let (du, bu) = (d.cpu_us_per_call(t), b.cpu_us_per_call(t));
        let rounds: Vec<f64> = d
            .round_us_per_call(t)
            .iter()
            .zip(b.round_us_per_call(t))
            .filter(|&(_, b)| b > 0.0)
            .map(|(d, b)| (d / b - 1.0) * 100.0)
            .collect();
        let (min, max) = if rounds.is_empty() {
            (f64::NAN, f64::NAN)
        } else {
            (
                rounds.iter().copied().fold(f64::INFINITY, f64::min),
                rounds.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            )
        };
        Some(Added {
            us: du - bu,
            percent: (du / bu.max(1e-9) - 1.0) * 100.0,
            min,
            max,
        })
    }

    /// The paced shape, where the target is judged.
    fn paced(&self) -> Option<&str> {
        self.shapes().into_iter().find(|s| s.starts_with("paced"))
    }

    pub fn targets(&self) -> Vec<Target> {
        let Some(shape) = self.paced() else {
            return Vec::new();
        };
        let Some(added) = self.added(shape) else {
            return Vec::new();
        };
        let failed: u64 = self
            .lanes
            .iter()
            .filter(|l| l.shape == shape)
            .map(|l| l.failed)
            .sum();
        vec![Target {
            name: format!(
                "DPoP ({}): sidecar CPU a DPoP-verified greet adds over a bearer one (proof \
                 verification and replay cache included), {shape}",
                self.plan.alg.as_str()
            ),
            measured: added.us,
            limit: ADDED_CPU_LIMIT_US,
            unit: "µs",
            at_least: false,
            not_applicable: if self.plan.smoke {
                Some("smoke run: too short to measure".to_owned())
            } else if failed > 0 {
                Some(format!(
                    "measured {:.1} µs, but {failed} calls failed: not all were verified calls",
                    added.us
                ))
            } else {
                None
            },
        }]
    }

    pub fn table(&self) -> String {
        let mut o = String::new();
        heading(
            &mut o,
            "sidecar DPoP",
            self.mode,
            &self.machine.host,
            "bearer and DPoP calls both work",
        );
        let p = &self.plan;
        let t = self.ticks_per_sec;
        let _ = writeln!(
            o,
            "noise:   other processes used {:.2} cores before the run, {:.2} during the measured rounds\n",
            self.preflight_other_cores, self.other_cores
        );
        let _ = writeln!(
            o,
            "DPoP (issue 34): tools/call greet through one sidecar (SQLite ledger: proofs remembered in memory), \
             bearer and DPoP in {} interleaved rounds",
            p.rounds
        );
        let _ = writeln!(
            o,
            "  bearer: Authorization: Bearer <token>; DPoP: Authorization: DPoP <the same claims + cnf.jkt> \
             and DPoP: <a fresh {} proof>;\n  every request built before its round; checked first: \
             a DPoP call succeeds, its proof again and the bound token as bearer get 401\n",
            p.alg.as_str()
        );
        for shape in self.shapes() {
            let _ = writeln!(o, "{shape}");
            let _ = writeln!(
                o,
                "{:<8} {:>9} {:>8} {:>8} {:>8} {:>7} | {:>11}  rounds (cpu µs/call)",
                "variant", "calls", "calls/s", "p50 µs", "p99 µs", "failed", "cpu µs/call"
            );
            for l in self.lanes.iter().filter(|l| l.shape == shape) {
                let rounds: Vec<String> = l
                    .round_us_per_call(t)
                    .iter()
                    .map(|v| format!("{v:.1}"))
                    .collect();
                let _ = writeln!(
                    o,
                    "{:<8} {:>9} {:>8.0} {:>8} {:>8} {:>7} | {:>11.2}  {}",
                    l.variant.name(),
                    l.calls,
                    l.calls as f64 / l.secs.max(1e-9),
                    us(l.latency.p50),
                    us(l.latency.p99),
                    l.failed,
                    l.cpu_us_per_call(t),
                    rounds.join(" ")
                );
            }
            if let Some(a) = self.added(shape) {
                let _ = writeln!(
                    o,
                    "  DPoP vs bearer: {:+.2} µs = {:+.1} % CPU per call (rounds {:+.1} … {:+.1} %)",
                    a.us, a.percent, a.min, a.max
                );
            }
            o.push('\n');
        }
        let _ = writeln!(
            o,
            "  (cpu µs/call: the sidecar process's CPU during the variant's rounds, per call \
             answered; rounds: the same for each of its rounds)"
        );
        let ip = &self.in_process;
        let _ = writeln!(
            o,
            "\nin process (the bench's own thread: no network, no sidecar), {} fresh {} proofs",
            ip.proofs,
            p.alg.as_str()
        );
        let _ = writeln!(
            o,
            "  verify_proof (RFC 9449 §4.3, replay excepted), key kept: {}",
            ip.verify.text()
        );
        let _ = writeln!(
            o,
            "  verify_proof building the key for every proof:          {}",
            ip.verify_key_built.text()
        );
        let _ = writeln!(
            o,
            "  {:<5} signature check alone (aws-lc-rs, key built once): {} = {:.0} % of verify_proof",
            p.alg.as_str(),
            ip.signature.text(),
            ip.signature.ns() / ip.verify.ns().max(1e-9) * 100.0
        );
        if let Some(shape) = self.paced()
            && let Some(a) = self.added(shape)
            && a.us > 0.0
        {
            let _ = writeln!(
                o,
                "  of the {:.1} µs a DPoP call added ({shape}): verify_proof {:.0} %, the signature {:.0} %",
                a.us,
                ip.verify.ns() / 1000.0 / a.us * 100.0,
                ip.signature.ns() / 1000.0 / a.us * 100.0
            );
        }
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
        let added: Vec<Value> = self
            .shapes()
            .into_iter()
            .filter_map(|shape| {
                let a = self.added(shape)?;
                Some(json!({"shape": shape, "us": a.us, "percent": a.percent,
                    "rounds_min_percent": a.min, "rounds_max_percent": a.max}))
            })
            .collect();
        let ip = &self.in_process;
        json!({
            "mode": self.mode,
            "machine": self.machine.to_json(),
            "plan": self.plan.to_json(),
            "sidecar_env": self.sidecar_env,
            "ticks_per_sec": t,
            "preflight_other_cores": self.preflight_other_cores,
            "other_cores": self.other_cores,
            "lanes": self.lanes.iter().map(|l| json!({
                "shape": l.shape, "variant": l.variant.name(),
                "calls": l.calls, "failed": l.failed, "secs": l.secs,
                "calls_per_second": l.calls as f64 / l.secs.max(1e-9),
                "cpu_ticks": l.ticks,
                "cpu_us_per_call": l.cpu_us_per_call(t),
                "rounds": l.rounds.iter().map(|&(n, ticks)| json!({
                    "calls": n, "cpu_ticks": ticks, "cpu_us_per_call": per_call(ticks, n, t),
                })).collect::<Vec<_>>(),
                "latency": l.latency.to_json(),
            })).collect::<Vec<_>>(),
            "added_by_dpop": added,
            "in_process": {
                "proofs": ip.proofs,
                "verify_proof": ip.verify.to_json(),
                "verify_proof_key_built_per_proof": ip.verify_key_built.to_json(),
                "signature_only": ip.signature.to_json(),
                "cpu_clock": "/proc/thread-self/schedstat",
            },
            "targets": self.targets().iter().map(Target::to_json).collect::<Vec<_>>(),
            "errors": {"count": self.errors.count, "examples": self.errors.examples},
            "passed": self.errors.count == 0,
        })
    }
}
