//! The install path end to end, as far as this machine allows: the chart renders the webhook
//! configurations and the webhook's config file; the real `lifeguard webhook` runs with that file;
//! the API emulator calls it for every pod and Lifeguard object like kube-apiserver does. Then,
//! as a platform team would: label a namespace, apply a policy, create a pod — the created pod
//! carries the sidecar.

use crate::support;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};
use support::kube::KubeEmulator;
use support::operator::TestCa;
use support::webhook::Webhook;

const RELEASE_NAMESPACE: &str = "lifeguard-system";

/// The chart's manifests for `values`.
fn render_chart(values: &Value) -> Vec<Value> {
    support::chart::render(values)
}

fn find<'a>(docs: &'a [Value], kind: &str, name_suffix: &str) -> &'a Value {
    docs.iter()
        .find(|d| {
            d["kind"] == kind
                && d["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with(name_suffix))
        })
        .unwrap_or_else(|| panic!("the chart renders no {kind} *{name_suffix}"))
}

struct Installed {
    emulator: KubeEmulator,
    webhook: Webhook,
}

/// What `helm install` would put in place for the admission path, with the webhook's serving
/// certificate from a test CA (`certificates.mode: existingSecret`).
async fn install() -> Installed {
    let emulator = KubeEmulator::start().await;
    let dir = std::sync::Arc::new(tempfile::tempdir().unwrap());
    let ca = std::sync::Arc::new(TestCa::new(dir.path()));
    let docs = render_chart(&json!({
        "certificates": {"mode": "existingSecret", "existingSecret": {
            "operatorSecretName": "operator-tls", "webhookSecretName": "webhook-tls",
            "caBundle": ca.ca_pem,
        }},
    }));
    // The operator accepts the configuration file the chart writes for it.
    let operator_config = find(&docs, "ConfigMap", "-operator-config");
    for (key, text) in operator_config["data"].as_object().unwrap() {
        lifeguard::operator::config::OperatorFileConfig::parse(key, text.as_str().unwrap())
            .unwrap_or_else(|e| panic!("the chart's operator config does not parse: {e}"));
    }
    // The webhook runs with exactly the configuration file the chart writes.
    let config = find(&docs, "ConfigMap", "-webhook-config");
    let (_, text) = config["data"].as_object().unwrap().iter().next().unwrap();
    let (cert, key) = (ca.cert_path.clone(), ca.key_path.clone());
    let webhook =
        Webhook::start_with_certificate(&emulator, text.as_str().unwrap(), dir, ca, &cert, &key)
            .await;

    let mutating = find(&docs, "MutatingWebhookConfiguration", "-inject");
    let validating = find(&docs, "ValidatingWebhookConfiguration", "-validate");
    let service = &mutating["webhooks"][0]["clientConfig"]["service"];
    assert_eq!(service["namespace"], RELEASE_NAMESPACE);
    let port: u16 = webhook.url.rsplit(':').next().unwrap().parse().unwrap();
    emulator
        .register_service(
            RELEASE_NAMESPACE,
            service["name"].as_str().unwrap(),
            service["port"].as_u64().unwrap() as u16,
            &format!("https://127.0.0.1:{port}"),
        )
        .await;
    let mut yaml = String::new();
    for doc in [mutating, validating] {
        yaml.push_str(&serde_json::to_string(doc).unwrap());
        yaml.push_str("\n---\n");
    }
    emulator.apply_yaml(&yaml).await;
    emulator
        .apply_yaml(
            "
apiVersion: v1
kind: Namespace
metadata: {name: lifeguard-system}
---
apiVersion: v1
kind: Namespace
metadata: {name: team-a}
---
apiVersion: v1
kind: Namespace
metadata: {name: team-b}
---
apiVersion: lifeguard.dev/v1alpha1
kind: McpServerPolicy
metadata: {name: reports, namespace: team-b}
spec:
  selector: {matchLabels: {app: reports}}
  resource: https://reports.team-b.example.com/mcp
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
",
        )
        .await;
    Installed { emulator, webhook }
}

fn mcp_pod(name: &str, labels: Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{
            "name": "server", "image": "registry.example.com/reports:1",
            "ports": [{"name": "mcp", "containerPort": 8080}],
        }]},
    }))
    .unwrap()
}

