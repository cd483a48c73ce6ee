//! `lifeguard status` (also `kubectl lifeguard status`): what Lifeguard enforces in a cluster
//! right now, read from the status the operator writes: policies and their sidecars, the
//! capability exceptions that have not expired, and the revocations still propagating.

use std::process::ExitCode;

use anyhow::Result;
use jiff::Timestamp;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, ListParams};
use kube::{Resource, ResourceExt};
use lifeguard::api::{CapabilityException, McpServerPolicy, PrincipalRevocation, conditions};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::cluster::{
    Cluster, EXCEPTIONS, KubectlArgs, Output, POLICIES, REVOCATIONS, block_on, print_stdout,
};
use super::present::{Progress, human_duration, principal_label, progress};

/// Flags of `status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub cluster: KubectlArgs,
    /// Namespace of the policies and exceptions shown (default: the context's namespace).
    /// PrincipalRevocations are cluster-wide and always shown.
    #[arg(short = 'n', long, value_name = "NS")]
    pub namespace: Option<String>,
    /// Policies and exceptions of every namespace.
    #[arg(short = 'A', long, conflicts_with = "namespace")]
    pub all_namespaces: bool,
    /// Output format. `json` lists every exception and revocation, with `expired` and
    /// `complete` flags, where the table leaves out expired and completed ones.
    #[arg(short = 'o', long = "output", value_enum, default_value_t)]
    pub output: Output,
}

pub fn run(args: &StatusArgs) -> Result<ExitCode> {
    block_on(async {
        let cluster = args.cluster.connect().await?;
        cluster
            .ensure_served(&[POLICIES, EXCEPTIONS, REVOCATIONS])
            .await?;
        let namespace = (!args.all_namespaces).then(|| {
            args.namespace
                .clone()
                .unwrap_or_else(|| cluster.default_namespace.clone())
        });
        let ns = namespace.as_deref();
        let client = &cluster.client;
        let (policies, exceptions, revocations) = tokio::try_join!(
            list(&cluster, in_scope::<McpServerPolicy>(client, ns)),
            list(&cluster, in_scope::<CapabilityException>(client, ns)),
            list(&cluster, Api::<PrincipalRevocation>::all(client.clone())),
        )?;
        let report = StatusReport::new(
            namespace,
            &policies,
            &exceptions,
            &revocations,
            Timestamp::now(),
        );
        match args.output {
            Output::Table => print_stdout(&report.render())?,
            Output::Json => print_stdout(&(serde_json::to_string_pretty(&report)? + "\n"))?,
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// The namespaced resource `K` in `namespace`, or in every namespace.
fn in_scope<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Every object `api` reaches.
async fn list<K>(cluster: &Cluster, api: Api<K>) -> Result<Vec<K>>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let plural = K::plural(&());
    api.list(&ListParams::default())
        .await
        .map(|list| list.items)
        .map_err(|e| cluster.explain(e, &format!("listing {plural}")))
}

/// Everything `status` shows; also its `-o json` document.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StatusReport {
    /// The namespace of the policies and exceptions; `null` for all namespaces.
    pub namespace: Option<String>,
    pub policies: Vec<PolicyRow>,
    pub exceptions: Vec<ExceptionRow>,
    pub revocations: Vec<RevocationRow>,
}

/// One McpServerPolicy as its status reports it.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRow {
    pub namespace: String,
    pub name: String,
    /// The `Ready` condition: `True`, `False`, or `Unknown` when there is none.
    pub ready: String,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub matched_pods: Option<i32>,
    pub sidecars_in_sync: Option<i32>,
    /// The compiled policy version the sidecars should run.
    pub policy_hash: Option<String>,
    /// The `Conflict` message when an older policy selects some of the same pods.
    pub conflict: Option<String>,
    /// Whether the status describes the current `metadata.generation`.
    pub up_to_date: bool,
}

/// One CapabilityException.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ExceptionRow {
    pub namespace: String,
    pub name: String,
    pub policy: String,
    pub capability: String,
    /// `Active`, `NotYetValid`, `Expired`, `Invalid`, or `Unknown` before the operator wrote one.
    pub state: String,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub approver: Option<String>,
    pub not_before: Timestamp,
    pub expires_at: Timestamp,
    /// Seconds until `expiresAt` (negative once passed).
    pub expires_in_seconds: i64,
    pub expired: bool,
}

/// One PrincipalRevocation and how far it has spread.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RevocationRow {
    pub name: String,
    pub issuer: String,
    pub subject: Option<String>,
    pub tenant: Option<String>,
    pub client: Option<String>,
    pub reason: String,
    pub target_sidecars: Option<i32>,
    pub acknowledged_sidecars: Option<i32>,
    /// The operator reported `Propagated=True` for the current generation.
    pub complete: bool,
    /// Whether the operator has written status for the current generation.
    pub observed: bool,
    pub created: Option<Timestamp>,
    pub age_seconds: Option<i64>,
}

fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

fn non_empty(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_owned())
}

/// The name serde gives a unit enum value (`sessionRevoked`, `sampling`).
fn serde_name<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        other => format!("{other:?}"),
    }
}

