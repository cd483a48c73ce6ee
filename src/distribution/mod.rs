//! How policy travels from the operator to sidecars: the wire messages of the distribution
//! stream. Pure serde types and constants, shared by `operator` (which serves the stream) and
//! `sidecar` (which dials it); neither imports the other.
//!
//! # The protocol
//!
//! The sidecar opens one long-lived HTTPS request (HTTP/1.1: the operator's listener offers
//! nothing else, see `runtime::tls`) to [`STREAM_PATH`] with
//! `Authorization: Bearer <projected ServiceAccount token>` and the query
//! `?podNamespace=NS&podName=NAME` (what the sidecar believes it is; the operator
//! trusts only the TokenReview of the bearer and refuses a mismatch with 403). The answer is
//! `application/x-ndjson`: one [`StreamMessage`] per line.
//!
//! - The first line is always a full [`Snapshot`]; every change the operator sees afterwards is
//!   pushed as a new full snapshot with a higher `version` (snapshots are small and complete, so
//!   a sidecar never has to merge deltas or ask for a resync).
//! - [`StreamMessage::Heartbeat`] lines arrive at least every [`HEARTBEAT_INTERVAL`]; a sidecar
//!   that hears nothing for [`SILENCE_TIMEOUT`] drops the connection and dials again.
//! - After a sidecar has put a snapshot in force *and* applied every revocation it carries, it
//!   POSTs an [`Ack`] to [`ACK_PATH`] with the same bearer. Acks are idempotent. The operator
//!   records an ack only from the pod (uid) whose stream is open, for a version that session
//!   was sent, with the policy hash and only the revocations that snapshot carried (409 for a
//!   closed, older or foreign session, 422 for anything never sent); counts are capped.
//! - A stream ends when its pod is deleted or replaced by a pod of the same name.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::policy::EffectivePolicy;

/// The policy stream (GET).
pub const STREAM_PATH: &str = "/distribution/v1/stream";
/// Where sidecars acknowledge versions (POST, JSON [`Ack`]).
pub const ACK_PATH: &str = "/distribution/v1/ack";
/// Audience the sidecar's projected ServiceAccount token must carry.
pub const TOKEN_AUDIENCE: &str = "lifeguard";
/// Media type of the stream.
pub const STREAM_CONTENT_TYPE: &str = "application/x-ndjson";
/// The operator writes a heartbeat at least this often.
pub const HEARTBEAT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);
/// A sidecar that hears nothing for this long reconnects.
pub const SILENCE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(35);
/// Largest line a sidecar accepts on the stream (a snapshot with many revocations is well
/// below this; a bound keeps a confused peer from exhausting memory).
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Query parameters of the stream request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamQuery {
    pub pod_namespace: String,
    pub pod_name: String,
}

/// One line of the stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum StreamMessage {
    /// The complete configuration the sidecar must enforce from now on.
    Snapshot(Box<Snapshot>),
    /// Nothing changed; the connection is alive.
    Heartbeat,
}

/// Everything one sidecar enforces, complete and versioned.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    /// Identifies this connection; echoed in every [`Ack`] so the operator can tell the pod's
    /// latest connection from an older one still draining.
    pub session: String,
    /// Increases with every snapshot an operator process sends (seeded from the wall clock at
    /// startup, so a restarted operator keeps counting upward).
    pub version: u64,
    /// The pod the operator authenticated (from the TokenReview, not from the sidecar's claim).
    pub pod: PodIdentity,
    /// The compiled policy: the McpServerPolicy that selects the pod (the oldest when several
    /// do), its verified active CapabilityExceptions and the PrincipalRevocations in force for
    /// its issuers. `None` when no policy selects the pod: the sidecar then enables nothing.
    pub policy: Option<EffectivePolicy>,
    /// The approver JWKS (with its revocation lists) that CapabilityException signatures must
    /// verify against; the sidecar verifies again at every use. `None` when the operator has no
    /// approver keys configured.
    pub approver_keys: Option<serde_json::Value>,
    /// When the operator built this snapshot.
    pub issued_at: Timestamp,
    /// For revocations of `policy` whose propagation is traced: the W3C `traceparent` of the
    /// revocation's span, keyed by revocation name, so the sidecar's application joins that
    /// trace. A hint for linking spans and nothing more: it is not part of the policy (nor of
    /// its hash), enforcement never reads it, and older operators and sidecars skip it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub revocation_traces: BTreeMap<String, String>,
}

