//! `lifeguard evidence`: the review's adversarial list, run against a live sidecar, written up
//! as a dated Markdown + JSON report.
//!
//! Every check is a black-box probe of behaviour the docs promise (docs/sidecar.md,
//! docs/policy-reference.md): it sends real MCP requests with tokens it mints, records each
//! request and answer (tokens replaced by labels), quotes the audit lines that appeared while it
//! ran, and passes only when every documented answer was observed. A check that cannot run
//! (it needs the policy file, or the policy does not configure what it probes) says so and is
//! never counted as passed. The exit status is 1 when any check failed.
//!
//! Layout: [`probe`] speaks MCP over HTTP and mints tokens; [`audit`] tails the audit trail;
//! [`policy`] learns what the policy promises and rewrites it for the reload check; [`checks`]
//! holds the checks; [`report`] writes the files.

mod admin;
mod audit;
mod call;
mod checks;
mod policy;
mod probe;
mod report;

use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;

use anyhow::{Context, Result, bail};
use jsonwebtoken::Algorithm;

use checks::{CHECKS, Env};
use probe::{Minter, Probe};
use report::{PolicyHashes, Report, Verdict};

/// Arguments of `lifeguard evidence`.
#[derive(Debug, clap::Args)]
pub struct EvidenceArgs {
    /// The sidecar's MCP endpoint, e.g. http://127.0.0.1:8080/mcp.
    #[arg(long, value_name = "URL", required_unless_present = "list")]
    pub target: Option<url::Url>,
    /// The sidecar's admin address (http://HOST:PORT): /ready tells the policy hash in force,
    /// and the reload check waits on it.
    #[arg(long, value_name = "URL")]
    pub admin: Option<url::Url>,
    /// The policy file the sidecar reads (standalone mode). Gives the checks their expected
    /// values and the policy hash; the `tool-removed-mid-run` and `user-disabled-mid-run`
    /// checks rewrite it and restore it.
    #[arg(long, value_name = "FILE", conflicts_with = "expect_policy")]
    pub policy: Option<PathBuf>,
    /// The policy the target enforces, read only (e.g. the manifest applied to a cluster): the
    /// expected values and hash, without the reload check.
    #[arg(long, value_name = "FILE")]
    pub expect_policy: Option<PathBuf>,
    /// The policy hash the target should be enforcing, e.g. a cluster policy's
    /// `status.policyHash`; checked against /ready and the audit trail.
    #[arg(long, value_name = "HASH")]
    pub expect_hash: Option<String>,
    /// The sidecar's audit trail (JSON lines), to quote the lines each check produced.
    #[arg(long, value_name = "PATH")]
    pub audit_file: Option<PathBuf>,
    /// The PEM private key of an issuer the target trusts, to mint the probe's tokens.
    #[arg(long, value_name = "PEM", required_unless_present = "list")]
    pub key: Option<PathBuf>,
    /// Key id written into the tokens' header.
    #[arg(long)]
    pub kid: Option<String>,
    /// Signature algorithm of --key.
    #[arg(long, default_value = "EdDSA")]
    pub alg: String,
    /// Issuer of the tokens. Default: the policy's first issuer.
    #[arg(long, value_name = "URL")]
    pub issuer: Option<String>,
    /// Audience of the tokens. Default: the policy's resource, else --target.
    #[arg(long, value_name = "URI")]
    pub audience: Option<String>,
    /// Space-separated scopes every probe token carries. Default: every scope the policy
    /// requires of the tools the checks use (`rows:write` without a policy).
    #[arg(long)]
    pub scope: Option<String>,
    /// The example server's own address (http://HOST:PORT, unprotected): lets checks confirm
    /// what did or did not reach it (`/_example/requests`) and make it emit listen events.
    #[arg(long, value_name = "URL")]
    pub upstream_debug: Option<url::Url>,
    /// Run only these checks (repeatable); default all. `--list` prints their names.
    #[arg(long = "check", value_name = "NAME")]
    pub only: Vec<String>,
    /// Print the checks and what each proves, then exit.
    #[arg(long)]
    pub list: bool,
    /// Directory for evidence-<UTC time>.md and .json.
    #[arg(long, value_name = "DIR", default_value = "target/evidence")]
    pub out: PathBuf,
}

