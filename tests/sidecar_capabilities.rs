//! Sidecar III, capability half, black box: a server's `sampling/createMessage` and `roots/list`
//! input requests reach the client only under an Active, correctly signed CapabilityException
//! whose budgets still allow it; otherwise the client never sees them and the decision is
//! audited with its reason. A refused `roots/list` is answered `{"roots": []}` for the client
//! (the task or call goes on). A refused sampling request cannot be declined: a task ends
//! `failed` with the documented error (and is cancelled at the server), a multi round-trip call
//! gets that error instead of a result.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use support::listen::ListenStream;
use support::{ExampleServer, McpClient, Sidecar, SidecarOptions, User, repo};

const APPROVER_KID: &str = "security-approver-1";
const TASKS_EXT: &str = "io.modelcontextprotocol/tasks";

fn approver_key() -> PathBuf {
    repo().join("examples/approvers/example-approver.pem")
}

fn attacker_key() -> PathBuf {
    support::fixture("keys/attacker-ed25519.pem")
}

/// What an exception grants; signed by [`Grant::signed`].
struct Grant {
    name: &'static str,
    capability: &'static str,
    client: &'static str,
    max_tokens: u32,
    iterations: u32,
    per_minute: u32,
    allowed_tools: &'static [&'static str],
    not_before: Timestamp,
    expires_at: Timestamp,
    approval_id: &'static str,
}

fn at(offset_secs: i64) -> Timestamp {
    Timestamp::now()
        .checked_add(SignedDuration::from_secs(offset_secs))
        .unwrap()
}

impl Grant {
    fn sampling(name: &'static str, client: &'static str) -> Self {
        Self {
            name,
            capability: "sampling",
            client,
            max_tokens: 1000,
            iterations: 5,
            per_minute: 100,
            allowed_tools: &[],
            not_before: at(-3600),
            expires_at: at(3600),
            approval_id: "CHG-1",
        }
    }

    fn unsigned_yaml(&self) -> String {
        format!(
            r#"apiVersion: lifeguard.dev/v1alpha1
kind: CapabilityException
metadata: {{name: {name}, namespace: tests}}
spec:
  policyRef: {{name: test-policy}}
  capability: {capability}
  clients: [{client}]
  purpose: Lets the tests exercise the capability gate.
  modelRoute: test/route
  limits: {{maxTokens: {tokens}, maxIterationsPerTask: {iterations}, maxRequestsPerMinute: {per_minute}}}
  allowedTools: {tools:?}
  notBefore: "{not_before}"
  expiresAt: "{expires_at}"
  approvalId: {approval}
  signature: unsigned
"#,
            name = self.name,
            capability = self.capability,
            client = self.client,
            tokens = self.max_tokens,
            iterations = self.iterations,
            per_minute = self.per_minute,
            tools = self.allowed_tools,
            not_before = self.not_before,
            expires_at = self.expires_at,
            approval = self.approval_id,
        )
    }

    /// The exception document signed with `key` under `kid`, as if it lived in `namespace`.
    fn signed_with(&self, key: &Path, kid: &str, namespace: &str) -> String {
        let text = self.unsigned_yaml();
        let documents = lifeguard::policy::manifest::parse_manifests(&text).unwrap();
        let Some(lifeguard::policy::manifest::LifeguardObject::Exception(exception)) =
            &documents[0].object
        else {
            panic!("not an exception: {text}");
        };
        let signature = lifeguard::exception::sign(
            &exception.spec,
            namespace,
            &std::fs::read(key).unwrap(),
            kid,
        )
        .unwrap();
        text.replace("signature: unsigned", &format!("signature: {signature}"))
    }

    fn signed(&self) -> String {
        self.signed_with(&approver_key(), APPROVER_KID, "tests")
    }
}

/// `spec` lines shared by the tests: everything may become a task; fast polls.
fn spec(capabilities: &str) -> String {
    format!(
        "  tasks:\n    minPollInterval: 10ms\n  listen:\n    notifications: [taskIds]\n  capabilities: {capabilities}\n"
    )
}

/// The policy the tests run under, as refusals name it.
const POLICY: &str = "tests/test-policy";

struct Setup {
    server: ExampleServer,
    sidecar: Sidecar,
    client: McpClient,
    trust: PathBuf,
    _trust_dir: tempfile::TempDir,
}

async fn setup(capabilities: &str, exceptions: &[String]) -> Setup {
    let server = ExampleServer::start();
    let trust_dir = tempfile::tempdir().unwrap();
    let trust = trust_dir.path().join("approvers.jwks.json");
    std::fs::copy(
        repo().join("examples/approvers/approvers.jwks.json"),
        &trust,
    )
    .unwrap();
    let sidecar = Sidecar::start(
        &server.url,
        SidecarOptions {
            spec: spec(capabilities),
            extra_documents: exceptions.join("---\n"),
            approver_keys: Some(trust.clone()),
            ..Default::default()
        },
    )
    .await;
    let client = McpClient::new(&sidecar.url);
    Setup {
        server,
        sidecar,
        client,
        trust,
        _trust_dir: trust_dir,
    }
}

