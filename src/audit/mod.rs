//! The audit trail: one JSON object per line for every decision about a task, written to stdout
//! or a file by a dedicated writer so request handling never waits on the disk.
//!
//! What never appears: tokens, raw task IDs (only a keyed hash), tool arguments and results
//! (only their size and SHA-256), prompts, model output; with `audit.identityDigests`, subjects
//! and tenants appear only as keyed hashes too.
//!
//! Every event of a task carries the task's correlation ID (`correlation_id`: the ID of the
//! request that created it, kept in the ledger with the task), so one filter reconstructs the
//! task from creation to purge; `requestId` names the request (or background run) that caused
//! each event.

use std::io::Write;

use hmac::{Hmac, KeyInit, Mac};
use serde::Serialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};

use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;

use crate::model::{Owner, TaskId};

mod writer;

/// Decision recorded with an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Allow,
    Deny,
    /// Something happened that is neither (a lifecycle change, an anomaly).
    Record,
}

/// The policy an event was decided under: its `namespace/name` and the hash of its effective
/// version.
#[derive(Clone, Copy, Debug)]
pub struct PolicyStamp<'a> {
    pub name: &'a str,
    pub hash: &'a str,
}

/// One audit event.
#[derive(Clone, Debug, Serialize)]
pub struct AuditEvent {
    pub event: &'static str,
    pub time: String,
    /// The task's correlation ID for events about a task (the ID of the request that created
    /// it), else the request's own ID.
    pub correlation_id: String,
    /// The request, or background run (a sweep, a revocation), that caused this event.
    #[serde(rename = "requestId")]
    pub request_id: String,
    /// `namespace/name` of the policy in force.
    pub policy: String,
    /// Hash of the effective policy version the decision was made under (what `lifeguard
    /// policy check --output json` reports as `hash` and the policy's status as `policyHash`).
    pub policy_hash: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// Keyed hash of the sidecar task ID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    pub decision: Decision,
    pub reason: &'static str,
    /// Event-specific facts (counts, sizes, hashes, the other identity of an admin action).
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub detail: Map<String, Value>,
}

impl AuditEvent {
    /// An event with the time set to now and no identity yet, caused by request (or background
    /// run) `request_id`, which is also its correlation ID until [`Self::for_task`] says
    /// otherwise.
    pub fn new(
        event: &'static str,
        request_id: &str,
        policy: PolicyStamp<'_>,
        decision: Decision,
        reason: &'static str,
    ) -> Self {
        Self {
            event,
            time: format!("{:.3}", jiff::Timestamp::now()),
            correlation_id: request_id.to_owned(),
            request_id: request_id.to_owned(),
            policy: policy.name.to_owned(),
            policy_hash: policy.hash.to_owned(),
            issuer: None,
            subject: None,
            tenant: None,
            client: None,
            tool: None,
            task: None,
            decision,
            reason,
            detail: Map::new(),
        }
    }

    pub fn owner(mut self, owner: &Owner) -> Self {
        self.issuer = Some(owner.issuer.clone());
        self.subject = Some(owner.subject.clone());
        self.tenant = Some(owner.tenant.clone());
        self.client = Some(owner.client.clone());
        self
    }

    pub fn tool(mut self, tool: &str) -> Self {
        self.tool = Some(tool.to_owned());
        self
    }

    pub fn task(mut self, hashed: String) -> Self {
        self.task = Some(hashed);
        self
    }

    /// The event is about task `id` whose correlation ID is `correlation_id` (the ledger's):
    /// its keyed hash and that ID (tasks recorded before correlation IDs were kept, with an
    /// empty one, correlate by their hash alone).
    pub fn for_task(mut self, hasher: &TaskHasher, id: &TaskId, correlation_id: &str) -> Self {
        self.task = Some(hasher.hash(id));
        if !correlation_id.is_empty() {
            self.correlation_id = correlation_id.to_owned();
        }
        self
    }

    pub fn detail(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.detail.insert(key.to_owned(), value.into());
        self
    }
}

/// Keyed hash of task IDs: stable for one ledger (the key lives in it), useless to anyone
/// without the key, so audit lines can be correlated without exposing usable IDs.
#[derive(Clone)]
pub struct TaskHasher {
    key: [u8; 32],
}

impl TaskHasher {
    pub fn new(key: [u8; 32]) -> Self {
        Self { key }
    }

    /// `h:` + 32 hex characters (128 bits of HMAC-SHA-256).
    pub fn hash(&self, id: &TaskId) -> String {
        self.hash_text(id.as_str())
    }

