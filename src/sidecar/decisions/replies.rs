//! What an upstream answer means: a task state reply, the final answer to a forwarded request,
//! and which of a client's input responses may reach the server.

use serde_json::{Map, Value};

use crate::mcp::codes;
use crate::mcp::jsonrpc::{MessageKind, classify};
use crate::mcp::task::{
    ReportedState, ResponsePeek, ResultType, parse_reported_state, response_result_type,
};

/// The server's answer to a `tasks/get` about one task.
#[derive(Clone, Debug, PartialEq)]
pub enum TaskReply {
    /// The server says no such task (-32602): it restarted or purged it.
    Lost,
    /// Another JSON-RPC error: passed on to the caller.
    Error,
    /// A state the server reported (terminal or not).
    State(ReportedState),
    /// Neither a result nor an error.
    NoResult,
    /// A result that is not a task state.
    Malformed,
}

/// Interprets the server's answer to a `tasks/get`.
pub fn interpret_task_reply(reply: &Value) -> TaskReply {
    if let Some(error) = reply.get("error") {
        return if error.get("code").and_then(Value::as_i64) == Some(codes::INVALID_PARAMS) {
            TaskReply::Lost
        } else {
            TaskReply::Error
        };
    }
    match reply.get("result") {
        None => TaskReply::NoResult,
        Some(result) => parse_reported_state(result).map_or(TaskReply::Malformed, TaskReply::State),
    }
}

/// What the final answer to a forwarded request is, for the sidecar's purposes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinalAnswer {
    /// Not the response to this request (another id, a notification, not JSON-RPC).
    NotTheResponse,
    /// The server asks for input before answering (multi round-trip): screen the requests.
    InputRequired,
    /// The request became a task.
    Task,
    /// Any other result or error: passed on as is.
    Plain,
}

/// Classifies an upstream message against the request (`request_id`) it should answer.
pub fn classify_final(message: &Value, request_id: &Value) -> FinalAnswer {
    if classify(message, request_id) != MessageKind::ResponseToRequest {
        return FinalAnswer::NotTheResponse;
    }
    match response_result_type(message) {
        Some(ResultType::InputRequired) => FinalAnswer::InputRequired,
        Some(ResultType::Task) => FinalAnswer::Task,
        _ => FinalAnswer::Plain,
    }
}

/// What to do with a JSON answer the server sent to a forwarded request, from a peek at it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JsonAnswer {
    /// The response to this request, needing nothing: passed on byte for byte.
    PassRaw,
    /// Parse it strictly and decide on the tree.
    Inspect,
    /// Not exactly the response to this request (another id — even `"7"` for `7` —, a request
    /// or notification, neither result nor error): never passed on.
    Refuse,
}

/// Judges a JSON answer from its peek (`None`: the peek could not read it).
pub fn judge_json_answer(peek: Option<&ResponsePeek>, request_id: &Value) -> JsonAnswer {
    let Some(peek) = peek else {
        return JsonAnswer::Inspect;
    };
    let is_response = peek.result_type.is_some() != peek.has_error;
    if peek.has_method || !is_response || peek.id.as_ref() != Some(request_id) {
        return JsonAnswer::Refuse;
    }
    match peek.result_type {
        Some(t) if t.needs_inspection() => JsonAnswer::Inspect,
        _ => JsonAnswer::PassRaw,
    }
}

/// An input request the task has outstanding now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outstanding {
    pub key: String,
    /// The request's method (`sampling/createMessage`, `elicitation/create`, …).
    pub method: String,
    /// For a capability the gate governs (sampling, roots).
    pub gated: bool,
}

