//! Leader election on a `coordination.k8s.io/v1` Lease: only the leader writes status, Events
//! and child objects; every replica serves sidecar streams.
//!
//! The leader renews every [`RENEW_INTERVAL`]; a Lease whose `renewTime` is older than its
//! `leaseDurationSeconds` ([`LEASE_DURATION`]) may be taken by anyone. A replica that cannot
//! renew for a whole lease duration stops acting as leader before anyone else can take over,
//! so two leaders never write at once (clock skew aside). Writes carry the `resourceVersion`
//! read, so two replicas racing for an expired Lease cannot both win.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Name of the Lease in the operator's namespace.
pub const LEASE_NAME: &str = "lifeguard-operator";
/// How long a Lease stays valid without renewal.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How often the holder renews (and others check).
pub const RENEW_INTERVAL: Duration = Duration::from_secs(2);

/// What to do with the Lease as found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseDecision {
    /// No Lease yet: create it holding it.
    Create,
    /// We hold it: renew.
    Renew,
    /// Someone else's Lease expired (or has no holder): take it over.
    Acquire,
    /// Someone else holds a valid Lease.
    Follow { holder: String },
}

/// Decides from the Lease as read, at `now`.
pub fn decide(lease: Option<&Lease>, me: &str, now: Timestamp) -> LeaseDecision {
    let Some(lease) = lease else {
        return LeaseDecision::Create;
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.unwrap_or_default();
    if holder == me {
        return LeaseDecision::Renew;
    }
    if holder.is_empty() {
        return LeaseDecision::Acquire;
    }
    let duration = spec
        .lease_duration_seconds
        .map(|s| jiff::SignedDuration::from_secs(i64::from(s)))
        .unwrap_or(jiff::SignedDuration::from_secs(
            LEASE_DURATION.as_secs() as i64
        ));
    match spec.renew_time.or(spec.acquire_time) {
        Some(MicroTime(renewed)) if renewed + duration > now => LeaseDecision::Follow { holder },
        _ => LeaseDecision::Acquire,
    }
}

fn lease_spec(me: &str, now: Timestamp, acquire: Option<Timestamp>, transitions: i32) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(me.to_owned()),
        lease_duration_seconds: Some(LEASE_DURATION.as_secs() as i32),
        acquire_time: acquire.map(MicroTime),
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(transitions),
        ..Default::default()
    }
}

/// One round: read, decide, write. Returns whether we hold the Lease afterwards.
pub async fn round(api: &Api<Lease>, me: &str) -> Result<bool, kube::Error> {
    round_at(api, me, Timestamp::now()).await
}

/// [`round`] at the instant `now`.
pub(crate) async fn round_at(
    api: &Api<Lease>,
    me: &str,
    now: Timestamp,
) -> Result<bool, kube::Error> {
    let current = api.get_opt(LEASE_NAME).await?;
    match decide(current.as_ref(), me, now) {
        LeaseDecision::Create => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(LEASE_NAME.to_owned()),
                    ..Default::default()
                },
                spec: Some(lease_spec(me, now, Some(now), 0)),
            };
            match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                // Another replica created it first.
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
        LeaseDecision::Follow { .. } => Ok(false),
        decision => {
            let previous = current
                .as_ref()
                .and_then(|l| l.spec.clone())
                .unwrap_or_default();
            let (acquire, transitions) = if decision == LeaseDecision::Renew {
                (
                    previous.acquire_time.map(|t| t.0),
                    previous.lease_transitions.unwrap_or(0),
                )
            } else {
                (Some(now), previous.lease_transitions.unwrap_or(0) + 1)
            };
            let patch = serde_json::json!({
                "metadata": {
                    "resourceVersion": current.as_ref().and_then(|l| l.metadata.resource_version.clone()),
                },
                "spec": lease_spec(me, now, acquire, transitions),
            });
            match api
                .patch(LEASE_NAME, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => Ok(true),
                // Someone wrote the Lease since we read it: they won this round.
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
    }
}

/// Runs the election until `shutdown`, publishing whether this replica leads. Gives the Lease
/// up on shutdown so a successor does not wait for it to expire.
pub async fn run(
    api: Api<Lease>,
    me: String,
    leading: watch::Sender<bool>,
    shutdown: CancellationToken,
) {
    let mut last_held: Option<std::time::Instant> = None;
    loop {
        match round(&api, &me).await {
            Ok(true) => {
                last_held = Some(std::time::Instant::now());
                if !*leading.borrow() {
                    tracing::info!(identity = %me, "became leader");
                }
                leading.send_replace(true);
            }
            Ok(false) => {
                if *leading.borrow() {
                    tracing::warn!(identity = %me, "lost the leader Lease");
                }
                last_held = None;
                leading.send_replace(false);
            }
            Err(error) => {
                tracing::warn!(%error, "leader election round failed");
                // Stop leading before the Lease could have expired for others.
                if last_held.is_some_and(|t| t.elapsed() + RENEW_INTERVAL >= LEASE_DURATION) {
                    last_held = None;
                    leading.send_replace(false);
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(RENEW_INTERVAL) => {}
        }
    }
    if *leading.borrow() {
        let release = serde_json::json!({"spec": {"holderIdentity": null, "renewTime": null}});
        let _ = api
            .patch(LEASE_NAME, &PatchParams::default(), &Patch::Merge(&release))
            .await;
        leading.send_replace(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: &str, renewed: &str) -> Lease {
        Lease {
            metadata: Default::default(),
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(renewed.parse().unwrap())),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn the_lease_is_taken_only_when_absent_ours_or_expired() {
        let now: Timestamp = "2026-12-01T00:00:20Z".parse().unwrap();
        assert_eq!(decide(None, "me", now), LeaseDecision::Create);
        assert_eq!(
            decide(Some(&lease("me", "2026-12-01T00:00:00Z")), "me", now),
            LeaseDecision::Renew
        );
        assert_eq!(
            decide(Some(&lease("other", "2026-12-01T00:00:10Z")), "me", now),
            LeaseDecision::Follow {
                holder: "other".into()
            }
        );
        // Renewed 15 s ago or more: expired.
        assert_eq!(
            decide(Some(&lease("other", "2026-12-01T00:00:05Z")), "me", now),
            LeaseDecision::Acquire
        );
        assert_eq!(
            decide(Some(&lease("", "2026-12-01T00:00:19Z")), "me", now),
            LeaseDecision::Acquire
        );
    }
}
