//! The Kubernetes API emulator (`tests/kube_emulator/`) calls admission webhooks as
//! kube-apiserver does: a test webhook over TLS, registered through
//! Mutating/ValidatingWebhookConfigurations created with kube-rs, mutates, denies and warns;
//! selectors, failure policies, dry runs and reinvocation decide what it sees.

use crate::support;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use lifeguard::api::McpServerPolicy;
use serde_json::{Value, json};
use support::kube::{AdmissionCall, KubeEmulator};
use support::test_webhook::{
    COUNT_ANNOTATION, SIDECAR, STATUS_ANNOTATION, TestWebhook, create_mutating, create_validating,
    pod_rules, webhook,
};
use support::tls::mint_tls;

async fn create_namespace(client: &kube::Client, name: &str, labels: Value) {
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
}

fn pod(metadata: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": metadata,
        "spec": {"containers": [{"name": "app", "image": "registry.invalid/app:1"}]},
    }))
    .unwrap()
}

fn container_names(pod: &Pod) -> Vec<String> {
    let spec = pod.spec.as_ref().unwrap();
    spec.containers.iter().map(|c| c.name.clone()).collect()
}

fn api_error(result: Result<Pod, kube::Error>) -> Box<kube::core::Status> {
    match result {
        Err(kube::Error::Api(status)) => status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn calls_summary(calls: &[AdmissionCall]) -> Vec<(String, String, String)> {
    calls
        .iter()
        .map(|c| {
            let at = format!("{}/{}", c.namespace, c.name);
            (c.webhook.clone(), c.operation.clone(), at)
        })
        .collect()
}

#[tokio::test]
async fn a_mutating_webhook_injects_a_sidecar_into_a_created_pod() {
    let k8s = KubeEmulator::start().await;
    let hook = TestWebhook::start().await;
    k8s.register_service("lifeguard", "lifeguard-webhook", 443, &hook.address)
        .await;
    let client = k8s.client().await;
    create_namespace(
        &client,
        "team-a",
        json!({"lifeguard.dev/inject": "enabled"}),
    )
    .await;
    create_mutating(
        &client,
        "lifeguard-inject",
        vec![webhook(
            "inject.lifeguard.dev",
            hook.service_config("/inject"),
            pod_rules(&["CREATE"]),
            json!({"namespaceSelector": {"matchLabels": {"lifeguard.dev/inject": "enabled"}}}),
        )],
    )
    .await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), "team-a");
    let created = pods
        .create(&PostParams::default(), &pod(json!({"name": "reports"})))
        .await
        .unwrap();
    assert_eq!(container_names(&created), ["app", SIDECAR]);
    let stored = pods.get("reports").await.unwrap();
    assert_eq!(container_names(&stored), ["app", SIDECAR]);
    let annotations = stored.metadata.annotations.unwrap();
    assert_eq!(annotations[STATUS_ANNOTATION], "{\"injected\":true}");
    assert!(stored.metadata.uid.is_some());

    // The review, as kube-apiserver sends it: mutating webhooks see the object before the
    // server gives it a uid.
    let reviews = hook.reviews();
    assert_eq!(reviews.len(), 1, "{reviews:?}");
    let (path, request) = &reviews[0];
    assert_eq!(path, "/inject?timeout=10s");
    assert_eq!(
        request["kind"],
        json!({"group": "", "version": "v1", "kind": "Pod"})
    );
    assert_eq!(request["requestKind"], request["kind"]);
    assert_eq!(
        request["resource"],
        json!({"group": "", "version": "v1", "resource": "pods"})
    );
    assert_eq!(request["operation"], "CREATE");
    assert_eq!(request["namespace"], "team-a");
    assert_eq!(request["name"], "reports");
    assert_eq!(request["dryRun"], false);
    assert_eq!(request["oldObject"], Value::Null);
    assert_eq!(request["options"]["kind"], "CreateOptions");
    assert_eq!(request["userInfo"]["username"], "kubernetes-admin");
    assert_eq!(request["object"]["metadata"]["name"], "reports");
    assert_eq!(request["object"]["metadata"]["uid"], Value::Null);
    assert_eq!(request["object"]["spec"]["containers"][0]["name"], "app");

    let calls = k8s.admissions().await;
    assert_eq!(calls.len(), 1, "{calls:?}");
    let call = &calls[0];
    assert_eq!(
        (call.webhook.as_str(), call.configuration.as_str()),
        ("inject.lifeguard.dev", "lifeguard-inject")
    );
    assert_eq!(call.kind, "mutating");
    assert_eq!(call.uid, request["uid"]);
    assert_eq!(call.allowed, Some(true));
    assert!(call.patched);
    assert_eq!(call.warnings, ["sidecar injected"]);
    assert_eq!(
        call.url.as_deref(),
        Some(format!("{}/inject", hook.address).as_str())
    );

    // With generateName, the name is chosen after mutating admission.
    let generated = pods
        .create(
            &PostParams::default(),
            &pod(json!({"generateName": "worker-"})),
        )
        .await
        .unwrap();
    assert!(
        generated
            .metadata
            .name
            .as_ref()
            .unwrap()
            .starts_with("worker-")
    );
    assert_eq!(container_names(&generated), ["app", SIDECAR]);
    let (_, request) = &hook.reviews()[1];
    assert_eq!(request.get("name"), None, "{request}");
    assert_eq!(request["object"]["metadata"]["generateName"], "worker-");
    assert_eq!(request["object"]["metadata"].get("name"), None);
}

