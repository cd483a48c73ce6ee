//! The human-readable table, the targets and the JSON file.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{Value, json};

use crate::bench_support::machine::Machine;
use crate::bench_support::procs::Memory;
use crate::bench_support::report::{errors_section, heading, load, mib};
use crate::cpu::Cpu;
use crate::fleet::Counters as FleetCounters;
use crate::measure::{AfterQuiet, Kind, Record, Reviews};
use crate::stats::{Errors, Summary, ms};

/// A target of the issue; the report prints its numbers with one decimal.
pub type Target = crate::bench_support::report::Target<1>;

/// Noise indicators around the run.
#[derive(Clone, Debug, Default)]
pub struct Noise {
    pub load_before: [f64; 3],
    pub load_after: [f64; 3],
    /// Cores' worth of CPU other processes used in the second before the run.
    pub preflight_other_cores: f64,
    /// Cores' worth of CPU other processes used on average during the measured runs.
    pub runs_other_cores: f64,
}

/// Setup facts.
#[derive(Clone, Debug, Default)]
pub struct Setup {
    pub sidecars: usize,
    pub policies: usize,
    pub runs: usize,
    pub connect_parallel: usize,
    pub decoys_same_issuer: bool,
    /// Longest wait for one propagation: slower ones are counted as this long.
    pub timeout: Duration,
    pub objects_created: Duration,
    pub operator_ready: Duration,
    pub policy_status_written: Duration,
    pub initial_sync: Duration,
    pub dial_to_first_ack: Summary,
}

/// Everything one run produced.
pub struct Results {
    pub mode: &'static str,
    pub machine: Machine,
    pub setup: Setup,
    pub noise: Noise,
    pub records: Vec<Record>,
    pub memory: Vec<(String, Memory)>,
    pub peak_rss_kib: u64,
    pub fleet: FleetCounters,
    pub reviews: Reviews,
    pub after_quiet: Option<AfterQuiet>,
    pub targets: Vec<Target>,
    pub errors: Errors,
}

fn f1(d: Duration) -> String {
    format!("{:.1}", ms(d))
}

fn of(records: &[Record], kind: Kind, pick: impl Fn(&Record) -> Option<Duration>) -> Summary {
    let samples: Vec<Duration> = records
        .iter()
        .filter(|r| r.kind == kind)
        .filter_map(pick)
        .collect();
    Summary::of(&samples)
}

fn mean(records: &[&Record], pick: impl Fn(&Record) -> f64) -> f64 {
    if records.is_empty() {
        return 0.0;
    }
    records.iter().map(|r| pick(r)).sum::<f64>() / records.len() as f64
}

impl Results {
    fn of_kind(&self, kind: Kind) -> Vec<&Record> {
        self.records.iter().filter(|r| r.kind == kind).collect()
    }

