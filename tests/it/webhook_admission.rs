//! `lifeguard webhook` over real TLS with real AdmissionReview JSON: injection, skip reasons,
//! required policies, validation, metrics, readiness and certificate rotation (kubelet-style
//! `..data` symlink swap). The cluster view comes from the API emulator.

use crate::support;

// Pods that only look injected (issue 28, items 2, 3 and 11).
mod forged_pods;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use support::kube::KubeEmulator;
use support::operator::TestCa;
use support::webhook::{
    EXCEPTION, POLICY, Webhook, admission_review, apply_patch, config_yaml, patch_of, pod_review,
};

const CLUSTER: &str = "
apiVersion: v1
kind: Namespace
metadata: {name: team-a, labels: {lifeguard.dev/inject: enabled}}
---
apiVersion: v1
kind: Namespace
metadata: {name: team-b}
---
apiVersion: lifeguard.dev/v1alpha1
kind: McpServerPolicy
metadata: {name: reports, namespace: team-a}
spec:
  selector: {matchLabels: {app: reports}}
  resource: https://reports.team-a.example.com/mcp
  identity: {issuers: [{issuer: https://idp.example.com, jwksUri: https://idp.example.com/jwks}]}
---
apiVersion: lifeguard.dev/v1alpha1
kind: McpServerPolicy
metadata: {name: billing, namespace: team-a}
spec:
  selector: {matchLabels: {app: billing}}
  resource: https://billing.team-a.example.com/mcp
  identity: {issuers: [{issuer: https://idp.example.com, jwksUri: https://idp.example.com/jwks}]}
  injection: {required: true}
";

async fn cluster() -> KubeEmulator {
    let emulator = KubeEmulator::start().await;
    emulator.apply_yaml(CLUSTER).await;
    emulator
}

fn mcp_pod(labels: Value, annotations: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "reports-", "labels": labels, "annotations": annotations},
        "spec": {"containers": [{
            "name": "server", "image": "registry.example.com/reports:1",
            "ports": [{"name": "mcp", "containerPort": 8080, "protocol": "TCP"}],
            "readinessProbe": {"httpGet": {"path": "/healthz", "port": "mcp"}},
        }]},
    })
}

#[tokio::test]
async fn a_pod_in_an_opted_in_namespace_gets_the_sidecar_over_tls() {
    let emulator = cluster().await;
    let webhook = Webhook::start(&emulator, &config_yaml("")).await;
    let pod = mcp_pod(json!({"app": "reports"}), json!({}));
    let response = webhook
        .review("/inject", &pod_review("u-1", "team-a", &pod))
        .await;
    assert_eq!(response["allowed"], true, "{response}");
    assert!(response.get("warnings").is_none(), "{response}");
    let injected = apply_patch(&pod, &patch_of(&response));

    let sidecar = &injected["spec"]["initContainers"][0];
    assert_eq!(sidecar["name"], "lifeguard-sidecar");
    assert_eq!(sidecar["restartPolicy"], "Always");
    assert_eq!(sidecar["image"], "ghcr.io/lifeguard-dev/lifeguard:test");
    assert_eq!(
        sidecar["ports"][0],
        json!({"name": "mcp", "containerPort": 8080, "protocol": "TCP"})
    );
    let args: Vec<&str> = sidecar["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    for pair in [
        [
            "--control-plane",
            "https://lifeguard-operator.lifeguard-system.svc:8443",
        ],
        ["--control-plane-ca", "/var/run/lifeguard/ca/ca.crt"],
        ["--listen", "0.0.0.0:8080"],
        ["--upstream", "http://127.0.0.1:15080/mcp"],
    ] {
        assert!(args.windows(2).any(|w| w == pair), "{pair:?} in {args:?}");
    }
    let server = &injected["spec"]["containers"][0];
    assert!(
        server.get("ports").is_none(),
        "the MCP port moved to the sidecar: {server}"
    );
    assert!(
        server["env"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "LIFEGUARD_UPSTREAM_PORT", "value": "15080"})),
        "{server}"
    );
    assert_eq!(
        server["readinessProbe"]["httpGet"],
        json!({"path": "/app-health/server/readyz", "port": 15020, "scheme": "HTTP"})
    );
    let token = injected["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "lifeguard-token")
        .unwrap();
    assert_eq!(
        token["projected"]["sources"][0]["serviceAccountToken"],
        json!({"audience": "lifeguard", "expirationSeconds": 600, "path": "token"})
    );
    let status: Value = serde_json::from_str(
        injected["metadata"]["annotations"]["lifeguard.dev/status"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(status["policy"], "reports");
    assert_eq!(status["version"], env!("CARGO_PKG_VERSION"));

    // A second pass over the injected pod is a no-op.
    let again = webhook
        .review("/inject", &pod_review("u-2", "team-a", &injected))
        .await;
    assert_eq!(patch_of(&again), json!([]));
    assert!(again.get("warnings").is_none());
    assert_eq!(
        webhook
            .metric("lifeguard_webhook_injections_total{outcome=\"injected\",reason=\"\"}")
            .await,
        Some(1.0)
    );
    assert_eq!(
        webhook
            .metric(
                "lifeguard_webhook_injections_total{outcome=\"skipped\",reason=\"AlreadyInjected\"}"
            )
            .await,
        Some(1.0)
    );
}

#[tokio::test]
async fn skipped_pods_are_annotated_and_warned_and_required_policies_deny() {
    let emulator = cluster().await;
    let webhook = Webhook::start(&emulator, &config_yaml("")).await;
    for (namespace, labels, annotations, reason) in [
        ("team-b", json!({"app": "reports"}), json!({}), "NotOptedIn"),
        ("team-a", json!({"app": "other"}), json!({}), "NoPolicy"),
        (
            "team-a",
            json!({"app": "reports"}),
            json!({"lifeguard.dev/inject": "disabled"}),
            "OptedOut",
        ),
    ] {
        let pod = mcp_pod(labels, annotations);
        let response = webhook
            .review("/inject", &pod_review("u", namespace, &pod))
            .await;
        assert_eq!(response["allowed"], true, "{reason}: {response}");
        let patched = apply_patch(&pod, &patch_of(&response));
        assert_eq!(
            patched["metadata"]["annotations"]["lifeguard.dev/injection-skipped"],
            reason
        );
        let warnings = response["warnings"].as_array().unwrap();
        assert!(
            warnings[0].as_str().unwrap().contains(reason),
            "{warnings:?}"
        );
    }
    // Nothing in the webhook's own namespace is touched, whatever it looks like.
    let pod = mcp_pod(json!({"app": "reports"}), json!({}));
    let response = webhook
        .review("/inject", &pod_review("u", "lifeguard-system", &pod))
        .await;
    assert_eq!(patch_of(&response), json!([]));
    assert!(response.get("warnings").is_none());

    let billing = mcp_pod(
        json!({"app": "billing"}),
        json!({"lifeguard.dev/inject": "disabled"}),
    );
    let response = webhook
        .review("/inject", &pod_review("u", "team-a", &billing))
        .await;
    assert_eq!(response["allowed"], false, "{response}");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("OptedOut") && message.contains("billing"),
        "{message}"
    );
    assert_eq!(
        webhook
            .metric("lifeguard_webhook_injections_total{outcome=\"denied\",reason=\"OptedOut\"}")
            .await,
        Some(1.0)
    );
}

#[tokio::test]
async fn validation_denies_an_overlapping_policy_and_an_unsigned_exception() {
    let emulator = cluster().await;
    let webhook = Webhook::start(&emulator, &config_yaml("")).await;
    let overlapping = json!({
        "apiVersion": "lifeguard.dev/v1alpha1", "kind": "McpServerPolicy",
        "metadata": {"name": "reports-v2", "namespace": "team-a"},
        "spec": {
            "selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["reports", "search"]}]},
            "resource": "https://reports2.team-a.example.com/mcp",
            "identity": {"issuers": [{"issuer": "https://idp.example.com", "jwksUri": "https://idp.example.com/jwks"}]},
        },
    });
    let review = admission_review("v-1", &POLICY, Some("team-a"), "CREATE", &overlapping, None);
    let response = webhook.review("/validate", &review).await;
    assert_eq!(response["allowed"], false, "{response}");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("reports"),
        "names the other policy: {message}"
    );

    let mut disjoint = overlapping.clone();
    disjoint["spec"]["selector"] = json!({"matchLabels": {"app": "search"}});
    let review = admission_review("v-2", &POLICY, Some("team-a"), "CREATE", &disjoint, None);
    assert_eq!(webhook.review("/validate", &review).await["allowed"], true);

    let exception = json!({
        "apiVersion": "lifeguard.dev/v1alpha1", "kind": "CapabilityException",
        "metadata": {"name": "summaries", "namespace": "team-a"},
        "spec": {
            "policyRef": {"name": "reports"}, "capability": "sampling", "clients": ["c"],
            "purpose": "summaries", "limits": {"maxTokens": 1, "maxIterationsPerTask": 1, "maxRequestsPerMinute": 1},
            "notBefore": "2026-12-01T00:00:00Z", "expiresAt": "2026-12-15T00:00:00Z",
            "approvalId": "CHG-1", "signature": "e30..c2ln",
        },
    });
    let review = admission_review(
        "v-3",
        &EXCEPTION,
        Some("team-a"),
        "CREATE",
        &exception,
        None,
    );
    let response = webhook.review("/validate", &review).await;
    assert_eq!(response["allowed"], false, "{response}");
}

#[tokio::test]
async fn bad_requests_get_a_clear_refusal() {
    let emulator = cluster().await;
    let webhook = Webhook::start(&emulator, &config_yaml("")).await;
    let client = webhook.ca.client();
    let response = client
        .post(format!("{}/inject", webhook.url))
        .body("{not json")
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["response"]["allowed"], false);
    assert!(
        body["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("AdmissionReview")
    );
    let plain = reqwest::Client::new()
        .post(format!(
            "{}/inject",
            webhook.url.replace("https://", "http://")
        ))
        .send()
        .await;
    assert!(
        plain.is_err() || plain.unwrap().status() != 200,
        "plain HTTP is not served"
    );
}

#[test]
fn config_errors_name_the_key_and_stop_the_webhook() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path());
    for (text, needle) in [
        (config_yaml("surprise: 1\n"), "surprise"),
        (config_yaml("").replace("image: ", "imag: "), "imag"),
        (
            config_yaml("").replace("https://", "http://"),
            "controlPlane.url",
        ),
    ] {
        let path = dir.path().join("webhook.yaml");
        std::fs::write(&path, text).unwrap();
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_lifeguard"))
            .args([
                "webhook",
                "--kubeconfig",
                "/nonexistent",
                "--admin",
                "127.0.0.1:0",
                "--listen",
                "127.0.0.1:0",
            ])
            .arg("--tls-cert")
            .arg(&ca.cert_path)
            .arg("--tls-key")
            .arg(&ca.key_path)
            .arg("--config")
            .arg(&path)
            .output()
            .unwrap();
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(needle), "{needle}: {stderr}");
    }
}