/// Runs the pack; exit status 0 when no check failed, 1 otherwise.
pub fn run(args: &EvidenceArgs) -> Result<ExitCode> {
    if args.list {
        for check in CHECKS {
            println!("{:<24} {}", check.id, check.title);
        }
        return Ok(ExitCode::SUCCESS);
    }
    for name in &args.only {
        if let Some((_, new)) = checks::RENAMED.iter().find(|(old, _)| old == name) {
            bail!(
                "the check {name:?} is now called {new:?} (docs/evidence-pack.md, \"Renamed \
                 checks\"); the report's JSON names it so too"
            );
        }
        if !CHECKS.iter().any(|c| c.id == name) {
            bail!("no check named {name:?}; `lifeguard evidence --list` names them");
        }
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(run_async(args))
}

async fn run_async(args: &EvidenceArgs) -> Result<ExitCode> {
    let started = jiff::Timestamp::now();
    // clap requires both unless --list, which returned before.
    let (Some(target), Some(key_path)) = (&args.target, &args.key) else {
        bail!("--target and --key are required");
    };
    let facts = match (&args.policy, &args.expect_policy) {
        (Some(path), _) => Some(policy::PolicyFacts::load(path, true)?),
        (None, Some(path)) => Some(policy::PolicyFacts::load(path, false)?),
        (None, None) => None,
    };
    let issuer = match (&args.issuer, &facts) {
        (Some(issuer), _) => issuer.clone(),
        (None, Some(f)) => f.first_issuer().context("the policy names no issuer")?,
        (None, None) => bail!("--issuer is needed without --policy or --expect-policy"),
    };
    let audience = match (&args.audience, &facts) {
        (Some(audience), _) => audience.clone(),
        (None, Some(f)) => f.policy.resource.clone(),
        (None, None) => target.to_string(),
    };
    let scope = match (&args.scope, &facts) {
        (Some(scope), _) => scope.clone(),
        (None, Some(f)) => f.scopes_for(checks::TOOLS_USED),
        (None, None) => "rows:write".to_owned(),
    };
    let key = std::fs::read(key_path).with_context(|| format!("reading {}", key_path.display()))?;
    let alg = Algorithm::from_str(&args.alg).context("unknown --alg")?;
    let minter = Minter::new(key, alg, args.kid.clone(), issuer, audience, scope)?;

    let probe = Probe::new(target.clone())?;
    probe.preflight().await?;
    let admin = match &args.admin {
        Some(url) => Some(admin::Admin::connect(url.clone()).await?),
        None => None,
    };
    let audit = args.audit_file.clone().map(audit::AuditTrail::new);
    let env = Env::new(
        probe,
        minter,
        audit,
        facts,
        admin,
        args.upstream_debug.clone(),
        args.expect_hash.clone(),
    )?;

    let mut results = Vec::new();
    for check in CHECKS {
        if !args.only.is_empty() && !args.only.iter().any(|n| n == check.id) {
            continue;
        }
        eprintln!("evidence: {} ...", check.id);
        let result = env.run(check).await;
        eprintln!("evidence: {} {}", check.id, result.verdict_line());
        results.push(result);
    }

    let hashes = PolicyHashes {
        policy_check: env.facts.as_ref().map(|f| f.hash.clone()),
        // Only a file the sidecar reads itself is expected to hash alike (see policy-hash).
        policy_check_compared: env.facts.as_ref().is_some_and(|f| f.live),
        expected: args.expect_hash.clone(),
        ready: match &env.admin {
            Some(admin) => admin.policy_hash().await,
            None => None,
        },
        audit: env.audit_hash.lock().ok().and_then(|h| h.clone()),
    };
    let report = Report::new(
        started,
        target.to_string(),
        args.admin.as_ref().map(url::Url::to_string),
        env.facts
            .as_ref()
            .map(|f| (f.path.display().to_string(), f.policy.policy.to_string())),
        hashes,
        results,
    );
    let (md, json) = report.write(&args.out)?;
    let failed = report.count(Verdict::Fail);
    println!(
        "evidence: {} passed, {} failed, {} not run\n  {}\n  {}",
        report.count(Verdict::Pass),
        failed,
        report.count(Verdict::NotRun),
        md.display(),
        json.display()
    );
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
