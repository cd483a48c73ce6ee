//! The SETs accepted recently, so a redelivery is answered at once without touching the
//! cluster again, and a `jti` reused for a different event is recognised. Bounded: the oldest
//! ids are forgotten first. Forgetting is harmless, because a redelivered SET maps to the same
//! object names (see [`super::events`]), so creating them again changes nothing, and the sink
//! compares an existing object with the one it was asked to create.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::set::VerifiedSet;

/// How many SET ids are remembered by default.
pub const DEFAULT_CAPACITY: usize = 100_000;

/// What is known of a SET's (issuer, jti).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Not accepted recently.
    New,
    /// Accepted recently with the same content: a redelivery.
    Same,
    /// Accepted recently with other content: the `jti` was reused.
    Different,
}

/// A bounded map of (issuer, jti) to the content fingerprint of the SET accepted under it.
/// Both are SHA-256 digests, so memory stays at about 150 bytes per entry however long the
/// ids are.
pub struct AcceptedIds {
    capacity: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    members: HashMap<[u8; 32], [u8; 32]>,
    order: VecDeque<[u8; 32]>,
}

fn key(issuer: &str, jti: &str) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(issuer.as_bytes());
    hash.update([0]);
    hash.update(jti.as_bytes());
    hash.finalize().into()
}

/// What a SET says, independent of when it was signed: its subject and its events (with
/// their timestamps). `iat` and the signature are left out, so a transmitter that signs a
/// retry anew is still recognised as redelivering. Objects are hashed with sorted keys.
pub fn fingerprint(set: &VerifiedSet) -> [u8; 32] {
    let mut hash = Sha256::new();
    // The parsed subject's Debug form: deterministic, and blind to key order and to members
    // the parser ignores.
    hash_str(&mut hash, &format!("{:?}", set.subject));
    for (uri, event) in &set.events {
        hash.update(b"e");
        hash_str(&mut hash, uri);
        hash_value(&mut hash, event);
    }
    hash.finalize().into()
}

fn hash_str(hash: &mut Sha256, text: &str) {
    hash.update((text.len() as u64).to_be_bytes());
    hash.update(text.as_bytes());
}

fn hash_value(hash: &mut Sha256, value: &Value) {
    match value {
        Value::Null => hash.update(b"n"),
        Value::Bool(b) => hash.update(if *b { b"t" } else { b"f" }),
        Value::Number(n) => {
            hash.update(b"#");
            hash_str(hash, &n.to_string());
        }
        Value::String(s) => {
            hash.update(b"s");
            hash_str(hash, s);
        }
        Value::Array(items) => {
            hash.update(b"[");
            hash.update((items.len() as u64).to_be_bytes());
            items.iter().for_each(|item| hash_value(hash, item));
        }
        Value::Object(map) => {
            hash.update(b"{");
            hash.update((map.len() as u64).to_be_bytes());
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            for (name, item) in entries {
                hash_str(hash, name);
                hash_value(hash, item);
            }
        }
    }
}

impl AcceptedIds {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        match self.inner.lock() {
            Ok(inner) => inner,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Whether (issuer, jti) was accepted recently, and with this content or another.
    pub fn seen(&self, issuer: &str, jti: &str, fingerprint: &[u8; 32]) -> Seen {
        match self.lock().members.get(&key(issuer, jti)) {
            None => Seen::New,
            Some(known) if known == fingerprint => Seen::Same,
            Some(_) => Seen::Different,
        }
    }

    /// Remembers (issuer, jti) with its content; the first content recorded stays.
    pub fn insert(&self, issuer: &str, jti: &str, fingerprint: [u8; 32]) {
        let key = key(issuer, jti);
        let mut inner = self.lock();
        if inner.members.contains_key(&key) {
            return;
        }
        inner.members.insert(key, fingerprint);
        inner.order.push_back(key);
        while inner.order.len() > self.capacity {
            if let Some(oldest) = inner.order.pop_front() {
                inner.members.remove(&oldest);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 32] = [1; 32];
    const B: [u8; 32] = [2; 32];

    #[test]
    fn remembers_pairs_and_forgets_the_oldest_beyond_capacity() {
        let ids = AcceptedIds::new(2);
        ids.insert("iss", "a", A);
        ids.insert("iss", "b", A);
        ids.insert("iss", "a", B);
        assert_eq!(ids.seen("iss", "a", &A), Seen::Same);
        assert_eq!(ids.seen("iss", "a", &B), Seen::Different);
        assert_eq!(ids.seen("iss", "b", &A), Seen::Same);
        assert_eq!(ids.seen("other", "a", &A), Seen::New);
        ids.insert("iss", "c", A);
        assert_eq!(ids.seen("iss", "a", &A), Seen::New);
        assert_eq!(ids.seen("iss", "c", &A), Seen::Same);
    }

    #[test]
    fn the_fingerprint_ignores_iat_and_key_order_but_not_the_subject() {
        let set = |sub: &str, iat: i64, event: Value| VerifiedSet {
            issuer: "iss".into(),
            jti: "j".into(),
            iat,
            txn: None,
            subject: super::super::subject::SubjectId::IssSub {
                iss: "idp".into(),
                sub: sub.into(),
            },
            events: vec![("uri".into(), event)],
        };
        let one = fingerprint(&set("alice", 1, serde_json::json!({"a": 1, "b": 2})));
        let resigned = fingerprint(&set("alice", 9, serde_json::json!({"b": 2, "a": 1})));
        let other = fingerprint(&set("bob", 1, serde_json::json!({"a": 1, "b": 2})));
        assert_eq!(one, resigned);
        assert_ne!(one, other);
    }
}
