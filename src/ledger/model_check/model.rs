//! The reference model of the ledger: the documented semantics of [`TaskLedger`] as a plain
//! in-memory state machine, with the answer each operation must give.
//!
//! Everything is in the model's own small vocabulary: tasks are the numbers of the
//! reservations that made them (`k`), owners, keys, key bindings, upstream IDs and replicas are
//! indexes into short tables, so random sequences collide often. [`super::ops`] turns these
//! into real ledger values and calls.
//!
//! [`TaskLedger`]: crate::ledger::TaskLedger

use std::collections::BTreeMap;

use crate::ledger::{BudgetOutcome, EndReason, QuotaScope, TaskStatus};

/// The model's clock starts here (2030) and only moves forward.
pub const T0: i64 = 1_900_000_000_000;
/// Replicas (ledger instances on the same storage); ops run through one of them.
pub const REPLICAS: usize = 2;
/// Idempotency keys per owner.
pub const KEYS: usize = 2;
/// Distinct upstream task IDs servers hand out.
pub const UPSTREAMS: usize = 3;
/// Keys a creating token may be bound to (besides none): a DPoP key and a client certificate
/// of the same thumbprint, so that only the kind of key tells them apart.
pub const BINDINGS: usize = 2;

/// Owners as (issuer, subject, tenant, client) indexes into [`ISSUERS`], [`SUBJECTS`],
/// [`TENANTS`] and [`CLIENTS`]: owners 0 and 1 share issuer, tenant and client; owner 2 has
/// the same tenant name and subject as owner 0 under another issuer and no client; owner 3
/// has no tenant.
pub const OWNERS: [(usize, usize, usize, usize); 4] =
    [(0, 0, 0, 0), (0, 1, 0, 0), (1, 0, 0, 2), (0, 2, 1, 1)];
pub const ISSUERS: [&str; 2] = ["a", "b"];
pub const SUBJECTS: [&str; 3] = ["s0", "s1", "s2"];
pub const TENANTS: [&str; 2] = ["t0", ""];
pub const CLIENTS: [&str; 3] = ["c0", "c1", ""];

/// The quotas of one case (fixed for the case, so "never exceeded" is checkable at any time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub principal: u32,
    pub tenant: u32,
    pub client: u32,
    pub server: u32,
}

/// A reservation not yet confirmed, released or swept.
#[derive(Clone, Debug, PartialEq)]
pub struct Held {
    pub owner: usize,
    /// The key the creating token was bound to, if any (an index below [`BINDINGS`]).
    pub binding: Option<usize>,
    pub key: Option<usize>,
    /// Until when the key maps to this reservation (and later its task).
    pub key_until: Option<i64>,
    pub window: i64,
    pub expires_at: i64,
    pub lease_until: Option<i64>,
    pub delegated_until: Option<i64>,
}

/// A pending cancellation.
#[derive(Clone, Debug, PartialEq)]
pub struct Intent {
    pub reason: EndReason,
    pub by: Option<usize>,
    pub message: String,
    pub requested_at: i64,
    pub give_up_at: i64,
    pub attempts: u32,
    pub next_attempt_at: i64,
}

/// How a terminal task ended.
#[derive(Clone, Debug, PartialEq)]
pub struct End {
    pub reason: EndReason,
    pub by: Option<usize>,
    pub payload: Option<serde_json::Value>,
    pub at: i64,
}

/// A confirmed task.
#[derive(Clone, Debug, PartialEq)]
pub struct Task {
    pub owner: usize,
    pub binding: Option<usize>,
    pub upstream: usize,
    pub status: TaskStatus,
    pub message: Option<String>,
    pub created_at: i64,
    pub last_updated_at: i64,
    pub ttl: i64,
    pub deadline_at: i64,
    pub ended: Option<End>,
    pub reads: u32,
    pub lease_until: Option<i64>,
    pub delegated_until: Option<i64>,
    pub cancel: Option<Intent>,
    pub home: usize,
    /// The replica whose space of upstream IDs holds `upstream` (per-replica server state on
    /// a backend that keeps replicas' spaces apart); `None`: the server's one space.
    pub space: Option<usize>,
    pub key: Option<usize>,
    pub key_until: Option<i64>,
}

impl Task {
    pub fn active(&self) -> bool {
        self.ended.is_none()
    }
}

/// One reservation's fate.
#[derive(Clone, Debug, PartialEq)]
pub enum Entry {
    Reserved(Held),
    Task(Box<Task>),
}

/// A replica's last heartbeat.
#[derive(Clone, Debug, PartialEq)]
pub struct Beat {
    pub address: Option<String>,
    pub at: i64,
    pub expires_at: i64,
}

/// One recorded use of an exception's budgets (by decision: a decision is recorded once, under
/// the grant it was last spent under).
#[derive(Clone, Debug, PartialEq)]
pub struct Use {
    pub grant: usize,
    pub scope: usize,
    pub task: Option<usize>,
    pub at: i64,
}

/// A task as an answer shows it: its number and state at that moment.
pub type Snap = (usize, Task);

