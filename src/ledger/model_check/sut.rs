//! The system under test: runs a model [`Op`] on real ledgers, and renders the model's
//! [`Expect`] as the real answer it stands for, so the two compare with `==`.
//!
//! Task IDs and the server's name carry a random nonce of the case, so cases can share one
//! PostgreSQL database; everything else (owners, keys, upstream IDs, replica and lease names)
//! is the same in every case, so a query not scoped by server would show.

use std::collections::HashMap;

use super::model::{CLIENTS, Expect, Filter, ISSUERS, Model, OWNERS, SUBJECTS, Snap, T0, TENANTS};
use super::ops::{Op, SWEEP_GIVE_UP, pending_message};
use crate::ledger::{
    BudgetOutcome, BudgetSpend, CancelIntent, CancelRequest, Confirmation, Confirmed, Ending,
    Finish, FinishOutcome, IdempotencyClaim, KeyBinding, LedgerError, Owner, PendingCancel,
    PrincipalFilter, PurgedTask, QuotaLimits, ReplicaBeat, ReplicaInfo, Reservation,
    ReserveOutcome, TaskId, TaskLedger, TaskRecord, TaskStatus,
};

/// How long an operation that must return at once may take before the case fails as hung.
const HANG: std::time::Duration = std::time::Duration::from_secs(30);

/// Where replica `r` says its hop listens.
pub fn address(r: usize) -> String {
    format!("10.0.0.{r}:15021")
}

pub fn replica(r: usize) -> String {
    format!("r{r}")
}

/// A ledger's answer to one operation, in real types.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    Done,
    NoReservation,
    InvalidArgument,
    Reserve(ReserveOutcome),
    Confirm(Confirmed),
    Record(Option<TaskRecord>),
    Finish(FinishOutcome),
    Cancel(CancelRequest),
    Due(Vec<PendingCancel>),
    Count(u32),
    Flag(bool),
    Tasks(Vec<TaskRecord>),
    Purged(Vec<PurgedTask>),
    Replica(Option<ReplicaInfo>),
    Budget(BudgetOutcome),
    Steps(Vec<Answer>),
}

/// A case's names.
pub struct Names {
    nonce: String,
}

impl Names {
    pub fn fresh() -> Self {
        let mut bytes = [0u8; 6];
        getrandom::fill(&mut bytes).expect("OS random number generator");
        Self {
            nonce: hex::encode(bytes),
        }
    }

    pub fn server(&self) -> String {
        format!("model/{}", self.nonce)
    }

    pub fn id(&self, k: usize) -> TaskId {
        TaskId::from_string(format!("task-{}-{k:04}", self.nonce))
    }

    /// Upstream IDs, issuers, subjects and keys are the same in every case: cases sharing a
    /// PostgreSQL database are different servers, which must not see each other's.
    fn upstream(&self, u: usize) -> String {
        format!("upstream-{u}")
    }

    pub fn owner(&self, o: usize) -> Owner {
        let (iss, sub, ten, cli) = OWNERS[o];
        Owner {
            issuer: self.issuer(iss),
            subject: SUBJECTS[sub].into(),
            tenant: TENANTS[ten].into(),
            client: CLIENTS[cli].into(),
        }
    }

    fn issuer(&self, i: usize) -> String {
        format!("https://{}.test/", ISSUERS[i])
    }

    fn key(o: usize, key: usize) -> [u8; 32] {
        let mut hash = [0u8; 32];
        hash[0] = o as u8;
        hash[1] = key as u8;
        hash
    }

    pub fn filter(&self, f: &Filter) -> PrincipalFilter {
        PrincipalFilter {
            issuer: self.issuer(f.issuer),
            subject: f.subject.map(|s| SUBJECTS[s].into()),
            tenant: f.tenant.map(|t| TENANTS[t].into()),
            client: f.client.map(|c| CLIENTS[c].into()),
        }
    }

