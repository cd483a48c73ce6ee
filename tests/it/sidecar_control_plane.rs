//! Cluster mode, black box: the real `lifeguard sidecar --control-plane` in front of the example
//! server, fed by a fake operator (`support::control_plane`) over TLS with a CA minted for the
//! test. Snapshots are compiled from policy YAML exactly as standalone mode compiles a file.

use crate::support;
use crate::support::alice;

use std::path::{Path, PathBuf};
use std::time::Duration;

use lifeguard::policy::EffectivePolicy;
use serde_json::json;
use support::control_plane::{Event, FakeControlPlane};
use support::{ClusterOptions, ExampleServer, McpClient, Sidecar};

const POD_NAMESPACE: &str = "team-a";
const POD_NAME: &str = "reports-0";
const TASKS: &str = "  tasks:\n    tools: [write_rows, slow_compute]\n    minPollInterval: 50ms\n";
const WRITE_ROWS_ONLY: &str = "  tasks:\n    tools: [write_rows]\n    minPollInterval: 50ms\n";
const WAIT: Duration = Duration::from_secs(15);

/// The test policy with `spec` under `spec:` and `extra` documents, its issuer's keys served
/// over https by the fake, compiled.
fn compiled(fake: &FakeControlPlane, spec: &str, extra: &str) -> EffectivePolicy {
    let placeholder = Path::new("/jwks-placeholder.json");
    let mut yaml = support::policy_yaml(placeholder, spec).replace(
        &format!("jwksFile: {}", placeholder.display()),
        &format!("jwksUri: {}", fake.jwks_uri),
    );
    if !extra.is_empty() {
        yaml.push_str("---\n");
        yaml.push_str(extra);
    }
    match lifeguard::policy::load_standalone("test.yaml", &yaml, jiff::Timestamp::now()) {
        Ok((policy, _)) => policy,
        Err(e) => panic!("test policy does not compile: {e}\n{yaml}"),
    }
}

fn revocation(name: &str, subject: &str, revoked_before: jiff::Timestamp) -> String {
    format!(
        "apiVersion: lifeguard.dev/v1alpha1\nkind: PrincipalRevocation\nmetadata: {{name: {name}}}\n\
         spec:\n  issuer: {}\n  subject: {subject}\n  revokedBefore: \"{revoked_before}\"\n  \
         reason: sessionRevoked\n  source: {{kind: manual}}\n",
        support::ISSUER
    )
}

struct Cluster {
    fake: FakeControlPlane,
    server: ExampleServer,
    sidecar: Sidecar,
    client: McpClient,
    token_file: PathBuf,
    _dir: tempfile::TempDir,
}

/// A fake operator with nothing to send yet, the example server, and a cluster-mode sidecar
/// presenting the token `token-1` and trusting the fake's CA through `--control-plane-ca`.
async fn start() -> Cluster {
    start_with(&[], Trust::Flag).await
}

/// How the sidecar is told to trust the fake's CA.
enum Trust {
    Flag,
    SslCertFile,
    Nothing,
    /// `--control-plane-ca` names this other CA, while `SSL_CERT_FILE` trusts the fake's.
    PinnedElsewhere(PathBuf),
}

/// Like [`start`], with the fake refusing streams of the `refused` bearers from the outset and
/// the CA given as `trust` says.
async fn start_with(refused: &[&str], trust: Trust) -> Cluster {
    let fake = FakeControlPlane::start().await;
    for bearer in refused {
        fake.refuse(bearer);
    }
    let ca = fake.ca_path.clone();
    let (ca, env) = match trust {
        Trust::Flag => (Some(ca), vec![]),
        Trust::SslCertFile => (
            None,
            vec![("SSL_CERT_FILE".to_owned(), ca.display().to_string())],
        ),
        Trust::Nothing => (None, vec![]),
        Trust::PinnedElsewhere(other) => (
            Some(other),
            vec![("SSL_CERT_FILE".to_owned(), ca.display().to_string())],
        ),
    };
    let server = ExampleServer::start();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "token-1\n").unwrap();
    let sidecar = Sidecar::start_cluster(
        &server.url,
        ClusterOptions {
            control_plane: fake.url.clone(),
            ca,
            token_file: token_file.clone(),
            pod_namespace: POD_NAMESPACE.into(),
            pod_name: POD_NAME.into(),
            args: vec![],
            env,
        },
    );
    let client = McpClient::new(&sidecar.url);
    Cluster {
        fake,
        server,
        sidecar,
        client,
        token_file,
        _dir: dir,
    }
}

