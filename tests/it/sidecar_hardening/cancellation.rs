//! Cancellations name only the caller's own requests (issue 28, item 10).

use super::*;

// 10. A cancellation stops only the caller's own request: JSON-RPC ids are the client's
// choice, and the server (like the official SDKs) correlates a cancellation by id alone.

/// The `notifications/cancelled` the server received: `[(requestId, subject, stopped)]`.
async fn server_cancellations(server: &ExampleServer) -> Vec<(Value, Value, u64)> {
    server
        .debug("/_example/cancellations")
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["requestId"].clone(),
                c["subject"].clone(),
                c["stopped"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_cancellation_naming_another_callers_request_id_never_reaches_the_server() {
    let (server, sidecar, client) = support::start_behind_sidecar(SPEC).await;
    let alice = alice().token();
    let bob = User::new("bob", "tenant-a", "console").token();
    // Alice's synchronous call, in flight under id 7 (it would run for a minute).
    let call = tokio::spawn({
        let builder = client
            .request(
                "tools/call",
                json!({"name": "slow_compute", "arguments": {"seconds": 60, "label": "alice"}}),
            )
            .without_tasks()
            .id(json!(7))
            .token(&alice);
        async move { builder.send().await }
    });
    let arrived = support::eventually(WAIT, async || {
        let calls = server.requests("tools/call").await;
        (!calls.is_empty()).then_some(())
    })
    .await;
    assert!(arrived.is_some(), "Alice's call reached the server");

    // Bob names Alice's id (and its string spelling): each is accepted like any notification,
    // and dropped.
    for id in [json!(7), json!("7")] {
        let dropped = send_cancellation(&client, &bob, id.clone()).await;
        assert_eq!(dropped.status, 202, "{id}: {dropped:?}");
        assert_eq!(dropped.raw, "", "a notification gets no body");
    }
    assert_eq!(
        server_cancellations(&server).await,
        [],
        "no cancellation of Bob's reached the server"
    );
    assert!(!call.is_finished(), "Alice's call is still running");
    assert_eq!(
        sidecar
            .metric("lifeguard_denials_total{reason=\"cancel_not_in_flight\"}")
            .await,
        2.0
    );
    let audited = sidecar
        .audit_event(|e| e["event"] == "request.denied" && e["reason"] == "cancel_not_in_flight")
        .await
        .expect("the dropped cancellation is audited");
    assert_eq!(audited["subject"], "bob", "{audited}");

    // Alice cancels her own call: it reaches the server, which stops it.
    let own = send_cancellation(&client, &alice, json!(7)).await;
    assert_eq!(own.status, 202, "{own:?}");
    let reply = tokio::time::timeout(WAIT, call)
        .await
        .expect("the cancelled call answers")
        .unwrap();
    assert_eq!(reply.error_code(), Some(-32800), "{reply:?}");
    assert_eq!(reply.body["id"], 7, "{reply:?}");
    assert_eq!(
        server_cancellations(&server).await,
        [(json!(7), json!("alice"), 1)]
    );
}

#[tokio::test]
async fn a_listen_stream_is_cancelled_only_by_its_own_listener() {
    let spec = format!("{SPEC}  listen:\n    notifications: [toolsListChanged]\n");
    let (server, _sidecar, client) = support::start_behind_sidecar(&spec).await;
    let alice = alice().token();
    let mallory = User::new("mallory", "tenant-b", "console").token();
    let mut stream = ListenStream::open(
        &client.url,
        &alice,
        json!("feed"),
        json!({"toolsListChanged": true}),
        true,
    )
    .await;
    let ack = stream.next(WAIT).await.expect("acknowledged");
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");

    let dropped = send_cancellation(&client, &mallory, json!("feed")).await;
    assert_eq!(dropped.status, 202, "{dropped:?}");
    assert_eq!(server_cancellations(&server).await, []);
    // The stream is alive: the next change still arrives.
    emit(&server, json!({"kind": "toolsListChanged"})).await;
    let frame = stream.next(WAIT).await.expect("still listening");
    assert_eq!(
        frame["method"], "notifications/tools/list_changed",
        "{frame}"
    );

    send_cancellation(&client, &alice, json!("feed")).await;
    assert_eq!(
        server_cancellations(&server).await,
        [(json!("feed"), json!("alice"), 1)]
    );
    let ended = support::eventually(WAIT, async || {
        let active = server.debug("/_example/listeners").await["active"].as_u64();
        (active == Some(0)).then_some(())
    })
    .await;
    assert!(
        ended.is_some(),
        "the listener's own cancellation ends the stream"
    );
}

async fn emit(server: &ExampleServer, body: Value) {
    let status = reqwest::Client::new()
        .post(format!("{}/_example/emit", server.base))
        .json(&body)
        .send()
        .await
        .unwrap()
        .status();
    assert!(status.is_success());
}
