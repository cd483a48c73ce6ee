//! The jobs behind the tools: how each one runs, sleeps, asks for input and honours
//! cancellation.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::sync::{Notify, mpsc};

use crate::inputs::{self, Expected};
use crate::rpc::RpcError;
use crate::store::{Outcome, Store};
use crate::tools::ToolCall;

/// A CallToolResult with one text block.
pub fn text_result(text: impl Into<String>) -> Value {
    json!({
        "resultType": "complete",
        "content": [{"type": "text", "text": text.into()}],
        "isError": false,
    })
}

/// A progress report: (progress, total, message).
pub type Progress = (u64, Option<u64>, String);

/// What a job can do to the outside world: the task it belongs to (none for synchronous runs),
/// and a progress sink (only for synchronous runs answered over SSE).
pub struct JobCtx {
    pub store: Arc<Store>,
    pub task: Option<(String, Arc<Notify>)>,
    pub progress: Option<mpsc::UnboundedSender<Progress>>,
}

impl JobCtx {
    fn task_id(&self) -> Option<&str> {
        self.task.as_ref().map(|(id, _)| id.as_str())
    }

    /// Sleeps, waking early on cancellation. Returns false when the task is no longer active.
    async fn sleep(&self, ms: u64) -> bool {
        let Some((id, wake)) = &self.task else {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            return true;
        };
        let deadline = tokio::time::Instant::now() + Duration::from_millis(ms);
        loop {
            if !self.store.is_active(id) {
                return false;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return self.store.is_active(id),
                _ = wake.notified() => {}
            }
        }
    }

    fn progress(&self, progress: u64, total: Option<u64>, message: String) {
        if let Some(tx) = &self.progress {
            let _ = tx.send((progress, total, message.clone()));
        }
        if let Some(id) = self.task_id() {
            self.store.set_message(id, message);
        }
    }