    /// The digest of the object a task acts on (`tasks.objects`), as audit lines show it:
    /// keyed like task IDs, separated by type so equal values of different types differ.
    pub fn object_digest(&self, resource_type: &str, object: &str) -> String {
        self.hash_text(&format!("object\u{1f}{resource_type}\u{1f}{object}"))
    }

    /// [`Self::hash`] of any text.
    pub fn hash_text(&self, text: &str) -> String {
        // HMAC accepts keys of any length, so this cannot fail.
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.key)
            .expect("HMAC takes any key length");
        mac.update(text.as_bytes());
        let digest = mac.finalize().into_bytes();
        let hex = hex::encode(&digest[..16]);
        format!("h:{hex}")
    }
}

/// Keyed hashes of subjects and tenants for trails that must not name people
/// (`audit.identityDigests`): the same value always gives the same digest under one ledger's
/// key, so events still correlate by principal, and whoever holds the key can check whether a
/// digest is a given user's (`h:` + 32 hex characters, as task hashes).
#[derive(Clone)]
pub struct IdentityDigester {
    hasher: TaskHasher,
}

impl IdentityDigester {
    pub fn new(key: [u8; 32]) -> Self {
        Self {
            hasher: TaskHasher::new(key),
        }
    }

    /// The digest of one identity value; an empty value (no tenant) stays empty.
    pub fn digest(&self, value: &str) -> String {
        if value.is_empty() {
            return String::new();
        }
        self.hasher.hash_text(value)
    }

    /// Replaces every subject and tenant of `event` by its digest: the caller's, and those of
    /// the other identities an event may name in its detail (`taskOwner`, `endedBy`, a
    /// revocation's `subject` and `tenant`).
    pub fn apply(&self, event: &mut AuditEvent) {
        for field in [&mut event.subject, &mut event.tenant]
            .into_iter()
            .flatten()
        {
            *field = self.digest(field);
        }
        for key in ["subject", "tenant"] {
            self.digest_in(event.detail.get_mut(key));
        }
        for key in ["taskOwner", "endedBy"] {
            if let Some(Value::Object(owner)) = event.detail.get_mut(key) {
                self.digest_in(owner.get_mut("subject"));
                self.digest_in(owner.get_mut("tenant"));
            }
        }
    }

    fn digest_in(&self, value: Option<&mut Value>) {
        if let Some(Value::String(text)) = value {
            *text = self.digest(text);
        }
    }
}

/// Size and SHA-256 of a JSON value, for audit lines that must not carry the value itself.
pub fn summarize(value: &Value) -> Value {
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    let digest = Sha256::digest(&bytes);
    let hex = hex::encode(digest);
    serde_json::json!({"bytes": bytes.len(), "sha256": hex})
}

/// Events queued for the writer at most; beyond it new events are dropped and counted (memory
/// stays bounded when the sink is slower than the traffic).
pub const QUEUE_CAPACITY: usize = 65_536;

/// How long the writer waits after a write before it takes the next batch: the most an event
/// waits for its line beyond the write itself. At 65,536 queued events per linger the queue
/// would fill only above ~30 million events a second.
pub const WRITE_LINGER: std::time::Duration = std::time::Duration::from_millis(2);

/// Handle for writing audit events; cheap to clone.
#[derive(Clone)]
pub struct AuditLog {
    tx: mpsc::Sender<Message>,
    health: Arc<AuditHealth>,
    /// Set while the policy in force asks for identity digests.
    digests: Arc<RwLock<Option<IdentityDigester>>>,
}

/// How the trail is doing, shared by every handle and the writer.
#[derive(Default)]
pub struct AuditHealth {
    /// The last write failed (cleared by the next successful one; the writer retries on its
    /// own while it fails).
    failing: AtomicBool,
    /// An event was dropped because the queue was full, since the last successful write.
    dropping: AtomicBool,
    /// Writes that failed (each a batch of lines), and events dropped at the full queue.
    pub write_errors: Counter,
    pub dropped: Counter,
}

impl AuditHealth {
    /// Whether every event is being written: no failed write and no drop since the last
    /// successful write.
    pub fn is_healthy(&self) -> bool {
        !self.failing.load(Ordering::Relaxed) && !self.dropping.load(Ordering::Relaxed)
    }
}

/// Where audit lines go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuditTarget {
    Stdout,
    /// A file, opened in append mode and created if missing.
    File(std::path::PathBuf),
}

enum Message {
    Event(Box<AuditEvent>),
    Retarget(AuditTarget),
}

fn open_target(target: &AuditTarget) -> std::io::Result<Box<dyn Write + Send>> {
    Ok(match target {
        AuditTarget::Stdout => Box::new(std::io::stdout()),
        AuditTarget::File(path) => {
            let mut options = std::fs::OpenOptions::new();
            options.create(true).append(true);
            // The trail names principals and tools: owner-only when created here.
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            Box::new(options.open(path)?)
        }
    })
}

