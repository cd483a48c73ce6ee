//! The Kubernetes API emulator (`tests/kube_emulator/`, on PyPI `kmock`) serves what the
//! operator needs, all through kube-rs: typed `Api` calls, watchers, reflectors, a `Controller`
//! with an owned kind, server-side apply of status, TokenReviews, Leases, Events and discovery.
//! Every check here is one a broken emulator fails.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, ListParams, PartialObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::wait::await_condition;
use kube::runtime::watcher::{self, watcher};
use kube::{Resource, ResourceExt};
use lifeguard::api::{McpServerPolicy, PrincipalRevocation};
use serde_json::{Value, json};
use support::kube::{KubeEmulator, TokenIdentity};

const WAIT: Duration = Duration::from_secs(10);

mod requests;

fn policy_yaml(namespace: &str, name: &str) -> String {
    format!(
        "apiVersion: lifeguard.dev/v1alpha1
kind: McpServerPolicy
metadata:
  name: {name}
  namespace: {namespace}
spec:
  selector:
    matchLabels: {{app: reports}}
  resource: https://reports.example.com/mcp
  identity:
    issuers:
      - issuer: https://idp.example.com
        jwksUri: https://idp.example.com/jwks.json
"
    )
}

/// What a watcher reported, in order: `apply NAME GENERATION RV` / `delete NAME RV`.
type Seen = Arc<Mutex<Vec<String>>>;

/// Runs a watcher over `api` in the background; returns what it reports (its initial listing
/// only as `init-done`).
fn record_watch<K>(api: Api<K>, config: watcher::Config) -> Seen
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let seen: Seen = Arc::default();
    let sink = seen.clone();
    tokio::spawn(async move {
        let mut events = watcher(api, config).boxed();
        while let Some(event) = events.next().await {
            let line = match event {
                Ok(watcher::Event::Apply(o)) => format!(
                    "apply {} {} {}",
                    o.name_any(),
                    o.meta().generation.unwrap_or_default(),
                    o.resource_version().unwrap_or_default()
                ),
                Ok(watcher::Event::Delete(o)) => {
                    format!(
                        "delete {} {}",
                        o.name_any(),
                        o.resource_version().unwrap_or_default()
                    )
                }
                Ok(watcher::Event::InitDone) => "init-done".to_owned(),
                Ok(_) => continue,
                Err(e) => format!("error {e}"),
            };
            sink.lock().unwrap().push(line);
        }
    });
    seen
}

/// Waits until `seen` has a line equal to `line`; returns everything seen by then.
async fn saw(seen: &Seen, line: &str) -> Vec<String> {
    saw_where(seen, line, |l| l == line).await
}

/// Waits until `seen` has a line that passes `check`; returns everything seen by then.
async fn saw_where(seen: &Seen, what: &str, check: impl Fn(&str) -> bool) -> Vec<String> {
    support::eventually(WAIT, async || {
        let lines = seen.lock().unwrap().clone();
        lines.iter().any(|l| check(l)).then_some(lines)
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "the watcher never reported `{what}`; it reported {:?}",
            seen.lock().unwrap()
        )
    })
}

fn errors(seen: &Seen) -> Vec<String> {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|l| l.starts_with("error"))
        .cloned()
        .collect()
}

