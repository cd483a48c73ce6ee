//! The operations a random sequence is made of ([`super::draw`] draws them), and what each
//! does to the reference [`Model`] (and what it must answer).
//!
//! Task arguments are reservation numbers, up to one past the last reservation (an ID never
//! reserved).

use serde_json::json;

use super::model::{Beat, End, Entry, Expect, Filter, Held, Intent, Model, Task, Use};
use crate::ledger::{BUDGET_USE_HORIZON_MS, BudgetOutcome, EndReason, TaskStatus};

/// One step of a sequence. `via` is the replica (ledger instance) it runs through.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// The clock moves forward.
    Advance(i64),
    /// `reserve` for `owner` with a token bound to key `binding` (or to none), optionally with
    /// idempotency key `key` (window `window`), void after `life`; identity lease and
    /// delegation `lease`/`delegation` from now.
    Reserve {
        owner: usize,
        binding: Option<usize>,
        key: Option<usize>,
        window: i64,
        life: i64,
        lease: Option<i64>,
        delegation: Option<i64>,
    },
    /// `confirm` of reservation `task` with upstream ID `upstream`, through replica `via`.
    Confirm {
        task: usize,
        upstream: usize,
        /// The server says it created the task this long before now.
        age: i64,
        status: TaskStatus,
        ttl: i64,
        deadline: i64,
        via: usize,
    },
    Release {
        task: usize,
    },
    /// `wait_settled` on a task that is not a pending reservation: returns at once.
    WaitSettled {
        task: usize,
    },
    Get {
        task: usize,
        via: usize,
    },
    Observe {
        task: usize,
        status: TaskStatus,
        message: Option<u8>,
    },
    Finish {
        task: usize,
        status: TaskStatus,
        reason: EndReason,
        by: Option<usize>,
        payload: bool,
    },
    RequestCancel {
        task: usize,
        reason: EndReason,
        by: Option<usize>,
        give_up: i64,
    },
    /// `cancels_due` (every home) or `cancels_due_for(home)`.
    CancelsDue {
        home: Option<usize>,
        limit: usize,
    },
    NoteCancelAttempt {
        task: usize,
        next: i64,
    },
    NoteResultRead {
        task: usize,
    },
    /// A read-once result: `note_result_read`, `forget_payload`, then `get`.
    ReadOnce {
        task: usize,
    },
    ForgetPayload {
        task: usize,
    },
    PastDeadline {
        limit: usize,
    },
    /// The deadline sweep: `past_deadline`, then a `request_cancel` for each task listed.
    Expire,
    RenewIdentity {
        task: usize,
        lease: Option<i64>,
        delegation: Option<i64>,
    },
    /// `purge_expired` with `limit`, called again until fewer than `limit` come back.
    Purge {
        limit: usize,
    },
    ActiveFor(Filter),
    /// A revocation: `active_for`, then a `request_cancel` (revocation) for each task listed.
    Revoke(Filter),
    Heartbeat {
        via: usize,
        life: i64,
        address: bool,
    },
    Replica {
        replica: usize,
    },
    Orphaned {
        limit: usize,
    },
    TryLease {
        via: usize,
        life: i64,
    },
    /// `spend_budget` of decision `decision` in scope `scope` (of task `task`, if given) under
    /// grant `grant`; the cost budget's grant expires `cost_life` from now.
    Spend {
        grant: usize,
        scope: usize,
        decision: usize,
        task: Option<usize>,
        max_iterations: u32,
        window: Option<i64>,
        max_per_minute: u32,
        cost: u64,
        max_cost: Option<u64>,
        cost_life: i64,
    },
    /// The orphan sweep of replica `via`: the sweep lease; if granted, `orphaned` and a
    /// `finish` (failed, upstream lost) of each task listed.
    Sweep {
        via: usize,
        life: i64,
    },
}

/// The task (if any) an operation addresses.
pub fn task_of(op: &Op) -> Option<usize> {
    match op {
        Op::Confirm { task, .. }
        | Op::Release { task }
        | Op::WaitSettled { task }
        | Op::Get { task, .. }
        | Op::Observe { task, .. }
        | Op::Finish { task, .. }
        | Op::RequestCancel { task, .. }
        | Op::NoteCancelAttempt { task, .. }
        | Op::NoteResultRead { task }
        | Op::ReadOnce { task }
        | Op::ForgetPayload { task }
        | Op::RenewIdentity { task, .. } => Some(*task),
        Op::Spend { task, .. } => *task,
        _ => None,
    }
}

