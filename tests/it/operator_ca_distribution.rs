//! The CA ConfigMap on the API emulator, with the real operator: a namespace that opts in (by
//! label) or holds an McpServerPolicy gets ConfigMap `lifeguard-ca` with the CA from the
//! operator's Secret; the ConfigMaps follow a rotated Secret, come back when deleted or edited,
//! keep their content when the Secret turns to garbage (which is reported), stay when a
//! namespace opts out, and never appear in a namespace that is neither opted in nor has a
//! policy. Needs the emulator to serve Namespace objects (`/api/v1/namespaces`).

use crate::support;

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams};
use support::eventually;
use support::kube::KubeEmulator;
use support::operator::{OPERATOR_NAMESPACE, Operator};

const WAIT: Duration = Duration::from_secs(30);
const SECRET: &str = "lifeguard-operator-tls";
const CONFIG_MAP: &str = "lifeguard-ca";
const KEY: &str = "ca.crt";

const OPERATOR_CONFIG: &str = "caDistribution:
  secretName: lifeguard-operator-tls
  secretKey: ca.crt
  configMap: {name: lifeguard-ca, key: ca.crt}
";

/// A self-signed CA certificate, PEM.
fn ca_pem(name: &str) -> String {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.self_signed(&key).unwrap().pem()
}

/// Applies the operator's TLS Secret with `ca` under `ca.crt`.
async fn put_secret(emulator: &KubeEmulator, ca: &str) {
    let secret = serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": OPERATOR_NAMESPACE},
        "stringData": {KEY: ca, "tls.crt": "unused", "tls.key": "unused"},
    });
    emulator.apply_yaml(&secret.to_string()).await;
}

/// Applies namespace `name`, with `lifeguard.dev/inject: enabled` when `opted_in`.
async fn put_namespace(emulator: &KubeEmulator, name: &str, opted_in: bool) {
    let labels = if opted_in {
        serde_json::json!({"lifeguard.dev/inject": "enabled"})
    } else {
        serde_json::json!({"team": name})
    };
    let namespace = serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": labels},
    });
    emulator.apply_yaml(&namespace.to_string()).await;
}

