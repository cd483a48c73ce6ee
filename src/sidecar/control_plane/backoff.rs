//! Reconnection delays: exponential backoff with full jitter.
//!
//! The ceiling starts at [`INITIAL`] and doubles after every failed attempt up to [`CAP`]; each
//! delay is drawn uniformly from `[0, ceiling]`. With a 2 s cap a sidecar dials again at most
//! 2 s (plus the connect time) after the operator comes back, and a fleet of sidecars that lost
//! the operator together does not dial back in lockstep.

use std::time::Duration;

/// The first ceiling.
pub const INITIAL: Duration = Duration::from_millis(100);
/// The largest ceiling.
pub const CAP: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    cap: Duration,
    ceiling: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(INITIAL, CAP)
    }
}

impl Backoff {
    pub fn new(initial: Duration, cap: Duration) -> Self {
        Self {
            initial,
            cap,
            ceiling: initial.min(cap),
        }
    }

    /// The delay before the next attempt, drawn with the operating system's randomness.
    pub fn next_delay(&mut self) -> Duration {
        let mut bytes = [0u8; 8];
        // Without randomness the jitter is lost, not the bound.
        let random = match getrandom::fill(&mut bytes) {
            Ok(()) => u64::from_le_bytes(bytes),
            Err(_) => u64::MAX,
        };
        self.next_delay_with(random)
    }

    /// The delay for a given random number (`u64::MAX` draws the ceiling itself).
    pub fn next_delay_with(&mut self, random: u64) -> Duration {
        let ceiling = self.ceiling;
        self.ceiling = (self.ceiling * 2).min(self.cap);
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        // random / u64::MAX scaled to [0, ceiling], in 128 bits so nothing overflows.
        let scaled = u128::from(nanos) * u128::from(random) / u128::from(u64::MAX);
        Duration::from_nanos(u64::try_from(scaled).unwrap_or(nanos))
    }

    /// Starts over after a connection that worked.
    pub fn reset(&mut self) {
        self.ceiling = self.initial.min(self.cap);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_double_to_the_cap_and_delays_stay_under_them() {
        let mut backoff = Backoff::default();
        let ceilings: Vec<Duration> = (0..8).map(|_| backoff.next_delay_with(u64::MAX)).collect();
        let ms = |v: u64| Duration::from_millis(v);
        assert_eq!(
            ceilings,
            vec![
                ms(100),
                ms(200),
                ms(400),
                ms(800),
                ms(1600),
                ms(2000),
                ms(2000),
                ms(2000)
            ]
        );
        assert_eq!(backoff.next_delay_with(0), Duration::ZERO, "full jitter");
        let half = backoff.next_delay_with(u64::MAX / 2);
        assert!(half > ms(990) && half < ms(1010), "{half:?}");
        for _ in 0..1000 {
            assert!(backoff.next_delay() <= CAP);
        }
    }

    #[test]
    fn a_reset_starts_from_the_first_ceiling_again() {
        let mut backoff = Backoff::default();
        for _ in 0..10 {
            backoff.next_delay_with(u64::MAX);
        }
        backoff.reset();
        assert_eq!(
            backoff.next_delay_with(u64::MAX),
            Duration::from_millis(100)
        );
    }
}