/// `_meta` declaring the tasks extension plus `sampling`/`roots` when asked.
fn meta(sampling: bool, roots: bool) -> Value {
    let mut caps = json!({"extensions": {TASKS_EXT: {}}});
    if sampling {
        caps["sampling"] = json!({});
    }
    if roots {
        caps["roots"] = json!({});
    }
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": caps,
    })
}

async fn summarize(client: &McpClient, token: &str, args: Value) -> String {
    let mut arguments = json!({"text": "quarterly numbers: revenue 7, cost 3"});
    for (k, v) in args.as_object().unwrap() {
        arguments[k] = v.clone();
    }
    let reply = client
        .request(
            "tools/call",
            json!({"name": "summarize_with_sampling", "arguments": arguments,
                   "_meta": meta(true, false)}),
        )
        .token(token)
        .send()
        .await;
    reply.result()["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("no task: {reply:?}"))
        .to_owned()
}

async fn get(client: &McpClient, token: &str, task: &str, sampling: bool, roots: bool) -> Value {
    let reply = client
        .request(
            "tasks/get",
            json!({"taskId": task, "_meta": meta(sampling, roots)}),
        )
        .token(token)
        .send()
        .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    reply.result().clone()
}

/// Polls (declaring sampling and roots) until the task asks for input or ends.
async fn next_state(client: &McpClient, token: &str, task: &str) -> Value {
    support::eventually(Duration::from_secs(10), async || {
        let state = get(client, token, task, true, true).await;
        let status = state["status"].as_str().unwrap_or_default().to_owned();
        (status != "working").then_some(state)
    })
    .await
    .expect("the task asks for input or ends within 10 s")
}

async fn answer(client: &McpClient, token: &str, task: &str, key: &str, response: Value) {
    let reply = client
        .request(
            "tasks/update",
            json!({"taskId": task, "inputResponses": {key: response}, "_meta": meta(true, true)}),
        )
        .token(token)
        .send()
        .await;
    assert_eq!(reply.status, 200, "{reply:?}");
}

fn sample(text: &str) -> Value {
    json!({"role": "assistant", "content": {"type": "text", "text": text},
           "model": "test-model", "stopReason": "endTurn"})
}

/// The message of a refused sampling request.
fn refusal_message() -> String {
    format!(
        "The MCP server asked for sampling/createMessage, which the Lifeguard policy {POLICY} does not allow"
    )
}

/// The JSON-RPC error a refused sampling request ends a task or a call with.
fn refusal_error(reason: &str) -> Value {
    json!({
        "code": -32603,
        "message": refusal_message(),
        "data": {"capability": "sampling/createMessage", "reason": reason, "policy": POLICY},
    })
}

/// Asserts that `state` (a `tasks/get` result) is a task ended by a sampling request refused
/// for `reason`: failed, the policy named, the documented error, nothing else.
fn assert_refused(state: &Value, reason: &str) {
    assert_eq!(state["status"], "failed", "{state}");
    assert_eq!(state["statusMessage"], json!(refusal_message()), "{state}");
    assert_eq!(state["error"], refusal_error(reason), "{state}");
    assert!(
        state.get("result").is_none() && state.get("inputRequests").is_none(),
        "{state}"
    );
}

/// The audit trail of each task a refused sampling request ended, in order: for each
/// `task.failed` with reason `capability_refused` (once at least `count` were written), the
/// events of its task: `capability.requested`, `capability.rejected` (with the reason, which is
/// returned), `task.failed`.
async fn refusal_trails(sidecar: &Sidecar, count: usize) -> Vec<String> {
    let failed = sidecar
        .audit_events_when(count, |e| {
            e["event"] == "task.failed" && e["reason"] == "capability_refused"
        })
        .await;
    assert_eq!(failed.len(), count, "{:?}", sidecar.audit());
    let audit = sidecar.audit();
    failed
        .iter()
        .map(|f| {
            let trail: Vec<&Value> = audit
                .iter()
                .filter(|e| e["task"] == f["task"] && e["event"] != "task.status_read")
                .collect();
            let events: Vec<&str> = trail.iter().filter_map(|e| e["event"].as_str()).collect();
            let gated = events
                .iter()
                .rposition(|e| *e == "capability.requested")
                .unwrap_or_else(|| panic!("no capability.requested: {trail:?}"));
            assert_eq!(
                events[gated..],
                ["capability.requested", "capability.rejected", "task.failed"],
                "{trail:?}"
            );
            let rejected = trail[gated + 1];
            assert_eq!(rejected["decision"], "deny");
            assert_eq!(rejected["detail"]["capability"], "sampling");
            assert_eq!(f["decision"], "record");
            rejected["reason"].as_str().unwrap().to_owned()
        })
        .collect()
}

/// The server's own statuses of its tasks (`/_example/tasks`), sorted.
async fn upstream_statuses(server: &ExampleServer) -> Vec<String> {
    let mut statuses: Vec<String> = server
        .debug("/_example/tasks")
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["status"].as_str().unwrap().to_owned())
        .collect();
    statuses.sort();
    statuses
}

