//! The ledger's PostgreSQL in a namespace of its own, two sidecar replicas reaching it over a
//! bridge: its link delayed, lossy and cut (a silent partition) while owners create and poll,
//! and the server restarted mid-run.

use super::{Acked, Refusal, SPEC, create, owners_only_and_none_lost, refusal};
use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::netns::{Lab, Link};
use support::pg_server::PgServer;
use support::replicas::SCOPE;
use support::{ExampleServer, McpClient, Sidecar, SidecarOptions, alice, bob};

/// PostgreSQL in its own namespace, two replicas (example server and sidecar each) in the
/// test's namespace on it, and a client per replica.
struct Setup {
    servers: Vec<ExampleServer>,
    sidecars: Vec<Sidecar>,
    clients: Vec<McpClient>,
    pg: PgServer,
    db_link: Link,
    /// Dropped last: the namespaces.
    lab: Lab,
}

async fn setup(test: &str) -> Option<Setup> {
    let mut lab = Lab::new(test)?;
    let mut lan = lab.network();
    lab.attach(None, &mut lan);
    let db = lab.node("db");
    let db_link = lab.attach(Some(&db), &mut lan);
    let pg = PgServer::start(&db, db_link.ip);
    let ledger = pg.url("connect_timeout=3");
    let mut servers = Vec::new();
    let mut sidecars = Vec::new();
    for i in 0..2 {
        let server = ExampleServer::start();
        let options = SidecarOptions {
            spec: SPEC.into(),
            ledger: Some(ledger.clone()),
            args: [
                "--ledger-scope",
                SCOPE,
                "--replica-id",
                &format!("replica-{i}"),
                "--internal-listen",
                "127.0.0.1:0",
            ]
            .map(str::to_owned)
            .to_vec(),
            ..Default::default()
        };
        sidecars.push(Sidecar::start(&server.url, options).await);
        servers.push(server);
    }
    let clients = sidecars.iter().map(|s| McpClient::new(&s.url)).collect();
    Some(Setup {
        servers,
        sidecars,
        clients,
        pg,
        db_link,
        lab,
    })
}

impl Setup {
    /// `count` tasks created in turn by alice and bob through alternating replicas, all of
    /// which must be acknowledged.
    async fn create_acked(&self, phase: &str, count: usize) -> Vec<Acked> {
        let mut acked = Vec::new();
        for n in 0..count {
            let (owner, other) = if n % 2 == 0 {
                (alice().token(), bob().token())
            } else {
                (bob().token(), alice().token())
            };
            let label = format!("{phase}-{n}");
            let id = create(&self.clients[n % 2], &owner, &label)
                .await
                .unwrap_or_else(|r| panic!("{label} refused while the ledger is up: {r:?}"));
            acked.push(Acked {
                id,
                label,
                owner,
                other,
            });
        }
        acked
    }

    /// The rows the example servers wrote for `label`, across replicas.
    /// One task created through each replica once the database is back (retried for up to
    /// 30 s: no replica is restarted); fails naming the replica that never recovered.
    async fn each_replica_creates_again(&self) -> Vec<Acked> {
        let mut created = Vec::new();
        for (i, client) in self.clients.iter().enumerate() {
            let label = format!("after-{i}");
            let id = support::eventually(Duration::from_secs(30), async || {
                create(client, &alice().token(), &label).await.ok()
            })
            .await
            .unwrap_or_else(|| panic!("replica {i} never recovered:\n{}", self.logs()));
            created.push(Acked {
                id,
                label,
                owner: alice().token(),
                other: bob().token(),
            });
        }
        created
    }

    async fn rows(&self, label: &str) -> usize {
        let mut rows = 0;
        for server in &self.servers {
            rows += server.rows_labelled(label).await.len();
        }
        rows
    }

