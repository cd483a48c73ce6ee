//! Token buckets shared by the replicas of a server through the PostgreSQL ledger
//! ([`crate::ledger::TaskLedger::take_tokens`]), so a limit holds for the server as a whole.
//!
//! Charging the database for every request would put a round trip on each one. Instead a
//! replica takes a small batch of tokens at once — [`BATCH_SECONDS`] of the bucket's rate, at
//! least one — and spends them locally for at most [`LEASE`]; what it has not spent by then is
//! dropped. Tokens come out of the one shared bucket before they are spent, so:
//!
//! - **Never more than the limit, give or take one lease**: over any interval of length `T`
//!   the replicas together admit at most `burst + rate × (T + LEASE)` requests per bucket.
//! - **At worst a little less**: a batch a replica took and did not spend before its lease
//!   ended is lost, at most `batch` tokens per replica per lease (with steady traffic, none).
//! - **Cost**: a request whose buckets all have leased tokens costs no round trip; otherwise
//!   one round trip charges all of its buckets at once. A bucket of rate `r` is charged at
//!   most `max(r, 1 / BATCH_SECONDS)` times a second per replica, and at most once per request.
//!
//! Requests are charged all or nothing, as in memory: tokens a refused request took are kept
//! in this replica's leases for the next request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::ledger::{LedgerError, TaskLedger, TokenAsk};
use crate::policy::rate_limits::Bucket;

use super::charges::Charge;

use super::local::Refused;

/// How long a replica may spend tokens it took from the shared bucket.
pub const LEASE: Duration = Duration::from_millis(250);
/// How much of a bucket's rate one batch takes (in seconds of it).
pub const BATCH_SECONDS: f64 = 0.05;
/// Most leases kept (one per bucket this replica charged recently); past it, expired ones are
/// dropped, then all.
const MAX_LEASES: usize = 65_536;

/// Tokens of one shared bucket this replica holds.
#[derive(Clone, Copy, Debug)]
struct Lease {
    tokens: u32,
    until: Instant,
}

/// The tokens one batch takes from `bucket`.
pub fn batch(bucket: Bucket) -> u32 {
    let span = (bucket.requests_per_second * BATCH_SECONDS).floor();
    // A rate of at most 10^6 a second: the product fits a u32.
    (span as u32).clamp(1, bucket.burst.max(1))
}

/// The bucket's ID in the database: its family and scope, and a digest of its party (claims
/// are the issuer's to choose: any length, any character, NUL included, which a database text
/// cannot hold).
fn shared_id(charge: &Charge) -> String {
    use sha2::{Digest, Sha256};
    let id = charge.bucket_id();
    let (head, party) = id.rsplit_once('\u{1}').unwrap_or((id.as_str(), ""));
    if party.is_empty() {
        return id;
    }
    format!(
        "{head}\u{1}{}",
        hex::encode(Sha256::digest(party.as_bytes()))
    )
}

/// The shared buckets as one replica sees them.
pub struct SharedBuckets {
    ledger: Arc<dyn TaskLedger>,
    leases: Mutex<HashMap<String, Lease>>,
}

impl SharedBuckets {
    pub fn new(ledger: Arc<dyn TaskLedger>) -> Self {
        Self {
            ledger,
            leases: Mutex::new(HashMap::new()),
        }
    }