impl AuditLog {
    /// Starts the writer on `target`. Fails when the file cannot be opened.
    pub fn open(target: AuditTarget) -> std::io::Result<(Self, tokio::task::JoinHandle<()>)> {
        let out = open_target(&target)?;
        let (tx, mut rx) = mpsc::channel::<Message>(QUEUE_CAPACITY);
        let health = Arc::new(AuditHealth::default());
        let writer = writer::Writer::new(out, target, health.clone());
        let writer = tokio::task::spawn_blocking(move || writer.run(&mut rx));
        let log = Self {
            tx,
            health,
            digests: Arc::default(),
        };
        Ok((log, writer))
    }

    /// Queues an event. Never blocks; events are written in order. When the queue is full the
    /// event is dropped and counted, and the trail reads unhealthy until a write succeeds.
    pub fn log(&self, mut event: AuditEvent) {
        // The request's span (when traces are exported) says what the audit trail says.
        crate::telemetry::spans::audit(
            match event.decision {
                Decision::Allow => "allow",
                Decision::Deny => "deny",
                Decision::Record => "record",
            },
            event.reason,
            &event.policy_hash,
            event.task.as_deref(),
        );
        if let Some(digester) = self
            .digests
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            digester.apply(&mut event);
        }
        match self.tx.try_send(Message::Event(Box::new(event))) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.health.dropped.inc();
                self.health.dropping.store(true, Ordering::Relaxed);
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.health.dropped.inc();
                self.health.failing.store(true, Ordering::Relaxed);
                tracing::error!("audit writer has stopped; event lost");
            }
        }
    }

    /// Switches where later events go (no-op when unchanged). Events queued before stay with the
    /// old target.
    pub fn retarget(&self, target: AuditTarget) {
        let _ = self.tx.try_send(Message::Retarget(target));
    }

    /// Writes subjects and tenants of later events as digests (`Some`) or in the clear.
    pub fn set_identity_digests(&self, digester: Option<IdentityDigester>) {
        *self.digests.write().unwrap_or_else(|e| e.into_inner()) = digester;
    }

    /// How the trail is doing (for readiness, fail-closed decisions and metrics).
    pub fn health(&self) -> &Arc<AuditHealth> {
        &self.health
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST_POLICY: PolicyStamp<'static> = PolicyStamp {
        name: "ns/p",
        hash: "h1",
    };

    #[cfg(unix)]
    #[test]
    fn audit_files_are_created_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        drop(open_target(&AuditTarget::File(path.clone())).unwrap());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn task_hashes_are_keyed_and_stable() {
        let id = TaskId::from_string("lgt_abc");
        let a = TaskHasher::new([1; 32]);
        let b = TaskHasher::new([2; 32]);
        assert_eq!(a.hash(&id), a.hash(&id));
        assert_ne!(a.hash(&id), b.hash(&id));
        assert!(a.hash(&id).starts_with("h:"));
        assert_eq!(a.hash(&id).len(), 34);
        assert!(!a.hash(&id).contains("abc"));
    }

    #[test]
    fn summaries_carry_size_and_hash_only() {
        let s = summarize(&serde_json::json!({"secret": "value"}));
        assert_eq!(s["bytes"], 18);
        assert_eq!(s["sha256"].as_str().unwrap().len(), 64);
        assert!(!s.to_string().contains("value"));
    }

    #[tokio::test]
    async fn events_are_written_as_json_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let (log, writer) = AuditLog::open(AuditTarget::File(path.clone())).unwrap();
        log.log(
            AuditEvent::new("task.created", "c1", TEST_POLICY, Decision::Allow, "ok").tool("t"),
        );
        log.log(AuditEvent::new(
            "task.denied",
            "c2",
            TEST_POLICY,
            Decision::Deny,
            "foreign_subject",
        ));
        let second = dir.path().join("second.jsonl");
        log.retarget(AuditTarget::File(second.clone()));
        log.log(AuditEvent::new(
            "task.cancelled",
            "c3",
            TEST_POLICY,
            Decision::Allow,
            "owner",
        ));
        drop(log);
        writer.await.unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["event"], "task.created");
        assert_eq!(lines[0]["tool"], "t");
        assert_eq!(lines[0]["policy"], "ns/p");
        assert_eq!(lines[0]["policy_hash"], "h1");
        assert_eq!(lines[1]["decision"], "deny");
        assert_eq!(lines[1]["reason"], "foreign_subject");
        let moved = std::fs::read_to_string(&second).unwrap();
        assert_eq!(moved.lines().count(), 1);
        assert!(moved.contains("task.cancelled"));
    }
}
