//! Token buckets kept in this sidecar's memory: the limits of a sidecar with its own SQLite
//! ledger, and the fallback of one whose shared ledger cannot be reached.
//!
//! Buckets live in sharded maps keyed by [`Charge::bucket_id`]. A bucket that has refilled to
//! its burst is the same as no bucket, so idle ones are swept when a shard grows; past
//! [`MAX_KEYS_PER_SHARD`] even after a sweep, new parties share one overflow bucket per family
//! and scope (conservative: they are limited together, never not at all).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use crate::policy::rate_limits::Bucket;

use super::charges::Charge;

const SHARDS: usize = 16;
/// Most buckets one shard keeps (131 072 in all).
pub const MAX_KEYS_PER_SHARD: usize = 8192;

/// One bucket's level when it was last charged.
#[derive(Clone, Copy, Debug)]
struct Level {
    tokens: f64,
    at: Instant,
}

impl Level {
    fn full(bucket: Bucket, now: Instant) -> Self {
        Self {
            tokens: f64::from(bucket.burst),
            at: now,
        }
    }

    /// The level at `now`: refilled at the bucket's rate, never above its burst (nor below
    /// what it was: `now` may be a moment earlier than a concurrent charge's).
    fn at(self, bucket: Bucket, now: Instant) -> Self {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        Self {
            tokens: (self.tokens + elapsed * bucket.requests_per_second)
                .min(f64::from(bucket.burst)),
            at: self.at.max(now),
        }
    }
}

/// Why a charge was refused: the index of the bucket whose wait is longest, and that wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused {
    pub charge: usize,
    pub retry_after_ms: u64,
}

/// In-memory token buckets.
pub struct LocalBuckets {
    shards: Vec<Mutex<HashMap<String, Level>>>,
    max_keys_per_shard: usize,
}

impl Default for LocalBuckets {
    fn default() -> Self {
        Self::with_capacity(MAX_KEYS_PER_SHARD)
    }
}