fn sidecar_of(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::Container> {
    pod.spec
        .as_ref()?
        .init_containers
        .iter()
        .flatten()
        .find(|c| c.name == "lifeguard-sidecar")
}

#[tokio::test]
async fn label_a_namespace_apply_a_policy_create_a_pod_and_it_carries_the_sidecar() {
    let Installed { emulator, webhook } = install().await;
    let client = emulator.client().await;
    let pods = Api::<Pod>::namespaced(client.clone(), "team-a");

    // Before the namespace opts in, the pod is not even sent to the webhook (injectionScope
    // optedIn): created as is, no annotation.
    let before = pods
        .create(
            &PostParams::default(),
            &mcp_pod("early", json!({"app": "reports"})),
        )
        .await
        .unwrap();
    assert!(sidecar_of(&before).is_none());
    assert!(
        before.metadata.annotations.is_none(),
        "{:?}",
        before.metadata.annotations
    );

    // docs/install.md steps 3–5: kubectl apply -f examples/install/{namespace,policy,server}.yaml
    for file in ["namespace.yaml", "policy.yaml", "server.yaml"] {
        let path = support::repo().join("examples/install").join(file);
        emulator
            .apply_yaml(&std::fs::read_to_string(path).unwrap())
            .await;
    }
    // The emulator runs no controllers: create the pod the Deployment's ReplicaSet would.
    let server: Vec<Value> = serde_saphyr::from_multiple(
        &std::fs::read_to_string(support::repo().join("examples/install/server.yaml")).unwrap(),
    )
    .unwrap();
    let mut template = server[0]["spec"]["template"].clone();
    template["metadata"]["name"] = json!("reports-0");
    let from_deployment: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": template["metadata"], "spec": template["spec"],
    }))
    .unwrap();
    // The webhook's caches see the label and the policy a moment after they are written.
    let created = support::eventually(std::time::Duration::from_secs(20), async || {
        let _ = pods.delete("reports-0", &Default::default()).await;
        let pod = pods
            .create(&PostParams::default(), &from_deployment)
            .await
            .ok()?;
        sidecar_of(&pod).is_some().then_some(pod)
    })
    .await
    .unwrap_or_else(|| panic!("the pod never got the sidecar:\n{}", webhook.logs()));
    let stored = pods.get("reports-0").await.unwrap();
    assert_eq!(
        stored.spec, created.spec,
        "what was stored is what was admitted"
    );
    let sidecar = sidecar_of(&stored).unwrap();
    assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"));
    let status = &stored.metadata.annotations.as_ref().unwrap()["lifeguard.dev/status"];
    assert!(status.contains("\"policy\":\"reports\""), "{status}");

    // A dry run is admitted the same way and stores nothing.
    let dry = pods
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &mcp_pod("reports-dry", json!({"app": "reports"})),
        )
        .await
        .unwrap();
    assert!(sidecar_of(&dry).is_some());
    assert!(pods.get_opt("reports-dry").await.unwrap().is_none());

    // A pod that opts out of a policy that requires the sidecar is refused.
    let refused = pods
        .create(
            &PostParams::default(),
            &mcp_pod(
                "billing-0",
                json!({"app": "billing", "lifeguard.dev/inject": "disabled"}),
            ),
        )
        .await
        .unwrap_err();
    let message = refused.to_string();
    assert!(
        message.contains("denied the request") && message.contains("OptedOut"),
        "{message}"
    );

    // A pod of another namespace, not opted in, never reaches the webhook.
    let calls_before = emulator.admissions().await.len();
    let other = Api::<Pod>::namespaced(client.clone(), "team-b")
        .create(
            &PostParams::default(),
            &mcp_pod("reports-0", json!({"app": "reports"})),
        )
        .await
        .unwrap();
    assert!(sidecar_of(&other).is_none());
    let calls: Vec<_> = emulator
        .admissions()
        .await
        .into_iter()
        .skip(calls_before)
        .collect();
    assert!(
        calls.iter().all(|c| c.namespace != "team-b"),
        "team-b pods must not be sent: {calls:?}"
    );
}

