//! The human-readable table, the target verdict and the JSON file.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{Value, json};

use crate::bench_support::machine::Machine;
use crate::bench_support::report::{heading, load, mib};
use crate::bench_support::stats::percentile;
use crate::load::Sample;
use crate::reviews::{Endpoint, Kind};
use crate::stats::{Errors, Summary, ms};

/// The target; the report prints its numbers with one decimal.
pub type Target = crate::bench_support::report::Target<1>;

/// The target: p99 ≤ 5 ms at 100 requests/s.
pub const TARGET_P99_MS: f64 = 5.0;
pub const TARGET_RATE: f64 = 100.0;

/// Latency percentiles of a set of samples (nearest rank; exact for the samples taken).
#[derive(Clone, Debug, Default)]
pub struct Latency {
    pub summary: Summary,
    pub p999: Duration,
}

impl Latency {
    pub fn of(samples: &[Duration]) -> Self {
        let mut sorted = samples.to_vec();
        sorted.sort_unstable();
        Self {
            summary: Summary::of(&sorted),
            p999: percentile(&sorted, 0.999),
        }
    }

    fn row(&self, label: &str) -> String {
        format!("{label:<42} {}", self.numbers())
    }

    fn row_wide(&self, label: &str) -> String {
        format!("{label:<52} {}", self.numbers())
    }

    fn numbers(&self) -> String {
        let s = &self.summary;
        format!(
            "{:>6} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>8.3}",
            s.n,
            ms(s.p50),
            ms(s.p90),
            ms(s.p99),
            ms(self.p999),
            ms(s.max),
            ms(s.mean)
        )
    }

    fn to_json(&self) -> Value {
        let mut v = self.summary.to_json();
        v["p99_9_ms"] = json!(ms(self.p999));
        v
    }
}

/// Memory and CPU of the processes around the measured window.
#[derive(Clone, Debug, Default)]
pub struct Resources {
    pub rss_idle_kib: u64,
    pub rss_peak_kib: u64,
    pub rss_mean_kib: u64,
    pub rss_end_kib: u64,
    pub hwm_end_kib: u64,
    pub threads: u64,
    /// Cores' worth of CPU over the measured window.
    pub webhook_cores: f64,
    pub emulator_cores: f64,
    pub bench_cores: f64,
    pub other_cores: f64,
    /// Established connections to the webhook at the end of the measured window.
    pub connections: usize,
}

/// Noise indicators around the run.
#[derive(Clone, Debug, Default)]
pub struct Noise {
    pub load_before: [f64; 3],
    pub load_after: [f64; 3],
    pub preflight_other_cores: f64,
}

/// The shape of the run.
#[derive(Clone, Debug, Default)]
pub struct Setup {
    pub rate: f64,
    pub warmup: Duration,
    pub duration: Duration,
    pub policies: usize,
    pub pod_bytes: usize,
    pub pod_review_bytes: usize,
    pub objects_created: Duration,
    pub webhook_ready: Duration,
}

