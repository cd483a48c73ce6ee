//! `notifications/cancelled`, honoured the way the official SDKs honour it: by request id
//! alone (a stateless server has nothing else to correlate a cancellation with), stopping every
//! request in flight under that id — a synchronous `tools/call` answers -32800 "Request
//! cancelled", a listen stream ends. Every cancellation received is recorded for tests
//! (`GET /_example/cancellations`), with the `Lifeguard-Subject` header it came with.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::AppState;
use crate::rpc::now_ms;

/// The code the official SDKs answer a cancelled request with.
pub const REQUEST_CANCELLED: i64 = -32800;
const LOG_LEN: usize = 200;

/// Requests in flight by id, and the cancellations received.
#[derive(Default)]
pub struct Cancels {
    next: AtomicU64,
    in_flight: Mutex<HashMap<String, Vec<(u64, CancellationToken)>>>,
    log: Mutex<VecDeque<Value>>,
}

/// One request in flight; unregistered when dropped.
pub struct Registered {
    cancels: Arc<Cancels>,
    key: String,
    serial: u64,
    pub token: CancellationToken,
}

/// Ids are compared as JSON: `"1"` and `1` are different requests.
fn key_of(id: &Value) -> String {
    id.to_string()
}

impl Cancels {
    pub fn register(self: &Arc<Self>, id: &Value) -> Registered {
        let key = key_of(id);
        let serial = self.next.fetch_add(1, Ordering::Relaxed);
        let token = CancellationToken::new();
        self.in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.clone())
            .or_default()
            .push((serial, token.clone()));
        Registered {
            cancels: self.clone(),
            key,
            serial,
            token,
        }
    }

    /// Stops every request in flight under `params.requestId`, and records the cancellation.
    pub fn cancel(&self, params: Option<&Value>, headers: &HeaderMap) {
        let request_id = params
            .and_then(|p| p.get("requestId"))
            .cloned()
            .unwrap_or(Value::Null);
        let stopped = {
            let map = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
            let tokens = map.get(&key_of(&request_id)).cloned().unwrap_or_default();
            for (_, token) in &tokens {
                token.cancel();
            }
            tokens.len()
        };
        let subject = headers
            .get("lifeguard-subject")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let entry = json!({
            "requestId": request_id,
            "reason": params.and_then(|p| p.get("reason")).cloned(),
            "stopped": stopped,
            "subject": subject,
            "atMs": now_ms(),
        });
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        if log.len() >= LOG_LEN {
            log.pop_front();
        }
        log.push_back(entry);
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut map = self
            .cancels
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(entries) = map.get_mut(&self.key) {
            entries.retain(|(serial, _)| *serial != self.serial);
            if entries.is_empty() {
                map.remove(&self.key);
            }
        }
    }
}

/// `GET /_example/cancellations`: every `notifications/cancelled` received, oldest first.
pub async fn cancellations(State(state): State<AppState>) -> Json<Vec<Value>> {
    let log = state.cancels.log.lock().unwrap_or_else(|e| e.into_inner());
    Json(log.iter().cloned().collect())
}
