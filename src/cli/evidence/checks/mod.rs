//! The adversarial checks, and what they share: the principals, one recorder per check, and
//! the few task chores every check needs (create, poll until, cancel and wait).
//!
//! A check states what it proves and what it does not cover, sends requests through its
//! [`Run`] (which records each one), and calls [`Run::expect`] for every documented answer. It
//! passes when every expectation held, fails otherwise, and is "not run" when it could not be
//! attempted here ([`Run::skip`]). Every check cancels the tasks it started, so the next one
//! starts from a quiet server.

mod envelope;
mod expiry;
mod lifecycle;
mod limits;
mod listen;
mod ownership;
mod reload;
mod revoked;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Result;
use lifeguard::policy::{ListenRules, TaskRules};
use serde_json::{Value, json};

use super::admin::Admin;
use super::audit::AuditTrail;
use super::call::Call;
use super::policy::PolicyFacts;
use super::probe::{Answer, Exchange, Minter, Principal, Probe};
use super::report::{CheckResult, Verdict};

/// The example server's tools the checks start as tasks.
pub const TOOLS_USED: &[&str] = &["write_rows", "slow_compute", "confirm_action"];

/// A check's name and what it is evidence of.
pub struct CheckDef {
    pub id: &'static str,
    pub title: &'static str,
    pub proves: &'static str,
    pub does_not_cover: &'static str,
}

/// Every check, in the order they run.
pub const CHECKS: &[CheckDef] = &[
    ownership::POLICY_HASH,
    ownership::CROSS_PRINCIPAL,
    ownership::GUESSED_IDS,
    ownership::TOKENS,
    expiry::TOKEN_EXPIRES_MID_TASK,
    envelope::ENVELOPE,
    lifecycle::CANCEL_THEN_WRITES,
    lifecycle::READ_ONCE,
    lifecycle::DEADLINE,
    limits::QUOTA,
    limits::IDEMPOTENCY,
    listen::LISTEN,
    reload::TOOL_REMOVED_MID_RUN,
    revoked::USER_DISABLED_MID_RUN,
];

/// Checks renamed since a release: `--check OLD` is refused with the new name (the names are
/// the report's JSON contract; docs/evidence-pack.md, "Renamed checks").
pub const RENAMED: &[(&str, &str)] = &[("disable-mid-run", "tool-removed-mid-run")];

/// The callers the checks play. Alice owns the tasks; everyone else tries to reach them.
pub struct People {
    pub alice: String,
    pub bob: String,
    pub carol: String,
    /// Subject `alice` in another tenant.
    pub alice_other_tenant: String,
    /// Alice through another OAuth client.
    pub alice_other_client: String,
    /// A principal of its own tenant, for the quota check.
    pub dave: String,
}

pub const ALICE: Principal = Principal {
    label: "alice token",
    subject: "alice",
    tenant: "tenant-a",
    client: "console",
};
const BOB: Principal = Principal {
    label: "bob token",
    subject: "bob",
    tenant: "tenant-a",
    client: "console",
};
const CAROL: Principal = Principal {
    label: "carol token",
    subject: "carol",
    tenant: "tenant-b",
    client: "console",
};
const ALICE_OTHER_TENANT: Principal = Principal {
    label: "alice@tenant-b token",
    subject: "alice",
    tenant: "tenant-b",
    client: "console",
};
const ALICE_OTHER_CLIENT: Principal = Principal {
    label: "alice via client cli token",
    subject: "alice",
    tenant: "tenant-a",
    client: "cli",
};
const DAVE: Principal = Principal {
    label: "dave token",
    subject: "dave",
    tenant: "tenant-q",
    client: "console",
};

