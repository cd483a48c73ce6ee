//! The tools: their `tools/list` descriptions and argument parsing (the jobs are in `jobs.rs`).

use serde_json::{Map, Value, json};

use crate::rpc::RpcError;

/// A parsed, validated `tools/call`.
#[derive(Debug, Clone)]
pub enum ToolCall {
    Greet {
        name: String,
    },
    WriteRows {
        count: u64,
        interval_ms: u64,
        label: String,
        /// The worker ignores `tasks/cancel` and writes on (deliberately uncooperative).
        ignore_cancel: bool,
        /// `tasks/get` answers only once the task was cancelled (or after 30 s): a poll in
        /// flight while a cancellation reaches the server.
        slow_polls: bool,
    },
    SlowCompute {
        seconds: f64,
        label: String,
        /// Reported while working: the task's statusMessage, or a progress message of a
        /// synchronous run answered over SSE.
        status: Option<String>,
    },
    FailingJob {
        after_ms: u64,
        /// The error's message (and the failed task's statusMessage).
        message: String,
    },
    ConfirmAction {
        action: String,
    },
    MultiInput,
    Summarize {
        text: String,
        max_tokens: u64,
        /// Sampling requests asked one after another within the task.
        rounds: u64,
        /// Tool names offered to the model (sampling with tools).
        tools: Vec<String>,
        /// Working time before the first sampling request.
        delay_ms: u64,
        /// More `sampling/createMessage` params (`includeContext`, `systemPrompt`, …), as
        /// given: to exercise an intermediary's isolation checks.
        extra: Map<String, Value>,
        /// The task ignores `tasks/cancel` (test switch, as for `write_rows`).
        ignore_cancel: bool,
    },
    ListRoots,
    Unstable {
        flip_after_ms: u64,
    },
    /// Deliberately breaks the protocol: answers with a task even when the request did not
    /// declare the Tasks extension (so tests can show the sidecar refuses it).
    Rogue {
        seconds: f64,
    },
}

impl ToolCall {
    /// Whether the tool becomes a task when the request declared the tasks extension.
    pub fn task_capable(&self) -> bool {
        !matches!(self, ToolCall::Greet { .. })
    }

    /// Whether the tool can only run as a task (it asks through a task's `inputRequests` and
    /// has no multi round-trip form).
    pub fn task_only(&self) -> bool {
        matches!(self, ToolCall::ConfirmAction { .. } | ToolCall::MultiInput)
    }
}

fn schema(properties: Value, required: &[&str]) -> Value {
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

fn tool(name: &str, description: &str, input_schema: Value) -> Value {
    json!({"name": name, "description": description, "inputSchema": input_schema})
}

/// The `tools` array of `tools/list`.
pub fn list() -> Value {
    json!([
        tool(
            "greet",
            "Say hello (synchronous).",
            schema(json!({"name": {"type": "string"}}), &["name"])
        ),
        tool(
            "write_rows",
            "Append `count` rows to an in-memory table, one every `intervalMs` (task).",
            schema(
                json!({
                    "count": {"type": "integer", "minimum": 0, "maximum": 100000, "default": 10},
                    "intervalMs": {"type": "integer", "minimum": 0, "maximum": 60000, "default": 200},
                    "label": {"type": "string", "default": ""},
                    "ignoreCancel": {"type": "boolean", "default": false,
                                     "description": "The worker ignores tasks/cancel and writes on"},
                    "slowPolls": {"type": "boolean", "default": false,
                                  "description": "tasks/get answers only once the task was cancelled (at most 30 s); later ones 200 ms late"}
                }),
                &[]
            )
        ),
        tool(
            "slow_compute",
            "Complete after `seconds` with `computed <label>` (task).",
            schema(
                json!({
                    "seconds": {"type": "number", "minimum": 0, "maximum": 86400, "default": 1},
                    "label": {"type": "string", "default": ""},
                    "status": {"type": "string",
                               "description": "Reported while working (statusMessage, or a progress message)"}
                }),
                &[]
            )
        ),
        tool(
            "failing_job",
            "Fail with a JSON-RPC error after `afterMs` (task).",
            schema(
                json!({"afterMs": {"type": "integer", "minimum": 0, "maximum": 3600000, "default": 100},
                       "message": {"type": "string", "default": "job failed on purpose"}}),
                &[]
            )
        ),
        tool(
            "confirm_action",
            "Ask the user to confirm `action` through an elicitation (task only).",
            schema(json!({"action": {"type": "string"}}), &["action"])
        ),
        tool(
            "multi_input",
            "Ask two questions at once (task only).",
            schema(json!({}), &[])
        ),
        tool(
            "summarize_with_sampling",
            "Summarize `text` by asking the client's model (sampling; as a task, or in multi round-trip requests).",
            schema(
                json!({
                    "text": {"type": "string"},
                    "maxTokens": {"type": "integer", "minimum": 1, "maximum": 100000, "default": 500},
                    "rounds": {"type": "integer", "minimum": 1, "maximum": 10, "default": 1},
                    "tools": {"type": "array", "items": {"type": "string"}},
                    "delayMs": {"type": "integer", "minimum": 0, "maximum": 60000, "default": 0},
                    "samplingParams": {"type": "object"},
                    "ignoreCancel": {"type": "boolean", "default": false}
                }),
                &["text"]
            )
        ),
        tool(
            "list_roots",
            "Ask the client for its roots and count them (as a task, or in one multi round-trip request).",
            schema(json!({}), &[])
        ),
        tool(
            "unstable_status",
            "BUGGY ON PURPOSE: completes, then flips its terminal state to failed (task).",
            schema(
                json!({"flipAfterMs": {"type": "integer", "minimum": 0, "maximum": 3600000, "default": 300}}),
                &[]
            )
        ),
        tool(
            "rogue_task",
            "BUGGY ON PURPOSE: answers with a task even to clients that did not declare the Tasks extension.",
            schema(
                json!({"seconds": {"type": "number", "minimum": 0, "maximum": 86400, "default": 5}}),
                &[]
            )
        ),
    ])
}

struct Args<'a>(&'a Map<String, Value>);