#[tokio::test]
async fn a_policy_is_reflected_its_spec_bumps_generation_and_status_apply_does_not() {
    let k8s = KubeEmulator::start().await;
    let client = k8s.client().await;
    let policies: Api<McpServerPolicy> = Api::namespaced(client.clone(), "team-a");

    let (store, writer) = reflector::store();
    let reflected = reflector::reflector(writer, watcher(policies.clone(), Default::default()))
        .applied_objects()
        .for_each(|_| async {});
    tokio::spawn(reflected);
    let seen = record_watch(policies.clone(), Default::default());
    saw(&seen, "init-done").await;

    let applied = k8s.apply_yaml(&policy_yaml("team-a", "reports")).await;
    assert_eq!(applied.len(), 1);
    let created = policies.get("reports").await.unwrap();
    let meta = &created.metadata;
    assert_eq!(meta.generation, Some(1), "{meta:?}");
    assert!(
        meta.uid.as_deref().is_some_and(|u| !u.is_empty()),
        "{meta:?}"
    );
    assert!(meta.creation_timestamp.is_some(), "{meta:?}");
    let rv1 = created.resource_version().unwrap();
    saw(&seen, &format!("apply reports 1 {rv1}")).await;

    let key = ObjectRef::new("reports").within("team-a");
    let in_store = support::eventually(WAIT, async || store.get(&key)).await;
    let in_store = in_store.expect("the reflector store gets the policy");
    assert_eq!(in_store.spec.resource, "https://reports.example.com/mcp");

    // A spec change bumps the generation; the watcher and the reflector see it.
    let patched = policies
        .patch(
            "reports",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"resource": "https://reports.example.com/v2/mcp"}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.metadata.generation, Some(2));
    let rv2 = patched.resource_version().unwrap();
    assert!(
        rv2.parse::<u64>().unwrap() > rv1.parse::<u64>().unwrap(),
        "{rv1} -> {rv2}"
    );
    saw(&seen, &format!("apply reports 2 {rv2}")).await;
    let updated = support::eventually(WAIT, async || {
        store
            .get(&key)
            .filter(|p| p.spec.resource.ends_with("/v2/mcp"))
    })
    .await;
    assert!(updated.is_some(), "the reflector store follows the patch");

    // Status through server-side apply on the status subresource, as the operator writes it.
    let status = json!({
        "apiVersion": "lifeguard.dev/v1alpha1",
        "kind": "McpServerPolicy",
        "status": {
            "observedGeneration": 2,
            "matchedPods": 3,
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "Compiled", "message": "ok",
                "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 2,
            }],
        },
    });
    let operator = PatchParams::apply("lifeguard-operator").force();
    let with_status = policies
        .patch_status("reports", &operator, &Patch::Apply(&status))
        .await
        .unwrap();
    let written = with_status.status.as_ref().expect("status written");
    assert_eq!(written.matched_pods, Some(3));
    assert_eq!(written.conditions[0].type_, "Ready");
    assert_eq!(
        with_status.metadata.generation,
        Some(2),
        "status is not spec"
    );
    assert_eq!(
        with_status.spec.resource, "https://reports.example.com/v2/mcp",
        "a status write leaves the spec alone"
    );
    let rv3 = with_status.resource_version().unwrap();
    assert_ne!(rv3, rv2);
    saw(&seen, &format!("apply reports 2 {rv3}")).await;
    assert_eq!(
        policies.get_status("reports").await.unwrap().status,
        with_status.status
    );

    // The same apply again changes nothing: same resourceVersion and no watch event. A label
    // change written after it is the very next event the watcher reports.
    let again = policies
        .patch_status("reports", &operator, &Patch::Apply(&status))
        .await
        .unwrap();
    assert_eq!(again.resource_version().unwrap(), rv3);
    // Writing status through the object itself is ignored (status subresource), so no event
    // either.
    let ignored = policies
        .patch(
            "reports",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"matchedPods": 99}})),
        )
        .await
        .unwrap();
    assert_eq!(ignored.resource_version().unwrap(), rv3);
    assert_eq!(ignored.status.unwrap().matched_pods, Some(3));
    let labelled = policies
        .patch(
            "reports",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        labelled.metadata.generation,
        Some(2),
        "metadata is not spec"
    );
    let rv4 = labelled.resource_version().unwrap();
    let lines = saw(&seen, &format!("apply reports 2 {rv4}")).await;
    let after_status: Vec<_> = lines
        .iter()
        .skip_while(|l| **l != format!("apply reports 2 {rv3}"))
        .collect();
    assert_eq!(
        after_status,
        [
            &format!("apply reports 2 {rv3}"),
            &format!("apply reports 2 {rv4}")
        ],
        "no event between the status write and the label write: {lines:?}"
    );

    // A later apply by the same manager that leaves a field out removes it.
    let mut smaller = status.clone();
    smaller["status"]
        .as_object_mut()
        .unwrap()
        .remove("matchedPods");
    let shrunk = policies
        .patch_status("reports", &operator, &Patch::Apply(&smaller))
        .await
        .unwrap();
    let shrunk = shrunk.status.unwrap();
    assert_eq!(shrunk.matched_pods, None);
    assert_eq!(shrunk.observed_generation, Some(2));
    assert!(errors(&seen).is_empty(), "{:?}", errors(&seen));
}

