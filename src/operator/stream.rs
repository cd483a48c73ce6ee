//! The distribution endpoint sidecars dial: one long-lived NDJSON stream of snapshots per
//! sidecar, and acknowledgements. See `crate::distribution` for the protocol.
//!
//! Every stream shares the operator's one [`Distribution`]: a snapshot line is assembled from
//! the policy's pre-serialized JSON (one copy per policy, however many sidecars run it) and a
//! few per-connection fields, so memory grows with policies plus sidecars, not their product.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{ObjectRef, Store};
use serde::Serialize;
use serde_json::value::RawValue;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::distribution::{
    Ack, HEARTBEAT_INTERVAL, PodIdentity, STREAM_CONTENT_TYPE, StreamMessage, StreamQuery,
};
use crate::policy::ObjectKey;
use crate::runtime::http::{BodyError, BodyReadTimeout, read_body};
use crate::telemetry::revocation_spans;

use super::auth::{
    AuthError, SidecarAuthenticator, check_claim, stream_life, token_digest, token_expiry,
};
use super::metrics::OperatorMetrics;
use super::plan::Plan;
use super::sessions::{SentSnapshot, Sessions, StreamToken};

/// What every stream sends from: the current plan, published whenever it changes.
#[derive(Debug)]
pub struct Distribution {
    pub version: u64,
    pub plan: Arc<Plan>,
    pub approver_keys: Option<Arc<RawValue>>,
    /// Identifies the approver keys' content, so a stream can tell they changed.
    pub approver_keys_hash: Option<String>,
}

/// Shared by the stream and ack handlers.
pub struct StreamContext {
    pub authenticator: SidecarAuthenticator,
    pub sessions: Arc<Sessions>,
    pub distribution: watch::Receiver<Arc<Distribution>>,
    pub metrics: Arc<OperatorMetrics>,
    pub shutdown: CancellationToken,
    /// The pod watch cache: a stream ends once its pod (that uid) is gone.
    pub pods: Store<Pod>,
}

/// A stream whose pod the cache has never shown (it may lag behind a pod that just started)
/// ends after this many heartbeats.
const UNSEEN_HEARTBEATS: u32 = 3;

/// Whether the stream's pod still exists, as the watch cache tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PodPresence {
    /// The cache holds the pod with this uid.
    Present,
    /// The cache holds no pod of that name.
    Absent,
    /// The cache holds a pod of that name with another uid: a new pod took the name.
    Replaced,
}

fn presence(pods: &Store<Pod>, pod: &PodIdentity) -> PodPresence {
    match pods.get(&ObjectRef::new(&pod.name).within(&pod.namespace)) {
        None => PodPresence::Absent,
        Some(found) if found.metadata.uid.as_deref() == Some(pod.uid.as_str()) => {
            PodPresence::Present
        }
        Some(_) => PodPresence::Replaced,
    }
}

/// The snapshot line as written: the policy and approver keys are embedded pre-serialized.
/// Must stay field-for-field what `StreamMessage::Snapshot` reads (a test checks).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SnapshotLine<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    session: &'a str,
    version: u64,
    pod: &'a PodIdentity,
    policy: Option<&'a RawValue>,
    approver_keys: Option<&'a RawValue>,
    issued_at: Timestamp,
    #[serde(skip_serializing_if = "Option::is_none")]
    revocation_traces: Option<&'a RawValue>,
}

/// What a stream last sent, to tell whether a new plan changes anything for its pod.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Sent {
    policy: Option<(ObjectKey, Option<String>)>,
    approver_keys_hash: Option<String>,
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

fn refuse(ctx: &StreamContext, error: &AuthError) -> Response {
    ctx.metrics.auth_refused(error.label());
    tracing::warn!(%error, reason = error.label(), "sidecar refused");
    (error.status(), error.to_string()).into_response()
}

