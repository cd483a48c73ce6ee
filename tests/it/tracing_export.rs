//! OpenTelemetry traces, black box: the sidecar exports its spans over each OTLP protocol to a
//! real receiver, continues the caller's W3C trace, and hands the MCP server its own client
//! span's context; without an endpoint nothing is exported and `traceparent` passes through.

use crate::support;

use serde_json::json;
use support::client::Reply;
use support::otlp::{OtlpReceiver, ReceivedSpan};
use support::process::{ExampleServer, Sidecar, SidecarOptions};
use support::{McpClient, alice};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

async fn sidecar(server: &ExampleServer, env: Vec<(String, String)>) -> Sidecar {
    Sidecar::start(
        &server.url,
        SidecarOptions {
            spec: "  tasks:\n    tools: [write_rows]\n".into(),
            env,
            ..SidecarOptions::default()
        },
    )
    .await
}

async fn call_with_traceparent(sidecar: &Sidecar) -> Reply {
    call_with_traceparent_as(sidecar, &alice().token()).await
}

async fn call_with_traceparent_as(sidecar: &Sidecar, token: &str) -> Reply {
    McpClient::new(&sidecar.url)
        .request(
            "tools/call",
            json!({"name": "write_rows", "arguments": {"count": 1, "intervalMs": 10}}),
        )
        .token(token)
        .header("traceparent", &format!("00-{TRACE}-{CALLER_SPAN}-01"))
        .send()
        .await
}

fn named(spans: &[ReceivedSpan], kind: i32) -> Option<&ReceivedSpan> {
    spans
        .iter()
        .find(|s| s.kind == kind && s.name == "tools/call write_rows")
}