#[tokio::test]
async fn a_cluster_scoped_revocation_is_created_read_and_deleted() {
    let k8s = KubeEmulator::start().await;
    let revocations: Api<PrincipalRevocation> = Api::all(k8s.client().await);
    let revocation: PrincipalRevocation = serde_json::from_value(json!({
        "apiVersion": "lifeguard.dev/v1alpha1",
        "kind": "PrincipalRevocation",
        "metadata": {"name": "alice-left"},
        "spec": {
            "issuer": "https://idp.example.com", "subject": "alice",
            "revokedBefore": "2026-01-01T00:00:00Z", "reason": "accountDisabled",
            "source": {"kind": "manual"},
        },
    }))
    .unwrap();

    let created = revocations
        .create(&PostParams::default(), &revocation)
        .await
        .unwrap();
    assert_eq!(created.metadata.namespace, None, "cluster-scoped");
    assert_eq!(created.metadata.generation, Some(1));
    let read = revocations.get("alice-left").await.unwrap();
    assert_eq!(read.spec.subject.as_deref(), Some("alice"));
    assert_eq!(read.metadata.uid, created.metadata.uid);
    assert_eq!(
        revocations
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );

    let duplicate = revocations
        .create(&PostParams::default(), &revocation)
        .await
        .unwrap_err();
    match duplicate {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 409, "{status:?}");
            assert_eq!(status.reason, "AlreadyExists", "{status:?}");
            assert!(status.is_already_exists());
        }
        other => panic!("expected a 409 Status: {other:?}"),
    }

    revocations
        .delete("alice-left", &DeleteParams::default())
        .await
        .unwrap();
    match revocations.get("alice-left").await.unwrap_err() {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 404, "{status:?}");
            assert_eq!(status.reason, "NotFound", "{status:?}");
            assert!(status.is_not_found());
        }
        other => panic!("expected a 404 Status: {other:?}"),
    }
    assert_eq!(revocations.get_opt("alice-left").await.unwrap(), None);
    assert!(
        revocations
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

#[tokio::test]
async fn pods_are_listed_and_watched_across_namespaces_and_watches_resume() {
    let k8s = KubeEmulator::start().await;
    let client = k8s.client().await;
    let all: Api<Pod> = Api::all(client.clone());
    // A one-second server-side watch timeout: the watcher has to resume from its last
    // resourceVersion, without losing or repeating events.
    let seen = record_watch(all.clone(), watcher::Config::default().timeout(1));
    saw(&seen, "init-done").await;
    let metadata_seen: Seen = Arc::default();
    let sink = metadata_seen.clone();
    // Metadata-only requests (`as=PartialObjectMetadata`), as operators watch pods.
    let metadata_pods: Api<PartialObjectMeta<Pod>> = Api::namespaced(client.clone(), "ns-b");
    tokio::spawn(async move {
        let mut events = watcher(metadata_pods, Default::default())
            .applied_objects()
            .boxed();
        while let Some(Ok(meta)) = events.next().await {
            sink.lock()
                .unwrap()
                .push(format!("apply {}", meta.name_any()));
        }
    });

    let labels = [("app", "reports")];
    let uid_a = k8s
        .create_pod("ns-a", "reports-1", &labels, "reports")
        .await;
    let uid_b = k8s
        .create_pod("ns-b", "reports-2", &labels, "reports")
        .await;
    assert_ne!(uid_a, uid_b);
    let listed = all.list(&ListParams::default()).await.unwrap();
    let names: Vec<_> = listed.items.iter().map(|p| p.name_any()).collect();
    assert_eq!(names, ["reports-1", "reports-2"]);
    assert_eq!(
        listed.items[0].metadata.uid.as_deref(),
        Some(uid_a.as_str())
    );
    assert_eq!(
        listed.items[1]
            .spec
            .as_ref()
            .unwrap()
            .service_account_name
            .as_deref(),
        Some("reports")
    );
    let in_b: Api<Pod> = Api::namespaced(client.clone(), "ns-b");
    let only_b: Vec<_> = in_b
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    assert_eq!(only_b, ["reports-2"]);
    saw(&metadata_seen, "apply reports-2").await;

    tokio::time::sleep(Duration::from_millis(1500)).await; // past the watch timeout
    k8s.create_pod("ns-b", "reports-3", &labels, "reports")
        .await;
    k8s.delete_pod("ns-a", "reports-1").await;
    let lines = saw_where(&seen, "delete reports-1", |l| {
        l.starts_with("delete reports-1 ")
    })
    .await;
    let applies: Vec<_> = lines
        .iter()
        .filter(|l| l.starts_with("apply"))
        .map(|l| l.rsplit_once(' ').unwrap())
        .collect();
    let names: Vec<_> = applies.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        names,
        [
            "apply reports-1 1",
            "apply reports-2 1",
            "apply reports-3 1"
        ],
        "every pod once, in order: {lines:?}"
    );
    let versions: Vec<u64> = applies.iter().map(|(_, rv)| rv.parse().unwrap()).collect();
    assert!(
        versions.is_sorted() && versions[0] < versions[2],
        "{lines:?}"
    );
    assert!(errors(&seen).is_empty(), "{:?}", errors(&seen));
    assert!(
        !metadata_seen
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("reports-1")),
        "the namespaced metadata watcher sees only ns-b: {:?}",
        metadata_seen.lock().unwrap()
    );
    // The pod watcher re-watched after its one-second timeout; the metadata watcher listed and
    // watched (the typed list above has no `limit`) asking for metadata only.
    let pod_watches = |r: &&Value| r["path"] == "/api/v1/pods" && r["query"]["watch"] == "true";
    let metadata_watcher = |r: &&Value| {
        r["path"] == "/api/v1/namespaces/ns-b/pods"
            && (r["query"].get("limit").is_some() || r["query"]["watch"] == "true")
    };
    let requests = support::eventually(WAIT, async || {
        let requests = k8s.requests().await;
        let rewatched = requests.iter().filter(pod_watches).count() >= 2;
        let both = requests.iter().filter(metadata_watcher).count() == 2;
        (rewatched && both).then_some(requests)
    })
    .await;
    let Some(requests) = requests else {
        panic!("no re-watch or metadata watch: {:?}", k8s.requests().await)
    };
    let metadata_requests: Vec<_> = requests.iter().filter(metadata_watcher).collect();
    assert!(
        metadata_requests.iter().all(|r| r["accept"]
            .as_str()
            .unwrap()
            .contains("as=PartialObjectMetadata")),
        "{metadata_requests:?}"
    );
    let listed: Value = reqwest::Client::new()
        .get(format!("{}/api/v1/namespaces/ns-b/pods", k8s.url()))
        .header(
            "Accept",
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["kind"], "PartialObjectMetadataList");
    assert_eq!(listed["items"][0]["kind"], "PartialObjectMetadata");
    assert!(listed["items"][0].get("spec").is_none(), "{listed}");
}