/// The requests the sidecar made to the server on its own with `reason`, by MCP method.
async fn sidecar_requests(server: &ExampleServer, method: &str, reason: &str) -> usize {
    server
        .debug("/_example/requests")
        .await
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| {
            r["mcpMethod"] == method
                && r["lifeguard"]["lifeguard-initiator"] == "sidecar"
                && r["lifeguard"]["lifeguard-initiator-reason"] == reason
        })
        .count()
}

/// Requests to the server with MCP method `method`, whoever sent them.
async fn upstream_requests(server: &ExampleServer, method: &str) -> usize {
    server
        .debug("/_example/requests")
        .await
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["mcpMethod"] == method)
        .count()
}

fn result_text(state: &Value) -> String {
    state["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text result: {state}"))
        .to_owned()
}

/// The reasons of `capability.rejected` events, in order, once at least `count` were written
/// (audit lines land asynchronously).
async fn rejections_when(sidecar: &Sidecar, count: usize) -> Vec<String> {
    sidecar
        .audit_events_when(count, |e| e["event"] == "capability.rejected")
        .await
        .iter()
        .map(|e| e["reason"].as_str().unwrap().to_owned())
        .collect()
}

/// Polls (declaring sampling and roots, as a client using them would) until the task ends.
async fn finish(client: &McpClient, token: &str, task: &str) -> Value {
    support::eventually(Duration::from_secs(10), async || {
        let state = get(client, token, task, true, true).await;
        let status = state["status"].as_str().unwrap_or_default().to_owned();
        ["completed", "failed", "cancelled"]
            .contains(&status.as_str())
            .then_some(state)
    })
    .await
    .expect("the task ends within 10 s")
}

/// The text of a complete `tools/call` result.
fn call_text(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text: {result}"))
        .to_owned()
}

/// Waits until the task ends; asserts the client never saw a sampling request on the way.
async fn ends_without_asking(client: &McpClient, token: &str, task: &str) -> Value {
    let state = next_state(client, token, task).await;
    assert_ne!(
        state["status"], "input_required",
        "the client saw a refused input request: {state}"
    );
    state
}

#[tokio::test]
async fn sampling_under_an_active_exception_reaches_the_declaring_client_within_budget() {
    let s = setup(
        "{sampling: exception}",
        &[Grant::sampling("ok", "console").signed()],
    )
    .await;
    let token = User::new("alice", "tenant-a", "console").token();
    let task = summarize(&s.client, &token, json!({"rounds": 2, "maxTokens": 200})).await;

    let asking = next_state(&s.client, &token, &task).await;
    assert_eq!(asking["status"], "input_required", "{asking}");
    let request = &asking["inputRequests"]["sample-1"];
    assert_eq!(request["method"], "sampling/createMessage");
    assert_eq!(request["params"]["maxTokens"], 200);
    // The same poll without the capability declared on *this* request does not show it.
    let undeclared = get(&s.client, &token, &task, false, false).await;
    assert_eq!(undeclared["status"], "working", "{undeclared}");
    assert!(undeclared.get("inputRequests").is_none(), "{undeclared}");

    answer(&s.client, &token, &task, "sample-1", sample("first")).await;
    let asking = support::eventually(Duration::from_secs(10), async || {
        let state = next_state(&s.client, &token, &task).await;
        state["inputRequests"]
            .get("sample-2")
            .is_some()
            .then_some(state)
    })
    .await
    .expect("second round asked");
    assert_eq!(asking["status"], "input_required");
    answer(&s.client, &token, &task, "sample-2", sample("second")).await;
    let done = finish(&s.client, &token, &task).await;
    assert_eq!(result_text(&done), "first | second");

    s.sidecar
        .audit_events_when(2, |e| e["event"] == "capability.allowed")
        .await;
    let audit = s.sidecar.audit();
    let allowed: Vec<&Value> = audit
        .iter()
        .filter(|e| e["event"] == "capability.allowed")
        .collect();
    assert_eq!(
        allowed.len(),
        2,
        "one decision per input request: {audit:?}"
    );
    assert_eq!(allowed[0]["detail"]["approvalId"], "CHG-1");
    assert_eq!(allowed[0]["detail"]["exception"], "tests/ok");
    // The approved model route is recorded with every use.
    assert!(
        allowed
            .iter()
            .all(|e| e["detail"]["modelRoute"] == "test/route"),
        "{allowed:?}"
    );
    assert_eq!(allowed[0]["detail"]["budgetLeft"]["iterations"], 4);
    assert_eq!(allowed[1]["detail"]["budgetLeft"]["iterations"], 3);
    let requested = audit
        .iter()
        .find(|e| e["event"] == "capability.requested")
        .expect("capability.requested audited");
    assert!(requested["detail"]["request"]["bytes"].as_u64().unwrap() > 0);
    let raw = std::fs::read_to_string(&s.sidecar.audit_path).unwrap();
    assert!(
        !raw.contains("quarterly") && !raw.contains("first"),
        "prompt or model output in the audit trail"
    );
    assert!(rejections_when(&s.sidecar, 0).await.is_empty());
}

