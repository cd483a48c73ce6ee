//! The three measurements, repeated: a PrincipalRevocation created through the API, a
//! security event pushed to the operator, and a policy spec change, each timed from just
//! before the request to the last sidecar's accepted acknowledgement. Between measurements
//! the revocation is deleted again (and that deletion propagated), and the operator is left
//! to finish its status writes, so every measurement starts from a quiet operator.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

use crate::bench_support::procs::Memory;
use crate::cluster::{
    Api, Emulator, ISSUER, Operator, POLL_INTERVALS, REVOCATIONS, SSF_AUDIENCE, TRANSMITTER,
    bench_policy_path,
};
use crate::cpu::{Cpu, Ticks};
use crate::fleet::{Fleet, Reached, Shortfall, Want};

const SESSION_REVOKED: &str = "https://schemas.openid.net/secevent/caep/event-type/session-revoked";

/// Which change was propagated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Revocation,
    SecurityEvent,
    SpecChange,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Revocation, Kind::SecurityEvent, Kind::SpecChange];

    pub fn label(self) -> &'static str {
        match self {
            Self::Revocation => "PrincipalRevocation created → last ack",
            Self::SecurityEvent => "SET received (push) → last ack",
            Self::SpecChange => "policy spec change → last ack",
        }
    }

    pub fn key(self) -> &'static str {
        match self {
            Self::Revocation => "revocation_created",
            Self::SecurityEvent => "security_event_pushed",
            Self::SpecChange => "policy_spec_changed",
        }
    }
}

/// Operator counters (from its /metrics) at one moment.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    pub plans: f64,
    pub plan_seconds: f64,
    pub snapshots_sent: f64,
    pub status_writes: f64,
    pub reconciles: f64,
}

impl Counters {
    pub async fn scrape(operator: &Operator) -> Self {
        let text = operator.metrics_text().await;
        let m = |name: &str| crate::cluster::metric_sum(&text, name);
        Self {
            plans: m("lifeguard_operator_plan_seconds_count"),
            plan_seconds: m("lifeguard_operator_plan_seconds_sum"),
            snapshots_sent: m("lifeguard_operator_snapshots_sent_total"),
            status_writes: m("lifeguard_operator_status_writes_total"),
            reconciles: m("lifeguard_operator_reconciles_total"),
        }
    }

    pub fn minus(&self, before: &Counters) -> Counters {
        Counters {
            plans: self.plans - before.plans,
            plan_seconds: self.plan_seconds - before.plan_seconds,
            snapshots_sent: self.snapshots_sent - before.snapshots_sent,
            status_writes: self.status_writes - before.status_writes,
            reconciles: self.reconciles - before.reconciles,
        }
    }
}

/// What acknowledgements cost the API server over the measured runs.
#[derive(Clone, Copy, Debug, Default)]
pub struct Reviews {
    /// TokenReviews the emulator answered during the runs.
    pub answered: u64,
    /// Acknowledgements the operator authenticated by the token of the pod's open stream.
    pub acks_by_stream_token: f64,
    /// Acknowledgements it authenticated by a TokenReview (made for it, or cached).
    pub acks_by_review: f64,
}

/// The revocation measured after a quiet spell, and what its acknowledgements cost.
#[derive(Clone, Copy, Debug)]
pub struct AfterQuiet {
    pub quiet: Duration,
    pub to_last_ack: Duration,
    pub reviews: Reviews,
}

impl Reviews {
    /// The emulator's TokenReviews so far and the operator's acknowledgement counters.
    pub async fn scrape(emulator: &Emulator, operator: &Operator) -> Result<Self> {
        let answered = match emulator.api.get("/__emulator/tokenreviews").await? {
            Value::Array(reviews) => reviews.len() as u64,
            other => bail!("the emulator's token reviews are not a list: {other}"),
        };
        let text = operator.metrics_text().await;
        let via = |how: &str| {
            crate::cluster::metric_sum(
                &text,
                &format!(
                    "lifeguard_operator_acknowledgement_authentications_total{{via=\"{how}\"}}"
                ),
            )
        };
        Ok(Self {
            answered,
            acks_by_stream_token: via("stream_token"),
            acks_by_review: via("token_review"),
        })
    }

    pub fn minus(&self, before: &Reviews) -> Reviews {
        Reviews {
            answered: self.answered.saturating_sub(before.answered),
            acks_by_stream_token: self.acks_by_stream_token - before.acks_by_stream_token,
            acks_by_review: self.acks_by_review - before.acks_by_review,
        }
    }
}

