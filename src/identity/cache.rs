//! A cache of tokens that already validated, so a client polling with the same token does not
//! pay a signature verification (an RSA public-key operation) on every request.
//!
//! Guarantees: an entry is keyed by the SHA-256 of the whole token, so only the identical token
//! hits; it is never served after the token's `exp` (with the same leeway as validation) nor
//! more than [`MAX_ENTRY_AGE`] after it was verified, which bounds how long a key the issuer
//! withdrew keeps validating already-seen tokens. Failures are never cached. Revocations are
//! checked on every request, cache hit or not. The cache belongs to one policy version: a
//! policy change (issuers, audiences, algorithms) starts an empty cache.

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

/// Verified tokens of one policy version.
#[derive(Default)]
pub struct TokenCache {
    entries: Mutex<HashMap<[u8; 32], Entry>>,
}

fn key(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl TokenCache {
    /// The identity of `token` if it validated recently and has not expired at `now_secs`.
    pub fn get(&self, token: &str, now_secs: u64) -> Option<Identity> {
        let entries = self.entries.lock().ok()?;
        let entry = entries.get(&key(token))?;
        let fresh = entry.verified_at.elapsed() < MAX_ENTRY_AGE
            && entry.identity.expires_at.saturating_add(LEEWAY_SECS as i64) >= now_secs as i64;
        fresh.then(|| entry.identity.clone())
    }

    /// Remembers a token that just validated.
    pub fn insert(&self, token: &str, identity: &Identity) {
        let Ok(mut entries) = self.entries.lock() else {
            return;
        };
        if entries.len() >= MAX_ENTRIES {
            entries.retain(|_, e| e.verified_at.elapsed() < MAX_ENTRY_AGE);
            if entries.len() >= MAX_ENTRIES {
                entries.clear();
            }
        }
        entries.insert(
            key(token),
            Entry {
                identity: identity.clone(),
                verified_at: Instant::now(),
            },
        );
    }

    pub fn len(&self) -> usize {
        self.entries.lock().map(|e| e.len()).unwrap_or(0)
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
}
