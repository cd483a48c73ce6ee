//! Crash harness: concurrent task creation and polling while a sidecar is killed with SIGKILL
//! and restarted, 20 times over, on SQLite (one replica) and on PostgreSQL (three replicas,
//! one of them killed per cycle). Afterwards: every task a client was told about is still
//! there for its owner (zero acknowledged tasks lost), every idempotency key names one task
//! however often it was retried across crashes (zero duplicates), and every task ends once its
//! deadline passes (none stuck). And the database itself going away: while PostgreSQL is
//! unreachable the sidecars create nothing (fail closed, with a retryable 503), and once it is
//! back they work again without being restarted.

use crate::support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use support::postgres::{DatabaseProxy, TestDatabase};
use support::replicas::{ReplicaOptions, Replicas};
use support::{ExampleServer, McpClient, Sidecar, SidecarOptions, User};

const CYCLES: usize = 20;
/// Every task's deadline: long tasks are cancelled by it, so all of them end.
const SPEC: &str = "  tasks:\n    deadline: {default: 3s}\n    minPollInterval: 10ms\n    concurrency: {perPrincipal: 500, perTenant: 500, perClient: 500, perServer: 500}\n";
const ARGS: [&str; 2] = ["--cancel-confirm-timeout", "2s"];

/// What the clients were told: idempotency key → task ID, and any key told two IDs.
#[derive(Default)]
struct Acknowledged {
    tasks: BTreeMap<String, String>,
    duplicates: Vec<(String, String, String)>,
}

impl Acknowledged {
    fn record(&mut self, key: &str, id: &str) {
        match self.tasks.get(key) {
            Some(known) if known != id => {
                self.duplicates
                    .push((key.to_owned(), known.clone(), id.to_owned()));
            }
            Some(_) => {}
            None => {
                self.tasks.insert(key.to_owned(), id.to_owned());
            }
        }
    }
}

/// Creates a task under `key` through `client`; its ID when the answer acknowledged one.
async fn create(client: &McpClient, token: &str, key: &str) -> Option<String> {
    // Half long (ended by the deadline), half short (complete on their own); a key always
    // asks for the same work, however often it is retried.
    let long = key
        .bytes()
        .map(usize::from)
        .sum::<usize>()
        .is_multiple_of(2);
    let args = if long {
        json!({"count": 100_000, "intervalMs": 20, "label": key})
    } else {
        json!({"count": 2, "intervalMs": 10, "label": key})
    };
    let reply = client
        .request(
            "tools/call",
            json!({"name": "write_rows", "arguments": args}),
        )
        .token(token)
        .header("Idempotency-Key", key)
        .send()
        .await;
    (reply.status == 200)
        .then(|| reply.result()["taskId"].as_str().map(str::to_owned))
        .flatten()
}

