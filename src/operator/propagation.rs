//! How far each PrincipalRevocation has spread: the sidecars it must reach (fixed when the
//! operator first sees it), which of them applied it, and when the last one did.
//!
//! - The target is the set of pods connected at first sight whose policy trusts the
//!   revocation's issuer. Sidecars that connect later get the revocation in their snapshot and
//!   their counts are added, but they do not move the target.
//! - A targeted pod that is deleted before acknowledging counts as done: its sidecar and its
//!   ledger are gone, so no work of the principal runs there any more.
//! - `propagationMillis` runs from the moment the operator first observed the object (for an
//!   object older than this operator process, from its `creationTimestamp`) to the last
//!   acknowledgement. A completed propagation recorded in status is kept as is.
//! - Revocations that existed before this process started wait [`RESTART_GRACE`] before
//!   their target is fixed, so sidecars have time to reconnect after an operator restart.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

use jiff::Timestamp;

use super::plan::PodKey;
use super::status::Propagation;

/// Time after startup before pre-existing, unfinished revocations get their target.
pub const RESTART_GRACE: Duration = Duration::from_secs(6);

#[derive(Clone, Debug)]
struct Tracked {
    observed: Timestamp,
    /// `None` while waiting for the restart grace.
    target: Option<BTreeSet<PodKey>>,
    completed: Option<(Timestamp, i64)>,
    /// A completion found in status at first sight: counts kept from there.
    recorded: Option<(i32, i32)>,
}

/// Every revocation this process has seen.
#[derive(Debug)]
pub struct PropagationTracker {
    started: Timestamp,
    revocations: HashMap<String, Tracked>,
}

/// What the tracker needs to know about a revocation the first time it sees it.
#[derive(Clone, Debug)]
pub struct FirstSight {
    pub created: Option<Timestamp>,
    /// `completedAt`, `propagationMillis`, target and acknowledged counts already in status.
    pub recorded_completion: Option<(Timestamp, i64, i32, i32)>,
}

impl PropagationTracker {
    pub fn new(started: Timestamp) -> Self {
        Self {
            started,
            revocations: HashMap::new(),
        }
    }

    fn grace_over(&self, now: Timestamp) -> bool {
        now >= self.started + jiff::SignedDuration::try_from(RESTART_GRACE).unwrap_or_default()
    }

    /// Records the first sight of `name` (no-op when already tracked); `targets` lists the
    /// connected pods whose snapshot carries it.
    pub fn observe(
        &mut self,
        name: &str,
        first: &FirstSight,
        now: Timestamp,
        targets: impl FnOnce() -> BTreeSet<PodKey>,
    ) {
        if self.revocations.contains_key(name) {
            return;
        }
        if let Some((at, millis, target, acked)) = first.recorded_completion {
            self.revocations.insert(
                name.to_owned(),
                Tracked {
                    observed: at,
                    target: Some(BTreeSet::new()),
                    completed: Some((at, millis)),
                    recorded: Some((target, acked)),
                },
            );
            return;
        }
        let predates_us = first.created.is_some_and(|c| c < self.started);
        let observed = if predates_us {
            first.created.unwrap_or(now)
        } else {
            now
        };
        let target = (!predates_us || self.grace_over(now)).then(targets);
        self.revocations.insert(
            name.to_owned(),
            Tracked {
                observed,
                target,
                completed: None,
                recorded: None,
            },
        );
    }

    /// Fixes the targets of revocations that waited for the restart grace.
    pub fn fix_deferred_targets(
        &mut self,
        now: Timestamp,
        mut targets: impl FnMut(&str) -> BTreeSet<PodKey>,
    ) {
        if !self.grace_over(now) {
            return;
        }
        for (name, tracked) in self.revocations.iter_mut() {
            if tracked.target.is_none() {
                tracked.target = Some(targets(name));
            }
        }
    }

    /// Whether the restart grace is still running for some revocation.
    pub fn waiting_for_grace(&self) -> Option<Timestamp> {
        self.revocations
            .values()
            .any(|t| t.target.is_none())
            .then(|| {
                self.started + jiff::SignedDuration::try_from(RESTART_GRACE).unwrap_or_default()
            })
    }