/// Everything one run produced.
pub struct Results {
    pub mode: &'static str,
    pub machine: Machine,
    pub setup: Setup,
    pub noise: Noise,
    pub per_kind: BTreeMap<Kind, Latency>,
    pub per_endpoint: BTreeMap<Endpoint, Latency>,
    pub overall: Latency,
    /// From the scheduled instant to the request's task starting (the pacer's delay).
    pub lag: Latency,
    /// From the request's task starting to the answer (the latency without the pacer's delay).
    pub sent_to_answer: Latency,
    pub sent: u64,
    pub checked: u64,
    pub measured: u64,
    /// Measured answers per second: measured requests over the time from the first one's
    /// scheduled instant to the last measured answer.
    pub achieved_rate: f64,
    pub versions: BTreeMap<String, u64>,
    /// The webhook's mean handler time per endpoint over the measured window (its histogram).
    pub handler_mean: BTreeMap<Endpoint, Duration>,
    pub resources: Resources,
    /// The webhook's work per call, timed in this process (library code).
    pub components: Vec<(&'static str, Latency)>,
    pub target: Target,
    pub errors: Errors,
}

/// What the samples say, before the readings around them are added.
pub struct Summaries {
    pub per_kind: BTreeMap<Kind, Latency>,
    pub per_endpoint: BTreeMap<Endpoint, Latency>,
    pub overall: Latency,
    pub lag: Latency,
    pub sent_to_answer: Latency,
    pub errors: Errors,
}

/// Latency summaries of the measured samples; errors from every sample (warm-up included).
pub fn summarize(samples: &[Sample]) -> Summaries {
    let measured: Vec<&Sample> = samples.iter().filter(|s| s.measured).collect();
    let of = |keep: &dyn Fn(&Sample) -> bool| {
        let v: Vec<Duration> = measured
            .iter()
            .filter(|s| keep(s))
            .map(|s| s.latency)
            .collect();
        Latency::of(&v)
    };
    let per_kind = Kind::ALL
        .into_iter()
        .map(|k| (k, of(&|s: &Sample| s.kind == k)))
        .collect();
    let per_endpoint = Endpoint::ALL
        .into_iter()
        .map(|e| (e, of(&|s: &Sample| s.kind.endpoint() == e)))
        .collect();
    let overall = of(&|_| true);
    let lag = Latency::of(&measured.iter().map(|s| s.lag).collect::<Vec<_>>());
    let sent_to_answer = Latency::of(
        &measured
            .iter()
            .map(|s| s.latency.saturating_sub(s.lag))
            .collect::<Vec<_>>(),
    );
    let mut errors = Errors::default();
    for s in samples {
        if let Err(e) = &s.outcome {
            errors.record(format!("{}: {e}", s.kind.label()));
        }
    }
    Summaries {
        per_kind,
        per_endpoint,
        overall,
        lag,
        sent_to_answer,
        errors,
    }
}

/// The verdict on the target: applicable to a full-rate release run.
pub fn target(overall: &Latency, setup: &Setup, mode: &str, build: &str) -> Target {
    let not_applicable = if mode == "smoke" || build == "debug" {
        Some(format!("{mode} run, {build} build"))
    } else if setup.rate < TARGET_RATE {
        Some(format!("rate {} req/s is below {TARGET_RATE}", setup.rate))
    } else {
        None
    };
    Target {
        name: format!(
            "admission latency p99, all requests, at {} req/s",
            setup.rate
        ),
        measured: ms(overall.summary.p99),
        limit: TARGET_P99_MS,
        unit: "ms",
        at_least: false,
        not_applicable,
    }
}

impl Results {
    /// The human-readable report.
    pub fn table(&self) -> String {
        let (m, s, n, r) = (&self.machine, &self.setup, &self.noise, &self.resources);
        let mut o = String::new();
        heading(
            &mut o,
            "admission webhook",
            self.mode,
            m,
            "the load and every check work",
        );
        let _ = writeln!(
            o,
            "setup:   namespace `bench` labelled lifeguard.dev/inject=enabled, {} McpServerPolicies (`reports` + {} decoys), \
             approver keys Secret; pod {} B ({} B as a review); objects created in {:.1} s, webhook ready in {:.1} s",
            s.policies,
            s.policies.saturating_sub(1),
            s.pod_bytes,
            s.pod_review_bytes,
            s.objects_created.as_secs_f64(),
            s.webhook_ready.as_secs_f64()
        );
        let _ = writeln!(
            o,
            "load:    open loop, {} req/s for {:.0} s after {:.0} s of unmeasured warm-up; HTTP/1.1 keep-alive, as kube-apiserver \
             calls webhooks, over TLS ({} open connection(s) at the end); \
             latency from each request's scheduled instant to the last byte of its answer",
            s.rate,
            s.duration.as_secs_f64(),
            s.warmup.as_secs_f64(),
            r.connections
        );
        let _ = writeln!(
            o,
            "noise:   load average {} before, {} after; other processes used {:.2} cores in the second before \
             the run and {:.2} cores during the measured window",
            load(n.load_before),
            load(n.load_after),
            n.preflight_other_cores,
            r.other_cores
        );
        let _ = writeln!(
            o,
            "\n{:<42} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
            "latency (ms)", "n", "p50", "p90", "p99", "p99.9", "max", "mean"
        );
        for (kind, lat) in &self.per_kind {
            let _ = writeln!(o, "{}", lat.row(kind.label()));
        }
        for (endpoint, lat) in &self.per_endpoint {
            let _ = writeln!(o, "{}", lat.row(&format!("all {}", endpoint.path())));
        }
        let _ = writeln!(o, "{}", self.overall.row("all requests"));
        let _ = writeln!(
            o,
            "{}",
            self.lag.row("  of which pacer lag (due → request task)")
        );
        let _ = writeln!(
            o,
            "{}",
            self.sent_to_answer
                .row("  the rest (request task → answer)")
        );
        let handler = self
            .handler_mean
            .iter()
            .map(|(e, d)| format!("{} {:.3} ms", e.path(), ms(*d)))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            o,
            "\nwebhook handler time (its own histogram, mean): {handler}"
        );
        let versions = self
            .versions
            .iter()
            .map(|(v, c)| format!("{v} {c}"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            o,
            "achieved: {} measured requests answered at {:.1} req/s; {} sent in all (warm-up included); answers: {versions}",
            self.measured, self.achieved_rate, self.sent
        );
        let per_request = if self.measured > 0 {
            r.webhook_cores * s.duration.as_secs_f64() / self.measured as f64 * 1e6
        } else {
            0.0
        };
        let _ = writeln!(
            o,
            "webhook: VmRSS {} idle before the load, {} mean and {} peak under load, {} at the end (VmHWM {}, {} threads); \
             CPU {:.3} cores = {:.0} µs per request",
            mib(r.rss_idle_kib),
            mib(r.rss_mean_kib),
            mib(r.rss_peak_kib),
            mib(r.rss_end_kib),
            mib(r.hwm_end_kib),
            r.threads,
            r.webhook_cores,
            per_request
        );
        let _ = writeln!(
            o,
            "others:  API emulator {:.3} cores, this benchmark {:.3} cores, other processes {:.3} cores",
            r.emulator_cores, r.bench_cores, r.other_cores
        );
        if !self.components.is_empty() {
            let _ = writeln!(
                o,
                "\n{:<52} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
                "webhook work per call, in process (ms)",
                "n",
                "p50",
                "p90",
                "p99",
                "p99.9",
                "max",
                "mean"
            );
            for (name, lat) in &self.components {
                let _ = writeln!(o, "{}", lat.row_wide(name));
            }
        }
        let _ = writeln!(o, "\ntargets");
        let _ = writeln!(o, "{}", self.target.line());
        if self.errors.count == 0 {
            let _ = writeln!(
                o,
                "\nno errors: {} of {} answers checked (verdict, uid, warnings, patch)",
                self.checked, self.sent
            );
        } else {
            let _ = writeln!(
                o,
                "\nFAILED: {} error(s); first: {:?}",
                self.errors.count, self.errors.examples
            );
        }
        o
    }

