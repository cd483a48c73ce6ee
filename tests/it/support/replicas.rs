//! Several replicas of one MCP server, as a Deployment runs them: one example server and one
//! sidecar per replica, every sidecar on one PostgreSQL ledger, each with its internal hop, and
//! a client per replica (a test picks them round-robin, as a Service would).

use std::path::PathBuf;

use super::postgres::TestDatabase;
use super::{ExampleServer, McpClient, Sidecar, SidecarOptions};

/// The ledger scope of the test policy (`tests/test-policy`).
pub const SCOPE: &str = "tests/test-policy";

pub struct Replicas {
    pub servers: Vec<ExampleServer>,
    pub sidecars: Vec<Sidecar>,
    pub clients: Vec<McpClient>,
    /// Dropped last: the sidecars hold connections to it.
    pub db: TestDatabase,
}

/// How to start the replicas.
#[derive(Clone, Default)]
pub struct ReplicaOptions {
    /// YAML under the policy's `spec:`.
    pub spec: String,
    pub extra_documents: String,
    pub approver_keys: Option<PathBuf>,
    /// `--heartbeat-ttl` (default 30s).
    pub heartbeat_ttl: Option<String>,
    pub args: Vec<String>,
    /// The sidecars' `--ledger` instead of the test database's own URL (e.g. through a
    /// [`super::postgres::DatabaseProxy`]).
    pub ledger_url: Option<String>,
}

impl Replicas {
    pub async fn start(count: usize, options: ReplicaOptions) -> Self {
        let db = TestDatabase::create().await;
        Self::start_on(db, count, options).await
    }

    pub async fn start_on(db: TestDatabase, count: usize, options: ReplicaOptions) -> Self {
        let mut servers = Vec::new();
        let mut sidecars = Vec::new();
        for i in 0..count {
            let server = ExampleServer::start();
            let sidecar = Sidecar::start(&server.url, sidecar_options(&db, i, &options)).await;
            servers.push(server);
            sidecars.push(sidecar);
        }
        let clients = sidecars.iter().map(|s| McpClient::new(&s.url)).collect();
        Self {
            servers,
            sidecars,
            clients,
            db,
        }
    }

    /// Kills replica `i`'s sidecar hard (`kill -9`) and starts it again with the same replica
    /// id and server, as a container restart does; returns once it is ready.
    pub async fn restart(&mut self, i: usize) {
        let sidecar = self.sidecars.remove(i);
        let sidecar = sidecar.restart_after_kill().await;
        self.clients[i] = McpClient::new(&sidecar.url);
        self.sidecars.insert(i, sidecar);
    }

    /// The client of replica `n % count`: `client(0)`, `client(1)`, … go round-robin.
    pub fn client(&self, n: usize) -> &McpClient {
        &self.clients[n % self.clients.len()]
    }

    /// A metric's value summed over the replicas (lines starting with `prefix`).
    pub async fn metric_sum(&self, prefix: &str) -> f64 {
        let mut sum = 0.0;
        for sidecar in &self.sidecars {
            let text = reqwest::get(format!("{}/metrics", sidecar.admin))
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            sum += text
                .lines()
                .filter(|l| l.starts_with(prefix))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>();
        }
        sum
    }
}

/// The options of replica `i`'s sidecar.
pub fn sidecar_options(db: &TestDatabase, i: usize, options: &ReplicaOptions) -> SidecarOptions {
    let mut args = vec![
        "--ledger-scope".to_owned(),
        SCOPE.to_owned(),
        "--replica-id".to_owned(),
        format!("replica-{i}"),
        "--internal-listen".to_owned(),
        "127.0.0.1:0".to_owned(),
    ];
    if let Some(ttl) = &options.heartbeat_ttl {
        args.extend(["--heartbeat-ttl".to_owned(), ttl.clone()]);
    }
    args.extend(options.args.iter().cloned());
    SidecarOptions {
        spec: options.spec.clone(),
        extra_documents: options.extra_documents.clone(),
        approver_keys: options.approver_keys.clone(),
        ledger: Some(options.ledger_url.clone().unwrap_or_else(|| db.url.clone())),
        args,
        ..Default::default()
    }
}
