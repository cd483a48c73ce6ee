//! Task shapes of the Tasks extension (`io.modelcontextprotocol/tasks`), read leniently and
//! rewritten minimally: the sidecar replaces the upstream task ID with its own and adjusts
//! `ttlMs`/`pollIntervalMs`, and forwards every other field untouched.

use serde_json::{Map, Value, json};

use crate::model::TaskStatus;

use super::{PROTOCOL_VERSION, TASKS_EXTENSION, meta};

/// `result.resultType` of a response: what kind of answer it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResultType {
    /// A final answer (`complete`, or no `resultType` at all).
    Complete,
    /// A `CreateTaskResult`: the request became a task.
    Task,
    /// The server asks the client for input before it can answer (multi round-trip request).
    InputRequired,
    /// A value this revision does not define.
    Other,
}

impl ResultType {
    fn from_wire(value: Option<&str>) -> Self {
        match value {
            None | Some("complete") => Self::Complete,
            Some("task") => Self::Task,
            Some("input_required") => Self::InputRequired,
            Some(_) => Self::Other,
        }
    }

    /// Whether a proxy must look into an answer of this type (task creation, input requests).
    pub fn needs_inspection(self) -> bool {
        matches!(self, Self::Task | Self::InputRequired)
    }
}

/// The `resultType` of a `result` object.
pub fn result_type(result: &Value) -> ResultType {
    ResultType::from_wire(result.get("resultType").and_then(Value::as_str))
}

/// The `resultType` of a response message (`None`: not a result, e.g. an error).
pub fn response_result_type(message: &Value) -> Option<ResultType> {
    message.get("result").map(result_type)
}

/// What a cheap look at a serialized response shows, read without building a JSON tree.
#[derive(Clone, Debug, PartialEq)]
pub struct ResponsePeek {
    pub id: Option<Value>,
    /// `result.resultType` (`None`: no `result`).
    pub result_type: Option<ResultType>,
    pub has_error: bool,
    /// A `method` member: a request or notification, not a response.
    pub has_method: bool,
}

/// Peeks at a serialized JSON-RPC response. `None` when the bytes are not one JSON object, or
/// repeat an envelope key (`id`, `result`, `error`, `method`, `jsonrpc`, `resultType`): the
/// caller then takes the careful path.
pub fn peek_response(bytes: &[u8]) -> Option<ResponsePeek> {
    #[derive(serde::Deserialize)]
    struct Peek<'a> {
        #[serde(default)]
        id: Option<Value>,
        #[serde(borrow, default)]
        result: Option<PeekResult<'a>>,
        #[serde(default)]
        error: Option<serde::de::IgnoredAny>,
        #[serde(default)]
        method: Option<serde::de::IgnoredAny>,
        #[serde(default, rename = "jsonrpc")]
        _jsonrpc: Option<serde::de::IgnoredAny>,
    }
    #[derive(serde::Deserialize)]
    struct PeekResult<'a> {
        #[serde(rename = "resultType", borrow, default)]
        result_type: Option<std::borrow::Cow<'a, str>>,
    }
    // serde also reads a struct from an array: only a top-level object is a response.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return None;
    }
    let peek = serde_json::from_slice::<Peek<'_>>(bytes).ok()?;
    Some(ResponsePeek {
        id: peek.id,
        result_type: peek
            .result
            .map(|r| ResultType::from_wire(r.result_type.as_deref())),
        has_error: peek.error.is_some(),
        has_method: peek.method.is_some(),
    })
}

/// The `inputRequests` map of a task state or `input_required` result, for screening in place.
pub fn input_requests_mut(state: &mut Value) -> Option<&mut Map<String, Value>> {
    state
        .get_mut("inputRequests")
        .and_then(Value::as_object_mut)
}

/// Removes a task state's `inputRequests`; a state that was `input_required` only because of
/// them reads `working` again.
pub fn clear_input_requests(state: &mut Value) {
    if let Some(o) = state.as_object_mut() {
        o.remove("inputRequests");
    }
    if state.get("status").and_then(Value::as_str) == Some(TaskStatus::InputRequired.as_str()) {
        state["status"] = json!(TaskStatus::Working.as_str());
    }
}