async fn one_protocol(protocol: &'static str) {
    let receiver = OtlpReceiver::start().await;
    let server = ExampleServer::start();
    let mut env = receiver.env(protocol);
    env.push((
        "OTEL_RESOURCE_ATTRIBUTES".into(),
        "deployment.environment=test".into(),
    ));
    let sidecar = sidecar(&server, env).await;

    let reply = call_with_traceparent(&sidecar).await;
    assert_eq!(reply.status, 200, "{reply:?}");

    let spans = receiver
        .wait_for(
            &format!("{protocol}: the server and client spans of the call"),
            |spans| named(spans, 2).is_some() && named(spans, 3).is_some(),
        )
        .await;
    let server_span = named(&spans, 2).unwrap();
    let client_span = named(&spans, 3).unwrap();
    assert_eq!(server_span.protocol, protocol);
    assert_eq!(server_span.service, "lifeguard-sidecar");
    assert_eq!(server_span.resource["deployment.environment"], "test");
    // The caller's trace continues: the server span is a child of the caller's span...
    assert_eq!(server_span.trace_id, TRACE);
    assert_eq!(server_span.parent_span_id, CALLER_SPAN);
    assert_eq!(server_span.attributes["mcp.method.name"], "tools/call");
    assert_eq!(server_span.attributes["gen_ai.tool.name"], "write_rows");
    assert_eq!(server_span.attributes["http.response.status_code"], "200");
    assert_eq!(
        server_span.attributes["gen_ai.operation.name"],
        "execute_tool"
    );
    assert_eq!(server_span.attributes["network.transport"], "tcp");
    assert_eq!(
        server_span.attributes["jsonrpc.request.id"],
        reply.body["id"].to_string()
    );
    assert!(!server_span.attributes.contains_key("error.type"));
    // ...the hop upstream is its child...
    assert_eq!(
        client_span.trace_id, TRACE,
        "the hop is in the caller's trace"
    );
    assert_eq!(client_span.parent_span_id, server_span.span_id);
    // ...and the MCP server was handed the hop's context, not the caller's.
    let logged = server.requests("tools/call").await;
    let traceparent = logged.last().unwrap()["traceparent"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        traceparent,
        format!("00-{TRACE}-{}-01", client_span.span_id)
    );
    // The decision is the audit trail's, with the task's keyed hash, never its ID.
    assert_eq!(server_span.attributes["lifeguard.decision"], "allow");
    let task_id = reply.result()["taskId"].as_str().unwrap().to_owned();
    let task_hash = &server_span.attributes["lifeguard.task"];
    assert!(!task_hash.is_empty() && !task_hash.contains(&task_id));
    assert!(!server_span.attributes["lifeguard.policy.hash"].is_empty());

    // Another user's poll of that task is refused; its span says so and why.
    let refused = McpClient::new(&sidecar.url)
        .request("tasks/get", json!({"taskId": task_id}))
        .token(&support::bob().token())
        .send()
        .await;
    assert!(refused.error_code().is_some(), "{refused:?}");
    let spans = receiver
        .wait_for(&format!("{protocol}: the refused poll's span"), |spans| {
            spans.iter().any(|s| s.name == "tasks/get")
        })
        .await;
    let poll = spans.iter().find(|s| s.name == "tasks/get").unwrap();
    assert_eq!(poll.attributes["lifeguard.decision"], "deny", "{poll:#?}");
    // A JSON-RPC error is recorded by its code, as the MCP conventions ask.
    let code = refused.error_code().unwrap().to_string();
    assert_eq!(poll.attributes["rpc.response.status_code"], code);
    assert_eq!(poll.attributes["error.type"], code);
    assert!(!poll.attributes.contains_key("gen_ai.operation.name"));
    assert!(!poll.attributes["lifeguard.reason"].is_empty(), "{poll:#?}");
    // No span anywhere carries the task ID, and no log line rides along as a span event; nor
    // the bridge's default extras (source location, thread, target, busy/idle times), which
    // say nothing about the request and cost CPU on every span.
    for span in &spans {
        assert!(span.events.is_empty(), "log events exported: {span:#?}");
        for extra in [
            "code.file.path",
            "code.line.number",
            "code.module.name",
            "thread.id",
            "thread.name",
            "target",
            "busy_ns",
            "idle_ns",
        ] {
            assert!(
                !span.attributes.contains_key(extra),
                "{extra} on a span: {span:#?}"
            );
        }
        for (key, value) in &span.attributes {
            assert!(
                !value.contains(&task_id),
                "{key} carries the task ID: {span:#?}"
            );
        }
    }
}

#[tokio::test]
async fn spans_reach_a_grpc_collector_and_continue_the_callers_trace() {
    one_protocol("grpc").await;
}

#[tokio::test]
async fn spans_reach_an_http_protobuf_collector_and_continue_the_callers_trace() {
    one_protocol("http/protobuf").await;
}

#[tokio::test]
async fn spans_reach_an_http_json_collector_and_continue_the_callers_trace() {
    one_protocol("http/json").await;
}

#[tokio::test]
async fn without_an_endpoint_nothing_is_exported_and_traceparent_passes_through() {
    let server = ExampleServer::start();
    let sidecar = sidecar(&server, Vec::new()).await;
    let reply = call_with_traceparent(&sidecar).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let logged = server.requests("tools/call").await;
    assert_eq!(
        logged.last().unwrap()["traceparent"],
        format!("00-{TRACE}-{CALLER_SPAN}-01"),
        "the caller's context reaches the server unchanged, as before tracing existed"
    );
}

#[tokio::test]
async fn a_setting_that_makes_no_sense_stops_the_sidecar_with_the_variable_named() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_lifeguard"))
        .args([
            "sidecar",
            "--policy",
            "/nonexistent.yaml",
            "--upstream",
            "http://127.0.0.1:9/mcp",
            "--ledger",
            "/nonexistent/ledger.db",
        ])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/thrift")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "OTEL_EXPORTER_OTLP_PROTOCOL=http/thrift: expected grpc, http/protobuf or http/json"
        ),
        "{stderr}"
    );
}

