//! The report of `--rate-limits` ([`super::rate_limits`]): the lane's results, the targets of
//! issue 33 with their verdicts, the table and the JSON.

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::bench_support::report::{errors_section, heading};
use crate::phases::Load;
use crate::rate_limits::{
    ALLOWING, FLOOD_FACTOR, Isolation, LEASE_SECS, NO_LIMIT, QUIET_P50_LIMIT, REFUSING, RatePlan,
    SHARED_LOWER_FRACTION,
};
use crate::report::{Machine, Target};
use crate::stats::{Errors, Summary, us};
use crate::trace_export::per_call;

/// One sidecar of the CPU part.
pub struct CpuLane {
    pub config: &'static str,
    /// Successes are the allowed calls, `refused` the 429s.
    pub load: Load,
    /// The sidecar's CPU over its measured rounds.
    pub ticks: u64,
    /// Per round: (calls answered, CPU ticks).
    pub rounds: Vec<(u64, u64)>,
}

impl CpuLane {
    pub fn answered(&self) -> u64 {
        self.load.requests + self.load.refused.len() as u64
    }

    pub fn us_per_call(&self, ticks_per_sec: u64) -> f64 {
        per_call(self.ticks, self.answered(), ticks_per_sec)
    }
}

/// One round of the three replicas, from a full bucket.
pub struct SharedRound {
    pub secs: f64,
    pub admitted: u64,
    pub refused: u64,
    pub per_replica: Vec<u64>,
}

/// Everything the lane produced.
pub struct RateResult {
    pub mode: &'static str,
    pub machine: Machine,
    pub plan: RatePlan,
    pub ticks_per_sec: u64,
    pub preflight_other_cores: f64,
    pub isolation: Isolation,
    pub cpu: Vec<CpuLane>,
    pub shared: Vec<SharedRound>,
    /// `lifeguard_errors_total{reason="rate_limit_store"}` over the replicas at the end: charges
    /// that fell back to a replica's memory (0 when the database answered every one).
    pub shared_fallbacks: f64,
    pub errors: Errors,
}

/// A round's bounds: (at most `burst + limit × (T + lease)`, at least the stated fraction of
/// `burst + limit × T`).
fn bounds(plan: &RatePlan, secs: f64) -> (f64, f64) {
    let burst = plan.limit.ceil();
    (
        burst + plan.limit * (secs + LEASE_SECS),
        SHARED_LOWER_FRACTION * (burst + plan.limit * secs),
    )
}

impl RateResult {
    fn lane(&self, config: &str) -> Option<&CpuLane> {
        self.cpu.iter().find(|l| l.config == config)
    }

