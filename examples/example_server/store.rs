//! In-memory task store, the rows table written by `write_rows`, and the broadcast channel that
//! feeds `subscriptions/listen` streams.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Map, Value, json};
use tokio::sync::{Notify, broadcast};

use crate::inputs::Expected;
use crate::rpc::{iso8601, now_ms};

/// Time-to-live advertised on every task (the demo never expires tasks).
pub const TTL_MS: u64 = 3_600_000;
const EVENT_CAPACITY: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Working,
    InputRequired,
    Completed,
    Failed,
    Cancelled,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Working => "working",
            Status::InputRequired => "input_required",
            Status::Completed => "completed",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Completed | Status::Failed | Status::Cancelled)
    }
}

/// How a job ended.
pub enum Outcome {
    /// A CallToolResult (also for tool-level errors with `isError: true`).
    Done(Value),
    /// A JSON-RPC error object: the task fails.
    Failed(Value),
    /// The job noticed it was cancelled and stopped.
    Cancelled,
}

/// Something a listen stream may be interested in.
#[derive(Debug, Clone)]
pub enum Event {
    /// A task changed; `state` is the full task (tasks/get result minus `resultType`).
    Task {
        task_id: String,
        state: Value,
    },
    ToolsListChanged,
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated {
        uri: String,
    },
}

struct Task {
    status: Status,
    status_message: Option<String>,
    created_ms: u64,
    updated_ms: u64,
    /// Outstanding input requests, keyed as sent to the client.
    input_requests: BTreeMap<String, Value>,
    /// Answers received for keys the job has not consumed yet.
    answers: BTreeMap<String, Value>,
    result: Option<Value>,
    error: Option<Value>,
    /// Wakes the job on cancellation or new answers.
    wake: Arc<Notify>,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    /// Tasks whose tool ignores `tasks/cancel` (a deliberately uncooperative worker), with how
    /// many cancels each ignored.
    ignores_cancel: HashMap<String, u64>,
    /// Tasks whose `tasks/get` waits for a cancellation (`slowPolls`).
    slow_polls: HashSet<String>,
    tasks: HashMap<String, Task>,
    /// Creation order, for `/_example/tasks`.
    order: Vec<String>,
    rows: Vec<Value>,
}

pub struct Store {
    inner: Mutex<Inner>,
    events: broadcast::Sender<Event>,
    pub poll_interval_ms: u64,
}