/// Given as the intent's pending message and give-up delay by the sweeps.
pub const SWEEP_GIVE_UP: i64 = 100;

pub fn pending_message(reason: EndReason) -> String {
    format!("cancelling ({})", reason.as_str())
}

/// The stored payload of a finish with `payload` set.
pub fn payload(status: TaskStatus, at: i64) -> Option<serde_json::Value> {
    match status {
        TaskStatus::Completed => {
            Some(json!({"content": [{"type": "text", "text": "ok"}], "at": at}))
        }
        TaskStatus::Failed => Some(json!({"code": -32603, "message": "failed", "at": at})),
        _ => None,
    }
}

impl Model {
    /// Applies `op`, leaving its answer in `self.expect`.
    pub fn apply(&mut self, op: &Op) {
        self.expect = self.step(op);
    }

    fn step(&mut self, op: &Op) -> Expect {
        let now = self.now;
        match *op {
            Op::Advance(ms) => {
                self.now += ms;
                Expect::Done
            }
            Op::Reserve {
                owner,
                binding,
                key,
                window,
                life,
                lease,
                delegation,
            } => {
                let k = self.next;
                self.next += 1;
                self.sweep_reservations();
                if let Some(key) = key
                    && let Some((holder, until)) = self.key_holder(owner, key)
                {
                    if until > now {
                        return match &self.entries[&holder] {
                            Entry::Reserved(_) => Expect::InFlight(holder),
                            Entry::Task(t) => Expect::Existing((holder, (**t).clone())),
                        };
                    }
                    self.clear_key(holder);
                }
                if let Some(scope) = self.exhausted(owner) {
                    return Expect::OverQuota(scope);
                }
                let held = Held {
                    owner,
                    binding,
                    key,
                    key_until: key.map(|_| now + window),
                    window,
                    expires_at: now + life,
                    lease_until: lease.map(|d| now + d),
                    delegated_until: delegation.map(|d| now + d),
                };
                self.entries.insert(k, Entry::Reserved(held));
                Expect::Reserved
            }
            Op::Confirm {
                task,
                upstream,
                age,
                status,
                ttl,
                deadline,
                via,
            } => {
                if status.is_terminal() {
                    return Expect::InvalidArgument;
                }
                let Some(Entry::Reserved(held)) = self.entries.get(&task).cloned() else {
                    return Expect::NoReservation;
                };
                let space = self.space(via);
                if let Some(holder) = self.upstream_holder(space, upstream) {
                    self.entries.remove(&task);
                    let existing = self.snap(holder).expect("holder");
                    // The same owner's task only under the same key (or none on both sides).
                    return if existing.1.owner == held.owner && existing.1.binding == held.binding {
                        Expect::SameOwner(existing)
                    } else {
                        Expect::HeldByAnotherOwner
                    };
                }
                let created_at = now - age;
                let t = Task {
                    owner: held.owner,
                    binding: held.binding,
                    upstream,
                    status,
                    message: None,
                    created_at,
                    last_updated_at: created_at,
                    ttl,
                    deadline_at: created_at + deadline,
                    ended: None,
                    reads: 0,
                    lease_until: held.lease_until,
                    delegated_until: held.delegated_until,
                    cancel: None,
                    home: via,
                    space,
                    key: held.key,
                    key_until: held.key_until.map(|u| u.max(created_at + held.window)),
                };
                self.entries.insert(task, Entry::Task(Box::new(t.clone())));
                Expect::New((task, t))
            }
            Op::Release { task } => {
                if matches!(self.entries.get(&task), Some(Entry::Reserved(_))) {
                    self.entries.remove(&task);
                }
                Expect::Done
            }
            Op::WaitSettled { .. } => Expect::Done,
            Op::Get { task, .. } => Expect::Record(self.snap(task)),
            Op::Observe {
                task,
                status,
                message,
            } => {
                if status.is_terminal() {
                    return Expect::InvalidArgument;
                }
                if let Some(t) = self.task_mut(task)
                    && t.active()
                {
                    t.status = status;
                    t.last_updated_at = now;
                    if t.cancel.is_none() {
                        t.message = message.map(|m| format!("progress {m}"));
                    }
                }
                Expect::Done
            }
            Op::Finish {
                task,
                status,
                reason,
                by,
                payload: with_payload,
            } => {
                if !status.is_terminal() {
                    return Expect::InvalidArgument;
                }
                self.finish(task, status, reason, by, with_payload)
            }
            Op::RequestCancel {
                task,
                reason,
                by,
                give_up,
            } => self.request_cancel(task, reason, by, give_up),
            Op::CancelsDue { home, limit } => {
                let due = self.cancels_due(home, limit);
                Expect::Due(due.into_iter().filter_map(|k| self.snap(k)).collect())
            }
            Op::NoteCancelAttempt { task, next } => {
                if let Some(c) = self.task_mut(task).and_then(|t| t.cancel.as_mut()) {
                    c.attempts += 1;
                    c.next_attempt_at = now + next;
                }
                Expect::Done
            }
            Op::NoteResultRead { task } => Expect::Count(self.note_read(task)),
            Op::ReadOnce { task } => {
                let reads = self.note_read(task);
                self.forget(task);
                Expect::Steps(vec![Expect::Count(reads), Expect::Record(self.snap(task))])
            }
            Op::ForgetPayload { task } => {
                self.forget(task);
                Expect::Done
            }
            Op::PastDeadline { limit } => {
                let mut due = self.past_deadline();
                due.truncate(limit);
                self.list(due)
            }
            Op::Expire => {
                let due = self.past_deadline();
                let mut steps = vec![self.list(due.clone())];
                for k in due {
                    let t = self.task(k).expect("listed");
                    let reason = if t.deadline_at <= now {
                        EndReason::Deadline
                    } else {
                        EndReason::IdentityLeaseExpired
                    };
                    steps.push(self.request_cancel(k, reason, None, SWEEP_GIVE_UP));
                }
                Expect::Steps(steps)
            }
            Op::RenewIdentity {
                task,
                lease,
                delegation,
            } => {
                let Some(t) = self.task_mut(task).filter(|t| t.active()) else {
                    return Expect::Flag(false);
                };
                let mut changed = false;
                for (stored, given) in [
                    (&mut t.lease_until, lease),
                    (&mut t.delegated_until, delegation),
                ] {
                    if let Some(d) = given
                        && stored.is_none_or(|s| now + d > s)
                    {
                        *stored = Some(now + d);
                        changed = true;
                    }
                }
                Expect::Flag(changed)
            }
            Op::Purge { .. } => {
                self.sweep_reservations();
                let gone: Vec<usize> = self
                    .tasks()
                    .filter(|(_, t)| t.created_at + t.ttl <= now)
                    .map(|(k, _)| k)
                    .collect();
                for k in &gone {
                    self.entries.remove(k);
                }
                self.uses.retain(|_, u| match u.task {
                    Some(k) => !gone.contains(&k),
                    None => u.at > now - BUDGET_USE_HORIZON_MS,
                });
                self.costs.retain(|_, (_, until)| *until > now);
                Expect::Purged(gone)
            }
            Op::ActiveFor(f) => self.list(self.active_for(&f)),
            Op::Revoke(f) => {
                let found = self.active_for(&f);
                let mut steps = vec![self.list(found.clone())];
                for k in found {
                    steps.push(self.request_cancel(k, EndReason::Revocation, None, SWEEP_GIVE_UP));
                }
                Expect::Steps(steps)
            }
            Op::Heartbeat { via, life, address } => {
                let beat = Beat {
                    address: address.then(|| super::sut::address(via)),
                    at: now,
                    expires_at: now + life,
                };
                self.replicas.insert(via, beat);
                Expect::Done
            }
            Op::Replica { replica } => {
                Expect::Replica(self.replicas.get(&replica).map(|b| (replica, b.clone())))
            }
            Op::Orphaned { limit } => {
                let mut gone = self.orphaned();
                gone.truncate(limit);
                self.list(gone)
            }
            Op::TryLease { via, life } => Expect::Flag(self.try_lease(via, life)),
            Op::Spend { .. } => Expect::Budget(self.spend(op)),
            Op::Sweep { via, life } => {
                if !self.try_lease(via, life) {
                    return Expect::Steps(vec![Expect::Flag(false)]);
                }
                let gone = self.orphaned();
                let mut steps = vec![Expect::Flag(true), self.list(gone.clone())];
                for k in gone {
                    steps.push(self.finish(
                        k,
                        TaskStatus::Failed,
                        EndReason::UpstreamLost,
                        None,
                        false,
                    ));
                }
                Expect::Steps(steps)
            }
        }
    }

