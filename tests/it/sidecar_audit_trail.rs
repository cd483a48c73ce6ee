//! The audit trail reconstructs a task, black box: every event of a task carries the task's
//! correlation ID (the ID of the request that created it) and its own `requestId`, terminal
//! events say how long the task ran, how it ended and what result was kept (size and digest),
//! and with `audit.identityDigests` no subject or tenant appears in the clear.

use crate::support;

use std::collections::HashSet;
use std::process::Command;

use serde_json::{Value, json};
use support::User;

const TOOLS: &str = "  tasks:\n    minPollInterval: 10ms\n    tools: [slow_compute]\n";

fn is_sha256(value: &Value) -> bool {
    value
        .as_str()
        .is_some_and(|h| h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()))
}

#[tokio::test]
async fn every_event_of_a_task_carries_its_correlation_id_and_the_end_is_described() {
    let (_server, sidecar, client) = support::start_behind_sidecar(TOOLS).await;
    let alice = User::new("alice", "tenant-a", "console").token();
    let bob = User::new("bob", "tenant-a", "console").token();
    let id = support::create_task(
        &client,
        &alice,
        "slow_compute",
        json!({"seconds": 0, "label": "audit"}),
    )
    .await;
    // Someone else's attempt belongs to the task's story too.
    let foreign = client.get_task(&bob, &id).await;
    assert_eq!(foreign.error_code(), Some(-32602), "{foreign:?}");
    let done = client.wait_terminal(&alice, &id, 10_000).await;
    assert_eq!(done.result()["status"], "completed", "{done:?}");

    let completed = sidecar
        .audit_event(|e| e["event"] == "task.completed")
        .await
        .expect("task.completed audited");
    sidecar
        .audit_event(|e| e["event"] == "task.result_read")
        .await
        .expect("task.result_read audited");
    let audit = sidecar.audit();
    let created = audit
        .iter()
        .find(|e| e["event"] == "task.created")
        .expect("task.created audited");
    let correlation = created["correlation_id"].as_str().unwrap().to_owned();
    assert_eq!(
        created["requestId"], correlation,
        "a task's correlation ID is the ID of the request that created it"
    );
    let task = &created["task"];
    let of_task: Vec<&Value> = audit.iter().filter(|e| &e["task"] == task).collect();
    let events: HashSet<&str> = of_task
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    for expected in [
        "task.created",
        "task.denied",
        "task.completed",
        "task.result_read",
    ] {
        assert!(events.contains(expected), "{expected} missing: {of_task:?}");
    }
    for event in &of_task {
        assert_eq!(event["correlation_id"], correlation.as_str(), "{event}");
        assert!(
            event["policy_hash"].as_str().is_some_and(|h| !h.is_empty()),
            "{event}"
        );
    }
    let requests: HashSet<&str> = of_task
        .iter()
        .map(|e| e["requestId"].as_str().unwrap())
        .collect();
    assert!(
        requests.len() >= 3,
        "creation, bob's poll and alice's polls are separate requests: {of_task:?}"
    );
    let denied = of_task
        .iter()
        .find(|e| e["event"] == "task.denied")
        .unwrap();
    assert_eq!(denied["subject"], "bob");
    assert_ne!(denied["requestId"], correlation.as_str());

    assert_eq!(completed["detail"]["endReason"], "upstream");
    assert!(completed["detail"]["durationMs"].as_i64().unwrap() >= 0);
    let result = &completed["detail"]["result"];
    assert!(result["bytes"].as_u64().unwrap() > 0, "{completed}");
    assert!(is_sha256(&result["sha256"]), "{completed}");
    let raw = std::fs::read_to_string(&sidecar.audit_path).unwrap();
    assert!(
        !raw.contains("computed for audit"),
        "the result itself never appears"
    );
}