    /// The record a model task stands for.
    pub fn record(&self, (k, t): &Snap) -> TaskRecord {
        TaskRecord {
            id: self.id(*k),
            upstream_id: self.upstream(t.upstream),
            owner: self.owner(t.owner),
            tool: "reports.generate".into(),
            scopes: vec!["tasks".into()],
            status: t.status,
            status_message: t.message.clone(),
            created_at: t.created_at,
            last_updated_at: t.last_updated_at,
            ttl_ms: t.ttl,
            deadline_at: t.deadline_at,
            poll_interval_ms: Some(1_000),
            ended: t.ended.as_ref().map(|e| Ending {
                reason: e.reason,
                by: e.by.map(|o| self.owner(o)),
                payload: e.payload.clone(),
                at: e.at,
            }),
            result_reads: t.reads,
            token_issued_at: Some(T0 / 1000),
            home: replica(t.home),
            correlation_id: format!("request-{k}"),
            object: k.is_multiple_of(2).then(|| format!("projects/p-{k}")),
            lease_until: t.lease_until,
            delegated_until: t.delegated_until,
            cancel: t.cancel.as_ref().map(|c| CancelIntent {
                reason: c.reason,
                by: c.by.map(|o| self.owner(o)),
                pending_message: c.message.clone(),
                requested_at: c.requested_at,
                give_up_at: c.give_up_at,
                trace: intent_trace(c.reason),
            }),
            trace: task_trace(*k),
            binding: t.binding.map(key_binding),
        }
    }

    fn boxed(&self, snap: &Snap) -> Box<TaskRecord> {
        Box::new(self.record(snap))
    }

    fn pending(&self, snap: &Snap) -> PendingCancel {
        let record = self.record(snap);
        let c = snap.1.cancel.as_ref().expect("a due task has an intent");
        PendingCancel {
            intent: record.cancel.clone().expect("rendered intent"),
            record,
            attempts: c.attempts,
            next_attempt_at: c.next_attempt_at,
        }
    }

    /// The answer the model expects.
    pub fn render(&self, e: &Expect) -> Answer {
        match e {
            Expect::Done => Answer::Done,
            Expect::NoReservation => Answer::NoReservation,
            Expect::InvalidArgument => Answer::InvalidArgument,
            Expect::Reserved => Answer::Reserve(ReserveOutcome::Reserved),
            Expect::Existing(s) => Answer::Reserve(ReserveOutcome::Existing(self.boxed(s))),
            Expect::InFlight(k) => Answer::Reserve(ReserveOutcome::InFlight(self.id(*k))),
            Expect::OverQuota(q) => Answer::Reserve(ReserveOutcome::OverQuota(*q)),
            Expect::New(s) => Answer::Confirm(Confirmed::New(self.record(s))),
            Expect::SameOwner(s) => Answer::Confirm(Confirmed::SameOwner(self.record(s))),
            Expect::HeldByAnotherOwner => Answer::Confirm(Confirmed::HeldByAnotherOwner),
            Expect::Record(s) => Answer::Record(s.as_ref().map(|s| self.record(s))),
            Expect::Applied(s) => Answer::Finish(FinishOutcome::Applied(self.boxed(s))),
            Expect::AlreadyTerminal(s) => {
                // The same model answer serves `finish` and `request_cancel`; the caller knows
                // which (see `expect_for`).
                Answer::Finish(FinishOutcome::AlreadyTerminal(self.boxed(s)))
            }
            Expect::NotFound => Answer::Finish(FinishOutcome::NotFound),
            Expect::Recorded(s) => Answer::Cancel(CancelRequest::Recorded(self.boxed(s))),
            Expect::AlreadyRequested(s) => {
                Answer::Cancel(CancelRequest::AlreadyRequested(self.boxed(s)))
            }
            Expect::Due(snaps) => Answer::Due(snaps.iter().map(|s| self.pending(s)).collect()),
            Expect::Count(n) => Answer::Count(*n),
            Expect::Flag(b) => Answer::Flag(*b),
            Expect::Tasks(snaps) => Answer::Tasks(snaps.iter().map(|s| self.record(s)).collect()),
            Expect::Purged(ks) => Answer::Purged(
                ks.iter()
                    .map(|k| PurgedTask {
                        id: self.id(*k),
                        correlation_id: format!("request-{k}"),
                    })
                    .collect(),
            ),
            Expect::Replica(r) => Answer::Replica(r.as_ref().map(|(r, b)| ReplicaInfo {
                replica: replica(*r),
                address: b.address.clone(),
                last_beat_at: b.at,
                expires_at: b.expires_at,
            })),
            Expect::Budget(b) => Answer::Budget(*b),
            Expect::Steps(steps) => Answer::Steps(steps.iter().map(|s| self.render(s)).collect()),
        }
    }