/// One measured propagation.
#[derive(Clone, Debug)]
pub struct Record {
    pub kind: Kind,
    pub run: usize,
    /// The triggering request's round trip (create, push answered 202, patch).
    pub request: Duration,
    pub to_first_ack: Duration,
    /// The measurement (the timeout when not every sidecar got there in time).
    pub to_last_ack: Duration,
    /// Not every sidecar acknowledged within the timeout: how many did.
    pub timed_out: Option<usize>,
    /// To the last acknowledgement *sent*: every sidecar had the change in force.
    pub to_last_sent: Duration,
    /// `status.propagationMillis` of the revocation, as the operator recorded it.
    pub propagation_millis: Option<i64>,
    /// When the bench first saw status report completion (polled every 50 ms after the last
    /// ack), from the request.
    pub status_seen: Option<Duration>,
    /// CPU seconds from the request to the last ack.
    pub cpu_to_last_ack: Cpu,
    /// CPU seconds of the whole cycle (request, propagation, status, cleanup, until idle).
    pub cpu_cycle: Cpu,
    pub cycle: Duration,
    /// Operator counters over the cycle.
    pub operator: Counters,
}

/// When a measurement started, its request's round trip, how the sidecars answered, and
/// the revocation it created (if any).
type Started = (
    Instant,
    Duration,
    Result<Reached, Shortfall>,
    Option<String>,
);

/// What the runs need.
pub struct Bench<'a> {
    pub api: &'a Api,
    pub operator: &'a Operator,
    pub emulator_pid: u32,
    pub fleet: &'a Arc<Fleet>,
    pub ticks_per_sec: u64,
    pub timeout: Duration,
    pub rest: Duration,
    pub set_key: EncodingKey,
    pub https: reqwest::Client,
    pub poll_index: usize,
    pub tag: String,
}