impl Cluster {
    /// Waits for `/ready` to answer 200 with a body containing `text`.
    async fn ready_saying(&self, text: &str) -> String {
        let found = support::eventually(WAIT, async || {
            let (status, body) = self.sidecar.ready().await;
            (status == 200 && body.contains(text)).then_some(body)
        })
        .await;
        let last = self.sidecar.ready().await;
        found.unwrap_or_else(|| {
            panic!(
                "/ready never said `{text}`; last {last:?}\n{}",
                self.sidecar.logs()
            )
        })
    }

    /// Waits until the fake has seen `count` accepted connections.
    async fn connections(&self, count: usize) {
        let seen = support::eventually(WAIT, async || {
            (self.fake.bearers().len() >= count).then_some(())
        })
        .await;
        assert!(
            seen.is_some(),
            "fewer than {count} connections: {:?}\n{}",
            self.fake.events(),
            self.sidecar.logs()
        );
    }
}

#[tokio::test]
async fn fails_closed_until_the_first_snapshot_then_enforces_each_new_one() {
    let cluster = start().await;
    cluster.connections(1).await;
    let token = alice().token();

    // Connected, but nothing to enforce yet: everything is refused and the pod is not ready.
    let refused = cluster
        .client
        .call_tool(&token, "slow_compute", json!({"seconds": 0.05}))
        .await;
    // Said as what it is, and when to ask again.
    refused.assert_retryable_503("before the first snapshot");
    assert_eq!(
        refused.body["error"]["message"], "No policy is loaded yet",
        "{refused:?}"
    );
    // The fake records the connection before the sidecar has read the answer's head and
    // updated its readiness text: wait for the text, then check it is still a refusal.
    let (status, body) = support::eventually(WAIT, async || {
        let (status, body) = cluster.sidecar.ready().await;
        body.contains("waiting for the first snapshot")
            .then_some((status, body))
    })
    .await
    .unwrap_or_else(|| panic!("never said it waits:\n{}", cluster.sidecar.logs()));
    assert_eq!(status, 503, "{body}");
    match &cluster.fake.events()[0] {
        Event::Connected {
            bearer,
            version,
            pod,
        } => {
            assert_eq!(bearer, "token-1");
            assert_eq!(*version, http::Version::HTTP_2, "ALPN chose h2");
            assert_eq!(
                (pod.pod_namespace.as_str(), pod.pod_name.as_str()),
                (POD_NAMESPACE, POD_NAME)
            );
        }
        other => panic!("first event {other:?}"),
    }

    // The first snapshot enables tasks.
    let first = compiled(&cluster.fake, TASKS, "");
    let v1 = cluster.fake.push(Some(first.clone()), None);
    let body = cluster
        .ready_saying("control plane connected, snapshot version")
        .await;
    assert!(body.contains(&first.hash()), "{body}");
    let task = support::create_task(
        &cluster.client,
        &token,
        "slow_compute",
        json!({"seconds": 0.05}),
    )
    .await;
    let done = cluster.client.wait_terminal(&token, &task, 10_000).await;
    assert_eq!(done.result()["status"], "completed", "{done:?}");
    let ack = cluster.fake.ack_of(v1).await.expect("first snapshot acked");
    assert_eq!(ack.policy_hash, Some(first.hash()));
    assert!(ack.revocations.is_empty());
    assert_eq!(
        cluster
            .sidecar
            .metric("lifeguard_policy_snapshot_version")
            .await,
        v1 as f64
    );
    assert_eq!(
        cluster
            .sidecar
            .metric("lifeguard_control_plane_connected")
            .await,
        1.0
    );

    // A new snapshot takes slow_compute out of tasks.tools: it no longer becomes a task.
    let second = compiled(&cluster.fake, WRITE_ROWS_ONLY, "");
    let v2 = cluster.fake.push(Some(second.clone()), None);
    let applied = support::eventually(WAIT, async || {
        let r = cluster
            .client
            .call_tool(&token, "slow_compute", json!({"seconds": 0.05}))
            .await;
        (r.status == 200 && r.result()["resultType"] == "complete").then_some(())
    })
    .await;
    assert!(applied.is_some(), "{}", cluster.sidecar.logs());
    let ack = cluster
        .fake
        .ack_of(v2)
        .await
        .expect("second snapshot acked");
    assert_eq!(ack.policy_hash, Some(second.hash()));
    assert!(
        cluster
            .sidecar
            .ledger_path
            .with_file_name("ledger.db.snapshot.json")
            .is_file(),
        "the snapshot is kept beside the ledger"
    );
}

