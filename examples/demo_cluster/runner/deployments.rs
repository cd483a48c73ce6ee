//! The Deployment controller and scheduler part of the pod runner: each Deployment gets
//! `replicas` pods of its current template, created through the API (so admission, and with it
//! the Lifeguard webhook, sees every one) and bound to the demo node. Pods of an older template
//! are deleted and replaced (no ReplicaSets, no rolling surge: the demo's stand-in, not the real
//! controller). A refused pod is retried; the refusal shows in the Deployment's
//! `ReplicaFailure` condition, where `kubectl describe`/`get -o yaml` find it.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use sha2::Digest;

use super::Node;

pub async fn run(node: Arc<Node>) {
    loop {
        if let Err(e) = reconcile_all(&node).await {
            eprintln!("pod runner: deployments: {e}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn reconcile_all(node: &Node) -> Result<(), kube::Error> {
    let deployments = Api::<Deployment>::all(node.client.clone())
        .list(&ListParams::default())
        .await?;
    let pods = Api::<Pod>::all(node.client.clone())
        .list(&ListParams::default())
        .await?;
    for deployment in deployments {
        let deployment = serde_json::to_value(&deployment).expect("a Deployment serializes");
        let owned: Vec<Value> = pods
            .iter()
            .filter(|p| {
                p.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| Some(o.uid.as_str()) == deployment["metadata"]["uid"].as_str())
            })
            .map(|p| serde_json::to_value(p).expect("a Pod serializes"))
            .collect();
        reconcile(node, &deployment, &owned).await?;
    }
    Ok(())
}

/// A short digest of the pod template, as the `pod-template-hash` label.
fn template_hash(template: &Value) -> String {
    let digest = sha2::Sha256::digest(template.to_string().as_bytes());
    hex::encode(&digest[..5])
}

async fn reconcile(node: &Node, deployment: &Value, owned: &[Value]) -> Result<(), kube::Error> {
    let namespace = deployment["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default");
    let name = deployment["metadata"]["name"].as_str().unwrap_or_default();
    let wanted = deployment["spec"]["replicas"].as_u64().unwrap_or(1) as usize;
    let template = &deployment["spec"]["template"];
    let hash = template_hash(template);
    let pods: Api<Pod> = Api::namespaced(node.client.clone(), namespace);

    let (current, outdated): (Vec<&Value>, Vec<&Value>) = owned
        .iter()
        .partition(|p| p["metadata"]["labels"]["pod-template-hash"] == hash.as_str());
    for pod in outdated.iter().chain(current.iter().skip(wanted)) {
        if let Some(pod_name) = pod["metadata"]["name"].as_str() {
            let _ = pods.delete(pod_name, &DeleteParams::default()).await;
        }
    }

    let mut failure = None;
    for _ in current.len()..wanted {
        let mut suffix = [0u8; 3];
        let _ = getrandom::fill(&mut suffix);
        let pod_name = format!("{name}-{hash}-{}", hex::encode(suffix));
        let mut metadata = template["metadata"].clone();
        if !metadata.is_object() {
            metadata = json!({});
        }
        metadata["name"] = json!(pod_name);
        metadata["namespace"] = json!(namespace);
        metadata["labels"]["pod-template-hash"] = json!(hash);
        metadata["ownerReferences"] = json!([{
            "apiVersion": "apps/v1", "kind": "Deployment", "name": name,
            "uid": deployment["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true,
        }]);
        let mut spec = template["spec"].clone();
        spec["nodeName"] = json!(node.name);
        let pod: Pod = match serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec,
        })) {
            Ok(pod) => pod,
            Err(e) => {
                failure = Some(format!("the pod template is not a valid Pod: {e}"));
                break;
            }
        };
        if let Err(e) = pods.create(&PostParams::default(), &pod).await {
            failure = Some(match e {
                kube::Error::Api(status) => status.message,
                other => other.to_string(),
            });
            break;
        }
    }

    // Status from the pods as they are now (the next round sees the ones just created).
    let ready = current
        .iter()
        .take(wanted)
        .filter(|p| {
            p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
        .count();
    let mut conditions = vec![json!({
        "type": "Available",
        "status": if ready >= wanted { "True" } else { "False" },
        "reason": if ready >= wanted { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" },
    })];
    if let Some(message) = &failure {
        conditions.push(json!({"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": message}));
    }
    let status = json!({"status": {
        "observedGeneration": deployment["metadata"]["generation"],
        "replicas": current.len().min(wanted),
        "updatedReplicas": current.len().min(wanted),
        "readyReplicas": ready,
        "availableReplicas": ready,
        "conditions": conditions,
    }});
    if deployment["status"] != status["status"] {
        Api::<Deployment>::namespaced(node.client.clone(), namespace)
            .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
            .await?;
    }
    Ok(())
}
