//! The container the webhook injects is a sidecar that starts: its exact command line and
//! environment (from the golden file of `/inject`), with the pod's paths and ports mapped onto
//! this machine, run the real `lifeguard sidecar` in cluster mode. It serves its admin port,
//! reports not-ready until a policy arrives (no operator here), and answers the rewritten probes
//! by running the original checks against the app on loopback.

use crate::support;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use support::operator::{TestCa, free_port};
use support::process::{spawn_collecting, wait_for_line};

fn injected_sidecar() -> Value {
    let path = support::fixture("injection/golden/injected-native.yaml");
    let golden: Value = serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    golden["pod"]["spec"]["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "lifeguard-sidecar")
        .cloned()
        .expect("the golden injected pod has the sidecar")
}

#[tokio::test]
async fn the_injected_container_runs_as_a_cluster_mode_sidecar() {
    let sidecar = injected_sidecar();
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path());
    let token = dir.path().join("token");
    std::fs::write(&token, "projected-token").unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();

    // The app the sidecar fronts: an HTTP server on the "upstream" port that answers 404 to
    // everything, so the TCP readiness check passes and the /healthz liveness check fails.
    let app = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let app_port = app.local_addr().unwrap().port();
    tokio::spawn(async move {
        axum::serve(
            app,
            axum::Router::new().fallback(|| async { http::StatusCode::NOT_FOUND }),
        )
        .await
    });
    let listen = free_port();
    let admin = free_port();

    // The pod's paths and ports, mapped onto this machine.
    let map = |s: &str| -> String {
        s.replace("/var/run/lifeguard/ca/ca.crt", ca.ca_path.to_str().unwrap())
            .replace("/var/run/secrets/lifeguard/token", token.to_str().unwrap())
            .replace("/var/lib/lifeguard", data.to_str().unwrap())
            .replace("0.0.0.0:8080", &listen.to_string())
            .replace("0.0.0.0:15020", &admin.to_string())
            .replace("15080", &app_port.to_string())
            .replace(
                "lifeguard-operator.lifeguard.svc:8443",
                &free_port().to_string(),
            )
    };
    let args: Vec<String> = sidecar["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| map(a.as_str().unwrap()))
        .collect();
    let mut env = BTreeMap::new();
    for var in sidecar["env"].as_array().unwrap() {
        let name = var["name"].as_str().unwrap().to_owned();
        let value = match name.as_str() {
            "POD_NAMESPACE" => "team-a".to_owned(),
            "POD_NAME" => "reports-0".to_owned(),
            _ => map(var["value"].as_str().unwrap()),
        };
        env.insert(name, value);
    }

    let mut command = Command::new(env!("CARGO_BIN_EXE_lifeguard"));
    command.args(&args).envs(&env);
    let (mut child, output, rx) = spawn_collecting(command);
    let admin_url = wait_for_line(&rx, "admin on ", "injected sidecar", &output);

    let get = |path: &'static str| {
        let url = format!("{admin_url}{path}");
        async move {
            let r = reqwest::get(&url).await.unwrap();
            r.status().as_u16()
        }
    };
    assert_eq!(get("/live").await, 200);
    assert_eq!(
        get("/ready").await,
        503,
        "no policy yet: not ready (the native sidecar's startup probe holds the app)"
    );
    assert_eq!(
        get("/app-health/reports/readyz").await,
        200,
        "TCP check of the app"
    );
    assert_eq!(
        get("/app-health/reports/livez").await,
        503,
        "/healthz answers 404"
    );
    assert_eq!(
        get("/app-health/reports/startupz").await,
        404,
        "no such probe"
    );
    // Still running: it keeps dialling the (absent) control plane.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "{}",
        output.lock().unwrap().join("\n")
    );
    let _ = child.kill();
    let _ = child.wait();
}