#[tokio::test]
async fn without_an_exception_the_client_never_sees_sampling_and_the_task_fails() {
    // `deny` (the default) needs no exception to refuse; an exception for it changes nothing.
    let s = setup("{}", &[Grant::sampling("ignored", "console").signed()]).await;
    let token = User::new("alice", "tenant-a", "console").token();
    let task = summarize(&s.client, &token, json!({})).await;
    let done = ends_without_asking(&s.client, &token, &task).await;
    assert_refused(&done, "no_exception");
    // The end is recorded: every later read is the same.
    assert_eq!(get(&s.client, &token, &task, true, true).await, done);
    assert_eq!(refusal_trails(&s.sidecar, 1).await, ["no_exception"]);
    let rejected = s
        .sidecar
        .audit()
        .into_iter()
        .find(|e| e["event"] == "capability.rejected")
        .unwrap();
    assert_eq!(rejected["subject"], "alice");
    // The server is asked to stop the task, and no made-up answer is sent to it.
    assert_eq!(upstream_statuses(&s.server).await, ["cancelled"]);
    assert_eq!(
        sidecar_requests(&s.server, "tasks/cancel", "capability_refused").await,
        1
    );
    assert_eq!(upstream_requests(&s.server, "tasks/update").await, 0);
}

#[tokio::test]
async fn exceptions_out_of_force_or_for_someone_else_are_refused_with_their_reason() {
    let expired = Grant {
        not_before: at(-7200),
        expires_at: at(-3600),
        ..Grant::sampling("expired", "expired-app")
    };
    let early = Grant {
        not_before: at(3600),
        expires_at: at(7200),
        ..Grant::sampling("early", "early-app")
    };
    let exceptions = [
        expired.signed(),
        early.signed(),
        // A key that is not the approver's, claiming the approver's kid.
        Grant::sampling("forged", "forged-app").signed_with(&attacker_key(), APPROVER_KID, "tests"),
        Grant::sampling("stranger", "stranger-app").signed_with(
            &approver_key(),
            "nobody-we-know",
            "tests",
        ),
        // A genuine approval for a server in another namespace, copied here.
        Grant::sampling("copied", "copied-app").signed_with(
            &approver_key(),
            APPROVER_KID,
            "elsewhere",
        ),
        Grant::sampling("console-only", "console").signed(),
    ];
    let s = setup("{sampling: exception}", &exceptions).await;
    let cases = [
        ("expired-app", "expired"),
        ("early-app", "not_yet_valid"),
        ("forged-app", "bad_signature"),
        ("stranger-app", "unknown_key"),
        ("copied-app", "wrong_server"),
        ("unlisted-app", "wrong_client"),
    ];
    for (n, (client_id, reason)) in cases.into_iter().enumerate() {
        let token = User::new("alice", "tenant-a", client_id).token();
        let task = summarize(&s.client, &token, json!({})).await;
        let done = ends_without_asking(&s.client, &token, &task).await;
        assert_refused(&done, reason);
        assert_eq!(
            rejections_when(&s.sidecar, n + 1)
                .await
                .last()
                .map(String::as_str),
            Some(reason),
            "{client_id}"
        );
    }
    let reasons: Vec<&str> = cases.iter().map(|(_, r)| *r).collect();
    assert_eq!(refusal_trails(&s.sidecar, cases.len()).await, reasons);
    assert_eq!(
        upstream_statuses(&s.server).await,
        vec!["cancelled"; cases.len()]
    );
    // The load reported each exception that is not in force.
    let logs = s.sidecar.logs();
    for name in [
        "tests/expired",
        "tests/early",
        "tests/forged",
        "tests/copied",
    ] {
        assert!(
            logs.lines()
                .any(|l| l.contains(name) && l.contains("not in force")),
            "{name} not reported at load:\n{logs}"
        );
    }
}

#[tokio::test]
async fn the_capability_must_be_declared_on_the_request_that_would_carry_it() {
    let s = setup(
        "{sampling: exception}",
        &[Grant::sampling("ok", "console").signed()],
    )
    .await;
    let token = User::new("alice", "tenant-a", "console").token();
    let task = summarize(&s.client, &token, json!({})).await;
    // Polls declaring only the tasks extension are not shown the sampling request and do not
    // decide it (a client that cannot answer must not end the task for one that can): the task
    // keeps waiting, and nothing is audited as allowed or rejected.
    let waiting = support::eventually(Duration::from_secs(10), async || {
        let state = get(&s.client, &token, &task, false, false).await;
        assert!(state.get("inputRequests").is_none(), "{state}");
        (state["status"] == "working" && state["statusMessage"] == "Waiting for a sample")
            .then_some(state)
    })
    .await
    .expect("the task waits for a sample, with the request hidden");
    assert!(waiting.get("error").is_none(), "{waiting}");
    let again = get(&s.client, &token, &task, false, false).await;
    assert_eq!(again["status"], "working", "{again}");
    // The poll that declares sampling is shown the request (the exception allows it).
    let shown = get(&s.client, &token, &task, true, false).await;
    assert_eq!(shown["status"], "input_required", "{shown}");
    let requests = shown["inputRequests"].as_object().expect("input requests");
    assert_eq!(requests.len(), 1, "{shown}");
    assert!(
        requests
            .values()
            .all(|r| r["method"] == "sampling/createMessage"),
        "{shown}"
    );
    assert!(
        s.sidecar
            .audit()
            .iter()
            .all(|e| e["event"] != "capability.rejected"),
        "nothing was rejected"
    );
}