/// What a snapshot of `distribution` for `pod` would carry, as [`Sent`] compares it: cheap, so
/// that a plan that changes nothing for a pod costs its stream no serialization.
fn sent_to(distribution: &Distribution, pod: &PodIdentity) -> Sent {
    let key = ObjectKey {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
    };
    let assigned = distribution.plan.policy_for(&key);
    Sent {
        policy: assigned.map(|(k, c)| (k.clone(), c.map(|c| c.hash.clone()))),
        approver_keys_hash: distribution.approver_keys_hash.clone(),
    }
}

fn snapshot_line(
    distribution: &Distribution,
    pod: &PodIdentity,
    session: &str,
) -> (Bytes, Sent, SentSnapshot) {
    let key = ObjectKey {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
    };
    let assigned = distribution.plan.policy_for(&key);
    let compiled = assigned.and_then(|(_, c)| c);
    let line = SnapshotLine {
        kind: "snapshot",
        session,
        version: distribution.version,
        pod,
        policy: compiled.map(|c| c.json.as_ref()),
        approver_keys: distribution.approver_keys.as_deref(),
        issued_at: Timestamp::now(),
        revocation_traces: compiled.and_then(|c| c.revocation_traces_json.as_deref()),
    };
    // Serializing borrowed JSON and plain fields cannot fail.
    let mut bytes = serde_json::to_vec(&line).unwrap_or_default();
    bytes.push(b'\n');
    let sent = sent_to(distribution, pod);
    let carried = SentSnapshot {
        version: distribution.version,
        policy_hash: compiled.map(|c| c.hash.clone()),
        revocations: compiled.map(|c| c.revocations.clone()).unwrap_or_default(),
    };
    (Bytes::from(bytes), sent, carried)
}

fn heartbeat_line() -> Bytes {
    let mut bytes = serde_json::to_vec(&StreamMessage::Heartbeat).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// Marks the session closed when the response body is dropped (the sidecar went away, or the
/// operator is shutting down).
struct SessionGuard {
    sessions: Arc<Sessions>,
    pod: PodIdentity,
    session: String,
    metrics: Arc<OperatorMetrics>,
    /// The stream ended because its pod no longer exists.
    pod_gone: bool,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        if self.pod_gone {
            self.sessions.forget(&self.pod, &self.session);
        } else {
            self.sessions.disconnect(&self.pod, &self.session);
        }
        self.metrics
            .sidecars_connected
            .set(i64::try_from(self.sessions.connected_count()).unwrap_or(i64::MAX));
    }
}

struct StreamState {
    guard: SessionGuard,
    distribution: watch::Receiver<Arc<Distribution>>,
    sent: Option<Sent>,
    heartbeat: tokio::time::Interval,
    shutdown: CancellationToken,
    metrics: Arc<OperatorMetrics>,
    pods: Store<Pod>,
    /// Whether the cache has shown this pod (with this uid) since the stream opened.
    seen: bool,
    /// Heartbeats sent while the cache never showed the pod.
    unseen_heartbeats: u32,
    /// The revocations of the last snapshot sent (kept only while spans are exported).
    carried: BTreeSet<String>,
    /// When the stream ends because its token's life is over (`auth::stream_life`).
    ends_at: tokio::time::Instant,
}

impl StreamState {
    /// Whether the stream's pod is gone: deleted or replaced by a pod of the same name with
    /// another uid after the cache showed it, or never shown for [`UNSEEN_HEARTBEATS`].
    fn pod_gone(&mut self) -> bool {
        let gone = match presence(&self.pods, &self.guard.pod) {
            PodPresence::Present => {
                self.seen = true;
                false
            }
            // Before the cache has shown this uid, another uid under the name may be the
            // cache lagging behind a re-created pod: both wait for the bound.
            PodPresence::Replaced | PodPresence::Absent => {
                self.seen || self.unseen_heartbeats >= UNSEEN_HEARTBEATS
            }
        };
        if gone {
            let pod = &self.guard.pod;
            tracing::info!(pod = %format!("{}/{}", pod.namespace, pod.name), uid = %pod.uid, session = %self.guard.session, "the pod of this stream no longer exists; ending the stream");
            self.guard.pod_gone = true;
        }
        gone
    }