/// The webhook's admission reviews are server spans of `lifeguard-webhook`, continuing the API
/// server's trace, with the injection outcome.
async fn webhook_review_over(protocol: &'static str) {
    use support::webhook::{Webhook, config_yaml, pod_review};

    let receiver = OtlpReceiver::start().await;
    let emulator = support::kube::KubeEmulator::start().await;
    let webhook =
        Webhook::start_with_env(&emulator, &config_yaml(""), &receiver.env(protocol)).await;
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "plain", "namespace": "team-z"},
        "spec": {"containers": [{"name": "app", "image": "registry.example.com/app:1"}]},
    });
    let response = webhook
        .ca
        .client()
        .post(format!("{}/inject", webhook.url))
        .header("traceparent", format!("00-{TRACE}-{CALLER_SPAN}-01"))
        .json(&pod_review("uid-1", "team-z", &pod))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);

    let spans = receiver
        .wait_for("the webhook's span of the review", |spans| {
            spans.iter().any(|s| s.name == "POST /inject")
        })
        .await;
    let span = spans.iter().find(|s| s.name == "POST /inject").unwrap();
    assert_eq!(span.protocol, protocol);
    assert_eq!(span.service, "lifeguard-webhook");
    assert_eq!(span.kind, 2);
    assert_eq!(span.trace_id, TRACE);
    assert_eq!(span.parent_span_id, CALLER_SPAN);
    assert_eq!(span.attributes["http.response.status_code"], "200");
    assert!(
        !span.attributes["lifeguard.decision"].is_empty(),
        "{span:#?}"
    );
    assert!(!span.attributes["lifeguard.reason"].is_empty(), "{span:#?}");
}

/// The operator's Security Event pushes are server spans of `lifeguard-operator` in the
/// transmitter's trace; a refused push is one too, with its status.
async fn operator_push_over(protocol: &'static str) {
    use support::operator::Operator;

    let receiver = OtlpReceiver::start().await;
    let emulator = support::kube::KubeEmulator::start().await;
    let config = support::ssf::two_push_transmitters(&[], &[]);
    let operator =
        Operator::start_with_env(&emulator, Some(&config), &[], &receiver.env(protocol)).await;
    let response = operator
        .ca
        .client()
        .post(format!("{}/ssf/push", operator.url))
        .header("content-type", "application/secevent+jwt")
        .header("traceparent", format!("00-{TRACE}-{CALLER_SPAN}-01"))
        .body("not.a.set")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);

    let spans = receiver
        .wait_for("the operator's span of the push", |spans| {
            spans.iter().any(|s| s.name == "POST /ssf/push")
        })
        .await;
    let span = spans.iter().find(|s| s.name == "POST /ssf/push").unwrap();
    assert_eq!(span.protocol, protocol);
    assert_eq!(span.service, "lifeguard-operator");
    assert_eq!(span.trace_id, TRACE);
    assert_eq!(span.parent_span_id, CALLER_SPAN);
    assert_eq!(span.attributes["http.response.status_code"], "400");
}

#[tokio::test]
async fn the_webhooks_admission_reviews_reach_a_grpc_collector_in_the_callers_trace() {
    webhook_review_over("grpc").await;
}

#[tokio::test]
async fn the_webhooks_admission_reviews_reach_an_http_protobuf_collector_in_the_callers_trace() {
    webhook_review_over("http/protobuf").await;
}

#[tokio::test]
async fn the_webhooks_admission_reviews_reach_an_http_json_collector_in_the_callers_trace() {
    webhook_review_over("http/json").await;
}

#[tokio::test]
async fn the_operators_security_event_pushes_reach_a_grpc_collector_in_the_callers_trace() {
    operator_push_over("grpc").await;
}

#[tokio::test]
async fn the_operators_security_event_pushes_reach_an_http_protobuf_collector_in_the_callers_trace()
{
    operator_push_over("http/protobuf").await;
}

#[tokio::test]
async fn the_operators_security_event_pushes_reach_an_http_json_collector_in_the_callers_trace() {
    operator_push_over("http/json").await;
}

