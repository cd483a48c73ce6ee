//! A cluster-mode sidecar cut off from its control plane by a silent partition: the sidecar and
//! its server in a namespace, reached by clients over one link and by the operator's stream
//! over another, which is cut — first with the fake operator (exact snapshots and acks), then
//! with the real one on the API emulator (a revocation applied during the cut). The sidecar notices the silence, says so in `/ready` and
//! its metrics, keeps enforcing its last snapshot and its revocations, and follows the
//! snapshot published meanwhile once the link is healed.

use crate::support;

use std::time::Duration;

use serde_json::json;
use support::control_plane::FakeControlPlane;
use support::netns::Lab;
use support::process::Place;
use support::{ClusterOptions, ExampleServer, McpClient, Sidecar, User, alice, bob};

const TASKS: &str = "  tasks:\n    tools: [write_rows]\n    minPollInterval: 50ms\n";
/// Beyond the sidecar's silence timeout (35 s) and a dial's connect timeout.
const NOTICE: Duration = Duration::from_secs(60);

/// The test policy with `revoked` principals, compiled as the operator would send it.
fn policy(fake: &FakeControlPlane, revoked: &[&str]) -> lifeguard::policy::EffectivePolicy {
    let placeholder = std::path::Path::new("/jwks-placeholder.json");
    let mut yaml = support::policy_yaml(placeholder, TASKS).replace(
        &format!("jwksFile: {}", placeholder.display()),
        &format!("jwksUri: {}", fake.jwks_uri),
    );
    let now = jiff::Timestamp::now();
    for subject in revoked {
        yaml.push_str(&format!(
            "---\napiVersion: lifeguard.dev/v1alpha1\nkind: PrincipalRevocation\n\
             metadata: {{name: revoke-{subject}}}\nspec:\n  issuer: {}\n  subject: {subject}\n  \
             revokedBefore: \"{now}\"\n  reason: sessionRevoked\n  source: {{kind: manual}}\n",
            support::ISSUER
        ));
    }
    match lifeguard::policy::load_standalone("test.yaml", &yaml, now) {
        Ok((policy, _)) => policy,
        Err(e) => panic!("test policy does not compile: {e}\n{yaml}"),
    }
}

/// A token issued a minute ago: earlier than any revocation made in this test.
fn token(user: User) -> String {
    user.token_with(|claims| {
        let iat = claims["iat"].as_i64().unwrap() - 60;
        claims["iat"] = json!(iat);
        claims["nbf"] = json!(iat - 5);
    })
}

/// Whether `token` may start a task through `client`.
async fn may_create(client: &McpClient, token: &str) -> bool {
    let reply = client
        .call_tool(token, "write_rows", json!({"count": 1}))
        .await;
    reply.status == 200 && reply.result()["taskId"].is_string()
}

