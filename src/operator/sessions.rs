//! The sidecars connected to this operator replica: one entry per pod (its latest
//! authenticated connection), what each acknowledged, and what each revocation did there.
//! Plain data behind a mutex; the stream and ack handlers write it, the status reconcilers
//! read it.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use jiff::Timestamp;
use tokio::sync::{Notify, mpsc};

use crate::distribution::{Ack, PodIdentity, RevocationApplied};
use crate::policy::ObjectKey;

#[cfg(test)]
use super::ack_table::RevocationTotals;
use super::ack_table::{AckTable, PodAck};
use super::plan::PodKey;

/// What a pod's sidecar last acknowledged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acknowledged {
    pub version: u64,
    pub policy_hash: Option<String>,
}

/// A sidecar's report for one revocation is capped at this many tasks (and, separately,
/// streams): a report above it is recorded as this bound. Totals over sidecars saturate at
/// `u64::MAX` (and status at `i64::MAX`); nothing wraps.
pub const MAX_REPORTED_COUNT: u64 = 1_000_000;
/// A session remembers what its last this-many snapshots carried; an ack may only name one
/// of them (an older one is answered as never sent).
pub const SENT_REMEMBERED: usize = 8;

/// What one snapshot sent on a session carried: all an ack of it may name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentSnapshot {
    pub version: u64,
    pub policy_hash: Option<String>,
    pub revocations: BTreeSet<String>,
}

/// The bearer token a stream was opened with (its SHA-256) and the instant the stream ends
/// (`auth::stream_life`): an acknowledgement presenting that token while the stream is open
/// comes from the stream's pod, reviewed when the stream opened, and needs no review of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamToken {
    pub digest: [u8; 32],
    pub until: Instant,
}

/// One pod's sidecar.
#[derive(Clone, Debug)]
pub struct SidecarSession {
    pub session: String,
    pub pod: PodIdentity,
    pub connected: bool,
    /// When this connection was authenticated (the latest connection of a pod wins across
    /// operator replicas).
    pub connected_at: Timestamp,
    /// Acknowledged through `session` (an older connection's acks are not counted).
    pub acknowledged: Option<Acknowledged>,
    /// The last [`SENT_REMEMBERED`] snapshots sent through `session`, oldest first.
    pub sent: VecDeque<SentSnapshot>,
    /// The token `session` was opened with, while it is open.
    pub token: Option<StreamToken>,
}

#[derive(Default)]
struct Inner {
    sidecars: HashMap<PodKey, SidecarSession>,
    /// revocation name → pod → what applying it did there. Kept across reconnects: a sidecar
    /// reports the counts of its first application every time it acknowledges.
    revocations: HashMap<String, BTreeMap<PodKey, RevocationApplied>>,
    /// Token digest → the pod whose open session was opened with it.
    stream_tokens: HashMap<[u8; 32], PodKey>,
}

impl Inner {
    /// Takes the token of `key`'s session out of the index (if the index still points at
    /// `key` for it).
    fn unbind(&mut self, key: &PodKey) {
        if let Some(token) = self.sidecars.get_mut(key).and_then(|e| e.token.take())
            && self.stream_tokens.get(&token.digest) == Some(key)
        {
            self.stream_tokens.remove(&token.digest);
        }
    }
}

/// Why an acknowledgement was not recorded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AckRefused {
    #[error("the pod has no open stream on this replica")]
    NoStream,
    #[error("the acknowledgement names an older connection of this pod")]
    StaleSession,
    #[error(
        "the stream of this pod name belongs to another pod (uid {current}); this token is for \
         uid {acking}"
    )]
    OtherPod { current: String, acking: String },
    #[error(
        "snapshot version {0} was never sent on this session (or is older than the last \
         {SENT_REMEMBERED} sent)"
    )]
    UnknownVersion(u64),
    #[error("snapshot version {0} carried another policy hash than the acknowledgement names")]
    PolicyHashMismatch(u64),
    #[error("snapshot version {version} did not carry revocation {name:?}")]
    UnsentRevocation { version: u64, name: String },
    #[error("revocation {0:?} is named more than once")]
    DuplicateRevocation(String),
}

