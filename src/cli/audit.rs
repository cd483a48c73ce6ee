//! `lifeguard audit digest`: which digest an audit trail written under
//! `audit.identityDigests` shows for a given subject or tenant, or (with `--object-type`)
//! which `detail.object` digest it shows for an object of `tasks.objects`.
//!
//! The key lives in the ledger, so only whoever may read the ledger can answer; the command
//! prints one `VALUE<TAB>DIGEST` line per value asked about.

use anyhow::{Context, Result};

use lifeguard::audit::{IdentityDigester, TaskHasher};
use lifeguard::ledger::LedgerScope;
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
    #[arg(long, value_name = "TYPE")]
    pub object_type: Option<String>,
    /// Subjects or tenants to digest (the same key digests both), or objects with
    /// --object-type.
    #[arg(required = true, value_name = "VALUE")]
    pub values: Vec<String>,
}

pub fn digest(args: &AuditDigestArgs) -> Result<()> {
    let location = super::sidecar::parse_ledger(&args.ledger)?;
    let scope = LedgerScope {
        server: super::sidecar::ledger_server(args.ledger_scope.as_deref())?,
        replica: "lifeguard-audit-digest".to_owned(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let secret = match args.object_type {
        Some(_) => AUDIT_HASH_SECRET,
        None => AUDIT_IDENTITY_SECRET,
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