#[tokio::test]
async fn token_budget_and_unapproved_tools_are_refused_while_others_pass_concurrently() {
    let grant = Grant {
        max_tokens: 100,
        allowed_tools: &["lookup"],
        ..Grant::sampling("budgeted", "console")
    };
    let s = setup("{sampling: exception}", &[grant.signed()]).await;
    let token = User::new("alice", "tenant-a", "console").token();
    let variants = [
        (json!({"maxTokens": 100}), None),
        (json!({"maxTokens": 101}), Some("token_budget")),
        (json!({"maxTokens": 50, "tools": ["lookup"]}), None),
        (
            json!({"maxTokens": 50, "tools": ["lookup", "shell"]}),
            Some("tool_not_allowed"),
        ),
    ];
    let tasks = futures_util::future::join_all(
        variants
            .iter()
            .map(|(args, _)| summarize(&s.client, &token, args.clone())),
    )
    .await;
    let states =
        futures_util::future::join_all(tasks.iter().map(|t| next_state(&s.client, &token, t)))
            .await;
    for ((args, refusal), state) in variants.iter().zip(&states) {
        match refusal {
            None => assert_eq!(state["status"], "input_required", "{args}: {state}"),
            Some(reason) => assert_refused(state, reason),
        }
    }
    let mut reasons = rejections_when(&s.sidecar, 2).await;
    reasons.sort();
    assert_eq!(reasons, ["token_budget", "tool_not_allowed"]);
    let mut trails = refusal_trails(&s.sidecar, 2).await;
    trails.sort();
    assert_eq!(trails, ["token_budget", "tool_not_allowed"]);
    assert_eq!(
        upstream_statuses(&s.server).await,
        ["cancelled", "cancelled", "input_required", "input_required"]
    );
}

#[tokio::test]
async fn iterations_per_task_are_capped() {
    let grant = Grant {
        iterations: 2,
        ..Grant::sampling("two-rounds", "console")
    };
    let s = setup("{sampling: exception}", &[grant.signed()]).await;
    let token = User::new("alice", "tenant-a", "console").token();
    let task = summarize(&s.client, &token, json!({"rounds": 3})).await;
    for round in 1..=2 {
        let key = format!("sample-{round}");
        let state = support::eventually(Duration::from_secs(10), async || {
            let state = next_state(&s.client, &token, &task).await;
            state["inputRequests"].get(&key).is_some().then_some(state)
        })
        .await
        .unwrap_or_else(|| panic!("round {round} asked"));
        assert_eq!(state["status"], "input_required");
        answer(&s.client, &token, &task, &key, sample(&format!("r{round}"))).await;
    }
    // The third round is over the budget: never shown, and the task fails.
    let done = support::eventually(Duration::from_secs(10), async || {
        let state = next_state(&s.client, &token, &task).await;
        assert!(state["inputRequests"].get("sample-3").is_none(), "{state}");
        (state["status"] == "failed").then_some(state)
    })
    .await
    .expect("the task fails");
    assert_refused(&done, "iteration_budget");
    assert_eq!(rejections_when(&s.sidecar, 1).await, ["iteration_budget"]);
    assert_eq!(refusal_trails(&s.sidecar, 1).await, ["iteration_budget"]);
    let allowed = s
        .sidecar
        .audit_events_when(2, |e| e["event"] == "capability.allowed")
        .await;
    assert_eq!(allowed.len(), 2, "{allowed:?}");
    assert_eq!(allowed[1]["detail"]["budgetLeft"]["iterations"], 0);
    assert_eq!(upstream_statuses(&s.server).await, ["cancelled"]);
}

#[tokio::test]
async fn the_per_minute_rate_is_counted_atomically_across_concurrent_tasks() {
    let grant = Grant {
        per_minute: 3,
        ..Grant::sampling("rated", "console")
    };
    let s = setup("{sampling: exception}", &[grant.signed()]).await;
    // Eight principals, so no concurrency quota interferes: the rate is per exception.
    let tokens: Vec<String> = (0..8)
        .map(|i| User::new(&format!("user-{i}"), "tenant-a", "console").token())
        .collect();
    let tasks = futures_util::future::join_all(
        tokens
            .iter()
            .map(|t| summarize(&s.client, t, json!({"maxTokens": 10}))),
    )
    .await;
    let states = futures_util::future::join_all(
        tokens
            .iter()
            .zip(&tasks)
            .map(|(token, t)| next_state(&s.client, token, t)),
    )
    .await;
    let shown = states
        .iter()
        .filter(|s| s["status"] == "input_required")
        .count();
    assert_eq!(shown, 3, "{states:?}");
    let refused: Vec<&Value> = states.iter().filter(|s| s["status"] == "failed").collect();
    assert_eq!(refused.len(), 5, "{states:?}");
    for state in refused {
        assert_refused(state, "rate");
    }
    assert_eq!(rejections_when(&s.sidecar, 5).await, ["rate"; 5]);
    assert_eq!(refusal_trails(&s.sidecar, 5).await, ["rate"; 5]);
    let upstream = upstream_statuses(&s.server).await;
    assert_eq!(
        upstream,
        [vec!["cancelled"; 5], vec!["input_required"; 3]].concat()
    );
}