#[tokio::test]
async fn a_revocation_cancels_the_owners_running_task_before_the_ack_counts_it() {
    let cluster = start().await;
    let policy = compiled(&cluster.fake, TASKS, "");
    cluster.fake.push(Some(policy), None);
    cluster.ready_saying("ready: policy").await;
    let now = jiff::Timestamp::now().as_second();
    let old_token = alice().token_with(|c| {
        c["iat"] = json!(now - 60);
        c["nbf"] = json!(now - 65);
    });
    let task = support::create_task(
        &cluster.client,
        &old_token,
        "write_rows",
        json!({"count": 1000, "intervalMs": 20, "label": "alice"}),
    )
    .await;

    let revoked_before = jiff::Timestamp::from_second(now - 10).unwrap();
    let revoking = compiled(
        &cluster.fake,
        TASKS,
        &revocation("alice-session", "alice", revoked_before),
    );
    let version = cluster.fake.push(Some(revoking.clone()), None);

    let fresh = alice().token();
    let cancelled = support::eventually(WAIT, async || {
        let r = cluster.client.get_task(&fresh, &task).await;
        (r.result()["status"] == "cancelled").then_some(())
    })
    .await;
    assert!(cancelled.is_some(), "{}", cluster.sidecar.logs());
    let ack = cluster
        .fake
        .ack_of(version)
        .await
        .expect("revoking snapshot acked");
    assert_eq!(ack.policy_hash, Some(revoking.hash()));
    assert_eq!(ack.revocations.len(), 1, "{ack:?}");
    assert_eq!(ack.revocations[0].name, "alice-session");
    assert!(ack.revocations[0].tasks_cancelled >= 1, "{ack:?}");
    let rows = cluster.server.rows_labelled("alice").await.len();
    assert!(rows < 1000, "the server's work stopped");
}

#[tokio::test]
async fn a_refused_identity_enables_nothing_and_the_token_is_read_again_at_every_dial() {
    let cluster = start_with(&["token-1"], Trust::Flag).await;
    cluster
        .fake
        .push(Some(compiled(&cluster.fake, TASKS, "")), None);

    // Refused (403), dialled again with the same backoff, never ready.
    let retried = support::eventually(WAIT, async || {
        let refusals = cluster
            .fake
            .events()
            .iter()
            .filter(|e| matches!(e, Event::Refused { .. }))
            .count();
        (refusals >= 2).then_some(())
    })
    .await;
    assert!(retried.is_some(), "{:?}", cluster.fake.events());
    assert_eq!(cluster.sidecar.ready().await.0, 503);
    let refused = cluster
        .client
        .call_tool(&alice().token(), "write_rows", json!({"count": 1}))
        .await;
    assert_eq!(refused.status, 503);
    assert!(
        cluster.sidecar.logs().contains("REFUSED"),
        "a refusal is logged loudly:\n{}",
        cluster.sidecar.logs()
    );

    // The kubelet rotates the token: the next dial presents the new one.
    std::fs::write(&cluster.token_file, "token-2\n").unwrap();
    cluster.connections(1).await;
    cluster.ready_saying("ready: policy").await;
    std::fs::write(&cluster.token_file, "token-3").unwrap();
    cluster.fake.drop_streams();
    cluster.connections(2).await;
    assert_eq!(cluster.fake.bearers(), vec!["token-2", "token-3"]);
    let events = cluster.fake.events();
    let position = |wanted: &dyn Fn(&Event) -> bool| events.iter().position(wanted).unwrap();
    let refused = position(&|e| matches!(e, Event::Refused { bearer } if bearer == "token-1"));
    let second = position(&|e| matches!(e, Event::Connected { bearer, .. } if bearer == "token-2"));
    let dropped = position(&|e| matches!(e, Event::Dropped));
    let third = position(&|e| matches!(e, Event::Connected { bearer, .. } if bearer == "token-3"));
    assert!(
        refused < second && second < dropped && dropped < third,
        "{events:?}"
    );
}

