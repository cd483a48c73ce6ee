//! The source against a plain-HTTP stand-in of the operator that sends one snapshot per stream
//! and then falls silent: the sidecar must drop the silent stream and dial again (with a short
//! silence timeout, so the test does not wait for the real one).

use std::convert::Infallible;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::{Body, Bytes};
use axum::routing::{get, post};
use futures_util::StreamExt;

use super::*;
use crate::distribution::{ACK_PATH, Ack, PodIdentity, STREAM_PATH};
use crate::sidecar::policy_source::PolicyPublisher;
use crate::telemetry::metrics::SidecarMetrics;

#[derive(Default)]
struct Seen {
    streams: AtomicUsize,
    acks: Mutex<Vec<Ack>>,
}

fn snapshot_line(n: usize) -> String {
    let snapshot = Snapshot {
        session: format!("session-{n}"),
        version: n as u64,
        pod: PodIdentity {
            namespace: "team-a".into(),
            name: "reports-0".into(),
            uid: "u".into(),
            service_account: "reports".into(),
        },
        policy: None,
        approver_keys: None,
        issued_at: Timestamp::now(),
        revocation_traces: Default::default(),
    };
    let line = serde_json::to_string(&StreamMessage::Snapshot(Box::new(snapshot)));
    line.expect("serializable") + "\n"
}

async fn stand_in(seen: Arc<Seen>) -> std::net::SocketAddr {
    let streams = seen.clone();
    let app = axum::Router::new()
        .route(
            STREAM_PATH,
            get(move || {
                let n = streams.streams.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    let first = futures_util::stream::once(async move {
                        Ok::<_, Infallible>(Bytes::from(snapshot_line(n)))
                    });
                    Body::from_stream(first.chain(futures_util::stream::pending()))
                }
            }),
        )
        .route(
            ACK_PATH,
            post(move |body: Bytes| async move {
                let ack: Ack = serde_json::from_slice(&body).expect("an ack");
                seen.acks.lock().expect("lock").push(ack);
                http::StatusCode::NO_CONTENT
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[tokio::test]
async fn a_silent_stream_is_dropped_and_dialled_again() {
    let seen = Arc::new(Seen::default());
    let addr = stand_in(seen.clone()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "t").expect("token");
    let config = ControlPlaneConfig {
        url: format!("http://{addr}").parse().expect("url"),
        token_file,
        pod_namespace: "team-a".into(),
        pod_name: "reports-0".into(),
        snapshot_path: dir.path().join("ledger.db.snapshot.json"),
        snapshot_key: crate::sidecar::snapshot_store::SnapshotKey::new([1; 32]),
        snapshot_generations: crate::sidecar::snapshot_store::SnapshotGenerations::new(
            Arc::new(
                crate::ledger::SqliteLedger::open(&dir.path().join("ledger.db")).expect("ledger"),
            ),
            "reports-0",
        ),
        silence_timeout: Duration::from_millis(300),
    };
    let shutdown = CancellationToken::new();
    let tls = crate::runtime::tls_client::client_config(&[]).expect("tls");
    let registry = Arc::new(KeyRegistry::new(shutdown.clone()));
    let metrics = ControlPlaneMetrics::default();
    let source = ControlPlaneSource::new(config, tls, registry, metrics.clone()).expect("source");
    let channels = PolicyPublisher::channel(Arc::new(SidecarMetrics::new()));
    let status = channels.status.clone();
    tokio::spawn(Box::new(source).run(channels.publisher, shutdown.clone()));

    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.acks.lock().expect("lock").len() < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    let acks = seen.acks.lock().expect("lock").clone();
    assert!(
        acks.len() >= 3,
        "dialled again after each silence: {acks:?}"
    );
    let sessions: Vec<&str> = acks.iter().take(3).map(|a| a.session.as_str()).collect();
    assert_eq!(sessions, vec!["session-1", "session-2", "session-3"]);
    assert!(acks.iter().all(|a| a.policy_hash.is_none()));
    assert!(metrics.reconnects.get() >= 2);
    let standby = status.borrow().standby.clone().unwrap_or_default();
    assert!(
        standby.contains("no McpServerPolicy selects this pod (team-a/reports-0)"),
        "{standby}"
    );
}