    /// [`Names::render`] for the operation that produced `e`: cancellation answers
    /// (`AlreadyTerminal`, `NotFound`) are [`CancelRequest`]s.
    pub fn expect_for(&self, op: &Op, e: &Expect) -> Answer {
        let cancel = |e: &Expect| match e {
            Expect::AlreadyTerminal(s) => {
                Answer::Cancel(CancelRequest::AlreadyTerminal(self.boxed(s)))
            }
            Expect::NotFound => Answer::Cancel(CancelRequest::NotFound),
            other => self.render(other),
        };
        match (op, e) {
            (Op::RequestCancel { .. }, e) => cancel(e),
            (Op::Expire | Op::Revoke(_), Expect::Steps(steps)) => Answer::Steps(
                steps
                    .iter()
                    .enumerate()
                    .map(|(i, s)| if i == 0 { self.render(s) } else { cancel(s) })
                    .collect(),
            ),
            _ => self.render(e),
        }
    }
}

fn answer<T>(
    result: crate::ledger::Result<T>,
    f: impl FnOnce(T) -> Answer,
) -> Result<Answer, String> {
    match result {
        Ok(v) => Ok(f(v)),
        Err(LedgerError::NoReservation) => Ok(Answer::NoReservation),
        Err(LedgerError::InvalidArgument(_)) => Ok(Answer::InvalidArgument),
        Err(e) => Err(format!("ledger error: {e}")),
    }
}

fn intent(
    reason: crate::ledger::EndReason,
    by: Option<Owner>,
    now: i64,
    give_up: i64,
) -> CancelIntent {
    CancelIntent {
        reason,
        by,
        pending_message: pending_message(reason),
        requested_at: now,
        give_up_at: now + give_up,
        trace: intent_trace(reason),
    }
}

/// Key binding `b` of the model: binding 0 is a DPoP key, binding 1 a client certificate with
/// the same thumbprint (the kind of key alone must keep them apart).
fn key_binding(b: usize) -> KeyBinding {
    let thumbprint = "NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs".to_owned();
    match b {
        0 => KeyBinding::Dpop { jkt: thumbprint },
        _ => KeyBinding::Mtls {
            x5t_s256: thumbprint,
        },
    }
}

/// The trace context task `k` is created under: every other task has none (created while
/// traces were not exported).
fn task_trace(k: usize) -> Option<String> {
    k.is_multiple_of(2)
        .then(|| format!("00-{:032x}-{:016x}-01", k + 1, k + 1))
}

/// The trace context an intent for `reason` is asked under: one per reason, so the first
/// intent's (the one that wins) is told apart from a later one's.
fn intent_trace(reason: crate::ledger::EndReason) -> Option<String> {
    Some(format!("00-{:032x}-{:016x}-00", 0xc0de, reason as u64 + 1))
}