/// A `tools/call` of `write_rows` whose `params._meta` carries `meta_traceparent`.
async fn call_with_meta_traceparent(
    sidecar: &Sidecar,
    meta_traceparent: &str,
    header: Option<&str>,
) -> Reply {
    let mut meta = support::client::request_meta(support::client::capabilities(true));
    meta["traceparent"] = json!(meta_traceparent);
    meta["tracestate"] = json!("client=1");
    let mut request = McpClient::new(&sidecar.url)
        .request(
            "tools/call",
            json!({"name": "write_rows", "arguments": {"count": 1, "intervalMs": 10}, "_meta": meta}),
        )
        .token(&alice().token());
    if let Some(header) = header {
        request = request.header("traceparent", header);
    }
    request.send().await
}

/// The MCP conventions carry the context in `params._meta` too: a request with it only there
/// continues that trace, and the server finds the hop's context in both places, never the
/// caller's (which would skip the hop).
#[tokio::test]
async fn a_context_in_params_meta_is_continued_and_replaced_by_the_hops() {
    let receiver = OtlpReceiver::start().await;
    let server = ExampleServer::start();
    let sidecar = sidecar(&server, receiver.env("grpc")).await;

    let reply =
        call_with_meta_traceparent(&sidecar, &format!("00-{TRACE}-{CALLER_SPAN}-01"), None).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let spans = receiver
        .wait_for("the server and client spans of the call", |spans| {
            named(spans, 2).is_some() && named(spans, 3).is_some()
        })
        .await;
    let server_span = named(&spans, 2).unwrap();
    let client_span = named(&spans, 3).unwrap();
    assert_eq!(server_span.trace_id, TRACE);
    assert_eq!(server_span.parent_span_id, CALLER_SPAN);
    assert_eq!(client_span.parent_span_id, server_span.span_id);
    let hop = format!("00-{TRACE}-{}-01", client_span.span_id);
    let logged = server.requests("tools/call").await;
    let logged = logged.last().unwrap();
    assert_eq!(logged["traceparent"], hop);
    assert_eq!(logged["metaTraceparent"], hop, "{logged:#}");
}

/// When the header and `_meta` name different contexts, the header wins.
#[tokio::test]
async fn the_header_wins_over_params_meta_when_both_name_a_context() {
    let receiver = OtlpReceiver::start().await;
    let server = ExampleServer::start();
    let sidecar = sidecar(&server, receiver.env("http/protobuf")).await;

    let other_trace = "0af7651916cd43dd8448eb211c80319c";
    let reply = call_with_meta_traceparent(
        &sidecar,
        &format!("00-{other_trace}-b7ad6b7169203331-01"),
        Some(&format!("00-{TRACE}-{CALLER_SPAN}-01")),
    )
    .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let spans = receiver
        .wait_for("the server span of the call", |spans| {
            named(spans, 2).is_some() && named(spans, 3).is_some()
        })
        .await;
    let server_span = named(&spans, 2).unwrap();
    assert_eq!(server_span.trace_id, TRACE);
    assert_eq!(server_span.parent_span_id, CALLER_SPAN);
    let client_span = named(&spans, 3).unwrap();
    let logged = server.requests("tools/call").await;
    assert_eq!(
        logged.last().unwrap()["metaTraceparent"],
        format!("00-{TRACE}-{}-01", client_span.span_id)
    );
}