    fn finish(
        &mut self,
        k: usize,
        status: TaskStatus,
        reason: EndReason,
        by: Option<usize>,
        with_payload: bool,
    ) -> Expect {
        let now = self.now;
        let Some(t) = self.task_mut(k) else {
            return Expect::NotFound;
        };
        if t.ended.is_some() {
            return Expect::AlreadyTerminal((k, t.clone()));
        }
        t.status = status;
        t.message = Some(format!("ended: {}", reason.as_str()));
        t.last_updated_at = now;
        t.cancel = None;
        t.ended = Some(End {
            reason,
            by,
            payload: if with_payload {
                payload(status, now)
            } else {
                None
            },
            at: now,
        });
        Expect::Applied((k, t.clone()))
    }

    fn request_cancel(
        &mut self,
        k: usize,
        reason: EndReason,
        by: Option<usize>,
        give_up: i64,
    ) -> Expect {
        if !reason.is_cancellation() || give_up < 0 {
            return Expect::InvalidArgument;
        }
        let now = self.now;
        let Some(t) = self.task_mut(k) else {
            return Expect::NotFound;
        };
        if t.ended.is_some() {
            return Expect::AlreadyTerminal((k, t.clone()));
        }
        if t.cancel.is_some() {
            return Expect::AlreadyRequested((k, t.clone()));
        }
        let message = pending_message(reason);
        t.message = Some(message.clone());
        t.last_updated_at = now;
        t.cancel = Some(Intent {
            reason,
            by,
            message,
            requested_at: now,
            give_up_at: now + give_up,
            attempts: 0,
            next_attempt_at: now,
        });
        Expect::Recorded((k, t.clone()))
    }