/// Runs `op` on `ledgers` (one per replica); `model` is the reference state after `op`.
pub async fn execute(
    ledgers: &[Box<dyn TaskLedger>],
    names: &Names,
    model: &Model,
    op: &Op,
) -> Result<Answer, String> {
    let l = &*ledgers[0];
    let now = model.now;
    let a = match *op {
        Op::Advance(_) => Answer::Done,
        Op::Reserve {
            owner,
            binding,
            key,
            window,
            life,
            lease,
            delegation,
        } => {
            // The model counted this reservation already: it is the last one made.
            let k = model.next - 1;
            let r = Reservation {
                id: names.id(k),
                owner: names.owner(owner),
                tool: "reports.generate".into(),
                scopes: vec!["tasks".into()],
                idempotency: key.map(|key| IdempotencyClaim {
                    key_hash: Names::key(owner, key),
                    window_ms: window,
                }),
                limits: QuotaLimits {
                    per_principal: model.limits.principal,
                    per_tenant: model.limits.tenant,
                    per_client: model.limits.client,
                    per_server: model.limits.server,
                },
                now,
                reservation_expires_at: now + life,
                token_issued_at: Some(T0 / 1000),
                correlation_id: format!("request-{k}"),
                object: k.is_multiple_of(2).then(|| format!("projects/p-{k}")),
                lease_until: lease.map(|d| now + d),
                delegated_until: delegation.map(|d| now + d),
                trace: task_trace(k),
                binding: binding.map(key_binding),
            };
            answer(l.reserve(r).await, Answer::Reserve)?
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
            let c = Confirmation {
                upstream_id: names.upstream(upstream),
                status,
                status_message: None,
                created_at: now - age,
                ttl_ms: ttl,
                deadline_at: now - age + deadline,
                poll_interval_ms: Some(1_000),
            };
            let (ledger, id) = (&ledgers[via], names.id(task));
            let confirmed = if model.per_replica {
                ledger.confirm_in_replica(&id, c).await
            } else {
                ledger.confirm(&id, c).await
            };
            answer(confirmed, Answer::Confirm)?
        }
        Op::Release { task } => answer(l.release(&names.id(task)).await, |()| Answer::Done)?,
        Op::WaitSettled { task } => {
            // Not pending, so it must return at once; the timeout only keeps a defect from
            // hanging the run.
            let settled = tokio::time::timeout(HANG, l.wait_settled(&names.id(task))).await;
            let settled = settled.map_err(|_| "wait_settled on a settled ID did not return")?;
            answer(settled, |()| Answer::Done)?
        }
        Op::Get { task, via } => answer(ledgers[via].get(&names.id(task)).await, Answer::Record)?,
        Op::Observe {
            task,
            status,
            message,
        } => {
            let message = message.map(|m| format!("progress {m}"));
            answer(
                l.observe(&names.id(task), status, message, now).await,
                |()| Answer::Done,
            )?
        }
        Op::Finish {
            task,
            status,
            reason,
            by,
            payload,
        } => {
            let f = finishing(names, status, reason, by, payload, now);
            answer(l.finish(&names.id(task), f).await, Answer::Finish)?
        }
        Op::RequestCancel {
            task,
            reason,
            by,
            give_up,
        } => {
            let i = intent(reason, by.map(|o| names.owner(o)), now, give_up);
            answer(l.request_cancel(&names.id(task), i).await, Answer::Cancel)?
        }
        Op::CancelsDue { home, limit } => {
            let due = match home {
                None => l.cancels_due(now, limit).await,
                Some(h) => l.cancels_due_for(&replica(h), now, limit).await,
            };
            answer(due, Answer::Due)?
        }
        Op::NoteCancelAttempt { task, next } => answer(
            l.note_cancel_attempt(&names.id(task), now + next).await,
            |()| Answer::Done,
        )?,
        Op::NoteResultRead { task } => {
            answer(l.note_result_read(&names.id(task)).await, Answer::Count)?
        }
        Op::ReadOnce { task } => {
            let id = names.id(task);
            let reads = answer(l.note_result_read(&id).await, Answer::Count)?;
            answer(l.forget_payload(&id).await, |()| Answer::Done)?;
            let record = answer(l.get(&id).await, Answer::Record)?;
            Answer::Steps(vec![reads, record])
        }
        Op::ForgetPayload { task } => {
            answer(l.forget_payload(&names.id(task)).await, |()| Answer::Done)?
        }
        Op::PastDeadline { limit } => answer(l.past_deadline(now, limit).await, Answer::Tasks)?,
        Op::Expire => {
            let due = l
                .past_deadline(now, 1_000)
                .await
                .map_err(|e| e.to_string())?;
            let mut steps = vec![Answer::Tasks(due.clone())];
            for t in due {
                let reason = if t.deadline_at <= now {
                    crate::ledger::EndReason::Deadline
                } else {
                    crate::ledger::EndReason::IdentityLeaseExpired
                };
                let i = intent(reason, None, now, SWEEP_GIVE_UP);
                steps.push(answer(l.request_cancel(&t.id, i).await, Answer::Cancel)?);
            }
            Answer::Steps(steps)
        }
        Op::RenewIdentity {
            task,
            lease,
            delegation,
        } => answer(
            l.renew_identity(
                &names.id(task),
                lease.map(|d| now + d),
                delegation.map(|d| now + d),
            )
            .await,
            Answer::Flag,
        )?,
        Op::Purge { limit } => {
            let mut purged = Vec::new();
            loop {
                let batch = l
                    .purge_expired(now, limit)
                    .await
                    .map_err(|e| e.to_string())?;
                let (n, last) = (batch.len(), batch.len() < limit);
                if n > limit {
                    return Err(format!("purge_expired deleted {n} tasks, limit {limit}"));
                }
                purged.extend(batch);
                if last {
                    break;
                }
            }
            purged.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
            Answer::Purged(purged)
        }
        Op::ActiveFor(f) => answer(l.active_for(&names.filter(&f)).await, Answer::Tasks)?,
        Op::Revoke(f) => {
            let found = l
                .active_for(&names.filter(&f))
                .await
                .map_err(|e| e.to_string())?;
            let mut steps = vec![Answer::Tasks(found.clone())];
            for t in found {
                let i = intent(
                    crate::ledger::EndReason::Revocation,
                    None,
                    now,
                    SWEEP_GIVE_UP,
                );
                steps.push(answer(l.request_cancel(&t.id, i).await, Answer::Cancel)?);
            }
            Answer::Steps(steps)
        }
        Op::Heartbeat {
            via,
            life,
            address: with_address,
        } => {
            let beat = ReplicaBeat {
                address: with_address.then(|| address(via)),
                now,
                expires_at: now + life,
            };
            answer(ledgers[via].heartbeat(&beat).await, |()| Answer::Done)?
        }
        Op::Replica { replica: r } => answer(l.replica(&replica(r)).await, Answer::Replica)?,
        Op::Orphaned { limit } => answer(l.orphaned(now, limit).await, Answer::Tasks)?,
        Op::TryLease { via, life } => answer(
            ledgers[via]
                .try_lease("sweep", &replica(via), now, now + life)
                .await,
            Answer::Flag,
        )?,
        Op::Spend {
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
        } => {
            let spend = BudgetSpend {
                exception: "ns/exception".into(),
                grant: format!("grant-{grant}"),
                scope: format!("scope-{scope}"),
                decision: format!("decision-{decision}"),
                task: task.map(|k| names.id(k)),
                max_iterations,
                iteration_window_ms: window,
                max_per_minute,
                cost,
                max_cost,
                cost_until: now + cost_life,
                now,
            };
            answer(l.spend_budget(&spend).await, Answer::Budget)?
        }
        Op::Sweep { via, life } => {
            let ledger = &*ledgers[via];
            let granted = ledger
                .try_lease("sweep", &replica(via), now, now + life)
                .await
                .map_err(|e| e.to_string())?;
            let mut steps = vec![Answer::Flag(granted)];
            if granted {
                let gone = ledger
                    .orphaned(now, 1_000)
                    .await
                    .map_err(|e| e.to_string())?;
                steps.push(Answer::Tasks(gone.clone()));
                for t in gone {
                    let f = finishing(
                        names,
                        TaskStatus::Failed,
                        crate::ledger::EndReason::UpstreamLost,
                        None,
                        false,
                        now,
                    );
                    steps.push(answer(ledger.finish(&t.id, f).await, Answer::Finish)?);
                }
            }
            Answer::Steps(steps)
        }
    };
    Ok(a)
}

