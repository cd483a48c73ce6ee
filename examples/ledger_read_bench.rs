//! Micro-benchmark of one ledger read (`TaskLedger::get` on SQLite), the read every
//! `tasks/get` makes: 2,000 confirmed tasks, then 20,000 reads in three rounds.
//! `cargo run --release --example ledger_read_bench [LOCATION]` (default: a temporary SQLite
//! file; a `postgres://` URL measures the PostgreSQL ledger there). Measured 2026-11-30 on the 2-core VM:
//! 3.9 µs per read at `b49c59e` (schema v2); 30 µs with schema v3 read through a join
//! (re-prepared at every call), 6.1 µs with two primary-key lookups (the fix).

use std::time::Instant;

use lifeguard::ledger::*;
#[tokio::main(flavor = "current_thread")]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let location: LedgerLocation = std::env::args()
        .nth(1)
        .unwrap_or_else(|| dir.path().join("l.db").display().to_string())
        .parse()
        .unwrap();
    let scope = LedgerScope {
        server: format!("bench/read-{}", std::process::id()),
        replica: "r0".into(),
    };
    let ledger = location.open(scope).await.unwrap();
    let owner = Owner {
        issuer: "i".into(),
        subject: "s".into(),
        tenant: "t".into(),
        client: "c".into(),
    };
    let limits = QuotaLimits {
        per_principal: u32::MAX,
        per_tenant: u32::MAX,
        per_client: u32::MAX,
        per_server: u32::MAX,
    };
    let mut ids = Vec::new();
    for n in 0..2000 {
        let id = TaskId::generate().unwrap();
        let r = Reservation {
            id: id.clone(),
            owner: owner.clone(),
            tool: "t".into(),
            scopes: vec![],
            idempotency: None,
            limits,
            now: 1,
            reservation_expires_at: i64::MAX / 2,
            token_issued_at: None,
            correlation_id: format!("r{n}"),
            object: None,
            lease_until: None,
            delegated_until: None,
            trace: None,
            binding: None,
        };
        ledger.reserve(r).await.unwrap();
        ledger
            .confirm(
                &id,
                Confirmation {
                    upstream_id: format!("u{n}"),
                    status: TaskStatus::Working,
                    status_message: None,
                    created_at: 1,
                    ttl_ms: i64::MAX / 4,
                    deadline_at: i64::MAX / 4,
                    poll_interval_ms: None,
                },
            )
            .await
            .unwrap();
        ids.push(id);
    }
    for round in 0..3 {
        let t = Instant::now();
        for i in 0..20_000 {
            std::hint::black_box(ledger.get(&ids[i % ids.len()]).await.unwrap());
        }
        println!(
            "round {round}: get {:.1} µs",
            t.elapsed().as_secs_f64() * 1e6 / 20_000.0
        );
    }
}
