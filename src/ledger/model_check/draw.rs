//! How random sequences are drawn: the small domains of every argument (four owners, two keys
//! each, two key bindings or none, three upstream IDs, two replicas, a handful of durations, so
//! that keys, bindings, upstream IDs, quotas and deadlines collide), operation weights that
//! follow the state (operations on tasks are rare while there are none), and the proptest
//! state machine that strings them together.

use proptest::prelude::*;
use proptest::sample::select;
use proptest_state_machine::ReferenceStateMachine;

use super::model::{BINDINGS, Entry, Filter, KEYS, Limits, Model, OWNERS, REPLICAS, UPSTREAMS};
use super::ops::{Op, task_of};
use crate::ledger::{BUDGET_USE_HORIZON_MS, EndReason, TaskStatus};

fn short() -> impl Strategy<Value = i64> {
    select(vec![1_i64, 10, 100, 1_000])
}

fn opt_short() -> impl Strategy<Value = Option<i64>> {
    prop::option::of(short())
}

fn filter() -> impl Strategy<Value = Filter> {
    (
        0..2_usize,
        prop::option::of(0..3_usize),
        prop::option::of(0..2_usize),
        prop::option::of(0..3_usize),
    )
        .prop_map(|(issuer, subject, tenant, client)| Filter {
            issuer,
            subject,
            tenant,
            client,
        })
}

fn nonterminal() -> impl Strategy<Value = TaskStatus> {
    // Mostly valid; now and then a terminal one, which must be refused.
    prop_oneof![
        6 => Just(TaskStatus::Working),
        3 => Just(TaskStatus::InputRequired),
        1 => Just(TaskStatus::Completed),
    ]
}

fn reason() -> impl Strategy<Value = EndReason> {
    select(vec![
        EndReason::Upstream,
        EndReason::OwnerCancel,
        EndReason::AdminCancel,
        EndReason::Revocation,
        EndReason::Deadline,
        EndReason::UpstreamLost,
        EndReason::IdentityLeaseExpired,
    ])
}

fn cancellation() -> impl Strategy<Value = EndReason> {
    prop_oneof![
        9 => select(vec![
            EndReason::OwnerCancel,
            EndReason::AdminCancel,
            EndReason::Revocation,
            EndReason::Deadline,
            EndReason::IdentityLeaseExpired,
        ]),
        1 => Just(EndReason::Upstream),
    ]
}

fn ending_status() -> impl Strategy<Value = TaskStatus> {
    prop_oneof![
        4 => Just(TaskStatus::Completed),
        3 => Just(TaskStatus::Failed),
        3 => Just(TaskStatus::Cancelled),
        1 => Just(TaskStatus::Working),
    ]
}

/// A task argument: mostly one of `preferred` (when there are any), else any number up to
/// one past the last reservation.
fn pick(preferred: Vec<usize>, next: usize) -> BoxedStrategy<usize> {
    if preferred.is_empty() {
        (0..=next).boxed()
    } else {
        prop_oneof![4 => select(preferred), 1 => 0..=next].boxed()
    }
}

