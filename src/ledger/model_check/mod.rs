//! Model-based tests of [`TaskLedger`] backends: random sequences of operations, each checked
//! against a small reference model of the documented semantics ([`model`]).
//!
//! A sequence ([`ops::Op`]) mixes reservations (with and without idempotency keys, by tokens
//! bound to a key or not), confirms, releases, reads, status updates, finishes, cancellation
//! intents and their retries, read-once results, identity renewals, deadline sweeps,
//! revocations, retention purges, heartbeats, the sweep lease and orphan sweeps, over two
//! ledger instances (replicas) sharing storage.
//! After every step the ledger's answer must equal the model's; on top of that, independent of
//! the model, a terminal task must never change (but for its payload going and its read count
//! growing). After the last step (after every step with `LIFEGUARD_MODEL_EVERY_STEP=1`) every
//! task the case made is compared with the model and no quota may be exceeded. A failing case is shrunk by proptest to a
//! minimal sequence; a real defect's sequence becomes a named test in [`regressions`].
//!
//! A backend runs it all by invoking [`ledger_model_tests!`] with a [`Storage`] and its
//! default number of cases. `PROPTEST_CASES` overrides the number of cases (e.g.
//! `PROPTEST_CASES=5000 cargo test --lib model_random_sequences`). Failing seeds are persisted in
//! `src/ledger/model_check/mod.regressions` and replayed first on later runs.
//!
//! [`TaskLedger`]: crate::ledger::TaskLedger

pub mod draw;
pub mod model;
pub mod ops;
pub mod regressions;
pub mod sut;

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use proptest_state_machine::ReferenceStateMachine;

use self::draw::LedgerModel;
use self::model::{Limits, Model, REPLICAS};
use self::ops::Op;
use self::sut::{Names, Watch, execute};
use crate::ledger::TaskLedger;

/// Set, every task and the quotas are compared with the model after every step, not only
/// after the last (about three times slower).
const EVERY_STEP: &str = "LIFEGUARD_MODEL_EVERY_STEP";

/// Longest random sequence.
const MAX_STEPS: usize = 60;

/// Where a backend's cases run: each case gets the ledgers of a fresh server.
#[async_trait]
pub trait Storage: Send + Sync {
    /// [`REPLICAS`] ledger instances (replicas `r0`, `r1`, …) of the new server `server` on
    /// shared storage, and whatever must outlive them.
    async fn open(&self, server: &str) -> (Vec<Box<dyn TaskLedger>>, Box<dyn Any + Send>);

    /// Whether replicas' `confirm_in_replica` upstream IDs live in separate spaces.
    fn replica_spaces(&self) -> bool;
}

/// Expands to `model_random_sequences` (random cases, `cases` of them unless `PROPTEST_CASES`
/// says otherwise) and one test per named regression. `storage` is an async closure resolving
/// to the backend's [`Storage`].
macro_rules! ledger_model_tests {
    ($storage:expr, $cases:expr $(,)?) => {
        #[test]
        fn model_random_sequences() {
            $crate::ledger::model_check::run_random(async || ($storage)().await, $cases);
        }

        $crate::ledger::model_check::ledger_model_tests!(@each $storage;
            model_regression_smoke,
            model_regression_purge_limit,
        );
    };
    (@each $storage:expr; $($name:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread")]
        async fn $name() {
            let storage = ($storage)().await;
            let (initial, ops) = $crate::ledger::model_check::regressions::$name();
            $crate::ledger::model_check::replay(&storage, initial, &ops).await;
        }
    )*};
}

pub(crate) use ledger_model_tests;

/// Runs one sequence from a fresh server and the initial model; the first disagreement is the
/// error. `seen` counts the steps started (proptest's shrinking uses it).
pub async fn run_case(
    storage: &dyn Storage,
    initial: Model,
    ops: &[Op],
    seen: Option<&AtomicUsize>,
) -> Result<(), String> {
    let names = Names::fresh();
    let (ledgers, guard) = storage.open(&names.server()).await;
    assert_eq!(ledgers.len(), REPLICAS);
    let mut model = initial;
    model.spaces = storage.replica_spaces();
    let mut watch = Watch::default();
    let every_step = std::env::var_os(EVERY_STEP).is_some();
    let result = async {
        for (i, op) in ops.iter().enumerate() {
            if let Some(seen) = seen {
                seen.fetch_add(1, Ordering::SeqCst);
            }
            model.apply(op);
            let got = execute(&ledgers, &names, &model, op).await;
            let got = got.map_err(|e| format!("step {i} {op:?}: {e}"))?;
            let want = names.expect_for(op, &model.expect);
            if got != want {
                return Err(format!(
                    "step {i} {op:?}:\nthe ledger answered {got:#?}\nthe model expects {want:#?}"
                ));
            }
            watch
                .answer(&got)
                .map_err(|e| format!("step {i} {op:?}: {e}"))?;
            if every_step {
                let checked = watch.everything(&ledgers, &names, &model).await;
                checked.map_err(|e| format!("after step {i} {op:?}: {e}"))?;
            }
        }
        let checked = watch.everything(&ledgers, &names, &model).await;
        checked.map_err(|e| format!("at the end: {e}"))
    }
    .await;
    drop(ledgers);
    drop(guard);
    result
}

/// Replays a recorded sequence (a regression test), panicking on the first disagreement.
pub async fn replay(storage: &dyn Storage, (limits, per_replica): (Limits, bool), ops: &[Op]) {
    if let Err(e) = run_case(storage, Model::new(limits, per_replica), ops, None).await {
        panic!("{e}");
    }
}

/// Random cases on the storage `make` resolves to: `default_cases` of them, or
/// `PROPTEST_CASES`.
pub fn run_random<S, F>(make: F, default_cases: u32)
where
    S: Storage + 'static,
    F: AsyncFnOnce() -> S,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let storage = runtime.block_on(make());
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_cases);
    let config = Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        source_file: Some(file!()),
        max_shrink_iters: 4_096,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let strategy = LedgerModel::sequential_strategy(1..MAX_STEPS);
    let result = runner.run(
        &strategy,
        |(initial, ops, seen): (Model, Vec<Op>, Option<Arc<AtomicUsize>>)| {
            let outcome = runtime.block_on(run_case(&storage, initial, &ops, seen.as_deref()));
            outcome.map_err(TestCaseError::fail)
        },
    );
    drop(storage);
    if let Err(e) = result {
        panic!("the ledger disagrees with the model: {e}");
    }
}