/// The operator's shape: a `Controller` over policies that owns NetworkPolicies and writes
/// status; an owned object deleted behind its back is recreated.
#[tokio::test]
async fn a_controller_reconciles_owned_objects_and_writes_status() {
    let k8s = KubeEmulator::start().await;
    let client = k8s.client().await;
    let policies: Api<McpServerPolicy> = Api::all(client.clone());
    let netpols: Api<NetworkPolicy> = Api::all(client.clone());

    struct Context {
        client: kube::Client,
        reconciles: Mutex<u32>,
    }
    async fn reconcile(
        policy: Arc<McpServerPolicy>,
        ctx: Arc<Context>,
    ) -> Result<Action, kube::Error> {
        *ctx.reconciles.lock().unwrap() += 1;
        let namespace = policy.namespace().unwrap();
        let name = policy.name_any();
        let owner = policy.controller_owner_ref(&()).unwrap();
        let netpol = json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": format!("{name}-sidecars"), "ownerReferences": [owner]},
            "spec": {"podSelector": {"matchLabels": {"app": "reports"}}, "policyTypes": ["Ingress"]},
        });
        let apply = PatchParams::apply("lifeguard-operator").force();
        Api::<NetworkPolicy>::namespaced(ctx.client.clone(), &namespace)
            .patch(&format!("{name}-sidecars"), &apply, &Patch::Apply(&netpol))
            .await?;
        let status = json!({
            "apiVersion": "lifeguard.dev/v1alpha1",
            "kind": "McpServerPolicy",
            "status": {"observedGeneration": policy.metadata.generation},
        });
        Api::<McpServerPolicy>::namespaced(ctx.client.clone(), &namespace)
            .patch_status(&name, &apply, &Patch::Apply(&status))
            .await?;
        Ok(Action::await_change())
    }
    fn error_policy(_: Arc<McpServerPolicy>, _: &kube::Error, _: Arc<Context>) -> Action {
        Action::requeue(Duration::from_millis(200))
    }
    let context = Arc::new(Context {
        client: client.clone(),
        reconciles: Mutex::new(0),
    });
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = errors.clone();
    tokio::spawn(
        Controller::new(policies.clone(), Default::default())
            .owns(netpols.clone(), Default::default())
            .run(reconcile, error_policy, context.clone())
            .for_each(move |result| {
                if let Err(e) = result {
                    sink.lock().unwrap().push(e.to_string());
                }
                async {}
            }),
    );

    k8s.apply_yaml(&policy_yaml("team-a", "reports")).await;
    let in_team: Api<McpServerPolicy> = Api::namespaced(client.clone(), "team-a");
    let observed = |generation: i64| {
        let in_team = in_team.clone();
        async move {
            support::eventually(WAIT, async || {
                let policy = in_team.get("reports").await.ok()?;
                let status = policy.status?;
                (status.observed_generation == Some(generation)).then_some(())
            })
            .await
        }
    };
    assert!(
        observed(1).await.is_some(),
        "errors: {:?}",
        errors.lock().unwrap()
    );
    let owned = Api::<NetworkPolicy>::namespaced(client.clone(), "team-a");
    let netpol = owned.get("reports-sidecars").await.unwrap();
    let owner = &netpol.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(owner.kind, "McpServerPolicy");

    in_team
        .patch(
            "reports",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"resource": "https://reports.example.com/v2/mcp"}})),
        )
        .await
        .unwrap();
    assert!(
        observed(2).await.is_some(),
        "errors: {:?}",
        errors.lock().unwrap()
    );

    let before = *context.reconciles.lock().unwrap();
    owned
        .delete("reports-sidecars", &DeleteParams::default())
        .await
        .unwrap();
    let recreated = support::eventually(WAIT, async || {
        owned.get_opt("reports-sidecars").await.ok().flatten()
    })
    .await;
    assert!(recreated.is_some(), "the owned NetworkPolicy is recreated");
    assert!(*context.reconciles.lock().unwrap() > before);
    assert!(
        errors.lock().unwrap().is_empty(),
        "{:?}",
        errors.lock().unwrap()
    );
}