#[tokio::test]
async fn the_last_snapshot_stays_in_force_while_the_control_plane_is_away() {
    let mut cluster = start().await;
    let v1 = cluster
        .fake
        .push(Some(compiled(&cluster.fake, TASKS, "")), None);
    cluster.ready_saying("control plane connected").await;
    let token = alice().token();
    let running = support::create_task(
        &cluster.client,
        &token,
        "slow_compute",
        json!({"seconds": 30}),
    )
    .await;

    cluster.fake.go_down().await;
    let body = cluster
        .ready_saying("control plane unreachable since")
        .await;
    assert!(
        body.contains(&format!("enforcing snapshot version {v1}")),
        "{body}"
    );
    assert_eq!(
        cluster
            .sidecar
            .metric("lifeguard_control_plane_connected")
            .await,
        0.0
    );
    // Still enforcing: the owner reads her task, and new work starts as a task.
    let read = cluster.client.get_task(&token, &running).await;
    assert_eq!(read.result()["status"], "working", "{read:?}");
    support::create_task(
        &cluster.client,
        &token,
        "slow_compute",
        json!({"seconds": 0.05}),
    )
    .await;
    let anonymous = cluster
        .client
        .call_tool("not-a-token", "slow_compute", json!({"seconds": 0.05}))
        .await;
    assert_eq!(anonymous.status, 401, "still enforcing, not failing open");

    // Back: the sidecar dials again by itself and follows the new snapshot.
    cluster.fake.come_back().await;
    let v2 = cluster
        .fake
        .push(Some(compiled(&cluster.fake, WRITE_ROWS_ONLY, "")), None);
    cluster.connections(2).await;
    cluster
        .ready_saying(&format!("control plane connected, snapshot version {v2}"))
        .await;
    assert!(cluster.fake.ack_of(v2).await.is_some());
    assert!(
        cluster
            .sidecar
            .metric("lifeguard_control_plane_reconnects_total")
            .await
            >= 1.0
    );
    let events = cluster.fake.events();
    let kinds: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            Event::Connected { .. } => Some("connected"),
            Event::Dropped => Some("dropped"),
            _ => None,
        })
        .collect();
    assert_eq!(kinds, vec!["connected", "dropped", "connected"]);
    cluster.client.cancel_task(&token, &running).await;
}

#[tokio::test]
async fn a_restart_without_the_control_plane_enforces_the_persisted_snapshot() {
    let mut cluster = start().await;
    let policy = compiled(&cluster.fake, TASKS, "");
    let v1 = cluster.fake.push(Some(policy.clone()), None);
    cluster.ready_saying("control plane connected").await;
    cluster.fake.ack_of(v1).await.expect("acked");
    let token = alice().token();
    let task = support::create_task(
        &cluster.client,
        &token,
        "slow_compute",
        json!({"seconds": 30}),
    )
    .await;
    let persisted = cluster
        .sidecar
        .ledger_path
        .with_file_name("ledger.db.snapshot.json");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&persisted).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    cluster.fake.go_down().await;
    cluster.sidecar = cluster.sidecar.respawn_after_kill();
    cluster.client = McpClient::new(&cluster.sidecar.url);
    let body = cluster
        .ready_saying(&format!("enforcing the persisted snapshot version {v1}"))
        .await;
    assert!(body.contains(&policy.hash()), "{body}");
    let read = cluster.client.get_task(&token, &task).await;
    assert_eq!(read.result()["status"], "working", "{read:?}");
    let refused = cluster
        .client
        .call_tool("not-a-token", "slow_compute", json!({"seconds": 0.05}))
        .await;
    assert_eq!(refused.status, 401);

    // The operator returns: the new process acks the snapshot on its own session.
    cluster.fake.come_back().await;
    let acked_again = support::eventually(WAIT, async || {
        let acks: Vec<_> = cluster
            .fake
            .acks()
            .into_iter()
            .filter(|a| a.version == v1)
            .collect();
        (acks.len() >= 2).then_some(acks)
    })
    .await
    .expect("acked by the restarted sidecar");
    assert_ne!(acked_again[0].session, acked_again[1].session);
    cluster.client.cancel_task(&token, &task).await;
}