    fn leases(&self) -> std::sync::MutexGuard<'_, HashMap<String, Lease>> {
        self.leases.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Charges `charges` (all or none): from this replica's leases where it holds tokens, and
    /// with one round trip to the ledger for the rest. An error is the ledger's: nothing was
    /// charged.
    pub async fn admit(&self, charges: &[Charge]) -> Result<Result<(), Refused>, LedgerError> {
        let ids: Vec<String> = charges.iter().map(shared_id).collect();
        let now = Instant::now();
        let mut leased = vec![false; charges.len()];
        {
            let mut leases = self.leases();
            for (index, id) in ids.iter().enumerate() {
                if let Some(lease) = leases.get_mut(id)
                    && lease.until > now
                    && lease.tokens > 0
                {
                    lease.tokens -= 1;
                    leased[index] = true;
                }
            }
        }
        let missing: Vec<usize> = (0..charges.len()).filter(|i| !leased[*i]).collect();
        if missing.is_empty() {
            return Ok(Ok(()));
        }
        let asks: Vec<TokenAsk> = missing
            .iter()
            .map(|&i| TokenAsk {
                bucket: ids[i].clone(),
                requests_per_second: charges[i].bucket.requests_per_second,
                burst: charges[i].bucket.burst,
                want: batch(charges[i].bucket),
            })
            .collect();
        let grants = match self.ledger.take_tokens(&asks).await {
            Ok(grants) => grants,
            Err(error) => {
                self.give_back(&ids, &leased, now);
                return Err(error);
            }
        };
        let until = Instant::now() + LEASE;
        let mut refused: Option<Refused> = None;
        let mut took = leased;
        {
            let mut leases = self.leases();
            if leases.len() >= MAX_LEASES {
                leases.retain(|_, lease| lease.until > now);
                if leases.len() >= MAX_LEASES {
                    leases.clear();
                }
            }
            for (&index, grant) in missing.iter().zip(&grants) {
                if grant.granted == 0 {
                    let wait = charges[index].bucket.wait_ms(1.0 - grant.left);
                    if refused.is_none_or(|r| wait > r.retry_after_ms) {
                        refused = Some(Refused {
                            charge: index,
                            retry_after_ms: wait,
                        });
                    }
                    continue;
                }
                took[index] = true;
                // One token pays for this request; the rest are leased.
                let lease = leases
                    .entry(ids[index].clone())
                    .or_insert(Lease { tokens: 0, until });
                if lease.until <= now {
                    lease.tokens = 0;
                }
                lease.tokens += grant.granted - 1;
                lease.until = until;
            }
        }
        match refused {
            None => Ok(Ok(())),
            Some(refused) => {
                self.give_back(&ids, &took, now);
                Ok(Err(refused))
            }
        }
    }

    /// Returns the tokens `took` marks to this replica's leases (for the next request).
    fn give_back(&self, ids: &[String], took: &[bool], now: Instant) {
        let mut leases = self.leases();
        for (id, took) in ids.iter().zip(took) {
            if !took {
                continue;
            }
            if let Some(lease) = leases.get_mut(id)
                && lease.until > now
            {
                lease.tokens += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_ids_hold_no_nul_and_keep_parties_apart() {
        use super::super::charges::charges_for;
        use crate::model::Owner;
        use crate::policy::rate_limits::{RateLimitRules, ScopedBuckets};
        let rules = RateLimitRules {
            all: ScopedBuckets {
                per_principal: Some(Bucket {
                    requests_per_second: 1.0,
                    burst: 1,
                }),
                per_server: Some(Bucket {
                    requests_per_second: 1.0,
                    burst: 1,
                }),
                ..ScopedBuckets::default()
            },
            ..RateLimitRules::default()
        };
        let owner = |subject: &str| Owner {
            issuer: "https://idp".into(),
            subject: subject.into(),
            tenant: String::new(),
            client: String::new(),
        };
        let alice = charges_for(&rules, &owner("alice\0x"), "tools/list", None);
        let bob = charges_for(&rules, &owner("bob"), "tools/list", None);
        let ids: Vec<String> = alice.iter().chain(&bob).map(shared_id).collect();
        assert!(ids.iter().all(|id| !id.contains('\0')), "{ids:?}");
        assert_ne!(ids[0], ids[2]);
        // The server's bucket has no party: one ID for everyone.
        assert_eq!(ids[1], ids[3]);
    }

    #[test]
    fn a_batch_is_a_twentieth_of_a_second_of_the_rate_within_one_and_the_burst() {
        let b = |rps: f64, burst: u32| Bucket {
            requests_per_second: rps,
            burst,
        };
        assert_eq!(batch(b(10.0, 20)), 1);
        assert_eq!(batch(b(1000.0, 2000)), 50);
        assert_eq!(batch(b(1000.0, 20)), 20);
        assert_eq!(batch(b(0.5, 1)), 1);
    }
}
