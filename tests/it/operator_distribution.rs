//! The operator against the API emulator, with light sidecars (in-process clients of the
//! distribution endpoint that authenticate and acknowledge like real ones): snapshots,
//! authentication, status, revocation propagation and exception state.

use crate::support;

// The listener's limits (issue 28, item 7).
mod ack_authentication;
mod listener_limits;

use std::time::Duration;

use serde_json::{Value, json};
use support::eventually;
use support::kube::KubeEmulator;
use support::operator::{LightSidecar, Operator, TestPod, policy_hash};

const NS: &str = "team-a";
const WAIT: Duration = Duration::from_secs(20);

fn policy(name: &str, app: &str, tools: &str) -> String {
    format!(
        r#"apiVersion: lifeguard.dev/v1alpha1
kind: McpServerPolicy
metadata: {{name: {name}, namespace: {NS}}}
spec:
  selector: {{matchLabels: {{app: {app}}}}}
  resource: http://127.0.0.1/mcp
  identity:
    issuers:
      - issuer: https://idp.test
        jwksUri: http://127.0.0.1:9/jwks
  tasks:
    enabled: true
    tools: [{tools}]
"#
    )
}

fn revocation(name: &str, subject: &str) -> String {
    format!(
        r#"apiVersion: lifeguard.dev/v1alpha1
kind: PrincipalRevocation
metadata: {{name: {name}}}
spec:
  issuer: https://idp.test
  subject: {subject}
  revokedBefore: "2030-01-01T00:00:00Z"
  reason: sessionRevoked
  source: {{kind: manual}}
"#
    )
}

async fn get(emulator: &KubeEmulator, path: &str) -> Option<Value> {
    let r = reqwest::get(format!("{}{path}", emulator.url()))
        .await
        .ok()?;
    if r.status() != 200 {
        return None;
    }
    r.json().await.ok()
}

fn policy_path(name: &str) -> String {
    format!("/apis/lifeguard.dev/v1alpha1/namespaces/{NS}/mcpserverpolicies/{name}")
}

fn condition<'a>(object: &'a Value, type_: &str) -> Option<&'a Value> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