/// The `inputRequests` of an `input_required` response message.
pub fn response_input_requests_mut(message: &mut Value) -> Option<&mut Map<String, Value>> {
    message
        .pointer_mut("/result/inputRequests")
        .and_then(Value::as_object_mut)
}

/// The `inputResponses` a client sent (`tasks/update`, or a retried multi round-trip request).
pub fn input_responses(params: Option<&Map<String, Value>>) -> Map<String, Value> {
    params
        .and_then(|p| p.get("inputResponses"))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

/// Sets a request's `params.inputResponses`; with `request_state`, also its `requestState`
/// (`Some(Value::Null)` removes it: the server sent none). No effect on a message without
/// params.
pub fn set_input_responses(
    request: &mut Value,
    responses: Map<String, Value>,
    request_state: Option<Value>,
) {
    let Some(params) = request.get_mut("params").and_then(Value::as_object_mut) else {
        return;
    };
    params.insert("inputResponses".into(), Value::Object(responses));
    match request_state {
        Some(Value::Null) => {
            params.remove("requestState");
        }
        Some(state) => {
            params.insert("requestState".into(), state);
        }
        None => {}
    }
}

/// The `requestState` of an `input_required` response message (null when absent).
pub fn response_request_state(message: &Value) -> Value {
    message
        .pointer("/result/requestState")
        .cloned()
        .unwrap_or(Value::Null)
}

/// Presents a task state or `CreateTaskResult` of the server under the sidecar's identity: the
/// upstream ID replaced everywhere, `taskId` and `ttlMs` the ledger's, and (with a floor)
/// `pollIntervalMs` the server's raised to at least `poll_floor_ms`.
pub fn present_task(
    value: &mut Value,
    upstream_id: &str,
    sidecar_id: &str,
    ttl_ms: i64,
    poll_floor_ms: Option<i64>,
) {
    replace_task_id(value, upstream_id, sidecar_id);
    value["taskId"] = json!(sidecar_id);
    value["ttlMs"] = json!(ttl_ms);
    if let Some(floor) = poll_floor_ms {
        let upstream = value
            .get("pollIntervalMs")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        value["pollIntervalMs"] = json!(upstream.max(floor));
    }
}

/// A task request the sidecar sends on its own (`tasks/get`, `tasks/update`, `tasks/cancel`):
/// its own request id, the protocol version and the Tasks extension declared.
pub fn sidecar_task_request(method: &str, upstream_id: &str, request_id: &str) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": request_id,
        "method": method,
        "params": {
            "taskId": upstream_id,
            "_meta": {
                meta::PROTOCOL_VERSION: PROTOCOL_VERSION,
                meta::CLIENT_CAPABILITIES: {"extensions": {TASKS_EXTENSION: {}}},
            }
        }
    })
}

/// Facts of a `CreateTaskResult` (`resultType: "task"`).
#[derive(Clone, Debug, PartialEq)]
pub struct CreatedTask {
    pub upstream_id: String,
    pub status: TaskStatus,
    pub status_message: Option<String>,
    /// `None`: no TTL stated or unlimited (`null`).
    pub ttl_ms: Option<i64>,
    pub poll_interval_ms: Option<i64>,
}

/// Reads a `CreateTaskResult` from a `result` object; `None` when it is not one.
pub fn parse_created_task(result: &Value) -> Option<CreatedTask> {
    if result_type(result) != ResultType::Task {
        return None;
    }
    let upstream_id = result.get("taskId")?.as_str()?.to_owned();
    let status = result
        .get("status")
        .and_then(Value::as_str)
        .and_then(TaskStatus::parse)
        .unwrap_or(TaskStatus::Working);
    Some(CreatedTask {
        upstream_id,
        status,
        status_message: result
            .get("statusMessage")
            .and_then(Value::as_str)
            .map(str::to_owned),
        ttl_ms: result
            .get("ttlMs")
            .and_then(Value::as_i64)
            .filter(|t| *t >= 0),
        poll_interval_ms: result
            .get("pollIntervalMs")
            .and_then(Value::as_i64)
            .filter(|p| *p >= 0),
    })
}