impl PolicyRow {
    pub fn new(policy: &McpServerPolicy) -> Self {
        let status = policy.status.clone().unwrap_or_default();
        let ready = condition(&status.conditions, conditions::READY);
        let conflict = condition(&status.conditions, conditions::CONFLICT)
            .filter(|c| c.status == "True")
            .map(|c| c.message.clone());
        let up_to_date = match (status.observed_generation, policy.metadata.generation) {
            (Some(observed), Some(generation)) => observed >= generation,
            (None, _) => false,
            (Some(_), None) => true,
        };
        Self {
            namespace: policy.namespace().unwrap_or_default(),
            name: policy.name_any(),
            ready: ready.map_or_else(|| "Unknown".to_owned(), |c| c.status.clone()),
            reason: ready.and_then(|c| non_empty(&c.reason)),
            message: ready.and_then(|c| non_empty(&c.message)),
            matched_pods: status.matched_pods,
            sidecars_in_sync: status.sidecars_in_sync,
            policy_hash: status.policy_hash,
            conflict,
            up_to_date,
        }
    }
}

impl ExceptionRow {
    pub fn new(exception: &CapabilityException, now: Timestamp) -> Self {
        let status = exception.status.clone().unwrap_or_default();
        let ready = condition(&status.conditions, conditions::READY);
        let expires_at = exception.spec.expires_at.0;
        let state = status
            .state
            .map_or_else(|| "Unknown".to_owned(), |s| serde_name(&s));
        Self {
            namespace: exception.namespace().unwrap_or_default(),
            name: exception.name_any(),
            policy: exception.spec.policy_ref.name.clone(),
            capability: serde_name(&exception.spec.capability),
            expired: state == "Expired" || expires_at <= now,
            state,
            reason: ready.and_then(|c| non_empty(&c.reason)),
            message: ready.and_then(|c| non_empty(&c.message)),
            approver: status.approver,
            not_before: exception.spec.not_before.0,
            expires_at,
            expires_in_seconds: expires_at.as_second() - now.as_second(),
        }
    }
}

impl RevocationRow {
    pub fn new(revocation: &PrincipalRevocation, now: Timestamp) -> Self {
        let spec = &revocation.spec;
        let status = revocation.status.clone().unwrap_or_default();
        let progress = progress(revocation);
        let created = revocation.metadata.creation_timestamp.as_ref().map(|t| t.0);
        Self {
            name: revocation.name_any(),
            issuer: spec.issuer.clone(),
            subject: spec.subject.clone(),
            tenant: spec.tenant.clone(),
            client: spec.client.clone(),
            reason: serde_name(&spec.reason),
            target_sidecars: status.target_sidecars,
            acknowledged_sidecars: status.acknowledged_sidecars,
            complete: matches!(progress, Progress::Complete { .. }),
            observed: progress != Progress::NotObserved,
            created,
            age_seconds: created.map(|c| now.as_second() - c.as_second()),
        }
    }
}

impl StatusReport {
    pub fn new(
        namespace: Option<String>,
        policies: &[McpServerPolicy],
        exceptions: &[CapabilityException],
        revocations: &[PrincipalRevocation],
        now: Timestamp,
    ) -> Self {
        let mut policies: Vec<PolicyRow> = policies.iter().map(PolicyRow::new).collect();
        policies.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        let mut exceptions: Vec<ExceptionRow> = exceptions
            .iter()
            .map(|e| ExceptionRow::new(e, now))
            .collect();
        exceptions.sort_by(|a, b| {
            (a.expires_at, &a.namespace, &a.name).cmp(&(b.expires_at, &b.namespace, &b.name))
        });
        let mut revocations: Vec<RevocationRow> = revocations
            .iter()
            .map(|r| RevocationRow::new(r, now))
            .collect();
        revocations.sort_by(|a, b| (a.created, &a.name).cmp(&(b.created, &b.name)));
        Self {
            namespace,
            policies,
            exceptions,
            revocations,
        }
    }

