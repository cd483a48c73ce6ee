//! The emulator's answers to the requests the operator makes besides watching its resources:
//! Leases, TokenReviews, Events, any other kind stored generically, and discovery.

use super::*;

#[tokio::test]
async fn a_lease_is_created_then_renewed_by_patch() {
    let k8s = KubeEmulator::start().await;
    let leases: Api<Lease> = Api::namespaced(k8s.client().await, "lifeguard-system");
    let lease: Lease = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "lifeguard-operator"},
        "spec": {
            "holderIdentity": "operator-0", "leaseDurationSeconds": 15,
            "acquireTime": "2026-01-01T00:00:00.000000Z", "renewTime": "2026-01-01T00:00:00.000000Z",
        },
    }))
    .unwrap();
    let created = leases.create(&PostParams::default(), &lease).await.unwrap();
    assert_eq!(
        created.spec.as_ref().unwrap().holder_identity.as_deref(),
        Some("operator-0")
    );

    let renewed = leases
        .patch(
            "lifeguard-operator",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {
                "holderIdentity": "operator-1",
                "renewTime": "2026-01-01T00:00:10.000000Z",
            }})),
        )
        .await
        .unwrap();
    let spec = leases
        .get("lifeguard-operator")
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("operator-1"));
    assert_eq!(
        spec.lease_duration_seconds,
        Some(15),
        "merge keeps the rest"
    );
    assert_eq!(
        spec.renew_time.map(|t| t.0.to_string()),
        Some("2026-01-01T00:00:10Z".to_owned())
    );
    assert_ne!(renewed.resource_version(), created.resource_version());
}

async fn review(client: &kube::Client, token: &str, audiences: &[&str]) -> Value {
    let reviews: Api<TokenReview> = Api::all(client.clone());
    let request = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_owned()),
            audiences: Some(audiences.iter().map(|a| (*a).to_owned()).collect()),
        },
        ..Default::default()
    };
    let answered = reviews
        .create(&PostParams::default(), &request)
        .await
        .unwrap();
    serde_json::to_value(answered.status.expect("a review has a status")).unwrap()
}

#[tokio::test]
async fn token_reviews_answer_from_the_token_table_and_are_recorded() {
    let k8s = KubeEmulator::start().await;
    let client = k8s.client().await;
    let audience = "lifeguard.dev/operator";
    k8s.add_token(
        "sidecar-token",
        TokenIdentity::service_account("team-a", "reports", "reports-1", "pod-uid-1", &[audience]),
    )
    .await;

    let known = review(&client, "sidecar-token", &[audience]).await;
    assert_eq!(known["authenticated"], true, "{known}");
    assert_eq!(
        known["user"]["username"],
        "system:serviceaccount:team-a:reports"
    );
    assert_eq!(
        known["user"]["extra"]["authentication.kubernetes.io/pod-name"],
        json!(["reports-1"])
    );
    assert_eq!(
        known["user"]["extra"]["authentication.kubernetes.io/pod-uid"],
        json!(["pod-uid-1"])
    );
    assert_eq!(known["audiences"], json!([audience]));
    assert!(
        known["user"]["groups"]
            .as_array()
            .unwrap()
            .contains(&json!("system:serviceaccounts:team-a")),
        "{known}"
    );

    let unknown = review(&client, "forged-token", &[audience]).await;
    assert_eq!(unknown["authenticated"], false, "{unknown}");
    assert!(
        unknown["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{unknown}"
    );
    assert!(
        unknown
            .get("user")
            .is_none_or(|u| u.get("username").is_none()),
        "{unknown}"
    );

    let elsewhere = review(
        &client,
        "sidecar-token",
        &["https://kubernetes.default.svc"],
    )
    .await;
    assert_eq!(elsewhere["authenticated"], false, "{elsewhere}");

    let reviews = k8s.token_reviews().await;
    let asked: Vec<_> = reviews.iter().map(|r| r["spec"]["token"].clone()).collect();
    assert_eq!(asked, ["sidecar-token", "forged-token", "sidecar-token"]);
    let answers: Vec<_> = reviews
        .iter()
        .map(|r| r["status"]["authenticated"].clone())
        .collect();
    assert_eq!(answers, [true, false, false]);

    k8s.remove_token("sidecar-token").await;
    let revoked = review(&client, "sidecar-token", &[audience]).await;
    assert_eq!(revoked["authenticated"], false, "{revoked}");
}

#[tokio::test]
async fn events_are_published_and_a_repeat_patches_the_series() {
    let k8s = KubeEmulator::start().await;
    let client = k8s.client().await;
    let policy = k8s.apply_yaml(&policy_yaml("team-a", "reports")).await;
    let reference = ObjectReference {
        api_version: Some("lifeguard.dev/v1alpha1".into()),
        kind: Some("McpServerPolicy".into()),
        name: Some("reports".into()),
        namespace: Some("team-a".into()),
        uid: policy[0].metadata.uid.clone(),
        ..Default::default()
    };
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "lifeguard-operator".into(),
            instance: Some("operator-0".into()),
        },
    );
    let event = Event {
        type_: EventType::Normal,
        reason: "Compiled".into(),
        note: Some("policy compiled".into()),
        action: "Compile".into(),
        secondary: None,
    };
    recorder.publish(&event, &reference).await.unwrap();
    recorder.publish(&event, &reference).await.unwrap();

    let events: Api<K8sEvent> = Api::namespaced(client.clone(), "team-a");
    let listed = events.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].reason.as_deref(), Some("Compiled"));
    assert_eq!(
        listed[0].regarding.as_ref().unwrap().name.as_deref(),
        Some("reports")
    );
    assert_eq!(
        listed[0].series.as_ref().map(|s| s.count),
        Some(2),
        "{listed:?}"
    );

    // The core v1 Event API takes events too.
    let core: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client, "team-a");
    let created = core
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": "reports.1"},
                "involvedObject": {"kind": "McpServerPolicy", "name": "reports", "namespace": "team-a"},
                "reason": "Compiled", "message": "policy compiled", "type": "Normal",
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    assert!(created.metadata.uid.is_some());
    assert_eq!(
        core.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
}

