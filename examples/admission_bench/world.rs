//! The world the webhook admits into: the API emulator holding the opted-in namespace, the
//! policies and the approver-keys Secret; the signed exception the load submits; and the
//! release `lifeguard webhook` process serving a certificate of the bench CA.

use std::path::Path;

use anyhow::{Context, Result};
use base64::Engine;
use futures_util::{StreamExt, TryStreamExt};
use serde_json::{Value, json};

use crate::harness::{Api, Ca, Component, Emulator, metric_sum};
use crate::reviews::{self, BENCH_POLICY, NS};

/// Namespace the webhook runs in (its approver-keys Secret lives there).
pub const WEBHOOK_NAMESPACE: &str = "lifeguard-system";
/// The approver-keys Secret and its key (`approverKeys` in the webhook's `--config`).
const APPROVERS_SECRET: &str = "lifeguard-approvers";
const APPROVERS_KEY: &str = "approvers.jwks.json";
/// The approver's test key (tests/fixtures/keys) and its kid in the JWKS next to it.
const APPROVER_KEY: &str = "tests/fixtures/keys/issuer-b-ed25519.pem";
const APPROVER_JWKS: &str = "tests/fixtures/keys/issuer-b-jwks.json";
const APPROVER_KID: &str = "test-b-ed-1";

const POLICIES: &str = "/apis/lifeguard.dev/v1alpha1/namespaces/bench/mcpserverpolicies";

/// Creates the namespaces, the approver-keys Secret, the bench policy (`reports`, selecting
/// the injected pods) and `policies - 1` decoys selecting other applications.
pub async fn populate(api: &Api, repo: &Path, policies: usize) -> Result<()> {
    const PARALLEL: usize = 8;
    api.post(
        "/api/v1/namespaces",
        &json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": NS, "labels": {"lifeguard.dev/inject": "enabled"}}}),
    )
    .await?;
    api.post(
        "/api/v1/namespaces",
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": WEBHOOK_NAMESPACE}}),
    )
    .await?;
    let jwks = approver_jwks(repo)?;
    api.post(
        &format!("/api/v1/namespaces/{WEBHOOK_NAMESPACE}/secrets"),
        &json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": APPROVERS_SECRET, "namespace": WEBHOOK_NAMESPACE},
            "data": {APPROVERS_KEY: base64::engine::general_purpose::STANDARD.encode(jwks)}}),
    )
    .await
    .context("creating the approver-keys Secret")?;
    futures_util::stream::iter(policy_objects(policies))
        .map(|policy| async move { api.post(POLICIES, &policy).await })
        .buffered(PARALLEL)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// The bench policy (`reports`, selecting the injected pods) and `policies - 1` decoys
/// selecting other applications.
pub fn policy_objects(policies: usize) -> Vec<Value> {
    std::iter::once(reviews::policy(BENCH_POLICY, reviews::bench_selector()))
        .chain(
            (1..policies)
                .map(|i| reviews::policy(&format!("decoy-{i:05}"), reviews::decoy_selector(i))),
        )
        .collect()
}

/// The approver keys document the Secret holds.
pub fn approver_jwks(repo: &Path) -> Result<Vec<u8>> {
    let path = repo.join(APPROVER_JWKS);
    std::fs::read(&path).with_context(|| format!("reading {}", path.display()))
}

/// The spec of the exception the load submits, signed by the test approver key with the
/// library's `exception::sign` (what `lifeguard exception sign` runs): valid from an hour ago
/// for 14 days, bound to the bench policy in the bench namespace.
pub fn signed_exception_spec(repo: &Path) -> Result<Value> {
    let now = jiff::Timestamp::now();
    let not_before = now - jiff::SignedDuration::from_hours(1);
    let expires_at = now + jiff::SignedDuration::from_hours(14 * 24);
    let mut spec = reviews::exception_spec(&not_before.to_string(), &expires_at.to_string());
    spec["signature"] = json!("");
    let typed: lifeguard::api::CapabilityExceptionSpec =
        serde_json::from_value(spec.clone()).context("the bench exception's spec")?;
    let key_path = repo.join(APPROVER_KEY);
    let key =
        std::fs::read(&key_path).with_context(|| format!("reading {}", key_path.display()))?;
    let signature = lifeguard::exception::sign(&typed, NS, &key, APPROVER_KID)
        .context("signing the bench exception")?;
    spec["signature"] = json!(signature);
    Ok(spec)
}

/// The webhook's `--config`.
pub fn webhook_config() -> String {
    format!(
        "sidecar:\n  image: ghcr.io/lifeguard-dev/lifeguard:bench\n  resources: {{requests: {{cpu: 50m, memory: 64Mi}}, limits: {{memory: 256Mi}}}}\ncontrolPlane:\n  url: https://lifeguard-operator.{WEBHOOK_NAMESPACE}.svc:8443\n  caConfigMap: {{name: lifeguard-ca, key: ca.crt}}\napproverKeys: {{secretName: {APPROVERS_SECRET}, key: {APPROVERS_KEY}}}\n"
    )
}

/// The webhook under test.
pub type Webhook = Component;

/// Starts the webhook with the benchmark's configuration and waits until /readyz answers 200
/// (caches synced, TLS served).
pub async fn start_webhook(
    binary: &Path,
    dir: &Path,
    emulator: &Emulator,
    ca: &Ca,
) -> Result<Webhook> {
    let config = dir.join("webhook.yaml");
    std::fs::write(&config, webhook_config()).context("writing webhook.yaml")?;
    Component::start(
        binary,
        "webhook",
        WEBHOOK_NAMESPACE,
        &config,
        &[],
        dir,
        emulator,
        ca,
    )
    .await
}

impl Component {
    /// The webhook's own account of its handler time: (sum of seconds, count) per endpoint
    /// label, from `lifeguard_webhook_admission_duration_seconds`.
    pub async fn handler_seconds(&self, endpoint: &str) -> (f64, f64) {
        let text = self.metrics_text().await;
        let series = |suffix: &str| {
            metric_sum(
                &text,
                &format!(
                    "lifeguard_webhook_admission_duration_seconds_{suffix}{{endpoint=\"{endpoint}\"}}"
                ),
            )
        };
        (series("sum"), series("count"))
    }
}
