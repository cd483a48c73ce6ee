//! Scale-out, black box: three replicas of one MCP server (three example servers, three
//! sidecars on one PostgreSQL ledger, each with its internal hop) and a client that spreads its
//! requests over them as a Service would. Every guarantee holds in aggregate: tasks are served
//! to their owner through any replica and to nobody else, quotas and idempotency keys count
//! across replicas, a revocation cancels on every replica, a replica that dies fails its tasks,
//! and a listen stream on one replica hears about tasks homed on another.

use crate::support;

use std::time::Duration;

use serde_json::{Value, json};
use support::User;
use support::capability::{Grant, next_state, summarize};
use support::listen::ListenStream;
use support::replicas::{ReplicaOptions, Replicas};

const SPEC: &str = "  tasks:\n    minPollInterval: 10ms\n  listen:\n    notifications: [taskIds]\n";
const WAIT: Duration = Duration::from_secs(20);

fn options(spec: &str) -> ReplicaOptions {
    ReplicaOptions {
        spec: spec.to_owned(),
        ..Default::default()
    }
}

/// A long task of `token`'s owner created through `client`; the sidecar's ID.
async fn long_task(client: &support::McpClient, token: &str, label: &str) -> String {
    support::create_task(
        client,
        token,
        "write_rows",
        json!({"count": 100_000, "intervalMs": 50, "label": label}),
    )
    .await
}