    pub fn targets(&self) -> Vec<Target> {
        let smoke = self
            .plan
            .smoke
            .then(|| "smoke run: too short to measure".to_owned());
        let i = &self.isolation;
        let mut targets = Vec::new();
        let t =
            |name: String, measured: f64, limit: f64, unit, at_least, na: Option<String>| Target {
                name,
                measured,
                limit,
                unit,
                at_least,
                not_applicable: na,
            };
        let quiet_failed =
            (i.quiet_beside.refused.len() as u64 + i.quiet_beside.errors.count) as f64;
        targets.push(t(
            "quiet principal beside a 10× flood: calls refused or failed".into(),
            quiet_failed,
            0.0,
            "calls",
            false,
            None,
        ));
        let (alone, beside) = (i.quiet_alone.rps(), i.quiet_beside.rps());
        targets.push(t(
            "quiet principal beside the flood: throughput, of its throughput alone".into(),
            beside / alone.max(1e-9),
            0.99,
            "×",
            true,
            smoke.clone(),
        ));
        targets.push(t(
            "quiet principal beside the flood: median latency, of its median alone".into(),
            i.quiet_beside_latency.p50 as f64 / i.quiet_alone_latency.p50.max(1) as f64,
            QUIET_P50_LIMIT,
            "×",
            false,
            smoke.clone(),
        ));
        targets.push(t(
            "flood: admitted calls, of burst + limit × seconds (one sidecar: exact)".into(),
            i.flood.requests as f64 / i.flood_bound.max(1e-9),
            1.0,
            "×",
            false,
            None,
        ));
        if let (Some(refusing), Some(allowing)) = (self.lane(REFUSING), self.lane(ALLOWING)) {
            let tps = self.ticks_per_sec;
            targets.push(t(
                format!(
                    "sidecar CPU per refused call, of its CPU per allowed greet ({:.0} calls/s)",
                    self.plan.cpu_rate
                ),
                refusing.us_per_call(tps) / allowing.us_per_call(tps).max(1e-9),
                1.0,
                "×",
                false,
                smoke.clone(),
            ));
        }
        for (n, r) in self.shared.iter().enumerate() {
            let (most, least) = bounds(&self.plan, r.secs);
            targets.push(t(
                format!("3 replicas on PostgreSQL, round {}: admitted calls, of burst + limit × (T + 0.25 s)", n + 1),
                r.admitted as f64 / most,
                1.0,
                "×",
                false,
                None,
            ));
            targets.push(t(
                format!(
                    "3 replicas on PostgreSQL, round {}: admitted calls, of burst + limit × T",
                    n + 1
                ),
                r.admitted as f64 / (least / SHARED_LOWER_FRACTION),
                SHARED_LOWER_FRACTION,
                "×",
                true,
                smoke.clone(),
            ));
        }
        targets.push(t(
            "3 replicas on PostgreSQL: charges that fell back to a replica's memory".into(),
            self.shared_fallbacks,
            0.0,
            "charges",
            false,
            None,
        ));
        targets
    }

