//! The SETs accepted recently, so a redelivery is answered at once without touching the
//! cluster again. Bounded: the oldest ids are forgotten first. Forgetting is harmless, because
//! a redelivered SET maps to the same object names (see [`super::events`]), so creating them
//! again changes nothing; this set only saves the API calls.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

/// How many SET ids are remembered by default.
pub const DEFAULT_CAPACITY: usize = 100_000;

/// A bounded set of (issuer, jti) pairs. Pairs are stored as SHA-256 digests, so memory stays
/// at about 100 bytes per entry however long the ids are.
pub struct AcceptedIds {
    capacity: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    members: HashSet<[u8; 32]>,
    order: VecDeque<[u8; 32]>,
}

fn key(issuer: &str, jti: &str) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(issuer.as_bytes());
    hash.update([0]);
    hash.update(jti.as_bytes());
    hash.finalize().into()
}

impl AcceptedIds {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            inner: Mutex::new(Inner::default()),
        }
    }

    pub fn contains(&self, issuer: &str, jti: &str) -> bool {
        let key = key(issuer, jti);
        match self.inner.lock() {
            Ok(inner) => inner.members.contains(&key),
            Err(poisoned) => poisoned.into_inner().members.contains(&key),
        }
    }

    pub fn insert(&self, issuer: &str, jti: &str) {
        let key = key(issuer, jti);
        let mut inner = match self.inner.lock() {
            Ok(inner) => inner,
            Err(poisoned) => poisoned.into_inner(),
        };
        if !inner.members.insert(key) {
            return;
        }
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

    #[test]
    fn remembers_pairs_and_forgets_the_oldest_beyond_capacity() {
        let ids = AcceptedIds::new(2);
        ids.insert("iss", "a");
        ids.insert("iss", "b");
        ids.insert("iss", "a");
        assert!(ids.contains("iss", "a") && ids.contains("iss", "b"));
        assert!(!ids.contains("other", "a"));
        ids.insert("iss", "c");
        assert!(!ids.contains("iss", "a"));
        assert!(ids.contains("iss", "b") && ids.contains("iss", "c"));
    }
}