/// The example server's own view of its tasks (status by the server's ID).
async fn upstream_statuses(server: &support::ExampleServer) -> Vec<String> {
    let tasks = server.debug("/_example/tasks").await;
    tasks
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["status"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_task_is_served_to_its_owner_through_any_replica_and_to_nobody_else() {
    let r = Replicas::start(3, options(SPEC)).await;
    let alice = User::new("alice", "tenant-a", "console").token();
    let bob = User::new("bob", "tenant-a", "console").token();
    let mut tasks = Vec::new();
    for home in 0..3 {
        tasks.push(long_task(r.client(home), &alice, &format!("t{home}")).await);
        // Each task's work runs on the server of the replica that created it.
        assert_eq!(upstream_statuses(&r.servers[home]).await, ["working"]);
    }

    // Every replica answers the owner about every task; the answer is the home's.
    let unknown = r.client(0).get_task(&alice, "lgt_no-such-task").await;
    for (home, task) in tasks.iter().enumerate() {
        for via in 0..3 {
            let read = r.client(via).get_task(&alice, task).await;
            assert_eq!(read.status, 200, "home {home} via {via}: {read:?}");
            assert_eq!(read.result()["taskId"], task.as_str());
            assert_eq!(read.result()["status"], "working", "{read:?}");
            // Nobody else learns anything, through any replica: the same answer as for an ID
            // that never existed.
            let foreign = r.client(via).get_task(&bob, task).await;
            assert_eq!(foreign.status, unknown.status);
            assert_eq!(foreign.body_without_id(), unknown.body_without_id());
            let cancel = r.client(via).cancel_task(&bob, task).await;
            assert_eq!(cancel.body_without_id(), unknown.body_without_id());
        }
        // Updates pass through another replica to the home.
        let update = r
            .client(home + 1)
            .request(
                "tasks/update",
                json!({"taskId": task, "inputResponses": {}}),
            )
            .token(&alice)
            .send()
            .await;
        assert_eq!(update.status, 200, "{update:?}");
    }
    // Six reads and three updates went to another replica than the task's home: each was
    // forwarded once, and authenticated once on arrival. Bob's never left the replica he asked.
    assert_eq!(
        r.metric_sum("lifeguard_hop_forwarded_total{reason=\"answered\"}")
            .await,
        9.0
    );
    assert_eq!(r.metric_sum("lifeguard_hop_received_total").await, 9.0);

    // Cancelled through a replica that is not its home: the home's server stops it.
    for (home, task) in tasks.iter().enumerate() {
        let ack = r.client(home + 2).cancel_task(&alice, task).await;
        assert_eq!(ack.status, 200, "{ack:?}");
        let read = r.client(home + 1).wait_terminal(&alice, task, 20_000).await;
        assert_eq!(read.result()["status"], "cancelled", "{read:?}");
        assert_eq!(upstream_statuses(&r.servers[home]).await, ["cancelled"]);
    }
    // Bob's attempts changed nothing and reached no server.
    for server in &r.servers {
        assert_eq!(upstream_statuses(server).await.len(), 1);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn quotas_and_idempotency_keys_count_across_replicas() {
    let spec = "  tasks:\n    minPollInterval: 10ms\n    concurrency: {perPrincipal: 2}\n";
    let r = Replicas::start(3, options(spec)).await;
    let alice = User::new("alice", "tenant-a", "console").token();
    long_task(r.client(0), &alice, "a").await;
    long_task(r.client(1), &alice, "b").await;
    // The third, through the third replica, is over her quota of two: the replicas share it.
    let third = r
        .client(2)
        .call_tool(
            &alice,
            "write_rows",
            json!({"count": 100, "intervalMs": 50, "label": "c"}),
        )
        .await;
    assert_eq!(third.status, 429, "{third:?}");
    assert_eq!(third.error_code(), Some(-31429), "{third:?}");
    assert!(upstream_statuses(&r.servers[2]).await.is_empty());

    // Twenty concurrent creates with one Idempotency-Key, spread over the three replicas:
    // one task.
    let bob = User::new("bob", "tenant-b", "console").token();
    let creates = (0..20).map(|i| {
        r.client(i)
            .request(
                "tools/call",
                json!({"name": "write_rows",
                       "arguments": {"count": 100_000, "intervalMs": 50, "label": "once"}}),
            )
            .token(&bob)
            .header("Idempotency-Key", "monthly-report-2026-11")
            .send()
    });
    let replies = futures_util::future::join_all(creates).await;
    let ids: std::collections::BTreeSet<String> = replies
        .iter()
        .map(|reply| {
            assert_eq!(reply.status, 200, "{reply:?}");
            reply.result()["taskId"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    let mut once = 0;
    for server in &r.servers {
        once += server
            .debug("/_example/tasks")
            .await
            .as_array()
            .unwrap()
            .len();
    }
    assert_eq!(
        once, 3,
        "alice's two tasks and bob's one reached the servers"
    );
}

fn revocation(subject: &str) -> String {
    let before = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(60);
    format!(
        r#"---
apiVersion: lifeguard.dev/v1alpha1
kind: PrincipalRevocation
metadata: {{name: revoke-{subject}}}
spec:
  issuer: {}
  subject: {subject}
  revokedBefore: "{before}"
  reason: accountDisabled
  source: {{kind: manual}}
"#,
        support::ISSUER
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_revocation_cancels_the_principals_tasks_on_every_replica() {
    let r = Replicas::start(3, options(SPEC)).await;
    let alice = User::new("alice", "tenant-a", "console");
    let bob = User::new("bob", "tenant-a", "console").token();
    let mut alices = Vec::new();
    for home in 0..3 {
        alices.push(long_task(r.client(home), &alice.token(), &format!("alice-{home}")).await);
    }
    let bobs = long_task(r.client(1), &bob, "bob").await;

    // Every replica's policy file gets the revocation, as every sidecar gets it from the
    // operator in a cluster.
    for sidecar in &r.sidecars {
        let mut policy = std::fs::read_to_string(sidecar.policy_file()).unwrap();
        policy.push_str(&revocation("alice"));
        let tmp = sidecar.policy_file().with_extension("tmp");
        std::fs::write(&tmp, policy).unwrap();
        std::fs::rename(&tmp, sidecar.policy_file()).unwrap();
    }
    // Each home's server stops alice's work; bob's runs on.
    for home in 0..3 {
        let stopped = support::eventually(WAIT, async || {
            let statuses = upstream_statuses(&r.servers[home]).await;
            statuses
                .iter()
                .any(|s| s == "cancelled")
                .then_some(statuses)
        })
        .await;
        assert!(
            stopped.is_some(),
            "replica {home}:\n{}",
            r.sidecars[home].logs()
        );
    }
    assert_eq!(
        upstream_statuses(&r.servers[1]).await,
        ["cancelled", "working"],
        "alice's cancelled, bob's working"
    );
    let read = r.client(2).get_task(&bob, &bobs).await;
    assert_eq!(read.result()["status"], "working");
    // Her tasks read cancelled through every replica (to an administrator's view: her tokens
    // are refused now, so look at the audit trail of each home instead).
    for (home, task) in alices.iter().enumerate() {
        let hashed = r.sidecars[home]
            .audit_event(|e| e["event"] == "task.cancelled" && e["reason"] == "revocation")
            .await;
        assert!(
            hashed.is_some(),
            "replica {home} recorded the end of {task}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_that_dies_fails_its_unfinished_tasks_and_the_owner_learns_on_the_next_poll() {
    let r = Replicas::start(
        3,
        ReplicaOptions {
            heartbeat_ttl: Some("3s".into()),
            ..options(SPEC)
        },
    )
    .await;
    let mut r = r;
    let alice = User::new("alice", "tenant-a", "console").token();
    let doomed = long_task(r.client(1), &alice, "doomed").await;
    let safe = long_task(r.client(2), &alice, "safe").await;
    // Replica 1 goes away with its server (a deleted pod).
    r.sidecars[1].kill_hard();
    drop(r.servers.remove(1));

    let failed = support::eventually(WAIT, async || {
        let read = r.client(0).get_task(&alice, &doomed).await;
        (read.result()["status"] == "failed").then_some(read)
    })
    .await
    .expect("the dead replica's task fails");
    let message = failed.result()["statusMessage"].as_str().unwrap();
    assert!(
        message.contains("replica-1") && message.contains("stopped"),
        "{message}"
    );
    // The other replicas' tasks are untouched.
    let read = r.client(0).get_task(&alice, &safe).await;
    assert_eq!(read.result()["status"], "working", "{read:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_listen_stream_on_one_replica_hears_about_tasks_homed_on_another() {
    let r = Replicas::start(2, options(SPEC)).await;
    let alice = User::new("alice", "tenant-a", "console").token();
    let bob = User::new("bob", "tenant-a", "console").token();
    let task = support::create_task(
        r.client(0),
        &alice,
        "write_rows",
        json!({"count": 4, "intervalMs": 200, "label": "heard"}),
    )
    .await;
    let mut stream = ListenStream::open(
        &r.client(1).url,
        &alice,
        json!("far"),
        json!({"taskIds": [task]}),
        true,
    )
    .await;
    let ack = stream.next(WAIT).await.expect("acknowledgement");
    assert_eq!(
        ack["params"]["notifications"]["taskIds"],
        json!([task]),
        "{ack}"
    );
    let frames = stream.drain(Duration::from_secs(5)).await;
    let about: Vec<&Value> = frames
        .iter()
        .filter(|f| f["method"] == "notifications/tasks")
        .collect();
    assert!(!about.is_empty(), "{frames:?}");
    assert!(about.iter().all(|f| f["params"]["taskId"] == task.as_str()));
    assert!(
        about
            .iter()
            .all(|f| f["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "far"),
        "tagged with this listener's subscription: {about:?}"
    );
    assert_eq!(about.last().unwrap()["params"]["status"], "completed");
    assert!(about.iter().all(|f| f["params"].get("result").is_none()));

    // Bob subscribing to her task through either replica hears nothing of it.
    let mut foreign = ListenStream::open(
        &r.client(1).url,
        &bob,
        json!("nosy"),
        json!({"taskIds": [task]}),
        true,
    )
    .await;
    let ack = foreign.next(WAIT).await.expect("acknowledgement");
    assert_eq!(ack["params"]["notifications"].get("taskIds"), None, "{ack}");
}

#[tokio::test(flavor = "multi_thread")]
async fn exception_budgets_hold_in_aggregate_across_replicas() {
    let trust_dir = tempfile::tempdir().unwrap();
    let trust = trust_dir.path().join("approvers.jwks.json");
    std::fs::copy(
        support::repo().join("examples/approvers/approvers.jwks.json"),
        &trust,
    )
    .unwrap();
    let grant = Grant {
        per_minute: 3,
        ..Grant::sampling("rated", "console")
    };
    let r = Replicas::start(
        3,
        ReplicaOptions {
            spec: support::capability::spec("{sampling: exception}"),
            extra_documents: grant.signed(),
            approver_keys: Some(trust),
            ..Default::default()
        },
    )
    .await;
    // Nine principals, three per replica: the rate is per exception, across replicas.
    let tokens: Vec<String> = (0..9)
        .map(|i| User::new(&format!("user-{i}"), "tenant-a", "console").token())
        .collect();
    let mut tasks = Vec::new();
    for (i, token) in tokens.iter().enumerate() {
        tasks.push(summarize(r.client(i), token, json!({"maxTokens": 10})).await);
    }
    let states = futures_util::future::join_all(
        tokens
            .iter()
            .zip(&tasks)
            .enumerate()
            .map(|(i, (token, task))| next_state(r.client(i + 1), token, task)),
    )
    .await;
    let shown = states
        .iter()
        .filter(|s| s["status"] == "input_required")
        .count();
    assert_eq!(
        shown, 3,
        "three uses a minute in all, not per replica: {states:?}"
    );
    assert_eq!(
        states.iter().filter(|s| s["status"] == "failed").count(),
        6,
        "{states:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_home_answers_its_owners_polls_from_a_recent_read_and_never_anyone_elses() {
    let r = Replicas::start(2, options(SPEC)).await;
    let alice = User::new("alice", "tenant-a", "console").token();
    let bob = User::new("bob", "tenant-a", "console").token();
    let task = long_task(r.client(0), &alice, "memory").await;
    let home = &r.sidecars[0];
    let answers = "lifeguard_home_memory_answers_total";
    // Polls in quick succession: after the first read, the home answers from memory (for
    // `FRESH_FOR`, one second). Two polls back to back, then the metric: its scrape never
    // stands between a read and the poll that may be answered from it.
    let mut remembered = false;
    for _ in 0..20 {
        for _ in 0..2 {
            let read = r.client(0).get_task(&alice, &task).await;
            assert_eq!(read.result()["status"], "working", "{read:?}");
        }
        if home.metric(answers).await >= 1.0 {
            remembered = true;
            break;
        }
    }
    assert!(remembered, "no poll was answered from memory");
    // Someone else's request never is: it gets the uniform answer by the ledger path.
    let before = home.metric(answers).await;
    let unknown = r.client(0).get_task(&bob, "lgt_no-such-task").await;
    let foreign = r.client(0).get_task(&bob, &task).await;
    assert_eq!(foreign.status, unknown.status);
    assert_eq!(foreign.body_without_id(), unknown.body_without_id());
    assert_eq!(
        home.metric(answers).await,
        before,
        "bob was not answered from memory"
    );
    // A change this replica writes is seen by the very next request.
    let ack = r.client(0).cancel_task(&alice, &task).await;
    assert_eq!(ack.status, 200, "{ack:?}");
    let after = r.client(0).get_task(&alice, &task).await;
    let shown = after.result()["statusMessage"].as_str().unwrap_or_default();
    assert!(
        after.result()["status"] == "cancelled" || shown.contains("cancellation requested"),
        "{after:?}"
    );
    // Through the other replica, the forwarded request is answered by the home the same way.
    let via = r.client(1).get_task(&alice, &task).await;
    assert_ne!(via.result()["statusMessage"], json!(null), "{via:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_administrator_cancels_through_any_replica_and_the_home_server_stops() {
    let spec = "  tasks:\n    adminCancelScope: lifeguard:tasks:admin\n    minPollInterval: 10ms\n";
    let r = Replicas::start(3, options(spec)).await;
    let alice = User::new("alice", "tenant-a", "console").token();
    let admin = User::new("ops", "tenant-a", "ops-console")
        .with_scopes("lifeguard:tasks:admin")
        .token();
    let task = long_task(r.client(0), &alice, "admin").await;
    let ack = r.client(2).cancel_task(&admin, &task).await;
    assert_eq!(ack.status, 200, "{ack:?}");
    let read = r.client(1).wait_terminal(&alice, &task, 20_000).await;
    assert_eq!(read.result()["status"], "cancelled", "{read:?}");
    assert_eq!(upstream_statuses(&r.servers[0]).await, ["cancelled"]);
    // The home replica carried it out (and audited who asked).
    let audited = r.sidecars[0]
        .audit_event(|e| e["event"] == "task.admin_cancelled")
        .await;
    assert!(audited.is_some(), "{}", r.sidecars[0].logs());
}

/// Events of one kind in all the replicas' audit trails.
fn all_events(r: &Replicas, matches: impl Fn(&Value) -> bool) -> Vec<Value> {
    r.sidecars
        .iter()
        .flat_map(|s| s.audit())
        .filter(|e| matches(e))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn deadlines_and_retention_run_once_per_server_and_outlive_the_replica_running_them() {
    let spec = "  tasks:\n    deadline: {default: 2s}\n    retention: {defaultTtl: 30s, maxTtl: 30s}\n    minPollInterval: 10ms\n";
    let mut r = Replicas::start(
        3,
        ReplicaOptions {
            heartbeat_ttl: Some("3s".into()),
            ..options(spec)
        },
    )
    .await;
    let alice = User::new("alice", "tenant-a", "console").token();
    // The replica holding the sweeps' lease dies before any deadline passes.
    let holder = support::eventually(WAIT, async || lease_holder(&r).await)
        .await
        .expect("a replica takes the sweep lease");
    let dead: usize = holder.trim_start_matches("replica-").parse().unwrap();
    r.sidecars[dead].kill_hard();
    let alive: Vec<usize> = (0..3).filter(|i| *i != dead).collect();
    let mut tasks = Vec::new();
    for (n, home) in alive.iter().cycle().take(4).enumerate() {
        tasks.push((
            *home,
            long_task(r.client(*home), &alice, &format!("d{home}-{n}")).await,
        ));
    }
    // Every deadline is enforced by whichever replica holds the lease now: each task is
    // cancelled once, by its own home's server.
    for (home, task) in &tasks {
        let read = r.client(*home).wait_terminal(&alice, task, 60_000).await;
        assert_eq!(read.result()["status"], "failed", "{read:?}");
        let message = read.result()["statusMessage"].as_str().unwrap_or_default();
        assert!(message.starts_with("Deadline exceeded"), "{read:?}");
    }
    for home in &alive {
        assert_eq!(
            upstream_statuses(&r.servers[*home]).await,
            ["cancelled", "cancelled"],
            "home {home}"
        );
    }
    assert_ne!(lease_holder(&r).await, Some(holder), "the lease moved on");
    let requested = all_events(&r, |e| {
        e["event"] == "task.cancel_requested" && e["reason"] == "deadline"
    });
    assert_eq!(
        requested.len(),
        tasks.len(),
        "one deadline cancel per task: {requested:?}"
    );
    // Retention ends 30 s after creation (after the lease changed hands and the deadlines
    // were enforced): each task is purged once, then unknown.
    let purged = support::eventually(Duration::from_secs(60), async || {
        let purged = all_events(&r, |e| e["event"] == "task.expired");
        (purged.len() >= tasks.len()).then_some(purged)
    })
    .await
    .expect("every task purged");
    assert_eq!(purged.len(), tasks.len(), "purged once each: {purged:?}");
    let (home, task) = &tasks[0];
    let gone = r.client(*home).get_task(&alice, task).await;
    assert_eq!(gone.error_code(), Some(-32602), "{gone:?}");
}

/// The replica holding the sweep lease now, from the database.
async fn lease_holder(r: &Replicas) -> Option<String> {
    let (client, connection) = tokio_postgres::connect(&r.db.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let now = jiff::Timestamp::now().as_millisecond();
    client
        .query_opt(
            "SELECT holder FROM lifeguard_leases WHERE name = 'sweeper' AND held_until > $1",
            &[&now],
        )
        .await
        .unwrap()
        .map(|row| row.get(0))
}