#[tokio::test]
async fn expiry_and_a_revoked_approval_take_effect_without_a_restart() {
    let grant = Grant {
        expires_at: at(3),
        ..Grant::sampling("short", "console")
    };
    let revocable = Grant {
        approval_id: "CHG-REVOKE-ME",
        ..Grant::sampling("revocable", "roots-app")
    };
    let s = setup(
        "{sampling: exception}",
        &[grant.signed(), revocable.signed()],
    )
    .await;
    let console = User::new("alice", "tenant-a", "console").token();
    let other = User::new("alice", "tenant-a", "roots-app").token();
    let before = summarize(&s.client, &console, json!({})).await;
    assert_eq!(
        next_state(&s.client, &console, &before).await["status"],
        "input_required"
    );
    let revocable_before = summarize(&s.client, &other, json!({})).await;
    assert_eq!(
        next_state(&s.client, &other, &revocable_before).await["status"],
        "input_required"
    );

    // Expiry: no reload happens, the clock alone ends the exception.
    let wait = grant.expires_at.duration_since(Timestamp::now());
    tokio::time::sleep(Duration::try_from(wait).unwrap_or_default() + Duration::from_millis(200))
        .await;
    let after = summarize(&s.client, &console, json!({})).await;
    assert_refused(
        &ends_without_asking(&s.client, &console, &after).await,
        "expired",
    );
    assert_eq!(rejections_when(&s.sidecar, 1).await, ["expired"]);
    // An allowance is re-verified at every use: the request allowed before the expiry is
    // refused at the next poll, for the same reason, and its task fails.
    assert_refused(
        &get(&s.client, &console, &before, true, true).await,
        "expired",
    );
    assert_eq!(rejections_when(&s.sidecar, 2).await, ["expired", "expired"]);

    // Revoking the approval in the trust file is picked up like a policy change: the reload
    // reports the exception out of force.
    let mut trust: Value =
        serde_json::from_str(&std::fs::read_to_string(&s.trust).unwrap()).unwrap();
    trust["revokedApprovals"] = json!(["CHG-REVOKE-ME"]);
    std::fs::write(&s.trust, trust.to_string()).unwrap();
    support::eventually(Duration::from_secs(10), async || {
        s.sidecar
            .logs()
            .lines()
            .any(|l| l.contains("tests/revocable") && l.contains("not in force"))
            .then_some(())
    })
    .await
    .expect("the revocation is loaded");
    let revoked = summarize(&s.client, &other, json!({})).await;
    assert_refused(
        &ends_without_asking(&s.client, &other, &revoked).await,
        "approval_revoked",
    );
    // …and the task allowed before the revocation is refused at its next poll.
    assert_refused(
        &get(&s.client, &other, &revocable_before, true, true).await,
        "approval_revoked",
    );
    assert_eq!(
        rejections_when(&s.sidecar, 4).await,
        ["expired", "expired", "approval_revoked", "approval_revoked"]
    );
    assert_eq!(
        refusal_trails(&s.sidecar, 4).await,
        ["expired", "expired", "approval_revoked", "approval_revoked"]
    );
}

#[tokio::test]
async fn a_sampling_request_hidden_in_a_task_notification_is_screened_too() {
    let s = setup(
        "{sampling: exception}",
        &[Grant::sampling("ok", "console").signed()],
    )
    .await;
    let allowed = User::new("alice", "tenant-a", "console").token();
    let refused = User::new("bob", "tenant-a", "other-app").token();
    let caps = meta(true, false)["io.modelcontextprotocol/clientCapabilities"].clone();
    for (token, expect_shown) in [(&allowed, true), (&refused, false)] {
        // Nobody polls: the only way the input request can travel is the listen stream.
        let task = summarize(&s.client, token, json!({"delayMs": 300})).await;
        let mut stream = ListenStream::open_declaring(
            &s.client.url,
            token,
            json!("l"),
            json!({"taskIds": [task]}),
            caps.clone(),
        )
        .await;
        assert_eq!(stream.status, 200);
        let mut frames = Vec::new();
        // Read until the task asks or ends (the stream may stay open).
        while let Some(frame) = stream.next(Duration::from_secs(5)).await {
            let status = frame["params"]["status"].as_str().unwrap_or_default();
            let settled = frame["method"] == "notifications/tasks"
                && ["input_required", "failed", "completed", "cancelled"].contains(&status);
            frames.push(frame);
            if settled {
                break;
            }
        }
        let raw = serde_json::to_string(&frames).unwrap();
        let last = frames.last().unwrap_or_else(|| panic!("{raw}"));
        assert_eq!(last["method"], "notifications/tasks", "{raw}");
        let shown = frames.iter().any(|f| {
            f["params"]["inputRequests"]
                .as_object()
                .is_some_and(|r| r.values().any(|r| r["method"] == "sampling/createMessage"))
        });
        assert_eq!(shown, expect_shown, "{raw}");
        assert_eq!(raw.contains("inputRequests"), expect_shown, "{raw}");
        if expect_shown {
            assert_eq!(last["params"]["status"], "input_required", "{raw}");
            answer(&s.client, token, &task, "sample-1", sample("seen")).await;
            // The completion comes by the stream, its result only by tasks/get.
            let completed = support::eventually(Duration::from_secs(10), async || {
                let frame = stream.next(Duration::from_millis(200)).await?;
                (frame["params"]["status"] == "completed").then_some(frame)
            })
            .await
            .expect("completion notified");
            assert!(completed["params"].get("result").is_none(), "{completed}");
            assert_eq!(
                result_text(&get(&s.client, token, &task, true, false).await),
                "seen"
            );
        } else {
            // The stream tells that the task failed and why, without the error object.
            assert_eq!(last["params"]["status"], "failed", "{raw}");
            assert_eq!(last["params"]["statusMessage"], json!(refusal_message()));
            assert_refused(
                &get(&s.client, token, &task, true, false).await,
                "wrong_client",
            );
        }
        assert!(
            frames
                .iter()
                .all(|f| f["params"].get("result").is_none() && f["params"].get("error").is_none()),
            "{raw}"
        );
    }
    assert_eq!(rejections_when(&s.sidecar, 1).await, ["wrong_client"]);
    assert_eq!(refusal_trails(&s.sidecar, 1).await, ["wrong_client"]);
}