impl LocalBuckets {
    /// Buckets whose shards keep at most `max_keys_per_shard` parties each.
    pub fn with_capacity(max_keys_per_shard: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            max_keys_per_shard,
        }
    }

    fn shard(&self, id: &str) -> &Mutex<HashMap<String, Level>> {
        use std::hash::{Hash, Hasher};
        // A fixed hasher: which shard a key lands in need not be secret (every shard is
        // bounded and swept), only spread.
        let mut hasher = std::hash::DefaultHasher::new();
        id.hash(&mut hasher);
        &self.shards[(hasher.finish() as usize) % SHARDS]
    }

    /// Takes one token from every bucket of `charges`, or from none: the first bucket without
    /// a token refuses the request, and the tokens already taken are given back. The refusal
    /// names the bucket with the longest wait among all that lack a token.
    pub fn admit(&self, charges: &[Charge], now: Instant) -> Result<(), Refused> {
        let ids: Vec<String> = charges.iter().map(Charge::bucket_id).collect();
        for (index, charge) in charges.iter().enumerate() {
            if let Err(wait) = self.take(&ids[index], charge.bucket, now) {
                for (taken, earlier) in charges[..index].iter().enumerate() {
                    self.give_back(&ids[taken], earlier.bucket, now);
                }
                let mut refused = Refused {
                    charge: index,
                    retry_after_ms: wait,
                };
                for (later, charge) in charges.iter().enumerate().skip(index + 1) {
                    let wait = self.wait(&ids[later], charge.bucket, now);
                    if wait > refused.retry_after_ms {
                        refused = Refused {
                            charge: later,
                            retry_after_ms: wait,
                        };
                    }
                }
                return Err(refused);
            }
        }
        Ok(())
    }

    /// Takes a token from bucket `id`, or says how long until one is due.
    fn take(&self, id: &str, bucket: Bucket, now: Instant) -> Result<(), u64> {
        let mut shard = self.shard(id).lock().unwrap_or_else(|e| e.into_inner());
        let key = self.room_for(&mut shard, id, bucket, now);
        let level = shard
            .get(&key)
            .map_or(Level::full(bucket, now), |l| l.at(bucket, now));
        if level.tokens >= 1.0 {
            shard.insert(
                key,
                Level {
                    tokens: level.tokens - 1.0,
                    at: level.at,
                },
            );
            Ok(())
        } else {
            shard.insert(key, level);
            Err(bucket.wait_ms(1.0 - level.tokens))
        }
    }

    fn give_back(&self, id: &str, bucket: Bucket, now: Instant) {
        let mut shard = self.shard(id).lock().unwrap_or_else(|e| e.into_inner());
        let key = if shard.contains_key(id) {
            id.to_owned()
        } else {
            overflow_key(id)
        };
        if let Some(level) = shard.get_mut(&key) {
            let refilled = level.at(bucket, now);
            *level = Level {
                tokens: (refilled.tokens + 1.0).min(f64::from(bucket.burst)),
                at: refilled.at,
            };
        }
    }

    /// How long until bucket `id` has a token, taking none.
    fn wait(&self, id: &str, bucket: Bucket, now: Instant) -> u64 {
        let shard = self.shard(id).lock().unwrap_or_else(|e| e.into_inner());
        let level = shard
            .get(id)
            .or_else(|| shard.get(&overflow_key(id)))
            .map_or(Level::full(bucket, now), |l| l.at(bucket, now));
        bucket.wait_ms(1.0 - level.tokens)
    }

    /// The key to charge for `id` in `shard`: its own when it has one or there is room
    /// (sweeping full buckets when the shard is at its bound), else the overflow bucket of
    /// its family and scope.
    fn room_for(
        &self,
        shard: &mut HashMap<String, Level>,
        id: &str,
        bucket: Bucket,
        now: Instant,
    ) -> String {
        if shard.contains_key(id) || shard.len() < self.max_keys_per_shard {
            return id.to_owned();
        }
        // A bucket that refilled to its burst holds nothing a new one would not.
        shard.retain(|_, level| level.at(bucket, now).tokens < f64::from(bucket.burst));
        if shard.len() < self.max_keys_per_shard {
            id.to_owned()
        } else {
            overflow_key(id)
        }
    }

    /// Buckets kept, for tests and the memory bound.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }
}

