//! The app containers' probes, carried through the sidecar's admin port. Injection moves the
//! MCP container to a loopback-only port, where the kubelet can no longer reach it; the webhook
//! rewrites each of its httpGet/tcpSocket probes to `GET /app-health/<container>/<kind>` on the
//! admin port and hands the original probe to the sidecar (`--app-probes`), which runs it
//! against 127.0.0.1 and answers with the verdict.
//!
//! Guarantees:
//! - A probe only ever reaches 127.0.0.1 on the port it was configured with: nothing in the
//!   request to the admin port chooses a host, port, path or header.
//! - What the kubelet does not offer or the sidecar cannot honour (an HTTPS scheme, a `host`,
//!   a named port, gRPC or exec probes, unknown fields, a malformed key) is refused at startup
//!   with the key and the field, so a rewritten pod fails loudly instead of probing the wrong
//!   thing.
//! - Verdicts follow the kubelet: an HTTP status from 200 to 399 or an accepted TCP connection
//!   is healthy; anything else, or no answer within [`PROBE_TIMEOUT`], is not.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, StatusCode};
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use serde::de::IgnoredAny;
use tokio::net::TcpStream;

/// The longest a probe waits for the app (the kubelet's own timeout is usually shorter and
/// ends the wait first).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Which of a container's probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProbeKind {
    Livez,
    Readyz,
    Startupz,
}

impl ProbeKind {
    fn parse(text: &str) -> Option<Self> {
        match text {
            "livez" => Some(Self::Livez),
            "readyz" => Some(Self::Readyz),
            "startupz" => Some(Self::Startupz),
            _ => None,
        }
    }
}

/// One probe, as the app container declared it (on its loopback port).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AppProbe {
    HttpGet {
        path: PathAndQuery,
        port: u16,
        /// `httpHeaders`, in order (a name may repeat).
        headers: Vec<(HeaderName, HeaderValue)>,
    },
    TcpSocket {
        port: u16,
    },
}

/// Every probe the sidecar answers for, keyed by container and kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AppProbes(BTreeMap<(String, ProbeKind), AppProbe>);

/// Why `--app-probes` was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum AppProbeError {
    #[error("not a JSON object keyed <container>/<livez|readyz|startupz>: {0}")]
    NotAnObject(String),
    #[error("{key:?}: {reason}")]
    Entry { key: String, reason: String },
}