    /// The human-readable report.
    pub fn table(&self) -> String {
        let (m, s, n) = (&self.machine, &self.setup, &self.noise);
        let mut o = String::new();
        heading(&mut o, "operator", self.mode, m, "every measurement works");
        let _ = writeln!(
            o,
            "setup:   {} pods selected by policy `bench`, {} decoy policies selecting nothing ({} issuer); \
             {} light sidecars, one HTTPS connection each; API: the kmock emulator",
            s.sidecars,
            s.policies.saturating_sub(1),
            if s.decoys_same_issuer {
                "same"
            } else {
                "another"
            },
            s.sidecars
        );
        let _ = writeln!(
            o,
            "noise:   load average {} before, {} after; other processes used {:.2} cores in the second \
             before the run and {:.2} cores on average during the runs",
            load(n.load_before),
            load(n.load_after),
            n.preflight_other_cores,
            n.runs_other_cores
        );
        let _ = writeln!(
            o,
            "startup: objects created in {:.1} s; operator ready in {:.1} s; status of all {} policies \
             written {:.1} s later",
            s.objects_created.as_secs_f64(),
            s.operator_ready.as_secs_f64(),
            s.policies,
            s.policy_status_written.as_secs_f64()
        );
        let d = &s.dial_to_first_ack;
        let _ = writeln!(
            o,
            "initial sync: {} sidecars, {} dialling at a time, all acknowledged after {:.1} s; per \
             sidecar, turn to dial → first ack accepted: p50 {} p99 {} max {} ms (TLS, the operator's \
             TokenReview against the emulator, first snapshot, ack)\n",
            s.sidecars,
            s.connect_parallel,
            s.initial_sync.as_secs_f64(),
            f1(d.p50),
            f1(d.p99),
            f1(d.max)
        );

        let _ = writeln!(
            o,
            "propagation to {} sidecars, {} runs each (ms, from just before the request)",
            s.sidecars, s.runs
        );
        let _ = writeln!(
            o,
            "{:<40} {:>3} {:>3} {:>9} {:>9} {:>9} {:>9} | {:>7} {:>8} {:>9} {:>8} {:>9} | {:>6}",
            "measurement",
            "n",
            "t/o",
            "p50",
            "p90",
            "p99",
            "max",
            "request",
            "1st ack",
            "last sent",
            "status",
            "prop.ms",
            "op cpu"
        );
        for kind in Kind::ALL {
            let last = of(&self.records, kind, |r| Some(r.to_last_ack));
            let request = of(&self.records, kind, |r| Some(r.request));
            let first = of(&self.records, kind, |r| Some(r.to_first_ack));
            let sent = of(&self.records, kind, |r| Some(r.to_last_sent));
            let status = of(&self.records, kind, |r| r.status_seen);
            let millis = of(&self.records, kind, |r| {
                r.propagation_millis
                    .map(|v| Duration::from_millis(v.max(0) as u64))
            });
            let runs = self.of_kind(kind);
            let timed_out = runs.iter().filter(|r| r.timed_out.is_some()).count();
            // A timed-out run counts as the timeout: a percentile that lands on one is a lower
            // bound.
            let bound = |d: Duration| {
                if timed_out > 0 && d >= s.timeout {
                    format!(">{}", f1(d))
                } else {
                    f1(d)
                }
            };
            let _ = writeln!(
                o,
                "{:<40} {:>3} {:>3} {:>9} {:>9} {:>9} {:>9} | {:>7} {:>8} {:>9} {:>8} {:>9} | {:>6.2}",
                kind.label(),
                last.n,
                timed_out,
                bound(last.p50),
                bound(last.p90),
                bound(last.p99),
                bound(last.max),
                f1(request.p50),
                f1(first.p50),
                f1(sent.p50),
                if status.n > 0 {
                    f1(status.p50)
                } else {
                    "-".into()
                },
                if millis.n > 0 {
                    format!("{:.0}/{:.0}", ms(millis.p50), ms(millis.p99))
                } else {
                    "-".into()
                },
                mean(&runs, |r| r.cpu_to_last_ack.operator),
            );
        }
        let _ = writeln!(
            o,
            "  (p50…max: to the last sidecar's acknowledgement accepted by the operator; t/o: runs \
             where not every sidecar acknowledged within the timeout, counted as the timeout (>); request, 1st ack, \
             last sent (every sidecar had it in force), status (bench saw status report completion, \
             polled every 50 ms after the last ack): p50s; prop.ms: the revocation's \
             status.propagationMillis p50/p99; op cpu: operator CPU seconds from the request to the \
             last ack, mean)\n"
        );

        let _ = writeln!(
            o,
            "operator work per cycle (request → propagated → status written → revocation deleted \
             and that propagated → idle), mean"
        );
        let _ = writeln!(
            o,
            "{:<40} {:>7} {:>6} {:>8} {:>9} {:>7} {:>10} | {:>6} {:>6} {:>6} {:>6}",
            "measurement",
            "cycle s",
            "plans",
            "plan ms",
            "snapshots",
            "status",
            "reconciles",
            "op s",
            "emu s",
            "bench s",
            "other"
        );
        for kind in Kind::ALL {
            let runs = self.of_kind(kind);
            let plans = mean(&runs, |r| r.operator.plans);
            let plan_ms = mean(&runs, |r| {
                r.operator.plan_seconds * 1000.0 / r.operator.plans.max(1.0)
            });
            let cpu = |f: fn(&Cpu) -> f64| mean(&runs, |r| f(&r.cpu_cycle));
            let _ = writeln!(
                o,
                "{:<40} {:>7.1} {:>6.1} {:>8.1} {:>9.0} {:>7.0} {:>10.0} | {:>6.2} {:>6.2} {:>6.2} {:>6.2}",
                kind.label(),
                mean(&runs, |r| r.cycle.as_secs_f64()),
                plans,
                plan_ms,
                mean(&runs, |r| r.operator.snapshots_sent),
                mean(&runs, |r| r.operator.status_writes),
                mean(&runs, |r| r.operator.reconciles),
                cpu(|c| c.operator),
                cpu(|c| c.emulator),
                cpu(|c| c.bench),
                cpu(|c| c.other),
            );
        }
        let _ = writeln!(
            o,
            "  (plans: plan recomputations, plan ms: mean time of one; snapshots: lines written to \
             sidecar streams; status: status patches; CPU seconds of the operator, the emulator, \
             this bench and everything else)\n"
        );

        let _ = writeln!(o, "memory (/proc/PID/status)");
        for (state, mem) in &self.memory {
            let _ = writeln!(
                o,
                "  {:<56} VmRSS {:>10}   VmHWM {:>10}   threads {}",
                state,
                mib(mem.rss_kib),
                mib(mem.hwm_kib),
                mem.threads
            );
        }
        let _ = writeln!(
            o,
            "  {:<56} VmRSS {:>10}\n",
            "operator peak during the runs (sampled every 50 ms)",
            mib(self.peak_rss_kib)
        );

        let f = &self.fleet;
        let _ = writeln!(
            o,
            "sidecars: {} snapshots read (the policy in them: {:.1} KiB of JSON), {} acks accepted, {} \
             ack attempts refused or failed (each sent again a second later, as a sidecar does), {} \
             stream failures/reconnects, {} stream refusals\n",
            f.snapshots,
            f.largest_policy as f64 / 1024.0,
            f.acks,
            f.ack_failures,
            f.stream_failures,
            f.refusals
        );
        let r = &self.reviews;
        let _ = writeln!(
            o,
            "token reviews during the runs: {} answered by the API server; acknowledgements \
             authenticated by the token of their open stream {:.0}, by a TokenReview (made or \
             cached) {:.0}\n",
            r.answered, r.acks_by_stream_token, r.acks_by_review
        );
        if let Some(q) = &self.after_quiet {
            let _ = writeln!(
                o,
                "after {} s without a change, a revocation reached the last sidecar's ack in {} ms; \
                 its acknowledgements: {:.0} by their stream's token, {:.0} by a TokenReview; \
                 TokenReviews answered meanwhile: {}\n",
                q.quiet.as_secs(),
                f1(q.to_last_ack),
                q.reviews.acks_by_stream_token,
                q.reviews.acks_by_review,
                q.reviews.answered
            );
        }

        let _ = writeln!(o, "anchors (what the alternatives take)");
        let _ = writeln!(
            o,
            "  revocation: the seeds promise \"within one polling interval\" (an SSF poll transmitter \
             polls every pollInterval, default 5 s); a revocation list cached for 30 s takes up to 30 s"
        );
        let _ = writeln!(
            o,
            "  policy change: restarting the pods (a Deployment rollout) takes tens of seconds\n"
        );

        let _ = writeln!(o, "targets");
        for t in &self.targets {
            let _ = writeln!(o, "{}", t.line());
        }
        errors_section(&mut o, &self.errors, "error(s)", "no errors");
        o
    }