    pub fn table(&self) -> String {
        let mut o = String::new();
        heading(
            &mut o,
            "sidecar rate-limit",
            self.mode,
            &self.machine.host,
            "limits refuse, isolate and hold across replicas",
        );
        let p = &self.plan;
        let _ = writeln!(
            o,
            "noise:   other processes used {:.2} cores before the run\n",
            self.preflight_other_cores
        );
        let i = &self.isolation;
        let _ = writeln!(
            o,
            "isolation: perPrincipal {{requestsPerSecond: {0}, burst: {0}}}; quiet principal at {1} calls/s, \
             flood at {2} calls/s ({FLOOD_FACTOR}×); {3} interleaved rounds of {4:.1} s",
            p.limit,
            p.quiet_rate(),
            p.flood_rate(),
            p.rounds,
            p.round.as_secs_f64()
        );
        let _ = writeln!(
            o,
            "{:<26} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
            "load", "ok", "refused", "calls/s", "p50 µs", "p90 µs", "p99 µs"
        );
        let row = |o: &mut String, name: &str, l: &Load, s: &Summary| {
            let _ = writeln!(
                o,
                "{:<26} {:>8} {:>8} {:>8.1} {:>8} {:>8} {:>8}",
                name,
                l.requests,
                l.refused.len(),
                l.rps(),
                us(s.p50),
                us(s.p90),
                us(s.p99)
            );
        };
        row(
            &mut o,
            "quiet, alone",
            &i.quiet_alone,
            &i.quiet_alone_latency,
        );
        row(
            &mut o,
            "quiet, beside the flood",
            &i.quiet_beside,
            &i.quiet_beside_latency,
        );
        let mut refused = i.flood.refused.clone();
        let refused_latency = Summary::of(&mut refused);
        row(
            &mut o,
            "flood (latency: refusals)",
            &i.flood,
            &refused_latency,
        );
        let _ = writeln!(
            o,
            "  flood admitted {} calls; its buckets allowed at most {:.0}\n",
            i.flood.requests, i.flood_bound
        );
        let tps = self.ticks_per_sec;
        let _ = writeln!(
            o,
            "CPU per call: greet paced at {} calls/s on 8 connections, {} interleaved rounds of {:.1} s per sidecar",
            p.cpu_rate,
            p.rounds,
            p.round.as_secs_f64()
        );
        let _ = writeln!(
            o,
            "{:<22} {:>8} {:>8} {:>8} {:>8} | {:>11}  rounds (cpu µs/call)",
            "sidecar", "ok", "refused", "p50 µs", "p99 µs", "cpu µs/call"
        );
        for l in &self.cpu {
            let mut all: Vec<u64> = l
                .load
                .samples
                .iter()
                .chain(&l.load.refused)
                .copied()
                .collect();
            let s = Summary::of(&mut all);
            let rounds: Vec<String> = l
                .rounds
                .iter()
                .map(|&(n, t)| format!("{:.1}", per_call(t, n, tps)))
                .collect();
            let _ = writeln!(
                o,
                "{:<22} {:>8} {:>8} {:>8} {:>8} | {:>11.2}  {}",
                l.config,
                l.load.requests,
                l.load.refused.len(),
                us(s.p50),
                us(s.p99),
                l.us_per_call(tps),
                rounds.join(" ")
            );
        }
        if let (Some(none), Some(allowing)) = (self.lane(NO_LIMIT), self.lane(ALLOWING)) {
            let _ = writeln!(
                o,
                "  the check on an allowed call: {:+.2} µs CPU ({ALLOWING} vs {NO_LIMIT})",
                allowing.us_per_call(tps) - none.us_per_call(tps)
            );
        }
        let _ = writeln!(
            o,
            "\nthree replicas on PostgreSQL: one principal at {} calls/s over the three, limit {} per second (burst {})",
            p.flood_rate(),
            p.limit,
            p.limit.ceil()
        );
        for (n, r) in self.shared.iter().enumerate() {
            let (most, least) = bounds(p, r.secs);
            let _ = writeln!(
                o,
                "  round {}: {:.2} s, admitted {} (per replica {:?}), refused {}; allowed at most {most:.0}, \
                 at least {least:.0} ({:.3}× of burst + limit × T)",
                n + 1,
                r.secs,
                r.admitted,
                r.per_replica,
                r.refused,
                r.admitted as f64 / (least / SHARED_LOWER_FRACTION)
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
        let tps = self.ticks_per_sec;
        let i = &self.isolation;
        let load = |l: &Load, s: &Summary| {
            json!({"ok": l.requests, "refused": l.refused.len(), "secs": l.elapsed.as_secs_f64(),
                   "calls_per_second": l.rps(), "latency": s.to_json()})
        };
        json!({
            "mode": self.mode,
            "machine": self.machine.to_json(),
            "plan": self.plan.to_json(),
            "ticks_per_sec": tps,
            "preflight_other_cores": self.preflight_other_cores,
            "isolation": {
                "quiet_alone": load(&i.quiet_alone, &i.quiet_alone_latency),
                "quiet_beside_flood": load(&i.quiet_beside, &i.quiet_beside_latency),
                "flood": {"admitted": i.flood.requests, "refused": i.flood.refused.len(),
                          "admitted_at_most": i.flood_bound},
            },
            "cpu": self.cpu.iter().map(|l| json!({
                "sidecar": l.config, "allowed": l.load.requests, "refused": l.load.refused.len(),
                "cpu_ticks": l.ticks, "cpu_us_per_call": l.us_per_call(tps),
                "rounds": l.rounds.iter().map(|&(n, t)| json!({
                    "calls": n, "cpu_ticks": t, "cpu_us_per_call": per_call(t, n, tps),
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "shared": {
                "rounds": self.shared.iter().map(|r| {
                    let (most, least) = bounds(&self.plan, r.secs);
                    json!({"secs": r.secs, "admitted": r.admitted, "refused": r.refused,
                           "per_replica": r.per_replica, "at_most": most, "at_least": least})
                }).collect::<Vec<_>>(),
                "fallbacks_to_memory": self.shared_fallbacks,
            },
            "targets": self.targets().iter().map(Target::to_json).collect::<Vec<_>>(),
            "errors": {"count": self.errors.count, "examples": self.errors.examples},
            "passed": self.errors.count == 0,
        })
    }
}