impl Store {
    pub fn new(poll_interval_ms: u64) -> Self {
        let (events, _) = broadcast::channel(EVENT_CAPACITY);
        Self {
            inner: Mutex::new(Inner::default()),
            events,
            poll_interval_ms,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that matters
        // for a demo; keep serving instead of propagating the poison.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    pub fn emit(&self, event: Event) {
        // No receivers is fine.
        let _ = self.events.send(event);
    }

    fn render(&self, id: &str, t: &Task) -> Value {
        let mut obj = Map::new();
        obj.insert("taskId".into(), json!(id));
        obj.insert("status".into(), json!(t.status.as_str()));
        if let Some(msg) = &t.status_message {
            obj.insert("statusMessage".into(), json!(msg));
        }
        obj.insert("createdAt".into(), json!(iso8601(t.created_ms)));
        obj.insert("lastUpdatedAt".into(), json!(iso8601(t.updated_ms)));
        obj.insert("ttlMs".into(), json!(TTL_MS));
        obj.insert("pollIntervalMs".into(), json!(self.poll_interval_ms));
        match t.status {
            Status::InputRequired => {
                let reqs: Map<String, Value> = t
                    .input_requests
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                obj.insert("inputRequests".into(), Value::Object(reqs));
            }
            Status::Completed => {
                obj.insert("result".into(), t.result.clone().unwrap_or(Value::Null));
            }
            Status::Failed => {
                obj.insert("error".into(), t.error.clone().unwrap_or(Value::Null));
            }
            Status::Working | Status::Cancelled => {}
        }
        Value::Object(obj)
    }

    /// Marks a change: bumps `lastUpdatedAt` and broadcasts the new full state.
    fn touch(&self, id: &str, t: &mut Task) {
        t.updated_ms = now_ms().max(t.updated_ms);
        let state = self.render(id, t);
        self.emit(Event::Task {
            task_id: id.to_owned(),
            state,
        });
    }

    /// Creates a task in `working` state and returns its ID, the flat CreateTaskResult and the
    /// job's wake handle. The task is visible to `tasks/get` before this returns.
    pub fn create(&self) -> (String, Value, Arc<Notify>) {
        let mut inner = self.lock();
        inner.next_id += 1;
        // DELIBERATELY GUESSABLE: a plain sequential counter. The spec requires unguessable task
        // IDs; this server violates that on purpose so the demo can show the sidecar hiding
        // upstream IDs behind its own unguessable, owner-bound ones.
        let id = format!("task-{}", inner.next_id);
        let now = now_ms();
        let task = Task {
            status: Status::Working,
            status_message: None,
            created_ms: now,
            updated_ms: now,
            input_requests: BTreeMap::new(),
            answers: BTreeMap::new(),
            result: None,
            error: None,
            wake: Arc::new(Notify::new()),
        };
        let mut created = self.render(&id, &task);
        created["resultType"] = json!("task");
        let wake = task.wake.clone();
        inner.tasks.insert(id.clone(), task);
        inner.order.push(id.clone());
        (id, created, wake)
    }

    /// Full task state (without `resultType`), or `None` when unknown.
    pub fn get(&self, id: &str) -> Option<Value> {
        let inner = self.lock();
        inner.tasks.get(id).map(|t| self.render(id, t))
    }

    /// `[{taskId, status}]` in creation order.
    pub fn brief_list(&self) -> Vec<Value> {
        let inner = self.lock();
        inner
            .order
            .iter()
            .filter_map(|id| {
                inner.tasks.get(id).map(|t| {
                    let mut brief = json!({"taskId": id, "status": t.status.as_str()});
                    if let Some(ignored) = inner.ignores_cancel.get(id) {
                        brief["ignoredCancels"] = json!(ignored);
                    }
                    brief
                })
            })
            .collect()
    }

    /// Whether the task exists and is not terminal.
    pub fn is_active(&self, id: &str) -> bool {
        let inner = self.lock();
        inner.tasks.get(id).is_some_and(|t| !t.status.is_terminal())
    }

    /// Marks a task as one whose tool ignores `tasks/cancel`.
    pub fn ignore_cancel(&self, id: &str) {
        self.lock().ignores_cancel.insert(id.to_owned(), 0);
    }

    /// Marks a task whose `tasks/get` answers only once it was cancelled.
    pub fn slow_polls(&self, id: &str) {
        self.lock().slow_polls.insert(id.to_owned());
    }

    /// How `tasks/get` on the task is paced: `None` without `slowPolls`, else whether the
    /// task was cancelled yet.
    pub fn slow_poll_cancelled(&self, id: &str) -> Option<bool> {
        let inner = self.lock();
        inner.slow_polls.contains(id).then(|| {
            inner
                .tasks
                .get(id)
                .is_none_or(|t| t.status == Status::Cancelled)
        })
    }

    /// Requests cancellation. `None` when the task is unknown; a terminal task is left alone,
    /// and so is a task whose tool ignores cancels (the request is only counted).
    pub fn cancel(&self, id: &str) -> Option<()> {
        let mut inner = self.lock();
        if let Some(ignored) = inner.ignores_cancel.get_mut(id) {
            *ignored += 1;
            return inner.tasks.contains_key(id).then_some(());
        }
        let t = inner.tasks.get_mut(id)?;
        if !t.status.is_terminal() {
            t.status = Status::Cancelled;
            t.status_message = Some("Cancelled by request".into());
            t.input_requests.clear();
            t.wake.notify_one();
            self.touch(id, t);
        }
        Some(())
    }

    /// Applies `inputResponses`: keys that are not outstanding are ignored; partial answers keep
    /// the task in `input_required`. Each answer to an outstanding key must be the result type
    /// of its request ([`Expected`]); when one is not, nothing is applied and the problems are
    /// returned per key (the task keeps waiting for the same keys). `None` when the task is
    /// unknown.
    pub fn update(
        &self,
        id: &str,
        responses: &Map<String, Value>,
    ) -> Option<Result<(), Map<String, Value>>> {
        let mut inner = self.lock();
        let t = inner.tasks.get_mut(id)?;
        if t.status != Status::InputRequired {
            return Some(Ok(()));
        }
        let problems: Map<String, Value> = responses
            .iter()
            .filter_map(|(key, answer)| {
                let expected = Expected::of_request(t.input_requests.get(key)?)?;
                expected
                    .check(answer)
                    .err()
                    .map(|p| (key.clone(), json!(p)))
            })
            .collect();
        if !problems.is_empty() {
            return Some(Err(problems));
        }
        let mut changed = false;
        for (key, answer) in responses {
            if t.input_requests.remove(key).is_some() {
                t.answers.insert(key.clone(), answer.clone());
                changed = true;
            }
        }
        if changed {
            if t.input_requests.is_empty() {
                t.status = Status::Working;
                t.status_message = None;
            }
            t.wake.notify_one();
            self.touch(id, t);
        }
        Some(Ok(()))
    }

    /// Puts the task into `input_required` with these (new, never reused) keys.
    /// Returns false when the task is no longer active.
    pub fn request_input(&self, id: &str, requests: &[(String, Value)], message: &str) -> bool {
        let mut inner = self.lock();
        let Some(t) = inner.tasks.get_mut(id) else {
            return false;
        };
        if t.status.is_terminal() {
            return false;
        }
        for (key, req) in requests {
            t.input_requests.insert(key.clone(), req.clone());
        }
        t.status = Status::InputRequired;
        t.status_message = Some(message.to_owned());
        self.touch(id, t);
        true
    }

    /// Takes the answers for `keys` once all of them arrived. `Err(())` when the task is no
    /// longer active, `Ok(None)` while some are still outstanding.
    pub fn take_answers(
        &self,
        id: &str,
        keys: &[String],
    ) -> Result<Option<Map<String, Value>>, ()> {
        let mut inner = self.lock();
        let Some(t) = inner.tasks.get_mut(id) else {
            return Err(());
        };
        if t.status.is_terminal() {
            return Err(());
        }
        if !keys.iter().all(|k| t.answers.contains_key(k)) {
            return Ok(None);
        }
        let mut out = Map::new();
        for k in keys {
            if let Some(v) = t.answers.remove(k) {
                out.insert(k.clone(), v);
            }
        }
        Ok(Some(out))
    }

    /// Sets a progress-style status message on an active task.
    pub fn set_message(&self, id: &str, message: String) {
        let mut inner = self.lock();
        if let Some(t) = inner.tasks.get_mut(id)
            && !t.status.is_terminal()
        {
            t.status_message = Some(message);
            self.touch(id, t);
        }
    }

    /// Appends a row, atomically with the cancellation check: once a task is cancelled (or
    /// otherwise terminal) no row can be written for it. `task_id` is `None` for synchronous
    /// (non-task) runs.
    pub fn write_row(&self, task_id: Option<&str>, label: &str, row: u64) -> bool {
        let mut inner = self.lock();
        if let Some(id) = task_id
            && inner.tasks.get(id).is_none_or(|t| t.status.is_terminal())
        {
            return false;
        }
        inner.rows.push(json!({
            "taskId": task_id,
            "label": label,
            "row": row,
            "atMs": now_ms(),
        }));
        true
    }

    pub fn rows(&self) -> Vec<Value> {
        self.lock().rows.clone()
    }

    /// Records how the job ended, unless the task already reached a terminal state (e.g. it was
    /// cancelled while the job was finishing).
    pub fn finish(&self, id: &str, outcome: Outcome) {
        let mut inner = self.lock();
        let Some(t) = inner.tasks.get_mut(id) else {
            return;
        };
        if t.status.is_terminal() {
            return;
        }
        match outcome {
            Outcome::Done(result) => {
                t.status = Status::Completed;
                t.status_message = None;
                t.result = Some(result);
            }
            Outcome::Failed(error) => {
                t.status = Status::Failed;
                t.status_message = error
                    .get("message")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                t.error = Some(error);
            }
            Outcome::Cancelled => {
                t.status = Status::Cancelled;
                t.status_message = Some("Cancelled by request".into());
            }
        }
        t.input_requests.clear();
        self.touch(id, t);
    }

    /// BUG ON PURPOSE (used only by `unstable_status`): overwrites a terminal state with
    /// `failed`, violating terminal immutability, so tests can show the sidecar keeps the first
    /// terminal state it saw.
    pub fn force_fail(&self, id: &str, error: Value) {
        let mut inner = self.lock();
        let Some(t) = inner.tasks.get_mut(id) else {
            return;
        };
        if t.status == Status::Cancelled {
            return;
        }
        t.status = Status::Failed;
        t.status_message = error
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_owned);
        t.result = None;
        t.error = Some(error);
        self.touch(id, t);
    }
}