    fn note_read(&mut self, k: usize) -> u32 {
        match self.task_mut(k) {
            Some(t) => {
                t.reads += 1;
                t.reads
            }
            None => 0,
        }
    }

    fn forget(&mut self, k: usize) {
        if let Some(end) = self.task_mut(k).and_then(|t| t.ended.as_mut()) {
            end.payload = None;
        }
    }

    fn spend(&mut self, op: &Op) -> BudgetOutcome {
        let Op::Spend {
            grant,
            scope,
            decision,
            task,
            max_iterations,
            window,
            max_per_minute,
            cost,
            max_cost,
            cost_life,
        } = *op
        else {
            unreachable!("a spend")
        };
        let now = self.now;
        if self.uses.get(&decision).is_some_and(|u| u.grant == grant) {
            return BudgetOutcome::Repeated;
        }
        let of_grant = || self.uses.values().filter(|u| u.grant == grant);
        let since = window.map_or(i64::MIN, |w| now - w);
        let iterations = of_grant()
            .filter(|u| u.scope == scope && u.at > since)
            .count() as u32;
        if iterations >= max_iterations {
            return BudgetOutcome::IterationBudget;
        }
        let last_minute = of_grant().filter(|u| u.at > now - 60_000).count() as u32;
        if last_minute >= max_per_minute {
            return BudgetOutcome::Rate;
        }
        let cost_left = match max_cost {
            None => None,
            Some(max) => {
                let (spent, until) = self.costs.get(&grant).copied().unwrap_or((0, i64::MIN));
                if spent + cost > max {
                    return BudgetOutcome::CostBudget;
                }
                self.costs
                    .insert(grant, (spent + cost, until.max(now + cost_life)));
                Some(max - spent - cost)
            }
        };
        let used = Use {
            grant,
            scope,
            task,
            at: now,
        };
        self.uses.insert(decision, used);
        BudgetOutcome::Spent {
            iterations_left: max_iterations - iterations - 1,
            per_minute_left: max_per_minute - last_minute - 1,
            cost_left,
        }
    }

    fn try_lease(&mut self, via: usize, life: i64) -> bool {
        let granted = self
            .lease
            .is_none_or(|(holder, until)| holder == via || until <= self.now);
        if granted {
            self.lease = Some((via, self.now + life));
        }
        granted
    }
}