    /// The propagation of `name` now. `reported` are the pods that acknowledged it, `pods`
    /// every pod that exists; `None` when the revocation was never observed.
    pub fn progress(
        &mut self,
        name: &str,
        reported: &HashSet<PodKey>,
        pods: &HashSet<PodKey>,
        tasks_cancelled: u64,
        streams_closed: u64,
        now: Timestamp,
    ) -> Option<Propagation> {
        let tracked = self.revocations.get_mut(name)?;
        let totals = (
            i64::try_from(tasks_cancelled).unwrap_or(i64::MAX),
            i64::try_from(streams_closed).unwrap_or(i64::MAX),
        );
        if let (Some((at, millis)), Some((target, acked))) = (tracked.completed, tracked.recorded) {
            return Some(Propagation {
                target,
                acknowledged: acked,
                tasks_cancelled: totals.0,
                streams_closed: totals.1,
                completed_at: Some(at),
                propagation_millis: Some(millis),
            });
        }
        let target = tracked.target.as_ref()?;
        let acknowledged = target
            .iter()
            .filter(|pod| reported.contains(*pod) || !pods.contains(*pod))
            .count();
        let target_len = target.len();
        if tracked.completed.is_none() && acknowledged == target_len {
            let millis = i64::try_from(now.duration_since(tracked.observed).as_millis())
                .unwrap_or(i64::MAX)
                .max(0);
            tracked.completed = Some((now, millis));
        }
        Some(Propagation {
            target: i32::try_from(target_len).unwrap_or(i32::MAX),
            acknowledged: i32::try_from(acknowledged).unwrap_or(i32::MAX),
            tasks_cancelled: totals.0,
            streams_closed: totals.1,
            completed_at: tracked.completed.map(|c| c.0),
            propagation_millis: tracked.completed.map(|c| c.1),
        })
    }

    /// Forgets a deleted revocation.
    pub fn forget(&mut self, name: &str) {
        self.revocations.remove(name);
    }

    /// Forgets every revocation `exists` says is gone (deleted before it expired).
    pub fn retain(&mut self, exists: impl Fn(&str) -> bool) {
        self.revocations.retain(|name, _| exists(name));
    }