impl AppProbes {
    /// Parses the JSON object of `--app-probes` (see the module documentation).
    pub fn parse(json: &str) -> Result<Self, AppProbeError> {
        let entries: BTreeMap<String, serde_json::Value> =
            serde_json::from_str(json).map_err(|e| AppProbeError::NotAnObject(e.to_string()))?;
        let mut probes = BTreeMap::new();
        for (key, value) in entries {
            let refuse = |reason: String| AppProbeError::Entry {
                key: key.clone(),
                reason,
            };
            let (container, kind) = parse_key(&key).map_err(refuse)?;
            let raw: RawProbe = serde_path_to_error::deserialize(value).map_err(|e| {
                refuse(match e.path().to_string().as_str() {
                    "." => e.inner().to_string(),
                    at => format!("{at}: {}", e.inner()),
                })
            })?;
            probes.insert((container, kind), raw.into_probe().map_err(refuse)?);
        }
        Ok(Self(probes))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The probe of `container`'s `kind` (`livez`, `readyz`, `startupz`), if configured.
    pub fn get(&self, container: &str, kind: &str) -> Option<&AppProbe> {
        let kind = ProbeKind::parse(kind)?;
        self.0.get(&(container.to_owned(), kind))
    }
}

/// `<container>/<kind>`: a container name (RFC 1123 label) and a probe kind.
fn parse_key(key: &str) -> Result<(String, ProbeKind), String> {
    let Some((container, kind)) = key.split_once('/') else {
        return Err("the key must be <container>/<livez|readyz|startupz>".into());
    };
    let is_label = !container.is_empty()
        && container.len() <= 63
        && container
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !container.starts_with('-')
        && !container.ends_with('-');
    if !is_label {
        return Err(format!("{container:?} is not a container name"));
    }
    let kind = ProbeKind::parse(kind)
        .ok_or_else(|| format!("{kind:?} is not a probe kind (livez, readyz or startupz)"))?;
    Ok((container.to_owned(), kind))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawProbe {
    http_get: Option<RawHttpGet>,
    tcp_socket: Option<RawTcpSocket>,
    // Named so that the refusal says what is unsupported rather than "unknown field".
    grpc: Option<IgnoredAny>,
    exec: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawHttpGet {
    path: Option<String>,
    port: serde_json::Value,
    scheme: Option<String>,
    host: Option<String>,
    #[serde(default)]
    http_headers: Vec<RawHeader>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHeader {
    name: String,
    value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTcpSocket {
    port: serde_json::Value,
    host: Option<String>,
}

impl RawProbe {
    fn into_probe(self) -> Result<AppProbe, String> {
        if self.grpc.is_some() || self.exec.is_some() {
            return Err(
                "only httpGet and tcpSocket probes can be carried through the sidecar".into(),
            );
        }
        match (self.http_get, self.tcp_socket) {
            (Some(http), None) => http.into_probe(),
            (None, Some(tcp)) => {
                refuse_host(tcp.host.as_deref(), "tcpSocket")?;
                Ok(AppProbe::TcpSocket {
                    port: port(&tcp.port, "tcpSocket.port")?,
                })
            }
            _ => Err("give exactly one of httpGet or tcpSocket".into()),
        }
    }
}

impl RawHttpGet {
    fn into_probe(self) -> Result<AppProbe, String> {
        refuse_host(self.host.as_deref(), "httpGet")?;
        match self.scheme.as_deref() {
            None | Some("HTTP") => {}
            Some(other) => {
                return Err(format!(
                    "httpGet.scheme: {other:?} is not supported: the sidecar probes over plain HTTP only"
                ));
            }
        }
        // The kubelet accepts a path without its leading slash and adds it.
        let path = self.path.unwrap_or_default();
        let path = if path.starts_with('/') {
            path
        } else {
            format!("/{path}")
        };
        let path = PathAndQuery::try_from(path.as_str())
            .map_err(|e| format!("httpGet.path: {path:?}: {e}"))?;
        let headers = self
            .http_headers
            .into_iter()
            .enumerate()
            .map(|(i, h)| {
                let name = HeaderName::try_from(h.name.as_str()).map_err(|_| {
                    format!(
                        "httpGet.httpHeaders[{i}].name: {:?} is not a header name",
                        h.name
                    )
                })?;
                let value = HeaderValue::try_from(h.value.as_str())
                    .map_err(|_| format!("httpGet.httpHeaders[{i}].value is not a header value"))?;
                Ok((name, value))
            })
            .collect::<Result<_, String>>()?;
        Ok(AppProbe::HttpGet {
            path,
            port: port(&self.port, "httpGet.port")?,
            headers,
        })
    }
}

fn refuse_host(host: Option<&str>, at: &str) -> Result<(), String> {
    match host {
        None => Ok(()),
        Some(host) => Err(format!(
            "{at}.host: {host:?} is not supported: the sidecar probes 127.0.0.1 only"
        )),
    }
}

fn port(value: &serde_json::Value, at: &str) -> Result<u16, String> {
    match value {
        serde_json::Value::Number(n) => n
            .as_u64()
            .and_then(|n| u16::try_from(n).ok())
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("{at}: {n} is not a port number (1-65535)")),
        serde_json::Value::String(name) => Err(format!(
            "{at}: named port {name:?} is not supported: give the number"
        )),
        other => Err(format!("{at}: {other} is not a port number")),
    }
}

/// What running a probe found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// The app answered with this status.
    Answered(StatusCode),
    /// The TCP connection was accepted.
    Connected,
    /// No connection (refused, reset, …).
    Unreachable(String),
    /// Connected, but the exchange failed (closed early, not HTTP).
    Failed(String),
    /// Nothing within the timeout.
    TimedOut,
}

impl ProbeOutcome {
    /// The admin port's answer to the kubelet: 200 when healthy by the kubelet's rules (an
    /// HTTP status 200-399, or a TCP connection), 503 with a one-line reason otherwise.
    pub fn response(&self) -> (StatusCode, String) {
        match self {
            Self::Answered(status) if (200..400).contains(&status.as_u16()) => (
                StatusCode::OK,
                format!("ok: the app answered {}", status.as_u16()),
            ),
            Self::Answered(status) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the app answered {}", status.as_u16()),
            ),
            Self::Connected => (StatusCode::OK, "ok: the app accepted a connection".into()),
            Self::Unreachable(why) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("cannot connect to the app: {why}"),
            ),
            Self::Failed(why) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the app's answer is unusable: {why}"),
            ),
            Self::TimedOut => (
                StatusCode::SERVICE_UNAVAILABLE,
                "the app did not answer in time".into(),
            ),
        }
    }
}