    /// Asks the client (through `inputRequests`) and waits until every key is answered.
    /// `None` when the task was cancelled meanwhile, or when there is no task at all.
    async fn ask(
        &self,
        requests: Vec<(String, Value)>,
        message: &str,
    ) -> Option<Map<String, Value>> {
        let (id, wake) = self.task.as_ref()?;
        let keys: Vec<String> = requests.iter().map(|(k, _)| k.clone()).collect();
        if !self.store.request_input(id, &requests, message) {
            return None;
        }
        loop {
            match self.store.take_answers(id, &keys) {
                Err(()) => return None,
                Ok(Some(answers)) => return Some(answers),
                Ok(None) => {}
            }
            tokio::select! {
                _ = wake.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }
}

fn elicitation(message: &str, properties: Value, required: &[&str]) -> Value {
    json!({
        "method": "elicitation/create",
        "params": {
            "message": message,
            "requestedSchema": {"type": "object", "properties": properties, "required": required}
        }
    })
}

/// `{action:"accept", content:{...}}` → the content object.
fn accepted_content(answer: Option<&Value>) -> Option<&Map<String, Value>> {
    let a = answer?;
    if a.get("action").and_then(Value::as_str) != Some("accept") {
        return None;
    }
    a.get("content").and_then(Value::as_object)
}

/// The text of a sampling answer (a `CreateMessageResult`): its first text block, with
/// `content` as one block or as an array of blocks.
fn sampled_text(answer: &Value) -> String {
    let block = match answer.get("content") {
        Some(Value::Array(blocks)) => blocks.iter().find(|b| b.get("text").is_some()),
        other => other,
    };
    block
        .and_then(|b| b.get("text"))
        .and_then(Value::as_str)
        .unwrap_or("(no text)")
        .to_owned()
}

/// The `sampling/createMessage` input request of a summary round.
fn sampling_request(
    text: &str,
    max_tokens: u64,
    tools: &[String],
    extra: &Map<String, Value>,
) -> Value {
    let mut params = json!({
        "messages": [{"role": "user", "content": {"type": "text", "text": format!("Summarize: {text}")}}],
        "maxTokens": max_tokens,
    });
    for (key, value) in extra {
        params[key] = value.clone();
    }
    if !tools.is_empty() {
        params["tools"] = Value::Array(
            tools
                .iter()
                .map(|name| json!({"name": name, "inputSchema": {"type": "object"}}))
                .collect(),
        );
    }
    json!({"method": "sampling/createMessage", "params": params})
}

/// `list_roots` outside a task, as a multi round-trip request: the first call answers
/// `input_required` with a `roots/list` input request; the retry carrying a `ListRootsResult`
/// for `roots-1` gets the count; a retry without it is asked again; any other answer is -32602.
pub fn roots_round_trip(params: &Value) -> Result<Value, RpcError> {
    inputs::check_retry(params, &[("roots-1", Expected::Roots)])?;
    Ok(match params.pointer("/inputResponses/roots-1") {
        Some(answer) => text_result(roots_text(answer)),
        None => json!({
            "resultType": "input_required",
            "inputRequests": {"roots-1": {"method": "roots/list", "params": {}}},
            "requestState": "list-roots-1",
        }),
    })
}

/// `N roots` for a `ListRootsResult`.
fn roots_text(answer: &Value) -> String {
    let count = answer
        .get("roots")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    format!("{count} roots")
}

/// `summarize_with_sampling` outside a task, as a multi round-trip request: each round answers
/// `input_required` with `sample-N` and a `requestState` carrying the round and the texts so
/// far (this peer trusts it: it is the demo's "before" picture); the retry carrying a
/// `CreateMessageResult` for `sample-N` moves to the next round or completes. A retry without
/// the answer is asked the same again; any other answer is -32602.
pub fn summarize_round_trip(
    params: &Value,
    text: &str,
    max_tokens: u64,
    rounds: u64,
    tools: &[String],
    extra: &Map<String, Value>,
) -> Result<Value, RpcError> {
    let bad_state = || RpcError::invalid_params("Invalid requestState");
    let (round, mut texts): (u64, Vec<String>) = match params.get("requestState") {
        None => (0, Vec::new()),
        Some(Value::String(state)) => {
            let state: Value = serde_json::from_str(state).map_err(|_| bad_state())?;
            let round = state
                .get("round")
                .and_then(Value::as_u64)
                .filter(|r| (1..=rounds).contains(r))
                .ok_or_else(bad_state)?;
            let texts = serde_json::from_value(state.get("texts").cloned().unwrap_or_default())
                .map_err(|_| bad_state())?;
            (round, texts)
        }
        Some(_) => return Err(bad_state()),
    };
    let key = format!("sample-{round}");
    inputs::check_retry(params, &[(key.as_str(), Expected::Sampling)])?;
    let next = match params.get("inputResponses").and_then(|r| r.get(&key)) {
        Some(answer) if round > 0 => {
            texts.push(sampled_text(answer));
            if round == rounds {
                return Ok(text_result(texts.join(" | ")));
            }
            round + 1
        }
        // Not answered (or nothing asked yet): ask this round (again).
        _ => round.max(1),
    };
    Ok(json!({
        "resultType": "input_required",
        "inputRequests": {format!("sample-{next}"): sampling_request(text, max_tokens, tools, extra)},
        "requestState": json!({"round": next, "texts": texts}).to_string(),
    }))
}

/// Runs the job behind a tool call to its end.
pub async fn run(call: &ToolCall, ctx: &JobCtx) -> Outcome {
    match call {
        ToolCall::Greet { name } => Outcome::Done(text_result(format!("Hello, {name}!"))),
        ToolCall::WriteRows {
            count,
            interval_ms,
            label,
            ..
        } => {
            for row in 1..=*count {
                if !ctx.sleep(*interval_ms).await {
                    return Outcome::Cancelled;
                }
                // The check for cancellation and the write happen under one lock.
                if !ctx.store.write_row(ctx.task_id(), label, row) {
                    return Outcome::Cancelled;
                }
                ctx.progress(row, Some(*count), format!("wrote {row} of {count} rows"));
            }
            Outcome::Done(text_result(format!("wrote {count} rows")))
        }
        ToolCall::SlowCompute {
            seconds,
            label,
            status,
        } => {
            // Bounded to 86400 s by parsing, so the conversion cannot overflow.
            let ms = (seconds * 1000.0).round() as u64;
            match status {
                // Reported again every 100 ms, so a listener that subscribed late sees it.
                Some(status) => {
                    let mut left = ms;
                    for round in 1.. {
                        ctx.progress(round, None, status.clone());
                        let slice = left.min(100);
                        if !ctx.sleep(slice).await {
                            return Outcome::Cancelled;
                        }
                        left -= slice;
                        if left == 0 {
                            break;
                        }
                    }
                }
                None => {
                    if !ctx.sleep(ms).await {
                        return Outcome::Cancelled;
                    }
                }
            }
            Outcome::Done(text_result(format!("computed {label}")))
        }
        ToolCall::Rogue { seconds } => {
            let ms = (seconds * 1000.0).round() as u64;
            if !ctx.sleep(ms).await {
                return Outcome::Cancelled;
            }
            Outcome::Done(text_result("rogue task finished".to_owned()))
        }
        ToolCall::FailingJob { after_ms, message } => {
            if !ctx.sleep(*after_ms).await {
                return Outcome::Cancelled;
            }
            Outcome::Failed(json!({"code": -32603, "message": message}))
        }
        ToolCall::ConfirmAction { action } => {
            let req = elicitation(
                &format!("Really {action}?"),
                json!({"confirm": {"type": "boolean"}}),
                &["confirm"],
            );
            let Some(answers) = ctx
                .ask(vec![("confirm-1".into(), req)], "Waiting for confirmation")
                .await
            else {
                return Outcome::Cancelled;
            };
            let confirmed = accepted_content(answers.get("confirm-1"))
                .and_then(|c| c.get("confirm"))
                .and_then(Value::as_bool)
                == Some(true);
            let verb = if confirmed { "confirmed" } else { "declined" };
            Outcome::Done(text_result(format!("{verb} {action}")))
        }
        ToolCall::MultiInput => {
            let name = elicitation(
                "What is your name?",
                json!({"name": {"type": "string"}}),
                &["name"],
            );
            let color = elicitation(
                "What is your favourite color?",
                json!({"color": {"type": "string"}}),
                &["color"],
            );
            let Some(answers) = ctx
                .ask(
                    vec![("name-1".into(), name), ("color-1".into(), color)],
                    "Waiting for two answers",
                )
                .await
            else {
                return Outcome::Cancelled;
            };
            let field = |key: &str, field: &str| {
                accepted_content(answers.get(key))
                    .and_then(|c| c.get(field))
                    .and_then(Value::as_str)
                    .unwrap_or("(declined)")
                    .to_owned()
            };
            Outcome::Done(text_result(format!(
                "name: {}, color: {}",
                field("name-1", "name"),
                field("color-1", "color")
            )))
        }
        ToolCall::Summarize {
            text,
            max_tokens,
            rounds,
            tools,
            delay_ms,
            extra,
            ..
        } => {
            if !ctx.sleep(*delay_ms).await {
                return Outcome::Cancelled;
            }
            let mut summaries = Vec::new();
            for round in 1..=*rounds {
                let key = format!("sample-{round}");
                let req = sampling_request(text, *max_tokens, tools, extra);
                let Some(answers) = ctx
                    .ask(vec![(key.clone(), req)], "Waiting for a sample")
                    .await
                else {
                    return Outcome::Cancelled;
                };
                // tasks/update accepts only a CreateMessageResult for this key.
                summaries.push(answers.get(&key).map(sampled_text).unwrap_or_default());
            }
            Outcome::Done(text_result(summaries.join(" | ")))
        }
        ToolCall::ListRoots => {
            let req = json!({"method": "roots/list", "params": {}});
            let Some(answers) = ctx
                .ask(vec![("roots-1".into(), req)], "Waiting for roots")
                .await
            else {
                return Outcome::Cancelled;
            };
            let roots = answers.get("roots-1").map(roots_text).unwrap_or_default();
            Outcome::Done(text_result(roots))
        }
        ToolCall::Unstable { .. } => {
            if !ctx.sleep(20).await {
                return Outcome::Cancelled;
            }
            Outcome::Done(text_result("first answer"))
        }
    }
}

/// Spawns the job of a freshly created task. For `unstable_status`, the job afterwards breaks
/// terminal immutability on purpose.
pub fn spawn_task(store: Arc<Store>, task_id: String, wake: Arc<Notify>, call: ToolCall) {
    tokio::spawn(async move {
        let ctx = JobCtx {
            store: store.clone(),
            task: Some((task_id.clone(), wake)),
            progress: None,
        };
        let outcome = run(&call, &ctx).await;
        store.finish(&task_id, outcome);
        if let ToolCall::Unstable { flip_after_ms } = call {
            tokio::time::sleep(Duration::from_millis(flip_after_ms)).await;
            store.force_fail(
                &task_id,
                json!({"code": -32603, "message": "changed my mind"}),
            );
        }
    });
}