/// What an operation must answer, in model terms ([`super::ops`] renders it).
#[derive(Clone, Debug, PartialEq)]
pub enum Expect {
    Done,
    NoReservation,
    InvalidArgument,
    Reserved,
    Existing(Snap),
    InFlight(usize),
    OverQuota(QuotaScope),
    New(Snap),
    SameOwner(Snap),
    HeldByAnotherOwner,
    Record(Option<Snap>),
    Applied(Snap),
    AlreadyTerminal(Snap),
    NotFound,
    Recorded(Snap),
    AlreadyRequested(Snap),
    Due(Vec<Snap>),
    Count(u32),
    Flag(bool),
    Tasks(Vec<Snap>),
    Purged(Vec<usize>),
    Replica(Option<(usize, Beat)>),
    Budget(BudgetOutcome),
    /// A composite operation's answers, in order.
    Steps(Vec<Expect>),
}

/// The reference state.
#[derive(Clone, Debug, PartialEq)]
pub struct Model {
    pub limits: Limits,
    /// The server keeps task state per replica: confirms go through `confirm_in_replica`.
    pub per_replica: bool,
    /// The backend keeps the replicas' upstream ID spaces apart (set from the backend before a
    /// case runs: PostgreSQL does, one SQLite file is one space).
    pub spaces: bool,
    pub now: i64,
    /// Reservations made so far (the next one is number `next`).
    pub next: usize,
    /// Reservations and tasks still stored, by number.
    pub entries: BTreeMap<usize, Entry>,
    pub replicas: BTreeMap<usize, Beat>,
    /// The sweep lease: holder and until.
    pub lease: Option<(usize, i64)>,
    /// Budget uses by decision, and each grant's spent cost with how long it is kept.
    pub uses: BTreeMap<usize, Use>,
    pub costs: BTreeMap<usize, (u64, i64)>,
    /// The answer of the last operation applied.
    pub expect: Expect,
}

impl Model {
    pub fn new(limits: Limits, per_replica: bool) -> Self {
        Self {
            limits,
            per_replica,
            spaces: false,
            now: T0,
            next: 0,
            entries: BTreeMap::new(),
            replicas: BTreeMap::new(),
            lease: None,
            uses: BTreeMap::new(),
            costs: BTreeMap::new(),
            expect: Expect::Done,
        }
    }

    pub fn task(&self, k: usize) -> Option<&Task> {
        match self.entries.get(&k) {
            Some(Entry::Task(t)) => Some(t),
            _ => None,
        }
    }

    pub fn task_mut(&mut self, k: usize) -> Option<&mut Task> {
        match self.entries.get_mut(&k) {
            Some(Entry::Task(t)) => Some(t),
            _ => None,
        }
    }

    /// Whether `k` is a reservation still stored (what `wait_settled` waits on).
    pub fn pending(&self, k: usize) -> bool {
        matches!(self.entries.get(&k), Some(Entry::Reserved(_)))
    }

    pub fn snap(&self, k: usize) -> Option<Snap> {
        self.task(k).map(|t| (k, t.clone()))
    }

    fn snaps(&self, ks: impl IntoIterator<Item = usize>) -> Vec<Snap> {
        ks.into_iter().filter_map(|k| self.snap(k)).collect()
    }

    /// Confirmed tasks, by number.
    pub fn tasks(&self) -> impl Iterator<Item = (usize, &Task)> {
        self.entries.iter().filter_map(|(k, e)| match e {
            Entry::Task(t) => Some((*k, &**t)),
            Entry::Reserved(_) => None,
        })
    }

    /// Owners of what holds a quota slot now: live reservations and non-terminal tasks.
    /// (Expired reservations not yet swept never count: every quota check sweeps first.)
    pub fn slot_holders(&self) -> Vec<usize> {
        self.entries
            .values()
            .filter_map(|e| match e {
                Entry::Reserved(h) if h.expires_at > self.now => Some(h.owner),
                Entry::Task(t) if t.active() => Some(t.owner),
                _ => None,
            })
            .collect()
    }

    /// Deletes expired reservations (as `reserve` and `purge_expired` do first).
    pub fn sweep_reservations(&mut self) {
        let now = self.now;
        self.entries
            .retain(|_, e| !matches!(e, Entry::Reserved(h) if h.expires_at <= now));
    }

    /// The quota a new reservation of `owner` would exceed, in the documented order.
    pub fn exhausted(&self, owner: usize) -> Option<QuotaScope> {
        let (iss, sub, ten, cli) = OWNERS[owner];
        let holders = self.slot_holders();
        let count = |f: &dyn Fn(usize) -> bool| holders.iter().filter(|o| f(**o)).count() as u32;
        let l = self.limits;
        if count(&|o| OWNERS[o].0 == iss && OWNERS[o].1 == sub) >= l.principal {
            return Some(QuotaScope::Principal);
        }
        if !TENANTS[ten].is_empty()
            && count(&|o| OWNERS[o].0 == iss && OWNERS[o].2 == ten) >= l.tenant
        {
            return Some(QuotaScope::Tenant);
        }
        if !CLIENTS[cli].is_empty()
            && count(&|o| OWNERS[o].0 == iss && OWNERS[o].3 == cli) >= l.client
        {
            return Some(QuotaScope::Client);
        }
        if count(&|_| true) >= l.server {
            return Some(QuotaScope::Server);
        }
        None
    }