/// Everything the checks share.
pub struct Env {
    pub probe: Probe,
    pub minter: Minter,
    pub audit: Option<AuditTrail>,
    pub facts: Option<PolicyFacts>,
    pub admin: Option<Admin>,
    pub upstream_debug: Option<url::Url>,
    /// `--expect-hash`: the policy version the target should enforce.
    pub expect_hash: Option<String>,
    pub people: People,
    /// Unique per run: labels rows and idempotency keys so runs never mix.
    pub nonce: String,
    /// The `policy_hash` the audit trail showed before any check changed the policy.
    pub audit_hash: Mutex<Option<String>>,
}

impl Env {
    pub fn new(
        probe: Probe,
        minter: Minter,
        audit: Option<AuditTrail>,
        facts: Option<PolicyFacts>,
        admin: Option<Admin>,
        upstream_debug: Option<url::Url>,
        expect_hash: Option<String>,
    ) -> Result<Self> {
        let mint = |p: &Principal| -> Result<String> {
            let token = minter.token_with(p, |_| {})?;
            probe.label(&token, p.label);
            Ok(token)
        };
        let people = People {
            alice: mint(&ALICE)?,
            bob: mint(&BOB)?,
            carol: mint(&CAROL)?,
            alice_other_tenant: mint(&ALICE_OTHER_TENANT)?,
            alice_other_client: mint(&ALICE_OTHER_CLIENT)?,
            dave: mint(&DAVE)?,
        };
        let nonce = format!("ev{}", jiff::Timestamp::now().as_millisecond());
        Ok(Self {
            probe,
            minter,
            audit,
            facts,
            admin,
            upstream_debug,
            expect_hash,
            people,
            nonce,
            audit_hash: Mutex::new(None),
        })
    }

    /// The policy's task rules, when the policy is known and has tasks.
    pub fn tasks(&self) -> Option<&TaskRules> {
        self.facts.as_ref().and_then(|f| f.policy.tasks.as_ref())
    }

    pub fn listen_rules(&self) -> Option<&ListenRules> {
        self.facts.as_ref().and_then(|f| f.policy.listen.as_ref())
    }

    /// Runs one check and turns its record into a result.
    pub async fn run(&self, check: &'static CheckDef) -> CheckResult {
        let started = Instant::now();
        let mark = self.audit.as_ref().map(AuditTrail::mark);
        let mut run = Run::default();
        match check.id {
            "policy-hash" => ownership::policy_hash(self, &mut run).await,
            "cross-principal" => ownership::cross_principal(self, &mut run).await,
            "guessed-ids" => ownership::guessed_ids(self, &mut run).await,
            "tokens" => ownership::tokens(self, &mut run).await,
            "token-expires-mid-task" => expiry::token_expires_mid_task(self, &mut run).await,
            "envelope" => envelope::envelope(self, &mut run).await,
            "cancel-then-writes" => lifecycle::cancel_then_writes(self, &mut run).await,
            "read-once" => lifecycle::read_once(self, &mut run).await,
            "deadline" => lifecycle::deadline(self, &mut run).await,
            "quota" => limits::quota(self, &mut run).await,
            "idempotency" => limits::idempotency(self, &mut run).await,
            "listen" => listen::listen(self, &mut run).await,
            "tool-removed-mid-run" => reload::tool_removed_mid_run(self, &mut run).await,
            "user-disabled-mid-run" => revoked::user_disabled_mid_run(self, &mut run).await,
            other => run.fail(format!("no implementation for check {other}")),
        }
        let audit = match (&self.audit, mark) {
            (Some(trail), Some(mark)) => trail.since(mark).await,
            _ => Vec::new(),
        };
        run.finish(check, audit, started.elapsed())
    }

    /// Whether the policy (when known) lets every tool in `tools` run as a task; if not, the
    /// check is skipped with the reason.
    pub fn task_tools_allowed(&self, run: &mut Run, tools: &[&str]) -> bool {
        let Some(facts) = &self.facts else {
            return true;
        };
        let Some(tasks) = &facts.policy.tasks else {
            run.skip("the policy enables no tasks (no `tasks` section)");
            return false;
        };
        if let Some(tool) = tools.iter().find(|t| !tasks.allows_tool(t)) {
            run.skip(format!(
                "the policy does not let {tool} run as a task (`tasks.tools`)"
            ));
            return false;
        }
        true
    }