#[tokio::test]
async fn selectors_decide_which_requests_a_webhook_sees() {
    let k8s = KubeEmulator::start().await;
    let hook = TestWebhook::start().await;
    let client = k8s.client().await;
    for (name, labels) in [
        ("team-a", json!({"lifeguard.dev/inject": "enabled"})),
        ("team-b", json!({})),
        ("kube-system", json!({"lifeguard.dev/inject": "enabled"})),
    ] {
        create_namespace(&client, name, labels).await;
    }
    // kube-apiserver labels every namespace with its name, which selectors rely on.
    let system = Api::<Namespace>::all(client.clone())
        .get("kube-system")
        .await
        .unwrap();
    assert_eq!(
        system.metadata.labels.unwrap()["kubernetes.io/metadata.name"],
        "kube-system"
    );
    create_mutating(
        &client,
        "lifeguard-inject",
        vec![webhook(
            "inject.lifeguard.dev",
            hook.url_config("/inject"),
            pod_rules(&["CREATE"]),
            json!({
                "namespaceSelector": {"matchExpressions": [
                    {"key": "lifeguard.dev/inject", "operator": "In", "values": ["enabled"]},
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]},
                ]},
                "objectSelector": {"matchExpressions": [
                    {"key": "app.kubernetes.io/part-of", "operator": "NotIn", "values": ["lifeguard"]},
                    {"key": "lifeguard.dev/skip", "operator": "DoesNotExist"},
                ]},
            }),
        )],
    )
    .await;
    create_validating(
        &client,
        "audit",
        vec![webhook(
            "audit.test.lifeguard.dev",
            hook.url_config("/warn"),
            pod_rules(&["CREATE"]),
            json!({"objectSelector": {"matchExpressions": [{"key": "audit", "operator": "Exists"}]}}),
        )],
    )
    .await;

    let cases = [
        ("team-a", "plain", json!({}), true),
        ("team-b", "plain", json!({}), false),
        ("kube-system", "plain", json!({}), false),
        (
            "team-a",
            "own",
            json!({"app.kubernetes.io/part-of": "lifeguard"}),
            false,
        ),
        (
            "team-a",
            "skipped",
            json!({"lifeguard.dev/skip": "1"}),
            false,
        ),
        ("team-a", "audited", json!({"audit": "yes"}), true),
    ];
    for (namespace, name, labels, injected) in cases {
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let created = pods
            .create(
                &PostParams::default(),
                &pod(json!({"name": name, "labels": labels})),
            )
            .await
            .unwrap();
        let expected: &[&str] = if injected {
            &["app", SIDECAR]
        } else {
            &["app"]
        };
        assert_eq!(container_names(&created), expected, "{namespace}/{name}");
    }
    let calls = k8s.admissions().await;
    let seen: Vec<_> = calls_summary(&calls);
    let expected = [
        ("inject.lifeguard.dev", "CREATE", "team-a/plain"),
        ("inject.lifeguard.dev", "CREATE", "team-a/audited"),
        ("audit.test.lifeguard.dev", "CREATE", "team-a/audited"),
    ]
    .map(|(w, o, at)| (w.to_owned(), o.to_owned(), at.to_owned()));
    assert_eq!(seen, expected);

    // A namespaced request in a namespace that does not exist cannot be matched against a
    // namespaceSelector: 404, as from kube-apiserver.
    let nowhere: Api<Pod> = Api::namespaced(client, "nowhere");
    let status = api_error(
        nowhere
            .create(&PostParams::default(), &pod(json!({"name": "plain"})))
            .await,
    );
    assert_eq!(status.code, 404);
    assert_eq!(status.message, "namespaces \"nowhere\" not found");
}