#[tokio::test]
async fn a_cancelled_task_names_its_end_reason_and_who_ended_it() {
    let (_server, sidecar, client) = support::start_behind_sidecar(TOOLS).await;
    let alice = User::new("alice", "tenant-a", "console").token();
    let id = support::create_task(
        &client,
        &alice,
        "slow_compute",
        json!({"seconds": 30, "label": "long"}),
    )
    .await;
    let cancelled = client.cancel_task(&alice, &id).await;
    assert_eq!(cancelled.status, 200, "{cancelled:?}");
    let ended = sidecar
        .audit_event(|e| e["event"] == "task.cancelled")
        .await
        .expect("task.cancelled audited");
    assert_eq!(ended["reason"], "owner_cancel");
    assert_eq!(ended["detail"]["endReason"], "owner_cancel");
    assert!(ended["detail"]["durationMs"].as_i64().unwrap() >= 0);
    let created = sidecar
        .audit_event(|e| e["event"] == "task.created")
        .await
        .unwrap();
    assert_eq!(ended["correlation_id"], created["correlation_id"]);
    assert_ne!(ended["requestId"], created["requestId"]);
}

#[tokio::test]
async fn identity_digests_hide_subjects_and_tenants_and_the_cli_tells_whose_they_are() {
    let spec = format!(
        "{TOOLS}    adminCancelScope: lifeguard:tasks:admin\n  audit: {{identityDigests: true}}\n"
    );
    let (_server, sidecar, client) = support::start_behind_sidecar(&spec).await;
    let alice = User::new("alice-sensitive", "tenant-secret", "console").token();
    let bob = User::new("bob-sensitive", "tenant-secret", "console").token();
    let id = support::create_task(
        &client,
        &alice,
        "slow_compute",
        json!({"seconds": 30, "label": "x"}),
    )
    .await;
    let foreign = client.get_task(&bob, &id).await;
    assert_eq!(foreign.error_code(), Some(-32602), "{foreign:?}");
    let created = sidecar
        .audit_event(|e| e["event"] == "task.created")
        .await
        .expect("task.created audited");
    let denied = sidecar
        .audit_event(|e| e["event"] == "task.denied")
        .await
        .expect("task.denied audited");

    let digest = |value: &str| {
        let output = Command::new(env!("CARGO_BIN_EXE_lifeguard"))
            .args(["audit", "digest", "--ledger"])
            .arg(&sidecar.ledger_path)
            .arg(value)
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        let line = String::from_utf8(output.stdout).unwrap();
        let (name, digest) = line.trim_end().split_once('\t').unwrap();
        assert_eq!(name, value);
        digest.to_owned()
    };
    let alice_digest = digest("alice-sensitive");
    assert!(alice_digest.starts_with("h:") && alice_digest.len() == 34);
    assert_eq!(created["subject"], alice_digest.as_str());
    assert_eq!(created["tenant"], digest("tenant-secret").as_str());
    assert_eq!(denied["subject"], digest("bob-sensitive").as_str());
    assert_ne!(
        created["subject"], denied["subject"],
        "principals still differ"
    );
    assert_eq!(created["client"], "console", "clients stay in the clear");

    // An admin's cancel names the task's owner in its detail: as a digest too.
    let admin = User::new("ops", "tenant-secret", "console")
        .with_scopes("lifeguard:tasks:admin")
        .token();
    let cancelled = client.cancel_task(&admin, &id).await;
    assert_eq!(cancelled.status, 200, "{cancelled:?}");
    let requested = sidecar
        .audit_event(|e| e["event"] == "task.cancel_requested" && e["reason"] == "admin")
        .await
        .expect("task.cancel_requested audited");
    assert_eq!(requested["subject"], digest("ops").as_str());
    assert_eq!(
        requested["detail"]["taskOwner"]["subject"],
        alice_digest.as_str()
    );
    let ended = sidecar
        .audit_event(|e| e["event"] == "task.admin_cancelled")
        .await
        .expect("task.admin_cancelled audited");
    assert_eq!(ended["subject"], alice_digest.as_str());
    assert_eq!(
        ended["detail"]["endedBy"]["subject"],
        digest("ops").as_str()
    );
    assert_eq!(ended["correlation_id"], created["correlation_id"]);

    // Nothing names them in the clear anywhere in the trail.
    let raw = std::fs::read_to_string(&sidecar.audit_path).unwrap();
    for name in ["alice-sensitive", "bob-sensitive", "tenant-secret"] {
        assert!(!raw.contains(name), "{name} in the clear: {raw}");
    }
}