impl AckRefused {
    /// 409 when the session is not (or no longer) this pod's; 422 when the acknowledgement
    /// names what was never sent.
    pub fn status(&self) -> http::StatusCode {
        match self {
            Self::NoStream | Self::StaleSession | Self::OtherPod { .. } => {
                http::StatusCode::CONFLICT
            }
            _ => http::StatusCode::UNPROCESSABLE_ENTITY,
        }
    }

    /// Bounded metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Self::NoStream => "no_stream",
            Self::StaleSession => "stale_session",
            Self::OtherPod { .. } => "other_pod",
            Self::UnknownVersion(_) => "unknown_version",
            Self::PolicyHashMismatch(_) => "policy_hash_mismatch",
            Self::UnsentRevocation { .. } => "unsent_revocation",
            Self::DuplicateRevocation(_) => "duplicate_revocation",
        }
    }
}

/// Checks `ack` against what `session` was sent; returns the revocation reports to record,
/// counts capped at [`MAX_REPORTED_COUNT`].
fn validate(session: &SidecarSession, ack: &Ack) -> Result<Vec<RevocationApplied>, AckRefused> {
    let sent = session
        .sent
        .iter()
        .find(|s| s.version == ack.version)
        .ok_or(AckRefused::UnknownVersion(ack.version))?;
    if sent.policy_hash != ack.policy_hash {
        return Err(AckRefused::PolicyHashMismatch(ack.version));
    }
    let mut named = BTreeSet::new();
    let mut reports = Vec::with_capacity(ack.revocations.len().min(sent.revocations.len()));
    for applied in &ack.revocations {
        if !sent.revocations.contains(&applied.name) {
            return Err(AckRefused::UnsentRevocation {
                version: ack.version,
                name: applied.name.clone(),
            });
        }
        if !named.insert(applied.name.as_str()) {
            return Err(AckRefused::DuplicateRevocation(applied.name.clone()));
        }
        if applied.tasks_cancelled > MAX_REPORTED_COUNT
            || applied.streams_closed > MAX_REPORTED_COUNT
        {
            tracing::warn!(
                pod = %format!("{}/{}", session.pod.namespace, session.pod.name),
                revocation = %applied.name,
                tasks = applied.tasks_cancelled,
                streams = applied.streams_closed,
                "a sidecar reported more than {MAX_REPORTED_COUNT} tasks or streams for one revocation; recording the bound"
            );
        }
        reports.push(RevocationApplied {
            name: applied.name.clone(),
            tasks_cancelled: applied.tasks_cancelled.min(MAX_REPORTED_COUNT),
            streams_closed: applied.streams_closed.min(MAX_REPORTED_COUNT),
        });
    }
    Ok(reports)
}

/// The registry, with channels that tell the status reconcilers which objects to look at again.
pub struct Sessions {
    inner: Mutex<Inner>,
    /// Bumped by every change (a cache key for views built from the registry).
    version: AtomicU64,
    /// Woken by every change (the ack table publisher waits on it).
    pub changed: Notify,
    pods_changed: mpsc::UnboundedSender<PodKey>,
    revocations_acknowledged: mpsc::UnboundedSender<String>,
}

/// Receivers of the registry's change notifications.
pub struct SessionEvents {
    /// A pod connected, disconnected or acknowledged.
    pub pods: mpsc::UnboundedReceiver<PodKey>,
    /// A revocation was acknowledged by some pod.
    pub revocations: mpsc::UnboundedReceiver<String>,
}

fn pod_key(pod: &PodIdentity) -> PodKey {
    ObjectKey {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
    }
}

impl Sessions {
    pub fn new() -> (Self, SessionEvents) {
        let (pods_tx, pods) = mpsc::unbounded_channel();
        let (rev_tx, revocations) = mpsc::unbounded_channel();
        (
            Self {
                inner: Mutex::new(Inner::default()),
                version: AtomicU64::new(0),
                changed: Notify::new(),
                pods_changed: pods_tx,
                revocations_acknowledged: rev_tx,
            },
            SessionEvents { pods, revocations },
        )
    }

    fn touched(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_one();
    }