/// One operation for the state `m`: task arguments favour reservations (for confirms and
/// releases) and stored tasks (for the rest), so most steps act on something.
pub fn op(m: &Model) -> BoxedStrategy<Op> {
    let next = m.next;
    let reserved: Vec<usize> = m
        .entries
        .iter()
        .filter(|(_, e)| matches!(e, Entry::Reserved(_)))
        .map(|(k, _)| *k)
        .collect();
    let tasks: Vec<usize> = m.tasks().map(|(k, _)| k).collect();
    // Weights: operations on reservations (tasks) are rare while there are none.
    let (r, t) = (
        u32::from(!reserved.is_empty()),
        u32::from(!tasks.is_empty()),
    );
    let pending: Vec<usize> = reserved.clone();
    let held = pick(reserved, next);
    let task = pick(tasks, next);
    let owner = 0..OWNERS.len();
    let replica = 0..REPLICAS;
    prop_oneof![
        4 => prop_oneof![20 => short(), 1 => Just(30_000_i64), 1 => Just(BUDGET_USE_HORIZON_MS)]
            .prop_map(Op::Advance),
        8 => (owner.clone(), prop::option::of(0..BINDINGS), prop::option::weighted(0.7, 0..KEYS),
              select(vec![0_i64, 30, 500]), select(vec![5_i64, 60, 5_000]), opt_short(), opt_short())
            .prop_map(|(owner, binding, key, window, life, lease, delegation)| Op::Reserve {
                owner, binding, key, window, life, lease, delegation,
            }),
        1 + 11 * r => (held.clone(), 0..UPSTREAMS, select(vec![0_i64, 0, 30]), nonterminal(),
              select(vec![40_i64, 300, 5_000]), select(vec![20_i64, 200, 3_000]), replica.clone())
            .prop_map(|(task, upstream, age, status, ttl, deadline, via)| Op::Confirm {
                task, upstream, age, status, ttl, deadline, via,
            }),
        1 => held.prop_map(|task| Op::Release { task }),
        1 => (0..=next)
            .prop_filter("a pending reservation", move |k| !pending.contains(k))
            .prop_map(|task| Op::WaitSettled { task }),
        1 + 3 * t => (task.clone(), replica.clone()).prop_map(|(task, via)| Op::Get { task, via }),
        1 + 3 * t => (task.clone(), nonterminal(), prop::option::of(0..2_u8))
            .prop_map(|(task, status, message)| Op::Observe { task, status, message }),
        1 + 7 * t => (task.clone(), ending_status(), reason(), prop::option::of(owner.clone()), any::<bool>())
            .prop_map(|(task, status, reason, by, payload)| Op::Finish {
                task, status, reason, by, payload,
            }),
        1 + 5 * t => (task.clone(), cancellation(), prop::option::of(owner), prop_oneof![1 => Just(-1_i64), 6 => select(vec![0_i64, 100])])
            .prop_map(|(task, reason, by, give_up)| Op::RequestCancel { task, reason, by, give_up }),
        2 => (prop::option::of(replica.clone()), select(vec![1_usize, 100]))
            .prop_map(|(home, limit)| Op::CancelsDue { home, limit }),
        1 + t => (task.clone(), short()).prop_map(|(task, next)| Op::NoteCancelAttempt { task, next }),
        1 + t => task.clone().prop_map(|task| Op::NoteResultRead { task }),
        1 + 3 * t => task.clone().prop_map(|task| Op::ReadOnce { task }),
        1 + t => task.clone().prop_map(|task| Op::ForgetPayload { task }),
        1 => select(vec![1_usize, 100]).prop_map(|limit| Op::PastDeadline { limit }),
        2 => Just(Op::Expire),
        1 + 3 * t => (task.clone(), opt_short(), opt_short())
            .prop_map(|(task, lease, delegation)| Op::RenewIdentity { task, lease, delegation }),
        2 => select(vec![1_usize, 2, 1_000]).prop_map(|limit| Op::Purge { limit }),
        1 => filter().prop_map(Op::ActiveFor),
        1 => filter().prop_map(Op::Revoke),
        2 => (replica.clone(), short(), any::<bool>())
            .prop_map(|(via, life, address)| Op::Heartbeat { via, life, address }),
        1 => replica.clone().prop_map(|replica| Op::Replica { replica }),
        1 => select(vec![1_usize, 100]).prop_map(|limit| Op::Orphaned { limit }),
        1 => (replica.clone(), short()).prop_map(|(via, life)| Op::TryLease { via, life }),
        1 => (replica, short()).prop_map(|(via, life)| Op::Sweep { via, life }),
        4 => (
            (0..2_usize, 0..2_usize, 0..4_usize, prop::option::of(task)),
            (1..=3_u32, prop::option::of(select(vec![100_i64, 1_000])), 1..=4_u32),
            (select(vec![1_u64, 4]), prop::option::of(select(vec![4_u64, 6])), select(vec![100_i64, 100_000])),
        )
            .prop_map(|((grant, scope, decision, task), (max_iterations, window, max_per_minute), (cost, max_cost, cost_life))| {
                Op::Spend { grant, scope, decision, task, max_iterations, window, max_per_minute, cost, max_cost, cost_life }
            }),
    ]
    .boxed()
}

/// The reference state machine for proptest: quotas drawn per case, then operations.
pub struct LedgerModel;

impl ReferenceStateMachine for LedgerModel {
    type State = Model;
    type Transition = Op;

    fn init_state() -> BoxedStrategy<Model> {
        (1..=4_u32, 2..=5_u32, 1..=4_u32, 2..=8_u32, any::<bool>())
            .prop_map(|(principal, tenant, client, server, per_replica)| {
                let limits = Limits {
                    principal,
                    tenant,
                    client,
                    server,
                };
                Model::new(limits, per_replica)
            })
            .boxed()
    }

    fn transitions(state: &Model) -> BoxedStrategy<Op> {
        op(state)
    }

    fn apply(mut state: Model, op: &Op) -> Model {
        state.apply(op);
        state
    }

    fn preconditions(state: &Model, op: &Op) -> bool {
        task_of(op).is_none_or(|k| k <= state.next)
            && !matches!(op, Op::WaitSettled { task } if state.pending(*task))
    }
}
