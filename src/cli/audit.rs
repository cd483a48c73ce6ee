//! `lifeguard audit digest`: which digest an audit trail written under
//! `audit.identityDigests` shows for a given subject or tenant, (with `--object-type`) which
//! `detail.object` digest it shows for an object of `tasks.objects`, or (with `--task`) which
//! `task` hash every event of a sidecar task ID carries.
//!
//! The keys live in the ledger, so only whoever may read the ledger can answer; the command
//! prints one `VALUE<TAB>DIGEST` line per value asked about, computed by the very functions the
//! sidecar's audit writer uses.

use anyhow::{Context, Result, bail};

use lifeguard::audit::{IdentityDigester, TaskHasher};
use lifeguard::ledger::{LedgerLocation, LedgerScope};
use lifeguard::model::TaskId;
use lifeguard::sidecar::{AUDIT_HASH_SECRET, AUDIT_IDENTITY_SECRET};

/// Arguments of `lifeguard audit digest`.
#[derive(Debug, clap::Args)]
pub struct AuditDigestArgs {
    /// The sidecar's ledger (the same value as its --ledger).
    #[arg(
        long,
        value_name = "LOCATION",
        env = "LIFEGUARD_LEDGER",
        hide_env_values = true
    )]
    pub ledger: String,
    /// The sidecar's --ledger-scope (default `local`).
    #[arg(long, value_name = "NAME", env = "LIFEGUARD_LEDGER_SCOPE")]
    pub ledger_scope: Option<String>,
    /// Digest the values as objects of this resource type (`tasks.objects.tools.*.type`, or
    /// the tool's name when the policy gives no type) instead of as subjects or tenants.
    #[arg(long, value_name = "TYPE", conflicts_with = "task")]
    pub object_type: Option<String>,
    /// Digest the values as task IDs (`lgt_…`, as clients see them, or any string a client
    /// sent: refused IDs are audited by the same hash), giving the `task` field of the audit
    /// events about that task.
    #[arg(long)]
    pub task: bool,
    /// Subjects or tenants to digest (the same key digests both), objects with
    /// --object-type, or task IDs with --task.
    #[arg(required = true, value_name = "VALUE")]
    pub values: Vec<String>,
}

pub fn digest(args: &AuditDigestArgs) -> Result<()> {
    let location = super::sidecar::parse_ledger(&args.ledger)?;
    // Opening an SQLite ledger creates a missing file, and reading a key creates a missing
    // key: a mistyped path would print digests under a brand-new key that match nothing.
    if let LedgerLocation::Sqlite(path) = &location
        && !path.is_file()
    {
        bail!(
            "no ledger at {}: give the sidecar's --ledger (its keys are what the audit trail \
             was written with)",
            path.display()
        );
    }
    let scope = LedgerScope {
        server: super::sidecar::ledger_server(args.ledger_scope.as_deref())?,
        replica: "lifeguard-audit-digest".to_owned(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    // Task IDs and objects are hashed under the task-hash key, subjects and tenants under the
    // identity key: the same keys, read from the same ledger, as the sidecar's writer.
    let secret = if args.task || args.object_type.is_some() {
        AUDIT_HASH_SECRET
    } else {
        AUDIT_IDENTITY_SECRET
    };
    let key = runtime.block_on(async {
        let ledger = location
            .open(scope)
            .await
            .with_context(|| format!("opening the task ledger {location}"))?;
        ledger
            .secret(secret)
            .await
            .with_context(|| format!("reading the audit key {secret} from the ledger"))
    })?;
    if args.task {
        let hasher = TaskHasher::new(key);
        for value in &args.values {
            println!(
                "{value}\t{}",
                hasher.hash(&TaskId::from_string(value.as_str()))
            );
        }
        return Ok(());
    }
    match &args.object_type {
        Some(resource_type) => {
            let hasher = TaskHasher::new(key);
            for value in &args.values {
                println!("{value}\t{}", hasher.object_digest(resource_type, value));
            }
        }
        None => {
            let digester = IdentityDigester::new(key);
            for value in &args.values {
                println!("{value}\t{}", digester.digest(value));
            }
        }
    }
    Ok(())
}