fn policy(namespace: &str) -> String {
    format!(
        "apiVersion: lifeguard.dev/v1alpha1
kind: McpServerPolicy
metadata: {{name: reports, namespace: {namespace}}}
spec:
  selector: {{matchLabels: {{app: reports}}}}
  resource: https://reports.example.com/mcp
  identity:
    issuers:
      - issuer: https://idp.example.com
        audiences: [https://reports.example.com/mcp]
        jwksUri: https://idp.example.com/jwks
"
    )
}

async fn config_map(emulator: &KubeEmulator, namespace: &str) -> Option<ConfigMap> {
    Api::<ConfigMap>::namespaced(emulator.client().await, namespace)
        .get_opt(CONFIG_MAP)
        .await
        .unwrap_or_else(|e| panic!("get configmap {namespace}/{CONFIG_MAP}: {e}"))
}

fn ca_of(config_map: &ConfigMap) -> Option<&str> {
    config_map.data.as_ref()?.get(KEY).map(String::as_str)
}

/// Waits until the ConfigMap in `namespace` carries `ca`.
async fn wait_for_ca(emulator: &KubeEmulator, operator: &Operator, namespace: &str, ca: &str) {
    let found = eventually(WAIT, async || {
        let cm = config_map(emulator, namespace).await?;
        (ca_of(&cm) == Some(ca)).then_some(cm)
    })
    .await;
    let Some(cm) = found else {
        panic!(
            "{namespace}/{CONFIG_MAP} never carried the expected CA; now: {:?}\noperator:\n{}",
            config_map(emulator, namespace).await,
            operator.logs()
        );
    };
    let labels = cm.metadata.labels.unwrap_or_default();
    assert_eq!(labels["app.kubernetes.io/part-of"], "lifeguard");
    assert_eq!(labels["app.kubernetes.io/managed-by"], "lifeguard-operator");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_ca_config_map_follows_opt_in_policies_rotation_and_tampering() {
    let emulator = KubeEmulator::start().await;
    let first = ca_pem("first CA");
    put_secret(&emulator, &first).await;
    for name in ["team-a", "team-b", "plain", "late"] {
        put_namespace(&emulator, name, false).await;
    }
    let operator = Operator::start(&emulator, Some(OPERATOR_CONFIG)).await;

    // Opting a namespace in by label brings the ConfigMap with the CA.
    put_namespace(&emulator, "team-a", true).await;
    wait_for_ca(&emulator, &operator, "team-a", &first).await;

    // A policy in an unlabelled namespace does too.
    emulator.apply_yaml(&policy("team-b")).await;
    wait_for_ca(&emulator, &operator, "team-b", &first).await;

    // Rotation: both follow the Secret.
    let second = ca_pem("second CA");
    put_secret(&emulator, &second).await;
    wait_for_ca(&emulator, &operator, "team-a", &second).await;
    wait_for_ca(&emulator, &operator, "team-b", &second).await;

    // Deleted: it comes back. Edited: it is restored.
    let client = emulator.client().await;
    Api::<ConfigMap>::namespaced(client.clone(), "team-a")
        .delete(CONFIG_MAP, &DeleteParams::default())
        .await
        .unwrap();
    wait_for_ca(&emulator, &operator, "team-a", &second).await;
    let tampered = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": CONFIG_MAP, "namespace": "team-b"},
        "data": {KEY: "tampered"},
    });
    emulator.apply_yaml(&tampered.to_string()).await;
    wait_for_ca(&emulator, &operator, "team-b", &second).await;

    // A Secret that no longer holds a certificate is not copied: the ConfigMaps keep the last
    // good CA, a deleted one stays deleted, a newly opted-in namespace waits, and the problem
    // is reported.
    const WRITES: &str = "lifeguard_operator_ca_configmap_writes_total{result=\"ok\"}";
    const NO_CERTIFICATE: &str =
        "lifeguard_operator_ca_source_problems_total{reason=\"no_certificate\"}";
    let writes_before = operator.metric(WRITES).await.expect("writes were counted");
    put_secret(&emulator, "not a certificate").await;
    let reported = eventually(WAIT, async || {
        let usable = operator
            .metric("lifeguard_operator_ca_source_usable")
            .await?;
        let problems = operator.metric(NO_CERTIFICATE).await?;
        (usable == 0.0 && problems >= 1.0).then_some(())
    })
    .await;
    assert!(
        reported.is_some(),
        "no problem reported:\n{}",
        operator.logs()
    );
    let warned = eventually(WAIT, async || {
        let events = Api::<Event>::namespaced(client.clone(), OPERATOR_NAMESPACE)
            .list(&ListParams::default())
            .await
            .ok()?;
        events.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("CaSourceUnusable")
                && e.type_.as_deref() == Some("Warning")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(SECRET)
        })
    })
    .await;
    assert!(warned.is_some(), "no Warning Event:\n{}", operator.logs());
    Api::<ConfigMap>::namespaced(client.clone(), "team-a")
        .delete(CONFIG_MAP, &DeleteParams::default())
        .await
        .unwrap();
    put_namespace(&emulator, "late", true).await;
    // A second bad version, counted once it is seen: the operator has looked again after the
    // deletion and the label above, and still wrote nothing.
    put_secret(&emulator, "still not a certificate").await;
    let counted = eventually(WAIT, async || {
        (operator.metric(NO_CERTIFICATE).await? >= 2.0).then_some(())
    })
    .await;
    assert!(
        counted.is_some(),
        "second bad version not seen:\n{}",
        operator.logs()
    );
    assert_eq!(operator.metric(WRITES).await, Some(writes_before));
    assert!(config_map(&emulator, "team-a").await.is_none());
    assert!(config_map(&emulator, "late").await.is_none());
    assert_eq!(
        ca_of(&config_map(&emulator, "team-b").await.unwrap()),
        Some(second.as_str())
    );

    // Fixed: everything catches up.
    let third = ca_pem("third CA");
    put_secret(&emulator, &third).await;
    for namespace in ["team-a", "team-b", "late"] {
        wait_for_ca(&emulator, &operator, namespace, &third).await;
    }
    let usable = operator.metric("lifeguard_operator_ca_source_usable").await;
    assert_eq!(usable, Some(1.0));

    // Opting out leaves the ConfigMap (running pods mount it); a namespace that never opted
    // in and has no policy never got one.
    put_namespace(&emulator, "team-a", false).await;
    let fourth = ca_pem("fourth CA");
    put_secret(&emulator, &fourth).await;
    wait_for_ca(&emulator, &operator, "team-b", &fourth).await;
    assert_eq!(
        ca_of(&config_map(&emulator, "team-a").await.unwrap()),
        Some(third.as_str()),
        "an opted-out namespace keeps its ConfigMap as it was"
    );
    assert!(config_map(&emulator, "plain").await.is_none());
}