    fn scope(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("in namespace {ns}"),
            None => "in all namespaces".to_owned(),
        }
    }

    /// The human-readable report: three tables, each followed by notes on what is not well.
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.render_policies(&mut out);
        out.push('\n');
        self.render_exceptions(&mut out);
        out.push('\n');
        self.render_revocations(&mut out);
        out
    }

    fn render_policies(&self, out: &mut String) {
        let scope = self.scope();
        if self.policies.is_empty() {
            out.push_str(&format!("No McpServerPolicies {scope}.\n"));
            return;
        }
        out.push_str(&format!("McpServerPolicies {scope}:\n"));
        let rows: Vec<Vec<String>> = self
            .policies
            .iter()
            .map(|p| {
                vec![
                    p.namespace.clone(),
                    p.name.clone(),
                    p.ready.clone(),
                    p.reason.clone().unwrap_or_else(|| "-".into()),
                    count(p.matched_pods),
                    match (p.sidecars_in_sync, p.matched_pods) {
                        (Some(in_sync), Some(matched)) => format!("{in_sync}/{matched}"),
                        _ => "-".into(),
                    },
                    p.policy_hash
                        .as_deref()
                        .map_or_else(|| "-".into(), |h| h.chars().take(12).collect()),
                ]
            })
            .collect();
        table(
            out,
            &[
                "NAMESPACE",
                "NAME",
                "READY",
                "REASON",
                "PODS",
                "IN-SYNC",
                "VERSION",
            ],
            &rows,
        );
        for p in &self.policies {
            let who = format!("{}/{}", p.namespace, p.name);
            if p.ready == "Unknown" {
                note(
                    out,
                    &who,
                    "no status yet; is the Lifeguard operator running?",
                );
            } else if !p.up_to_date {
                note(
                    out,
                    &who,
                    "the status describes an older generation of the spec; the operator has not caught up yet",
                );
            } else if p.ready != "True"
                && let Some(message) = &p.message
            {
                note(out, &who, message);
            }
            if let Some(conflict) = &p.conflict {
                note(out, &who, &format!("conflict: {conflict}"));
            }
        }
    }

    fn render_exceptions(&self, out: &mut String) {
        let shown: Vec<&ExceptionRow> = self.exceptions.iter().filter(|e| !e.expired).collect();
        let hidden = self.exceptions.len() - shown.len();
        let scope = self.scope();
        if shown.is_empty() {
            out.push_str(&format!("No unexpired CapabilityExceptions {scope}.\n"));
        } else {
            out.push_str(&format!("CapabilityExceptions {scope}:\n"));
            let rows: Vec<Vec<String>> = shown
                .iter()
                .map(|e| {
                    vec![
                        e.namespace.clone(),
                        e.name.clone(),
                        e.policy.clone(),
                        e.capability.clone(),
                        e.state.clone(),
                        e.expires_at.to_string(),
                        human_duration(e.expires_in_seconds),
                        e.approver.clone().unwrap_or_else(|| "-".into()),
                    ]
                })
                .collect();
            table(
                out,
                &[
                    "NAMESPACE",
                    "NAME",
                    "POLICY",
                    "CAPABILITY",
                    "STATE",
                    "EXPIRES",
                    "EXPIRES-IN",
                    "APPROVER",
                ],
                &rows,
            );
            for e in &shown {
                let who = format!("{}/{}", e.namespace, e.name);
                if e.state == "Unknown" {
                    note(
                        out,
                        &who,
                        "no status yet; is the Lifeguard operator running?",
                    );
                } else if e.state != "Active" {
                    let why = match (&e.reason, &e.message) {
                        (Some(reason), Some(message)) => format!("{reason}: {message}"),
                        (Some(text), None) | (None, Some(text)) => text.clone(),
                        (None, None) => e.state.clone(),
                    };
                    note(out, &who, &why);
                }
            }
        }
        if hidden > 0 {
            out.push_str(&format!(
                "({hidden} expired exception{} not shown)\n",
                plural_s(hidden)
            ));
        }
    }

    fn render_revocations(&self, out: &mut String) {
        let shown: Vec<&RevocationRow> = self.revocations.iter().filter(|r| !r.complete).collect();
        let hidden = self.revocations.len() - shown.len();
        if shown.is_empty() {
            out.push_str("No PrincipalRevocations in progress (cluster-wide).\n");
        } else {
            out.push_str("PrincipalRevocations in progress (cluster-wide):\n");
            let rows: Vec<Vec<String>> = shown
                .iter()
                .map(|r| {
                    vec![
                        r.name.clone(),
                        r.issuer.clone(),
                        principal_label(
                            r.subject.as_deref(),
                            r.tenant.as_deref(),
                            r.client.as_deref(),
                        ),
                        r.reason.clone(),
                        match (r.acknowledged_sidecars, r.target_sidecars) {
                            (Some(acked), Some(target)) if r.observed => {
                                format!("{acked}/{target}")
                            }
                            _ => "-".into(),
                        },
                        r.age_seconds.map_or_else(|| "-".into(), human_duration),
                    ]
                })
                .collect();
            table(
                out,
                &["NAME", "ISSUER", "SUBJECT", "REASON", "PROPAGATED", "AGE"],
                &rows,
            );
            for r in shown.iter().filter(|r| !r.observed) {
                note(
                    out,
                    &r.name,
                    "no status yet; is the Lifeguard operator running?",
                );
            }
        }
        if hidden > 0 {
            out.push_str(&format!(
                "({hidden} completed revocation{} not shown)\n",
                plural_s(hidden)
            ));
        }
    }
}

fn plural_s(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn count(value: Option<i32>) -> String {
    value.map_or_else(|| "-".into(), |v| v.to_string())
}

fn note(out: &mut String, who: &str, text: &str) {
    out.push_str(&format!("  ! {who}: {text}\n"));
}

/// Columns padded to their widest cell and separated by three spaces, as kubectl prints them.
pub fn table(out: &mut String, header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
            if i > 0 {
                line.push_str("   ");
            }
            line.push_str(cell);
            line.extend(std::iter::repeat_n(' ', width - cell.chars().count()));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
