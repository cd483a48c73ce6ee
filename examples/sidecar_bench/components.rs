//! Component timings, in process, with the sidecar's own library code: what one token
//! validation costs (RS256 and EdDSA), what one durable ledger write costs on the disk the bench
//! ledger lives on, and what a bare fdatasync costs there. They explain the end-to-end numbers;
//! they are taken after the end-to-end phases, with the servers stopped.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use jsonwebtoken::Algorithm;
use lifeguard::identity::{KeySet, validate_token};
use lifeguard::ledger::{
    Confirmation, Owner, QuotaLimits, Reservation, ReserveOutcome, SqliteLedger, TaskId,
    TaskLedger, TaskStatus,
};
use serde_json::{Value, json};

use crate::procs::{ISSUER, Keys, policy_yaml};
use crate::stats::Summary;

/// Named component summaries, in the order measured.
pub type Components = Vec<(&'static str, Summary)>;

pub async fn measure(keys: &Keys, dir: &Path, iterations: usize) -> Result<Components> {
    let mut out = Vec::new();
    for (name, alg) in [
        ("validate_token RS256 (in process)", Algorithm::RS256),
        ("validate_token EdDSA (in process)", Algorithm::EdDSA),
    ] {
        out.push((name, jwt(keys, alg, iterations * 4)?));
    }
    std::fs::create_dir_all(dir).context("creating the component directory")?;
    out.push((
        "fdatasync 4 KiB append (same disk)",
        fsync(dir, iterations)?,
    ));
    out.extend(ledger(dir, iterations).await?);
    Ok(out)
}

fn jwt(keys: &Keys, alg: Algorithm, n: usize) -> Result<Summary> {
    let (policy, _) =
        lifeguard::policy::load_standalone("bench.yaml", &policy_yaml(), jiff::Timestamp::now())
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    let key_set = Arc::new(KeySet::from_jwks(&keys.jwks).map_err(|e| anyhow::anyhow!("{e}"))?);
    let token = keys.token(alg, "component", "tenant-0", "client-0")?;
    let now = jiff::Timestamp::now().as_second() as u64;
    let lookup = |_: &lifeguard::policy::TrustedIssuer| Some(key_set.clone());
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        let identity = validate_token(&token, &policy, &lookup, now);
        samples.push(started.elapsed().as_nanos() as u64);
        if let Err(e) = identity {
            bail!("the bench token does not validate: {e}");
        }
    }
    Ok(Summary::of(&mut samples))
}

fn fsync(dir: &Path, n: usize) -> Result<Summary> {
    let path = dir.join("fsync-probe");
    let mut file = std::fs::File::create(&path).context("creating the fsync probe")?;
    let block = vec![0x5au8; 4096];
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        file.write_all(&block).context("writing the fsync probe")?;
        file.sync_data().context("fdatasync")?;
        samples.push(started.elapsed().as_nanos() as u64);
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
    Ok(Summary::of(&mut samples))
}

/// reserve, confirm, observe (durable writes, one commit each when issued one at a time) and
/// get (a read) on a fresh SqliteLedger next to the bench ledger.
async fn ledger(dir: &Path, n: usize) -> Result<Components> {
    let path = dir.join("component-ledger.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let ledger = SqliteLedger::open(&path).map_err(|e| anyhow::anyhow!("{e}"))?;
    let owner = Owner {
        issuer: ISSUER.into(),
        subject: "component".into(),
        tenant: "tenant-0".into(),
        client: "client-0".into(),
    };
    let limits = QuotaLimits {
        per_principal: 1_000_000,
        per_tenant: 1_000_000,
        per_client: 1_000_000,
        per_server: 1_000_000,
    };
    let (mut reserve, mut confirm, mut observe, mut get) = (vec![], vec![], vec![], vec![]);
    let now = || jiff::Timestamp::now().as_millisecond();
    for i in 0..n {
        let id = TaskId::generate().map_err(|e| anyhow::anyhow!("{e}"))?;
        let reservation = Reservation {
            id: id.clone(),
            owner: owner.clone(),
            tool: "slow_compute".into(),
            scopes: vec![],
            idempotency: None,
            limits,
            now: now(),
            reservation_expires_at: now() + 600_000,
            token_issued_at: None,
            correlation_id: format!("bench-{i}"),
            object: None,
            lease_until: None,
            delegated_until: None,
            trace: None,
            binding: None,
        };
        let started = Instant::now();
        let outcome = ledger
            .reserve(reservation)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        reserve.push(started.elapsed().as_nanos() as u64);
        if outcome != ReserveOutcome::Reserved {
            bail!("component ledger refused a reservation: {outcome:?}");
        }
        let created_at = now();
        let confirmation = Confirmation {
            upstream_id: format!("task-{i}"),
            status: TaskStatus::Working,
            status_message: None,
            created_at,
            ttl_ms: 3_600_000,
            deadline_at: now() + 3_600_000,
            poll_interval_ms: Some(500),
        };
        let started = Instant::now();
        ledger
            .confirm(&id, confirmation)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        confirm.push(started.elapsed().as_nanos() as u64);
        let started = Instant::now();
        // A later time than the confirmation's, as in the sidecar (an UPDATE that changes
        // nothing commits without a write or an fsync, which would flatter the number).
        ledger
            .observe(&id, TaskStatus::Working, None, now().max(created_at + 1))
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        observe.push(started.elapsed().as_nanos() as u64);
        let started = Instant::now();
        let record = ledger.get(&id).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        get.push(started.elapsed().as_nanos() as u64);
        if record.is_none() {
            bail!("component ledger lost a task");
        }
    }
    let stats = ledger.write_stats();
    drop(ledger);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    if stats.commits == 0 {
        bail!("the component ledger committed nothing");
    }
    Ok(vec![
        ("ledger reserve (durable commit)", Summary::of(&mut reserve)),
        ("ledger confirm (durable commit)", Summary::of(&mut confirm)),
        ("ledger observe (durable commit)", Summary::of(&mut observe)),
        ("ledger get (read, page cache)", Summary::of(&mut get)),
    ])
}

pub fn to_json(components: &Components) -> Value {
    Value::Array(
        components
            .iter()
            .map(|(name, s)| json!({"name": name, "latency": s.to_json()}))
            .collect(),
    )
}