impl Args<'_> {
    fn string(&self, key: &str, default: Option<&str>) -> Result<String, RpcError> {
        match (self.0.get(key), default) {
            (Some(Value::String(s)), _) => Ok(s.clone()),
            (None, Some(d)) => Ok(d.to_owned()),
            (None, None) => Err(RpcError::invalid_params(format!(
                "Invalid arguments: missing `{key}`"
            ))),
            (Some(_), _) => Err(RpcError::invalid_params(format!(
                "Invalid arguments: `{key}` must be a string"
            ))),
        }
    }

    fn uint(&self, key: &str, default: u64, max: u64) -> Result<u64, RpcError> {
        match self.0.get(key) {
            None => Ok(default),
            Some(v) => v.as_u64().filter(|n| *n <= max).ok_or_else(|| {
                RpcError::invalid_params(format!(
                    "Invalid arguments: `{key}` must be an integer between 0 and {max}"
                ))
            }),
        }
    }

    fn flag(&self, key: &str) -> Result<bool, RpcError> {
        match self.0.get(key) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(RpcError::invalid_params(format!(
                "Invalid arguments: `{key}` must be a boolean"
            ))),
        }
    }

    fn number(&self, key: &str, default: f64, max: f64) -> Result<f64, RpcError> {
        match self.0.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_f64()
                .filter(|n| n.is_finite() && *n >= 0.0 && *n <= max)
                .ok_or_else(|| {
                    RpcError::invalid_params(format!(
                        "Invalid arguments: `{key}` must be a number between 0 and {max}"
                    ))
                }),
        }
    }
}

/// Parses `tools/call` params into a [`ToolCall`]; unknown tools and bad arguments are -32602.
pub fn parse(params: &Value) -> Result<ToolCall, RpcError> {
    let name = params
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::invalid_params("tools/call requires a string `name`"))?;
    let empty = Map::new();
    let args = match params.get("arguments") {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(m)) => m,
        Some(_) => return Err(RpcError::invalid_params("`arguments` must be an object")),
    };
    let a = Args(args);
    Ok(match name {
        "greet" => ToolCall::Greet {
            name: a.string("name", None)?,
        },
        "write_rows" => ToolCall::WriteRows {
            count: a.uint("count", 10, 100_000)?,
            interval_ms: a.uint("intervalMs", 200, 60_000)?,
            label: a.string("label", Some(""))?,
            ignore_cancel: a.flag("ignoreCancel")?,
            slow_polls: a.flag("slowPolls")?,
        },
        "slow_compute" => ToolCall::SlowCompute {
            seconds: a.number("seconds", 1.0, 86_400.0)?,
            label: a.string("label", Some(""))?,
            status: match a.string("status", Some(""))? {
                s if s.is_empty() => None,
                s => Some(s),
            },
        },
        "failing_job" => ToolCall::FailingJob {
            after_ms: a.uint("afterMs", 100, 3_600_000)?,
            message: a.string("message", Some("job failed on purpose"))?,
        },
        "confirm_action" => ToolCall::ConfirmAction {
            action: a.string("action", None)?,
        },
        "multi_input" => ToolCall::MultiInput,
        "summarize_with_sampling" => ToolCall::Summarize {
            ignore_cancel: a.flag("ignoreCancel")?,
            extra: match args.get("samplingParams") {
                None | Some(Value::Null) => Map::new(),
                Some(Value::Object(extra)) => extra.clone(),
                Some(_) => {
                    return Err(RpcError::invalid_params(
                        "`samplingParams` must be an object",
                    ));
                }
            },
            delay_ms: a.uint("delayMs", 0, 60_000)?,
            text: a.string("text", None)?,
            max_tokens: a.uint("maxTokens", 500, 100_000)?.max(1),
            rounds: a.uint("rounds", 1, 10)?.max(1),
            tools: match args.get("tools") {
                None | Some(Value::Null) => vec![],
                Some(Value::Array(items)) => items
                    .iter()
                    .map(|t| {
                        t.as_str().map(str::to_owned).ok_or_else(|| {
                            RpcError::invalid_params("`tools` must be an array of tool names")
                        })
                    })
                    .collect::<Result<_, _>>()?,
                Some(_) => {
                    return Err(RpcError::invalid_params(
                        "`tools` must be an array of tool names",
                    ));
                }
            },
        },
        "list_roots" => ToolCall::ListRoots,
        "rogue_task" => ToolCall::Rogue {
            seconds: a.number("seconds", 5.0, 86_400.0)?,
        },
        "unstable_status" => ToolCall::Unstable {
            flip_after_ms: a.uint("flipAfterMs", 300, 3_600_000)?,
        },
        other => return Err(RpcError::invalid_params(format!("Unknown tool: {other}"))),
    })
}