    /// `tools/call` that must become a task; the sidecar's task ID, or `None` (recorded as a
    /// failure).
    pub async fn create_task(
        &self,
        run: &mut Run,
        label: &str,
        token: &str,
        tool: &str,
        arguments: Value,
    ) -> Option<String> {
        let answer = run
            .send(&self.probe, Call::tool(label, tool, arguments).token(token))
            .await;
        let id = answer.result()["taskId"].as_str().map(str::to_owned);
        let ok = answer.status == 200 && answer.result()["resultType"] == "task" && id.is_some();
        run.expect(ok, || {
            format!(
                "{label}: expected a task (HTTP 200, resultType task), got HTTP {} {}",
                answer.status,
                short(&answer.raw)
            )
        });
        if ok { id } else { None }
    }

    /// Polls `tasks/get` until `done` holds for the answer or `timeout` passes; records only
    /// the last poll (and a note with how many there were).
    pub async fn poll_until(
        &self,
        run: &mut Run,
        label: &str,
        token: &str,
        task_id: &str,
        timeout: Duration,
        done: impl Fn(&Answer) -> bool,
    ) -> Answer {
        let deadline = Instant::now() + timeout;
        let mut polls = 0;
        loop {
            polls += 1;
            let call = Call::task(label, "tasks/get", task_id).token(token);
            let (exchange, answer) = self.probe.send(&call).await;
            if done(&answer) || answer.status == 0 || Instant::now() >= deadline {
                run.record(exchange);
                if polls > 1 {
                    run.note(format!("{label}: {polls} polls, the last one shown"));
                }
                return answer;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Cancels a task as cleanup and waits until it is terminal (its quota slot is free).
    pub async fn cancel_and_wait(&self, run: &mut Run, token: &str, task_id: &str) {
        let call = Call::task("cleanup: cancel", "tasks/cancel", task_id).token(token);
        let (_, answer) = self.probe.send(&call).await;
        if answer.status != 200 {
            run.note(format!(
                "cleanup: tasks/cancel answered HTTP {}",
                answer.status
            ));
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let call = Call::task("cleanup: poll", "tasks/get", task_id).token(token);
            let (_, answer) = self.probe.send(&call).await;
            if answer.status != 200 || is_terminal(answer.task_status()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        run.note("cleanup: a cancelled task did not end within 20 s");
    }

    /// A URL on the example server's debug API, when `--upstream-debug` was given.
    pub fn debug_url(&self, path: &str) -> Option<url::Url> {
        self.upstream_debug.as_ref().and_then(|b| b.join(path).ok())
    }

    /// The example server's request log (`/_example/requests`, its last 200 requests), or
    /// `None` without `--upstream-debug`.
    async fn upstream_log(&self) -> Option<Vec<Value>> {
        let url = self.debug_url("/_example/requests")?;
        let seen = self.probe.get_json(url).await.ok()?;
        seen.as_array().cloned()
    }

    /// Where the server's request log stands now: the time of its latest entry.
    pub async fn upstream_mark(&self) -> Option<u64> {
        let log = self.upstream_log().await?;
        Some(
            log.iter()
                .filter_map(|r| r["atMs"].as_u64())
                .max()
                .unwrap_or(0),
        )
    }

    /// How many requests with `Mcp-Method: method` reached the server after `mark`.
    pub async fn upstream_since(&self, mark: Option<u64>, method: &str) -> Option<usize> {
        let mark = mark?;
        let log = self.upstream_log().await?;
        Some(
            log.iter()
                .filter(|r| r["atMs"].as_u64().is_some_and(|t| t > mark))
                .filter(|r| r["mcpMethod"] == method)
                .count(),
        )
    }
}

/// One check's record while it runs.
#[derive(Default)]
pub struct Run {
    exchanges: Vec<Exchange>,
    failures: Vec<String>,
    notes: Vec<String>,
    skipped: Option<String>,
    summary: Option<String>,
}

impl Run {
    /// Sends `call` and records it.
    pub async fn send(&mut self, probe: &Probe, call: Call) -> Answer {
        let (exchange, answer) = probe.send(&call).await;
        self.record(exchange);
        answer
    }

    pub fn record(&mut self, exchange: Exchange) {
        self.exchanges.push(exchange);
    }

    /// Records a failure unless `ok`; returns `ok`.
    pub fn expect(&mut self, ok: bool, what: impl FnOnce() -> String) -> bool {
        if !ok {
            self.failures.push(what());
        }
        ok
    }

    pub fn fail(&mut self, what: impl Into<String>) {
        self.failures.push(what.into());
    }

    pub fn note(&mut self, what: impl Into<String>) {
        self.notes.push(what.into());
    }

    /// The check cannot run here, and says why.
    pub fn skip(&mut self, why: impl Into<String>) {
        self.skipped = Some(why.into());
    }

    pub fn is_skipped(&self) -> bool {
        self.skipped.is_some()
    }

    /// What held, in one sentence, for a passing check.
    pub fn summary(&mut self, what: impl Into<String>) {
        self.summary = Some(what.into());
    }

    fn finish(self, check: &'static CheckDef, audit: Vec<Value>, took: Duration) -> CheckResult {
        let (verdict, reason) = match (self.failures.first(), &self.skipped) {
            (Some(first), _) => (
                Verdict::Fail,
                if self.failures.len() > 1 {
                    format!("{first} (and {} more)", self.failures.len() - 1)
                } else {
                    first.clone()
                },
            ),
            (None, Some(why)) => (Verdict::NotRun, why.clone()),
            (None, None) => (
                Verdict::Pass,
                self.summary
                    .unwrap_or_else(|| "every documented answer was observed".to_owned()),
            ),
        };
        CheckResult {
            id: check.id,
            title: check.title,
            proves: check.proves,
            does_not_cover: check.does_not_cover,
            verdict,
            reason,
            failures: self.failures,
            notes: self.notes,
            exchanges: self.exchanges,
            audit,
            elapsed_ms: took.as_millis() as u64,
        }
    }
}

pub fn is_terminal(status: &str) -> bool {
    matches!(status, "completed" | "failed" | "cancelled")
}

/// The documented answer to every task ID a caller may not see (docs/sidecar.md, "Every later
/// request" and "Refusals"): HTTP 400 and this body, whatever the reason.
pub fn is_task_not_found(answer: &Answer) -> bool {
    answer.status == 400
        && answer.body_without_id()
            == json!({"jsonrpc": "2.0", "error": {"code": -32602, "message": "Task not found",
                      "data": {"reason": "task_not_found", "remediation": "none"}}})
}

/// The first 300 characters of an answer, for a failure message.
pub fn short(text: &str) -> String {
    let mut end = text.len().min(300);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let cut = if end < text.len() { "…" } else { "" };
    format!("{}{cut}", &text[..end])
}

/// The audit lines after `mark` whose `event` is `event`, when an audit file was given.
pub async fn audit_lines(env: &Env, mark: Option<usize>, event: &str) -> Option<Vec<Value>> {
    let (trail, mark) = (env.audit.as_ref()?, mark?);
    Some(
        trail
            .since(mark)
            .await
            .into_iter()
            .filter(|l| super::audit::field(l, "event") == event)
            .collect(),
    )
}

/// Every audit line after `mark`, when an audit file was given.
pub async fn audit_lines_since(env: &Env, mark: Option<usize>) -> Option<Vec<Value>> {
    let (trail, mark) = (env.audit.as_ref()?, mark?);
    Some(trail.since(mark).await)
}