#[tokio::test]
async fn lifeguard_objects_pass_through_validation() {
    let Installed { emulator, webhook } = install().await;
    let policy = support::repo().join("examples/install/policy.yaml");
    emulator
        .apply_yaml(&std::fs::read_to_string(policy).unwrap())
        .await;
    // An exception whose signature nobody can verify (no approver keys, a forged signature).
    let yaml = "
apiVersion: lifeguard.dev/v1alpha1
kind: CapabilityException
metadata: {name: summaries, namespace: team-a}
spec:
  policyRef: {name: reports}
  capability: sampling
  clients: [c]
  purpose: summaries
  modelRoute: gateway/summaries
  limits: {maxTokens: 1, maxIterationsPerTask: 1, maxRequestsPerMinute: 1}
  notBefore: '2026-12-01T00:00:00Z'
  expiresAt: '2026-12-15T00:00:00Z'
  approvalId: CHG-1
  signature: e30..c2ln
";
    let documents: Vec<Value> = serde_saphyr::from_multiple(yaml).unwrap();
    let response = emulator
        .send(
            http::Method::POST,
            "/apis/lifeguard.dev/v1alpha1/namespaces/team-a/capabilityexceptions",
            "application/json",
            Some(&documents[0]),
        )
        .await;
    assert!(response.status >= 400, "{:?}", response.body);
    let message = response.body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("denied the request"),
        "{message}\n{}",
        webhook.logs()
    );

    // A policy whose selector overlaps `reports` is refused and names it.
    let overlapping = json!({
        "apiVersion": "lifeguard.dev/v1alpha1", "kind": "McpServerPolicy",
        "metadata": {"name": "reports-v2", "namespace": "team-a"},
        "spec": {
            "selector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]},
            "resource": "https://reports2.team-a.example.com/mcp",
            "identity": {"issuers": [{"issuer": "https://idp.example.com", "jwksUri": "https://idp.example.com/jwks"}]},
        },
    });
    let response = emulator
        .send(
            http::Method::POST,
            "/apis/lifeguard.dev/v1alpha1/namespaces/team-a/mcpserverpolicies",
            "application/json",
            Some(&overlapping),
        )
        .await;
    assert!(response.status >= 400, "{:?}", response.body);
    let message = response.body["message"].as_str().unwrap_or_default();
    assert!(message.contains("`reports`"), "{message}");
}

/// Issue 28, items 2 and 3, through the API server path: a pod copied from a running injected
/// pod (`kubectl get pod -o yaml | kubectl apply`) keeps its one sidecar; the same copy with
/// the sidecar's image swapped, or a pod that only claims the sidecar with the status
/// annotation and shares its process namespace, is refused by the required policy.
#[tokio::test]
async fn a_copied_injected_pod_is_admitted_and_a_doctored_copy_is_refused() {
    let Installed { emulator, webhook } = install().await;
    let client = emulator.client().await;
    let pods = Api::<Pod>::namespaced(client.clone(), "team-a");
    let labels = json!({"app": "billing", "lifeguard.dev/inject": "enabled"});
    // The webhook's caches see the policy a moment after it is written.
    support::eventually(std::time::Duration::from_secs(20), async || {
        let _ = pods.delete("billing-0", &Default::default()).await;
        let pod = pods
            .create(
                &PostParams::default(),
                &mcp_pod("billing-0", labels.clone()),
            )
            .await
            .ok()?;
        sidecar_of(&pod).is_some().then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("billing-0 never got the sidecar:\n{}", webhook.logs()));

    let stored = serde_json::to_value(pods.get("billing-0").await.unwrap()).unwrap();
    let copy_of = |name: &str| {
        let mut copy = stored.clone();
        let meta = copy["metadata"].as_object_mut().unwrap();
        meta.retain(|k, _| ["labels", "annotations", "namespace"].contains(&k.as_str()));
        meta.insert("name".into(), json!(name));
        copy.as_object_mut().unwrap().remove("status");
        copy
    };
    let copied: Pod = serde_json::from_value(copy_of("billing-copy")).unwrap();
    let created = pods
        .create(&PostParams::default(), &copied)
        .await
        .unwrap_or_else(|e| panic!("the genuine copy is admitted: {e}\n{}", webhook.logs()));
    let sidecars = created
        .spec
        .as_ref()
        .unwrap()
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.name == "lifeguard-sidecar")
        .count();
    assert_eq!(sidecars, 1, "the copy keeps exactly one sidecar");

    let mut doctored = copy_of("billing-doctored");
    doctored["spec"]["initContainers"][0]["image"] = json!("registry.example.com/pause:1");
    let refused = pods
        .create(
            &PostParams::default(),
            &serde_json::from_value(doctored).unwrap(),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("denied the request") && refused.contains("ForeignSidecar"),
        "{refused}"
    );
    assert!(pods.get_opt("billing-doctored").await.unwrap().is_none());

    let mut claimed = serde_json::to_value(mcp_pod("billing-claimed", labels.clone())).unwrap();
    claimed["metadata"]["annotations"] = stored["metadata"]["annotations"].clone();
    claimed["spec"]["shareProcessNamespace"] = json!(true);
    let refused = pods
        .create(
            &PostParams::default(),
            &serde_json::from_value(claimed).unwrap(),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("denied the request") && refused.contains("SharedProcessNamespace"),
        "{refused}"
    );

    // Lifeguard's own label is a claim too: the chart does not let it skip the webhook, and the
    // required policy refuses the pod.
    let mut labels = labels;
    labels["app.kubernetes.io/part-of"] = json!("lifeguard");
    let refused = pods
        .create(
            &PostParams::default(),
            &mcp_pod("billing-component", labels),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("denied the request") && refused.contains("LifeguardComponent"),
        "{refused}"
    );
}