    pub fn to_json(&self) -> Value {
        let (s, r) = (&self.setup, &self.resources);
        let per_kind: serde_json::Map<String, Value> = self
            .per_kind
            .iter()
            .map(|(k, l)| (k.key().to_owned(), l.to_json()))
            .collect();
        let per_endpoint: serde_json::Map<String, Value> = self
            .per_endpoint
            .iter()
            .map(|(e, l)| (e.metric_label().to_owned(), l.to_json()))
            .collect();
        let handler: serde_json::Map<String, Value> = self
            .handler_mean
            .iter()
            .map(|(e, d)| (e.metric_label().to_owned(), json!(ms(*d))))
            .collect();
        json!({
            "mode": self.mode,
            "machine": self.machine.to_json(),
            "config": {
                "rate_per_s": s.rate, "warmup_s": s.warmup.as_secs_f64(),
                "duration_s": s.duration.as_secs_f64(), "policies": s.policies,
                "protocol": "HTTP/1.1",
                "pod_bytes": s.pod_bytes, "pod_review_bytes": s.pod_review_bytes,
            },
            "setup": {
                "objects_created_ms": ms(s.objects_created),
                "webhook_ready_ms": ms(s.webhook_ready),
            },
            "noise": {
                "load_average_before": self.noise.load_before,
                "load_average_after": self.noise.load_after,
                "preflight_other_processes_cores": self.noise.preflight_other_cores,
                "run_other_processes_cores": r.other_cores,
            },
            "latency": {
                "per_kind": per_kind,
                "per_endpoint": per_endpoint,
                "overall": self.overall.to_json(),
                "pacer_lag": self.lag.to_json(),
                "request_task_to_answer": self.sent_to_answer.to_json(),
            },
            "webhook_handler_mean_ms": handler,
            "sent": self.sent,
            "checked": self.checked,
            "measured": self.measured,
            "achieved_rate_per_s": self.achieved_rate,
            "http_versions": self.versions,
            "resources": {
                "webhook_vm_rss_idle_kib": r.rss_idle_kib,
                "webhook_vm_rss_mean_kib": r.rss_mean_kib,
                "webhook_vm_rss_peak_kib": r.rss_peak_kib,
                "webhook_vm_rss_end_kib": r.rss_end_kib,
                "webhook_vm_hwm_end_kib": r.hwm_end_kib,
                "webhook_threads": r.threads,
                "webhook_cores": r.webhook_cores,
                "emulator_cores": r.emulator_cores,
                "bench_cores": r.bench_cores,
                "other_processes_cores": r.other_cores,
                "connections_at_end": r.connections,
            },
            "components": self.components.iter()
                .map(|(name, l)| json!({"component": name, "latency": l.to_json()}))
                .collect::<Vec<_>>(),
            "targets": [self.target.to_json()],
            "errors": {"count": self.errors.count, "examples": self.errors.examples},
            "passed": self.errors.count == 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(kind: Kind, measured: bool, latency_ms: u64, ok: bool) -> Sample {
        Sample {
            kind,
            measured,
            latency: Duration::from_millis(latency_ms),
            lag: Duration::ZERO,
            outcome: if ok { Ok(()) } else { Err("bad".into()) },
            version: Some("HTTP/1.1".into()),
            finished: std::time::Instant::now(),
        }
    }

    #[test]
    fn warm_up_is_not_measured_but_its_errors_count() {
        let samples = vec![
            sample(Kind::PodInjected, false, 900, false),
            sample(Kind::PodInjected, true, 1, true),
            sample(Kind::PodInjected, true, 3, true),
            sample(Kind::Exception, true, 2, true),
        ];
        let Summaries {
            per_kind,
            per_endpoint,
            overall,
            errors,
            ..
        } = summarize(&samples);
        assert_eq!(overall.summary.n, 3);
        assert_eq!(overall.summary.max, Duration::from_millis(3));
        assert_eq!(per_kind[&Kind::PodInjected].summary.n, 2);
        assert_eq!(per_kind[&Kind::PodNoPolicy].summary.n, 0);
        assert_eq!(per_endpoint[&Endpoint::Validate].summary.n, 1);
        assert_eq!(errors.count, 1);
    }

    #[test]
    fn the_target_applies_to_full_release_runs_at_the_rate() {
        let overall = Latency::of(&[Duration::from_millis(2)]);
        let setup = Setup {
            rate: 100.0,
            ..Setup::default()
        };
        assert_eq!(
            target(&overall, &setup, "full", "release").verdict(),
            "PASS"
        );
        assert_eq!(
            target(&overall, &setup, "smoke", "release").verdict(),
            "N/A"
        );
        let slow = Setup {
            rate: 50.0,
            ..Setup::default()
        };
        assert_eq!(target(&overall, &slow, "full", "release").verdict(), "N/A");
        let late = Latency::of(&[Duration::from_millis(6)]);
        assert_eq!(target(&late, &setup, "full", "release").verdict(), "MISS");
    }
}
