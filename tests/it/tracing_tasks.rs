//! A task's story in traces, black box: the `tools/call` that creates a task is remembered in
//! the ledger, and every later span about the task — `tasks/get`, `tasks/update`,
//! `tasks/cancel` (refused ones too), each listen delivery, each cancellation retried from the
//! outbox — carries a span link to that call's server span, whatever trace it is in.

use std::time::Duration;

use crate::support;

use serde_json::{Value, json};
use support::client::{capabilities, request_meta};
use support::otlp::{OtlpReceiver, ReceivedSpan};
use support::process::{ExampleServer, Sidecar, SidecarOptions};
use support::{McpClient, alice, bob};

const CREATE_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const POLL_TRACE: &str = "5cf92f3577b34da6a3ce929d0e0e4737";
const PROBE_TRACE: &str = "6df92f3577b34da6a3ce929d0e0e4738";
const LISTEN_TRACE: &str = "7ef92f3577b34da6a3ce929d0e0e4739";
const CANCEL_TRACE: &str = "8ff92f3577b34da6a3ce929d0e0e473a";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

const SPEC: &str = "  tasks:
    tools: [write_rows]
    minPollInterval: 10ms
  listen:
    notifications: [taskIds]
    maxStreamDuration: 30s
";

fn traceparent(trace: &str) -> String {
    format!("00-{trace}-{CALLER_SPAN}-01")
}

async fn traced_sidecar(server: &ExampleServer, receiver: &OtlpReceiver, args: &[&str]) -> Sidecar {
    Sidecar::start(
        &server.url,
        SidecarOptions {
            spec: SPEC.into(),
            env: receiver.env("grpc"),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            ..SidecarOptions::default()
        },
    )
    .await
}

/// Creates a `write_rows` task with `arguments` in trace [`CREATE_TRACE`]; its ID.
async fn create(sidecar: &Sidecar, arguments: Value) -> String {
    let reply = McpClient::new(&sidecar.url)
        .request(
            "tools/call",
            json!({"name": "write_rows", "arguments": arguments}),
        )
        .token(&alice().token())
        .header("traceparent", &traceparent(CREATE_TRACE))
        .send()
        .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    reply.result()["taskId"]
        .as_str()
        .expect("a task was created")
        .to_owned()
}

/// `method` about task `id` by `token` in `trace`.
async fn about_task(
    sidecar: &Sidecar,
    token: &str,
    method: &str,
    id: &str,
    trace: &str,
) -> support::client::Reply {
    McpClient::new(&sidecar.url)
        .request(method, json!({"taskId": id}))
        .token(token)
        .header("traceparent", &traceparent(trace))
        .send()
        .await
}

/// [`about_task`] by alice, the task's owner, which must be answered.
async fn owner_asks(sidecar: &Sidecar, method: &str, id: &str, trace: &str) {
    let reply = about_task(sidecar, &alice().token(), method, id, trace).await;
    assert_eq!(reply.status, 200, "{method}: {reply:?}");
    assert!(reply.error_code().is_none(), "{method}: {reply:?}");
}

/// The server span of the call that created the task.
fn creating_span(spans: &[ReceivedSpan]) -> Option<&ReceivedSpan> {
    spans
        .iter()
        .find(|s| s.kind == 2 && s.trace_id == CREATE_TRACE && s.name == "tools/call write_rows")
}

fn in_trace<'a>(spans: &'a [ReceivedSpan], trace: &str, name: &str) -> Vec<&'a ReceivedSpan> {
    spans
        .iter()
        .filter(|s| s.trace_id == trace && s.name == name)
        .collect()
}

/// Whether `span` links to `created` (and says the link is to the task's creation).
fn links_to(span: &ReceivedSpan, created: &ReceivedSpan) -> bool {
    span.links.iter().any(|link| {
        link.trace_id == created.trace_id
            && link.span_id == created.span_id
            && link.attributes.get("lifeguard.link").map(String::as_str) == Some("task.created")
    })
}

