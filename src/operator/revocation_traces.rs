//! Which trace each PrincipalRevocation's propagation belongs to, and how that trace travels.
//!
//! A revocation's trace context is the W3C `traceparent` of its `lifeguard.revocation` span
//! (`telemetry::revocation_spans`), kept on the object as the annotation
//! [`TRACEPARENT_ANNOTATION`] and sent to sidecars in the snapshot's `revocationTraces`.
//!
//! - A security event's revocation is created with the annotation already set
//!   (`revocation_sink`): the span is a child of the push request's span.
//! - A revocation found without the annotation (a person applied it) gets a new trace from the
//!   leading replica, at the first plan that carries it, so the first snapshot sidecars receive
//!   already names it; the leader then writes the annotation with a merge patch of
//!   `metadata.annotations` (preconditioned on the object's `uid` and `resourceVersion`, so it
//!   never replaces a value someone wrote meanwhile). Until the annotation is there, snapshots
//!   this replica sends use the trace it keeps in memory ([`StartedTraces`]).
//! - An annotation that is present is never changed, whoever wrote it. One that does not parse
//!   as a `traceparent` is ignored: that revocation is not traced (logged once).
//! - Only revocations whose propagation is not complete (`status.completedAt` unset) and not
//!   expired are traced; a completed one leaves the snapshots' `revocationTraces`.
//!
//! Nothing here happens unless spans are exported: without an endpoint no annotation is
//! written and snapshots carry no traces.
//!
//! The annotation is a trace hint and nothing more. Whoever may write PrincipalRevocations can
//! set it to any value, which only decides which trace the operator's and the sidecars' spans
//! about that revocation join (and, under a parent-based sampler, whether they are sampled):
//! enforcement never reads it, and such a writer can already revoke anyone.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use crate::api::PrincipalRevocation;
use crate::telemetry::otel::exporting;
use crate::telemetry::revocation_spans::{self, TraceParent};

use super::conventions::FIELD_MANAGER;

/// The annotation carrying a revocation's `traceparent`.
pub const TRACEPARENT_ANNOTATION: &str = "lifeguard.dev/traceparent";

/// How often the annotation write is tried again after a conflicting change.
const ANNOTATE_ATTEMPTS: usize = 3;

/// What a revocation object says about its trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TraceHint {
    /// The annotation holds a valid `traceparent`.
    Valid(String),
    /// The annotation holds something else: ignored, and kept as it is.
    Invalid,
    /// No annotation.
    Missing,
}

/// The trace hint of `revocation`'s annotation.
pub fn hint(revocation: &PrincipalRevocation) -> TraceHint {
    match revocation
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(TRACEPARENT_ANNOTATION))
    {
        None => TraceHint::Missing,
        Some(value) => match TraceParent::parse(value) {
            Some(parsed) => TraceHint::Valid(parsed.to_string()),
            None => TraceHint::Invalid,
        },
    }
}

/// Whether `revocation`'s propagation is still traced at `now`: not complete, not expired.
fn in_flight(revocation: &PrincipalRevocation, now: Timestamp) -> bool {
    let completed = revocation
        .status
        .as_ref()
        .is_some_and(|s| s.completed_at.is_some());
    let expired = revocation
        .spec
        .expires_at
        .as_ref()
        .is_some_and(|e| e.0 <= now);
    !completed && !expired
}

/// The merge patch that adds the annotation, preconditioned on the object being the one read
/// (`uid`) and unchanged since (`resourceVersion`): the API server refuses it with a conflict
/// otherwise, so a value written meanwhile is never replaced.
pub fn annotation_patch(uid: &str, resource_version: &str, traceparent: &str) -> Value {
    json!({
        "metadata": {
            "uid": uid,
            "resourceVersion": resource_version,
            "annotations": {TRACEPARENT_ANNOTATION: traceparent},
        }
    })
}

/// A trace this replica started for a revocation without one.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Started {
    /// The object it was started for (a new object of the same name gets its own).
    uid: String,
    traceparent: String,
}

/// The traces this replica started and whose annotation it has not seen yet, and the objects
/// whose annotation it ignored.
#[derive(Debug, Default)]
pub struct StartedTraces {
    started: BTreeMap<String, Started>,
    /// uids whose unusable annotation was reported (once each).
    ignored: BTreeSet<String>,
}

fn uid_of(revocation: &PrincipalRevocation) -> Option<&str> {
    revocation.metadata.uid.as_deref()
}

fn name_of(revocation: &PrincipalRevocation) -> &str {
    revocation.metadata.name.as_deref().unwrap_or_default()
}

impl StartedTraces {
    /// Forgets what the objects no longer need: traces of revocations that are gone, replaced,
    /// annotated (the annotation is the source from then on) or no longer in flight.
    pub fn settle(&mut self, revocations: &[Arc<PrincipalRevocation>], now: Timestamp) {
        let pending: BTreeMap<&str, &str> = revocations
            .iter()
            .filter(|r| hint(r) == TraceHint::Missing && in_flight(r, now))
            .filter_map(|r| Some((name_of(r), uid_of(r)?)))
            .collect();
        self.started
            .retain(|name, s| pending.get(name.as_str()) == Some(&s.uid.as_str()));
        let existing: BTreeSet<&str> = revocations.iter().filter_map(|r| uid_of(r)).collect();
        self.ignored.retain(|uid| existing.contains(uid.as_str()));
    }