    /// The sidecars' log lines at ERROR or WARN.
    fn errors(&self) -> String {
        self.logs()
            .lines()
            .filter(|l| l.contains("ERROR") || l.contains("WARN"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn logs(&self) -> String {
        self.sidecars
            .iter()
            .map(Sidecar::logs)
            .collect::<Vec<_>>()
            .join("\n---\n")
    }
}

/// Polls every acknowledged task in `tasks` as its owner, round and round through both
/// replicas, until `stop`; any answer that is neither the task nor a retryable 503 is recorded
/// in `wrong`.
fn poll_load(
    clients: Vec<McpClient>,
    tasks: Arc<Mutex<Vec<Acked>>>,
    wrong: Arc<Mutex<Vec<String>>>,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut polls = 0;
        while !stop.is_cancelled() {
            let batch = tasks.lock().unwrap().clone();
            for (n, task) in batch.iter().enumerate() {
                let read = clients[n % 2].get_task(&task.owner, &task.id).await;
                polls += 1;
                let fine = (read.status == 200 && read.result()["taskId"] == task.id.as_str())
                    || (read.status == 503 && read.body["error"]["data"]["retryable"] == true);
                if !fine {
                    wrong.lock().unwrap().push(format!(
                        "{} {}: {} {}",
                        task.label, task.id, read.status, read.body
                    ));
                }
                let snoop = clients[(n + 1) % 2].get_task(&task.other, &task.id).await;
                if snoop.result().get("taskId").is_some() {
                    wrong.lock().unwrap().push(format!(
                        "served to a non-owner: {}: {}",
                        task.label, snoop.body
                    ));
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        polls
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_partitioned_slow_or_lossy_database_fails_closed_and_loses_nothing() {
    let Some(s) = setup("network_faults::ledger::partition").await else {
        return;
    };
    let tasks = Arc::new(Mutex::new(s.create_acked("healthy", 6).await));
    let wrong = Arc::new(Mutex::new(Vec::new()));
    let stop = tokio_util::sync::CancellationToken::new();
    let load = poll_load(
        s.clients.clone(),
        tasks.clone(),
        wrong.clone(),
        stop.clone(),
    );

    // Slow and lossy: everything still works, only later.
    s.lab.delay(&s.db_link, 150);
    let slow = s.create_acked("delayed", 4).await;
    tasks.lock().unwrap().extend(slow);
    s.lab.loss(&s.db_link, 15);
    let lossy = s.create_acked("lossy", 4).await;
    tasks.lock().unwrap().extend(lossy);

    // Cut: nothing is created, and every refusal is the retryable 503 (side by side: each
    // waits for a pooled connection's TCP user timeout, or for a new one's connect timeout).
    s.lab.cut(&s.db_link);
    let mut refusals = tokio::task::JoinSet::new();
    for n in 0..4 {
        let client = s.clients[n % 2].clone();
        refusals.spawn(async move {
            let label = format!("cut-{n}");
            match create(&client, &alice().token(), &label).await {
                Ok(id) => panic!("{label} acknowledged as {id} while the database is cut off"),
                Err(reply) => {
                    refusal(&reply, &label);
                }
            }
        });
    }
    while let Some(done) = refusals.join_next().await {
        done.unwrap();
    }

    // Healed: both replicas create again, without a restart.
    s.lab.heal(&s.db_link);
    let after = s.each_replica_creates_again().await;
    tasks.lock().unwrap().extend(after);
    stop.cancel();
    let polls = load.await.unwrap();
    assert!(polls > 0, "the poll load never ran");
    let wrong = wrong.lock().unwrap().clone();
    assert!(
        wrong.is_empty(),
        "wrong answers under load: {wrong:#?}\nsidecar errors:\n{}",
        s.errors()
    );

    let tasks = tasks.lock().unwrap().clone();
    owners_only_and_none_lost(&s.clients, &tasks).await;
    // Nothing reached a server for the creations refused while the database was cut off.
    for n in 0..4 {
        assert_eq!(s.rows(&format!("cut-{n}")).await, 0, "cut-{n} ran upstream");
    }
    for task in &tasks {
        assert_eq!(s.rows(&task.label).await, 2, "{task:?}");
    }
    drop(s.pg);
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_restarted_mid_run_loses_nothing_and_is_rejoined_without_restarts() {
    let Some(s) = setup("network_faults::ledger::restart").await else {
        return;
    };
    let tasks = Arc::new(Mutex::new(s.create_acked("before", 6).await));
    let wrong = Arc::new(Mutex::new(Vec::new()));
    let stop = tokio_util::sync::CancellationToken::new();
    let load = poll_load(
        s.clients.clone(),
        tasks.clone(),
        wrong.clone(),
        stop.clone(),
    );
    // Creations keep coming while the server restarts: each is acknowledged or refused with
    // the retryable 503, never anything else.
    let creator = {
        let clients = s.clients.clone();
        let stop = stop.clone();
        let tasks = tasks.clone();
        tokio::spawn(async move {
            let mut refused = Vec::new();
            let mut n = 0;
            while !stop.is_cancelled() {
                let label = format!("during-{n}");
                match create(&clients[n % 2], &alice().token(), &label).await {
                    Ok(id) => tasks.lock().unwrap().push(Acked {
                        id,
                        label,
                        owner: alice().token(),
                        other: bob().token(),
                    }),
                    Err(reply) => refused.push((label, reply)),
                }
                n += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            refused
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.pg.restart();
    // Back: each replica creates again, without a restart of its own.
    let after = s.each_replica_creates_again().await;
    tasks.lock().unwrap().extend(after);
    stop.cancel();
    let refused = creator.await.unwrap();
    load.await.unwrap();
    // A refusal before the server saw the task left nothing there; one after it (the ledger
    // failed between the reservation and the confirmation) says the task was cancelled there.
    for (label, reply) in &refused {
        if refusal(reply, label) == Refusal::Retryable {
            assert_eq!(s.rows(label).await, 0, "{label} refused yet ran upstream");
        }
    }
    let wrong = wrong.lock().unwrap().clone();
    assert!(
        wrong.is_empty(),
        "wrong answers under load: {wrong:#?}\nsidecar errors:\n{}",
        s.errors()
    );
    let tasks = tasks.lock().unwrap().clone();
    owners_only_and_none_lost(&s.clients, &tasks).await;
    for task in &tasks {
        assert_eq!(s.rows(&task.label).await, 2, "{task:?}");
    }
}

/// A poll that learns from the server that a task ended, while the ledger cannot record that
/// end, is the retryable 503, never "Task not found": the owner's task is there, only the
/// answer is not (the home answers a poll from its recent read of the ledger, so the poll
/// reaches the server, and the server's report, without a ledger read).
#[tokio::test(flavor = "multi_thread")]
async fn an_end_the_ledger_cannot_record_is_a_retryable_503_not_a_lost_task() {
    let db = support::postgres::TestDatabase::create().await;
    let mut proxy = support::postgres::DatabaseProxy::start().await;
    let server = ExampleServer::start();
    let sidecar = Sidecar::start(
        &server.url,
        SidecarOptions {
            spec: SPEC.into(),
            ledger: Some(proxy.url_for(&db.url)),
            args: ["--ledger-scope", SCOPE, "--replica-id", "replica-0"]
                .map(str::to_owned)
                .to_vec(),
            ..Default::default()
        },
    )
    .await;
    let client = McpClient::new(&sidecar.url);
    let token = alice().token();
    let id = support::create_task(
        &client,
        &token,
        "slow_compute",
        serde_json::json!({"seconds": 0.3}),
    )
    .await;
    let first = client.get_task(&token, &id).await;
    assert_eq!(first.result()["status"], "working", "{first:?}");
    // The server's task ends; the ledger goes away before the owner's next poll.
    let ended = support::eventually(Duration::from_secs(10), async || {
        let tasks = server.debug("/_example/tasks").await;
        let done = tasks.as_array()?.iter().any(|t| t["status"] == "completed");
        done.then_some(())
    })
    .await;
    assert!(ended.is_some(), "the server's task never completed");
    proxy.take_down();
    let during = client.get_task(&token, &id).await;
    during.assert_retryable_503("a poll while the ledger cannot record the end");
    assert_eq!(
        during.body["error"]["message"], "The task ledger is unavailable; retry shortly",
        "{during:?}"
    );
    // Back: the owner gets her task's end.
    proxy.bring_back().await;
    let done = support::eventually(Duration::from_secs(30), async || {
        let read = client.get_task(&token, &id).await;
        (read.result()["status"] == "completed").then_some(read)
    })
    .await;
    assert!(done.is_some(), "{}", sidecar.logs());
}