    /// Revocations whose propagation has not completed, with the instant their clock started
    /// (including those still waiting for the restart grace).
    pub fn pending(&self) -> Vec<(String, Timestamp)> {
        self.revocations
            .iter()
            .filter(|(_, t)| t.completed.is_none())
            .map(|(name, t)| (name.clone(), t.observed))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn pod(name: &str) -> PodKey {
        PodKey {
            namespace: "team-a".into(),
            name: name.into(),
        }
    }

    fn set(names: &[&str]) -> HashSet<PodKey> {
        names.iter().map(|n| pod(n)).collect()
    }

    const START: &str = "2026-12-01T00:00:00Z";

    #[test]
    fn the_target_is_fixed_at_first_sight_and_completion_needs_every_target() {
        let mut t = PropagationTracker::new(at(START));
        let seen = at("2026-12-01T00:01:00.000Z");
        let first = FirstSight {
            created: Some(seen),
            recorded_completion: None,
        };
        t.observe("rev", &first, seen, || [pod("a"), pod("b")].into());
        // A second sight with more pods changes nothing.
        t.observe("rev", &first, seen, || {
            [pod("a"), pod("b"), pod("c")].into()
        });
        let all = set(&["a", "b", "c"]);
        let p = t
            .progress(
                "rev",
                &set(&["a", "c"]),
                &all,
                2,
                0,
                at("2026-12-01T00:01:00.200Z"),
            )
            .unwrap();
        assert_eq!((p.target, p.acknowledged, p.completed_at), (2, 1, None));
        let done_at = at("2026-12-01T00:01:00.350Z");
        let p = t
            .progress("rev", &set(&["a", "b", "c"]), &all, 5, 1, done_at)
            .unwrap();
        assert_eq!((p.target, p.acknowledged), (2, 2));
        assert_eq!(p.completed_at, Some(done_at));
        assert_eq!(p.propagation_millis, Some(350));
        assert_eq!(p.tasks_cancelled, 5);
        // Completion is not moved by later acknowledgements.
        let p = t
            .progress(
                "rev",
                &set(&["a", "b", "c"]),
                &all,
                5,
                1,
                at("2026-12-01T00:09:00Z"),
            )
            .unwrap();
        assert_eq!(p.completed_at, Some(done_at));
    }

    #[test]
    fn a_deleted_target_pod_counts_as_done_and_no_target_completes_at_once() {
        let mut t = PropagationTracker::new(at(START));
        let now = at("2026-12-01T00:02:00Z");
        let first = FirstSight {
            created: Some(now),
            recorded_completion: None,
        };
        t.observe("rev", &first, now, || [pod("a"), pod("gone")].into());
        let p = t
            .progress("rev", &set(&["a"]), &set(&["a"]), 0, 0, now)
            .unwrap();
        assert_eq!((p.acknowledged, p.propagation_millis), (2, Some(0)));
        t.observe("empty", &first, now, BTreeSet::new);
        let p = t
            .progress("empty", &set(&[]), &set(&[]), 0, 0, now)
            .unwrap();
        assert_eq!((p.target, p.completed_at), (0, Some(now)));
    }

    #[test]
    fn after_a_restart_old_revocations_wait_for_sidecars_to_reconnect() {
        let mut t = PropagationTracker::new(at(START));
        let first = FirstSight {
            created: Some(at("2026-11-30T23:00:00Z")),
            recorded_completion: None,
        };
        let early = at("2026-12-01T00:00:01Z");
        t.observe("old", &first, early, || {
            panic!("target fixed during the grace")
        });
        assert!(
            t.progress("old", &set(&[]), &set(&[]), 0, 0, early)
                .is_none()
        );
        assert!(t.waiting_for_grace().is_some());
        let later = at("2026-12-01T00:00:07Z");
        t.fix_deferred_targets(later, |_| [pod("a")].into());
        let p = t
            .progress("old", &set(&["a"]), &set(&["a"]), 1, 0, later)
            .unwrap();
        assert_eq!(p.target, 1);
        // Counted from the object's creation.
        assert_eq!(p.propagation_millis, Some(3_607_000));
    }

    #[test]
    fn pending_lists_unfinished_revocations_and_retain_drops_deleted_ones() {
        let mut t = PropagationTracker::new(at(START));
        let seen = at("2026-12-01T00:05:00Z");
        let first = FirstSight {
            created: Some(seen),
            recorded_completion: None,
        };
        t.observe("waiting", &first, seen, || [pod("a")].into());
        t.observe("deleted", &first, seen, || [pod("a")].into());
        t.observe("done", &first, seen, BTreeSet::new);
        t.progress("done", &set(&[]), &set(&["a"]), 0, 0, seen);
        let mut pending = t.pending();
        pending.sort();
        assert_eq!(
            pending,
            vec![("deleted".to_owned(), seen), ("waiting".to_owned(), seen)]
        );
        t.retain(|name| name != "deleted");
        assert_eq!(t.pending(), vec![("waiting".to_owned(), seen)]);
        assert!(
            t.progress("deleted", &set(&[]), &set(&[]), 0, 0, seen)
                .is_none()
        );
    }

    #[test]
    fn a_completion_already_in_status_is_kept() {
        let mut t = PropagationTracker::new(at(START));
        let done = at("2026-11-30T12:00:00Z");
        let first = FirstSight {
            created: Some(at("2026-11-30T11:59:59Z")),
            recorded_completion: Some((done, 812, 7, 7)),
        };
        t.observe("rev", &first, at(START), BTreeSet::new);
        let p = t
            .progress("rev", &set(&[]), &set(&[]), 3, 1, at(START))
            .unwrap();
        assert_eq!(
            (
                p.target,
                p.acknowledged,
                p.completed_at,
                p.propagation_millis
            ),
            (7, 7, Some(done), Some(812))
        );
    }
}