/// The token check and each ledger operation of a request are child spans of its server span;
/// a request refused before its body is read still gets its span, with the check's outcome.
#[tokio::test]
async fn the_token_check_and_the_ledger_are_child_spans_of_the_request() {
    let receiver = OtlpReceiver::start().await;
    let server = ExampleServer::start();
    let sidecar = sidecar(&server, receiver.env("http/json")).await;

    let token = alice().token();
    let reply = call_with_traceparent_as(&sidecar, &token).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let children_of = |spans: &[ReceivedSpan], parent: &str, name: &str| {
        spans
            .iter()
            .filter(|s| s.parent_span_id == parent && s.name.starts_with(name))
            .cloned()
            .collect::<Vec<_>>()
    };
    let spans = receiver
        .wait_for("the call's span tree", |spans| {
            named(spans, 2).is_some_and(|server| {
                !children_of(spans, &server.span_id, "lifeguard.authenticate").is_empty()
                    && children_of(spans, &server.span_id, "ledger ").len() >= 2
            })
        })
        .await;
    let server_span = named(&spans, 2).unwrap();
    let auth = &children_of(&spans, &server_span.span_id, "lifeguard.authenticate")[0];
    assert_eq!(auth.trace_id, TRACE);
    assert_eq!(auth.attributes["lifeguard.auth.outcome"], "ok");
    let ledger: Vec<String> = children_of(&spans, &server_span.span_id, "ledger ")
        .iter()
        .map(|s| s.name.clone())
        .collect();
    // A task is reserved before the server is called and confirmed after.
    assert!(ledger.contains(&"ledger reserve".to_owned()), "{ledger:?}");
    assert!(ledger.contains(&"ledger confirm".to_owned()), "{ledger:?}");
    let reserve = spans.iter().find(|s| s.name == "ledger reserve").unwrap();
    assert_eq!(reserve.attributes["db.system.name"], "sqlite");
    assert_eq!(reserve.attributes["db.operation.name"], "reserve");

    // The same token again is answered by the token cache: no span for a check that took no
    // time, while the request's own span and its ledger children are there as before.
    let again = call_with_traceparent_as(&sidecar, &token).await;
    assert_eq!(again.status, 200, "{again:?}");
    let spans = receiver
        .wait_for("the second call's server span", |spans| {
            spans
                .iter()
                .filter(|s| s.kind == 2 && s.trace_id == TRACE)
                .count()
                >= 2
        })
        .await;
    let second = spans
        .iter()
        .filter(|s| s.kind == 2 && s.trace_id == TRACE)
        .find(|s| s.span_id != server_span.span_id)
        .unwrap();
    let spans = receiver
        .wait_for("the second call's ledger spans", |spans| {
            children_of(spans, &second.span_id, "ledger ").len() >= 2
        })
        .await;
    assert!(
        children_of(&spans, &second.span_id, "lifeguard.authenticate").is_empty(),
        "a cached token check has no span: {spans:#?}"
    );

    // A forged token is refused before the body is read: a span of its own, in the caller's
    // trace, whose token check says why.
    let refused = McpClient::new(&sidecar.url)
        .request("tools/call", json!({"name": "write_rows", "arguments": {}}))
        .token("not-a-token")
        .header(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        )
        .send()
        .await;
    assert_eq!(refused.status, 401, "{refused:?}");
    let spans = receiver
        .wait_for("the refused call's span", |spans| {
            spans.iter().any(|s| {
                s.kind == 2
                    && s.trace_id == "0af7651916cd43dd8448eb211c80319c"
                    && s.attributes
                        .get("http.response.status_code")
                        .map(String::as_str)
                        == Some("401")
            }) && spans.iter().any(|s| {
                s.name == "lifeguard.authenticate"
                    && s.trace_id == "0af7651916cd43dd8448eb211c80319c"
            })
        })
        .await;
    let refused_span = spans
        .iter()
        .find(|s| s.kind == 2 && s.trace_id == "0af7651916cd43dd8448eb211c80319c")
        .unwrap();
    assert_eq!(refused_span.parent_span_id, "b7ad6b7169203331");
    assert_eq!(refused_span.attributes["lifeguard.decision"], "deny");
    let check = spans
        .iter()
        .find(|s| {
            s.name == "lifeguard.authenticate" && s.trace_id == "0af7651916cd43dd8448eb211c80319c"
        })
        .unwrap();
    assert_eq!(check.parent_span_id, refused_span.span_id);
    assert_ne!(check.attributes["lifeguard.auth.outcome"], "ok");
}
