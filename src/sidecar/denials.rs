//! Audit lines for refusals that anyone can cause at will (no token, a bad token, a malformed
//! or non-conforming request, a foreign Origin): written once per kind and period, with the
//! rest counted into one summary line at the end of the period. Without this an attacker
//! writes the trail for us — several bytes of audit for every byte sent. Exact counts are
//! always in the `lifeguard_denials_total{reason}` metric.
//!
//! A kind is (event, reason, principal): refusals of an authenticated principal are limited
//! per principal, so one noisy client does not hide another's.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::audit::{AuditEvent, AuditLog};
use crate::model::Owner;

/// How long one summary period lasts.
pub const PERIOD: Duration = Duration::from_secs(60);
/// Most kinds tracked at once; past it, refusals of new principals share one kind.
const MAX_KINDS: usize = 10_000;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Kind {
    event: &'static str,
    reason: &'static str,
    principal: Option<(String, String)>,
}

struct Period {
    started: Instant,
    /// The first line of the period, as the template of its summary.
    first: AuditEvent,
    suppressed: u64,
}

/// Rate-limited audit lines for refusals.
#[derive(Default)]
pub struct DenialAudit {
    periods: Mutex<HashMap<Kind, Period>>,
}

impl DenialAudit {
    /// Writes `event` when it is the first of its kind in the current period; counts it
    /// otherwise. `principal` is the refused caller, when known.
    pub fn log(
        &self,
        audit: &AuditLog,
        event: AuditEvent,
        principal: Option<&Owner>,
        now: Instant,
    ) {
        // A refusal the audit trail only counts still shows on the request's span.
        crate::telemetry::spans::audit(
            "deny",
            event.reason,
            &event.policy_hash,
            event.task.as_deref(),
        );
        let Ok(mut periods) = self.periods.lock() else {
            return;
        };
        let mut kind = Kind {
            event: event.event,
            reason: event.reason,
            principal: principal.map(|o| (o.issuer.clone(), o.subject.clone())),
        };
        if periods.len() >= MAX_KINDS && !periods.contains_key(&kind) {
            kind.principal = Some(("*".into(), "*".into()));
        }
        match periods.get_mut(&kind) {
            Some(period) if now.duration_since(period.started) < PERIOD => {
                period.suppressed += 1;
            }
            previous => {
                if let Some(period) = previous {
                    let ended = std::mem::replace(
                        period,
                        Period {
                            started: now,
                            first: event.clone(),
                            suppressed: 0,
                        },
                    );
                    write_summary(audit, ended);
                } else {
                    periods.insert(
                        kind,
                        Period {
                            started: now,
                            first: event.clone(),
                            suppressed: 0,
                        },
                    );
                }
                audit.log(event);
            }
        }
    }

    /// Writes the summary of every period that has ended, and forgets it.
    pub fn flush(&self, audit: &AuditLog, now: Instant) {
        let Ok(mut periods) = self.periods.lock() else {
            return;
        };
        let ended: Vec<Kind> = periods
            .iter()
            .filter(|(_, p)| now.duration_since(p.started) >= PERIOD)
            .map(|(k, _)| k.clone())
            .collect();
        for kind in ended {
            if let Some(period) = periods.remove(&kind) {
                write_summary(audit, period);
            }
        }
    }
}

/// One line for the refusals of a period after its first, when there were any.
fn write_summary(audit: &AuditLog, period: Period) {
    if period.suppressed == 0 {
        return;
    }
    let mut summary = period.first;
    summary.time = format!("{:.3}", jiff::Timestamp::now());
    audit.log(
        summary
            .detail("repeated", period.suppressed)
            .detail("periodSeconds", PERIOD.as_secs()),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::{AuditTarget, Decision};

    fn denied(reason: &'static str) -> AuditEvent {
        AuditEvent::new(
            "auth.denied",
            "c",
            crate::audit::PolicyStamp {
                name: "ns/p",
                hash: "h",
            },
            Decision::Deny,
            reason,
        )
    }

    async fn lines(path: &std::path::Path, at_least: usize) -> Vec<serde_json::Value> {
        for _ in 0..200 {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let lines: Vec<serde_json::Value> = text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            if lines.len() >= at_least {
                return lines;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("fewer than {at_least} audit lines");
    }

    #[tokio::test]
    async fn one_line_per_kind_and_period_plus_a_summary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let (audit, _writer) = AuditLog::open(AuditTarget::File(path.clone())).unwrap();
        let denials = DenialAudit::default();
        let t0 = Instant::now();
        for _ in 0..100 {
            denials.log(&audit, denied("missing_token"), None, t0);
        }
        denials.log(&audit, denied("bad_signature"), None, t0);
        // Nothing ended yet.
        denials.flush(&audit, t0 + Duration::from_secs(1));
        let written = lines(&path, 2).await;
        assert_eq!(written.len(), 2, "{written:?}");
        // The period ends: one summary for the 99 repeats; none for a kind without repeats.
        denials.flush(&audit, t0 + PERIOD);
        let written = lines(&path, 3).await;
        assert_eq!(written.len(), 3, "{written:?}");
        assert_eq!(written[2]["reason"], "missing_token");
        assert_eq!(written[2]["detail"]["repeated"], 99);
        // A new period starts afresh.
        denials.log(&audit, denied("missing_token"), None, t0 + PERIOD * 2);
        assert_eq!(lines(&path, 4).await.len(), 4);
    }

    #[tokio::test]
    async fn principals_are_limited_separately() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let (audit, _writer) = AuditLog::open(AuditTarget::File(path.clone())).unwrap();
        let denials = DenialAudit::default();
        let owner = |s: &str| Owner {
            issuer: "i".into(),
            subject: s.into(),
            tenant: String::new(),
            client: String::new(),
        };
        let now = Instant::now();
        for _ in 0..5 {
            denials.log(&audit, denied("protocol"), Some(&owner("mallory")), now);
        }
        denials.log(&audit, denied("protocol"), Some(&owner("alice")), now);
        assert_eq!(lines(&path, 2).await.len(), 2);
    }
}
