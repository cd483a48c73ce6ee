//! The internal hop: requests about a task whose server state lives on another replica are
//! answered by that replica (its "home"), reached over HTTP on its `--internal-listen` port.
//!
//! The sending replica has already authenticated the caller and checked that the caller may
//! act on the task; it forwards the client's request unchanged (headers and body, so the home
//! replica authenticates and authorizes it again on its own) with the hop's signed headers
//! ([`auth`]). The home replica answers it exactly as if the client had asked it directly, and
//! the answer is relayed as it is. A hop request is never forwarded again.

pub mod auth;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::ledger::{ReplicaInfo, TaskLedger};

use self::auth::{HopClaims, HopRefusal};
use super::context::RequestContext;
use super::respond;

fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}

/// The path of the hop endpoint on `--internal-listen`.
pub const PATH: &str = "/internal/v1/mcp";

/// Name of the ledger secret that keys hop signatures (shared by every replica of a server).
pub const KEY_SECRET: &str = "internal-hop-key";

/// Nonces remembered (each for twice the accepted skew); beyond it the oldest half is dropped
/// and requests older than that are refused as stale by their time anyway.
const MAX_NONCES: usize = 100_000;

/// How long a forwarded request may go unacknowledged by the home's TCP stack before the hop
/// gives its connection up (Linux `TCP_USER_TIMEOUT`). The whole request may take the upstream
/// timeout, since the home may wait on its server; but a home behind a silent partition (no
/// RST, no ICMP) never acknowledges the bytes, and without this a poll sent over a pooled
/// connection would wait that whole timeout (5 min by default) for its retryable 503. A slow
/// home acknowledges at once and answers later, so this never cuts a long answer.
#[cfg(target_os = "linux")]
const UNACKNOWLEDGED_TIMEOUT: Duration = Duration::from_secs(5);

/// The hop as this replica uses it: the shared key, a pooled client, and the memory of the
/// nonces it has accepted.
pub struct Hop {
    key: [u8; 32],
    me: String,
    client: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
    seen: Mutex<HashMap<String, i64>>,
}

/// Why a forward did not produce the home replica's answer.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// The home replica has no live heartbeat (or never said where its hop listens).
    #[error("the home replica {0} is gone")]
    HomeGone(String),
    #[error("the home replica {replica} did not answer: {reason}")]
    Unreachable { replica: String, reason: String },
}

impl Hop {
    /// Reads (creating on first use) the shared key from the ledger.
    pub async fn new(ledger: &dyn TaskLedger, timeout: Duration) -> crate::ledger::Result<Self> {
        let key = ledger.secret(KEY_SECRET).await?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        #[cfg(target_os = "linux")]
        connector.set_tcp_user_timeout(Some(UNACKNOWLEDGED_TIMEOUT));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build(connector);
        Ok(Self {
            key,
            me: ledger.scope().replica.clone(),
            client,
            timeout,
            seen: Mutex::new(HashMap::new()),
        })
    }

    /// Sends the client's request in `ctx` to `home` and returns its answer as received.
    pub async fn forward(
        &self,
        ledger: &dyn TaskLedger,
        home: &str,
        ctx: &RequestContext,
    ) -> Result<Response, ForwardError> {
        let response = self
            .send(ledger, home, &ctx.headers, ctx.body.clone())
            .await?;
        let (parts, body) = response.into_parts();
        if refused_the_hop(parts.status, &parts.headers) {
            // The home refused the hop itself (signature, clock skew, replay): the client's
            // request was never judged there, so this is no answer to relay (a 401 would tell
            // the client to get another token); it is a home that did not answer.
            return Err(ForwardError::Unreachable {
                replica: home.to_owned(),
                reason: "it refused the signed hop request (hop key or clocks disagree)".into(),
            });
        }
        let mut relayed = Response::new(Body::new(body));
        *relayed.status_mut() = parts.status;
        for name in [
            header::CONTENT_TYPE,
            header::RETRY_AFTER,
            header::WWW_AUTHENTICATE,
        ] {
            if let Some(value) = parts.headers.get(&name) {
                relayed.headers_mut().insert(name, value.clone());
            }
        }
        Ok(relayed)
    }

