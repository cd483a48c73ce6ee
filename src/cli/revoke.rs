//! `lifeguard revoke` (also `kubectl lifeguard revoke`): create a PrincipalRevocation by hand
//! and, with `--wait`, follow its propagation to the sidecars until the operator reports it
//! complete.
//!
//! The object's name is a hash of the principal and `revokedBefore`, so running the same
//! request again (same `--revoked-before`) finds the object the first run created instead of
//! adding a second one.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use futures_util::StreamExt;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use lifeguard::api::{
    PolicyDuration, PrincipalRevocation, PrincipalRevocationSpec, RevocationReason,
    RevocationSource, RevocationSourceKind,
};
use sha2::{Digest, Sha256};

use super::cluster::{Cluster, KubectlArgs, Output, REVOCATIONS, block_on, print_stdout};
use super::present::{Progress, human_duration, principal_label, progress};

/// Flags of `revoke`.
#[derive(Debug, clap::Args)]
pub struct RevokeArgs {
    #[command(flatten)]
    pub cluster: KubectlArgs,
    /// Token issuer (`iss`) of the principal, exactly as in its tokens.
    #[arg(long, value_name = "ISSUER")]
    pub issuer: String,
    /// Subject of the principal (`sub`, or the policy's subject claim). Without it, every
    /// subject of the --tenant and/or --client given is revoked.
    #[arg(long, value_name = "SUBJECT")]
    pub subject: Option<String>,
    /// With --subject: only the principal's tokens and tasks in this tenant. Alone: the whole
    /// tenant's.
    #[arg(long, value_name = "TENANT")]
    pub tenant: Option<String>,
    /// With --subject: only the principal's tokens and tasks through this OAuth client.
    /// Alone: everyone's through this client (e.g. consent withdrawn for the application).
    #[arg(long, value_name = "CLIENT")]
    pub client: Option<String>,
    /// Why; decides whether tokens issued afterwards work again.
    #[arg(long, value_enum, value_name = "REASON")]
    pub reason: ReasonArg,
    /// Tokens issued at or before this instant (RFC 3339, whole seconds) are refused. Default:
    /// now. Give the value an earlier run printed to repeat that exact request.
    #[arg(long, value_name = "TIME")]
    pub revoked_before: Option<String>,
    /// Let the operator delete the revocation this long after `revokedBefore` (sets
    /// `expiresAt`; use the longest token lifetime). Default: kept until deleted.
    #[arg(long, value_name = "DURATION")]
    pub expires_in: Option<PolicyDuration>,
    /// Follow the propagation until every targeted sidecar applied the revocation.
    #[arg(long)]
    pub wait: bool,
    /// How long `--wait` waits before giving up (exit code 1).
    #[arg(long, value_name = "DURATION", default_value = "2m", requires = "wait")]
    pub timeout: PolicyDuration,
    /// Output format: `json` prints the object (after `--wait`, with its final status) and
    /// writes progress to stderr.
    #[arg(short = 'o', long = "output", value_enum, default_value_t)]
    pub output: Output,
}

/// The reasons a PrincipalRevocation accepts, as written in its `spec.reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "camelCase")]
pub enum ReasonArg {
    /// Sessions ended; tokens issued later work again.
    SessionRevoked,
    /// Password or credential changed; tokens issued later work again.
    CredentialChange,
    /// Account disabled: every token is refused until the revocation is deleted.
    AccountDisabled,
    /// Account gone: every token is refused until the revocation is deleted.
    AccountPurged,
    /// A credential leaked; tokens issued later work again.
    CredentialCompromise,
    /// An administrator ended the principal's work; tokens issued later work again.
    AdminAction,
}

impl From<ReasonArg> for RevocationReason {
    fn from(reason: ReasonArg) -> Self {
        match reason {
            ReasonArg::SessionRevoked => Self::SessionRevoked,
            ReasonArg::CredentialChange => Self::CredentialChange,
            ReasonArg::AccountDisabled => Self::AccountDisabled,
            ReasonArg::AccountPurged => Self::AccountPurged,
            ReasonArg::CredentialCompromise => Self::CredentialCompromise,
            ReasonArg::AdminAction => Self::AdminAction,
        }
    }
}

/// Label on the objects `revoke` creates (the security-event receiver uses `security-event`).
pub const SOURCE_LABEL: &str = "lifeguard.dev/source";
pub const SOURCE_LABEL_VALUE: &str = "manual";

/// A checked revocation request.
#[derive(Debug, Clone, PartialEq)]
pub struct RevocationRequest {
    pub issuer: String,
    pub subject: Option<String>,
    pub tenant: Option<String>,
    pub client: Option<String>,
    pub reason: RevocationReason,
    pub revoked_before: Timestamp,
    pub expires_at: Option<Timestamp>,
}