    /// The revocations that need a new trace: in flight, without annotation, and without a
    /// trace this replica started for that object.
    pub fn needing_trace<'a>(
        &self,
        revocations: &'a [Arc<PrincipalRevocation>],
        now: Timestamp,
    ) -> Vec<&'a PrincipalRevocation> {
        revocations
            .iter()
            .filter(|r| hint(r) == TraceHint::Missing && in_flight(r, now))
            .filter(|r| {
                uid_of(r).is_some_and(|uid| {
                    self.started
                        .get(name_of(r))
                        .is_none_or(|s| s.uid.as_str() != uid)
                })
            })
            .map(AsRef::as_ref)
            .collect()
    }

    /// Records the trace started for `revocation`.
    pub fn record(&mut self, revocation: &PrincipalRevocation, traceparent: String) {
        if let Some(uid) = uid_of(revocation) {
            self.started.insert(
                name_of(revocation).to_owned(),
                Started {
                    uid: uid.to_owned(),
                    traceparent,
                },
            );
        }
    }

    /// The revocations with an annotation that is not a `traceparent` and not reported yet;
    /// they count as reported from now on.
    pub fn newly_ignored<'a>(
        &mut self,
        revocations: &'a [Arc<PrincipalRevocation>],
    ) -> Vec<&'a PrincipalRevocation> {
        revocations
            .iter()
            .filter(|r| hint(r) == TraceHint::Invalid)
            .filter(|r| uid_of(r).is_some_and(|uid| self.ignored.insert(uid.to_owned())))
            .map(AsRef::as_ref)
            .collect()
    }

    /// Revocation name → `traceparent` for every revocation in flight with a trace: its
    /// annotation when valid, else the one this replica started for that object.
    pub fn traces(
        &self,
        revocations: &[Arc<PrincipalRevocation>],
        now: Timestamp,
    ) -> BTreeMap<String, String> {
        revocations
            .iter()
            .filter(|r| in_flight(r, now))
            .filter_map(|r| {
                let traceparent = match hint(r) {
                    TraceHint::Valid(traceparent) => traceparent,
                    TraceHint::Invalid => return None,
                    TraceHint::Missing => self
                        .started
                        .get(name_of(r))
                        .filter(|s| uid_of(r) == Some(s.uid.as_str()))?
                        .traceparent
                        .clone(),
                };
                Some((name_of(r).to_owned(), traceparent))
            })
            .collect()
    }
}

/// The trace of `revocation`: its annotation when it holds a `traceparent`, else the one in
/// the plan's `traces` (started by this replica); none for an unusable annotation.
pub fn trace_of(
    revocation: &PrincipalRevocation,
    traces: &BTreeMap<String, String>,
) -> Option<String> {
    match hint(revocation) {
        TraceHint::Valid(traceparent) => Some(traceparent),
        TraceHint::Invalid => None,
        TraceHint::Missing => traces.get(name_of(revocation)).cloned(),
    }
}

/// The `reason` of a revocation as its spans name it (`sessionRevoked`, ...).
pub fn reason_label(revocation: &PrincipalRevocation) -> String {
    match serde_json::to_value(revocation.spec.reason) {
        Ok(Value::String(reason)) => reason,
        _ => String::new(),
    }
}

/// Starts a trace for every revocation that needs one (see the module documentation) and
/// writes each one's annotation in the background. Only the leading replica calls this, and
/// only while spans are exported.
pub fn start_traces(
    started: &mut StartedTraces,
    revocations: &[Arc<PrincipalRevocation>],
    now: Timestamp,
    client: &kube::Client,
) {
    if !exporting() {
        return;
    }
    for revocation in started.newly_ignored(revocations) {
        tracing::warn!(
            revocation = name_of(revocation),
            annotation = TRACEPARENT_ANNOTATION,
            "the revocation's trace annotation is not a W3C traceparent; it is left as it is and the revocation is not traced"
        );
    }
    for revocation in started.needing_trace(revocations, now) {
        let name = name_of(revocation).to_owned();
        let span = revocation_spans::started(&name, &reason_label(revocation));
        let (Some(traceparent), Some(uid)) = (
            revocation_spans::traceparent_of(&span),
            uid_of(revocation).map(str::to_owned),
        ) else {
            continue;
        };
        started.record(revocation, traceparent.clone());
        let api: Api<PrincipalRevocation> = Api::all(client.clone());
        tokio::spawn(async move {
            let written = tracing::Instrument::instrument(
                annotate(&api, &name, &uid, &traceparent),
                span.clone(),
            )
            .await;
            let written = written.unwrap_or_else(|error| {
                tracing::warn!(revocation = %name, %error, "writing the revocation's trace annotation failed; this replica's snapshots carry the trace, others' do not");
                false
            });
            revocation_spans::annotated(&span, written);
        });
    }
}

/// Writes `traceparent` as the annotation of revocation `name` (the object `uid`) unless the
/// object has the annotation already; `Ok(false)` when it was not written (gone, replaced,
/// annotated meanwhile, or changing too fast).
pub async fn annotate(
    api: &Api<PrincipalRevocation>,
    name: &str,
    uid: &str,
    traceparent: &str,
) -> Result<bool, kube::Error> {
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    for _ in 0..ANNOTATE_ATTEMPTS {
        let Some(current) = api.get_opt(name).await? else {
            return Ok(false);
        };
        if uid_of(&current) != Some(uid) || hint(&current) != TraceHint::Missing {
            return Ok(false);
        }
        let version = current.metadata.resource_version.as_deref().unwrap_or("");
        let patch = annotation_patch(uid, version, traceparent);
        match api.patch(name, &params, &Patch::Merge(&patch)).await {
            Ok(_) => return Ok(true),
            // Changed since it was read: read it again.
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

#[cfg(test)]
#[path = "revocation_traces_tests.rs"]
mod tests;