/// Runs `probe` against 127.0.0.1, giving up after `timeout`.
pub async fn run(probe: &AppProbe, timeout: Duration) -> ProbeOutcome {
    let attempt = async {
        match probe {
            AppProbe::TcpSocket { port } => match connect(*port).await {
                Ok(_) => ProbeOutcome::Connected,
                Err(outcome) => outcome,
            },
            AppProbe::HttpGet {
                path,
                port,
                headers,
            } => http_get(path, *port, headers).await,
        }
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .unwrap_or(ProbeOutcome::TimedOut)
}

async fn connect(port: u16) -> Result<TcpStream, ProbeOutcome> {
    TcpStream::connect((Ipv4Addr::LOCALHOST, port))
        .await
        .map_err(|e| ProbeOutcome::Unreachable(format!("127.0.0.1:{port}: {e}")))
}

/// The request the kubelet would send: the configured headers, then `Host`, `User-Agent` and
/// `Accept` where they did not set them, and no keep-alive.
fn probe_request(
    path: &PathAndQuery,
    port: u16,
    configured: &[(HeaderName, HeaderValue)],
) -> Request<Empty<Bytes>> {
    let mut headers = HeaderMap::new();
    for (name, value) in configured {
        headers.append(name.clone(), value.clone());
    }
    let defaults = [
        (header::HOST, format!("127.0.0.1:{port}")),
        (header::USER_AGENT, "kube-probe/lifeguard".to_owned()),
        (header::ACCEPT, "*/*".to_owned()),
    ];
    for (name, value) in defaults {
        if !headers.contains_key(&name)
            && let Ok(value) = HeaderValue::try_from(value)
        {
            headers.insert(name, value);
        }
    }
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    let mut request = Request::new(Empty::new());
    *request.uri_mut() = path.clone().into();
    *request.headers_mut() = headers;
    request
}

async fn http_get(
    path: &PathAndQuery,
    port: u16,
    headers: &[(HeaderName, HeaderValue)],
) -> ProbeOutcome {
    let stream = match connect(port).await {
        Ok(stream) => stream,
        Err(outcome) => return outcome,
    };
    let (mut sender, connection) =
        match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await {
            Ok(parts) => parts,
            Err(e) => return ProbeOutcome::Failed(e.to_string()),
        };
    let request = probe_request(path, port, headers);
    // The connection is driven here and dropped (closed) on return; the body is never read.
    // With `Connection: close` it may end in the same poll that delivers the answer, so an
    // ended connection still yields the answer it carried.
    let response = sender.send_request(request);
    tokio::pin!(response);
    let answered = tokio::select! {
        biased;
        answered = &mut response => answered,
        ended = connection => match ended {
            Ok(()) => response.await,
            Err(e) => return ProbeOutcome::Failed(e.to_string()),
        },
    };
    match answered {
        Ok(response) => ProbeOutcome::Answered(response.status()),
        Err(e) => ProbeOutcome::Failed(e.to_string()),
    }
}

/// `GET /app-health/{container}/{kind}` for the admin router.
pub fn router(probes: Arc<AppProbes>) -> Router {
    Router::new()
        .route("/app-health/{container}/{kind}", get(answer))
        .with_state(probes)
}

async fn answer(
    State(probes): State<Arc<AppProbes>>,
    Path((container, kind)): Path<(String, String)>,
) -> Response {
    let Some(probe) = probes.get(&container, &kind) else {
        return (StatusCode::NOT_FOUND, "no such app probe").into_response();
    };
    let outcome = run(probe, PROBE_TIMEOUT).await;
    let (status, text) = outcome.response();
    if status != StatusCode::OK {
        tracing::debug!(%container, %kind, reason = %text, "app probe failed");
    }
    (status, text).into_response()
}

#[cfg(test)]
#[path = "app_probes_tests.rs"]
mod tests;
