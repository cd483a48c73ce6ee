//! The DPoP replay cache: every proof's `jti` is accepted once, for as long as its `iat` keeps
//! it in the policy's window (RFC 9449 §11.1).
//!
//! - A sidecar with its own (SQLite) ledger remembers proofs in memory ([`LocalProofs`]):
//!   bounded, split over independently locked shards, and fail-closed when full of proofs
//!   still in their window (a proof it had to forget could be replayed; refusing new ones
//!   until old ones expire cannot be exploited, only noticed). A restart forgets them: a
//!   proof seen just before a restart could be used once more within its window (policies
//!   that need better set `requireNonce`, which limits a proof's life to two minutes).
//! - Replicas sharing a PostgreSQL ledger remember proofs there
//!   ([`crate::ledger::TaskLedger::remember_proof`]): a proof used at one replica is a replay
//!   at every other. When the database cannot be reached, proofs are refused as unavailable
//!   (retry shortly) rather than checked in memory alone, which would let a captured proof
//!   be replayed once per replica.
//!
//! Requests forwarded by another replica over the internal hop were checked there and are not
//! checked again (their proof's `jti` is already recorded).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::ledger::TaskLedger;

/// Most proofs one sidecar remembers in memory: at the default 5-minute window, a sustained
/// 3 300 DPoP requests a second. Each entry is 24 bytes of key and expiry plus the map's
/// overhead: about 40 MB when full.
pub const MAX_LOCAL_PROOFS: usize = 1_000_000;
const SHARDS: usize = 16;
const SHARD_PROOFS: usize = MAX_LOCAL_PROOFS / SHARDS;

/// Whether a proof may be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProofUse {
    /// First use: recorded.
    First,
    /// Used before, within its window.
    Replayed,
    /// Could not be recorded (the memory is full of live proofs, or the shared cache is
    /// unreachable): refuse, the client may retry shortly.
    Unavailable,
}

/// Proofs remembered in this sidecar's memory.
pub struct LocalProofs {
    /// 128 bits of the digest (no collision in any realistic number of proofs) → the Unix
    /// second after which the proof is stale anyway.
    shards: Box<[Mutex<HashMap<u128, i64>>]>,
}

impl Default for LocalProofs {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }
}

impl LocalProofs {
    /// Records the proof `digest`, stale after `until_secs`, at `now_secs`.
    pub fn remember(&self, digest: &[u8; 32], until_secs: i64, now_secs: i64) -> ProofUse {
        let mut head = [0u8; 16];
        head.copy_from_slice(&digest[..16]);
        let key = u128::from_le_bytes(head);
        let shard = &self.shards[usize::from(digest[16]) % SHARDS];
        let Ok(mut proofs) = shard.lock() else {
            return ProofUse::Unavailable;
        };
        if let Some(until) = proofs.get(&key)
            && *until >= now_secs
        {
            return ProofUse::Replayed;
        }
        if proofs.len() >= SHARD_PROOFS {
            proofs.retain(|_, until| *until >= now_secs);
            if proofs.len() >= SHARD_PROOFS {
                return ProofUse::Unavailable;
            }
        }
        proofs.insert(key, until_secs);
        ProofUse::First
    }
}

/// Where this sidecar remembers proofs.
pub enum ReplayCache {
    Local(LocalProofs),
    Shared(Arc<dyn TaskLedger>),
}

impl ReplayCache {
    /// In the ledger when replicas share it, else in memory.
    pub fn for_ledger(ledger: &Arc<dyn TaskLedger>) -> Self {
        if ledger.is_shared() {
            Self::Shared(ledger.clone())
        } else {
            Self::Local(LocalProofs::default())
        }
    }

    /// Records a proof's use (see [`LocalProofs::remember`]).
    pub async fn remember(&self, digest: &[u8; 32], until_secs: i64, now_secs: i64) -> ProofUse {
        match self {
            Self::Local(local) => local.remember(digest, until_secs, now_secs),
            Self::Shared(ledger) => {
                let until_ms = until_secs.saturating_mul(1000).saturating_add(999);
                match ledger
                    .remember_proof(digest, until_ms, now_secs.saturating_mul(1000))
                    .await
                {
                    Ok(true) => ProofUse::First,
                    Ok(false) => ProofUse::Replayed,
                    Err(error) => {
                        tracing::warn!(%error, "the shared DPoP replay cache is unreachable; DPoP requests are refused until it is back");
                        ProofUse::Unavailable
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(n: u32) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        Sha256::digest(n.to_be_bytes()).into()
    }

    #[test]
    fn a_proof_is_accepted_once_within_its_window() {
        let proofs = LocalProofs::default();
        assert_eq!(proofs.remember(&digest(1), 100, 50), ProofUse::First);
        assert_eq!(proofs.remember(&digest(1), 100, 60), ProofUse::Replayed);
        assert_eq!(proofs.remember(&digest(1), 100, 100), ProofUse::Replayed);
        assert_eq!(proofs.remember(&digest(2), 100, 60), ProofUse::First);
        // Past its window the proof is refused as stale before it gets here; its entry may go.
        assert_eq!(proofs.remember(&digest(1), 200, 101), ProofUse::First);
    }

    #[test]
    fn a_full_cache_refuses_rather_than_forgets_and_drops_stale_proofs_first() {
        let proofs = LocalProofs::default();
        // Live proofs (stale after second 10) until one shard is full.
        let mut n = 0u32;
        let refused = loop {
            if proofs.remember(&digest(n), 10, 0) == ProofUse::Unavailable {
                break n;
            }
            n += 1;
        };
        assert!(refused as usize >= SHARD_PROOFS);
        // Everything recorded is still remembered: nothing was forgotten to make room.
        for m in (0..refused).step_by(997) {
            assert_eq!(
                proofs.remember(&digest(m), 10, 5),
                ProofUse::Replayed,
                "{m}"
            );
        }
        // Once they are stale, the full shard makes room.
        assert_eq!(proofs.remember(&digest(refused), 100, 20), ProofUse::First);
        assert_eq!(
            proofs.remember(&digest(refused), 100, 21),
            ProofUse::Replayed
        );
    }
}