/// Field limits of the CRD schema (checked here too, so the message names the flag).
const MAX_ISSUER: usize = 2048;
const MAX_IDENTIFIER: usize = 1024;

fn check_identifier(flag: &str, value: &str, max: usize, problems: &mut Vec<String>) {
    if value.trim().is_empty() {
        problems.push(format!("--{flag} must not be empty"));
    } else if value.trim() != value {
        problems.push(format!(
            "--{flag} {value:?} has leading or trailing whitespace; tokens are compared byte for byte"
        ));
    } else if value.chars().count() > max {
        problems.push(format!("--{flag} is longer than {max} characters"));
    }
}

impl RevocationRequest {
    /// Checks the flags of `revoke` at `now`; every problem is listed in the error.
    pub fn from_args(args: &RevokeArgs, now: Timestamp) -> Result<Self> {
        let mut problems = Vec::new();
        check_identifier("issuer", &args.issuer, MAX_ISSUER, &mut problems);
        if args.subject.is_none() && args.tenant.is_none() && args.client.is_none() {
            problems.push(
                "name at least one of --subject, --tenant and --client: a revocation never covers a whole issuer"
                    .to_owned(),
            );
        }
        for (flag, value) in [
            ("subject", &args.subject),
            ("tenant", &args.tenant),
            ("client", &args.client),
        ] {
            if let Some(value) = value {
                check_identifier(flag, value, MAX_IDENTIFIER, &mut problems);
            }
        }
        let current_second = Timestamp::from_second(now.as_second()).unwrap_or(now);
        let revoked_before = match &args.revoked_before {
            None => Some(current_second),
            Some(text) => match text.parse::<Timestamp>() {
                Err(e) => {
                    problems.push(format!(
                        "--revoked-before {text:?} is not an RFC 3339 time such as 2026-12-01T10:00:00Z ({e})"
                    ));
                    None
                }
                Ok(at) if at.subsec_nanosecond() != 0 => {
                    problems.push(format!(
                        "--revoked-before {text:?} has a fraction of a second; Kubernetes stores whole seconds"
                    ));
                    None
                }
                Ok(at) if at > current_second => {
                    problems.push(format!(
                        "--revoked-before {text:?} is in the future; a revocation covers tokens already issued"
                    ));
                    None
                }
                Ok(at) => Some(at),
            },
        };
        let mut expires_at = None;
        if let (Some(ttl), Some(revoked_before)) = (&args.expires_in, revoked_before) {
            let span = jiff::SignedDuration::try_from(ttl.get()).ok();
            match span.and_then(|s| revoked_before.checked_add(s).ok()) {
                None => problems.push(format!("--expires-in {} is out of range", ttl.as_str())),
                Some(at) if at <= now => problems.push(format!(
                    "--expires-in {}: the revocation would already have expired at {at}",
                    ttl.as_str()
                )),
                Some(at) => expires_at = Some(at),
            }
        }
        let Some(revoked_before) = revoked_before.filter(|_| problems.is_empty()) else {
            bail!(
                "invalid revocation request:\n  - {}",
                problems.join("\n  - ")
            );
        };
        Ok(Self {
            issuer: args.issuer.clone(),
            subject: args.subject.clone(),
            tenant: args.tenant.clone(),
            client: args.client.clone(),
            reason: args.reason.into(),
            revoked_before,
            expires_at,
        })
    }

    /// `manual-` and 20 hex digits of SHA-256 over the principal and `revokedBefore` (each
    /// field length-prefixed, an absent subject, tenant or client distinct from every value).
    pub fn name(&self) -> String {
        let mut hash = Sha256::new();
        let fields = [
            Some(self.issuer.as_str()),
            self.subject.as_deref(),
            self.tenant.as_deref(),
            self.client.as_deref(),
            Some(&self.revoked_before.to_string()),
        ];
        for field in fields {
            match field {
                Some(value) => {
                    hash.update((value.len() as u64).to_be_bytes());
                    hash.update(value.as_bytes());
                }
                None => hash.update(u64::MAX.to_be_bytes()),
            }
        }
        let digest = hash.finalize();
        let hex = hex::encode(&digest[..10]);
        format!("manual-{hex}")
    }