    /// Sends a client request (its headers, and `body`) to `home`, signed; the home replica's
    /// response, its body unread.
    pub async fn send(
        &self,
        ledger: &dyn TaskLedger,
        home: &str,
        client_headers: &HeaderMap,
        body: Bytes,
    ) -> Result<http::Response<Incoming>, ForwardError> {
        let now = now_ms();
        let replica = ledger
            .replica(home)
            .await
            .map_err(|e| ForwardError::Unreachable {
                replica: home.to_owned(),
                reason: format!("looking up its address: {e}"),
            })?;
        let address = match replica {
            Some(ReplicaInfo {
                address: Some(address),
                expires_at,
                ..
            }) if expires_at > now => address,
            // Alive, but started without `--internal-listen`: its tasks are not lost, only
            // unreachable from here.
            Some(ReplicaInfo {
                address: None,
                expires_at,
                ..
            }) if expires_at > now => {
                return Err(ForwardError::Unreachable {
                    replica: home.to_owned(),
                    reason: "it serves no internal hop (--internal-listen)".into(),
                });
            }
            _ => return Err(ForwardError::HomeGone(home.to_owned())),
        };
        let unreachable = |reason: String| ForwardError::Unreachable {
            replica: home.to_owned(),
            reason,
        };
        let uri: Uri = format!("http://{address}{PATH}")
            .parse()
            .map_err(|e| unreachable(format!("bad address {address:?}: {e}")))?;
        let headers = self.signed_headers(home, client_headers, &body, now);
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(uri)
            .body(Full::new(body))
            .map_err(|e| unreachable(e.to_string()))?;
        *request.headers_mut() = headers;
        tokio::time::timeout(self.timeout, self.client.request(request))
            .await
            .map_err(|_| unreachable(format!("no answer within {:?}", self.timeout)))?
            .map_err(|e| unreachable(e.to_string()))
    }

    /// The client's headers (minus hop-by-hop headers and any hop headers it sent) with the
    /// hop's signed claims.
    fn signed_headers(&self, to: &str, incoming: &HeaderMap, body: &[u8], now: i64) -> HeaderMap {
        let mut headers = HeaderMap::with_capacity(incoming.len() + 5);
        for (name, value) in incoming {
            let n = name.as_str();
            if auth::HOP_HEADERS.contains(&n) || auth::UNSIGNED.contains(&n) {
                continue;
            }
            headers.append(name.clone(), value.clone());
        }
        let mut nonce = [0u8; 16];
        let _ = getrandom::fill(&mut nonce);
        let claims = HopClaims {
            from: self.me.clone(),
            to: to.to_owned(),
            time_ms: now,
            nonce: hex::encode(nonce),
        };
        let signature = auth::sign(&self.key, &claims, &headers, body);
        let mut set = |name: &'static str, value: &str| {
            if let Ok(value) = HeaderValue::from_str(value) {
                headers.insert(HeaderName::from_static(name), value);
            }
        };
        set(auth::FROM, &claims.from);
        set(auth::TO, &claims.to);
        set(auth::TIME, &claims.time_ms.to_string());
        set(auth::NONCE, &claims.nonce);
        set(auth::SIGNATURE, &signature);
        headers
    }

    /// Checks a received hop request, remembering its nonce.
    pub fn accept(&self, headers: &HeaderMap, body: &[u8]) -> Result<HopClaims, HopRefusal> {
        let now = now_ms();
        let claims = auth::verify(&self.key, &self.me, now, headers, body)?;
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.retain(|_, at| now - *at <= 2 * auth::MAX_SKEW_MS);
        if seen.len() >= MAX_NONCES {
            return Err(HopRefusal::Replayed);
        }
        if seen.insert(claims.nonce.clone(), now).is_some() {
            return Err(HopRefusal::Replayed);
        }
        Ok(claims)
    }
}

/// Whether a home replica's answer is its refusal of the hop itself (401 without a bearer
/// challenge; the answer to a client's bad token always carries `WWW-Authenticate`).
fn refused_the_hop(status: http::StatusCode, headers: &HeaderMap) -> bool {
    status == http::StatusCode::UNAUTHORIZED && !headers.contains_key(header::WWW_AUTHENTICATE)
}

/// The answer when the home replica cannot be reached: retry later (the task is neither lost
/// nor revealed: only a request its owner or an administrator may make is routed).
pub fn unreachable_answer(ctx: &RequestContext) -> Response {
    respond::retry_shortly(
        &ctx.id(),
        "The replica running this task did not answer; try again shortly",
        "replica_unreachable",
        Some(&ctx.policy.name),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_challenge_less_401_is_the_homes_refusal_of_the_hop() {
        let none = HeaderMap::new();
        let mut challenged = HeaderMap::new();
        challenged.insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer error=\"invalid_token\""),
        );
        assert!(refused_the_hop(http::StatusCode::UNAUTHORIZED, &none));
        assert!(!refused_the_hop(
            http::StatusCode::UNAUTHORIZED,
            &challenged
        ));
        assert!(!refused_the_hop(http::StatusCode::BAD_REQUEST, &none));
        assert!(!refused_the_hop(http::StatusCode::OK, &none));
    }
}
