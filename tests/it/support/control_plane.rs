//! A fake operator for cluster-mode tests: the distribution endpoints of
//! `lifeguard::distribution` over TLS (HTTP/2 or HTTP/1.1), with a CA and leaf minted here, and
//! an always-on JWKS endpoint signed by the same CA. It records what sidecars did (connections
//! with their bearer, acks) as an ordered event log, and can drop its streams, go down and come
//! back on the same port.

use super::tls::{mint_tls_for, serve};
use std::collections::HashSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{HeaderMap, StatusCode};
use lifeguard::distribution::{
    ACK_PATH, Ack, PodIdentity, STREAM_CONTENT_TYPE, STREAM_PATH, Snapshot, StreamMessage,
    StreamQuery,
};
use lifeguard::policy::EffectivePolicy;
use tempfile::TempDir;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// What the fake saw, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A stream was opened (and accepted) with this bearer over this HTTP version.
    Connected {
        bearer: String,
        version: http::Version,
        pod: StreamQuery,
    },
    /// A stream was refused (403) for this bearer.
    Refused { bearer: String },
    /// A sidecar acknowledged a snapshot.
    Acked { bearer: String, ack: Ack },
    /// The test dropped every stream (`drop_streams`) or took the server down.
    Dropped,
}

/// The snapshot content the fake serves: `None` until the first `push`.
#[derive(Default)]
struct Current {
    /// Bumped by every push.
    version: u64,
    policy: Option<EffectivePolicy>,
    approver_keys: Option<serde_json::Value>,
}

#[derive(Default)]
struct Shared {
    current: Mutex<Current>,
    events: Mutex<Vec<Event>>,
    refused: Mutex<HashSet<String>>,
    sessions: Mutex<u64>,
}

struct App {
    shared: Arc<Shared>,
    /// The current version (0: nothing to send yet); streams wake up on every change.
    pushed: watch::Sender<u64>,
    /// Incremented to end every open stream.
    drops: watch::Sender<u64>,
}

pub struct FakeControlPlane {
    _dir: TempDir,
    /// The CA that signed the fake's certificate, for `--control-plane-ca`.
    pub ca_path: PathBuf,
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    /// An https JWKS URL (the issuer keys of `tests/fixtures`), up while the fake is down.
    pub jwks_uri: String,
    addr: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
    app: Arc<App>,
    /// The accept loop and its connections, while up.
    running: Option<JoinSet<()>>,
    _jwks: JoinSet<()>,
}

impl FakeControlPlane {
    /// Starts the fake with nothing to send: streams stay open and silent until `push`.
    pub async fn start() -> Self {
        let loopback = std::net::Ipv4Addr::LOCALHOST;
        Self::start_on(loopback, loopback).await
    }

    /// [`FakeControlPlane::start`] with the distribution endpoint on `stream` and the JWKS
    /// endpoint on `jwks` (addresses of the test's namespace, e.g. on two `support::netns`
    /// networks, so a test can cut one and keep the other).
    pub async fn start_on(stream: std::net::Ipv4Addr, jwks: std::net::Ipv4Addr) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let names = ["127.0.0.1".to_owned(), "localhost".to_owned()];
        let (ca_pem, tls) =
            mint_tls_for(&[&names[..], &[stream.to_string(), jwks.to_string()]].concat());
        let ca_path = dir.path().join("ca.pem");
        std::fs::write(&ca_path, ca_pem).unwrap();
        let app = Arc::new(App {
            shared: Arc::default(),
            pushed: watch::channel(0).0,
            drops: watch::channel(0).0,
        });
        let listener = tokio::net::TcpListener::bind((stream, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let running = serve(listener, tls.clone(), router(app.clone()));
        let jwks_listener = tokio::net::TcpListener::bind((jwks, 0)).await.unwrap();
        let jwks_addr = jwks_listener.local_addr().unwrap();
        let jwks = std::fs::read_to_string(super::fixture("keys/issuer-jwks.json")).unwrap();
        let jwks_router = Router::new().route(
            "/jwks.json",
            get(move || {
                let jwks = jwks.clone();
                async move { ([(http::header::CONTENT_TYPE, "application/json")], jwks) }
            }),
        );
        Self {
            _dir: dir,
            ca_path,
            url: format!("https://{addr}"),
            jwks_uri: format!("https://{jwks_addr}/jwks.json"),
            addr,
            tls: tls.clone(),
            app,
            running: Some(running),
            _jwks: serve(jwks_listener, tls, jwks_router),
        }
    }

    /// Makes `policy` (with `approver_keys`) the content of the next snapshot, sent at once to
    /// every open stream and first to every new one; returns its version.
    pub fn push(
        &self,
        policy: Option<EffectivePolicy>,
        approver_keys: Option<serde_json::Value>,
    ) -> u64 {
        let version = {
            let mut current = self.app.shared.current.lock().unwrap();
            current.version += 1;
            current.policy = policy;
            current.approver_keys = approver_keys;
            current.version
        };
        self.app.pushed.send_replace(version);
        version
    }

    /// Streams opened with `bearer` are refused with 403 from now on.
    pub fn refuse(&self, bearer: &str) {
        self.app
            .shared
            .refused
            .lock()
            .unwrap()
            .insert(bearer.to_owned());
    }

    /// Ends every open stream (the server stays up).
    pub fn drop_streams(&self) {
        self.record(Event::Dropped);
        self.app.drops.send_modify(|n| *n += 1);
    }

    /// Closes the listener and every connection.
    pub async fn go_down(&mut self) {
        if let Some(mut running) = self.running.take() {
            self.record(Event::Dropped);
            running.abort_all();
            while running.join_next().await.is_some() {}
        }
    }

    /// Listens again on the same address.
    pub async fn come_back(&mut self) {
        assert!(self.running.is_none(), "already up");
        let listener = tokio::net::TcpListener::bind(self.addr)
            .await
            .expect("rebind the fake control plane's port");
        self.running = Some(serve(listener, self.tls.clone(), router(self.app.clone())));
    }

    fn record(&self, event: Event) {
        self.app.shared.events.lock().unwrap().push(event);
    }

    /// Everything seen so far, oldest first.
    pub fn events(&self) -> Vec<Event> {
        self.app.shared.events.lock().unwrap().clone()
    }

    /// The acks received so far.
    pub fn acks(&self) -> Vec<Ack> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Acked { ack, .. } => Some(ack),
                _ => None,
            })
            .collect()
    }

    /// The ack of snapshot `version`, waiting up to 15 s for it.
    pub async fn ack_of(&self, version: u64) -> Option<Ack> {
        super::eventually(Duration::from_secs(15), async || {
            self.acks().into_iter().find(|a| a.version == version)
        })
        .await
    }

    /// The bearers of accepted streams, in order.
    pub fn bearers(&self) -> Vec<String> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Connected { bearer, .. } => Some(bearer),
                _ => None,
            })
            .collect()
    }
}