/// The task state an upstream reported in a `tasks/get` result or `notifications/tasks`.
#[derive(Clone, Debug, PartialEq)]
pub struct ReportedState {
    pub status: TaskStatus,
    pub status_message: Option<String>,
    /// Keys of the outstanding `inputRequests`.
    pub input_keys: Vec<String>,
    /// The terminal payload: `result` for completed, `error` for failed.
    pub payload: Option<Value>,
}

/// Reads the task state from a `tasks/get` result (or notification params).
pub fn parse_reported_state(result: &Value) -> Option<ReportedState> {
    let status = TaskStatus::parse(result.get("status")?.as_str()?)?;
    let input_keys = result
        .get("inputRequests")
        .and_then(Value::as_object)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    let payload = match status {
        TaskStatus::Completed => result.get("result").cloned(),
        TaskStatus::Failed => result.get("error").cloned(),
        _ => None,
    };
    Some(ReportedState {
        status,
        status_message: result
            .get("statusMessage")
            .and_then(Value::as_str)
            .map(str::to_owned),
        input_keys,
        payload,
    })
}

/// Shortest upstream ID rewritten inside longer strings. Shorter IDs (`"1"`) would also match
/// unrelated text, so for them only whole-string occurrences are replaced.
pub const MIN_SUBSTRING_ID_LEN: usize = 6;

/// Replaces every occurrence of `upstream_id` in string values (and object keys) of `value`
/// with `sidecar_id`, so the upstream's ID cannot leak through `statusMessage`, error texts or
/// nested fields.
pub fn replace_task_id(value: &mut Value, upstream_id: &str, sidecar_id: &str) {
    match value {
        Value::String(s) => {
            if s == upstream_id {
                *s = sidecar_id.to_owned();
            } else if upstream_id.len() >= MIN_SUBSTRING_ID_LEN && s.contains(upstream_id) {
                *s = s.replace(upstream_id, sidecar_id);
            }
        }
        Value::Array(items) => items
            .iter_mut()
            .for_each(|v| replace_task_id(v, upstream_id, sidecar_id)),
        Value::Object(map) => {
            let keys: Vec<String> = map.keys().cloned().collect();
            for key in keys {
                if let Some(mut v) = map.remove(&key) {
                    replace_task_id(&mut v, upstream_id, sidecar_id);
                    let key = if key == upstream_id {
                        sidecar_id.to_owned()
                    } else {
                        key
                    };
                    map.insert(key, v);
                }
            }
        }
        _ => {}
    }
}

/// RFC 3339 timestamp (UTC, millisecond precision) for Unix milliseconds.
pub fn iso_millis(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms)
        .map(|t| format!("{t:.3}"))
        .unwrap_or_default()
}

/// The fields every task state carries, from the ledger's view.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskView<'a> {
    pub task_id: &'a str,
    pub status: TaskStatus,
    pub status_message: Option<&'a str>,
    pub created_at: i64,
    pub last_updated_at: i64,
    pub ttl_ms: i64,
    pub poll_interval_ms: i64,
}

impl TaskView<'_> {
    fn base(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("taskId".into(), json!(self.task_id));
        m.insert("status".into(), json!(self.status.as_str()));
        if let Some(msg) = self.status_message {
            m.insert("statusMessage".into(), json!(msg));
        }
        m.insert("createdAt".into(), json!(iso_millis(self.created_at)));
        m.insert(
            "lastUpdatedAt".into(),
            json!(iso_millis(self.last_updated_at)),
        );
        m.insert("ttlMs".into(), json!(self.ttl_ms));
        m.insert("pollIntervalMs".into(), json!(self.poll_interval_ms));
        m
    }

    /// A flat `CreateTaskResult`.
    pub fn create_result(&self) -> Value {
        let mut m = self.base();
        m.insert("resultType".into(), json!("task"));
        Value::Object(m)
    }

    /// A `tasks/get` result built from the ledger alone (terminal tasks): `result` for completed
    /// (when `payload` is given), `error` for failed.
    pub fn get_result(&self, payload: Option<&Value>) -> Value {
        let mut m = self.state(payload);
        m.insert("resultType".into(), json!("complete"));
        Value::Object(m)
    }

    /// The task state alone (the params of a `notifications/tasks`): the `tasks/get` result
    /// without `resultType`.
    pub fn notification_params(&self, payload: Option<&Value>) -> Value {
        Value::Object(self.state(payload))
    }

    fn state(&self, payload: Option<&Value>) -> Map<String, Value> {
        let mut m = self.base();
        if let Some(payload) = payload {
            match self.status {
                TaskStatus::Completed => {
                    m.insert("result".into(), payload.clone());
                }
                TaskStatus::Failed => {
                    m.insert("error".into(), payload.clone());
                }
                _ => {}
            }
        }
        m
    }
}