#[tokio::test]
async fn a_denial_carries_the_webhooks_status_and_earlier_warnings() {
    let k8s = KubeEmulator::start().await;
    let hook = TestWebhook::start().await;
    let client = k8s.client().await;
    create_mutating(
        &client,
        "inject",
        vec![webhook(
            "inject.lifeguard.dev",
            hook.url_config("/inject"),
            pod_rules(&["CREATE"]),
            json!({}),
        )],
    )
    .await;
    create_validating(
        &client,
        "deny",
        vec![webhook(
            "deny.test.lifeguard.dev",
            hook.url_config("/deny"),
            pod_rules(&["CREATE", "UPDATE"]),
            json!({}),
        )],
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client, "team-a");
    let refused = pod(json!({"name": "refused", "labels": {"deny": "yes"}}));
    let status = api_error(pods.create(&PostParams::default(), &refused).await);
    assert_eq!(status.code, 403);
    assert_eq!(status.reason, "Forbidden");
    assert_eq!(
        status.message,
        "admission webhook \"deny.test.lifeguard.dev\" denied the request: pods labelled deny=yes are refused"
    );
    assert!(pods.get_opt("refused").await.unwrap().is_none());
    // The validating webhook saw the object as mutated, with its uid.
    let (_, request) = hook.reviews().pop().unwrap();
    assert_eq!(request["object"]["spec"]["containers"][1]["name"], SIDECAR);
    assert!(
        request["object"]["metadata"]["uid"].is_string(),
        "{request}"
    );

    // The denial still carries the mutating webhook's warning.
    let raw = k8s
        .send(
            http::Method::POST,
            "/api/v1/namespaces/team-a/pods",
            "application/json",
            Some(&serde_json::to_value(&refused).unwrap()),
        )
        .await;
    assert_eq!(raw.status, 403, "{:?}", raw.body);
    assert_eq!(raw.warnings(), ["sidecar injected"]);

    // An UPDATE is checked too, and a denied one changes nothing.
    pods.create(&PostParams::default(), &pod(json!({"name": "allowed"})))
        .await
        .unwrap();
    let patch = Patch::Merge(json!({"metadata": {"labels": {"deny": "yes"}}}));
    let status = api_error(pods.patch("allowed", &PatchParams::default(), &patch).await);
    assert_eq!(status.code, 403);
    let stored = pods.get("allowed").await.unwrap();
    assert_eq!(stored.metadata.labels, None);
    let calls = k8s.admissions().await;
    let last = calls.last().unwrap();
    assert_eq!(
        (last.operation.as_str(), last.allowed),
        ("UPDATE", Some(false))
    );
    assert_eq!(last.status.as_ref().unwrap()["code"], 403);
}

