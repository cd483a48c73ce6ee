//! The model-based ledger tests ([`crate::ledger::model_check`]) on PostgreSQL: one database
//! per test, a server of its own per case (every row is scoped by server).

use std::any::Any;

use super::support::{TestDb, scope};
use crate::ledger::TaskLedger;
use crate::ledger::model_check::{self, model::REPLICAS, sut::replica};

/// Each case's ledgers hold few connections: a case runs one operation at a time.
const POOL: usize = 2;

struct Shared(TestDb);

#[async_trait::async_trait]
impl model_check::Storage for Shared {
    async fn open(&self, server: &str) -> (Vec<Box<dyn TaskLedger>>, Box<dyn Any + Send>) {
        let location = self.0.location().with_pool_size(POOL);
        let mut ledgers: Vec<Box<dyn TaskLedger>> = Vec::new();
        for r in 0..REPLICAS {
            let ledger = crate::ledger::PostgresLedger::open(&location, scope(server, &replica(r)))
                .await
                .unwrap_or_else(|e| panic!("open the ledger: {e}"));
            ledgers.push(Box::new(ledger));
        }
        (ledgers, Box::new(()))
    }

    fn replica_spaces(&self) -> bool {
        true
    }
}

model_check::ledger_model_tests!(async || Shared(TestDb::create().await), 64);