/// A background sampler of the operator's VmRSS (every 50 ms).
pub struct RssSampler {
    peak_kib: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl RssSampler {
    pub fn start(pid: u32) -> Self {
        let peak_kib = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (peak, halt) = (peak_kib.clone(), stop.clone());
        let task = tokio::spawn(async move {
            while !halt.load(Ordering::Relaxed) {
                peak.fetch_max(Memory::read(pid).rss_kib, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        Self {
            peak_kib,
            stop,
            task,
        }
    }

    pub async fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        self.peak_kib.load(Ordering::Relaxed)
    }
}

impl Bench<'_> {
    fn ticks(&self) -> Ticks {
        Ticks::take(self.operator.proc.pid, self.emulator_pid)
    }

    /// Waits until the operator has stopped writing status and recomputing plans for 300 ms
    /// (its counters unchanged over three scrapes 100 ms apart).
    pub async fn quiesce(&self) -> Result<Duration> {
        let start = Instant::now();
        let mut last = Counters::scrape(self.operator).await;
        let mut unchanged = 0;
        while unchanged < 3 {
            if start.elapsed() > self.timeout {
                bail!("the operator kept writing status for {:?}", self.timeout);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            let now = Counters::scrape(self.operator).await;
            let moved = now.status_writes != last.status_writes || now.plans != last.plans;
            unchanged = if moved { 0 } else { unchanged + 1 };
            last = now;
        }
        Ok(start.elapsed())
    }

    /// Waits until every sidecar's last acknowledgement names one policy hash other than
    /// `old` (after a timed-out spec change).
    async fn converged_away_from(&self, old: Option<String>) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(now) = self.fleet.common_hash()
                && now != old
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the sidecars did not converge on the changed policy");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Polls `path` every 50 ms until `done` holds for it; the time since `since`.
    async fn status_until(
        &self,
        path: &str,
        since: Instant,
        done: impl Fn(&Value) -> bool,
    ) -> Option<(Duration, Value)> {
        let deadline = Instant::now() + self.timeout;
        while Instant::now() < deadline {
            if let Ok(object) = self.api.get(path).await
                && done(&object)
            {
                return Some((since.elapsed(), object));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    /// One measurement of `kind`.
    pub async fn measure(&mut self, kind: Kind, run: usize) -> Result<Record> {
        let counters = Counters::scrape(self.operator).await;
        let ticks = self.ticks();
        let before = self.fleet.common_hash();
        let (start, request, reached, revocation) = match kind {
            Kind::Revocation => self.create_revocation(run).await?,
            Kind::SecurityEvent => self.push_event(run).await?,
            Kind::SpecChange => self.change_spec().await?,
        };
        let at_last_ack = self.ticks();
        let (reached, timed_out) = match reached {
            Ok(r) => (r, None),
            Err(shortfall) => {
                eprintln!("  {kind:?} run {run} timed out: {shortfall}");
                let at = start + self.timeout;
                let r = Reached {
                    first: at,
                    last: at,
                    last_sent: at,
                };
                (r, Some(shortfall.acknowledged))
            }
        };
        if timed_out.is_some() && revocation.is_none() {
            // Let the spec change finish before anything else is measured.
            self.converged_away_from(before.flatten()).await?;
        }
        let (propagation_millis, status_seen) = match &revocation {
            Some(name) => {
                let path = format!("{REVOCATIONS}/{name}");
                match self
                    .status_until(&path, start, |o| o["status"]["completedAt"].is_string())
                    .await
                {
                    Some((seen, o)) => (o["status"]["propagationMillis"].as_i64(), Some(seen)),
                    None => (None, None),
                }
            }
            None => {
                let hash = self.fleet.common_hash().flatten();
                let size = self.fleet.size;
                let seen = self
                    .status_until(&bench_policy_path(), start, |o| {
                        let s = &o["status"];
                        s["policyHash"].as_str() == hash.as_deref()
                            && s["sidecarsInSync"].as_u64() == Some(size as u64)
                            && s["observedGeneration"] == o["metadata"]["generation"]
                    })
                    .await;
                (None, seen.map(|(d, _)| d))
            }
        };
        if let Some(name) = &revocation {
            // Delete it again, and wait until every sidecar runs without it.
            let goal = self.fleet.expect(Want::Lacks(name.clone()));
            self.api.delete(&format!("{REVOCATIONS}/{name}")).await?;
            self.fleet
                .wait(goal, self.timeout)
                .await
                .context("propagating the deletion")?;
        }
        self.quiesce().await?;
        tokio::time::sleep(self.rest).await;
        let end = self.ticks();
        let after = Counters::scrape(self.operator).await;
        Ok(Record {
            kind,
            run,
            request,
            to_first_ack: reached.first.duration_since(start),
            to_last_ack: reached.last.duration_since(start),
            timed_out,
            to_last_sent: reached.last_sent.duration_since(start),
            propagation_millis,
            status_seen,
            cpu_to_last_ack: ticks.until(&at_last_ack, self.ticks_per_sec),
            cpu_cycle: ticks.until(&end, self.ticks_per_sec),
            cycle: start.elapsed(),
            operator: after.minus(&counters),
        })
    }

    async fn create_revocation(&mut self, run: usize) -> Result<Started> {
        let name = format!("bench-rev-{}-{run:03}", self.tag);
        let body = json!({
            "apiVersion": "lifeguard.dev/v1alpha1", "kind": "PrincipalRevocation",
            "metadata": {"name": name},
            "spec": {
                "issuer": ISSUER, "subject": format!("user-{run}"),
                "revokedBefore": jiff::Timestamp::now().to_string(),
                "reason": "sessionRevoked", "source": {"kind": "manual"},
            },
        });
        let goal = self.fleet.expect(Want::Carries(name.clone()));
        let start = Instant::now();
        self.api.post(REVOCATIONS, &body).await?;
        let request = start.elapsed();
        let reached = self.fleet.wait(goal, self.timeout).await;
        Ok((start, request, reached, Some(name)))
    }

    async fn push_event(&mut self, run: usize) -> Result<Started> {
        let jti = format!("bench-{}-{run:03}", self.tag);
        let now = jiff::Timestamp::now().as_second();
        let claims = json!({
            "iss": TRANSMITTER, "aud": SSF_AUDIENCE, "iat": now, "jti": jti,
            "sub_id": {"format": "iss_sub", "iss": ISSUER, "sub": format!("set-user-{run}")},
            "events": {SESSION_REVOKED: {"event_timestamp": now - 1, "initiating_entity": "policy"}},
        });
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some("test-b-ed-1".into());
        header.typ = Some("secevent+jwt".into());
        let set = jsonwebtoken::encode(&header, &claims, &self.set_key).context("signing a SET")?;
        let name = lifeguard::operator::ssf::events::object_name(TRANSMITTER, &jti, None);
        let goal = self.fleet.expect(Want::Carries(name.clone()));
        let start = Instant::now();
        let answer = self
            .https
            .post(format!("{}/ssf/push", self.operator.url))
            .header("content-type", "application/secevent+jwt")
            .body(set)
            .send()
            .await
            .context("pushing a SET")?;
        let request = start.elapsed();
        let status = answer.status();
        if status != reqwest::StatusCode::ACCEPTED {
            let body = answer.text().await.unwrap_or_default();
            bail!("/ssf/push answered {status}, not 202: {body}");
        }
        let reached = self.fleet.wait(goal, self.timeout).await;
        Ok((start, request, reached, Some(name)))
    }

    async fn change_spec(&mut self) -> Result<Started> {
        let Some(current) = self.fleet.common_hash() else {
            bail!("the sidecars do not all run the same policy before the spec change");
        };
        self.poll_index = (self.poll_index + 1) % POLL_INTERVALS.len();
        let patch =
            json!({"spec": {"tasks": {"minPollInterval": POLL_INTERVALS[self.poll_index]}}});
        let goal = self.fleet.expect(Want::HashOtherThan(current));
        let start = Instant::now();
        self.api.merge_patch(&bench_policy_path(), &patch).await?;
        let request = start.elapsed();
        let reached = self.fleet.wait(goal, self.timeout).await;
        Ok((start, request, reached, None))
    }
}