fn finishing(
    names: &Names,
    status: TaskStatus,
    reason: crate::ledger::EndReason,
    by: Option<usize>,
    with_payload: bool,
    now: i64,
) -> Finish {
    Finish {
        status,
        status_message: Some(format!("ended: {}", reason.as_str())),
        ending: Ending {
            reason,
            by: by.map(|o| names.owner(o)),
            payload: if with_payload {
                super::ops::payload(status, now)
            } else {
                None
            },
            at: now,
        },
    }
}

/// Checks that hold whatever the model says: a terminal task never changes (but for its
/// payload going, and its read count growing), and no quota is ever exceeded.
#[derive(Default)]
pub struct Watch {
    terminal: HashMap<String, TaskRecord>,
}

impl Watch {
    /// Looks at every record in an answer.
    pub fn answer(&mut self, a: &Answer) -> Result<(), String> {
        let mut records: Vec<&TaskRecord> = Vec::new();
        collect_records(a, &mut records);
        for r in records {
            self.record(r)?;
        }
        Ok(())
    }

    fn record(&mut self, r: &TaskRecord) -> Result<(), String> {
        match self.terminal.get_mut(r.id.as_str()) {
            Some(first) => {
                let mut same = r.clone();
                let forgotten = first.ended.as_ref().is_some_and(|e| e.payload.is_some())
                    && r.ended.as_ref().is_some_and(|e| e.payload.is_none());
                if forgotten && let Some(e) = first.ended.as_mut() {
                    e.payload = None;
                }
                if r.result_reads < first.result_reads {
                    return Err(format!("result reads went back: {first:#?} then {r:#?}"));
                }
                same.result_reads = first.result_reads;
                if same != *first {
                    return Err(format!("a terminal task changed: {first:#?} became {r:#?}"));
                }
                first.result_reads = r.result_reads;
            }
            None if r.ended.is_some() => {
                if !r.status.is_terminal() || r.cancel.is_some() {
                    return Err(format!("an ended task is not terminal: {r:#?}"));
                }
                self.terminal.insert(r.id.as_str().to_owned(), r.clone());
            }
            None => {}
        }
        Ok(())
    }

