//! A cache of tokens that already validated, so a client polling with the same token does not
//! pay a signature verification (an RSA public-key operation) on every request.
//!
//! Guarantees: an entry is keyed by the SHA-256 of the whole token, so only the identical token
//! hits; it is never served after the token's `exp` (with the same leeway as validation) nor
//! more than [`MAX_ENTRY_AGE`] after it was verified, which bounds how long a key the issuer
//! withdrew keeps validating already-seen tokens. Failures are never cached. Revocations are
//! checked on every request, cache hit or not. The cache belongs to one policy version: a
//! policy change (issuers, audiences, algorithms) starts an empty cache.
//!
//! Every request of every connection looks here, so the cache must not be a point where the
//! sidecar's workers wait for each other: the SHA-256 is computed before any lock is taken, and
//! the entries are split over [`SHARDS`] independently locked maps chosen by the key's first
//! byte (uniformly distributed, being a hash), each holding at most its share of
//! [`MAX_ENTRIES`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::jwt::{Identity, LEEWAY_SECS};

/// Longest time a verified token is trusted without verifying its signature again.
pub const MAX_ENTRY_AGE: Duration = Duration::from_secs(60);
/// Most entries kept; when full, entries past their age are dropped, then everything.
pub const MAX_ENTRIES: usize = 10_000;

struct Entry {
    identity: Identity,
    verified_at: Instant,
}

/// Independently locked parts of the cache.
pub const SHARDS: usize = 32;
const SHARD_ENTRIES: usize = MAX_ENTRIES / SHARDS;

type Shard = Mutex<HashMap<[u8; 32], Entry>>;

/// Verified tokens of one policy version.
pub struct TokenCache {
    shards: Box<[Shard]>,
}

impl Default for TokenCache {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
        }
    }
}

fn key(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl TokenCache {
    /// The identity of `token` if it validated recently and has not expired at `now_secs`.
    pub fn get(&self, token: &str, now_secs: u64) -> Option<Identity> {
        let key = key(token);
        let entries = self.shard(&key).lock().ok()?;
        let entry = entries.get(&key)?;
        let fresh = entry.verified_at.elapsed() < MAX_ENTRY_AGE
            && entry.identity.expires_at.saturating_add(LEEWAY_SECS as i64) >= now_secs as i64;
        fresh.then(|| entry.identity.clone())
    }

    /// Remembers a token that just validated.
    pub fn insert(&self, token: &str, identity: &Identity) {
        let key = key(token);
        let Ok(mut entries) = self.shard(&key).lock() else {
            return;
        };
        if entries.len() >= SHARD_ENTRIES {
            entries.retain(|_, e| e.verified_at.elapsed() < MAX_ENTRY_AGE);
            if entries.len() >= SHARD_ENTRIES {
                entries.clear();
            }
        }
        entries.insert(
            key,
            Entry {
                identity: identity.clone(),
                verified_at: Instant::now(),
            },
        );
    }

    fn shard(&self, key: &[u8; 32]) -> &Shard {
        &self.shards[usize::from(key[0]) % SHARDS]
    }

    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().map(|e| e.len()).unwrap_or(0))
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::model::Owner;

    fn identity(exp: i64) -> Identity {
        Identity {
            owner: Owner {
                issuer: "i".into(),
                subject: "s".into(),
                tenant: "t".into(),
                client: "c".into(),
            },
            scopes: BTreeSet::new(),
            issued_at: Some(0),
            expires_at: exp,
            binding: None,
        }
    }

    #[test]
    fn hits_only_the_identical_unexpired_token() {
        let cache = TokenCache::default();
        cache.insert("token-a", &identity(1_000));
        assert_eq!(cache.get("token-a", 900), Some(identity(1_000)));
        assert_eq!(cache.get("token-b", 900), None);
        assert_eq!(
            cache.get("token-a", 1_000 + LEEWAY_SECS),
            Some(identity(1_000))
        );
        assert_eq!(cache.get("token-a", 1_001 + LEEWAY_SECS), None, "expired");
    }

    #[test]
    fn stays_bounded() {
        let cache = TokenCache::default();
        for i in 0..(MAX_ENTRIES + 10) {
            cache.insert(&format!("t{i}"), &identity(10));
        }
        assert!(cache.len() <= MAX_ENTRIES);
    }

    #[test]
    fn entries_spread_over_the_shards() {
        let cache = TokenCache::default();
        for i in 0..(SHARDS * 20) {
            cache.insert(&format!("t{i}"), &identity(10));
        }
        let used = cache
            .shards
            .iter()
            .filter(|s| !s.lock().unwrap().is_empty())
            .count();
        assert_eq!(used, SHARDS, "every shard holds some tokens");
        assert_eq!(cache.len(), SHARDS * 20);
        assert_eq!(cache.get("t7", 1), Some(identity(10)));
    }
}