/// One cycle's load on `urls` until `stop`: creators with fresh keys (and, first, the keys
/// left unacknowledged by earlier cycles), pollers reading acknowledged tasks.
async fn load(
    urls: Vec<String>,
    token: String,
    cycle: usize,
    acked: Arc<Mutex<Acknowledged>>,
    retry: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
) {
    let mut workers = Vec::new();
    for w in 0..4 {
        let (urls, token, acked, retry, stop) = (
            urls.clone(),
            token.clone(),
            acked.clone(),
            retry.clone(),
            stop.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let pending = retry.lock().unwrap().pop();
                let key = pending.unwrap_or_else(|| format!("c{cycle}-w{w}-{n}"));
                let client = McpClient::new(&urls[(w + n) % urls.len()]);
                match create(&client, &token, &key).await {
                    Some(id) => acked.lock().unwrap().record(&key, &id),
                    None => retry.lock().unwrap().push(key),
                }
                n += 1;
            }
        }));
    }
    for p in 0..2 {
        let (urls, token, acked, stop) = (urls.clone(), token.clone(), acked.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            let mut n = p;
            while !stop.load(Ordering::Relaxed) {
                let id = {
                    let acked = acked.lock().unwrap();
                    let len = acked.tasks.len();
                    (len > 0).then(|| acked.tasks.values().nth(n % len).unwrap().clone())
                };
                if let Some(id) = id {
                    let _ = McpClient::new(&urls[n % urls.len()])
                        .get_task(&token, &id)
                        .await;
                }
                n += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    for worker in workers {
        let _ = worker.await;
    }
}

/// What a fleet of sidecars under test can do.
trait Fleet {
    fn urls(&self) -> Vec<String>;
    /// Kills one sidecar with SIGKILL and restarts it (cycle `cycle`).
    async fn crash(&mut self, cycle: usize);
}

struct Single {
    _server: ExampleServer,
    sidecar: Option<Sidecar>,
}

impl Fleet for Single {
    fn urls(&self) -> Vec<String> {
        vec![self.sidecar.as_ref().unwrap().url.clone()]
    }

    async fn crash(&mut self, _cycle: usize) {
        let sidecar = self.sidecar.take().unwrap();
        self.sidecar = Some(sidecar.restart_after_kill().await);
    }
}

impl Fleet for Replicas {
    fn urls(&self) -> Vec<String> {
        self.sidecars.iter().map(|s| s.url.clone()).collect()
    }

    async fn crash(&mut self, cycle: usize) {
        self.restart(cycle % self.sidecars.len()).await;
    }
}

/// Runs the cycles on `fleet` and checks what the clients were told against what is there.
async fn survive(fleet: &mut impl Fleet) {
    let alice = User::new("alice", "tenant-a", "console").token();
    let acked = Arc::new(Mutex::new(Acknowledged::default()));
    let retry = Arc::new(Mutex::new(Vec::new()));
    for cycle in 0..CYCLES {
        let stop = Arc::new(AtomicBool::new(false));
        let running = tokio::spawn(load(
            fleet.urls(),
            alice.clone(),
            cycle,
            acked.clone(),
            retry.clone(),
            stop.clone(),
        ));
        // Let the load run, then kill in the middle of it: after a while, and once this cycle
        // has had at least one creation acknowledged (a busy machine may need longer for the
        // first; the kill must never land on a cycle that did nothing).
        let before = acked.lock().unwrap().tasks.len();
        tokio::time::sleep(Duration::from_millis(150 + 37 * (cycle as u64 % 5))).await;
        let waiting = std::time::Instant::now();
        while acked.lock().unwrap().tasks.len() == before {
            assert!(
                waiting.elapsed() < Duration::from_secs(60),
                "cycle {cycle}: no creation acknowledged in 60 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        fleet.crash(cycle).await;
        stop.store(true, Ordering::Relaxed);
        running.await.unwrap();
        // Keys acknowledged before the crash still name the same task.
        let sample: Vec<(String, String)> = {
            let acked = acked.lock().unwrap();
            acked
                .tasks
                .iter()
                .step_by(7)
                .take(3)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        for (i, (key, _)) in sample.iter().enumerate() {
            let client = McpClient::new(&fleet.urls()[i % fleet.urls().len()]);
            if let Some(id) = create(&client, &alice, key).await {
                acked.lock().unwrap().record(key, &id);
            }
        }
    }
    // The keys never acknowledged, once more: each creates at most one task.
    let leftover: Vec<String> = retry.lock().unwrap().drain(..).collect();
    for (i, key) in leftover.iter().enumerate() {
        let client = McpClient::new(&fleet.urls()[i % fleet.urls().len()]);
        if let Some(id) = create(&client, &alice, key).await {
            acked.lock().unwrap().record(key, &id);
        }
    }

    let acked = std::mem::take(&mut *acked.lock().unwrap());
    eprintln!(
        "crash harness: {} tasks acknowledged over {CYCLES} cycles, {} keys retried at the end",
        acked.tasks.len(),
        leftover.len()
    );
    assert!(
        acked.tasks.len() >= CYCLES,
        "the load created too little to prove anything: {}",
        acked.tasks.len()
    );
    assert_eq!(acked.duplicates, [], "keys acknowledged with two task IDs");
    let urls = fleet.urls();
    let mut lost = Vec::new();
    for (i, id) in acked.tasks.values().enumerate() {
        let read = McpClient::new(&urls[i % urls.len()])
            .get_task(&alice, id)
            .await;
        if read.status != 200 {
            lost.push((id.clone(), read));
        }
    }
    assert!(lost.is_empty(), "acknowledged tasks lost: {lost:?}");
    // Every deadline is 3 s: all of them end (cancelled, or completed on their own).
    let stuck = support::eventually(Duration::from_secs(60), async || {
        let mut stuck = Vec::new();
        for (i, id) in acked.tasks.values().enumerate() {
            let read = McpClient::new(&urls[i % urls.len()])
                .get_task(&alice, id)
                .await;
            let status = read.result()["status"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if !["completed", "failed", "cancelled"].contains(&status.as_str()) {
                stuck.push((id.clone(), status));
            }
        }
        stuck.is_empty().then_some(())
    })
    .await;
    assert!(
        stuck.is_some(),
        "tasks still unfinished long past their deadline"
    );
}

fn sidecar_args() -> Vec<String> {
    ARGS.iter().map(|a| a.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_one_replica_loses_and_duplicates_nothing_across_20_kill_9_cycles() {
    let server = ExampleServer::start();
    let sidecar = Sidecar::start(
        &server.url,
        SidecarOptions {
            spec: SPEC.into(),
            args: sidecar_args(),
            ..Default::default()
        },
    )
    .await;
    let mut fleet = Single {
        _server: server,
        sidecar: Some(sidecar),
    };
    survive(&mut fleet).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_three_replicas_lose_and_duplicate_nothing_across_20_kill_9_cycles() {
    let mut fleet = Replicas::start(
        3,
        ReplicaOptions {
            spec: SPEC.into(),
            args: sidecar_args(),
            ..Default::default()
        },
    )
    .await;
    survive(&mut fleet).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn while_postgres_is_unreachable_nothing_is_created_and_afterwards_everything_works() {
    let db = TestDatabase::create().await;
    let mut proxy = DatabaseProxy::start().await;
    let url = proxy.url_for(&db.url);
    let r = Replicas::start_on(
        db,
        3,
        ReplicaOptions {
            spec: SPEC.into(),
            ledger_url: Some(url),
            ..Default::default()
        },
    )
    .await;
    let alice = User::new("alice", "tenant-a", "console").token();
    let before = support::create_task(
        r.client(0),
        &alice,
        "write_rows",
        json!({"count": 2, "intervalMs": 10, "label": "before"}),
    )
    .await;

    proxy.take_down();
    for i in 0..3 {
        let refused = r
            .client(i)
            .call_tool(
                &alice,
                "write_rows",
                json!({"count": 1, "label": format!("down-{i}")}),
            )
            .await;
        // Refused, and the answer says what is wrong and that a retry will do.
        refused.assert_retryable_503(&format!("replica {i} while down"));
        assert_eq!(
            refused.body["error"]["message"], "The task ledger is unavailable; retry shortly",
            "{refused:?}"
        );
    }
    // Nothing reached any server while the ledger could not record it.
    for server in &r.servers {
        let rows = server.rows_where("label", "down-0").await.len()
            + server.rows_where("label", "down-1").await.len()
            + server.rows_where("label", "down-2").await.len();
        assert_eq!(rows, 0);
    }

    proxy.bring_back().await;
    for i in 0..3 {
        let created = support::eventually(Duration::from_secs(30), async || {
            let reply = r
                .client(i)
                .call_tool(
                    &alice,
                    "write_rows",
                    json!({"count": 1, "label": format!("after-{i}")}),
                )
                .await;
            (reply.status == 200).then_some(reply)
        })
        .await;
        assert!(
            created.is_some(),
            "replica {i} never recovered:\n{}",
            r.sidecars[i].logs()
        );
    }
    let read = r.client(2).get_task(&alice, &before).await;
    assert_eq!(read.status, 200, "{read:?}");
}

/// Regression (issue 30): a database outage longer than `--heartbeat-ttl` lets every heartbeat
/// lapse, because nobody can write one. That is no evidence that a replica stopped: after the
/// database returns, polls through another replica are retryable until the home has beaten
/// again, the sweep fails nothing, and the running task carries on.
#[tokio::test(flavor = "multi_thread")]
async fn an_outage_longer_than_the_heartbeat_ttl_fails_no_running_task() {
    let db = TestDatabase::create().await;
    let direct = db.url.clone();
    let mut proxy = DatabaseProxy::start().await;
    let url = proxy.url_for(&db.url);
    let r = Replicas::start_on(
        db,
        2,
        ReplicaOptions {
            spec: "  tasks:\n    minPollInterval: 10ms\n".into(),
            heartbeat_ttl: Some("2s".into()),
            ledger_url: Some(url),
            ..Default::default()
        },
    )
    .await;
    let alice = User::new("alice", "tenant-a", "console").token();
    let task = support::create_task(
        r.client(0),
        &alice,
        "write_rows",
        json!({"count": 100_000, "intervalMs": 50, "label": "outlives-the-outage"}),
    )
    .await;
    let read = r.client(1).get_task(&alice, &task).await;
    assert_eq!(read.result()["status"], "working", "{read:?}");

    // The outage lasts until both heartbeats have lapsed (read past the proxy).
    proxy.take_down();
    let lapsed = support::eventually(Duration::from_secs(30), async || {
        let beats = heartbeats(&direct).await;
        let now = jiff::Timestamp::now().as_millisecond();
        (beats.len() == 2 && beats.iter().all(|(_, expires)| *expires <= now)).then_some(())
    })
    .await;
    assert!(lapsed.is_some(), "heartbeats never lapsed");
    proxy.bring_back().await;

    // Through the other replica: retryable refusals at first, then the home's answer; never
    // a failed task.
    let mut answers = Vec::new();
    let working = support::eventually(Duration::from_secs(30), async || {
        let read = r.client(1).get_task(&alice, &task).await;
        answers.push((read.status, read.body.clone()));
        (read.status == 200).then_some(read)
    })
    .await
    .unwrap_or_else(|| panic!("no answer after the outage: {answers:?}"));
    assert_eq!(working.result()["status"], "working", "{working:?}");
    for (status, body) in &answers {
        let refused_for_now = *status == 503 && body["error"]["data"]["retryable"] == true;
        assert!(
            refused_for_now || (*status == 200 && body["result"]["status"] == "working"),
            "{status} {body}"
        );
    }
    // Both replicas beat again; two more TTLs of sweeps (the grace after the outage has
    // passed) fail nothing.
    let renewed = support::eventually(Duration::from_secs(30), async || {
        let now = jiff::Timestamp::now().as_millisecond();
        let beats = heartbeats(&direct).await;
        beats
            .iter()
            .all(|(_, expires)| *expires > now)
            .then_some(())
    })
    .await;
    assert!(renewed.is_some(), "the replicas never beat again");
    tokio::time::sleep(Duration::from_secs(4)).await;
    for i in 0..2 {
        let read = r.client(i).get_task(&alice, &task).await;
        assert_eq!(read.result()["status"], "working", "replica {i}: {read:?}");
    }
    assert_eq!(r.metric_sum("lifeguard_tasks_orphaned_total").await, 0.0);
    let upstream = r.servers[0].debug("/_example/tasks").await;
    assert_eq!(upstream[0]["status"], "working", "{upstream}");
}

/// Each replica's heartbeat expiry (ms), read directly from the database.
async fn heartbeats(url: &str) -> Vec<(String, i64)> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .query("SELECT replica, expires_at FROM lifeguard_replicas", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}