/// The kubelet's layout of a projected Secret: `<dir>/..<timestamp>/` holds the files,
/// `..data` points at it and the visible names point through `..data`.
fn kubelet_dir(dir: &Path, generation: &str, cert: &Path, key: &Path) {
    let data = dir.join(format!("..{generation}"));
    std::fs::create_dir_all(&data).unwrap();
    std::fs::copy(cert, data.join("tls.crt")).unwrap();
    std::fs::copy(key, data.join("tls.key")).unwrap();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(format!("..{generation}"), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    for name in ["tls.crt", "tls.key"] {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{name}"), &link).unwrap();
        }
    }
}

async fn handshake_ok(ca: &TestCa, url: &str) -> bool {
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.ca_pem.as_bytes()).unwrap())
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    client
        .post(format!("{url}/inject"))
        .body("{}")
        .send()
        .await
        .is_ok()
}

#[tokio::test]
async fn rotated_certificates_reach_new_connections_and_a_bad_pair_keeps_the_old_one() {
    let emulator = cluster().await;
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let first = Arc::new(TestCa::new(&dir.path().join("first").tap_create()));
    let second = TestCa::new(&dir.path().join("second").tap_create());
    let certs = dir.path().join("certs").tap_create();
    kubelet_dir(&certs, "2026_12_01_a", &first.cert_path, &first.key_path);
    let webhook = Webhook::start_with_certificate(
        &emulator,
        &config_yaml(""),
        dir.clone(),
        first.clone(),
        &certs.join("tls.crt"),
        &certs.join("tls.key"),
    )
    .await;
    assert!(handshake_ok(&first, &webhook.url).await);
    assert!(!handshake_ok(&second, &webhook.url).await);

    kubelet_dir(&certs, "2026_12_01_b", &second.cert_path, &second.key_path);
    let rotated = support::eventually(Duration::from_secs(30), async || {
        handshake_ok(&second, &webhook.url).await.then_some(())
    })
    .await;
    assert!(
        rotated.is_some(),
        "the rotated certificate was never served:\n{}",
        webhook.logs()
    );
    assert!(
        !handshake_ok(&first, &webhook.url).await,
        "new connections get the new certificate"
    );

    // A certificate with another pair's key: refused, the previous pair stays.
    kubelet_dir(&certs, "2026_12_01_c", &first.cert_path, &second.key_path);
    // Certificates are re-checked when a connection arrives.
    let refused = support::eventually(Duration::from_secs(30), async || {
        handshake_ok(&second, &webhook.url).await;
        webhook
            .logs()
            .contains("keeping the previous one")
            .then_some(())
    })
    .await;
    assert!(refused.is_some(), "{}", webhook.logs());
    assert!(handshake_ok(&second, &webhook.url).await);
}