/// An empty acknowledgement (`tasks/update`, `tasks/cancel`).
pub fn empty_ack() -> Value {
    json!({"resultType": "complete"})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_flat_create_task_result() {
        let r = json!({"resultType":"task","taskId":"task-7","status":"working",
                       "createdAt":"2026-11-30T00:00:00Z","lastUpdatedAt":"2026-11-30T00:00:00Z",
                       "ttlMs":60000,"pollIntervalMs":500});
        let t = parse_created_task(&r).unwrap();
        assert_eq!(t.upstream_id, "task-7");
        assert_eq!(t.status, TaskStatus::Working);
        assert_eq!(t.ttl_ms, Some(60000));
        assert_eq!(t.poll_interval_ms, Some(500));
        assert!(parse_created_task(&json!({"resultType":"complete","content":[]})).is_none());
        let unlimited = json!({"resultType":"task","taskId":"x","status":"working","ttlMs":null});
        assert_eq!(parse_created_task(&unlimited).unwrap().ttl_ms, None);
    }

    #[test]
    fn reads_reported_state_with_payloads_and_input_keys() {
        let s = parse_reported_state(&json!({"status":"input_required",
            "inputRequests":{"confirm-1":{"method":"elicitation/create"}}}))
        .unwrap();
        assert_eq!(s.input_keys, vec!["confirm-1".to_owned()]);
        let done =
            parse_reported_state(&json!({"status":"completed","result":{"content":[]}})).unwrap();
        assert_eq!(done.payload, Some(json!({"content":[]})));
        let failed =
            parse_reported_state(&json!({"status":"failed","error":{"code":-1,"message":"m"}}))
                .unwrap();
        assert_eq!(failed.payload.unwrap()["code"], -1);
        assert!(parse_reported_state(&json!({"status":"exploded"})).is_none());
    }

    #[test]
    fn replaces_upstream_ids_everywhere_without_mangling_short_ids() {
        let mut v = json!({"taskId":"task-42","statusMessage":"task-42 is at 50%",
                           "nested":[{"ref":"task-42"}],"task-42":{"k":"v"}});
        replace_task_id(&mut v, "task-42", "lgt_X");
        assert_eq!(v["taskId"], "lgt_X");
        assert_eq!(v["statusMessage"], "lgt_X is at 50%");
        assert_eq!(v["nested"][0]["ref"], "lgt_X");
        assert!(v.get("lgt_X").is_some());
        let mut short = json!({"taskId":"1","statusMessage":"1 of 10 done"});
        replace_task_id(&mut short, "1", "lgt_X");
        assert_eq!(short["taskId"], "lgt_X");
        assert_eq!(short["statusMessage"], "1 of 10 done");
    }

    #[test]
    fn tells_result_types_apart_with_and_without_a_tree() {
        let cases = [
            (
                json!({"result": {"resultType": "task"}}),
                Some(ResultType::Task),
            ),
            (
                json!({"result": {"resultType": "input_required"}}),
                Some(ResultType::InputRequired),
            ),
            (
                json!({"result": {"content": []}}),
                Some(ResultType::Complete),
            ),
            (
                json!({"result": {"resultType": "later"}}),
                Some(ResultType::Other),
            ),
            (json!({"error": {"code": 1}}), None),
        ];
        for (message, expected) in cases {
            assert_eq!(response_result_type(&message), expected, "{message}");
            let bytes = serde_json::to_vec(&message).unwrap();
            assert_eq!(
                peek_response(&bytes).map(|p| p.result_type),
                Some(expected),
                "{message}"
            );
        }
        assert_eq!(peek_response(b"{"), None);
        assert!(ResultType::Task.needs_inspection());
        assert!(!ResultType::Complete.needs_inspection());
    }

    #[test]
    fn peeks_refuse_arrays_and_repeated_envelope_keys() {
        let ok = peek_response(br#" {"jsonrpc":"2.0","id":"7","result":{"content":[]}}"#).unwrap();
        assert_eq!(ok.id, Some(json!("7")));
        assert!(!ok.has_error && !ok.has_method);
        assert_eq!(
            peek_response(br#"[{"jsonrpc":"2.0","id":7,"result":{}}]"#),
            None
        );
        assert_eq!(peek_response(br#"{"id":7,"id":8,"result":{}}"#), None);
        assert_eq!(
            peek_response(br#"{"id":7,"result":{"resultType":"complete","resultType":"task"}}"#),
            None
        );
        let request = peek_response(br#"{"id":1,"method":"sampling/createMessage"}"#).unwrap();
        assert!(request.has_method);
    }

    #[test]
    fn clearing_input_requests_returns_a_state_to_working() {
        let mut state = json!({"status": "input_required", "inputRequests": {"k": {}}});
        assert_eq!(input_requests_mut(&mut state).map(|m| m.len()), Some(1));
        clear_input_requests(&mut state);
        assert_eq!(state, json!({"status": "working"}));
        let mut done = json!({"status": "completed", "inputRequests": {}});
        clear_input_requests(&mut done);
        assert_eq!(done, json!({"status": "completed"}));
    }

    #[test]
    fn presents_tasks_under_the_sidecars_identity() {
        let mut v = json!({"taskId": "task-42", "statusMessage": "task-42 runs",
                           "ttlMs": 999, "pollIntervalMs": 100});
        present_task(&mut v, "task-42", "lgt_X", 60_000, Some(2_000));
        assert_eq!(
            v,
            json!({"taskId": "lgt_X", "statusMessage": "lgt_X runs", "ttlMs": 60_000,
                   "pollIntervalMs": 2_000})
        );
        let mut slow = json!({"taskId": "t", "pollIntervalMs": 9_000});
        present_task(&mut slow, "t", "lgt_Y", 1, Some(2_000));
        assert_eq!(slow["pollIntervalMs"], 9_000);
        let mut kept = json!({"taskId": "t", "pollIntervalMs": 5});
        present_task(&mut kept, "t", "lgt_Z", 1, None);
        assert_eq!(kept["pollIntervalMs"], 5);
    }

    #[test]
    fn input_responses_round_trip_with_request_state() {
        let mut request = json!({"params": {"inputResponses": {"old": 1}, "requestState": "s0"}});
        let offered = input_responses(request["params"].as_object());
        assert_eq!(Value::Object(offered.clone()), json!({"old": 1}));
        set_input_responses(&mut request, offered.clone(), Some(json!("s1")));
        assert_eq!(request["params"]["requestState"], "s1");
        set_input_responses(&mut request, offered, Some(Value::Null));
        assert!(request["params"].get("requestState").is_none());
        assert_eq!(response_request_state(&json!({"result": {}})), Value::Null);
    }

    #[test]
    fn sidecar_requests_declare_the_tasks_extension() {
        let r = sidecar_task_request("tasks/get", "up-1", "lifeguard-abc");
        assert_eq!(r["id"], "lifeguard-abc");
        assert_eq!(r["params"]["taskId"], "up-1");
        assert!(
            r["params"]["_meta"][meta::CLIENT_CAPABILITIES]["extensions"][TASKS_EXTENSION]
                .is_object()
        );
    }

    #[test]
    fn builds_results_from_the_ledger_view() {
        let view = TaskView {
            task_id: "lgt_X",
            status: TaskStatus::Failed,
            status_message: Some("deadline exceeded"),
            created_at: 0,
            last_updated_at: 1500,
            ttl_ms: 60000,
            poll_interval_ms: 2000,
        };
        let get = view.get_result(Some(&json!({"code":-32603,"message":"m"})));
        assert_eq!(get["resultType"], "complete");
        assert_eq!(get["status"], "failed");
        assert_eq!(get["error"]["code"], -32603);
        assert_eq!(get["lastUpdatedAt"], "1970-01-01T00:00:01.500Z");
        let params = view.notification_params(None);
        assert!(params.get("resultType").is_none());
        assert_eq!(params["status"], "failed");
        let create = view.create_result();
        assert_eq!(create["resultType"], "task");
        assert!(create.get("result").is_none());
    }
}
