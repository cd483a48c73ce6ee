//! Keys from a JWKS URL: fetched at load, refetched when a token names a new key (rotation),
//! and never refetched more than once per interval however many unknown key ids arrive.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::routing::get;
use jsonwebtoken::Algorithm;
use serde_json::{Value, json};
use support::{McpClient, Sidecar, SidecarOptions, User};

struct JwksServer {
    url: String,
    keys: Arc<std::sync::Mutex<Value>>,
    fetches: Arc<AtomicUsize>,
}

async fn jwks_server(initial: Value) -> JwksServer {
    let keys = Arc::new(std::sync::Mutex::new(initial));
    let fetches = Arc::new(AtomicUsize::new(0));
    let (k, f) = (keys.clone(), fetches.clone());
    let app = Router::new().route(
        "/jwks.json",
        get(move || {
            let (k, f) = (k.clone(), f.clone());
            async move {
                f.fetch_add(1, Ordering::SeqCst);
                axum::Json(k.lock().unwrap().clone())
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    JwksServer {
        url: format!("http://{addr}/jwks.json"),
        keys,
        fetches,
    }
}

fn fixture_jwks() -> Value {
    serde_json::from_slice(&std::fs::read(support::fixture("keys/issuer-jwks.json")).unwrap())
        .unwrap()
}

fn rsa_token(user: &User, kid: &str) -> String {
    let now = jiff::Timestamp::now().as_second();
    let claims = json!({"iss": support::ISSUER, "aud": support::RESOURCE, "sub": user.subject,
                        "tid": user.tenant, "client_id": user.client, "iat": now, "exp": now + 600});
    let key = std::fs::read(support::fixture("keys/issuer-rsa.pem")).unwrap();
    lifeguard::identity::mint::mint_token(&key, Algorithm::RS256, Some(kid), &claims).unwrap()
}

#[tokio::test]
async fn rotated_keys_are_picked_up_and_unknown_kids_cannot_force_refetches() {
    let all = fixture_jwks();
    let ed_only = json!({"keys": [all["keys"][0].clone()]});
    let jwks = jwks_server(ed_only).await;
    let upstream = support::ExampleServer::start();
    let sidecar = Sidecar::start(
        &upstream.url,
        SidecarOptions {
            jwks_uri: Some(jwks.url.clone()),
            ..Default::default()
        },
    )
    .await;
    let client = McpClient::new(&sidecar.url);
    let alice = User::new("alice", "t", "c");
    assert_eq!(
        jwks.fetches.load(Ordering::SeqCst),
        1,
        "fetched once at load"
    );

    let ok = client
        .request("tools/list", json!({}))
        .token(&alice.token())
        .send()
        .await;
    assert_eq!(ok.status, 200, "{ok:?}");

    // The issuer rotates in an RSA key; the first token signed with it triggers one refetch.
    *jwks.keys.lock().unwrap() = all.clone();
    let rotated = client
        .request("tools/list", json!({}))
        .token(&rsa_token(&alice, "test-rsa-1"))
        .send()
        .await;
    assert_eq!(rotated.status, 200, "{rotated:?}\n{}", sidecar.logs());
    assert_eq!(jwks.fetches.load(Ordering::SeqCst), 2);

    // A burst of tokens naming keys that do not exist: refused, and at most no further fetch
    // within the rate-limit interval (the last fetch was just now).
    for i in 0..20 {
        let r = client
            .request("tools/list", json!({}))
            .token(&rsa_token(&alice, &format!("made-up-{i}")))
            .send()
            .await;
        assert_eq!(r.status, 401);
    }
    assert_eq!(
        jwks.fetches.load(Ordering::SeqCst),
        2,
        "unknown kids forced refetches"
    );
}

#[tokio::test]
async fn an_unreachable_jwks_keeps_the_sidecar_unready_and_refusing() {
    let upstream = support::ExampleServer::start();
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let policy = dir.path().join("policy.yaml");
    let text = support::policy_yaml(std::path::Path::new("unused"), "")
        .replace("jwksFile: unused", "jwksUri: http://127.0.0.1:9/jwks.json");
    std::fs::write(&policy, text).unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_lifeguard"));
    command
        .arg("sidecar")
        .arg("--policy")
        .arg(&policy)
        .args([
            "--upstream",
            &upstream.url,
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
        ])
        .arg("--ledger")
        .arg(dir.path().join("ledger.db"))
        .arg("--audit-file")
        .arg(dir.path().join("audit.jsonl"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let lines = std::thread::spawn(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .take_while(|l| !l.contains("cannot load issuer keys"))
            .filter(|l| l.contains("listening on") || l.contains("admin on"))
            .collect::<Vec<_>>()
    });
    let seen = lines.join().unwrap();
    let admin = seen
        .iter()
        .find_map(|l| l.split("admin on ").nth(1))
        .unwrap()
        .trim()
        .to_owned();
    let url = seen
        .iter()
        .find_map(|l| l.split("listening on ").nth(1))
        .unwrap()
        .trim()
        .to_owned();
    let ready = reqwest::get(format!("{admin}/ready")).await.unwrap();
    assert_eq!(ready.status().as_u16(), 503);
    let refused = McpClient::new(&url)
        .request("tools/list", json!({}))
        .token(&User::new("a", "t", "c").token())
        .send()
        .await;
    assert_eq!(
        refused.status, 503,
        "fail closed without a policy: {refused:?}"
    );
    let _ = child.kill();
    let _ = child.wait();
}