#[tokio::test]
async fn webhook_warnings_are_warning_headers() {
    let k8s = KubeEmulator::start().await;
    let hook = TestWebhook::start().await;
    create_validating(
        &k8s.client().await,
        "warn",
        vec![webhook(
            "warn.test.lifeguard.dev",
            hook.url_config("/warn"),
            pod_rules(&["CREATE"]),
            json!({}),
        )],
    )
    .await;
    let response = k8s
        .send(
            http::Method::POST,
            "/api/v1/namespaces/team-a/pods",
            "application/json",
            Some(&serde_json::to_value(pod(json!({"name": "warned"}))).unwrap()),
        )
        .await;
    assert_eq!(response.status, 201, "{:?}", response.body);
    assert_eq!(
        response.warning_headers(),
        [
            r#"299 - "first warning""#,
            r#"299 - "a \"quoted\" warning""#
        ]
    );
    assert_eq!(
        response.warnings(),
        ["first warning", "a \"quoted\" warning"]
    );
    let calls = k8s.admissions().await;
    assert_eq!(calls[0].warnings, response.warnings());
}

#[tokio::test]
async fn failure_policy_decides_what_a_failed_call_does() {
    let k8s = KubeEmulator::start().await;
    let hook = TestWebhook::start().await;
    let (other_ca, _) = mint_tls();
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let client = k8s.client().await;
    // One webhook per case, each selecting the pods labelled with its case.
    let case = |name: &str, config: Value, extra: Value| {
        let mut extra = extra;
        extra["objectSelector"] = json!({"matchLabels": {"case": name}});
        webhook(
            &format!("{name}.test.lifeguard.dev"),
            config,
            pod_rules(&["CREATE"]),
            extra,
        )
    };
    let unregistered = json!({
        "service": {"namespace": "lifeguard", "name": "missing", "path": "/inject"},
        "caBundle": hook.ca_bundle,
    });
    let untrusted = json!({
        "url": format!("{}/inject", hook.address),
        "caBundle": BASE64.encode(other_ca),
    });
    let down = json!({"url": format!("https://{closed}/inject"), "caBundle": hook.ca_bundle});
    create_mutating(
        &client,
        "cases",
        vec![
            case("down", down.clone(), json!({"failurePolicy": "Fail"})),
            case("ignored", down, json!({"failurePolicy": "Ignore"})),
            case("unregistered", unregistered, json!({})),
            case("untrusted", untrusted, json!({})),
            case(
                "slow",
                hook.url_config("/slow"),
                json!({"timeoutSeconds": 1}),
            ),
        ],
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client, "team-a");
    let create = async |name: &str| {
        let labelled = pod(json!({"name": name, "labels": {"case": name}}));
        pods.create(&PostParams::default(), &labelled).await
    };

    let status = api_error(create("down").await);
    assert_eq!(
        (status.code, status.reason.as_str()),
        (500, "InternalError")
    );
    let prefix = format!(
        "Internal error occurred: failed calling webhook \"down.test.lifeguard.dev\": failed to call \
         webhook: Post \"https://{closed}/inject?timeout=10s\": "
    );
    assert!(status.message.starts_with(&prefix), "{}", status.message);
    assert!(pods.get_opt("down").await.unwrap().is_none());

    let ignored = create("ignored").await.unwrap();
    assert_eq!(container_names(&ignored), ["app"]);

    let status = api_error(create("unregistered").await);
    assert!(
        status
            .message
            .contains("no address for service lifeguard/missing:443"),
        "{}",
        status.message
    );

    let status = api_error(create("untrusted").await);
    assert!(
        status.message.contains("certificate verify failed"),
        "{}",
        status.message
    );

    let status = api_error(create("slow").await);
    assert!(
        status.message.ends_with("context deadline exceeded"),
        "{}",
        status.message
    );

    let calls = k8s.admissions().await;
    let outcomes: Vec<_> = calls
        .iter()
        .map(|c| (c.webhook.as_str(), c.allowed, c.ignored, c.error.is_some()))
        .collect();
    assert_eq!(
        outcomes,
        [
            ("down.test.lifeguard.dev", None, false, true),
            ("ignored.test.lifeguard.dev", None, true, true),
            ("unregistered.test.lifeguard.dev", None, false, true),
            ("untrusted.test.lifeguard.dev", None, false, true),
            ("slow.test.lifeguard.dev", None, false, true),
        ]
    );
}

