//! Helpers of the capability black-box tests: the test policy, signed grants, the example
//! server's sampling tool, and readers of the audit trail.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::{ExampleServer, McpClient, Sidecar, SidecarOptions, repo};
use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

pub const APPROVER_KID: &str = "security-approver-1";
pub const TASKS_EXT: &str = "io.modelcontextprotocol/tasks";

pub fn approver_key() -> PathBuf {
    repo().join("examples/approvers/example-approver.pem")
}

pub fn attacker_key() -> PathBuf {
    crate::support::fixture("keys/attacker-ed25519.pem")
}

/// What an exception grants; signed by [`Grant::signed`].
pub struct Grant {
    pub name: &'static str,
    pub capability: &'static str,
    pub client: &'static str,
    pub max_tokens: u32,
    pub iterations: u32,
    pub per_minute: u32,
    pub allowed_tools: &'static [&'static str],
    pub not_before: Timestamp,
    pub expires_at: Timestamp,
    pub approval_id: &'static str,
}

pub fn at(offset_secs: i64) -> Timestamp {
    Timestamp::now()
        .checked_add(SignedDuration::from_secs(offset_secs))
        .unwrap()
}

impl Grant {
    pub fn sampling(name: &'static str, client: &'static str) -> Self {
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

    pub fn unsigned_yaml(&self) -> String {
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
    pub fn signed_with(&self, key: &Path, kid: &str, namespace: &str) -> String {
        sign_yaml(&self.unsigned_yaml(), key, kid, namespace)
    }

    /// [`Self::unsigned_yaml`] edited by `edit` (extra spec fields), then signed by the
    /// test approver.
    pub fn signed_edited(&self, edit: impl FnOnce(String) -> String) -> String {
        sign_yaml(
            &edit(self.unsigned_yaml()),
            &approver_key(),
            APPROVER_KID,
            "tests",
        )
    }

    pub fn signed(&self) -> String {
        self.signed_with(&approver_key(), APPROVER_KID, "tests")
    }
}

/// An unsigned exception document (`signature: unsigned`) signed with `key` under `kid`.
pub fn sign_yaml(text: &str, key: &Path, kid: &str, namespace: &str) -> String {
    {
        let documents = lifeguard::policy::manifest::parse_manifests(text).unwrap();
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
}

/// `spec` lines shared by the tests: everything may become a task; fast polls.
pub fn spec(capabilities: &str) -> String {
    format!(
        "  tasks:\n    minPollInterval: 10ms\n  listen:\n    notifications: [taskIds]\n  capabilities: {capabilities}\n"
    )
}

/// The policy the tests run under, as refusals name it.
pub const POLICY: &str = "tests/test-policy";

pub struct Setup {
    pub server: ExampleServer,
    pub sidecar: Sidecar,
    pub client: McpClient,
    pub trust: PathBuf,
    pub _trust_dir: tempfile::TempDir,
}

pub async fn setup(capabilities: &str, exceptions: &[String]) -> Setup {
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
pub fn meta(sampling: bool, roots: bool) -> Value {
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

pub async fn summarize(client: &McpClient, token: &str, args: Value) -> String {
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

pub async fn get(
    client: &McpClient,
    token: &str,
    task: &str,
    sampling: bool,
    roots: bool,
) -> Value {
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
pub async fn next_state(client: &McpClient, token: &str, task: &str) -> Value {
    crate::support::eventually(Duration::from_secs(10), async || {
        let state = get(client, token, task, true, true).await;
        let status = state["status"].as_str().unwrap_or_default().to_owned();
        (status != "working").then_some(state)
    })
    .await
    .expect("the task asks for input or ends within 10 s")
}

pub async fn answer(client: &McpClient, token: &str, task: &str, key: &str, response: Value) {
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

pub fn sample(text: &str) -> Value {
    json!({"role": "assistant", "content": {"type": "text", "text": text},
           "model": "test-model", "stopReason": "endTurn"})
}

/// The message of a refused sampling request.
pub fn refusal_message() -> String {
    format!(
        "The MCP server asked for sampling/createMessage, which the Lifeguard policy {POLICY} does not allow"
    )
}

/// Asserts `error` is the JSON-RPC error a refused sampling request ends a task or a call
/// with: the documented code, message and `data` members (`capability`, `reason`, `policy`),
/// and the structured refusal beside them (`remediation`: `requestException` naming the
/// exception to ask for where one would help, else `none`).
pub fn assert_refusal_error(error: &Value, reason: &str) {
    assert_eq!(error["code"], -32603, "{error}");
    assert_eq!(error["message"], json!(refusal_message()), "{error}");
    let data = &error["data"];
    assert_eq!(data["capability"], "sampling/createMessage", "{error}");
    assert_eq!(data["reason"], reason, "{error}");
    assert_eq!(data["policy"], POLICY, "{error}");
    match data["remediation"].as_str() {
        Some("requestException") => {
            assert_eq!(data["exceptionCapability"], "sampling", "{error}");
            assert_eq!(
                data["authorization"]["reason"], "insufficient_authorization",
                "{error}"
            );
        }
        Some("none") => assert!(data.get("authorization").is_none(), "{error}"),
        other => panic!("unexpected remediation {other:?}: {error}"),
    }
}

/// Asserts that `state` (a `tasks/get` result) is a task ended by a sampling request refused
/// for `reason`: failed, the policy named, the documented error, nothing else.
pub fn assert_refused(state: &Value, reason: &str) {
    assert_eq!(state["status"], "failed", "{state}");
    assert_eq!(state["statusMessage"], json!(refusal_message()), "{state}");
    assert_refusal_error(&state["error"], reason);
    assert!(
        state.get("result").is_none() && state.get("inputRequests").is_none(),
        "{state}"
    );
}

/// The audit trail of each task a refused sampling request ended, in order: for each
/// `task.failed` with reason `capability_refused` (once at least `count` were written), the
/// events of its task: `capability.requested`, `capability.rejected` (with the reason, which is
/// returned), `task.failed`.
pub async fn refusal_trails(sidecar: &Sidecar, count: usize) -> Vec<String> {
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
pub async fn upstream_statuses(server: &ExampleServer) -> Vec<String> {
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
pub async fn sidecar_requests(server: &ExampleServer, method: &str, reason: &str) -> usize {
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
pub async fn upstream_requests(server: &ExampleServer, method: &str) -> usize {
    server.requests(method).await.len()
}

pub fn result_text(state: &Value) -> String {
    state["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text result: {state}"))
        .to_owned()
}

/// The reasons of `capability.rejected` events, in order, once at least `count` were written
/// (audit lines land asynchronously).
pub async fn rejections_when(sidecar: &Sidecar, count: usize) -> Vec<String> {
    sidecar
        .audit_events_when(count, |e| e["event"] == "capability.rejected")
        .await
        .iter()
        .map(|e| e["reason"].as_str().unwrap().to_owned())
        .collect()
}

/// Polls (declaring sampling and roots, as a client using them would) until the task ends.
pub async fn finish(client: &McpClient, token: &str, task: &str) -> Value {
    crate::support::eventually(Duration::from_secs(10), async || {
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
pub fn call_text(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text: {result}"))
        .to_owned()
}

/// Waits until the task ends; asserts the client never saw a sampling request on the way.
pub async fn ends_without_asking(client: &McpClient, token: &str, task: &str) -> Value {
    let state = next_state(client, token, task).await;
    assert_ne!(
        state["status"], "input_required",
        "the client saw a refused input request: {state}"
    );
    state
}
