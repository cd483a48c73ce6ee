//! Black-box test harness: the real `lifeguard` binary, the bundled example MCP server, tokens
//! signed with the test keys, and an MCP client that speaks 2026-07-28 over HTTP.

pub mod authorizer;
pub mod capability;
pub mod chart;
pub mod client;
pub mod cluster;
pub mod control_plane;
pub mod daemon;
pub mod dpop;
pub mod example_server;
pub mod kube;
pub mod kubectl_plugin;
pub mod listen;
pub mod listener;
pub mod netns;
pub mod operator;
pub mod otlp;
pub mod pg_server;
pub mod postgres;
pub mod process;
pub mod python;
pub mod replicas;
pub mod rogue;
pub mod ssf;
pub mod test_webhook;
pub mod tls;
pub mod webhook;

use std::path::{Path, PathBuf};

pub use client::McpClient;
pub use process::{ClusterOptions, ExampleServer, Sidecar, SidecarOptions};

use jsonwebtoken::Algorithm;
use serde_json::{Value, json};

pub const ISSUER: &str = "https://idp.test";
pub const RESOURCE: &str = "http://127.0.0.1/mcp";

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn fixture(path: &str) -> PathBuf {
    repo().join("tests/fixtures").join(path)
}

/// A principal for tests.
#[derive(Clone, Debug)]
pub struct User {
    pub subject: String,
    pub tenant: String,
    pub client: String,
    pub scopes: String,
}

impl User {
    pub fn new(subject: &str, tenant: &str, client: &str) -> Self {
        Self {
            subject: subject.into(),
            tenant: tenant.into(),
            client: client.into(),
            scopes: String::new(),
        }
    }

    pub fn with_scopes(mut self, scopes: &str) -> Self {
        self.scopes = scopes.into();
        self
    }

    /// A token valid for an hour, signed by the test issuer's Ed25519 key.
    pub fn token(&self) -> String {
        self.token_with(|_| {})
    }

    /// A token with claims adjusted by `edit`.
    pub fn token_with(&self, edit: impl FnOnce(&mut Value)) -> String {
        let now = jiff::Timestamp::now().as_second();
        let mut claims = json!({
            "iss": ISSUER, "aud": RESOURCE, "sub": self.subject, "tid": self.tenant,
            "client_id": self.client, "scope": self.scopes,
            "iat": now, "nbf": now - 5, "exp": now + 3600,
        });
        edit(&mut claims);
        let key = std::fs::read(fixture("keys/issuer-ed25519.pem")).unwrap();
        lifeguard::identity::mint::mint_token(&key, Algorithm::EdDSA, Some("test-ed-1"), &claims)
            .unwrap()
    }
}

/// Alice of tenant-a, calling through the console client: the tests' usual caller.
pub fn alice() -> User {
    User::new("alice", "tenant-a", "console")
}

/// Bob of the same tenant and client as [`alice`]: the usual second caller, who must not see
/// her tasks.
pub fn bob() -> User {
    User::new("bob", "tenant-a", "console")
}

/// The example server, a sidecar in front of it with `spec` appended under the test policy's
/// `spec:`, and a client of the sidecar.
pub async fn start_behind_sidecar(spec: &str) -> (ExampleServer, Sidecar, McpClient) {
    let server = ExampleServer::start();
    let sidecar = Sidecar::start(
        &server.url,
        SidecarOptions {
            spec: spec.to_owned(),
            ..Default::default()
        },
    )
    .await;
    let client = McpClient::new(&sidecar.url);
    (server, sidecar, client)
}

/// `tools/call` of `tool` that must become a task; returns the sidecar's task ID.
pub async fn create_task(client: &McpClient, token: &str, tool: &str, args: Value) -> String {
    let reply = client.call_tool(token, tool, args).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let result = reply.result();
    assert_eq!(result["resultType"], "task", "{reply:?}");
    result["taskId"].as_str().unwrap().to_owned()
}

/// A standalone policy for the tests, with `extra` appended under `spec:`.
pub fn policy_yaml(jwks: &Path, extra: &str) -> String {
    format!(
        r#"apiVersion: lifeguard.dev/v1alpha1
kind: McpServerPolicy
metadata: {{name: test-policy, namespace: tests}}
spec:
  selector: {{}}
  resource: {RESOURCE}
  identity:
    issuers:
      - issuer: {ISSUER}
        jwksFile: {}
{extra}"#,
        jwks.display()
    )
}

/// Reads the audit file's events.
pub fn audit_events(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Polls `check` every 50 ms until it returns `Some` or `timeout` passes. A wait for a state,
/// not a timing check: keep `timeout` generous.
pub async fn eventually<T>(
    timeout: std::time::Duration,
    check: impl AsyncFnMut() -> Option<T>,
) -> Option<T> {
    poll_until(timeout, std::time::Duration::from_millis(50), check).await
}

/// Polls `check` every `interval` until it returns `Some` or `timeout` passes.
pub async fn poll_until<T>(
    timeout: std::time::Duration,
    interval: std::time::Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> Option<T> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(interval).await;
    }
}