    /// Changes so far.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// This replica's table: every pod's latest connection and what it reported.
    pub fn table(&self, replica: &str, now: Timestamp) -> AckTable {
        let inner = self.lock();
        let mut pods: BTreeMap<String, PodAck> = BTreeMap::new();
        for (key, s) in &inner.sidecars {
            pods.insert(
                key.to_string(),
                PodAck {
                    connected_at: s.connected_at,
                    connected: s.connected,
                    policy_hash: s.acknowledged.as_ref().and_then(|a| a.policy_hash.clone()),
                    revocations: BTreeMap::new(),
                },
            );
        }
        for (name, by_pod) in &inner.revocations {
            for (key, applied) in by_pod {
                if let Some(entry) = pods.get_mut(&key.to_string()) {
                    entry.revocations.insert(
                        name.clone(),
                        [applied.tasks_cancelled, applied.streams_closed],
                    );
                }
            }
        }
        AckTable {
            replica: replica.to_owned(),
            updated_at: now,
            pods,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The data stays consistent across a panic elsewhere: every write is a single insert.
        super::conventions::locked(&self.inner)
    }

    /// Records a new authenticated connection, opened with `token`; it replaces any earlier
    /// one of the same pod.
    pub fn connect(&self, pod: PodIdentity, session: String, token: Option<StreamToken>) {
        let key = pod_key(&pod);
        let mut inner = self.lock();
        inner.unbind(&key);
        if let Some(token) = token {
            inner.stream_tokens.insert(token.digest, key.clone());
        }
        inner.sidecars.insert(
            key.clone(),
            SidecarSession {
                session,
                pod,
                connected: true,
                connected_at: Timestamp::now(),
                acknowledged: None,
                sent: VecDeque::new(),
                token,
            },
        );
        drop(inner);
        self.touched();
        let _ = self.pods_changed.send(key);
    }

    /// Marks a connection closed (only if it is still the pod's latest).
    pub fn disconnect(&self, pod: &PodIdentity, session: &str) {
        let key = pod_key(pod);
        let mut inner = self.lock();
        if let Some(entry) = inner.sidecars.get_mut(&key)
            && entry.session == session
        {
            entry.connected = false;
            entry.sent.clear();
            inner.unbind(&key);
            drop(inner);
            self.touched();
            let _ = self.pods_changed.send(key);
        }
    }

    /// Forgets a connection whose pod no longer exists (only if it is still the pod name's
    /// latest), so deleted pods leave no state behind.
    pub fn forget(&self, pod: &PodIdentity, session: &str) {
        let key = pod_key(pod);
        let mut inner = self.lock();
        if inner
            .sidecars
            .get(&key)
            .is_some_and(|entry| entry.session == session && entry.pod.uid == pod.uid)
        {
            inner.unbind(&key);
            inner.sidecars.remove(&key);
            drop(inner);
            self.touched();
            let _ = self.pods_changed.send(key);
        }
    }

    /// Records that `sent` went out on `session` (before the line is written, so its ack
    /// cannot arrive first). Keeps the last [`SENT_REMEMBERED`].
    pub fn record_sent(&self, pod: &PodIdentity, session: &str, sent: SentSnapshot) {
        let mut inner = self.lock();
        if let Some(entry) = inner.sidecars.get_mut(&pod_key(pod))
            && entry.session == session
            && entry.pod.uid == pod.uid
        {
            if entry.sent.len() >= SENT_REMEMBERED {
                entry.sent.pop_front();
            }
            entry.sent.push_back(sent);
        }
    }

    /// The pod whose open stream was opened with the token of `digest`, if that stream is still
    /// open at `now` (see [`StreamToken`]).
    pub fn pod_of_stream_token(&self, digest: &[u8; 32], now: Instant) -> Option<PodIdentity> {
        let inner = self.lock();
        let entry = inner.sidecars.get(inner.stream_tokens.get(digest)?)?;
        let token = entry.token.as_ref()?;
        (entry.connected && token.digest == *digest && now < token.until).then(|| entry.pod.clone())
    }

    /// Records an acknowledgement from `pod`.
    pub fn acknowledge(&self, pod: &PodIdentity, ack: &Ack) -> Result<(), AckRefused> {
        let key = pod_key(pod);
        let mut inner = self.lock();
        let entry = inner.sidecars.get_mut(&key).ok_or(AckRefused::NoStream)?;
        if entry.pod.uid != pod.uid {
            return Err(AckRefused::OtherPod {
                current: entry.pod.uid.clone(),
                acking: pod.uid.clone(),
            });
        }
        if !entry.connected {
            return Err(AckRefused::NoStream);
        }
        if entry.session != ack.session {
            return Err(AckRefused::StaleSession);
        }
        if entry
            .acknowledged
            .as_ref()
            .is_some_and(|a| a.version > ack.version)
        {
            // A late ack of an older version changes nothing.
            return Ok(());
        }
        let reports = validate(entry, ack)?;
        entry.acknowledged = Some(Acknowledged {
            version: ack.version,
            policy_hash: ack.policy_hash.clone(),
        });
        for applied in &reports {
            inner
                .revocations
                .entry(applied.name.clone())
                .or_default()
                .insert(key.clone(), applied.clone());
        }
        drop(inner);
        self.touched();
        let _ = self.pods_changed.send(key);
        for applied in reports {
            let _ = self.revocations_acknowledged.send(applied.name);
        }
        Ok(())
    }

    /// Forgets a revocation (after it was deleted).
    pub fn forget_revocation(&self, revocation: &str) {
        self.lock().revocations.remove(revocation);
        self.touched();
    }

    /// Number of pods with an open connection.
    pub fn connected_count(&self) -> usize {
        self.lock()
            .sidecars
            .values()
            .filter(|s| s.connected)
            .count()
    }
}

/// Queries of this replica's own registry, for the tests: the controllers read every
/// replica's sidecars merged (`ack_table::SidecarView`) instead.
#[cfg(test)]
impl Sessions {
    /// Whether the pod's latest connection is open and acknowledged `policy_hash`.
    pub fn in_sync(&self, pod: &PodKey, policy_hash: &str) -> bool {
        self.lock().sidecars.get(pod).is_some_and(|s| {
            s.connected
                && s.acknowledged
                    .as_ref()
                    .is_some_and(|a| a.policy_hash.as_deref() == Some(policy_hash))
        })
    }

