//! Server nonces for DPoP proofs (RFC 9449 §9), when a policy requires them
//! (`spec.identity.dpop.requireNonce`).
//!
//! Stateless and shared by every replica of a server: a nonce is the number of the minute it
//! was issued in and an HMAC-SHA-256 tag over that number, keyed by a secret the replicas share
//! through the ledger. A nonce is current during the minute it names and the next one, so a
//! client that just got one has at least a minute to use it and a proof can never be made
//! ahead of time for a later minute. Nothing is stored per nonce; replay of a whole proof is
//! refused by the `jti` cache, not by the nonce.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// How long one nonce period lasts, in seconds.
pub const NONCE_PERIOD_SECS: i64 = 60;
/// Bytes of the HMAC tag kept in a nonce: 128 bits cannot be guessed.
const TAG_BYTES: usize = 16;
const CONTEXT: &[u8] = b"lifeguard dpop nonce v1";

/// The key nonces are made and checked with.
#[derive(Clone)]
pub struct NonceKey([u8; 32]);

impl NonceKey {
    pub fn new(key: [u8; 32]) -> Self {
        Self(key)
    }

    /// The nonce to hand out at `now_secs`.
    pub fn issue(&self, now_secs: i64) -> String {
        let period = now_secs.div_euclid(NONCE_PERIOD_SECS);
        let mut bytes = Vec::with_capacity(8 + TAG_BYTES);
        bytes.extend_from_slice(&period.to_be_bytes());
        bytes.extend_from_slice(&self.tag(period)[..TAG_BYTES]);
        URL_SAFE_NO_PAD.encode(bytes)
    }

    /// Whether `nonce` was issued with this key in the current period or the one before.
    pub fn is_current(&self, nonce: &str, now_secs: i64) -> bool {
        let Ok(bytes) = URL_SAFE_NO_PAD.decode(nonce) else {
            return false;
        };
        if bytes.len() != 8 + TAG_BYTES {
            return false;
        }
        let (period, tag) = bytes.split_at(8);
        let period = i64::from_be_bytes(period.try_into().unwrap_or([0; 8]));
        let now = now_secs.div_euclid(NONCE_PERIOD_SECS);
        if period != now && period != now - 1 {
            return false;
        }
        self.mac(period).verify_truncated_left(tag).is_ok()
    }

    fn mac(&self, period: i64) -> Hmac<Sha256> {
        let mut mac =
            <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(CONTEXT);
        mac.update(&period.to_be_bytes());
        mac
    }

    fn tag(&self, period: i64) -> [u8; 32] {
        self.mac(period).finalize().into_bytes().into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: i64 = 1_800_000_000 - 1_800_000_000 % NONCE_PERIOD_SECS;

    #[test]
    fn a_nonce_is_current_for_its_period_and_the_next() {
        let key = NonceKey::new([7; 32]);
        let nonce = key.issue(T + 5);
        assert_eq!(nonce, key.issue(T), "one nonce per period");
        assert!(key.is_current(&nonce, T));
        assert!(key.is_current(&nonce, T + NONCE_PERIOD_SECS + 59));
        assert!(!key.is_current(&nonce, T + 2 * NONCE_PERIOD_SECS));
        assert!(!key.is_current(&nonce, T - 1), "not before its period");
        assert_ne!(nonce, key.issue(T + NONCE_PERIOD_SECS));
    }

    #[test]
    fn only_this_key_makes_current_nonces() {
        let key = NonceKey::new([7; 32]);
        let other = NonceKey::new([8; 32]);
        assert!(!key.is_current(&other.issue(T), T));
        // A nonce for a later period with a forged tag, and malformed ones.
        let mut forged = URL_SAFE_NO_PAD.decode(key.issue(T)).unwrap();
        forged[..8].copy_from_slice(&(T / NONCE_PERIOD_SECS + 1).to_be_bytes());
        assert!(!key.is_current(&URL_SAFE_NO_PAD.encode(forged), T + NONCE_PERIOD_SECS));
        for bad in ["", "!!", "AAAA", &key.issue(T)[..10]] {
            assert!(!key.is_current(bad, T), "{bad}");
        }
    }
}