/// Polls, a refused probe, a listen delivery and the cancel are each in their own trace, and
/// each links to the call that created the task.
#[tokio::test]
async fn every_later_request_about_a_task_links_to_the_call_that_created_it() {
    let receiver = OtlpReceiver::start().await;
    let server = ExampleServer::start();
    let sidecar = traced_sidecar(&server, &receiver, &[]).await;
    let id = create(&sidecar, json!({"count": 1000, "intervalMs": 50})).await;

    owner_asks(&sidecar, "tasks/get", &id, POLL_TRACE).await;
    // Someone else's probe of the task is refused, and is part of the task's story.
    let probe = about_task(&sidecar, &bob().token(), "tasks/get", &id, PROBE_TRACE).await;
    assert!(probe.error_code().is_some(), "{probe:?}");

    let params = json!({
        "notifications": {"taskIds": [id]},
        "_meta": request_meta(capabilities(true)),
    });
    let mut stream = McpClient::new(&sidecar.url)
        .request("subscriptions/listen", params)
        .id(json!("s-1"))
        .token(&alice().token())
        .header("traceparent", &traceparent(LISTEN_TRACE))
        .accept_sse()
        .stream()
        .await;
    assert_eq!(stream.status, 200);
    let delivered = support::eventually(Duration::from_secs(10), async || {
        stream
            .next(Duration::from_millis(500))
            .await
            .filter(|frame| frame["method"] == "notifications/tasks")
    })
    .await;
    assert!(delivered.is_some(), "no task frame was delivered");

    owner_asks(&sidecar, "tasks/cancel", &id, CANCEL_TRACE).await;

    let spans = receiver
        .wait_for(
            "the creation, the polls, a delivery and the cancel",
            |spans| {
                creating_span(spans).is_some()
                    && !in_trace(spans, POLL_TRACE, "tasks/get").is_empty()
                    && !in_trace(spans, PROBE_TRACE, "tasks/get").is_empty()
                    && !in_trace(spans, LISTEN_TRACE, "notifications/tasks").is_empty()
                    && in_trace(spans, CANCEL_TRACE, "tasks/cancel").len() >= 2
            },
        )
        .await;
    let created = creating_span(&spans).unwrap();
    assert!(
        created.links.is_empty(),
        "the creating call links nowhere: {created:#?}"
    );

    let poll = in_trace(&spans, POLL_TRACE, "tasks/get")
        .into_iter()
        .find(|s| s.kind == 2)
        .expect("the poll's server span");
    assert_eq!(poll.parent_span_id, CALLER_SPAN);
    assert!(links_to(poll, created), "{poll:#?}");

    let probe = in_trace(&spans, PROBE_TRACE, "tasks/get")[0];
    assert_eq!(probe.attributes["lifeguard.decision"], "deny");
    assert!(links_to(probe, created), "{probe:#?}");

    // Deliveries are children of the listen request's span, linked to the creation, and say
    // the frame was delivered with the task's keyed hash (never its ID).
    let listen = in_trace(&spans, LISTEN_TRACE, "subscriptions/listen")
        .into_iter()
        .find(|s| s.kind == 2)
        .expect("the listen request's server span");
    let delivery = in_trace(&spans, LISTEN_TRACE, "notifications/tasks")
        .into_iter()
        .find(|s| s.attributes.get("lifeguard.decision").map(String::as_str) == Some("deliver"))
        .expect("a delivery span");
    assert_eq!(delivery.parent_span_id, listen.span_id);
    assert!(links_to(delivery, created), "{delivery:#?}");
    assert_eq!(
        delivery.attributes["lifeguard.task"],
        created.attributes["lifeguard.task"]
    );

    // The cancel's server span links to the creation; the cancel sent upstream is its child.
    let cancel = in_trace(&spans, CANCEL_TRACE, "tasks/cancel");
    let cancel_server = cancel.iter().find(|s| s.kind == 2).expect("server span");
    assert!(links_to(cancel_server, created), "{cancel_server:#?}");
    let upstream = cancel.iter().find(|s| s.kind == 3).expect("client span");
    assert_eq!(upstream.parent_span_id, cancel_server.span_id);

    for span in &spans {
        for (key, value) in &span.attributes {
            assert!(!value.contains(&id), "{key} carries the task ID: {span:#?}");
        }
    }
}

/// A cancellation the server does not confirm is retried from the outbox: each retry is a
/// span in the trace of the request that asked for the cancel, linked to the task's creation,
/// with the cancel sent upstream as its child.
#[tokio::test]
async fn cancellation_retries_continue_the_cancel_requests_trace() {
    let receiver = OtlpReceiver::start().await;
    let server = ExampleServer::start();
    let sidecar = traced_sidecar(&server, &receiver, &["--cancel-confirm-timeout", "20s"]).await;
    let id = create(
        &sidecar,
        json!({"count": 100000, "intervalMs": 50, "ignoreCancel": true}),
    )
    .await;
    owner_asks(&sidecar, "tasks/cancel", &id, CANCEL_TRACE).await;

    let spans = receiver
        .wait_for("a retry of the cancel, with its upstream cancel", |spans| {
            in_trace(spans, CANCEL_TRACE, "lifeguard.cancel.retry")
                .iter()
                .any(|retry| {
                    spans.iter().any(|s| {
                        s.parent_span_id == retry.span_id && s.name == "tasks/cancel" && s.kind == 3
                    })
                })
        })
        .await;
    let created = creating_span(&spans).expect("the creating call's span");
    let request = in_trace(&spans, CANCEL_TRACE, "tasks/cancel")
        .into_iter()
        .find(|s| s.kind == 2)
        .expect("the cancel request's server span");
    let retries = in_trace(&spans, CANCEL_TRACE, "lifeguard.cancel.retry");
    for retry in &retries {
        assert_eq!(retry.parent_span_id, request.span_id, "{retry:#?}");
        assert_eq!(retry.attributes["lifeguard.reason"], "owner_cancel");
        assert!(links_to(retry, created), "{retry:#?}");
    }
    // The server really was asked again, inside the retry.
    let retried_upstream = spans
        .iter()
        .filter(|s| retries.iter().any(|r| r.span_id == s.parent_span_id) && s.kind == 3)
        .count();
    assert!(retried_upstream >= 1);
    assert!(
        server.debug("/_example/tasks").await[0]["ignoredCancels"].as_u64() >= Some(2),
        "the server saw the first cancel and a retry"
    );
}