    /// Pods that reported applying `revocation`.
    pub fn reported(&self, revocation: &str) -> Vec<PodKey> {
        self.lock()
            .revocations
            .get(revocation)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// What `revocation` did, summed over the pods that reported it.
    pub fn totals(&self, revocation: &str) -> RevocationTotals {
        let inner = self.lock();
        let mut totals = RevocationTotals::default();
        if let Some(pods) = inner.revocations.get(revocation) {
            for applied in pods.values() {
                totals.tasks_cancelled = totals
                    .tasks_cancelled
                    .saturating_add(applied.tasks_cancelled);
                totals.streams_closed =
                    totals.streams_closed.saturating_add(applied.streams_closed);
            }
        }
        totals
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str) -> PodIdentity {
        PodIdentity {
            namespace: "team-a".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            service_account: "reports".into(),
        }
    }

    fn ack(session: &str, version: u64, hash: &str, revoked: &[(&str, u64)]) -> Ack {
        Ack {
            session: session.into(),
            version,
            policy_hash: Some(hash.into()),
            revocations: revoked
                .iter()
                .map(|(name, tasks)| RevocationApplied {
                    name: (*name).into(),
                    tasks_cancelled: *tasks,
                    streams_closed: 1,
                })
                .collect(),
        }
    }

    /// Connects `pod` on `session` and records that `version` went out with hash `h` and
    /// revocations `revoked`.
    fn sent(sessions: &Sessions, pod: &PodIdentity, session: &str, version: u64, revoked: &[&str]) {
        sessions.record_sent(
            pod,
            session,
            SentSnapshot {
                version,
                policy_hash: Some("h".into()),
                revocations: revoked.iter().map(|r| (*r).to_owned()).collect(),
            },
        );
    }

    fn connect(
        sessions: &Sessions,
        pod: &PodIdentity,
        session: &str,
        version: u64,
        revoked: &[&str],
    ) {
        sessions.connect(pod.clone(), session.into(), None);
        sent(sessions, pod, session, version, revoked);
    }

    #[test]
    fn an_open_streams_token_names_its_pod_until_the_stream_ends_or_expires() {
        let (sessions, _events) = Sessions::new();
        let now = Instant::now();
        let until = now + std::time::Duration::from_secs(600);
        let token = |n: u8| StreamToken {
            digest: [n; 32],
            until,
        };
        sessions.connect(pod("a"), "s1".into(), Some(token(1)));
        sessions.connect(pod("b"), "s2".into(), Some(token(2)));
        sessions.connect(pod("c"), "s3".into(), None);
        assert_eq!(sessions.pod_of_stream_token(&[1; 32], now), Some(pod("a")));
        assert_eq!(sessions.pod_of_stream_token(&[2; 32], now), Some(pod("b")));
        assert_eq!(sessions.pod_of_stream_token(&[3; 32], now), None);
        // Not once the stream's life is over (the stream ends then too).
        assert_eq!(sessions.pod_of_stream_token(&[1; 32], until), None);
        // A reconnection with a rotated token: the old token no longer vouches.
        sessions.connect(pod("a"), "s4".into(), Some(token(4)));
        assert_eq!(sessions.pod_of_stream_token(&[1; 32], now), None);
        assert_eq!(sessions.pod_of_stream_token(&[4; 32], now), Some(pod("a")));
        // A reconnection with the same token keeps it bound to the new session.
        sessions.connect(pod("a"), "s5".into(), Some(token(4)));
        assert_eq!(sessions.pod_of_stream_token(&[4; 32], now), Some(pod("a")));
        // An older session closing late leaves the newer one's token bound.
        sessions.disconnect(&pod("a"), "s4");
        assert_eq!(sessions.pod_of_stream_token(&[4; 32], now), Some(pod("a")));
        sessions.disconnect(&pod("a"), "s5");
        assert_eq!(sessions.pod_of_stream_token(&[4; 32], now), None);
        // A deleted pod's stream, likewise.
        sessions.forget(&pod("b"), "s2");
        assert_eq!(sessions.pod_of_stream_token(&[2; 32], now), None);
        assert!(sessions.lock().stream_tokens.is_empty());
    }

    #[test]
    fn only_the_latest_connection_of_a_pod_counts() {
        let (sessions, mut events) = Sessions::new();
        connect(&sessions, &pod("a"), "s1", 1, &[]);
        connect(&sessions, &pod("a"), "s2", 1, &[]);
        assert_eq!(
            sessions.acknowledge(&pod("a"), &ack("s1", 1, "h", &[])),
            Err(AckRefused::StaleSession)
        );
        sessions
            .acknowledge(&pod("a"), &ack("s2", 1, "h", &[]))
            .unwrap();
        let key = pod_key(&pod("a"));
        assert!(sessions.in_sync(&key, "h"));
        assert!(!sessions.in_sync(&key, "other"));
        // The first connection closing later does not mark the pod disconnected.
        sessions.disconnect(&pod("a"), "s1");
        assert_eq!(sessions.connected_count(), 1);
        sessions.disconnect(&pod("a"), "s2");
        assert_eq!(sessions.connected_count(), 0);
        assert!(!sessions.in_sync(&key, "h"));
        assert!(events.pods.try_recv().is_ok());
        // A closed session takes no acknowledgement.
        assert_eq!(
            sessions.acknowledge(&pod("a"), &ack("s2", 1, "h", &[])),
            Err(AckRefused::NoStream)
        );
    }

    #[test]
    fn revocation_counts_sum_over_pods_and_survive_reconnects() {
        let (sessions, mut events) = Sessions::new();
        connect(&sessions, &pod("a"), "s1", 5, &["rev"]);
        connect(&sessions, &pod("b"), "s2", 5, &["rev"]);
        sessions
            .acknowledge(&pod("a"), &ack("s1", 5, "h", &[("rev", 2)]))
            .unwrap();
        sessions
            .acknowledge(&pod("b"), &ack("s2", 5, "h", &[("rev", 3)]))
            .unwrap();
        // Pod a reconnects and reports the same first-application counts again.
        connect(&sessions, &pod("a"), "s3", 6, &["rev"]);
        sessions
            .acknowledge(&pod("a"), &ack("s3", 6, "h", &[("rev", 2)]))
            .unwrap();
        assert_eq!(
            sessions.totals("rev"),
            RevocationTotals {
                tasks_cancelled: 5,
                streams_closed: 2
            }
        );
        assert_eq!(sessions.reported("rev").len(), 2);
        assert_eq!(events.revocations.try_recv().unwrap(), "rev");
    }

    #[test]
    fn an_ack_from_a_pod_without_a_stream_is_refused() {
        let (sessions, _events) = Sessions::new();
        assert_eq!(
            sessions.acknowledge(&pod("x"), &ack("s", 1, "h", &[])),
            Err(AckRefused::NoStream)
        );
    }

    #[test]
    fn an_ack_names_only_what_its_session_was_sent() {
        let (sessions, _events) = Sessions::new();
        connect(&sessions, &pod("a"), "s1", 5, &["rev"]);
        let refused = [
            (ack("s1", 99, "h", &[]), AckRefused::UnknownVersion(99)),
            (
                ack("s1", 5, "other", &[]),
                AckRefused::PolicyHashMismatch(5),
            ),
            (
                ack("s1", 5, "h", &[("invented", 1)]),
                AckRefused::UnsentRevocation {
                    version: 5,
                    name: "invented".into(),
                },
            ),
            (
                ack("s1", 5, "h", &[("rev", 1), ("rev", 1)]),
                AckRefused::DuplicateRevocation("rev".into()),
            ),
        ];
        for (bad, error) in refused {
            assert_eq!(sessions.acknowledge(&pod("a"), &bad), Err(error.clone()));
            assert_eq!(error.status(), http::StatusCode::UNPROCESSABLE_ENTITY);
        }
        // Nothing was recorded, and the genuine ack still counts.
        assert!(!sessions.in_sync(&pod_key(&pod("a")), "h"));
        sessions
            .acknowledge(&pod("a"), &ack("s1", 5, "h", &[("rev", 1)]))
            .unwrap();
        assert!(sessions.in_sync(&pod_key(&pod("a")), "h"));
        assert!(sessions.reported("invented").is_empty());
    }

    #[test]
    fn counts_are_capped_and_totals_saturate() {
        let (sessions, _events) = Sessions::new();
        connect(&sessions, &pod("a"), "s1", 1, &["rev"]);
        connect(&sessions, &pod("b"), "s2", 1, &["rev"]);
        sessions
            .acknowledge(&pod("a"), &ack("s1", 1, "h", &[("rev", u64::MAX)]))
            .unwrap();
        sessions
            .acknowledge(&pod("b"), &ack("s2", 1, "h", &[("rev", u64::MAX)]))
            .unwrap();
        assert_eq!(
            sessions.totals("rev").tasks_cancelled,
            2 * MAX_REPORTED_COUNT
        );
    }

    #[test]
    fn an_ack_is_bound_to_the_pod_uid_and_only_recent_versions_are_remembered() {
        let (sessions, _events) = Sessions::new();
        connect(&sessions, &pod("a"), "s1", 1, &[]);
        let mut successor = pod("a");
        successor.uid = "uid-new".into();
        // The same name, another uid: the ack of the old pod's token is not the new pod's.
        assert!(matches!(
            sessions.acknowledge(&successor, &ack("s1", 1, "h", &[])),
            Err(AckRefused::OtherPod { .. })
        ));
        for version in 2..=(SENT_REMEMBERED as u64 + 1) {
            sent(&sessions, &pod("a"), "s1", version, &[]);
        }
        assert_eq!(
            sessions.acknowledge(&pod("a"), &ack("s1", 1, "h", &[])),
            Err(AckRefused::UnknownVersion(1))
        );
        // A deleted pod's stream leaves nothing behind.
        sessions.forget(&pod("a"), "s1");
        assert_eq!(sessions.connected_count(), 0);
        assert!(sessions.lock().sidecars.is_empty());
    }
}
