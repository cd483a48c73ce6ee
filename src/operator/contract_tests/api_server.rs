//! A scripted API server: a `kube::Client` over tower-test's mock service, and a task that
//! checks every request the client sends against a script, in order, and answers it.
//!
//! A request is matched exactly: method, path and query string as kube builds them, the
//! `Content-Type`, and the JSON body key for key (no missing and no extra fields). Two
//! placeholders stand for values the code under test cannot be made to fix: [`NOW`] (a
//! timestamp read from the wall clock during the test, e.g. an Event's `eventTime`) and
//! [`ANY`] (any string, e.g. a generated Event name). After the script, the server requires
//! silence: once every clone of the client is dropped, no further request may have arrived.

use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use jiff::Timestamp;
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

type ApiServerHandle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// Matches any timestamp taken from the wall clock while the test ran.
pub const NOW: &str = "<now>";
/// Matches any string.
pub const ANY: &str = "<any>";

/// Content type of a server-side apply patch.
pub const APPLY_PATCH: &str = "application/apply-patch+yaml";
/// Content type of a JSON merge patch.
pub const MERGE_PATCH: &str = "application/merge-patch+json";
/// Content type of a create or delete body.
pub const JSON: &str = "application/json";

/// The query every status and child write of the operator carries.
pub const SSA_QUERY: &str = "?&force=true&fieldManager=lifeguard-operator";

/// What the server answers.
enum Reply {
    Json(StatusCode, Value),
    /// The request body, as the API server answers a successful create.
    Echo(StatusCode),
}

/// One request the code under test must send, and the answer it gets.
pub struct Exchange {
    method: Method,
    uri: String,
    content_type: Option<&'static str>,
    body: Option<Value>,
    reply: Reply,
}

impl Exchange {
    fn new(method: Method, uri: impl Into<String>, body: Option<(&'static str, Value)>) -> Self {
        let (content_type, body) = match body {
            Some((content_type, body)) => (Some(content_type), Some(body)),
            None => (None, None),
        };
        Self {
            method,
            uri: uri.into(),
            content_type,
            body,
            reply: Reply::Json(StatusCode::OK, json!({})),
        }
    }

    /// A GET (no body).
    pub fn get(uri: impl Into<String>) -> Self {
        Self::new(Method::GET, uri, None)
    }

    /// A create.
    pub fn post(uri: impl Into<String>, body: Value) -> Self {
        Self::new(Method::POST, uri, Some((JSON, body)))
    }

    /// A server-side apply.
    pub fn apply(uri: impl Into<String>, body: Value) -> Self {
        Self::new(Method::PATCH, uri, Some((APPLY_PATCH, body)))
    }

    /// A JSON merge patch.
    pub fn merge(uri: impl Into<String>, body: Value) -> Self {
        Self::new(Method::PATCH, uri, Some((MERGE_PATCH, body)))
    }

    /// A delete with default options.
    pub fn delete(uri: impl Into<String>) -> Self {
        Self::new(Method::DELETE, uri, Some((JSON, json!({}))))
    }

    /// Answers with `status` and `body`.
    pub fn respond(mut self, status: StatusCode, body: Value) -> Self {
        self.reply = Reply::Json(status, body);
        self
    }

    /// Answers 200 with `body`.
    pub fn ok(self, body: Value) -> Self {
        self.respond(StatusCode::OK, body)
    }

    /// Answers 201 with the request body.
    pub fn created(mut self) -> Self {
        self.reply = Reply::Echo(StatusCode::CREATED);
        self
    }

    /// Answers with a `Status` failure.
    pub fn fail(self, code: u16, reason: &str) -> Self {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        self.respond(status, failure(code, reason))
    }

    pub fn not_found(self) -> Self {
        self.fail(404, "NotFound")
    }

    /// 409 on an update whose `resourceVersion` is stale.
    pub fn conflict(self) -> Self {
        self.fail(409, "Conflict")
    }

    /// 409 on a create whose name is taken.
    pub fn already_exists(self) -> Self {
        self.fail(409, "AlreadyExists")
    }

    pub fn server_error(self) -> Self {
        self.fail(500, "InternalError")
    }
}

/// A `meta/v1` `Status` as the API server sends with an error.
pub fn failure(code: u16, reason: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Status", "metadata": {},
        "status": "Failure", "message": format!("mock: {reason}"), "reason": reason, "code": code
    })
}

/// A client whose every request goes to the returned server.
pub fn mock_client() -> (Client, ApiServer) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(service, "default"), ApiServer(handle))
}

/// The server end, before its script is known.
pub struct ApiServer(ApiServerHandle);

