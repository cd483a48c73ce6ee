//! Decisions of the object authorizer, reused for a bounded time and count.
//!
//! Guarantees: an entry is served only while younger than the policy's `cacheTtl` (a `0s` TTL
//! caches nothing); at most `cacheSize` entries are held, the oldest dropped first; only
//! answers (allow or deny) are cached, never errors. The cache belongs to one authorizer
//! configuration: a policy that changes it starts an empty one.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::Question;

struct Entry {
    allowed: bool,
    decided_at: Instant,
}

struct Inner {
    entries: HashMap<Question, Entry>,
    /// Keys in the order they were decided (a key decided again appears again; stale
    /// positions are skipped when they reach the front).
    order: VecDeque<(Question, Instant)>,
}

/// Bounded, time-limited decisions.
pub struct DecisionCache {
    ttl: Duration,
    size: usize,
    inner: Mutex<Inner>,
}

impl DecisionCache {
    pub fn new(ttl: Duration, size: usize) -> Self {
        Self {
            ttl,
            size: size.max(1),
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                order: VecDeque::new(),
            }),
        }
    }

    /// The cached decision of `question`, if one younger than the TTL is held at `now`.
    pub fn get(&self, question: &Question, now: Instant) -> Option<bool> {
        if self.ttl.is_zero() {
            return None;
        }
        let inner = self.inner.lock().ok()?;
        let entry = inner.entries.get(question)?;
        (now.saturating_duration_since(entry.decided_at) < self.ttl).then_some(entry.allowed)
    }

    /// Remembers the authorizer's answer to `question`, given at `now`.
    pub fn insert(&self, question: Question, allowed: bool, now: Instant) {
        if self.ttl.is_zero() {
            return;
        }
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        inner.order.push_back((question.clone(), now));
        inner.entries.insert(
            question,
            Entry {
                allowed,
                decided_at: now,
            },
        );
        while inner.entries.len() > self.size || inner.order.len() > 2 * self.size {
            let Some((oldest, at)) = inner.order.pop_front() else {
                break;
            };
            // Only the newest position of a key removes it.
            if inner
                .entries
                .get(&oldest)
                .is_some_and(|e| e.decided_at == at)
            {
                inner.entries.remove(&oldest);
            }
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.inner.lock().map(|i| i.entries.len()).unwrap_or(0)
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::super::Action;
    use super::*;

    fn question(object: &str, action: Action) -> Question {
        Question {
            issuer: "https://idp".into(),
            subject: "alice".into(),
            tenant: "t".into(),
            client: "c".into(),
            tool: "report".into(),
            resource_type: "project".into(),
            object: object.into(),
            action,
        }
    }

    #[test]
    fn serves_a_decision_only_while_it_is_younger_than_the_ttl() {
        let cache = DecisionCache::new(Duration::from_secs(5), 10);
        let t0 = Instant::now();
        cache.insert(question("x", Action::Read), false, t0);
        assert_eq!(cache.get(&question("x", Action::Read), t0), Some(false));
        assert_eq!(
            cache.get(&question("x", Action::Read), t0 + Duration::from_secs(4)),
            Some(false)
        );
        assert_eq!(
            cache.get(&question("x", Action::Read), t0 + Duration::from_secs(5)),
            None
        );
    }

    #[test]
    fn a_decision_is_about_one_object_and_one_operation() {
        let cache = DecisionCache::new(Duration::from_secs(5), 10);
        let t0 = Instant::now();
        cache.insert(question("x", Action::Read), true, t0);
        assert_eq!(cache.get(&question("y", Action::Read), t0), None);
        assert_eq!(cache.get(&question("x", Action::Result), t0), None);
        let mut bob = question("x", Action::Read);
        bob.subject = "bob".into();
        assert_eq!(cache.get(&bob, t0), None);
    }

    #[test]
    fn a_zero_ttl_caches_nothing() {
        let cache = DecisionCache::new(Duration::ZERO, 10);
        let t0 = Instant::now();
        cache.insert(question("x", Action::Read), true, t0);
        assert_eq!(cache.get(&question("x", Action::Read), t0), None);
        assert!(cache.is_empty());
    }

    #[test]
    fn holds_at_most_its_size_dropping_the_oldest_first() {
        let cache = DecisionCache::new(Duration::from_secs(60), 3);
        let t0 = Instant::now();
        for (i, object) in ["a", "b", "c", "d"].iter().enumerate() {
            let at = t0 + Duration::from_millis(i as u64);
            cache.insert(question(object, Action::Read), true, at);
        }
        assert_eq!(cache.len(), 3);
        let later = t0 + Duration::from_secs(1);
        assert_eq!(cache.get(&question("a", Action::Read), later), None);
        assert_eq!(cache.get(&question("d", Action::Read), later), Some(true));
    }

    #[test]
    fn deciding_a_key_again_keeps_it_as_the_newest() {
        let cache = DecisionCache::new(Duration::from_secs(60), 2);
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        cache.insert(question("a", Action::Read), true, ms(0));
        cache.insert(question("b", Action::Read), true, ms(1));
        cache.insert(question("a", Action::Read), false, ms(2));
        cache.insert(question("c", Action::Read), true, ms(3));
        assert_eq!(cache.get(&question("a", Action::Read), ms(4)), Some(false));
        assert_eq!(cache.get(&question("b", Action::Read), ms(4)), None);
        assert_eq!(cache.get(&question("c", Action::Read), ms(4)), Some(true));
        // Repeated decisions of one key never grow the bookkeeping without bound.
        for n in 0..100 {
            cache.insert(question("a", Action::Read), true, ms(10 + n));
        }
        assert!(cache.inner.lock().unwrap().order.len() <= 4);
    }
}