    /// The PrincipalRevocation to create.
    pub fn object(&self) -> PrincipalRevocation {
        let mut revocation = PrincipalRevocation::new(
            &self.name(),
            PrincipalRevocationSpec {
                issuer: self.issuer.clone(),
                subject: self.subject.clone(),
                tenant: self.tenant.clone(),
                client: self.client.clone(),
                revoked_before: Time(self.revoked_before),
                reason: self.reason,
                source: RevocationSource {
                    kind: RevocationSourceKind::Manual,
                    event_type: None,
                    issuer: None,
                    jti: None,
                    txn: None,
                },
                expires_at: self.expires_at.map(Time),
            },
        );
        revocation.metadata.labels = Some(BTreeMap::from([(
            SOURCE_LABEL.to_owned(),
            SOURCE_LABEL_VALUE.to_owned(),
        )]));
        revocation
    }
}

/// Why an existing object of the same name is not the revocation asked for (empty when it
/// is: same principal, reason and expiry, and a `revokedBefore` at least as late).
pub fn differences(
    existing: &PrincipalRevocationSpec,
    asked: &PrincipalRevocationSpec,
) -> Vec<String> {
    let mut found = Vec::new();
    let principal = |s: &PrincipalRevocationSpec| {
        (
            s.issuer.clone(),
            s.subject.clone(),
            s.tenant.clone(),
            s.client.clone(),
        )
    };
    if principal(existing) != principal(asked) {
        found.push(format!(
            "it revokes {} at {}",
            principal_label(
                existing.subject.as_deref(),
                existing.tenant.as_deref(),
                existing.client.as_deref()
            ),
            existing.issuer
        ));
    }
    if existing.reason != asked.reason {
        found.push(format!(
            "its reason is {} (asked: {})",
            reason_name(existing.reason),
            reason_name(asked.reason)
        ));
    }
    if existing.revoked_before.0 < asked.revoked_before.0 {
        found.push(format!(
            "its revokedBefore is {} (asked: {})",
            existing.revoked_before.0, asked.revoked_before.0
        ));
    }
    if existing.expires_at != asked.expires_at {
        let show = |t: &Option<Time>| t.as_ref().map_or("none".to_owned(), |t| t.0.to_string());
        found.push(format!(
            "its expiresAt is {} (asked: {})",
            show(&existing.expires_at),
            show(&asked.expires_at)
        ));
    }
    found
}

fn reason_name(reason: RevocationReason) -> String {
    match serde_json::to_value(reason) {
        Ok(serde_json::Value::String(name)) => name,
        other => format!("{other:?}"),
    }
}

/// What `--wait` reports when it gives up.
pub fn timeout_message(name: &str, last: &Progress, timeout: &str) -> String {
    let what = match last {
        Progress::NotObserved => {
            "the Lifeguard operator has not reported on it yet (no status: is the operator running?)"
                .to_owned()
        }
        Progress::Propagating {
            acknowledged,
            target: Some(target),
            ..
        } => format!(
            "{acknowledged} of {target} targeted sidecars applied it; {} still pending",
            (target - acknowledged).max(0)
        ),
        Progress::Propagating {
            acknowledged,
            target: None,
            ..
        } => format!(
            "{acknowledged} sidecars applied it and the operator has not fixed the target yet"
        ),
        Progress::Complete { .. } => "it completed".to_owned(),
    };
    format!(
        "timed out after {timeout} waiting for principalrevocation {name} to propagate: {what}. \
         It stays in force; follow it with `kubectl get principalrevocation {name} -o wide`"
    )
}

fn explain_reason(request: &RevocationRequest) -> String {
    let reason = reason_name(request.reason);
    if request.reason.refuses_all_tokens() {
        format!("{reason}: every token of the principal is refused until the object is deleted")
    } else {
        format!(
            "{reason}: tokens issued at or before {} are refused; tokens issued later work",
            request.revoked_before
        )
    }
}

pub fn run(args: &RevokeArgs) -> Result<ExitCode> {
    let request = RevocationRequest::from_args(args, Timestamp::now())?;
    block_on(async {
        let cluster = args.cluster.connect().await?;
        cluster.ensure_served(&[REVOCATIONS]).await?;
        let api: Api<PrincipalRevocation> = Api::all(cluster.client.clone());
        let object = create_or_find(&cluster, &api, &request, args.output).await?;
        let report = |line: &str| say(args.output, line);
        let outcome = if args.wait {
            follow(&api, object, args.timeout.get(), report).await
        } else {
            Ok(object)
        };
        match outcome {
            Ok(object) => {
                if args.output == Output::Json {
                    print_stdout(&(serde_json::to_string_pretty(&object)? + "\n"))?;
                }
                Ok(ExitCode::SUCCESS)
            }
            Err(Unfinished::TimedOut(last, error)) => {
                let mut message = timeout_message(&request.name(), &last, args.timeout.as_str());
                if let Some(error) = error {
                    message.push_str(&format!(
                        " (last error watching it on {}: {error})",
                        cluster.description
                    ));
                }
                eprintln!("error: {message}");
                Ok(ExitCode::FAILURE)
            }
            Err(Unfinished::Deleted) => {
                eprintln!(
                    "error: principalrevocation {} was deleted (expired, or by someone) before \
                     it finished propagating",
                    request.name()
                );
                Ok(ExitCode::FAILURE)
            }
        }
    })
}