#[tokio::test]
async fn any_kind_is_stored_generically_and_json_patch_works() {
    let k8s = KubeEmulator::start().await;
    let applied = k8s
        .apply_yaml(
            "apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: team-a}
data: {mode: strict}
---
apiVersion: v1
kind: Secret
metadata: {name: keys, namespace: team-a}
stringData: {key: value}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: reports-ingress, namespace: team-a}
spec:
  podSelector: {matchLabels: {app: reports}}
  policyTypes: [Ingress]
---
apiVersion: example.com/v1
kind: Widget
metadata: {name: gadget, namespace: team-a}
spec: {size: 3}
",
        )
        .await;
    let kinds: Vec<_> = applied
        .iter()
        .map(|o| o.types.as_ref().unwrap().kind.clone())
        .collect();
    assert_eq!(kinds, ["ConfigMap", "Secret", "NetworkPolicy", "Widget"]);
    assert_eq!(applied[3].data["spec"]["size"], 3);

    let client = k8s.client().await;
    let netpols: Api<NetworkPolicy> = Api::namespaced(client.clone(), "team-a");
    let netpol = netpols.get("reports-ingress").await.unwrap();
    assert_eq!(
        netpol.spec.unwrap().policy_types,
        Some(vec!["Ingress".to_owned()])
    );

    // Re-applying with a field left out removes it (the same field manager owned it).
    k8s.apply_yaml(
        "apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: team-a}
data: {other: x}
",
    )
    .await;
    let configmaps: Api<ConfigMap> = Api::namespaced(client, "team-a");
    let data = configmaps.get("settings").await.unwrap().data.unwrap();
    assert_eq!(data.get("mode"), None, "{data:?}");
    assert_eq!(data.get("other").map(String::as_str), Some("x"));

    // A JSON patch (RFC 6902), sent raw: kube's Patch::Json needs a feature the crate leaves off.
    let response = reqwest::Client::new()
        .patch(format!(
            "{}/api/v1/namespaces/team-a/configmaps/settings",
            k8s.url()
        ))
        .header("Content-Type", "application/json-patch+json")
        .body(r#"[{"op": "add", "path": "/data/added", "value": "y"}]"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let data = configmaps.get("settings").await.unwrap().data.unwrap();
    assert_eq!(data.get("added").map(String::as_str), Some("y"));
}

#[tokio::test]
async fn discovery_lists_the_lifeguard_kinds_and_the_version() {
    let k8s = KubeEmulator::start().await;
    let client = k8s.client().await;
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(
        (version.major.as_str(), version.minor.as_str()),
        ("1", "33")
    );

    for discovery in [
        kube::Discovery::new(client.clone()).run().await.unwrap(),
        kube::Discovery::new(client.clone())
            .run_aggregated()
            .await
            .unwrap(),
    ] {
        let group = discovery
            .get("lifeguard.dev")
            .expect("lifeguard.dev discovered");
        let kinds: Vec<_> = group
            .recommended_resources()
            .into_iter()
            .map(|(ar, caps)| (ar.kind, caps.scope == kube::discovery::Scope::Namespaced))
            .collect();
        for expected in [
            ("McpServerPolicy".to_owned(), true),
            ("CapabilityException".to_owned(), true),
            ("PrincipalRevocation".to_owned(), false),
        ] {
            assert!(kinds.contains(&expected), "{expected:?} in {kinds:?}");
        }
        let (_, caps) = group.recommended_kind("McpServerPolicy").unwrap();
        assert!(
            caps.subresources
                .iter()
                .any(|(ar, _)| ar.plural == "status"),
            "{caps:?}"
        );
        assert!(discovery.has_group("coordination.k8s.io"));
        assert!(discovery.has_group("events.k8s.io"));
    }
}