/// `VALUE<TAB>DIGEST` lines, as pairs.
type Digests = Vec<(String, String)>;

/// `lifeguard audit digest` with `args`: each `VALUE<TAB>DIGEST` line, or the exit code and
/// stderr of the failure.
fn audit_digest(args: &[&str]) -> Result<Digests, (Option<i32>, String)> {
    let output = Command::new(env!("CARGO_BIN_EXE_lifeguard"))
        .args(["audit", "digest"])
        .args(args)
        .output()
        .unwrap();
    if !output.status.success() {
        return Err((
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        ));
    }
    Ok(String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (value, digest) = l.split_once('\t').expect("VALUE<TAB>DIGEST");
            (value.to_owned(), digest.to_owned())
        })
        .collect())
}

/// `audit digest --task` maps a task ID (the sidecar's, or any ID a client sent) to the `task`
/// hash its audit events carry; and `task.created` is the task's start: the event says the task
/// is `working` from its first answer, and no separate start event exists (the protocol has no
/// queued state, docs/sidecar.md "Audit trail").
#[tokio::test]
async fn the_cli_names_the_audit_hash_of_a_task_id_and_creation_is_the_start() {
    let (_server, sidecar, client) = support::start_behind_sidecar(TOOLS).await;
    let alice = User::new("alice", "tenant-a", "console").token();
    let bob = User::new("bob", "tenant-a", "console").token();
    let id = support::create_task(
        &client,
        &alice,
        "slow_compute",
        json!({"seconds": 30, "label": "digest"}),
    )
    .await;
    let forged = "lgt_not-a-task-anyone-was-given";
    let foreign = client.get_task(&bob, forged).await;
    assert_eq!(foreign.error_code(), Some(-32602), "{foreign:?}");
    let polled = client.get_task(&alice, &id).await;
    assert_eq!(polled.result()["status"], "working", "{polled:?}");
    let created = sidecar
        .audit_event(|e| e["event"] == "task.created")
        .await
        .expect("task.created audited");
    let refused = sidecar
        .audit_event(|e| e["event"] == "task.denied" && e["reason"] == "unknown")
        .await
        .expect("the forged ID's refusal audited");

    let ledger = sidecar.ledger_path.to_str().unwrap();
    let lines = audit_digest(&["--ledger", ledger, "--task", &id, forged]).expect("digests");
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0].0, id);
    assert_eq!(created["task"], lines[0].1.as_str(), "{created}");
    assert!(lines[0].1.starts_with("h:") && !lines[0].1.contains(&id));
    assert_eq!(lines[1].0, forged);
    assert_eq!(refused["task"], lines[1].1.as_str(), "{refused}");
    // Every event of the task carries that hash.
    let audit = sidecar.audit();
    let of_task: Vec<&Value> = audit
        .iter()
        .filter(|e| e["correlation_id"] == created["correlation_id"])
        .collect();
    assert!(of_task.len() >= 2, "{of_task:?}");
    for event in of_task {
        assert_eq!(event["task"], lines[0].1.as_str(), "{event}");
    }
    // The identity key is another key: the same text digests differently without --task.
    let as_identity = audit_digest(&["--ledger", ledger, &id]).expect("identity digest");
    assert_ne!(as_identity[0].1, lines[0].1);

    // Creation is the start: the first answer already says `working`.
    assert_eq!(created["detail"]["status"], "working", "{created}");
    assert!(
        !audit.iter().any(|e| e["event"] == "task.started"),
        "no separate start event"
    );

    // A mistyped ledger is an error, not digests under a brand-new key.
    let missing = sidecar.ledger_path.with_file_name("no-such-ledger.db");
    let (code, stderr) = audit_digest(&["--ledger", missing.to_str().unwrap(), "--task", &id])
        .expect_err("a missing ledger is refused");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("no ledger at"), "{stderr}");
    assert!(!missing.exists(), "the missing ledger was created");
    let (code, stderr) = audit_digest(&["--ledger", ledger, "--task", "--object-type", "t", &id])
        .expect_err("--task and --object-type together are refused");
    assert_eq!(code, Some(2), "{stderr}");
    client.cancel_task(&alice, &id).await;
}