/// A line for people: on stdout, or on stderr when stdout carries JSON.
fn say(output: Output, line: &str) {
    match output {
        // A closed stdout is not a reason to stop revoking.
        Output::Table => {
            let _ = print_stdout(&format!("{line}\n"));
        }
        Output::Json => eprintln!("{line}"),
    }
}

async fn create_or_find(
    cluster: &Cluster,
    api: &Api<PrincipalRevocation>,
    request: &RevocationRequest,
    output: Output,
) -> Result<PrincipalRevocation> {
    let desired = request.object();
    let name = desired.name_any();
    let report = |line: String| say(output, &line);
    let object = match api.create(&PostParams::default(), &desired).await {
        Ok(created) => {
            report(format!("principalrevocation.lifeguard.dev/{name} created"));
            created
        }
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let existing = api
                .get(&name)
                .await
                .map_err(|e| cluster.explain(e, &format!("reading principalrevocation {name}")))?;
            let differences = differences(&existing.spec, &desired.spec);
            if !differences.is_empty() {
                return Err(anyhow!(
                    "principalrevocation {name} already exists but is not this request: {}. \
                     Inspect it with `kubectl get principalrevocation {name} -o yaml`",
                    differences.join("; ")
                ));
            }
            let age = existing
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| {
                    let seconds = Timestamp::now().as_second() - t.0.as_second();
                    format!(" (created {} ago)", human_duration(seconds.max(0)))
                })
                .unwrap_or_default();
            report(format!(
                "principalrevocation.lifeguard.dev/{name} already exists{age}; nothing created"
            ));
            existing
        }
        Err(e) => return Err(cluster.explain(e, &format!("creating principalrevocation {name}"))),
    };
    report(format!(
        "  principal:     {} at {}",
        principal_label(
            request.subject.as_deref(),
            request.tenant.as_deref(),
            request.client.as_deref()
        ),
        request.issuer
    ));
    report(format!("  reason:        {}", explain_reason(request)));
    report(format!(
        "  revokedBefore: {} (repeat this exact request with --revoked-before {})",
        request.revoked_before, request.revoked_before
    ));
    if let Some(expires_at) = request.expires_at {
        report(format!("  expiresAt:     {expires_at}"));
    }
    Ok(object)
}

/// Why `--wait` stopped without completion: the last progress seen and the last watch error.
enum Unfinished {
    TimedOut(Progress, Option<String>),
    Deleted,
}

/// Watches the object until the operator reports it propagated, saying every new state.
async fn follow(
    api: &Api<PrincipalRevocation>,
    object: PrincipalRevocation,
    timeout: Duration,
    report: impl Fn(&str),
) -> Result<PrincipalRevocation, Unfinished> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = progress(&object);
    report(&last.to_string());
    if matches!(last, Progress::Complete { .. }) {
        return Ok(object);
    }
    let config = watcher::Config::default().fields(&format!("metadata.name={}", object.name_any()));
    let mut events = watcher(api.clone(), config).default_backoff().boxed();
    let mut last_error = None;
    let mut listed = false;
    loop {
        let event = match tokio::time::timeout_at(deadline, events.next()).await {
            Err(_) | Ok(None) => return Err(Unfinished::TimedOut(last, last_error)),
            Ok(Some(Err(e))) => {
                last_error = Some(e.to_string());
                continue;
            }
            Ok(Some(Ok(event))) => event,
        };
        let current = match event {
            watcher::Event::Init => {
                listed = false;
                continue;
            }
            watcher::Event::InitDone if !listed => return Err(Unfinished::Deleted),
            watcher::Event::InitDone => continue,
            watcher::Event::Delete(_) => return Err(Unfinished::Deleted),
            watcher::Event::InitApply(object) | watcher::Event::Apply(object) => {
                listed = true;
                object
            }
        };
        let now = progress(&current);
        if now != last {
            report(&now.to_string());
            last = now;
        }
        if matches!(last, Progress::Complete { .. }) {
            return Ok(current);
        }
    }
}

#[cfg(test)]
#[path = "revoke_tests.rs"]
mod tests;