/// The running script.
pub struct Served(JoinHandle<()>);

impl ApiServer {
    /// Answers `script` in order on a task, then requires silence.
    pub fn serve(self, script: Vec<Exchange>) -> Served {
        let mut handle = self.0;
        let started = Timestamp::now();
        Served(tokio::spawn(async move {
            let total = script.len();
            for (index, exchange) in script.into_iter().enumerate() {
                let Some((request, send)) = handle.next_request().await else {
                    panic!(
                        "request {} of {total} ({} {}) was never sent",
                        index + 1,
                        exchange.method,
                        exchange.uri
                    );
                };
                let sent = check(index + 1, &exchange, request, started).await;
                let (status, body) = match exchange.reply {
                    Reply::Json(status, body) => (status, body),
                    Reply::Echo(status) => (status, sent.unwrap_or_else(|| json!({}))),
                };
                let response = Response::builder()
                    .status(status)
                    .header(http::header::CONTENT_TYPE, JSON)
                    .body(Body::from(serde_json::to_vec(&body).unwrap_or_default()))
                    .unwrap_or_else(|e| panic!("building the mock response: {e}"));
                send.send_response(response);
            }
            if let Some((request, _)) = handle.next_request().await {
                panic!(
                    "unexpected request after the {total} scripted: {} {}",
                    request.method(),
                    request.uri()
                );
            }
        }))
    }
}

impl Served {
    /// Waits for the script to finish. Every clone of the client must have been dropped (the
    /// server cannot otherwise know that nothing more comes). A failed check panics here with
    /// its own message.
    pub async fn verify(self) {
        match tokio::time::timeout(Duration::from_secs(5), self.0).await {
            Err(_) => panic!(
                "the mock API server did not finish: a scripted request was not sent, or a \
                 client clone is still alive"
            ),
            Ok(Err(error)) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Ok(Err(error)) => panic!("the mock API server task failed: {error}"),
            Ok(Ok(())) => {}
        }
    }
}

/// Checks one request; returns its JSON body.
async fn check(
    number: usize,
    exchange: &Exchange,
    request: Request<Body>,
    started: Timestamp,
) -> Option<Value> {
    let what = format!("request {number} ({} {})", exchange.method, exchange.uri);
    assert_eq!(request.method(), exchange.method, "{what}: method");
    assert_eq!(
        request.uri().to_string(),
        exchange.uri,
        "{what}: path and query"
    );
    let content_type = request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or("<not text>").to_owned());
    assert_eq!(
        content_type.as_deref(),
        exchange.content_type,
        "{what}: content type"
    );
    let bytes = request
        .into_body()
        .collect_bytes()
        .await
        .unwrap_or_else(|e| panic!("{what}: reading the body: {e}"));
    let Some(expected) = &exchange.body else {
        assert!(
            bytes.is_empty(),
            "{what}: unexpected body {}",
            String::from_utf8_lossy(&bytes)
        );
        return None;
    };
    let mut actual: Value = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "{what}: body is not JSON ({e}): {}",
            String::from_utf8_lossy(&bytes)
        )
    });
    let sent = actual.clone();
    mask_placeholders(expected, &mut actual, started);
    assert!(
        actual == *expected,
        "{what}: body differs\n--- sent\n{}\n--- expected\n{}",
        pretty(&actual),
        pretty(expected)
    );
    Some(sent)
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default()
}

/// Replaces, in `actual`, the values that satisfy a placeholder of `expected` with the
/// placeholder, so that one equality check compares everything else exactly.
fn mask_placeholders(expected: &Value, actual: &mut Value, started: Timestamp) {
    match (expected, actual) {
        (Value::String(placeholder), actual @ Value::String(_)) if placeholder == ANY => {
            *actual = Value::String(ANY.into());
        }
        (Value::String(placeholder), actual @ Value::String(_)) if placeholder == NOW => {
            let during_test = actual
                .as_str()
                .and_then(|s| s.parse::<Timestamp>().ok())
                .is_some_and(|t| {
                    // Serialized times may be truncated to the second.
                    t >= started - jiff::SignedDuration::from_secs(1) && t <= Timestamp::now()
                });
            if during_test {
                *actual = Value::String(NOW.into());
            }
        }
        (Value::Object(expected), Value::Object(actual)) => {
            for (key, value) in expected {
                if let Some(slot) = actual.get_mut(key) {
                    mask_placeholders(value, slot, started);
                }
            }
        }
        (Value::Array(expected), Value::Array(actual)) => {
            for (value, slot) in expected.iter().zip(actual.iter_mut()) {
                mask_placeholders(value, slot, started);
            }
        }
        _ => {}
    }
}