async fn ready_saying(sidecar: &Sidecar, text: &str, wait: Duration) -> String {
    support::eventually(wait, async || {
        let (status, body) = sidecar.ready().await;
        (status == 200 && body.contains(text)).then_some(body)
    })
    .await
    .unwrap_or_else(|| panic!("/ready never said `{text}`:\n{}", sidecar.logs()))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sidecar_cut_off_from_the_operator_enforces_what_it_had_and_catches_up() {
    let Some(mut lab) = Lab::new("network_faults::control_plane") else {
        return;
    };
    let mut lan = lab.network();
    let mut ctl = lab.network();
    let root_lan = lab.attach(None, &mut lan);
    let root_ctl = lab.attach(None, &mut ctl);
    let pod = lab.node("pod");
    let pod_lan = lab.attach(Some(&pod), &mut lan);
    let pod_ctl = lab.attach(Some(&pod), &mut ctl);
    let fake = FakeControlPlane::start_on(root_ctl.ip, root_lan.ip).await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "token-1\n").unwrap();
    let server = ExampleServer::start_in(&pod);
    let sidecar = Sidecar::start_cluster_at(
        &server.url,
        ClusterOptions {
            control_plane: fake.url.clone(),
            ca: Some(fake.ca_path.clone()),
            token_file,
            pod_namespace: "team-a".into(),
            pod_name: "reports-0".into(),
            args: vec![],
            env: vec![],
        },
        Some(Place {
            netns: pod.clone(),
            host: pod_lan.ip,
        }),
    );
    let client = McpClient::new(&sidecar.url);
    let (alice, bob) = (token(alice()), token(bob()));

    // Bob is revoked by the first snapshot; alice works.
    let v1 = fake.push(Some(policy(&fake, &["bob"])), None);
    ready_saying(
        &sidecar,
        &format!("control plane connected, snapshot version {v1}"),
        Duration::from_secs(15),
    )
    .await;
    assert!(may_create(&client, &alice).await);
    assert!(
        !may_create(&client, &bob).await,
        "a revoked principal served"
    );

    // Cut: the stream falls silent (no reset, no close); the sidecar notices and says so.
    lab.cut(&pod_ctl);
    let body = ready_saying(&sidecar, "control plane unreachable since", NOTICE).await;
    assert!(
        body.contains(&format!("enforcing snapshot version {v1}")),
        "{body}"
    );
    assert_eq!(
        sidecar
            .daemon
            .metric("lifeguard_control_plane_connected")
            .await,
        Some(0.0)
    );
    // A snapshot revoking alice too is published while the sidecar cannot hear it.
    let v2 = fake.push(Some(policy(&fake, &["bob", "alice"])), None);
    // Still enforcing the last snapshot: alice works, bob stays revoked, no token no entry.
    assert!(
        may_create(&client, &alice).await,
        "last policy not in force"
    );
    assert!(
        !may_create(&client, &bob).await,
        "a revocation lifted by the partition"
    );
    let anonymous = client
        .call_tool("not-a-token", "write_rows", json!({"count": 1}))
        .await;
    assert_eq!(anonymous.status, 401, "failing open: {anonymous:?}");

    // Healed: it dials again by itself, follows v2, and alice is refused from then on.
    lab.heal(&pod_ctl);
    ready_saying(
        &sidecar,
        &format!("control plane connected, snapshot version {v2}"),
        NOTICE,
    )
    .await;
    assert!(fake.ack_of(v2).await.is_some(), "v2 never acknowledged");
    assert!(!may_create(&client, &alice).await, "a revocation missed");
    assert!(!may_create(&client, &bob).await);
    let reconnects = sidecar
        .daemon
        .metric("lifeguard_control_plane_reconnects_total")
        .await;
    assert!(reconnects.is_some_and(|n| n >= 1.0), "{reconnects:?}");
    drop((sidecar, server, fake));
}