    /// The stored entry holding idempotency key `key` of `owner`, with its window's end.
    pub fn key_holder(&self, owner: usize, key: usize) -> Option<(usize, i64)> {
        self.entries.iter().find_map(|(k, e)| {
            let (o, kk, until) = match e {
                Entry::Reserved(h) => (h.owner, h.key, h.key_until),
                Entry::Task(t) => (t.owner, t.key, t.key_until),
            };
            (o == owner && kk == Some(key)).then(|| (*k, until.unwrap_or(i64::MIN)))
        })
    }

    /// Forgets a lapsed key: the entry no longer maps it.
    pub fn clear_key(&mut self, k: usize) {
        match self.entries.get_mut(&k) {
            Some(Entry::Reserved(h)) => (h.key, h.key_until) = (None, None),
            Some(Entry::Task(t)) => (t.key, t.key_until) = (None, None),
            None => {}
        }
    }

    /// The space a confirmation through replica `via` records its upstream ID in.
    pub fn space(&self, via: usize) -> Option<usize> {
        (self.per_replica && self.spaces).then_some(via)
    }

    /// The confirmed task holding upstream ID `upstream` in `space`, if one is retained.
    pub fn upstream_holder(&self, space: Option<usize>, upstream: usize) -> Option<usize> {
        self.tasks()
            .find(|(_, t)| t.space == space && t.upstream == upstream)
            .map(|(k, _)| k)
    }

    /// Non-terminal tasks past their deadline or identity lease without a pending intent,
    /// by the earlier of the two, then number.
    pub fn past_deadline(&self) -> Vec<usize> {
        let now = self.now;
        let mut due: Vec<(i64, usize)> = self
            .tasks()
            .filter(|(_, t)| t.active() && t.cancel.is_none())
            .filter(|(_, t)| t.deadline_at <= now || t.lease_until.is_some_and(|l| l <= now))
            .map(|(k, t)| (t.deadline_at.min(t.lease_until.unwrap_or(t.deadline_at)), k))
            .collect();
        due.sort();
        due.into_iter().map(|(_, k)| k).collect()
    }

    /// Non-terminal tasks whose home replica never beat or whose beat expired, oldest first.
    pub fn orphaned(&self) -> Vec<usize> {
        let mut gone: Vec<(i64, usize)> = self
            .tasks()
            .filter(|(_, t)| t.active())
            .filter(|(_, t)| {
                self.replicas
                    .get(&t.home)
                    .is_none_or(|b| b.expires_at <= self.now)
            })
            .map(|(k, t)| (t.created_at, k))
            .collect();
        gone.sort();
        gone.into_iter().map(|(_, k)| k).collect()
    }

    /// Pending intents due now (on tasks homed on `home`, if given), in the documented order.
    pub fn cancels_due(&self, home: Option<usize>, limit: usize) -> Vec<usize> {
        let mut due: Vec<(i64, i64, usize)> = self
            .tasks()
            .filter(|(_, t)| t.active() && home.is_none_or(|h| t.home == h))
            .filter_map(|(k, t)| t.cancel.as_ref().map(|c| (c, k)))
            .filter(|(c, _)| c.next_attempt_at <= self.now)
            .map(|(c, k)| (c.next_attempt_at, c.requested_at, k))
            .collect();
        due.sort();
        due.into_iter().take(limit).map(|(_, _, k)| k).collect()
    }

    /// Non-terminal tasks matching a revocation filter, by creation then number.
    pub fn active_for(&self, f: &Filter) -> Vec<usize> {
        let mut found: Vec<(i64, usize)> = self
            .tasks()
            .filter(|(_, t)| t.active() && f.matches(t.owner))
            .map(|(k, t)| (t.created_at, k))
            .collect();
        found.sort();
        found.into_iter().map(|(_, k)| k).collect()
    }

    pub fn list(&self, ks: Vec<usize>) -> Expect {
        Expect::Tasks(self.snaps(ks))
    }
}

/// A revocation filter: an issuer, narrowed by subject, tenant and client (indexes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Filter {
    pub issuer: usize,
    pub subject: Option<usize>,
    pub tenant: Option<usize>,
    pub client: Option<usize>,
}

impl Filter {
    pub fn matches(&self, owner: usize) -> bool {
        let (iss, sub, ten, cli) = OWNERS[owner];
        iss == self.issuer
            && self.subject.is_none_or(|s| SUBJECTS[s] == SUBJECTS[sub])
            && self.tenant.is_none_or(|t| TENANTS[t] == TENANTS[ten])
            && self.client.is_none_or(|c| CLIENTS[c] == CLIENTS[cli])
    }
}