#[tokio::test]
async fn sampling_in_a_multi_round_trip_request_passes_the_gate_or_ends_the_call_with_an_error() {
    let s = setup(
        "{sampling: exception}",
        &[Grant::sampling("ok", "console").signed()],
    )
    .await;
    let console = User::new("alice", "tenant-a", "console").token();
    let stranger = User::new("alice", "tenant-a", "other-app").token();
    // No task: the client declares sampling only.
    let mut no_task = meta(true, false);
    no_task["io.modelcontextprotocol/clientCapabilities"] = json!({"sampling": {}});
    let call = |token: &str, extra: Value| {
        let mut params = json!({"name": "summarize_with_sampling",
                                "arguments": {"text": "quarterly numbers", "maxTokens": 100},
                                "_meta": no_task});
        for (k, v) in extra.as_object().unwrap() {
            params[k] = v.clone();
        }
        s.client.request("tools/call", params).token(token).send()
    };

    // Under the exception: the client is asked, answers by retrying, and gets the result.
    let first = call(&console, json!({})).await;
    assert_eq!(first.result()["resultType"], "input_required", "{first:?}");
    let request = &first.result()["inputRequests"]["sample-1"];
    assert_eq!(request["method"], "sampling/createMessage", "{first:?}");
    let done = call(
        &console,
        json!({"inputResponses": {"sample-1": sample("margin 57%")},
               "requestState": first.result()["requestState"]}),
    )
    .await;
    assert_eq!(call_text(done.result()), "margin 57%", "{done:?}");
    let calls_before = upstream_requests(&s.server, "tools/call").await;
    assert_eq!(calls_before, 2);

    // Another client: never asked, nothing retried upstream, the call ends with the error.
    let refused = call(&stranger, json!({})).await;
    assert_eq!(refused.status, 200, "{refused:?}");
    assert!(refused.body.get("result").is_none(), "{refused:?}");
    assert_eq!(
        refused.body["error"],
        refusal_error("wrong_client"),
        "{refused:?}"
    );
    assert!(!refused.raw.contains("inputRequests"), "{refused:?}");
    assert_eq!(
        upstream_requests(&s.server, "tools/call").await,
        calls_before + 1,
        "the refused call was retried upstream"
    );
    assert_eq!(rejections_when(&s.sidecar, 1).await, ["wrong_client"]);
    let failed = s
        .sidecar
        .audit_event(|e| e["event"] == "request.failed")
        .await
        .expect("request.failed audited");
    assert_eq!(failed["reason"], "capability_refused");
    assert_eq!(failed["decision"], "deny");
    assert_eq!(failed["detail"]["capability"], "sampling/createMessage");
    assert_eq!(failed["client"], "other-app");
    let audit = s.sidecar.audit();
    let order: Vec<&str> = audit
        .iter()
        .filter(|e| e["correlation_id"] == failed["correlation_id"])
        .filter_map(|e| e["event"].as_str())
        .filter(|e| e.starts_with("capability.") || *e == "request.failed")
        .collect();
    assert_eq!(
        order,
        [
            "capability.requested",
            "capability.rejected",
            "request.failed"
        ]
    );
}