#[tokio::test]
async fn a_sampling_exception_without_a_model_route_is_refused_at_admission() {
    let emulator = cluster().await;
    let webhook = Webhook::start(&emulator, &config_yaml("")).await;
    let routeless = json!({
        "apiVersion": "lifeguard.dev/v1alpha1", "kind": "CapabilityException",
        "metadata": {"name": "routeless", "namespace": "team-a"},
        "spec": {
            "policyRef": {"name": "reports"}, "capability": "sampling", "clients": ["c"],
            "purpose": "summaries", "limits": {"maxTokens": 1, "maxIterationsPerTask": 1, "maxRequestsPerMinute": 1},
            "notBefore": "2026-12-01T00:00:00Z", "expiresAt": "2026-12-15T00:00:00Z",
            "approvalId": "CHG-1", "signature": "e30..c2ln",
        },
    });
    let review = admission_review(
        "m-1",
        &EXCEPTION,
        Some("team-a"),
        "CREATE",
        &routeless,
        None,
    );
    let response = webhook.review("/validate", &review).await;
    assert_eq!(response["allowed"], false, "{response}");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("spec.modelRoute: modelRoute is required for a sampling exception"),
        "{message}"
    );
    // An object stored before the rule, updated without touching its spec (a label): the
    // refusal is a warning, so the object can still be labelled or deleted.
    let mut labelled = routeless.clone();
    labelled["metadata"]["labels"] = json!({"team": "a"});
    let review = admission_review(
        "m-2",
        &EXCEPTION,
        Some("team-a"),
        "UPDATE",
        &labelled,
        Some(&routeless),
    );
    let response = webhook.review("/validate", &review).await;
    assert_eq!(response["allowed"], true, "{response}");
    let warnings = response["warnings"].to_string();
    assert!(warnings.contains("modelRoute is required"), "{warnings}");
}