    /// Marks, in each one's trace, the traced revocations this snapshot brings this sidecar
    /// for the first time on this stream (nothing without export).
    fn trace_new_revocations(&mut self, distribution: &Distribution, carried: &SentSnapshot) {
        if !crate::telemetry::otel::exporting() {
            return;
        }
        let pod = &self.guard.pod;
        if let Some(traces) = distribution
            .plan
            .policy_for(&ObjectKey {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
            })
            .and_then(|(_, c)| c)
            .map(|c| &c.revocation_traces)
        {
            for (name, traceparent) in traces
                .iter()
                .filter(|(name, _)| !self.carried.contains(name.as_str()))
            {
                drop(revocation_spans::distributed(
                    name,
                    traceparent,
                    &pod.namespace,
                    &pod.name,
                    carried.version,
                ));
            }
        }
        self.carried.clone_from(&carried.revocations);
    }

    /// The next line to write, or `None` to end the stream.
    async fn next_line(&mut self) -> Option<Bytes> {
        let mut changed = self.sent.is_none();
        loop {
            if changed {
                if self.pod_gone() {
                    return None;
                }
                let current = self.distribution.borrow_and_update().clone();
                if self.sent.as_ref() != Some(&sent_to(&current, &self.guard.pod)) {
                    let (line, sent, carried) =
                        snapshot_line(&current, &self.guard.pod, &self.guard.session);
                    self.trace_new_revocations(&current, &carried);
                    self.guard
                        .sessions
                        .record_sent(&self.guard.pod, &self.guard.session, carried);
                    self.sent = Some(sent);
                    self.metrics.snapshots_sent.inc();
                    self.heartbeat.reset();
                    return Some(line);
                }
            }
            tokio::select! {
                _ = self.shutdown.cancelled() => return None,
                _ = tokio::time::sleep_until(self.ends_at) => {
                    let pod = &self.guard.pod;
                    tracing::info!(pod = %format!("{}/{}", pod.namespace, pod.name), session = %self.guard.session, "the token this stream was opened with has expired; ending the stream so that the sidecar reconnects with its current token");
                    self.metrics.streams_expired.inc();
                    return None;
                }
                result = self.distribution.changed() => {
                    if result.is_err() {
                        return None;
                    }
                    changed = true;
                }
                _ = self.heartbeat.tick() => {
                    if self.pod_gone() {
                        return None;
                    }
                    if !self.seen {
                        self.unseen_heartbeats += 1;
                    }
                    return Some(heartbeat_line());
                }
            }
        }
    }
}

