//! Client requests in flight to this replica's server, by JSON-RPC id and principal, so that a
//! `notifications/cancelled` reaches the server only when it can stop nobody's request but the
//! caller's own.
//!
//! JSON-RPC ids are chosen by clients, and a server correlates a cancellation with a request by
//! id alone: without this, any client could name another client's id and stop its call or its
//! listen stream. A request is in flight from the moment it passed the pipeline's checks until
//! its answer ended (for a streamed answer, until the stream ended or the client went away).
//!
//! One registry per replica is enough: an in-flight request lives on this replica's connection
//! to its own server process, so a cancellation can only ever reach it through this replica.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::response::Response;
use futures_util::StreamExt;
use http::header::CONTENT_TYPE;
use serde_json::Value;

use crate::model::Owner;

/// What may become of a client's `notifications/cancelled`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelVerdict {
    /// Every request in flight under that id is the caller's: forward it.
    Forward,
    /// No request of the caller's is in flight under that id (or the id is not an id).
    NotInFlight,
    /// The caller has a request in flight under that id, and so does another principal: the
    /// server could not tell them apart, so nothing is forwarded.
    Shared,
}

impl CancelVerdict {
    /// The reason label of a dropped cancellation (audit and metrics).
    pub fn reason(self) -> &'static str {
        match self {
            Self::Forward => "own_request",
            Self::NotInFlight => "cancel_not_in_flight",
            Self::Shared => "cancel_id_shared",
        }
    }
}

/// The registry of requests in flight on this replica.
#[derive(Default)]
pub struct InFlight {
    next: AtomicU64,
    by_id: Mutex<HashMap<String, Vec<(u64, Owner)>>>,
}

/// Keeps one request registered until dropped.
pub struct InFlightGuard {
    registry: Arc<InFlight>,
    key: String,
    serial: u64,
}

/// The key of an id: a string's text, a number's digits. `"7"` and `7` share a key on purpose:
/// a server that coerces ids would confuse them, so they count as the same id.
fn key_of(id: &Value) -> Option<String> {
    match id {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

impl InFlight {
    /// Registers `owner`'s request `id` until the guard is dropped; `None` for a message
    /// without a usable id (a notification).
    pub fn enter(self: &Arc<Self>, owner: &Owner, id: &Value) -> Option<InFlightGuard> {
        let key = key_of(id)?;
        let serial = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock()
            .entry(key.clone())
            .or_default()
            .push((serial, owner.clone()));
        Some(InFlightGuard {
            registry: self.clone(),
            key,
            serial,
        })
    }

    /// Whether `owner` may cancel the request named `request_id` at the server.
    pub fn judge(&self, owner: &Owner, request_id: Option<&Value>) -> CancelVerdict {
        let Some(key) = request_id.and_then(key_of) else {
            return CancelVerdict::NotInFlight;
        };
        let map = self.lock();
        let Some(entries) = map.get(&key) else {
            return CancelVerdict::NotInFlight;
        };
        if !entries.iter().any(|(_, o)| o == owner) {
            CancelVerdict::NotInFlight
        } else if entries.iter().all(|(_, o)| o == owner) {
            CancelVerdict::Forward
        } else {
            CancelVerdict::Shared
        }
    }

    /// How many requests are in flight (tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().values().map(Vec::len).sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<(u64, Owner)>>> {
        self.by_id.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Keeps `guard` registered for as long as the answer is being delivered: until a streamed
/// answer ends or its client goes away. A JSON answer is complete already: the request is no
/// longer in flight at the server.
pub fn hold_until_answered(response: Response, guard: Option<InFlightGuard>) -> Response {
    let Some(guard) = guard else {
        return response;
    };
    let streamed = response
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !streamed {
        return response;
    }
    response.map(|body| {
        Body::from_stream(body.into_data_stream().map(move |chunk| {
            let _held = &guard;
            chunk
        }))
    })
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        let mut map = self.registry.lock();
        if let Some(entries) = map.get_mut(&self.key) {
            entries.retain(|(serial, _)| *serial != self.serial);
            if entries.is_empty() {
                map.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn owner(subject: &str) -> Owner {
        Owner {
            issuer: "https://idp".into(),
            subject: subject.into(),
            tenant: "t".into(),
            client: "c".into(),
        }
    }

    #[test]
    fn only_the_callers_own_requests_may_be_cancelled() {
        let registry = Arc::new(InFlight::default());
        let (alice, bob) = (owner("alice"), owner("bob"));
        let guard = registry.enter(&alice, &json!(7)).unwrap();
        assert_eq!(
            registry.judge(&alice, Some(&json!(7))),
            CancelVerdict::Forward
        );
        assert_eq!(
            registry.judge(&bob, Some(&json!(7))),
            CancelVerdict::NotInFlight
        );
        assert_eq!(
            registry.judge(&alice, Some(&json!(8))),
            CancelVerdict::NotInFlight
        );
        drop(guard);
        assert_eq!(
            registry.judge(&alice, Some(&json!(7))),
            CancelVerdict::NotInFlight
        );
        assert_eq!(registry.len(), 0);
    }

    #[test]
    fn an_id_in_flight_for_two_principals_is_cancelled_for_neither() {
        let registry = Arc::new(InFlight::default());
        let (alice, bob) = (owner("alice"), owner("bob"));
        let _a = registry.enter(&alice, &json!("x")).unwrap();
        let b = registry.enter(&bob, &json!("x")).unwrap();
        assert_eq!(
            registry.judge(&bob, Some(&json!("x"))),
            CancelVerdict::Shared
        );
        drop(b);
        assert_eq!(
            registry.judge(&alice, Some(&json!("x"))),
            CancelVerdict::Forward
        );
    }

    #[test]
    fn a_string_and_a_number_of_the_same_digits_are_one_id() {
        let registry = Arc::new(InFlight::default());
        let _a = registry.enter(&owner("alice"), &json!(1)).unwrap();
        let _b = registry.enter(&owner("bob"), &json!("1")).unwrap();
        assert_eq!(
            registry.judge(&owner("bob"), Some(&json!("1"))),
            CancelVerdict::Shared
        );
    }

    #[test]
    fn same_principal_with_another_tenant_or_client_is_another_caller() {
        let registry = Arc::new(InFlight::default());
        let alice = owner("alice");
        let mut other_client = alice.clone();
        other_client.client = "other".into();
        let _g = registry.enter(&alice, &json!(3)).unwrap();
        assert_eq!(
            registry.judge(&other_client, Some(&json!(3))),
            CancelVerdict::NotInFlight
        );
        assert_eq!(registry.judge(&alice, None), CancelVerdict::NotInFlight);
        assert_eq!(
            registry.judge(&alice, Some(&json!({"id": 3}))),
            CancelVerdict::NotInFlight
        );
        assert!(registry.enter(&alice, &Value::Null).is_none());
    }
}