impl Snapshot {
    /// The hash of the policy this snapshot carries (`None`: no policy).
    pub fn policy_hash(&self) -> Option<String> {
        self.policy.as_ref().map(EffectivePolicy::hash)
    }
}

/// The pod on the other end of a stream, as the operator's TokenReview established it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodIdentity {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub service_account: String,
}

/// A sidecar's acknowledgement: snapshot `version` is in force and every revocation it carries
/// has been applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ack {
    pub session: String,
    pub version: u64,
    /// Hash of the policy now in force (`None`: the snapshot carried no policy).
    pub policy_hash: Option<String>,
    /// One entry per revocation of the snapshot, with what applying it did on this sidecar
    /// (counts are from the first time this sidecar process applied that revocation version).
    #[serde(default)]
    pub revocations: Vec<RevocationApplied>,
}

/// What one sidecar did for one revocation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RevocationApplied {
    /// `metadata.name` of the PrincipalRevocation.
    pub name: String,
    pub tasks_cancelled: u64,
    pub streams_closed: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_tagged_ndjson_lines() {
        let heartbeat = serde_json::to_string(&StreamMessage::Heartbeat).unwrap();
        assert_eq!(heartbeat, r#"{"type":"heartbeat"}"#);
        let snapshot = StreamMessage::Snapshot(Box::new(Snapshot {
            session: "s1".into(),
            version: 7,
            pod: PodIdentity {
                namespace: "team-a".into(),
                name: "reports-0".into(),
                uid: "u".into(),
                service_account: "reports".into(),
            },
            policy: None,
            approver_keys: None,
            issued_at: Timestamp::UNIX_EPOCH,
            revocation_traces: BTreeMap::new(),
        }));
        let line = serde_json::to_string(&snapshot).unwrap();
        assert!(!line.contains('\n'));
        assert!(line.starts_with(r#"{"type":"snapshot","session":"s1","version":7"#));
        let back: StreamMessage = serde_json::from_str(&line).unwrap();
        assert_eq!(back, snapshot);
    }

    #[test]
    fn revocation_traces_travel_only_when_there_are_some() {
        let mut snapshot = Snapshot {
            session: "s1".into(),
            version: 7,
            pod: PodIdentity {
                namespace: "team-a".into(),
                name: "reports-0".into(),
                uid: "u".into(),
                service_account: "reports".into(),
            },
            policy: None,
            approver_keys: None,
            issued_at: Timestamp::UNIX_EPOCH,
            revocation_traces: BTreeMap::new(),
        };
        // An operator without traces writes no field; a sidecar reads a snapshot without one.
        let plain = serde_json::to_string(&snapshot).unwrap();
        assert!(!plain.contains("revocationTraces"), "{plain}");
        assert_eq!(serde_json::from_str::<Snapshot>(&plain).unwrap(), snapshot);
        snapshot.revocation_traces = BTreeMap::from([(
            "alice-session".to_owned(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
        )]);
        let traced = serde_json::to_string(&snapshot).unwrap();
        assert!(
            traced.contains(r#""revocationTraces":{"alice-session":"00-4bf9"#),
            "{traced}"
        );
        assert_eq!(serde_json::from_str::<Snapshot>(&traced).unwrap(), snapshot);
    }

    #[test]
    fn acks_without_revocations_parse() {
        let ack: Ack =
            serde_json::from_str(r#"{"session":"s","version":3,"policyHash":null}"#).unwrap();
        assert!(ack.revocations.is_empty());
        assert_eq!(ack.version, 3);
    }
}