/// `GET /distribution/v1/stream`.
pub async fn open_stream(
    State(ctx): State<Arc<StreamContext>>,
    headers: HeaderMap,
    query: Result<Query<StreamQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(query)) = query else {
        return (
            StatusCode::BAD_REQUEST,
            "podNamespace and podName query parameters are required",
        )
            .into_response();
    };
    let Some(token) = bearer(&headers) else {
        return refuse(&ctx, &AuthError::MissingToken);
    };
    let pod = match ctx.authenticator.authenticate(token).await {
        Ok(pod) => pod,
        Err(error) => return refuse(&ctx, &error),
    };
    if let Err(error) = check_claim(&pod, &query.pod_namespace, &query.pod_name) {
        return refuse(&ctx, &error);
    }
    let session = new_session_id();
    let ends_at = tokio::time::Instant::now()
        + stream_life(token_expiry(token), Timestamp::now().as_second());
    let stream_token = StreamToken {
        digest: token_digest(token),
        until: ends_at.into_std(),
    };
    ctx.sessions
        .connect(pod.clone(), session.clone(), Some(stream_token));
    ctx.metrics
        .sidecars_connected
        .set(i64::try_from(ctx.sessions.connected_count()).unwrap_or(i64::MAX));
    tracing::info!(pod = %format!("{}/{}", pod.namespace, pod.name), %session, "sidecar connected");
    let mut heartbeat = tokio::time::interval(HEARTBEAT_INTERVAL);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    heartbeat.reset();
    let state = StreamState {
        guard: SessionGuard {
            sessions: ctx.sessions.clone(),
            pod,
            session,
            metrics: ctx.metrics.clone(),
            pod_gone: false,
        },
        distribution: ctx.distribution.clone(),
        sent: None,
        heartbeat,
        shutdown: ctx.shutdown.clone(),
        metrics: ctx.metrics.clone(),
        pods: ctx.pods.clone(),
        seen: false,
        unseen_heartbeats: 0,
        carried: BTreeSet::new(),
        ends_at,
    };
    let body = futures_util::stream::unfold(state, |mut state| async move {
        let line = state.next_line().await?;
        Some((Ok::<_, Infallible>(line), state))
    });
    (
        [
            (header::CONTENT_TYPE, STREAM_CONTENT_TYPE),
            (header::CACHE_CONTROL, "no-store"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

/// Largest acknowledgement read: an [`Ack`] is a few fields and one short entry per
/// revocation of the snapshot (~100 bytes each).
pub const MAX_ACK_BYTES: usize = 256 * 1024;

/// `POST /distribution/v1/ack`. The body is read only after the token was checked, and at most
/// [`MAX_ACK_BYTES`] of it. The token of a stream open on this replica names its pod without a
/// review (the stream's review vouches for it until the stream ends, at the token's expiry at
/// the latest), so a connected fleet's acknowledgements cost the API server nothing, however
/// long it was quiet; any other token is reviewed (a review is reused for at most a minute).
pub async fn acknowledge(
    State(ctx): State<Arc<StreamContext>>,
    timeout: BodyReadTimeout,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let Some(token) = bearer(&headers) else {
        return refuse(&ctx, &AuthError::MissingToken);
    };
    let streaming = ctx
        .sessions
        .pod_of_stream_token(&token_digest(token), std::time::Instant::now());
    let pod = match streaming {
        Some(pod) => {
            ctx.metrics.ack_authenticated("stream_token");
            pod
        }
        None => match ctx.authenticator.authenticate_cached(token).await {
            Ok(pod) => {
                ctx.metrics.ack_authenticated("token_review");
                pod
            }
            Err(error) => return refuse(&ctx, &error),
        },
    };
    let ack: Ack = match read_body(body, MAX_ACK_BYTES, timeout).await {
        Ok(bytes) => match serde_json::from_slice(&bytes) {
            Ok(ack) => ack,
            Err(error) => {
                let message = format!("the acknowledgement is not a valid Ack: {error}");
                return (StatusCode::BAD_REQUEST, message).into_response();
            }
        },
        Err(BodyError::TooLarge) => {
            let message = format!("the acknowledgement is larger than {MAX_ACK_BYTES} bytes");
            return (StatusCode::PAYLOAD_TOO_LARGE, message).into_response();
        }
        Err(BodyError::TimedOut) => {
            let message = "the acknowledgement did not arrive in time";
            return (StatusCode::REQUEST_TIMEOUT, message).into_response();
        }
        Err(BodyError::Unreadable) => {
            let message = "the acknowledgement could not be read";
            return (StatusCode::BAD_REQUEST, message).into_response();
        }
    };
    match ctx.sessions.acknowledge(&pod, &ack) {
        Ok(()) => {
            ctx.metrics.acks.inc();
            StatusCode::NO_CONTENT.into_response()
        }
        Err(refused) => {
            ctx.metrics.ack_refused(refused.label());
            tracing::warn!(pod = %format!("{}/{}", pod.namespace, pod.name), uid = %pod.uid, error = %refused, reason = refused.label(), "acknowledgement refused");
            (refused.status(), refused.to_string()).into_response()
        }
    }
}

fn new_session_id() -> String {
    let mut bytes = [0u8; 16];
    // The OS random source does not fail on supported platforms; a zero id would still only
    // identify a connection, not authorize anything.
    let _ = getrandom::fill(&mut bytes);
    hex::encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::distribution::Snapshot;

    #[test]
    fn a_snapshot_line_reads_back_as_the_wire_message() {
        let distribution = Distribution {
            version: 42,
            plan: Arc::new(Plan::default()),
            approver_keys: Some(Arc::from(
                serde_json::value::to_raw_value(&serde_json::json!({"keys": []})).unwrap(),
            )),
            approver_keys_hash: Some("h".into()),
        };
        let pod = PodIdentity {
            namespace: "team-a".into(),
            name: "reports-0".into(),
            uid: "u".into(),
            service_account: "reports".into(),
        };
        let (line, sent, carried) = snapshot_line(&distribution, &pod, "s1");
        assert_eq!(carried.version, 42);
        assert!(carried.policy_hash.is_none() && carried.revocations.is_empty());
        assert!(line.ends_with(b"\n"));
        let message: StreamMessage = serde_json::from_slice(&line).unwrap();
        let StreamMessage::Snapshot(snapshot) = message else {
            panic!("not a snapshot");
        };
        let Snapshot {
            session,
            version,
            pod: back,
            policy,
            approver_keys,
            ..
        } = *snapshot;
        assert_eq!((session.as_str(), version), ("s1", 42));
        assert_eq!(back, pod);
        assert!(policy.is_none());
        assert_eq!(approver_keys, Some(serde_json::json!({"keys": []})));
        assert_eq!(sent.policy, None);
    }

    #[test]
    fn a_snapshot_line_carries_its_policys_revocation_traces() {
        let effective = crate::policy::testing::with_tasks("    enabled: true\n");
        let traces = std::collections::BTreeMap::from([(
            "alice-session".to_owned(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
        )]);
        let policy_key = ObjectKey {
            namespace: "team-a".into(),
            name: "reports".into(),
        };
        let compiled = super::super::plan::CompiledPolicy {
            hash: effective.hash(),
            json: Arc::from(serde_json::value::to_raw_value(&effective).unwrap()),
            revocations: ["alice-session".to_owned()].into(),
            revocation_traces_json: Some(Arc::from(
                serde_json::value::to_raw_value(&traces).unwrap(),
            )),
            revocation_traces: traces.clone(),
            effective,
        };
        let mut plan = Plan::default();
        plan.policies.insert(
            policy_key.clone(),
            super::super::plan::PolicyPlan {
                generation: Some(1),
                compiled: Some(Arc::new(compiled)),
                errors: Vec::new(),
                matched_pods: 1,
                shadowed_by: None,
            },
        );
        let pod = PodIdentity {
            namespace: "team-a".into(),
            name: "reports-0".into(),
            uid: "u".into(),
            service_account: "reports".into(),
        };
        plan.pods.insert(
            ObjectKey {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
            },
            policy_key,
        );
        let distribution = Distribution {
            version: 3,
            plan: Arc::new(plan),
            approver_keys: None,
            approver_keys_hash: None,
        };
        let (line, _, carried) = snapshot_line(&distribution, &pod, "s1");
        let StreamMessage::Snapshot(snapshot) = serde_json::from_slice(&line).unwrap() else {
            panic!("not a snapshot");
        };
        assert_eq!(snapshot.revocation_traces, traces);
        // The sidecar's hash of what it enforces is the plan's: traces are beside the policy.
        assert_eq!(snapshot.policy_hash(), carried.policy_hash);
    }

    /// The stream's state and what the test keeps of its world: the registry, the metrics, and
    /// the plan's sender (while it lives, the stream waits for plans).
    type Opened = (
        StreamState,
        Arc<Sessions>,
        Arc<OperatorMetrics>,
        watch::Sender<Arc<Distribution>>,
    );

    /// A stream of a pod the cache holds, its token good for `life`, on a plan with no policy.
    fn open_state(life: std::time::Duration) -> Opened {
        use kube::runtime::{reflector, watcher};
        let pod = PodIdentity {
            namespace: "team-a".into(),
            name: "reports-0".into(),
            uid: "uid-1".into(),
            service_account: "reports".into(),
        };
        let (pods, mut writer) = reflector::store::<Pod>();
        writer.apply_watcher_event(&watcher::Event::Apply(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "reports-0", "namespace": "team-a", "uid": "uid-1"},
                "spec": {"containers": [], "serviceAccountName": "reports"}
            }))
            .unwrap(),
        ));
        let (sessions, _events) = Sessions::new();
        let sessions = Arc::new(sessions);
        let metrics = Arc::new(OperatorMetrics::new());
        let (publish, distribution) = watch::channel(Arc::new(Distribution {
            version: 1,
            plan: Arc::new(Plan::default()),
            approver_keys: None,
            approver_keys_hash: None,
        }));
        let token = StreamToken {
            digest: [7; 32],
            until: std::time::Instant::now() + life,
        };
        sessions.connect(pod.clone(), "s1".into(), Some(token));
        let mut heartbeat = tokio::time::interval(HEARTBEAT_INTERVAL);
        heartbeat.reset();
        let state = StreamState {
            guard: SessionGuard {
                sessions: sessions.clone(),
                pod,
                session: "s1".into(),
                metrics: metrics.clone(),
                pod_gone: false,
            },
            distribution,
            sent: None,
            heartbeat,
            shutdown: CancellationToken::new(),
            metrics: metrics.clone(),
            pods,
            seen: false,
            unseen_heartbeats: 0,
            carried: BTreeSet::new(),
            ends_at: tokio::time::Instant::now() + life,
        };
        (state, sessions, metrics, publish)
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_ends_when_its_tokens_life_is_over_and_its_token_stops_vouching() {
        // Not a multiple of the heartbeat interval, so no heartbeat is due at the same instant.
        let (mut state, sessions, metrics, _publish) =
            open_state(std::time::Duration::from_secs(25));
        let ends_at = state.ends_at;
        assert!(
            sessions
                .pod_of_stream_token(&[7; 32], std::time::Instant::now())
                .is_some()
        );
        let mut lines = Vec::new();
        let mut ended = false;
        // Bounded, so that a stream that never ends fails the test instead of hanging it.
        for _ in 0..10 {
            match state.next_line().await {
                Some(line) => lines.push(serde_json::from_slice::<StreamMessage>(&line).unwrap()),
                None => {
                    ended = true;
                    break;
                }
            }
        }
        assert!(ended, "{lines:?}");
        // The snapshot, then a heartbeat every 10 s until the 25 s life is over, then the end.
        assert!(
            matches!(lines.first(), Some(StreamMessage::Snapshot(_))),
            "{lines:?}"
        );
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(tokio::time::Instant::now() >= ends_at);
        assert_eq!(metrics.streams_expired.get(), 1);
        // Still open until the response body (the state) is dropped; then the session is
        // closed and its token names nobody.
        assert_eq!(sessions.connected_count(), 1);
        drop(state);
        assert_eq!(sessions.connected_count(), 0);
        assert!(
            sessions
                .pod_of_stream_token(&[7; 32], std::time::Instant::now())
                .is_none()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_within_its_tokens_life_keeps_going() {
        let (mut state, _sessions, metrics, _publish) =
            open_state(std::time::Duration::from_secs(600));
        for _ in 0..10 {
            assert!(state.next_line().await.is_some());
        }
        assert_eq!(metrics.streams_expired.get(), 0);
    }

    #[test]
    fn only_bearer_credentials_are_read() {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer(&h), None);
    }
}
