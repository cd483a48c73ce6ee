//! A whole cluster without a cluster: the API emulator, the real operator, and real sidecars
//! in cluster mode (each in front of its own example MCP server, each with a pod and a bound
//! token in the emulator).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::Value;

use super::kube::KubeEmulator;
use super::operator::{Operator, TestPod};
use super::process::{ClusterOptions, ExampleServer, Sidecar};
use super::{ISSUER, McpClient, RESOURCE, eventually, fixture};

pub const NS: &str = "team-a";
pub const APP: &str = "reports";

/// Serves the test issuer's JWKS over plain HTTP on loopback (allowed for loopback hosts).
pub struct JwksServer {
    pub url: String,
    task: tokio::task::JoinHandle<()>,
}

impl JwksServer {
    pub async fn start() -> Self {
        let jwks = std::fs::read_to_string(fixture("keys/issuer-jwks.json")).unwrap();
        let router = Router::new().route(
            "/jwks.json",
            get(move || {
                let jwks = jwks.clone();
                async move { ([(http::header::CONTENT_TYPE, "application/json")], jwks) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Self {
            url: format!("http://{addr}/jwks.json"),
            task,
        }
    }
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The McpServerPolicy the cluster tests apply, with `tasks` YAML under `spec.tasks`.
pub fn policy(jwks: &str, tools: &str) -> String {
    format!(
        r#"apiVersion: lifeguard.dev/v1alpha1
kind: McpServerPolicy
metadata: {{name: {APP}, namespace: {NS}}}
spec:
  selector: {{matchLabels: {{app: {APP}}}}}
  resource: {RESOURCE}
  identity:
    issuers:
      - issuer: {ISSUER}
        jwksUri: {jwks}
  tasks:
    tools: [{tools}]
    minPollInterval: 50ms
"#
    )
}

/// One pod: its example server, its sidecar and a client of the sidecar.
pub struct Member {
    pub pod: TestPod,
    /// Kept for the pod's lifetime: dropping it stops the server.
    pub _server: ExampleServer,
    pub sidecar: Sidecar,
    pub client: McpClient,
}

pub struct Cluster {
    pub emulator: KubeEmulator,
    pub operator: Operator,
    pub jwks: JwksServer,
    pub members: Vec<Member>,
    _tokens: tempfile::TempDir,
}

impl Cluster {
    /// The emulator, an operator with `config`, and `n` pods with real sidecars dialing it.
    pub async fn start(n: usize, config: Option<&str>) -> Self {
        Self::start_with_env(n, config, &[]).await
    }

    /// [`Cluster::start`] with `env` (e.g. the `OTEL_*` trace settings) for the operator and
    /// every sidecar.
    pub async fn start_with_env(n: usize, config: Option<&str>, env: &[(String, String)]) -> Self {
        let emulator = KubeEmulator::start().await;
        let operator = Operator::start_with_env(&emulator, config, &[], env).await;
        let jwks = JwksServer::start().await;
        let tokens = tempfile::tempdir().unwrap();
        let mut members = Vec::new();
        for i in 0..n {
            let name = format!("{APP}-{i}");
            let pod = TestPod::create(&emulator, NS, &name, &[("app", APP)], APP).await;
            let token_file = tokens.path().join(format!("{name}.token"));
            std::fs::write(&token_file, &pod.token).unwrap();
            let server = ExampleServer::start();
            let sidecar = Sidecar::start_cluster(
                &server.url,
                ClusterOptions {
                    control_plane: operator.url.clone(),
                    ca: Some(operator.ca.ca_path.clone()),
                    token_file,
                    pod_namespace: NS.into(),
                    pod_name: name,
                    args: Vec::new(),
                    env: env.to_vec(),
                },
            );
            let client = McpClient::new(&sidecar.url);
            members.push(Member {
                pod,
                _server: server,
                sidecar,
                client,
            });
        }
        Self {
            emulator,
            operator,
            jwks,
            members,
            _tokens: tokens,
        }
    }

    /// Waits until every sidecar is ready with a policy whose `/ready` text contains `marker`.
    pub async fn all_ready_with(&self, marker: &str) {
        for member in &self.members {
            let url = format!("{}/ready", member.sidecar.admin);
            let ready = eventually(Duration::from_secs(30), async || {
                let r = reqwest::get(&url).await.ok()?;
                let ok = r.status() == 200;
                let text = r.text().await.ok()?;
                (ok && text.contains(marker)).then_some(())
            })
            .await;
            assert!(
                ready.is_some(),
                "sidecar {} never ready with `{marker}`:\n{}\n--- operator ---\n{}",
                member.pod.name,
                member.sidecar.logs(),
                self.operator.logs()
            );
        }
    }

    /// GET an object from the emulator (`None` when absent).
    pub async fn get(&self, path: &str) -> Option<Value> {
        let r = reqwest::get(format!("{}{path}", self.emulator.url()))
            .await
            .ok()?;
        if r.status() != 200 {
            return None;
        }
        r.json().await.ok()
    }

    /// Waits until the object at `path` satisfies `check`; fails with the operator's logs.
    pub async fn wait_for(&self, path: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        let found = eventually(Duration::from_secs(30), async || {
            let o = self.get(path).await?;
            check(&o).then_some(o)
        })
        .await;
        found.unwrap_or_else(|| {
            panic!(
                "{what}: {path} is {:?}\n--- operator ---\n{}",
                futures_util::FutureExt::now_or_never(self.get(path)),
                self.operator.logs()
            )
        })
    }
}

/// Compact SETs signed with the test keys.
pub struct SetSigner {
    key: Arc<Vec<u8>>,
}

impl Default for SetSigner {
    fn default() -> Self {
        Self {
            key: Arc::new(std::fs::read(fixture("keys/issuer-b-ed25519.pem")).unwrap()),
        }
    }
}

impl SetSigner {
    /// Signs `claims` with the transmitter key (EdDSA, kid `test-b-ed-1` unless `kid` says
    /// otherwise) and the given `typ`.
    pub fn sign(&self, claims: &Value, kid: &str, typ: &str) -> String {
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(kid.to_owned());
        header.typ = Some(typ.to_owned());
        let key = EncodingKey::from_ed_pem(&self.key).unwrap();
        jsonwebtoken::encode(&header, claims, &key).unwrap()
    }
}
