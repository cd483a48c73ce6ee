//! The world the operator runs in: the Kubernetes API emulator and the CA (`harness.rs`), the
//! operator process itself, and the objects: pods with their ServiceAccount tokens, the `bench`
//! policy and the decoys.

use std::path::Path;

use anyhow::{Context, Result};
use futures_util::{StreamExt, TryStreamExt};
use serde_json::{Value, json};

pub use crate::harness::{Api, Ca, Component, Emulator, metric_sum};

/// Namespace of the pods and policies.
pub const NS: &str = "bench";
/// Namespace the operator runs in (its Lease, Secrets).
pub const OPERATOR_NAMESPACE: &str = "lifeguard-system";
/// The token issuer every policy trusts (the principals' issuer; revocations name it).
pub const ISSUER: &str = "https://idp.bench";
/// The issuer decoys trust with `--decoys-other-issuer`.
pub const OTHER_ISSUER: &str = "https://other-idp.bench";
/// The SET transmitter (its keys: tests/fixtures/keys/issuer-b-*).
pub const TRANSMITTER: &str = "https://ssf.idp.bench";
/// The operator's SSF audience.
pub const SSF_AUDIENCE: &str = "https://lifeguard.bench/ssf";
/// Label value of the pods the `bench` policy selects.
const APP: &str = "bench-sidecar";
/// The two values the spec-change measurement alternates between.
pub const POLL_INTERVALS: [&str; 2] = ["1s", "2s"];

pub const POLICIES: &str = "/apis/lifeguard.dev/v1alpha1/namespaces/bench/mcpserverpolicies";
pub const REVOCATIONS: &str = "/apis/lifeguard.dev/v1alpha1/principalrevocations";

/// The operator's `--config`: a push transmitter whose keys are inline.
fn operator_config(repo: &Path) -> Result<String> {
    let path = repo.join("tests/fixtures/keys/issuer-b-jwks.json");
    let jwks: Value = serde_json::from_slice(
        &std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?,
    )?;
    Ok(format!(
        "securityEvents:\n  audience: {SSF_AUDIENCE}\n  transmitters:\n    - issuer: {TRANSMITTER}\n      jwks: {jwks}\n      delivery: push\n"
    ))
}

/// The operator under test.
pub type Operator = Component;

/// Starts the operator with the benchmark's configuration and waits until it is ready.
///
/// Every light sidecar connects from 127.0.0.1 with two connections (its stream and its
/// acknowledgements), where pods in a cluster each have an address of their own: the
/// per-address connection cap (`--max-connections-per-peer`, 64 by default) is raised to what
/// `sidecars` need, or the operator would close all but the first 32 sidecars' connections.
pub async fn start_operator(
    binary: &Path,
    repo: &Path,
    dir: &Path,
    emulator: &Emulator,
    ca: &Ca,
    sidecars: usize,
) -> Result<Operator> {
    let config = dir.join("operator.yaml");
    std::fs::write(&config, operator_config(repo)?).context("writing operator.yaml")?;
    let per_peer = sidecars * 2 + 64;
    let extra = [
        "--max-connections-per-peer".to_owned(),
        per_peer.to_string(),
        "--max-connections".to_owned(),
        per_peer.max(8192).to_string(),
    ];
    Component::start(
        binary,
        "operator",
        OPERATOR_NAMESPACE,
        &config,
        &extra,
        dir,
        emulator,
        ca,
    )
    .await
}

impl Component {
    /// The operator's /metrics: every sample of `name` (any labels) summed.
    pub async fn metric(&self, name: &str) -> f64 {
        let Ok(response) = reqwest::get(format!("{}/metrics", self.admin)).await else {
            return 0.0;
        };
        let text = response.text().await.unwrap_or_default();
        metric_sum(&text, name)
    }
}

/// A pod and the token its sidecar presents.
#[derive(Clone, Debug)]
pub struct BenchPod {
    pub name: String,
    pub uid: String,
    pub token: String,
}

fn policy(name: &str, app: &str, issuer: &str, min_poll: &str) -> Value {
    json!({
        "apiVersion": "lifeguard.dev/v1alpha1", "kind": "McpServerPolicy",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "selector": {"matchLabels": {"app": app}},
            "resource": "http://127.0.0.1/mcp",
            "identity": {"issuers": [{"issuer": issuer, "jwksUri": "http://127.0.0.1:9/jwks"}]},
            "tasks": {"enabled": true, "tools": ["slow_compute"], "minPollInterval": min_poll},
        },
    })
}

/// Path of the `bench` policy.
pub fn bench_policy_path() -> String {
    format!("{POLICIES}/bench")
}

/// Creates `pods` pods with tokens the emulator's TokenReview accepts (audience `lifeguard`),
/// the `bench` policy selecting them, and `policies - 1` decoys selecting nothing that trust
/// `decoy_issuer`.
pub async fn populate(
    api: &Api,
    pods: usize,
    policies: usize,
    decoy_issuer: &str,
) -> Result<Vec<BenchPod>> {
    const PARALLEL: usize = 8;
    let created: Vec<BenchPod> = futures_util::stream::iter(0..pods)
        .map(|i| async move {
            let name = format!("bench-{i:05}");
            let pod = json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": NS, "labels": {"app": APP}},
                "spec": {
                    "serviceAccountName": "bench",
                    "containers": [{"name": "app", "image": "registry.invalid/app:1"}],
                },
            });
            let stored = api
                .post(&format!("/api/v1/namespaces/{NS}/pods"), &pod)
                .await?;
            let uid = stored["metadata"]["uid"]
                .as_str()
                .context("the emulator assigns a uid")?
                .to_owned();
            Ok::<_, anyhow::Error>(BenchPod {
                token: format!("bench-token-{name}-{uid}"),
                name,
                uid,
            })
        })
        .buffered(PARALLEL)
        .try_collect()
        .await?;
    // One request registers every token.
    let mut table = serde_json::Map::new();
    for pod in &created {
        table.insert(
            pod.token.clone(),
            json!({
                "username": format!("system:serviceaccount:{NS}:bench"),
                "uid": format!("sa-uid-{NS}-bench"),
                "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{NS}"), "system:authenticated"],
                "extra": {
                    "authentication.kubernetes.io/pod-name": [pod.name],
                    "authentication.kubernetes.io/pod-uid": [pod.uid],
                },
                "audiences": ["lifeguard"],
            }),
        );
    }
    api.post("/__emulator/tokens", &Value::Object(table))
        .await
        .context("registering the pods' tokens")?;
    api.post(POLICIES, &policy("bench", APP, ISSUER, POLL_INTERVALS[0]))
        .await?;
    futures_util::stream::iter(1..policies)
        .map(|i| async move {
            let name = format!("decoy-{i:05}");
            api.post(
                POLICIES,
                &policy(&name, &format!("decoy-{i:05}"), decoy_issuer, "1s"),
            )
            .await
        })
        .buffered(PARALLEL)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(created)
}
