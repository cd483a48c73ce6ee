//! How fast one transmitter may create revocations: a token bucket per transmitter
//! (`revocationBurst` tokens, refilled at `revocationsPerMinute`). One token per revocation a
//! SET creates; SETs that create nothing (lifts, verification, audit-only events) and
//! redeliveries of accepted SETs cost nothing. Only verified SETs reach the bucket, so someone
//! without the transmitter's signing key cannot spend its tokens.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A token bucket. Time is passed in, so it is tested without waiting.
pub struct TokenBucket {
    capacity: f64,
    per_second: f64,
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    /// A full bucket of `burst` tokens refilled at `per_minute`.
    pub fn new(burst: u32, per_minute: u32, now: Instant) -> Self {
        let capacity = f64::from(burst.max(1));
        Self {
            capacity,
            per_second: f64::from(per_minute.max(1)) / 60.0,
            state: Mutex::new((capacity, now)),
        }
    }

    /// Takes `cost` tokens (at most the burst, so any SET eventually fits), or says how long
    /// until they are there.
    pub fn take(&self, cost: u32, now: Instant) -> Result<(), Duration> {
        let cost = f64::from(cost).min(self.capacity);
        let mut state = match self.state.lock() {
            Ok(state) => state,
            Err(poisoned) => poisoned.into_inner(),
        };
        let (tokens, last) = *state;
        let elapsed = now.saturating_duration_since(last).as_secs_f64();
        let tokens = (tokens + elapsed * self.per_second).min(self.capacity);
        if tokens >= cost {
            *state = (tokens - cost, now);
            Ok(())
        } else {
            *state = (tokens, now);
            Err(Duration::from_secs_f64((cost - tokens) / self.per_second))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_the_rate_applies() {
        let start = Instant::now();
        let bucket = TokenBucket::new(3, 60, start);
        for _ in 0..3 {
            assert_eq!(bucket.take(1, start), Ok(()));
        }
        let wait = bucket.take(1, start).unwrap_err();
        assert!(wait > Duration::from_millis(900) && wait <= Duration::from_secs(1));
        assert_eq!(bucket.take(1, start + Duration::from_secs(1)), Ok(()));
        assert!(bucket.take(1, start + Duration::from_secs(1)).is_err());
        // Refill stops at the burst.
        let later = start + Duration::from_secs(3600);
        assert_eq!(bucket.take(3, later), Ok(()));
        assert!(bucket.take(1, later).is_err());
    }

    #[test]
    fn a_cost_above_the_burst_costs_the_burst() {
        let start = Instant::now();
        let bucket = TokenBucket::new(2, 60, start);
        assert_eq!(bucket.take(5, start), Ok(()));
        assert!(bucket.take(1, start).is_err());
    }
}