#[tokio::test]
async fn a_dry_run_is_admitted_as_one_and_persists_nothing() {
    let k8s = KubeEmulator::start().await;
    let hook = TestWebhook::start().await;
    let client = k8s.client().await;
    create_mutating(
        &client,
        "inject",
        vec![webhook(
            "inject.lifeguard.dev",
            hook.url_config("/inject"),
            pod_rules(&["CREATE"]),
            json!({}),
        )],
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client, "team-a");
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let answered = pods
        .create(&dry_run, &pod(json!({"name": "trial"})))
        .await
        .unwrap();
    assert_eq!(container_names(&answered), ["app", SIDECAR]);
    assert!(pods.get_opt("trial").await.unwrap().is_none());
    let (_, request) = &hook.reviews()[0];
    assert_eq!(request["dryRun"], true);
    assert_eq!(request["options"]["dryRun"], json!(["All"]));
    assert!(k8s.admissions().await[0].dry_run);
}

#[tokio::test]
async fn a_validating_webhook_checks_updates_and_deletes_of_a_custom_resource() {
    let k8s = KubeEmulator::start().await;
    let hook = TestWebhook::start().await;
    let client = k8s.client().await;
    create_validating(
        &client,
        "lifeguard-validate",
        vec![webhook(
            "policy.test.lifeguard.dev",
            hook.url_config("/policy"),
            json!([{
                "operations": ["UPDATE", "DELETE"], "apiGroups": ["lifeguard.dev"],
                "apiVersions": ["v1alpha1"], "resources": ["mcpserverpolicies"], "scope": "Namespaced",
            }]),
            json!({}),
        )],
    )
    .await;
    k8s.apply_yaml(
        "apiVersion: lifeguard.dev/v1alpha1
kind: McpServerPolicy
metadata: {name: reports, namespace: team-a}
spec:
  selector: {matchLabels: {app: reports}}
  resource: https://reports.example.com/mcp
  identity:
    issuers:
      - issuer: https://idp.example.com
        jwksUri: https://idp.example.com/jwks.json
",
    )
    .await;
    let policies: Api<McpServerPolicy> = Api::namespaced(client, "team-a");
    let set_resource = |resource: &str| Patch::Merge(json!({"spec": {"resource": resource}}));
    policies
        .patch(
            "reports",
            &PatchParams::default(),
            &set_resource("https://reports.example.com/v2/mcp"),
        )
        .await
        .unwrap();
    let refused = policies
        .patch(
            "reports",
            &PatchParams::default(),
            &set_resource("https://forbidden.example.com/mcp"),
        )
        .await;
    let Err(kube::Error::Api(status)) = refused else {
        panic!("expected a denial, got {refused:?}");
    };
    // No code in the webhook's status: 400, as from kube-apiserver.
    assert_eq!(status.code, 400);
    assert_eq!(
        status.message,
        "admission webhook \"policy.test.lifeguard.dev\" denied the request: resource \
         https://forbidden.example.com/mcp is not allowed"
    );
    let stored = policies.get("reports").await.unwrap();
    assert_eq!(stored.spec.resource, "https://reports.example.com/v2/mcp");
    // The status subresource is another resource (`mcpserverpolicies/status`): not sent.
    let status_patch = Patch::Merge(json!({"status": {"observedGeneration": 2}}));
    policies
        .patch_status("reports", &PatchParams::default(), &status_patch)
        .await
        .unwrap();
    policies
        .delete("reports", &DeleteParams::default())
        .await
        .unwrap();

    let reviews = hook.reviews();
    let operations: Vec<_> = reviews
        .iter()
        .map(|(_, r)| r["operation"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(operations, ["UPDATE", "UPDATE", "DELETE"]);
    let update = &reviews[0].1;
    assert_eq!(
        update["oldObject"]["spec"]["resource"],
        "https://reports.example.com/mcp"
    );
    assert_eq!(
        update["object"]["spec"]["resource"],
        "https://reports.example.com/v2/mcp"
    );
    assert_eq!(update["options"]["kind"], "UpdateOptions");
    assert_eq!(
        update["resource"],
        json!({"group": "lifeguard.dev", "version": "v1alpha1", "resource": "mcpserverpolicies"})
    );
    let delete = &reviews[2].1;
    assert_eq!(delete["object"], Value::Null);
    assert_eq!(delete["oldObject"]["metadata"]["name"], "reports");
    assert_eq!(delete["options"]["kind"], "DeleteOptions");
}

#[tokio::test]
async fn an_if_needed_webhook_is_called_again_after_a_later_one_changed_the_object() {
    let k8s = KubeEmulator::start().await;
    let hook = TestWebhook::start().await;
    let client = k8s.client().await;
    // Configurations run in name order: "a-count" first, then "b-inject".
    create_mutating(
        &client,
        "b-inject",
        vec![webhook(
            "inject.lifeguard.dev",
            hook.url_config("/inject"),
            pod_rules(&["CREATE"]),
            json!({}),
        )],
    )
    .await;
    create_mutating(
        &client,
        "a-count",
        vec![webhook(
            "count.test.lifeguard.dev",
            hook.url_config("/count-containers"),
            pod_rules(&["CREATE"]),
            json!({"reinvocationPolicy": "IfNeeded"}),
        )],
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client, "team-a");
    let created = pods
        .create(&PostParams::default(), &pod(json!({"name": "reports"})))
        .await
        .unwrap();
    assert_eq!(container_names(&created), ["app", SIDECAR]);
    assert_eq!(created.metadata.annotations.unwrap()[COUNT_ANNOTATION], "2");
    let calls = k8s.admissions().await;
    let rounds: Vec<_> = calls
        .iter()
        .map(|c| (c.webhook.as_str(), c.round, c.patched))
        .collect();
    assert_eq!(
        rounds,
        [
            ("count.test.lifeguard.dev", 0, true),
            ("inject.lifeguard.dev", 0, true),
            ("count.test.lifeguard.dev", 1, true),
        ]
    );
}

#[tokio::test]
async fn webhook_configurations_are_discovered_and_validated() {
    let k8s = KubeEmulator::start().await;
    let client = k8s.client().await;
    let discovery = kube::Discovery::new(client.clone()).run().await.unwrap();
    let group = discovery
        .get("admissionregistration.k8s.io")
        .expect("admissionregistration.k8s.io discovered");
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        let (_, caps) = group.recommended_kind(kind).unwrap();
        assert_eq!(caps.scope, kube::discovery::Scope::Cluster, "{kind}");
    }

    let invalid = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "broken"},
        "webhooks": [{
            "name": "broken.test.lifeguard.dev",
            "clientConfig": {"url": "http://127.0.0.1:1/inject"},
            "rules": pod_rules(&["CREATE"]),
            "admissionReviewVersions": ["v1"],
            "matchConditions": [{"name": "always", "expression": "true"}],
        }],
    });
    let response = k8s
        .send(
            http::Method::POST,
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
            "application/json",
            Some(&invalid),
        )
        .await;
    assert_eq!(response.status, 422, "{:?}", response.body);
    let message = response.body["message"].as_str().unwrap();
    for expected in [
        "MutatingWebhookConfiguration.admissionregistration.k8s.io \"broken\" is invalid",
        "webhooks[0].clientConfig.url: Invalid value",
        "webhooks[0].sideEffects: Unsupported value",
        "webhooks[0].matchConditions: Forbidden",
    ] {
        assert!(message.contains(expected), "{expected:?} in {message}");
    }
    let stored = Api::<MutatingWebhookConfiguration>::all(client)
        .get_opt("broken")
        .await
        .unwrap();
    assert!(stored.is_none());
}