/// The object authorizer's decisions are child spans of the request that needed them (asked,
/// or answered from the cache), and the authorizer receives the context of the span that
/// asked it, so its own spans join the trace. Neither the object nor the principal is named.
#[tokio::test]
async fn the_object_authorizers_decisions_are_child_spans_and_it_gets_their_context() {
    use support::authorizer::Authorizer;

    let authorizer = Authorizer::start(
        "grants:\n  - {subject: alice, issuer: 'https://idp.test', tenant: tenant-a, type: project, object: proj-x}\n",
    );
    let receiver = OtlpReceiver::start().await;
    let server = ExampleServer::start();
    let spec = format!(
        "  tasks:\n    tools: [write_rows]\n    minPollInterval: 10ms\n    objects:\n      authorizer: {{url: \"{}\", cacheTtl: 60s}}\n      tools:\n        write_rows: {{pointer: /label, type: project}}\n",
        authorizer.url
    );
    let sidecar = Sidecar::start(
        &server.url,
        SidecarOptions {
            spec,
            env: receiver.env("http/protobuf"),
            ..SidecarOptions::default()
        },
    )
    .await;
    let id = create(
        &sidecar,
        json!({"count": 1000, "intervalMs": 50, "label": "proj-x"}),
    )
    .await;
    // The first poll asks the authorizer about reading; the second is answered from the cache.
    owner_asks(&sidecar, "tasks/get", &id, POLL_TRACE).await;
    owner_asks(&sidecar, "tasks/get", &id, PROBE_TRACE).await;

    let authorize_under = |spans: &[ReceivedSpan], trace: &str| -> Option<ReceivedSpan> {
        let request = spans.iter().find(|s| s.kind == 2 && s.trace_id == trace)?;
        spans
            .iter()
            .find(|s| s.name == "lifeguard.authorize" && s.parent_span_id == request.span_id)
            .cloned()
    };
    let spans = receiver
        .wait_for("the three decisions' spans", |spans| {
            [CREATE_TRACE, POLL_TRACE, PROBE_TRACE]
                .iter()
                .all(|trace| authorize_under(spans, trace).is_some())
        })
        .await;
    let at_creation = authorize_under(&spans, CREATE_TRACE).unwrap();
    let first_poll = authorize_under(&spans, POLL_TRACE).unwrap();
    let second_poll = authorize_under(&spans, PROBE_TRACE).unwrap();
    assert_eq!(at_creation.kind, 3);
    assert_eq!(
        (
            at_creation.attributes["lifeguard.action"].as_str(),
            at_creation.attributes["lifeguard.authorizer.source"].as_str(),
            at_creation.attributes["lifeguard.decision"].as_str(),
        ),
        ("create", "authorizer", "allow")
    );
    assert_eq!(first_poll.attributes["lifeguard.action"], "read");
    assert_eq!(
        first_poll.attributes["lifeguard.authorizer.source"],
        "authorizer"
    );
    assert_eq!(
        second_poll.attributes["lifeguard.authorizer.source"],
        "cache"
    );
    assert_eq!(second_poll.attributes["lifeguard.decision"], "allow");
    for span in [&at_creation, &first_poll, &second_poll] {
        for value in span.attributes.values() {
            assert!(
                !value.contains("proj-x") && !value.contains("alice"),
                "{span:#?}"
            );
        }
    }

    // The authorizer was asked twice, each time in the asking span's context.
    let asked: Vec<String> = authorizer
        .decisions()
        .await
        .iter()
        .map(|d| d["traceparent"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        asked,
        vec![
            format!("00-{CREATE_TRACE}-{}-01", at_creation.span_id),
            format!("00-{POLL_TRACE}-{}-01", first_poll.span_id),
        ]
    );
}