fn router(app: Arc<App>) -> Router {
    Router::new()
        .route(STREAM_PATH, get(stream))
        .route(ACK_PATH, post(ack))
        .with_state(app)
}

fn bearer(headers: &HeaderMap) -> Option<String> {
    headers
        .get(http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::to_owned)
}

async fn stream(
    State(app): State<Arc<App>>,
    Query(pod): Query<StreamQuery>,
    version: http::Version,
    headers: HeaderMap,
) -> Response {
    let Some(bearer) = bearer(&headers) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    let shared = &app.shared;
    if shared.refused.lock().unwrap().contains(&bearer) {
        shared
            .events
            .lock()
            .unwrap()
            .push(Event::Refused { bearer });
        return (StatusCode::FORBIDDEN, "pod identity mismatch").into_response();
    }
    shared.events.lock().unwrap().push(Event::Connected {
        bearer,
        version,
        pod: pod.clone(),
    });
    let session = {
        let mut n = shared.sessions.lock().unwrap();
        *n += 1;
        format!("session-{n}")
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    let mut pushed = app.pushed.subscribe();
    let mut drops = app.drops.subscribe();
    let shared = app.shared.clone();
    tokio::spawn(async move {
        let mut sent = 0;
        let mut heartbeat = tokio::time::interval(Duration::from_millis(500));
        loop {
            let line = {
                let current = shared.current.lock().unwrap();
                (current.version > sent).then(|| {
                    sent = current.version;
                    snapshot_line(&current, &session, &pod)
                })
            };
            if let Some(line) = line
                && tx.send(line).await.is_err()
            {
                return;
            }
            tokio::select! {
                changed = pushed.changed() => if changed.is_err() { return },
                _ = drops.changed() => return,
                _ = heartbeat.tick() => {
                    let beat = serde_json::to_string(&StreamMessage::Heartbeat).unwrap() + "\n";
                    if tx.send(Bytes::from(beat)).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    (
        [(http::header::CONTENT_TYPE, STREAM_CONTENT_TYPE)],
        Body::from_stream(body),
    )
        .into_response()
}

fn snapshot_line(current: &Current, session: &str, pod: &StreamQuery) -> Bytes {
    let snapshot = Snapshot {
        session: session.to_owned(),
        version: current.version,
        pod: PodIdentity {
            namespace: pod.pod_namespace.clone(),
            name: pod.pod_name.clone(),
            uid: "uid-1".into(),
            service_account: "reports".into(),
        },
        policy: current.policy.clone(),
        approver_keys: current.approver_keys.clone(),
        issued_at: jiff::Timestamp::now(),
        revocation_traces: Default::default(),
    };
    let line = serde_json::to_string(&StreamMessage::Snapshot(Box::new(snapshot))).unwrap();
    Bytes::from(line + "\n")
}

async fn ack(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let Some(bearer) = bearer(&headers) else {
        return StatusCode::UNAUTHORIZED;
    };
    let Ok(ack) = serde_json::from_slice::<Ack>(&body) else {
        return StatusCode::BAD_REQUEST;
    };
    app.shared
        .events
        .lock()
        .unwrap()
        .push(Event::Acked { bearer, ack });
    StatusCode::NO_CONTENT
}