    pub fn to_json(&self) -> Value {
        let s = &self.setup;
        let per_kind = |kind: Kind| {
            let runs = self.of_kind(kind);
            json!({
                "to_last_ack": of(&self.records, kind, |r| Some(r.to_last_ack)).to_json(),
                "to_last_ack_sent": of(&self.records, kind, |r| Some(r.to_last_sent)).to_json(),
                "to_first_ack": of(&self.records, kind, |r| Some(r.to_first_ack)).to_json(),
                "request": of(&self.records, kind, |r| Some(r.request)).to_json(),
                "status_seen": of(&self.records, kind, |r| r.status_seen).to_json(),
                "status_propagation_millis": of(&self.records, kind, |r| r.propagation_millis
                    .map(|v| Duration::from_millis(v.max(0) as u64))).to_json(),
                "runs": runs.iter().map(|r| json!({
                    "run": r.run, "request_ms": ms(r.request), "to_first_ack_ms": ms(r.to_first_ack),
                    "to_last_ack_ms": ms(r.to_last_ack), "to_last_ack_sent_ms": ms(r.to_last_sent),
                    "timed_out_with_acknowledged": r.timed_out,
                    "status_propagation_millis": r.propagation_millis,
                    "status_seen_ms": r.status_seen.map(ms),
                    "cpu_to_last_ack": r.cpu_to_last_ack.to_json(),
                    "cycle_ms": ms(r.cycle), "cpu_cycle": r.cpu_cycle.to_json(),
                    "operator": {
                        "plans": r.operator.plans, "plan_seconds": r.operator.plan_seconds,
                        "snapshots_sent": r.operator.snapshots_sent,
                        "status_writes": r.operator.status_writes,
                        "reconciles": r.operator.reconciles,
                    },
                })).collect::<Vec<_>>(),
            })
        };
        let mut measurements = serde_json::Map::new();
        for kind in Kind::ALL {
            measurements.insert(kind.key().to_owned(), per_kind(kind));
        }
        let f = &self.fleet;
        json!({
            "mode": self.mode,
            "machine": self.machine.to_json(),
            "config": {
                "sidecars": s.sidecars, "policies": s.policies, "runs": s.runs,
                "connect_parallel": s.connect_parallel, "decoys_same_issuer": s.decoys_same_issuer,
                "timeout_ms": ms(s.timeout),
            },
            "noise": {
                "load_average_before": self.noise.load_before,
                "load_average_after": self.noise.load_after,
                "preflight_other_processes_cores": self.noise.preflight_other_cores,
                "runs_other_processes_cores": self.noise.runs_other_cores,
            },
            "setup": {
                "objects_created_ms": ms(s.objects_created),
                "operator_ready_ms": ms(s.operator_ready),
                "policy_status_written_ms": ms(s.policy_status_written),
                "initial_sync_ms": ms(s.initial_sync),
                "dial_to_first_ack": s.dial_to_first_ack.to_json(),
            },
            "measurements": measurements,
            "memory": self.memory.iter().map(|(state, m)| json!({"state": state, "status": m.to_json_with_threads()}))
                .collect::<Vec<_>>(),
            "peak_rss_kib": self.peak_rss_kib,
            "sidecars": {
                "snapshots": f.snapshots, "acks": f.acks, "ack_failures": f.ack_failures,
                "stream_failures": f.stream_failures, "refusals": f.refusals,
                "largest_policy_bytes": f.largest_policy,
            },
            "token_reviews": {
                "answered_during_runs": self.reviews.answered,
                "acks_by_stream_token": self.reviews.acks_by_stream_token,
                "acks_by_review": self.reviews.acks_by_review,
            },
            "after_quiet": self.after_quiet.map(|q| json!({
                "quiet_secs": q.quiet.as_secs(),
                "revocation_to_last_ack_ms": ms(q.to_last_ack),
                "acks_by_stream_token": q.reviews.acks_by_stream_token,
                "acks_by_review": q.reviews.acks_by_review,
                "token_reviews_answered": q.reviews.answered,
            })),
            "targets": self.targets.iter().map(Target::to_json).collect::<Vec<_>>(),
            "errors": {"count": self.errors.count, "examples": self.errors.examples},
            "passed": self.errors.count == 0,
        })
    }
}