/// The shared bucket of `id`'s family and scope (the id up to its party key).
fn overflow_key(id: &str) -> String {
    let family_and_scope = id.rsplit_once('\u{1}').map_or(id, |(head, _)| head);
    format!("{family_and_scope}\u{1}\u{2}overflow")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::charges::charges_for;
    use super::*;
    use crate::model::Owner;
    use crate::policy::rate_limits::{RateLimitRules, ScopedBuckets};

    fn bucket(rps: f64, burst: u32) -> Option<Bucket> {
        Some(Bucket {
            requests_per_second: rps,
            burst,
        })
    }

    fn owner(subject: &str) -> Owner {
        Owner {
            issuer: "https://idp".into(),
            subject: subject.into(),
            tenant: "t".into(),
            client: "c".into(),
        }
    }

    fn per_principal(rps: f64, burst: u32) -> RateLimitRules {
        RateLimitRules {
            all: ScopedBuckets {
                per_principal: bucket(rps, burst),
                ..ScopedBuckets::default()
            },
            ..RateLimitRules::default()
        }
    }

    #[test]
    fn a_burst_is_admitted_then_one_request_per_token_due() {
        let rules = per_principal(2.0, 3);
        let buckets = LocalBuckets::default();
        let t0 = Instant::now();
        let charges = charges_for(&rules, &owner("alice"), "tools/list", None);
        for _ in 0..3 {
            assert_eq!(buckets.admit(&charges, t0), Ok(()));
        }
        let refused = buckets.admit(&charges, t0).unwrap_err();
        assert_eq!(refused.retry_after_ms, 500);
        // Half a second later one token is due, and only one.
        let t1 = t0 + Duration::from_millis(500);
        assert_eq!(buckets.admit(&charges, t1), Ok(()));
        assert!(buckets.admit(&charges, t1).is_err());
        // Another principal has a bucket of its own.
        let bob = charges_for(&rules, &owner("bob"), "tools/list", None);
        assert_eq!(buckets.admit(&bob, t1), Ok(()));
    }

    #[test]
    fn a_refused_request_takes_no_token_from_the_buckets_that_had_one() {
        let rules = RateLimitRules {
            all: ScopedBuckets {
                per_principal: bucket(1.0, 5),
                per_server: bucket(1.0, 1),
                ..ScopedBuckets::default()
            },
            ..RateLimitRules::default()
        };
        let buckets = LocalBuckets::default();
        let t0 = Instant::now();
        let alice = charges_for(&rules, &owner("alice"), "tools/list", None);
        assert_eq!(buckets.admit(&alice, t0), Ok(()));
        // The server bucket is empty: refused, and alice's own bucket keeps its 4 tokens.
        for _ in 0..10 {
            let refused = buckets.admit(&alice, t0).unwrap_err();
            assert_eq!(refused.charge, 1);
        }
        let server_only = RateLimitRules {
            all: ScopedBuckets {
                per_principal: bucket(1.0, 5),
                ..ScopedBuckets::default()
            },
            ..RateLimitRules::default()
        };
        let own = charges_for(&server_only, &owner("alice"), "tools/list", None);
        for _ in 0..4 {
            assert_eq!(buckets.admit(&own, t0), Ok(()));
        }
        assert!(buckets.admit(&own, t0).is_err());
    }

    #[test]
    fn the_refusal_names_the_longest_wait() {
        let rules = RateLimitRules {
            all: ScopedBuckets {
                per_principal: bucket(10.0, 1),
                per_server: bucket(0.5, 1),
                ..ScopedBuckets::default()
            },
            ..RateLimitRules::default()
        };
        let buckets = LocalBuckets::default();
        let t0 = Instant::now();
        let charges = charges_for(&rules, &owner("alice"), "tools/list", None);
        assert_eq!(buckets.admit(&charges, t0), Ok(()));
        let refused = buckets.admit(&charges, t0).unwrap_err();
        assert_eq!(
            refused,
            Refused {
                charge: 1,
                retry_after_ms: 2000
            }
        );
    }

    #[test]
    fn idle_buckets_are_swept_and_past_the_bound_new_parties_share_one() {
        let rules = per_principal(1000.0, 1);
        let buckets = LocalBuckets::with_capacity(2);
        let t0 = Instant::now();
        for n in 0..200 {
            // Each party comes 10 ms after the last: every earlier bucket has refilled by then
            // and may be swept.
            let now = t0 + Duration::from_millis(10 * n);
            let charges = charges_for(&rules, &owner(&format!("p{n}")), "tools/list", None);
            assert_eq!(buckets.admit(&charges, now), Ok(()), "party {n}");
        }
        assert!(buckets.len() <= 2 * SHARDS + SHARDS, "{}", buckets.len());
        // Past the bound with every bucket busy, newcomers share an overflow bucket: limited
        // together, not unlimited.
        let slow = per_principal(0.001, 1);
        let crowded = LocalBuckets::with_capacity(1);
        let mut admitted = 0;
        for n in 0..(SHARDS * 4) {
            let charges = charges_for(&slow, &owner(&format!("q{n}")), "tools/list", None);
            if crowded.admit(&charges, t0).is_ok() {
                admitted += 1;
            }
        }
        assert!(admitted < SHARDS * 4, "{admitted}");
        assert!(crowded.len() <= SHARDS * 2, "{}", crowded.len());
    }
}