/// The same partition with the real operator (on the API emulator) in the root namespace: the
/// sidecar and its server in a pod namespace, the operator's distribution endpoint on one link
/// and the issuer's JWKS on another. A PrincipalRevocation applied while the link is cut
/// reaches the sidecar once it is healed: the owner's running task is cancelled, and the
/// operator records the sidecar's acknowledgement in the revocation's status.
#[tokio::test(flavor = "multi_thread")]
async fn the_real_operator_catches_a_cut_off_sidecar_up_on_a_revocation_made_meanwhile() {
    use support::cluster::{APP, NS};
    use support::kube::KubeEmulator;
    use support::operator::{Operator, TestPod};

    let Some(mut lab) = Lab::new("network_faults::real_operator") else {
        return;
    };
    let mut lan = lab.network();
    let mut ctl = lab.network();
    let root_lan = lab.attach(None, &mut lan);
    let root_ctl = lab.attach(None, &mut ctl);
    let pod_ns = lab.node("pod");
    let pod_lan = lab.attach(Some(&pod_ns), &mut lan);
    let pod_ctl = lab.attach(Some(&pod_ns), &mut ctl);

    let emulator = KubeEmulator::start().await;
    let operator = Operator::start_on(&emulator, None, root_ctl.ip, &[root_lan.ip]).await;
    // The issuer's JWKS, over HTTPS with the operator's CA, which the sidecar trusts.
    let jwks_listener = tokio::net::TcpListener::bind((root_lan.ip, 0))
        .await
        .unwrap();
    let jwks_url = format!("https://{}/jwks.json", jwks_listener.local_addr().unwrap());
    let jwks = std::fs::read_to_string(support::fixture("keys/issuer-jwks.json")).unwrap();
    let _jwks = support::tls::serve(
        jwks_listener,
        operator.ca.server_config(),
        axum::Router::new().route(
            "/jwks.json",
            axum::routing::get(move || {
                let jwks = jwks.clone();
                async move { ([(http::header::CONTENT_TYPE, "application/json")], jwks) }
            }),
        ),
    );
    emulator
        .apply_yaml(&support::cluster::policy(&jwks_url, "write_rows"))
        .await;
    let pod = TestPod::create(&emulator, NS, "reports-0", &[("app", APP)], APP).await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, &pod.token).unwrap();
    let server = ExampleServer::start_in(&pod_ns);
    let sidecar = Sidecar::start_cluster_at(
        &server.url,
        ClusterOptions {
            control_plane: operator.url.clone(),
            ca: Some(operator.ca.ca_path.clone()),
            token_file,
            pod_namespace: NS.into(),
            pod_name: pod.name.clone(),
            args: vec![],
            env: vec![],
        },
        Some(Place {
            netns: pod_ns.clone(),
            host: pod_lan.ip,
        }),
    );
    let client = McpClient::new(&sidecar.url);
    let (alice, bob) = (token(alice()), token(bob()));
    ready_saying(&sidecar, "control plane connected", Duration::from_secs(30)).await;
    let task = support::create_task(
        &client,
        &alice,
        "write_rows",
        json!({"count": 100_000, "intervalMs": 50, "label": "alice-long"}),
    )
    .await;

    // Cut: the sidecar notices the silence and keeps enforcing what it had.
    lab.cut(&pod_ctl);
    let body = ready_saying(&sidecar, "control plane unreachable since", NOTICE).await;
    assert!(body.contains("enforcing snapshot version"), "{body}");
    // Alice is revoked while the sidecar cannot hear it: it keeps its last policy (alice's
    // task runs on, bob is served, no token no entry) until it can.
    let revoked_before = jiff::Timestamp::now();
    emulator
        .apply_yaml(&format!(
            "apiVersion: lifeguard.dev/v1alpha1\nkind: PrincipalRevocation\nmetadata: {{name: alice-during-cut}}\nspec:\n  issuer: {}\n  subject: alice\n  revokedBefore: \"{revoked_before}\"\n  reason: sessionRevoked\n  source: {{kind: manual}}\n",
            support::ISSUER
        ))
        .await;
    assert!(may_create(&client, &bob).await, "last policy not in force");
    let read = client.get_task(&alice, &task).await;
    assert_eq!(read.result()["status"], "working", "{read:?}");
    let anonymous = client
        .call_tool("not-a-token", "write_rows", json!({"count": 1}))
        .await;
    assert_eq!(anonymous.status, 401, "failing open: {anonymous:?}");

    // Healed: the sidecar dials again, applies the revocation, cancels alice's task and acks.
    lab.heal(&pod_ctl);
    let cancelled = support::eventually(NOTICE, async || {
        sidecar.audit().into_iter().find(|e| {
            e["event"] == "task.cancel_requested"
                && e["reason"].as_str().is_some_and(|r| r.starts_with("revo"))
        })
    })
    .await;
    assert!(
        cancelled.is_some(),
        "the revocation made during the cut never reached the sidecar:\n{}\n--- operator ---\n{}",
        sidecar.logs(),
        operator.logs()
    );
    assert!(!may_create(&client, &alice).await, "a revocation missed");
    let path = "/apis/lifeguard.dev/v1alpha1/principalrevocations/alice-during-cut";
    let acknowledged = support::eventually(NOTICE, async || {
        let object: serde_json::Value = reqwest::get(format!("{}{path}", emulator.url()))
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        (object["status"]["acknowledgedSidecars"] == 1).then_some(object)
    })
    .await
    .unwrap_or_else(|| panic!("the operator never recorded the ack:\n{}", operator.logs()));
    assert_eq!(
        acknowledged["status"]["tasksCancelled"], 1,
        "{acknowledged}"
    );
    drop((sidecar, server, operator, emulator));
}