trait TapCreate {
    fn tap_create(self) -> Self;
}

impl TapCreate for std::path::PathBuf {
    fn tap_create(self) -> Self {
        std::fs::create_dir_all(&self).unwrap();
        self
    }
}

// The listener's limits (docs/operations.md, "Listener limits"), with timeouts short enough to
// watch them act. Outcomes are asserted, not durations: "the server closes the connection"
// within a generous bound.

fn sample(name: &str, labels: &str) -> String {
    format!("lifeguard_webhook_{name}{{{labels}}}")
}

#[tokio::test]
async fn the_listener_closes_silent_and_trickling_connections() {
    use support::listener::{address, closed_by_server, tls, trickle_head};
    let emulator = cluster().await;
    let limits = ["--handshake-timeout", "1s", "--header-read-timeout", "1s"];
    let webhook = Webhook::start_with_args(&emulator, &config_yaml(""), &limits).await;
    let addr = address(&webhook.url);

    // A TCP connection that never sends a ClientHello.
    let mut no_hello = tokio::net::TcpStream::connect(addr).await.unwrap();
    assert!(
        closed_by_server(&mut no_hello).await,
        "a connection without a ClientHello stays open"
    );
    // A TLS session that never sends a request.
    let mut silent = tls(&webhook.ca.ca_pem, addr).await.expect("handshake");
    assert!(
        closed_by_server(&mut silent).await,
        "a silent TLS session stays open"
    );
    // A request head sent a byte at a time, never finishing.
    let mut slow = tls(&webhook.ca.ca_pem, addr).await.expect("handshake");
    assert!(
        trickle_head(&mut slow, Duration::from_millis(100), 100_000).await,
        "a trickled request head is never cut off"
    );

    let handshake = sample("connections_timed_out_total", r#"reason="handshake""#);
    assert_eq!(webhook.metric(&handshake).await, Some(1.0));
    let header = sample("connections_timed_out_total", r#"reason="header_read""#);
    assert_eq!(webhook.metric(&header).await, Some(2.0));
    // Well-behaved clients are still served.
    let review = pod_review("u-limits", "team-b", &mcp_pod(json!({}), json!({})));
    assert_eq!(webhook.review("/inject", &review).await["allowed"], true);
}

#[tokio::test]
async fn connections_beyond_the_per_peer_cap_are_refused() {
    use support::listener::{address, still_open, tls};
    let emulator = cluster().await;
    let limits = ["--max-connections-per-peer", "3"];
    let webhook = Webhook::start_with_args(&emulator, &config_yaml(""), &limits).await;
    let addr = address(&webhook.url);
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(tls(&webhook.ca.ca_pem, addr).await.expect("within the cap"));
    }
    // The fourth is closed at accept: its handshake cannot complete.
    assert!(
        tls(&webhook.ca.ca_pem, addr).await.is_none(),
        "a connection beyond the per-peer cap was served"
    );
    let refused = sample(
        "connections_refused_total",
        r#"reason="max_connections_per_peer""#,
    );
    assert_eq!(webhook.metric(&refused).await, Some(1.0));
    assert_eq!(
        webhook.metric("lifeguard_webhook_connections_open").await,
        Some(3.0)
    );
    for session in &mut held {
        assert!(still_open(session, Duration::from_millis(200)).await);
    }
    // Slots are given back when connections close.
    drop(held);
    let review = pod_review("u-cap", "team-b", &mcp_pod(json!({}), json!({})));
    let served = support::eventually(Duration::from_secs(20), async || {
        let response = webhook
            .ca
            .client()
            .post(format!("{}/inject", webhook.url))
            .json(&review)
            .send()
            .await
            .ok()?;
        (response.status() == 200).then_some(())
    })
    .await;
    assert!(served.is_some(), "{}", webhook.logs());
}

#[tokio::test]
async fn review_bodies_are_bounded_before_they_are_read() {
    use support::listener::{address, post_head_only, response_head, status, tls};
    let emulator = cluster().await;
    let limits = [
        "--max-review-bytes",
        "65536",
        "--review-buffer-bytes",
        "65536",
        "--body-read-timeout",
        "5s",
    ];
    let webhook = Webhook::start_with_args(&emulator, &config_yaml(""), &limits).await;
    let addr = address(&webhook.url);
    let json = [("Content-Type", "application/json")];

    // A body announced larger than the bound is refused before a byte of it is sent.
    let mut large = tls(&webhook.ca.ca_pem, addr).await.unwrap();
    post_head_only(&mut large, "/inject", &json, 100 * 1024 * 1024).await;
    let head = response_head(&mut large)
        .await
        .expect("no answer before the body");
    assert_eq!(status(&head), 413, "{head}");

    // A body that fits but never comes holds the whole review buffer...
    let mut held = tls(&webhook.ca.ca_pem, addr).await.unwrap();
    post_head_only(&mut held, "/validate", &json, 65536).await;
    let reserved = "lifeguard_webhook_review_buffer_reserved_bytes";
    let full = support::eventually(Duration::from_secs(20), async || {
        (webhook.metric(reserved).await? == 65536.0).then_some(())
    })
    .await;
    assert!(full.is_some(), "the held body never reserved the buffer");
    // ...so two more reviews of that size wait for room. When the held body is cut off at the
    // body read timeout, one of them gets the room (and is cut off in turn, its body never
    // coming either), the other is told to retry once it waited its own timeout.
    let mut waiting = Vec::new();
    for _ in 0..2 {
        let mut stream = tls(&webhook.ca.ca_pem, addr).await.unwrap();
        post_head_only(&mut stream, "/inject", &json, 65536).await;
        waiting.push(stream);
    }
    let head = response_head(&mut held).await.expect("no answer");
    assert_eq!(status(&head), 408, "{head}");
    let mut statuses = Vec::new();
    for stream in &mut waiting {
        statuses.push(status(&response_head(stream).await.expect("no answer")));
    }
    statuses.sort_unstable();
    assert_eq!(statuses, [408, 503]);
    assert_eq!(webhook.metric(reserved).await, Some(0.0));

    for (endpoint, reason) in [
        ("inject", "too_large"),
        ("inject", "busy"),
        ("inject", "timed_out"),
        ("validate", "timed_out"),
    ] {
        let labels = format!(r#"endpoint="{endpoint}",reason="{reason}""#);
        assert_eq!(
            webhook
                .metric(&sample("bodies_refused_total", &labels))
                .await,
            Some(1.0),
            "{endpoint} {reason}"
        );
    }
    let review = pod_review("u-body", "team-b", &mcp_pod(json!({}), json!({})));
    assert_eq!(webhook.review("/inject", &review).await["allowed"], true);
}