    /// Looks at every task of the case and at the quotas, through the ledger.
    pub async fn everything(
        &mut self,
        ledgers: &[Box<dyn TaskLedger>],
        names: &Names,
        model: &Model,
    ) -> Result<(), String> {
        let l = &*ledgers[0];
        for k in 0..=model.next {
            let got = answer(l.get(&names.id(k)).await, Answer::Record)?;
            let want = names.render(&Expect::Record(model.snap(k)));
            if got != want {
                return Err(format!("task {k}: ledger has {got:#?}, model {want:#?}"));
            }
            self.answer(&got)?;
        }
        let limits = model.limits;
        let mut server = 0;
        for issuer in 0..ISSUERS.len() {
            let filter = |subject, tenant, client| Filter {
                issuer,
                subject,
                tenant,
                client,
            };
            let count = |tasks: Vec<TaskRecord>| tasks.len() as u32;
            let all = l.active_for(&names.filter(&filter(None, None, None))).await;
            server += count(all.map_err(|e| e.to_string())?);
            for (subject, tenant, client, limit) in (0..SUBJECTS.len())
                .map(|s| (Some(s), None, None, limits.principal))
                .chain([(None, Some(0), None, limits.tenant)])
                .chain((0..2).map(|c| (None, None, Some(c), limits.client)))
            {
                let f = filter(subject, tenant, client);
                let n = count(
                    l.active_for(&names.filter(&f))
                        .await
                        .map_err(|e| e.to_string())?,
                );
                if n > limit {
                    return Err(format!(
                        "{n} active tasks for {f:?}, over the quota of {limit}"
                    ));
                }
            }
        }
        if server > limits.server {
            return Err(format!("{server} active tasks, over the server quota"));
        }
        Ok(())
    }
}

fn collect_records<'a>(a: &'a Answer, out: &mut Vec<&'a TaskRecord>) {
    match a {
        Answer::Reserve(ReserveOutcome::Existing(r))
        | Answer::Finish(FinishOutcome::Applied(r) | FinishOutcome::AlreadyTerminal(r))
        | Answer::Cancel(
            CancelRequest::Recorded(r)
            | CancelRequest::AlreadyRequested(r)
            | CancelRequest::AlreadyTerminal(r),
        ) => out.push(r),
        Answer::Confirm(Confirmed::New(r) | Confirmed::SameOwner(r)) | Answer::Record(Some(r)) => {
            out.push(r)
        }
        Answer::Due(due) => out.extend(due.iter().map(|d| &d.record)),
        Answer::Tasks(tasks) => out.extend(tasks.iter()),
        Answer::Steps(steps) => steps.iter().for_each(|s| collect_records(s, out)),
        _ => {}
    }
}