#[tokio::test]
async fn streaming_lists_and_waits_for_one_object_work() {
    let k8s = KubeEmulator::start().await;
    let leases: Api<Lease> = Api::namespaced(k8s.client().await, "lifeguard-system");
    // `sendInitialEvents`: the initial objects, then a bookmark that ends the initial events.
    let seen = record_watch(leases.clone(), watcher::Config::default().streaming_lists());
    saw(&seen, "init-done").await;
    // `await_condition` watches one object by `fieldSelector=metadata.name=…`.
    let waiting = tokio::spawn(await_condition(
        leases.clone(),
        "second",
        |lease: Option<&Lease>| lease.is_some(),
    ));
    for name in ["first", "second"] {
        let lease: Lease =
            serde_json::from_value(json!({"metadata": {"name": name}, "spec": {}})).unwrap();
        leases.create(&PostParams::default(), &lease).await.unwrap();
    }
    let found = tokio::time::timeout(WAIT, waiting).await.unwrap().unwrap();
    assert_eq!(
        found.unwrap().unwrap().metadata.name.as_deref(),
        Some("second")
    );
    saw_where(&seen, "apply second", |l| l.starts_with("apply second ")).await;
    assert!(errors(&seen).is_empty(), "{:?}", errors(&seen));
    let requests = k8s.requests().await;
    assert!(
        requests
            .iter()
            .any(|r| r["query"]["sendInitialEvents"] == "true"),
        "{requests:?}"
    );
    assert!(
        requests
            .iter()
            .any(|r| r["query"]["fieldSelector"] == "metadata.name=second"),
        "{requests:?}"
    );
}
