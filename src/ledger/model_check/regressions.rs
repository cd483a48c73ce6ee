//! Named sequences replayed on every backend by [`super::ledger_model_tests!`]: shrunk
//! counterexamples of real defects the random cases found, and a smoke sequence that walks a
//! task through its whole life.

use super::model::Limits;
use super::ops::Op;
use crate::ledger::{EndReason, TaskStatus};

const ROOMY: Limits = Limits {
    principal: 3,
    tenant: 4,
    client: 3,
    server: 6,
};

/// A task is reserved with a key by a key-bound token, confirmed, found again by its key,
/// cancelled, finished, read once, and purged when retention ends (not before).
pub fn model_regression_smoke() -> ((Limits, bool), Vec<Op>) {
    let reserve = |key| Op::Reserve {
        owner: 0,
        binding: Some(0),
        key,
        window: 500,
        life: 60,
        lease: Some(100),
        delegation: None,
    };
    let ops = vec![
        reserve(Some(0)),
        reserve(Some(0)),
        Op::Confirm {
            task: 0,
            upstream: 0,
            age: 0,
            status: TaskStatus::Working,
            ttl: 300,
            deadline: 200,
            via: 1,
        },
        reserve(Some(0)),
        Op::RequestCancel {
            task: 0,
            reason: EndReason::OwnerCancel,
            by: Some(0),
            give_up: 100,
        },
        Op::CancelsDue {
            home: Some(1),
            limit: 100,
        },
        Op::Finish {
            task: 0,
            status: TaskStatus::Completed,
            reason: EndReason::Upstream,
            by: None,
            payload: true,
        },
        Op::ReadOnce { task: 0 },
        Op::Get { task: 0, via: 0 },
        Op::Advance(100),
        Op::Purge { limit: 1 },
        Op::Advance(200),
        Op::Purge { limit: 1 },
        Op::Get { task: 0, via: 1 },
    ];
    ((ROOMY, false), ops)
}

/// PostgreSQL: `purge_expired(now, 1)` with two expired tasks deleted both. Its `DELETE … WHERE
/// id IN (SELECT … LIMIT $3 FOR UPDATE SKIP LOCKED)` let the planner run the limited subquery
/// again for each row of the outer scan (a nested-loop semi join), and each run, skipping the
/// row the previous one had just deleted, picked the next: the limit bounded nothing.
pub fn model_regression_purge_limit() -> ((Limits, bool), Vec<Op>) {
    let limits = Limits {
        principal: 1,
        tenant: 2,
        client: 2,
        server: 2,
    };
    let reserve = |owner| Op::Reserve {
        owner,
        binding: None,
        key: None,
        window: 0,
        life: 5,
        lease: None,
        delegation: None,
    };
    let confirm = |task, upstream| Op::Confirm {
        task,
        upstream,
        age: 0,
        status: TaskStatus::Working,
        ttl: 40,
        deadline: 20,
        via: 0,
    };
    let ops = vec![
        reserve(0),
        confirm(0, 1),
        reserve(0),
        reserve(0),
        Op::Advance(1),
        reserve(0),
        reserve(1),
        confirm(4, 0),
        Op::Advance(100),
        Op::Purge { limit: 1 },
    ];
    ((limits, false), ops)
}