#[tokio::test]
async fn roots_follow_the_same_gate_in_tasks_and_in_multi_round_trip_requests() {
    let roots = Grant {
        capability: "roots",
        ..Grant::sampling("roots", "console")
    };
    let s = setup("{roots: exception}", &[roots.signed()]).await;
    let console = User::new("alice", "tenant-a", "console").token();
    let stranger = User::new("alice", "tenant-a", "other-app").token();

    // As a task: shown to the approved client, answered, counted.
    let reply = s
        .client
        .request(
            "tools/call",
            json!({"name": "list_roots", "arguments": {}, "_meta": meta(false, true)}),
        )
        .token(&console)
        .send()
        .await;
    let task = reply.result()["taskId"].as_str().unwrap().to_owned();
    let asking = next_state(&s.client, &console, &task).await;
    assert_eq!(asking["inputRequests"]["roots-1"]["method"], "roots/list");
    let listed = json!({"roots": [{"uri": "file:///srv/secret-a"}, {"uri": "file:///srv/b"}]});
    answer(&s.client, &console, &task, "roots-1", listed.clone()).await;
    let done = finish(&s.client, &console, &task).await;
    assert_eq!(result_text(&done), "2 roots");

    // As a task for another client: never asked; the sidecar answers the server with no roots
    // itself, and the task completes.
    let reply = s
        .client
        .request(
            "tools/call",
            json!({"name": "list_roots", "arguments": {}, "_meta": meta(false, true)}),
        )
        .token(&stranger)
        .send()
        .await;
    let task = reply.result()["taskId"].as_str().unwrap().to_owned();
    let done = support::eventually(Duration::from_secs(10), async || {
        let state = get(&s.client, &stranger, &task, false, true).await;
        assert_ne!(state["status"], "input_required", "{state}");
        (state["status"] != "working").then_some(state)
    })
    .await
    .expect("the task ends");
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(result_text(&done), "0 roots");
    assert_eq!(
        sidecar_requests(&s.server, "tasks/update", "capability_declined").await,
        1
    );

    // Multi round-trip (no task): the approved client gets `input_required` and retries.
    let mrtr =
        |token: &str, params: Value| s.client.request("tools/call", params).token(token).send();
    let mut no_task = meta(false, true);
    no_task["io.modelcontextprotocol/clientCapabilities"] = json!({"roots": {}});
    let first = mrtr(
        &console,
        json!({"name": "list_roots", "arguments": {}, "_meta": no_task}),
    )
    .await;
    assert_eq!(first.result()["resultType"], "input_required", "{first:?}");
    assert_eq!(
        first.result()["inputRequests"]["roots-1"]["method"],
        "roots/list"
    );
    let retry = mrtr(
        &console,
        json!({"name": "list_roots", "arguments": {}, "_meta": no_task,
               "inputResponses": {"roots-1": {"roots": [{"uri": "file:///srv/c"}]}},
               "requestState": first.result()["requestState"]}),
    )
    .await;
    assert_eq!(call_text(retry.result()), "1 roots");

    // Another client: never asked; the sidecar retries the call with no roots itself, so the
    // client gets the server's complete answer in one request.
    let calls_before = upstream_requests(&s.server, "tools/call").await;
    let refused = mrtr(
        &stranger,
        json!({"name": "list_roots", "arguments": {}, "_meta": no_task}),
    )
    .await;
    assert_eq!(refused.status, 200, "{refused:?}");
    assert_eq!(refused.result()["resultType"], "complete", "{refused:?}");
    assert_eq!(call_text(refused.result()), "0 roots");
    assert_eq!(
        upstream_requests(&s.server, "tools/call").await,
        calls_before + 2,
        "the call and the sidecar's retry with no roots"
    );
    assert_eq!(
        rejections_when(&s.sidecar, 2).await,
        ["wrong_client", "wrong_client"]
    );
    // Roots refusals fail nothing.
    assert!(
        !s.sidecar
            .audit()
            .iter()
            .any(|e| e["reason"] == "capability_refused"),
        "{:?}",
        s.sidecar.audit()
    );
    let raw = std::fs::read_to_string(&s.sidecar.audit_path).unwrap();
    assert!(!raw.contains("/srv/"), "root paths in the audit trail");
}

#[tokio::test]
async fn iterations_bound_multi_round_trip_exchanges_across_retries() {
    // maxIterationsPerTask 2: outside tasks, every new call is a new request, so the budget is
    // counted per principal and tool (within a window), not per call.
    let grant = Grant {
        iterations: 2,
        ..Grant::sampling("exchanges", "console")
    };
    let s = setup("{sampling: exception}", &[grant.signed()]).await;
    let console = User::new("alice", "tenant-a", "console").token();
    let mut no_task = meta(true, false);
    no_task["io.modelcontextprotocol/clientCapabilities"] = json!({"sampling": {}});
    let call = || {
        s.client
            .request(
                "tools/call",
                json!({"name": "summarize_with_sampling",
                       "arguments": {"text": "numbers", "maxTokens": 100},
                       "_meta": no_task}),
            )
            .token(&console)
            .send()
    };
    for round in 1..=2 {
        let asked = call().await;
        assert_eq!(
            asked.result()["resultType"],
            "input_required",
            "round {round}: {asked:?}"
        );
    }
    let third = call().await;
    assert!(third.body.get("result").is_none(), "{third:?}");
    assert_eq!(
        third.body["error"],
        refusal_error("iteration_budget"),
        "{third:?}"
    );
}