#[tokio::test]
async fn an_edited_persisted_snapshot_never_lifts_a_revocation_after_a_restart() {
    let mut cluster = start().await;
    let revoked_before = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1);
    let revoking = compiled(
        &cluster.fake,
        TASKS,
        &revocation("alice-session", "alice", revoked_before),
    );
    let version = cluster.fake.push(Some(revoking), None);
    cluster.fake.ack_of(version).await.expect("acked");
    let token = alice().token();
    let refused = cluster
        .client
        .call_tool(&token, "slow_compute", json!({"seconds": 0.05}))
        .await;
    assert_ne!(
        refused.status, 200,
        "the revoked user is refused: {refused:?}"
    );

    // With the operator away, someone who can write the volume removes the revocation from the
    // persisted snapshot (and makes it look newer), then the sidecar restarts.
    cluster.fake.go_down().await;
    let persisted = cluster
        .sidecar
        .ledger_path
        .with_file_name("ledger.db.snapshot.json");
    let mut file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&persisted).unwrap()).unwrap();
    let snapshot = if file.get("snapshot").is_some() {
        &mut file["snapshot"]
    } else {
        &mut file
    };
    assert_eq!(
        snapshot["policy"]["revocations"][0]["name"],
        "alice-session"
    );
    snapshot["policy"]["revocations"] = json!([]);
    snapshot["version"] = json!(version + 1);
    std::fs::write(&persisted, serde_json::to_vec(&file).unwrap()).unwrap();
    restart_fails_closed(
        cluster,
        "is not authenticated by this sidecar's ledger key",
        "the edit",
    )
    .await;
}

/// Restarts the sidecar (the operator away) and checks that it refused its persisted snapshot:
/// the log says `refusal`, alice (revoked by the refused file's successor) gets 503 and `/ready`
/// has no snapshot.
async fn restart_fails_closed(mut cluster: Cluster, refusal: &str, what: &str) {
    cluster.sidecar = cluster.sidecar.respawn_after_kill();
    cluster.client = McpClient::new(&cluster.sidecar.url);
    let complained = support::eventually(WAIT, async || {
        cluster.sidecar.logs().contains(refusal).then_some(())
    })
    .await;
    let after = cluster
        .client
        .call_tool(&alice().token(), "slow_compute", json!({"seconds": 0.05}))
        .await;
    assert_eq!(
        after.status, 503,
        "{what} re-admitted a revoked user: {after:?}"
    );
    assert!(complained.is_some(), "{}", cluster.sidecar.logs());
    let (status, body) = cluster.sidecar.ready().await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("no snapshot received yet"), "{body}");
}

/// A restored older copy of the persisted snapshot (genuine: this sidecar wrote it) must not
/// lift a revocation a newer snapshot carried: its generation is behind the ledger's.
#[tokio::test]
async fn an_older_persisted_snapshot_never_lifts_a_revocation_after_a_restart() {
    let mut cluster = start().await;
    let persisted = cluster
        .sidecar
        .ledger_path
        .with_file_name("ledger.db.snapshot.json");
    let before = cluster
        .fake
        .push(Some(compiled(&cluster.fake, TASKS, "")), None);
    cluster.fake.ack_of(before).await.expect("acked");
    // The sidecar persists a snapshot before acking it.
    let older = std::fs::read(&persisted).unwrap();
    let revoked_before = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1);
    let revoking = compiled(
        &cluster.fake,
        TASKS,
        &revocation("alice-session", "alice", revoked_before),
    );
    let version = cluster.fake.push(Some(revoking), None);
    cluster.fake.ack_of(version).await.expect("acked");
    let refused = cluster
        .client
        .call_tool(&alice().token(), "slow_compute", json!({"seconds": 0.05}))
        .await;
    assert_ne!(refused.status, 200, "revoked: {refused:?}");
    let newer = std::fs::read(&persisted).unwrap();
    assert_ne!(newer, older, "the newer snapshot is persisted");
    let generation = |bytes: &[u8]| {
        serde_json::from_slice::<serde_json::Value>(bytes).unwrap()["generation"].to_string()
    };
    let stale = format!(
        "is generation {} of this sidecar's snapshot but the ledger's last is {}",
        generation(&older),
        generation(&newer)
    );

    // With the operator away, the state directory's older file is put back (a restored
    // backup), and the sidecar restarts.
    cluster.fake.go_down().await;
    std::fs::write(&persisted, &older).unwrap();
    restart_fails_closed(
        cluster,
        &format!("ledger.db.snapshot.json {stale}"),
        "the older file",
    )
    .await;
}

