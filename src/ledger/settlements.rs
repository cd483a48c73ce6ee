//! In-process wake-ups for [`TaskLedger::wait_settled`](super::TaskLedger::wait_settled).
//!
//! A waiter registers interest in a reservation *before* it checks whether the reservation is
//! still pending; the backend calls [`Settlements::settle`] after the transaction that confirmed,
//! released or voided it committed. Whichever comes first, the waiter cannot miss it: either its
//! interest was registered before `settle` (and is woken), or the commit happened before its
//! check (which then sees the reservation settled).
//!
//! Memory stays bounded by the number of current waiters: an entry exists only while someone
//! waits on that ID, and `settle` drops it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;

/// Waiters on reservations, by reservation ID.
#[derive(Default)]
pub(crate) struct Settlements {
    waiting: Mutex<HashMap<String, Waiting>>,
}

struct Waiting {
    notify: Arc<Notify>,
    /// Live [`Interest`]s in this entry; the entry goes when the last one does.
    interests: usize,
}

/// Registered interest in one reservation settling. Keep it alive while waiting.
pub(crate) struct Interest<'a> {
    settlements: &'a Settlements,
    id: String,
    notify: Arc<Notify>,
}

impl Settlements {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Waiting>> {
        // Every critical section leaves the map consistent, so a poisoned lock is still usable.
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers interest in `id`. The returned future completes once [`Settlements::settle`]
    /// names `id` after this call; check the reservation's state after registering, and await
    /// the future only if it is still pending.
    pub(crate) fn interest(&self, id: &str) -> (Interest<'_>, OwnedNotified) {
        let mut waiting = self.lock();
        let entry = waiting.entry(id.to_owned()).or_insert_with(|| Waiting {
            notify: Arc::new(Notify::new()),
            interests: 0,
        });
        entry.interests += 1;
        let notify = Arc::clone(&entry.notify);
        // Created under the lock, so a concurrent `settle` either ran before (and the caller's
        // state check sees the commit) or after (and wakes this future).
        let settled = Arc::clone(&notify).notified_owned();
        drop(waiting);
        (
            Interest {
                settlements: self,
                id: id.to_owned(),
                notify,
            },
            settled,
        )
    }

    /// Wakes everyone waiting on these reservations. Call it after the transaction that settled
    /// them committed.
    pub(crate) fn settle<I>(&self, ids: I)
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let mut waiting = self.lock();
        if waiting.is_empty() {
            return;
        }
        for id in ids {
            if let Some(entry) = waiting.remove(id.as_ref()) {
                entry.notify.notify_waiters();
            }
        }
    }

    /// Wakes every waiter, whatever it waits on: for a backend that may have missed
    /// settlements (a lost notification connection). Each checks its reservation again.
    pub(crate) fn settle_all(&self) {
        let mut waiting = self.lock();
        for (_, entry) in waiting.drain() {
            entry.notify.notify_waiters();
        }
    }

    /// Reservations someone currently waits on.
    #[cfg(test)]
    pub(crate) fn tracked(&self) -> usize {
        self.lock().len()
    }
}

impl Drop for Interest<'_> {
    fn drop(&mut self) {
        let mut waiting = self.settlements.lock();
        // After a `settle`, the entry is gone or belongs to newer waiters: leave it alone.
        if let Some(entry) = waiting.get_mut(&self.id)
            && Arc::ptr_eq(&entry.notify, &self.notify)
        {
            entry.interests -= 1;
            if entry.interests == 0 {
                waiting.remove(&self.id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;

    use futures_util::FutureExt;

    use super::*;

    fn register<'a>(s: &'a Settlements, id: &str) -> (Interest<'a>, Pin<Box<OwnedNotified>>) {
        let (interest, settled) = s.interest(id);
        (interest, Box::pin(settled))
    }

    fn woken(settled: &mut Pin<Box<OwnedNotified>>) -> bool {
        settled.as_mut().now_or_never().is_some()
    }

    #[test]
    fn settle_wakes_every_interest_registered_before_it() {
        let settlements = Settlements::default();
        let (a, mut a_settled) = register(&settlements, "r1");
        let (b, mut b_settled) = register(&settlements, "r1");
        let (other, mut other_settled) = register(&settlements, "r2");
        assert_eq!(settlements.tracked(), 2);
        assert!(!woken(&mut a_settled));

        settlements.settle(["r1", "unknown"]);
        assert!(woken(&mut a_settled), "polled before the settle");
        assert!(woken(&mut b_settled), "never polled before the settle");
        assert!(!woken(&mut other_settled));
        assert_eq!(settlements.tracked(), 1, "settled entries are dropped");

        // Interest registered after the settle waits for the next one.
        let (late, mut late_settled) = register(&settlements, "r1");
        assert!(!woken(&mut late_settled));
        drop((a, b, late));
        assert_eq!(settlements.tracked(), 1);
        drop(other);
        assert_eq!(
            settlements.tracked(),
            0,
            "entries go with their last waiter"
        );
    }

    #[test]
    fn settle_all_wakes_everyone() {
        let settlements = Settlements::default();
        let (a, mut a_settled) = register(&settlements, "r1");
        let (b, mut b_settled) = register(&settlements, "r2");
        settlements.settle_all();
        assert!(woken(&mut a_settled) && woken(&mut b_settled));
        assert_eq!(settlements.tracked(), 0);
        drop((a, b));
        assert_eq!(settlements.tracked(), 0);
    }

    #[test]
    fn dropping_an_old_interest_keeps_newer_waiters() {
        let settlements = Settlements::default();
        let (old, _) = register(&settlements, "r1");
        settlements.settle(["r1"]);
        let (new, mut new_settled) = register(&settlements, "r1");
        drop(old);
        assert_eq!(settlements.tracked(), 1);
        settlements.settle(["r1"]);
        assert!(woken(&mut new_settled));
        drop(new);
        assert_eq!(settlements.tracked(), 0);
    }
}
