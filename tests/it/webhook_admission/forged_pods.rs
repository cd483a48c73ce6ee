//! Pods that only look injected, share a process namespace, or point the sidecar at a decoy
//! port (issue 28, items 2, 3 and 11): the webhook proves injection instead of believing marks.

use super::*;

/// Issue 28, item 2: Lifeguard's own marks prove nothing. A pod that arrives with the status
/// annotation (any value), or a container, init container, volume or volume mount named like
/// the injected ones, but without exactly the sidecar this webhook injects, is not injected: a
/// required policy refuses it, another policy injects it (status annotation only) or reports it.
#[tokio::test]
async fn lifeguards_own_marks_do_not_dodge_a_required_policy() {
    let emulator = cluster().await;
    let webhook = Webhook::start(&emulator, &config_yaml("")).await;
    let marked = |edit: &dyn Fn(&mut Value)| {
        let mut pod = mcp_pod(json!({"app": "billing"}), json!({}));
        edit(&mut pod);
        pod
    };
    let decoy = json!({"name": "lifeguard-sidecar", "image": "registry.example.com/pause:1"});
    let forgeries = [
        (
            "an empty status annotation",
            marked(&|p| p["metadata"]["annotations"]["lifeguard.dev/status"] = json!("")),
        ),
        (
            "a copied status annotation",
            marked(&|p| {
                p["metadata"]["annotations"]["lifeguard.dev/status"] = json!(
                    "{\"version\":\"0.1.0\",\"policy\":\"billing\",\"native\":true,\"port\":\"mcp\"}"
                )
            }),
        ),
        (
            "a container named lifeguard-sidecar",
            marked(&|p| {
                p["spec"]["containers"]
                    .as_array_mut()
                    .unwrap()
                    .push(decoy.clone())
            }),
        ),
        (
            "an init container named lifeguard-sidecar",
            marked(&|p| p["spec"]["initContainers"] = json!([decoy.clone()])),
        ),
        (
            "a volume named lifeguard-data",
            marked(&|p| p["spec"]["volumes"] = json!([{"name": "lifeguard-data", "emptyDir": {}}])),
        ),
        (
            "another container told the upstream port",
            marked(&|p| {
                p["spec"]["containers"].as_array_mut().unwrap().push(json!({
                    "name": "decoy", "image": "registry.example.com/pause:1",
                    "env": [{"name": "LIFEGUARD_UPSTREAM_PORT", "value": "15080"}],
                }))
            }),
        ),
        (
            "a mount of the sidecar's token volume",
            marked(&|p| {
                p["spec"]["containers"][0]["volumeMounts"] =
                    json!([{"name": "lifeguard-token", "mountPath": "/stolen"}])
            }),
        ),
    ];
    for (what, pod) in &forgeries {
        let response = webhook
            .review("/inject", &pod_review("u", "team-a", pod))
            .await;
        if response["allowed"] == true {
            // Only a pod that now really carries the sidecar may pass.
            let injected = apply_patch(pod, &patch_of(&response));
            let sidecar = injected["spec"]["initContainers"]
                .as_array()
                .and_then(|l| l.iter().find(|c| c["name"] == "lifeguard-sidecar"))
                .unwrap_or_else(|| panic!("{what}: admitted without a sidecar: {response}"));
            assert_eq!(
                sidecar["image"], "ghcr.io/lifeguard-dev/lifeguard:test",
                "{what}: {response}"
            );
            continue;
        }
        let message = response["status"]["message"].as_str().unwrap();
        assert!(
            message.contains("ForeignSidecar") && message.contains("billing"),
            "{what}: {message}"
        );
    }
    assert!(
        webhook
            .metric(
                "lifeguard_webhook_injections_total{outcome=\"denied\",reason=\"ForeignSidecar\"}"
            )
            .await
            >= Some(4.0)
    );

    // Under a policy that does not require the sidecar: a status annotation alone is
    // overwritten by a real injection; a decoy sidecar is reported and loses the annotation.
    let mut claimed = mcp_pod(
        json!({"app": "reports"}),
        json!({"lifeguard.dev/status": ""}),
    );
    let response = webhook
        .review("/inject", &pod_review("u", "team-a", &claimed))
        .await;
    let injected = apply_patch(&claimed, &patch_of(&response));
    assert_eq!(
        injected["spec"]["initContainers"][0]["name"], "lifeguard-sidecar",
        "{response}"
    );
    claimed["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(decoy);
    let response = webhook
        .review("/inject", &pod_review("u", "team-a", &claimed))
        .await;
    assert_eq!(response["allowed"], true, "{response}");
    let patched = apply_patch(&claimed, &patch_of(&response));
    let annotations = &patched["metadata"]["annotations"];
    assert_eq!(
        annotations["lifeguard.dev/injection-skipped"], "ForeignSidecar",
        "{response}"
    );
    assert!(
        annotations.get("lifeguard.dev/status").is_none(),
        "{annotations}"
    );
    assert!(
        response["warnings"][0]
            .as_str()
            .unwrap()
            .contains("ForeignSidecar")
    );

    // The webhook's own injection, sent again (reinvocation, a copied pod), stays a no-op;
    // the same pod with the sidecar's image swapped is not.
    let genuine = apply_patch(
        &mcp_pod(json!({"app": "billing"}), json!({})),
        &patch_of(
            &webhook
                .review(
                    "/inject",
                    &pod_review(
                        "u",
                        "team-a",
                        &mcp_pod(json!({"app": "billing"}), json!({})),
                    ),
                )
                .await,
        ),
    );
    let again = webhook
        .review("/inject", &pod_review("u", "team-a", &genuine))
        .await;
    assert_eq!(again["allowed"], true, "{again}");
    assert_eq!(patch_of(&again), json!([]));
    let mut swapped = genuine.clone();
    swapped["spec"]["initContainers"][0]["image"] = json!("registry.example.com/pause:1");
    let response = webhook
        .review("/inject", &pod_review("u", "team-a", &swapped))
        .await;
    assert_eq!(response["allowed"], false, "{response}");
}

/// Issue 28, item 3: containers sharing a process namespace with the sidecar could read its
/// token and ledger through /proc/<pid>/root, so such pods get no sidecar (reported) and a
/// required policy refuses them.
#[tokio::test]
async fn pods_sharing_a_process_namespace_get_no_sidecar() {
    let emulator = cluster().await;
    let webhook = Webhook::start(&emulator, &config_yaml("")).await;
    for (field, app, allowed) in [
        ("shareProcessNamespace", "reports", true),
        ("shareProcessNamespace", "billing", false),
        ("hostPID", "billing", false),
    ] {
        let mut pod = mcp_pod(json!({"app": app}), json!({}));
        pod["spec"][field] = json!(true);
        let response = webhook
            .review("/inject", &pod_review("u", "team-a", &pod))
            .await;
        assert_eq!(response["allowed"], allowed, "{field} {app}: {response}");
        if allowed {
            let patched = apply_patch(&pod, &patch_of(&response));
            assert!(
                patched["spec"].get("initContainers").is_none(),
                "{response}"
            );
            assert_eq!(
                patched["metadata"]["annotations"]["lifeguard.dev/injection-skipped"],
                "SharedProcessNamespace"
            );
            assert!(
                response["warnings"][0]
                    .as_str()
                    .unwrap()
                    .contains("SharedProcessNamespace")
            );
        } else {
            let message = response["status"]["message"].as_str().unwrap();
            assert!(message.contains("SharedProcessNamespace"), "{message}");
        }
    }
    assert_eq!(
        webhook
            .metric(
                "lifeguard_webhook_injections_total{outcome=\"skipped\",reason=\"SharedProcessNamespace\"}"
            )
            .await,
        Some(1.0)
    );
}

/// One change to a pod.
type PodEdit<'a> = Box<dyn Fn(&mut Value) + 'a>;

/// Issue 28, item 11: the port the sidecar takes over must be the MCP server's. An annotation
/// naming a decoy container's port, a second container declaring `mcp`, or a hostPort on the
/// MCP port would leave the real port exposed: refused by a required policy, reported otherwise.
#[tokio::test]
async fn the_port_taken_over_must_be_the_mcp_servers() {
    let emulator = cluster().await;
    let webhook = Webhook::start(&emulator, &config_yaml("")).await;
    let decoy = json!({"name": "decoy", "image": "registry.example.com/pause:1",
        "ports": [{"name": "metrics", "containerPort": 9100, "protocol": "TCP"}]});
    let second_mcp = json!({"name": "decoy", "image": "registry.example.com/pause:1",
        "ports": [{"name": "mcp", "containerPort": 9000, "protocol": "TCP"}]});
    let shapes: [(&str, PodEdit<'_>); 3] = [
        (
            "lifeguard.dev/port names a decoy's port",
            Box::new(|p| {
                p["metadata"]["annotations"]["lifeguard.dev/port"] = json!("metrics");
                p["spec"]["containers"]
                    .as_array_mut()
                    .unwrap()
                    .push(decoy.clone());
            }),
        ),
        (
            "two containers declare mcp",
            Box::new(|p| {
                p["spec"]["containers"]
                    .as_array_mut()
                    .unwrap()
                    .insert(0, second_mcp.clone())
            }),
        ),
        (
            "the MCP port has a hostPort",
            Box::new(|p| p["spec"]["containers"][0]["ports"][0]["hostPort"] = json!(8080)),
        ),
    ];
    for (what, shape) in &shapes {
        for app in ["billing", "reports"] {
            let mut pod = mcp_pod(json!({"app": app}), json!({}));
            shape(&mut pod);
            let response = webhook
                .review("/inject", &pod_review("u", "team-a", &pod))
                .await;
            if app == "billing" {
                assert_eq!(response["allowed"], false, "{what}: {response}");
                let message = response["status"]["message"].as_str().unwrap();
                assert!(message.contains("AmbiguousPort"), "{what}: {message}");
            } else {
                assert_eq!(response["allowed"], true, "{what}: {response}");
                let patched = apply_patch(&pod, &patch_of(&response));
                assert!(
                    patched["spec"].get("initContainers").is_none(),
                    "{what}: no sidecar on a decoy port: {response}"
                );
                assert_eq!(
                    patched["metadata"]["annotations"]["lifeguard.dev/injection-skipped"],
                    "AmbiguousPort",
                    "{what}"
                );
            }
        }
    }
    // The annotation still renames the port when no container declares `mcp`.
    let mut renamed = mcp_pod(
        json!({"app": "billing"}),
        json!({"lifeguard.dev/port": "http"}),
    );
    renamed["spec"]["containers"][0]["ports"][0]["name"] = json!("http");
    renamed["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"] = json!("http");
    let response = webhook
        .review("/inject", &pod_review("u", "team-a", &renamed))
        .await;
    let injected = apply_patch(&renamed, &patch_of(&response));
    assert_eq!(
        injected["spec"]["initContainers"][0]["ports"][0],
        json!({"name": "http", "containerPort": 8080, "protocol": "TCP"}),
        "{response}"
    );
}
