//! The app's probes through the sidecar's admin port (what injection rewrites httpGet/tcpSocket
//! probes to): `GET /app-health/<container>/<kind>` runs the configured check against
//! 127.0.0.1 and answers 200 when the app is healthy by the kubelet's rules, 503 when not, 404
//! for a probe nobody configured; the configured headers reach the app. A probe the sidecar
//! cannot carry stops it at startup with a clear error.

use crate::support;

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, StatusCode, Uri};
use serde_json::json;
use support::process::run_to_completion;
use support::{Sidecar, SidecarOptions};

type Seen = Arc<Mutex<Vec<(String, HeaderMap)>>>;

/// The app container: answers `/healthz` 200, `/broken` 500, `/moved` 302 and records every
/// request (path and headers).
async fn start_app() -> (u16, Seen) {
    async fn answer(State(seen): State<Seen>, uri: Uri, headers: HeaderMap) -> Response {
        seen.lock().unwrap().push((uri.path().to_owned(), headers));
        match uri.path() {
            "/healthz" => "healthy".into_response(),
            "/broken" => (StatusCode::INTERNAL_SERVER_ERROR, "broken").into_response(),
            "/moved" => (StatusCode::FOUND, [("location", "/elsewhere")]).into_response(),
            _ => StatusCode::NOT_FOUND.into_response(),
        }
    }
    let seen = Seen::default();
    let router = Router::new().fallback(answer).with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, router).await });
    (port, seen)
}

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

async fn probe(sidecar: &Sidecar, key: &str) -> (u16, String) {
    let response = reqwest::get(format!("{}/app-health/{key}", sidecar.admin))
        .await
        .unwrap_or_else(|e| panic!("GET /app-health/{key}: {e}"));
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

#[tokio::test]
async fn app_probes_reach_the_app_on_loopback_and_answer_by_the_kubelets_rules() {
    let (port, seen) = start_app().await;
    let closed = closed_port();
    let probes = json!({
        "app/livez": {"httpGet": {"path": "/healthz", "port": port, "scheme": "HTTP",
            "httpHeaders": [{"name": "X-Probe-Token", "value": "secret-1"},
                            {"name": "Host", "value": "app.internal"}]}},
        "app/readyz": {"httpGet": {"path": "/broken", "port": port}},
        "app/startupz": {"tcpSocket": {"port": port}},
        "other/livez": {"tcpSocket": {"port": closed}},
        "other/readyz": {"httpGet": {"path": "/moved", "port": port}},
        "other/startupz": {"httpGet": {"path": "/healthz", "port": closed}},
    });
    let sidecar = Sidecar::start(
        &format!("http://127.0.0.1:{port}/mcp"),
        SidecarOptions {
            args: vec!["--app-probes".into(), probes.to_string()],
            ..Default::default()
        },
    )
    .await;

    let (status, body) = probe(&sidecar, "app/livez").await;
    assert_eq!((status, body.as_str()), (200, "ok: the app answered 200"));
    {
        let seen = seen.lock().unwrap();
        let (path, headers) = seen.last().expect("the app saw the probe");
        assert_eq!(path, "/healthz");
        assert_eq!(headers["x-probe-token"], "secret-1");
        assert_eq!(headers["host"], "app.internal");
    }

    let (status, body) = probe(&sidecar, "app/readyz").await;
    assert_eq!(status, 503);
    assert!(body.contains("500"), "{body}");

    assert_eq!(probe(&sidecar, "app/startupz").await.0, 200);
    let (status, body) = probe(&sidecar, "other/livez").await;
    assert_eq!(status, 503);
    assert!(body.contains("cannot connect"), "{body}");
    assert_eq!(probe(&sidecar, "other/startupz").await.0, 503);

    // A redirect counts as healthy and is not followed.
    let before = seen.lock().unwrap().len();
    assert_eq!(probe(&sidecar, "other/readyz").await.0, 200);
    let paths: Vec<String> = seen.lock().unwrap()[before..]
        .iter()
        .map(|(p, _)| p.clone())
        .collect();
    assert_eq!(paths, ["/moved"]);

    // Probes nobody configured: 404, and the app hears nothing of them.
    let before = seen.lock().unwrap().len();
    for key in ["app/healthz", "nobody/livez", "app/livez/extra"] {
        assert_eq!(probe(&sidecar, key).await.0, 404, "{key}");
    }
    assert_eq!(seen.lock().unwrap().len(), before);
}

/// `lifeguard sidecar` with `args` (besides a policy, upstream and ledger) and `env`, run to
/// completion: it must refuse to start.
fn refused(args: &[&str], env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_lifeguard"));
    command
        .arg("sidecar")
        .arg("--policy")
        .arg(dir.path().join("policy.yaml"))
        .args([
            "--upstream",
            "http://127.0.0.1:9/mcp",
            "--listen",
            "127.0.0.1:0",
        ])
        .arg("--ledger")
        .arg(dir.path().join("ledger.db"))
        .args(args)
        .env_remove("LIFEGUARD_APP_PROBES")
        .envs(env.iter().copied());
    let output = run_to_completion(command, "lifeguard sidecar", Duration::from_secs(30));
    assert!(!output.status.success(), "started: {output:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn probes_the_sidecar_cannot_carry_stop_it_at_startup() {
    let admin = ["--admin", "127.0.0.1:0"];
    let https = r#"{"app/livez": {"httpGet": {"port": 8080, "scheme": "HTTPS"}}}"#;
    let error = refused(&[&admin[..], &["--app-probes", https]].concat(), &[]);
    assert!(
        error.contains("--app-probes") && error.contains("app/livez") && error.contains("HTTPS"),
        "{error}"
    );

    let host = r#"{"app/readyz": {"tcpSocket": {"port": 8080, "host": "10.0.0.7"}}}"#;
    let error = refused(&admin, &[("LIFEGUARD_APP_PROBES", host)]);
    assert!(
        error.contains("app/readyz") && error.contains("tcpSocket.host"),
        "{error}"
    );

    let bad_key = r#"{"app": {"tcpSocket": {"port": 8080}}}"#;
    let error = refused(&[&admin[..], &["--app-probes", bad_key]].concat(), &[]);
    assert!(error.contains("<container>/"), "{error}");

    let fine = r#"{"app/livez": {"tcpSocket": {"port": 8080}}}"#;
    let error = refused(&["--app-probes", fine], &[]);
    assert!(error.contains("--app-probes needs --admin"), "{error}");
}