/// The input responses of a `tasks/update` that may reach the server: answers to requests
/// outstanding right now, and for gated requests only those the gate allowed (an answer to a
/// request the gate has not decided yet — one the client was never shown — is dropped too).
pub fn forwardable_inputs(
    offered: Map<String, Value>,
    outstanding: &[Outstanding],
    allowed: impl Fn(&str) -> bool,
) -> Map<String, Value> {
    offered
        .into_iter()
        .filter(|(key, _)| {
            outstanding
                .iter()
                .any(|o| &o.key == key && (!o.gated || allowed(key)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::model::TaskStatus;

    #[test]
    fn task_replies() {
        assert_eq!(
            interpret_task_reply(&json!({"error": {"code": -32602, "message": "gone"}})),
            TaskReply::Lost
        );
        assert_eq!(
            interpret_task_reply(&json!({"error": {"code": -32603, "message": "oops"}})),
            TaskReply::Error
        );
        assert_eq!(interpret_task_reply(&json!({"id": 1})), TaskReply::NoResult);
        assert_eq!(
            interpret_task_reply(&json!({"result": {"status": "exploded"}})),
            TaskReply::Malformed
        );
        match interpret_task_reply(&json!({"result": {"status": "completed", "result": {}}})) {
            TaskReply::State(s) => assert_eq!(s.status, TaskStatus::Completed),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn final_answers() {
        let id = json!(7);
        assert_eq!(
            classify_final(
                &json!({"jsonrpc": "2.0", "id": 7, "result": {"resultType": "task"}}),
                &id
            ),
            FinalAnswer::Task
        );
        assert_eq!(
            classify_final(
                &json!({"jsonrpc": "2.0", "id": 7, "result": {"resultType": "input_required"}}),
                &id
            ),
            FinalAnswer::InputRequired
        );
        assert_eq!(
            classify_final(
                &json!({"jsonrpc": "2.0", "id": 7, "result": {"content": []}}),
                &id
            ),
            FinalAnswer::Plain
        );
        assert_eq!(
            classify_final(
                &json!({"jsonrpc": "2.0", "id": 7, "error": {"code": 1}}),
                &id
            ),
            FinalAnswer::Plain
        );
        assert_eq!(
            classify_final(
                &json!({"jsonrpc": "2.0", "id": 8, "result": {"resultType": "task"}}),
                &id
            ),
            FinalAnswer::NotTheResponse
        );
    }

    #[test]
    fn json_answers_must_be_exactly_the_response_to_this_request() {
        use crate::mcp::task::peek_response;
        let id = json!(7);
        let judge = |text: &str| judge_json_answer(peek_response(text.as_bytes()).as_ref(), &id);
        assert_eq!(
            judge(r#"{"jsonrpc":"2.0","id":7,"result":{"content":[]}}"#),
            JsonAnswer::PassRaw
        );
        assert_eq!(
            judge(r#"{"jsonrpc":"2.0","id":7,"error":{"code":1}}"#),
            JsonAnswer::PassRaw
        );
        assert_eq!(
            judge(r#"{"jsonrpc":"2.0","id":7,"result":{"resultType":"task"}}"#),
            JsonAnswer::Inspect
        );
        for refused in [
            r#"{"jsonrpc":"2.0","id":"7","result":{"resultType":"task"}}"#,
            r#"{"jsonrpc":"2.0","id":7.0,"result":{}}"#,
            r#"{"jsonrpc":"2.0","result":{}}"#,
            r#"{"jsonrpc":"2.0","id":7}"#,
            r#"{"jsonrpc":"2.0","id":7,"result":{},"error":{}}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"roots/list"}"#,
        ] {
            assert_eq!(judge(refused), JsonAnswer::Refuse, "{refused}");
        }
        assert_eq!(
            judge(r#"[{"jsonrpc":"2.0","id":7,"result":{}}]"#),
            JsonAnswer::Inspect
        );
    }

    #[test]
    fn only_outstanding_inputs_and_allowed_gated_ones_are_forwarded() {
        let offered = json!({"a": 1, "b": 2, "c": 3, "d": 4})
            .as_object()
            .cloned()
            .unwrap();
        let outstanding = [
            Outstanding {
                method: String::new(),
                key: "a".into(),
                gated: false,
            },
            Outstanding {
                method: String::new(),
                key: "b".into(),
                gated: true,
            },
            Outstanding {
                method: String::new(),
                key: "c".into(),
                gated: true,
            },
        ];
        // b was allowed, c never decided (or refused), d is not outstanding.
        let kept = forwardable_inputs(offered, &outstanding, |k| k == "b");
        assert_eq!(Value::Object(kept), json!({"a": 1, "b": 2}));
    }
}