/// The targets, checked against what was measured.
pub fn targets(
    records: &[Record],
    setup: &Setup,
    at_rest: &Memory,
    peak_rss_kib: u64,
    after_quiet: Option<&AfterQuiet>,
) -> Vec<Target> {
    let scale = (setup.sidecars < 1_000 || setup.policies < 1_000).then(|| {
        format!(
            "only {} sidecars and {} policies in this run",
            setup.sidecars, setup.policies
        )
    });
    let p99 = |kind: Kind| ms(of(records, kind, |r| Some(r.to_last_ack)).p99);
    let t = |name: &str, measured: f64, limit: f64, unit| Target {
        name: name.to_owned(),
        measured,
        limit,
        unit,
        at_least: false,
        not_applicable: scale.clone(),
    };
    vec![
        t(
            "PrincipalRevocation created → last ack, p99",
            p99(Kind::Revocation),
            1000.0,
            "ms",
        ),
        t(
            "SET received → last ack, p99",
            p99(Kind::SecurityEvent),
            1000.0,
            "ms",
        ),
        t(
            "policy spec change → last ack, p99",
            p99(Kind::SpecChange),
            1000.0,
            "ms",
        ),
        t(
            "operator VmRSS at rest, all sidecars connected",
            at_rest.rss_mib(),
            128.0,
            "MiB",
        ),
        t(
            "operator VmRSS peak during the runs",
            peak_rss_kib as f64 / 1024.0,
            128.0,
            "MiB",
        ),
        // However long the fleet was quiet: acknowledgements on open streams are never
        // TokenReviews, so there is no burst of them to spread.
        Target {
            name: "TokenReviews for the acks of a revocation after a quiet spell".to_owned(),
            measured: after_quiet.map_or(0.0, |q| q.reviews.answered as f64),
            limit: 0.0,
            unit: "reviews",
            at_least: false,
            not_applicable: match after_quiet {
                None => Some("no quiet spell in this run (--quiet-secs 0)".to_owned()),
                Some(q) if q.quiet < Duration::from_secs(60) => Some(format!(
                    "a quiet spell of {} s, shorter than a cached review lives",
                    q.quiet.as_secs()
                )),
                Some(_) => scale.clone(),
            },
        },
    ]
}