async fn pods(emulator: &KubeEmulator, count: usize, app: &str) -> Vec<TestPod> {
    let mut pods = Vec::new();
    for i in 0..count {
        pods.push(TestPod::create(emulator, NS, &format!("{app}-{i}"), &[("app", app)], app).await);
    }
    pods
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecars_get_their_policy_acknowledge_it_and_status_counts_them() {
    let emulator = KubeEmulator::start().await;
    let operator = Operator::start(&emulator, None).await;
    let pods = pods(&emulator, 3, "reports").await;
    let other = TestPod::create(&emulator, NS, "unrelated-0", &[("app", "unrelated")], "x").await;
    emulator
        .apply_yaml(&policy("reports", "reports", "generate_report"))
        .await;

    let sidecars: Vec<LightSidecar> = pods
        .iter()
        .map(|p| LightSidecar::connect(&operator, p, (NS, &p.name), 0))
        .collect();
    let unselected = LightSidecar::connect(&operator, &other, (NS, "unrelated-0"), 0);

    // Every selected sidecar receives the compiled policy, for its own pod.
    for (sidecar, pod) in sidecars.iter().zip(&pods) {
        let snapshot = eventually(WAIT, async || {
            sidecar.last().filter(|s| s["policy"].is_object())
        })
        .await
        .unwrap_or_else(|| panic!("no snapshot:\n{}", operator.logs()));
        assert_eq!(snapshot["pod"]["name"], pod.name.as_str());
        assert_eq!(snapshot["pod"]["uid"], pod.uid.as_str());
        assert_eq!(snapshot["policy"]["policy"]["name"], "reports");
        assert_eq!(
            snapshot["policy"]["tasks"]["tools"],
            json!({"only": ["generate_report"]})
        );
    }
    // A pod no policy selects gets a snapshot without a policy.
    let empty = eventually(WAIT, async || unselected.last()).await.unwrap();
    assert!(empty["policy"].is_null(), "{empty}");

    // Status: matched pods and sidecars in sync, Ready, the hash the sidecars run.
    let hash = policy_hash(&sidecars[0].last().unwrap()["policy"]);
    let object = eventually(WAIT, async || {
        let o = get(&emulator, &policy_path("reports")).await?;
        (o["status"]["sidecarsInSync"] == 3).then_some(o)
    })
    .await
    .unwrap_or_else(|| panic!("status never showed 3 in sync:\n{}", operator.logs()));
    assert_eq!(object["status"]["matchedPods"], 3);
    assert_eq!(object["status"]["policyHash"], hash.as_str());
    let ready = condition(&object, "Ready").unwrap();
    assert_eq!(
        (ready["status"].as_str(), ready["reason"].as_str()),
        (Some("True"), Some("Programmed"))
    );
    assert_eq!(
        ready["observedGeneration"],
        object["metadata"]["generation"]
    );

    // A spec change reaches every sidecar as a new version, and status follows.
    let first_version = sidecars[0].last().unwrap()["version"].as_u64().unwrap();
    emulator
        .apply_yaml(&policy(
            "reports",
            "reports",
            "generate_report, bulk_update",
        ))
        .await;
    for sidecar in &sidecars {
        let snapshot = eventually(WAIT, async || {
            sidecar.last().filter(|s| {
                s["policy"]["tasks"]["tools"]["only"]
                    .as_array()
                    .is_some_and(|t| t.len() == 2)
            })
        })
        .await
        .expect("the changed policy reached the sidecar");
        assert!(snapshot["version"].as_u64().unwrap() > first_version);
    }
    let new_hash = policy_hash(&sidecars[0].last().unwrap()["policy"]);
    assert_ne!(new_hash, hash);
    let object = eventually(WAIT, async || {
        let o = get(&emulator, &policy_path("reports")).await?;
        (o["status"]["policyHash"] == new_hash.as_str() && o["status"]["sidecarsInSync"] == 3)
            .then_some(o)
    })
    .await
    .expect("status follows the new hash");
    assert_eq!(
        object["status"]["observedGeneration"],
        object["metadata"]["generation"]
    );
    assert_eq!(
        operator
            .metric("lifeguard_operator_sidecars_connected")
            .await,
        Some(4.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_presenting_another_pods_identity_or_no_valid_token_is_refused_and_not_counted() {
    let emulator = KubeEmulator::start().await;
    let operator = Operator::start(&emulator, None).await;
    emulator
        .apply_yaml(&policy("reports", "reports", "generate_report"))
        .await;
    let pods = pods(&emulator, 2, "reports").await;

    // Pod 1's token, claiming to be pod 0.
    let impostor = LightSidecar::connect(&operator, &pods[1], (NS, &pods[0].name), 0);
    // A token the API server does not know.
    let forged = TestPod {
        token: "forged".into(),
        ..TestPod::create(&emulator, NS, "reports-9", &[("app", "reports")], "reports").await
    };
    let forger = LightSidecar::connect(&operator, &forged, (NS, "reports-9"), 0);
    let refused = eventually(WAIT, async || {
        let a = impostor.seen.lock().unwrap().refusals.first().copied()?;
        let b = forger.seen.lock().unwrap().refusals.first().copied()?;
        Some((a, b))
    })
    .await
    .expect("both refused");
    assert_eq!(refused, (403, 401));
    assert!(impostor.last().is_none() && forger.last().is_none());
    let object = eventually(WAIT, async || {
        let o = get(&emulator, &policy_path("reports")).await?;
        o["status"]["matchedPods"].as_i64().map(|_| o)
    })
    .await
    .unwrap();
    assert_eq!(object["status"]["sidecarsInSync"], 0);
    assert!(
        operator
            .metric("lifeguard_operator_sidecar_auth_refusals_total{reason=\"claim_mismatch\"}")
            .await
            >= Some(1.0)
    );
    assert!(
        operator
            .metric("lifeguard_operator_sidecar_auth_refusals_total{reason=\"not_authenticated\"}")
            .await
            >= Some(1.0)
    );
    // Every stream was reviewed with the lifeguard audience.
    let reviews = emulator.token_reviews().await;
    assert!(!reviews.is_empty());
    assert!(
        reviews
            .iter()
            .all(|r| r["spec"]["audiences"] == json!(["lifeguard"])),
        "{reviews:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_reaches_every_trusting_sidecar_and_status_reports_completion() {
    let emulator = KubeEmulator::start().await;
    let operator = Operator::start(&emulator, None).await;
    emulator
        .apply_yaml(&policy("reports", "reports", "generate_report"))
        .await;
    let pods = pods(&emulator, 3, "reports").await;
    let sidecars: Vec<LightSidecar> = pods
        .iter()
        .map(|p| LightSidecar::connect(&operator, p, (NS, &p.name), 2))
        .collect();
    for sidecar in &sidecars {
        eventually(WAIT, async || {
            sidecar.last().filter(|s| s["policy"].is_object())
        })
        .await
        .expect("policy first");
    }
    emulator
        .apply_yaml(&revocation("alice-revoked", "alice"))
        .await;
    for sidecar in &sidecars {
        eventually(WAIT, async || {
            sidecar.last().filter(|s| {
                s["policy"]["revocations"]
                    .as_array()
                    .is_some_and(|r| r.len() == 1)
            })
        })
        .await
        .unwrap_or_else(|| {
            panic!(
                "the revocation did not reach the sidecar: {:?}\n{}\n{}",
                sidecar.last(),
                operator.logs(),
                emulator.logs()
            )
        });
    }
    let path = "/apis/lifeguard.dev/v1alpha1/principalrevocations/alice-revoked";
    let object = eventually(WAIT, async || {
        let o = get(&emulator, path).await?;
        o["status"]["completedAt"].is_string().then_some(o)
    })
    .await
    .unwrap_or_else(|| panic!("never completed:\n{}", operator.logs()));
    let status = &object["status"];
    assert_eq!(status["targetSidecars"], 3);
    assert_eq!(status["acknowledgedSidecars"], 3);
    assert_eq!(status["tasksCancelled"], 6);
    assert!(status["propagationMillis"].as_i64().unwrap() >= 0);
    let propagated = condition(&object, "Propagated").unwrap();
    assert_eq!(propagated["status"], "True");

    // A sidecar that connects later gets the revocation in its first snapshot; the target
    // stays what it was.
    let late_pod = TestPod::create(
        &emulator,
        NS,
        "reports-late",
        &[("app", "reports")],
        "reports",
    )
    .await;
    let late = LightSidecar::connect(&operator, &late_pod, (NS, "reports-late"), 1);
    let first = eventually(WAIT, async || late.last()).await.unwrap();
    assert_eq!(first["policy"]["revocations"][0]["name"], "alice-revoked");
    let object = eventually(WAIT, async || {
        let o = get(&emulator, path).await?;
        (o["status"]["tasksCancelled"] == 7).then_some(o)
    })
    .await
    .expect("the late sidecar's count is added");
    assert_eq!(object["status"]["targetSidecars"], 3);
}

fn signed_exception(
    name: &str,
    policy: &str,
    not_before: jiff::Timestamp,
    expires: jiff::Timestamp,
) -> String {
    support::operator::signed_exception(NS, name, policy, not_before, expires)
}

fn exception_path(name: &str) -> String {
    format!("/apis/lifeguard.dev/v1alpha1/namespaces/{NS}/capabilityexceptions/{name}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exceptions_are_verified_against_the_approver_secret_and_expire_at_their_instant() {
    let emulator = KubeEmulator::start().await;
    let config = "approverKeys: {secretName: lifeguard-approvers, key: approvers.jwks.json}\n";
    let operator = Operator::start(&emulator, Some(config)).await;
    let mut policy_yaml = policy("reports", "reports", "generate_report");
    policy_yaml.push_str("  capabilities: {sampling: exception}\n");
    emulator.apply_yaml(&policy_yaml).await;
    let now = jiff::Timestamp::now();
    let soon = now + jiff::SignedDuration::from_secs(5);
    emulator
        .apply_yaml(&signed_exception(
            "summaries",
            "reports",
            now - jiff::SignedDuration::from_secs(60),
            soon,
        ))
        .await;
    emulator
        .apply_yaml(&signed_exception(
            "orphan",
            "no-such-policy",
            now - jiff::SignedDuration::from_secs(60),
            soon,
        ))
        .await;

    // No approver Secret yet: nothing can be verified.
    let state = |o: &Value| {
        (
            o["status"]["state"].as_str().map(str::to_owned),
            condition(o, "Ready").and_then(|c| c["reason"].as_str().map(str::to_owned)),
        )
    };
    let o = eventually(WAIT, async || {
        let o = get(&emulator, &exception_path("summaries")).await?;
        o["status"]["state"].is_string().then_some(o)
    })
    .await
    .unwrap_or_else(|| panic!("no status:\n{}", operator.logs()));
    assert_eq!(
        state(&o),
        (Some("Invalid".into()), Some("NoTrustedKeys".into()))
    );

    // The Secret appears: the exception verifies and is Active; the orphan names its problem.
    let jwks = std::fs::read_to_string(support::fixture("keys/issuer-jwks.json")).unwrap();
    emulator
        .apply_yaml(
            &serde_json::to_string(&json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "lifeguard-approvers", "namespace": "lifeguard-system"},
                "stringData": {"approvers.jwks.json": jwks}
            }))
            .unwrap(),
        )
        .await;
    let active = eventually(WAIT, async || {
        let o = get(&emulator, &exception_path("summaries")).await?;
        (o["status"]["state"] == "Active").then_some(o)
    })
    .await
    .unwrap_or_else(|| panic!("never Active:\n{}", operator.logs()));
    assert_eq!(active["status"]["approver"], "test-ed-1");
    let verified = condition(&active, "SignatureVerified").unwrap();
    assert_eq!(verified["status"], "True");
    let orphan = eventually(WAIT, async || {
        let o = get(&emulator, &exception_path("orphan")).await?;
        (state(&o).1.as_deref() == Some("PolicyNotFound")).then_some(o)
    })
    .await;
    assert!(orphan.is_some());

    // Nobody touches it again: at `expiresAt` it flips to Expired by itself.
    let expired = eventually(Duration::from_secs(15), async || {
        let o = get(&emulator, &exception_path("summaries")).await?;
        (o["status"]["state"] == "Expired").then_some(o)
    })
    .await
    .unwrap_or_else(|| panic!("never Expired:\n{}", operator.logs()));
    let ready = condition(&expired, "Ready").unwrap();
    assert_eq!(
        (ready["status"].as_str(), ready["reason"].as_str()),
        (Some("False"), Some("Expired"))
    );
    let flipped: jiff::Timestamp = ready["lastTransitionTime"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    // Kubernetes times have whole seconds.
    assert!(
        flipped.as_second() >= soon.as_second(),
        "flipped at {flipped}, before expiresAt {soon}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_holds_the_lease_and_a_restarted_replica_takes_it_over() {
    let emulator = KubeEmulator::start().await;
    let mut operator = Operator::start(&emulator, None).await;
    let lease_path =
        "/apis/coordination.k8s.io/v1/namespaces/lifeguard-system/leases/lifeguard-operator";
    let first = eventually(WAIT, async || {
        let l = get(&emulator, lease_path).await?;
        l["spec"]["holderIdentity"].as_str().map(str::to_owned)
    })
    .await
    .expect("a Lease with a holder");
    let lease = get(&emulator, lease_path).await.unwrap();
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 15);
    assert_eq!(
        operator.metric("lifeguard_operator_leader").await,
        Some(1.0)
    );
    operator.restart().await;
    let second = eventually(Duration::from_secs(40), async || {
        let l = get(&emulator, lease_path).await?;
        let holder = l["spec"]["holderIdentity"].as_str()?.to_owned();
        (holder != first).then_some(holder)
    })
    .await
    .unwrap_or_else(|| panic!("the restarted replica never led:\n{}", operator.logs()));
    assert!(!second.is_empty());
    let leading = eventually(WAIT, async || {
        (operator.metric("lifeguard_operator_leader").await == Some(1.0)).then_some(())
    })
    .await;
    assert!(leading.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_replicas_the_leader_counts_the_sidecars_of_both() {
    let emulator = KubeEmulator::start().await;
    let first = Operator::start(&emulator, None).await;
    let second = Operator::start(&emulator, None).await;
    emulator
        .apply_yaml(&policy("reports", "reports", "generate_report"))
        .await;
    let pods = pods(&emulator, 4, "reports").await;
    // Half the sidecars dial each replica.
    let sidecars: Vec<LightSidecar> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let replica = if i % 2 == 0 { &first } else { &second };
            LightSidecar::connect(replica, p, (NS, &p.name), 1)
        })
        .collect();
    for sidecar in &sidecars {
        eventually(WAIT, async || {
            sidecar.last().filter(|s| s["policy"].is_object())
        })
        .await
        .expect("every sidecar got the policy from its replica");
    }
    eventually(WAIT, async || {
        let o = get(&emulator, &policy_path("reports")).await?;
        (o["status"]["sidecarsInSync"] == 4).then_some(o)
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "the leader never counted all four:\n{}\n---\n{}",
            first.logs(),
            second.logs()
        )
    });
    // The follower keeps its table in a ConfigMap; the leader counts its own from memory.
    let tables = get(&emulator, "/api/v1/namespaces/lifeguard-system/configmaps")
        .await
        .unwrap();
    let names: Vec<&str> = tables["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["metadata"]["name"].as_str())
        .filter(|n| n.starts_with("lifeguard-acks-"))
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");

    // A revocation propagates through both replicas; the leader reports all four.
    emulator
        .apply_yaml(&revocation("alice-revoked", "alice"))
        .await;
    let path = "/apis/lifeguard.dev/v1alpha1/principalrevocations/alice-revoked";
    let object = eventually(WAIT, async || {
        let o = get(&emulator, path).await?;
        o["status"]["completedAt"].is_string().then_some(o)
    })
    .await
    .unwrap_or_else(|| panic!("never completed:\n{}\n---\n{}", first.logs(), second.logs()));
    assert_eq!(object["status"]["targetSidecars"], 4);
    assert_eq!(object["status"]["acknowledgedSidecars"], 4);
    assert_eq!(object["status"]["tasksCancelled"], 4);
}

/// A hand-driven sidecar connection: the open stream (kept open while this lives) and its
/// first snapshot.
struct RawStream {
    _response: reqwest::Response,
    first: Value,
}

impl RawStream {
    /// Opens the stream and reads until a snapshot `wanted` accepts (the operator's caches may
    /// lag behind objects just created: later snapshots catch up).
    async fn open(operator: &Operator, pod: &TestPod, wanted: impl Fn(&Value) -> bool) -> Self {
        let url = format!(
            "{}/distribution/v1/stream?podNamespace={}&podName={}",
            operator.url, pod.namespace, pod.name
        );
        let mut response = operator
            .ca
            .client()
            .get(url)
            .bearer_auth(&pod.token)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let mut buffer = Vec::new();
        let read = async {
            loop {
                let chunk = response.chunk().await.unwrap().expect("the stream goes on");
                buffer.extend_from_slice(&chunk);
                while let Some(pos) = buffer.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buffer.drain(..=pos).collect();
                    let message: Value = serde_json::from_slice(&line).unwrap();
                    if message["type"] == "snapshot" && wanted(&message) {
                        return message;
                    }
                }
            }
        };
        let first = tokio::time::timeout(WAIT, read)
            .await
            .unwrap_or_else(|_| panic!("no wanted snapshot:\n{}", operator.logs()));
        Self {
            _response: response,
            first,
        }
    }

    /// The ack of the first snapshot a genuine sidecar would send.
    fn genuine_ack(&self, tasks: u64) -> Value {
        let revocations: Vec<Value> = self.first["policy"]["revocations"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|r| json!({"name": r["name"], "tasksCancelled": tasks, "streamsClosed": 0}))
            .collect();
        json!({
            "session": self.first["session"], "version": self.first["version"],
            "policyHash": self.first["policy"].as_object().map(|_| policy_hash(&self.first["policy"])),
            "revocations": revocations,
        })
    }
}

async fn post_ack(operator: &Operator, pod: &TestPod, ack: &Value) -> (u16, String) {
    let response = operator
        .ca
        .client()
        .post(format!("{}/distribution/v1/ack", operator.url))
        .bearer_auth(&pod.token)
        .json(ack)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_ends_with_its_pod_and_never_serves_or_counts_for_a_successor_of_the_same_name() {
    let emulator = KubeEmulator::start().await;
    let operator = Operator::start(&emulator, None).await;
    emulator
        .apply_yaml(&policy("reports", "reports", "generate_report"))
        .await;
    let old = TestPod::create(&emulator, NS, "reports-0", &[("app", "reports")], "reports").await;
    let sidecar = LightSidecar::connect(&operator, &old, (NS, "reports-0"), 0);
    eventually(WAIT, async || {
        sidecar.last().filter(|s| s["policy"].is_object())
    })
    .await
    .expect("the first pod's policy");
    eventually(WAIT, async || {
        let o = get(&emulator, &policy_path("reports")).await?;
        (o["status"]["sidecarsInSync"] == 1).then_some(())
    })
    .await
    .expect("the first pod in sync");

    // The pod is deleted and a new one takes its name (a new uid); its sidecar never dials.
    emulator.delete_pod(NS, "reports-0").await;
    let successor =
        TestPod::create(&emulator, NS, "reports-0", &[("app", "reports")], "reports").await;
    assert_ne!(successor.uid, old.uid);
    // The old stream ends; dialling again with the old pod's token is refused (its uid is gone).
    let refused = eventually(WAIT, async || {
        sidecar.seen.lock().unwrap().refusals.first().copied()
    })
    .await
    .unwrap_or_else(|| panic!("the old pod's stream stayed open:\n{}", operator.logs()));
    assert_eq!(refused, 403);

    // The policy changes: nobody serves the successor, so nobody is in sync with the new hash.
    emulator
        .apply_yaml(&policy("reports", "reports", "generate_report, export"))
        .await;
    let object = eventually(WAIT, async || {
        let o = get(&emulator, &policy_path("reports")).await?;
        let hash = o["status"]["policyHash"].as_str()?;
        let generation = o["metadata"]["generation"].as_i64()?;
        (o["status"]["observedGeneration"].as_i64() == Some(generation) && !hash.is_empty())
            .then_some(o)
    })
    .await
    .expect("status of the new generation");
    assert_eq!(object["status"]["sidecarsInSync"], 0, "{object}");
    let snapshots = sidecar.seen.lock().unwrap().snapshots.clone();
    assert!(
        snapshots.iter().all(|s| s["pod"]["uid"] == old.uid.as_str()
            && s["policy"]["tasks"]["tools"] == json!({"only": ["generate_report"]})),
        "the old stream received the successor's policy: {snapshots:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_naming_what_the_session_was_never_sent_are_refused_and_counts_saturate() {
    let emulator = KubeEmulator::start().await;
    let operator = Operator::start(&emulator, None).await;
    emulator
        .apply_yaml(&policy("reports", "reports", "generate_report"))
        .await;
    emulator
        .apply_yaml(&revocation("alice-revoked", "alice"))
        .await;
    let genuine =
        TestPod::create(&emulator, NS, "reports-0", &[("app", "reports")], "reports").await;
    // A pod in another namespace no policy selects: its snapshot never carries the revocation.
    let outsider = TestPod::create(&emulator, "team-b", "other-0", &[("app", "x")], "x").await;
    let outsider_stream = RawStream::open(&operator, &outsider, |_| true).await;
    assert!(outsider_stream.first["policy"].is_null());
    let stream = RawStream::open(&operator, &genuine, |s| {
        s["policy"]["revocations"][0]["name"] == "alice-revoked"
    })
    .await;

    // The outsider acks the revocation with invented counts: refused, nothing recorded.
    for tasks in [1_000_000u64, u64::MAX] {
        let mut forged = outsider_stream.genuine_ack(0);
        forged["revocations"] =
            json!([{"name": "alice-revoked", "tasksCancelled": tasks, "streamsClosed": 0}]);
        let (status, body) = post_ack(&operator, &outsider, &forged).await;
        assert_eq!(status, 422, "{body}");
        assert!(body.contains("alice-revoked"), "{body}");
    }
    // An ack of a version never sent is refused and does not poison the genuine ack.
    let mut future = stream.genuine_ack(1);
    future["version"] = json!(u64::MAX);
    let (status, body) = post_ack(&operator, &genuine, &future).await;
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("never sent"), "{body}");
    // An ack naming 2,000 made-up revocations is refused as a whole (no state is created).
    let mut flood = stream.genuine_ack(1);
    flood["revocations"] = Value::Array(
        (0..2_000)
            .map(|i| json!({"name": format!("made-up-{i}"), "tasksCancelled": 1, "streamsClosed": 1}))
            .collect(),
    );
    let (status, body) = post_ack(&operator, &genuine, &flood).await;
    assert_eq!(status, 422, "{body}");
    // One naming 30,000 (about 2 MiB) is larger than an ack may be: refused on its announced
    // length, before a byte of it is read (sending it whole would race the refusal).
    {
        use support::listener::{address, post_head_only, response_head, status, tls};
        let mut raw = tls(&operator.ca.ca_pem, address(&operator.url))
            .await
            .unwrap();
        let bearer = format!("Bearer {}", genuine.token);
        let headers = [
            ("Content-Type", "application/json"),
            ("Authorization", bearer.as_str()),
        ];
        post_head_only(&mut raw, "/distribution/v1/ack", &headers, 30_000 * 70).await;
        let head = response_head(&mut raw)
            .await
            .expect("no answer before the body was sent");
        assert_eq!(status(&head), 413, "{head}");
    }

    // The genuine ack counts, with its report capped at the documented bound.
    let (status, body) = post_ack(&operator, &genuine, &stream.genuine_ack(u64::MAX)).await;
    assert_eq!(status, 204, "{body}");
    let path = "/apis/lifeguard.dev/v1alpha1/principalrevocations/alice-revoked";
    eventually(WAIT, async || {
        let o = get(&emulator, path).await?;
        (o["status"]["tasksCancelled"] == 1_000_000).then_some(o)
    })
    .await
    .unwrap_or_else(|| panic!("the capped count never showed:\n{}", operator.logs()));
    eventually(WAIT, async || {
        let o = get(&emulator, &policy_path("reports")).await?;
        (o["status"]["sidecarsInSync"] == 1).then_some(())
    })
    .await
    .expect("the genuine sidecar is in sync");
    assert!(
        operator
            .metric(
                "lifeguard_operator_acknowledgement_refusals_total{reason=\"unsent_revocation\"}"
            )
            .await
            >= Some(2.0)
    );
}