#[tokio::test]
async fn a_pod_no_policy_selects_is_ready_and_refuses_every_request() {
    let cluster = start().await;
    let token = alice().token();
    let v1 = cluster.fake.push(None, None);
    let body = cluster
        .ready_saying("no McpServerPolicy selects this pod")
        .await;
    assert!(body.contains("team-a/reports-0"), "{body}");
    let refused = cluster
        .client
        .call_tool(&token, "write_rows", json!({"count": 1}))
        .await;
    assert_eq!(refused.status, 503, "{refused:?}");
    let message = refused.body["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        message.contains("no McpServerPolicy selects this pod"),
        "{refused:?}"
    );
    let ack = cluster.fake.ack_of(v1).await.expect("acked");
    assert_eq!(ack.policy_hash, None);

    // A policy enables the pod; withdrawing it refuses everything again.
    cluster
        .fake
        .push(Some(compiled(&cluster.fake, TASKS, "")), None);
    cluster.ready_saying("ready: policy").await;
    support::create_task(
        &cluster.client,
        &token,
        "slow_compute",
        json!({"seconds": 0.05}),
    )
    .await;
    let v3 = cluster.fake.push(None, None);
    cluster
        .ready_saying("no McpServerPolicy selects this pod")
        .await;
    let refused = cluster
        .client
        .call_tool(&token, "slow_compute", json!({"seconds": 0.05}))
        .await;
    assert_eq!(refused.status, 503, "{refused:?}");
    assert!(cluster.fake.ack_of(v3).await.is_some());
}

#[tokio::test]
async fn the_control_plane_must_present_a_trusted_certificate() {
    // Trusted through SSL_CERT_FILE (added to the system roots): connects, and the issuer's
    // JWKS (signed by the same CA) loads too.
    let trusted = start_with(&[], Trust::SslCertFile).await;
    trusted
        .fake
        .push(Some(compiled(&trusted.fake, TASKS, "")), None);
    trusted.ready_saying("control plane connected").await;

    // Not trusted at all: the handshake fails, nothing is enabled.
    let untrusted = start_with(&[], Trust::Nothing).await;
    untrusted
        .fake
        .push(Some(compiled(&untrusted.fake, TASKS, "")), None);
    let complained = support::eventually(WAIT, async || {
        let logs = untrusted.sidecar.logs();
        (logs.contains("no connection to the control plane") && logs.contains("certificate"))
            .then_some(())
    })
    .await;
    assert!(complained.is_some(), "{}", untrusted.sidecar.logs());
    assert!(untrusted.fake.bearers().is_empty());
    assert_eq!(untrusted.sidecar.ready().await.0, 503);
}

#[tokio::test]
async fn with_control_plane_ca_the_stream_trusts_that_ca_alone() {
    // The fake's CA is trusted through SSL_CERT_FILE (as a public or injected root would be),
    // but --control-plane-ca names another CA: the fake is an impostor and gets no token.
    let dir = tempfile::tempdir().unwrap();
    let other = support::operator::TestCa::new(dir.path());
    let impostor = start_with(&[], Trust::PinnedElsewhere(other.ca_path.clone())).await;
    impostor
        .fake
        .push(Some(compiled(&impostor.fake, TASKS, "")), None);
    let complained = support::eventually(WAIT, async || {
        let logs = impostor.sidecar.logs();
        (logs.contains("no connection to the control plane") && logs.contains("certificate"))
            .then_some(())
    })
    .await;
    assert!(complained.is_some(), "{}", impostor.sidecar.logs());
    assert!(
        impostor.fake.bearers().is_empty(),
        "the token went to a control plane only SSL_CERT_FILE vouches for"
    );
    assert_eq!(impostor.sidecar.ready().await.0, 503);
}

#[test]
fn exactly_one_policy_source_and_approver_keys_only_with_a_file() {
    let run = |args: &[&str]| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_lifeguard"));
        command
            .args(["sidecar", "--upstream", "http://127.0.0.1:9/mcp"])
            .args(["--ledger", "/nonexistent/ledger.db"])
            .args(args);
        let output = support::process::run_to_completion(
            command,
            "lifeguard sidecar",
            Duration::from_secs(30),
        );
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let cluster = [
        "--control-plane",
        "https://127.0.0.1:9",
        "--token-file",
        "t",
    ];
    let (code, err) = run(&[&["--policy", "p.yaml"][..], &cluster[..]].concat());
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("cannot be used with"), "{err}");
    let (code, err) = run(&[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--policy") && err.contains("--control-plane"),
        "{err}"
    );
    let (code, err) = run(&[&cluster[..], &["--approver-keys", "k.json"][..]].concat());
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--approver-keys"), "{err}");
}
