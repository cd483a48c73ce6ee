//! What is known about one authenticated, checked client request, as every handler sees it.

use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;
use serde_json::Value;

use crate::audit::{AuditEvent, Decision};
use crate::identity::Identity;
use crate::mcp::checks::RequestFacts;
use crate::mcp::jsonrpc::Request;

use super::active_policy::ActivePolicy;
use super::forward::client_request_headers;

/// Which way a request reached this sidecar.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// From a client, on the MCP port.
    Client,
    /// From another replica over the internal hop: answered here, never forwarded again.
    Hop { from: String },
}

/// Everything known about one authenticated, checked request.
pub struct RequestContext {
    pub correlation_id: String,
    pub policy: Arc<ActivePolicy>,
    pub identity: Identity,
    pub request: Request,
    pub facts: RequestFacts,
    pub headers: HeaderMap,
    /// The request body as received, forwarded unchanged when nothing in it needs rewriting.
    pub body: Bytes,
    /// From a client, or forwarded by another replica (never forwarded again).
    pub arrival: Arrival,
}

impl RequestContext {
    /// An audit event about this request, with the caller filled in: the owner and, for a
    /// key-bound token, the key it proved (`keyBinding`, `jkt:` or `x5t#S256:` and the key's
    /// thumbprint, itself a SHA-256 digest of the public key).
    pub fn audit(
        &self,
        event: &'static str,
        decision: Decision,
        reason: &'static str,
    ) -> AuditEvent {
        let event = AuditEvent::new(
            event,
            &self.correlation_id,
            self.policy.stamp(),
            decision,
            reason,
        )
        .owner(&self.identity.owner);
        match &self.identity.binding {
            Some(binding) => event.detail("keyBinding", binding.to_stored()),
            None => event,
        }
    }

    /// The caller's bearer token, as presented.
    pub fn bearer(&self) -> Option<&str> {
        crate::identity::jwt::bearer_token(
            self.headers
                .get(http::header::AUTHORIZATION)
                .map(|v| v.as_bytes()),
        )
        .ok()
    }

    /// The id to answer with.
    pub fn id(&self) -> Value {
        self.request.response_id()
    }

    /// Headers for forwarding this request (or one derived from it) to the server.
    pub fn upstream_headers(&self) -> HeaderMap {
        client_request_headers(
            &self.headers,
            &self.identity,
            self.policy.effective.upstream_identity,
        )
    }

    /// The `arguments` of a `tools/call` (null when absent).
    pub fn tool_arguments(&self) -> Value {
        self.request
            .params()
            .and_then(|p| p.get("arguments"))
            .cloned()
            .unwrap_or(Value::Null)
    }

    /// The id of a request the sidecar sends upstream on this request's behalf.
    pub fn sidecar_request_id(&self) -> String {
        sidecar_request_id(&self.correlation_id)
    }
}

/// The JSON-RPC id of a request the sidecar itself sends upstream for a correlation id.
pub fn sidecar_request_id(correlation_id: &str) -> String {
    format!("lifeguard-{correlation_id}")
}

/// 128 random bits, hex: ties audit lines and logs of one request together.
///
/// The bits come from the OS generator, fetched for [`IDS_PER_FILL`] ids at a time per thread
/// (one `getrandom` call per request was a measurable share of the request path).
pub fn new_correlation_id() -> String {
    let bytes = RANDOM_POOL.with(|pool| pool.borrow_mut().take());
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(32);
    for b in bytes {
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 0x0f)] as char);
    }
    out
}

/// Correlation ids drawn per call to the OS generator.
const IDS_PER_FILL: usize = 32;

/// Random bytes of this thread not yet handed out; each is handed out once.
struct RandomPool {
    bytes: [u8; 16 * IDS_PER_FILL],
    next: usize,
}

impl RandomPool {
    fn take(&mut self) -> [u8; 16] {
        if self.next == IDS_PER_FILL {
            // An OS RNG failure leaves zeros: the id only correlates, it protects nothing.
            if getrandom::fill(&mut self.bytes).is_err() {
                self.bytes.fill(0);
            }
            self.next = 0;
        }
        let mut out = [0u8; 16];
        out.copy_from_slice(&self.bytes[self.next * 16..(self.next + 1) * 16]);
        self.next += 1;
        out
    }
}

thread_local! {
    static RANDOM_POOL: std::cell::RefCell<RandomPool> = const {
        std::cell::RefCell::new(RandomPool {
            bytes: [0; 16 * IDS_PER_FILL],
            next: IDS_PER_FILL,
        })
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn correlation_ids_are_128_random_bits_in_hex() {
        let a = new_correlation_id();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, new_correlation_id());
        assert_eq!(sidecar_request_id("ab"), "lifeguard-ab");
    }

    #[test]
    fn no_correlation_id_repeats_across_refills() {
        let ids: std::collections::HashSet<String> = (0..IDS_PER_FILL * 5)
            .map(|_| new_correlation_id())
            .collect();
        assert_eq!(ids.len(), IDS_PER_FILL * 5);
    }
}
