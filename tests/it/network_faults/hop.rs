//! A home replica partitioned from its peers: replica 0 runs in a namespace of its own with
//! its clients and its database still in reach, and only its internal hop on a second link,
//! which is cut. As docs/scale-out.md says, requests for its tasks that reach the other replica
//! get the retryable 503 (counted as `reason="unreachable"`), nothing is lost or revealed, its
//! own clients are served throughout, and the hop works again once healed.

use super::{SPEC, answered};
use crate::support;

use std::time::Duration;

use serde_json::json;
use support::netns::Lab;
use support::pg_server::PgServer;
use support::process::Place;
use support::replicas::SCOPE;
use support::{ExampleServer, McpClient, Sidecar, SidecarOptions, alice, bob};

fn options(ledger: &str, replica: &str, hop: String, place: Option<Place>) -> SidecarOptions {
    SidecarOptions {
        spec: SPEC.into(),
        ledger: Some(ledger.to_owned()),
        args: vec![
            "--ledger-scope".into(),
            SCOPE.into(),
            "--replica-id".into(),
            replica.into(),
            "--internal-listen".into(),
            hop,
        ],
        place,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_home_cut_off_from_its_peers_costs_a_retryable_503_and_nothing_else() {
    let Some(mut lab) = Lab::new("network_faults::hop") else {
        return;
    };
    // lan: the test, PostgreSQL and replica 0's client port; hop: replica 0's hop alone.
    let mut lan = lab.network();
    let mut hops = lab.network();
    lab.attach(None, &mut lan);
    let root_hop = lab.attach(None, &mut hops);
    let db = lab.node("db");
    let db_link = lab.attach(Some(&db), &mut lan);
    let r0 = lab.node("replica0");
    let r0_lan = lab.attach(Some(&r0), &mut lan);
    let r0_hop = lab.attach(Some(&r0), &mut hops);
    let pg = PgServer::start(&db, db_link.ip);
    let ledger = pg.url("connect_timeout=3");

    let server0 = ExampleServer::start_in(&r0);
    let place = Place {
        netns: r0.clone(),
        host: r0_lan.ip,
    };
    let home = Sidecar::start(
        &server0.url,
        options(
            &ledger,
            "replica-0",
            format!("{}:0", r0_hop.ip),
            Some(place),
        ),
    )
    .await;
    let server1 = ExampleServer::start();
    let other = Sidecar::start(
        &server1.url,
        options(&ledger, "replica-1", format!("{}:0", root_hop.ip), None),
    )
    .await;
    let (at_home, elsewhere) = (McpClient::new(&home.url), McpClient::new(&other.url));
    let (alice, bob) = (alice().token(), bob().token());
    let homed =
        support::create_task(&at_home, &alice, "slow_compute", json!({"seconds": 60})).await;

    // Healthy: the other replica forwards the owner's poll to the home; bob learns nothing.
    let read = elsewhere.get_task(&alice, &homed).await;
    assert_eq!(read.result()["status"], "working", "{read:?}");
    let foreign = elsewhere.get_task(&bob, &homed).await;
    assert_eq!(
        foreign.body["error"]["message"], "Task not found",
        "{foreign:?}"
    );

    lab.cut(&r0_hop);
    // Through the other replica: the retryable 503 of an unreachable home, over and over.
    for _ in 0..3 {
        let cut = answered(
            "a poll through the cut hop",
            elsewhere.get_task(&alice, &homed),
        )
        .await;
        cut.assert_retryable_503("a poll for a task homed behind the partition");
        assert!(cut.result().get("status").is_none(), "{cut:?}");
    }
    // Nothing revealed to anyone else, and the home's own clients are served as before.
    let foreign = elsewhere.get_task(&bob, &homed).await;
    assert_eq!(
        foreign.body["error"]["message"], "Task not found",
        "{foreign:?}"
    );
    let direct = at_home.get_task(&alice, &homed).await;
    assert_eq!(direct.result()["status"], "working", "{direct:?}");
    // New work starts on either side.
    let fresh = support::create_task(&elsewhere, &alice, "write_rows", json!({"count": 1})).await;
    support::create_task(&at_home, &bob, "write_rows", json!({"count": 1})).await;
    let unreachable = other
        .daemon
        .metric("lifeguard_hop_forwarded_total{reason=\"unreachable\"}")
        .await;
    assert!(
        unreachable.is_some_and(|n| n >= 3.0),
        "unreachable hops counted: {unreachable:?}"
    );

    // Healed: the owner's task is served through the other replica again, still running.
    lab.heal(&r0_hop);
    let back = support::eventually(Duration::from_secs(30), async || {
        let read = elsewhere.get_task(&alice, &homed).await;
        (read.status == 200).then_some(read)
    })
    .await
    .unwrap_or_else(|| panic!("the hop never came back:\n{}", other.logs()));
    assert_eq!(back.result()["status"], "working", "{back:?}");
    let done = at_home.wait_terminal(&alice, &fresh, 10_000).await;
    assert_eq!(done.result()["status"], "completed", "{done:?}");
    elsewhere.cancel_task(&alice, &homed).await;
    drop((home, other, server0, server1, pg));
}
