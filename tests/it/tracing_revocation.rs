//! The revocation trace, black box: the real operator on the API emulator, real sidecars in
//! cluster mode, a real OTLP receiver. A revocation that enters Lifeguard — a signed SET
//! pushed to the operator, or a PrincipalRevocation a person applies — is one trace: the
//! operator's `lifeguard.revocation` span (named on the object by `lifeguard.dev/traceparent`),
//! its distribution to each sidecar, each sidecar's `lifeguard.revocation.apply` and the
//! `tasks/cancel` each sends upstream, and the operator's mark when propagation completed.
//! Span IDs and parent links are asserted, never timings.

use crate::support;
use crate::support::{alice, bob};

use serde_json::{Value, json};
use support::User;
use support::cluster::{APP, Cluster, NS, policy};
use support::otlp::{OtlpReceiver, ReceivedSpan};
use support::ssf::{AUDIENCE, TRANSMITTER, two_push_transmitters};

const ANNOTATION: &str = "lifeguard.dev/traceparent";
/// The transmitter's trace, continued by the push.
const TRANSMITTER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const TRANSMITTER_SPAN: &str = "00f067aa0ba902b7";
/// A trace a person chose for their revocation (written on the object by them).
const PERSON_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const PERSON_SPAN: &str = "b7ad6b7169203331";
const SESSION_REVOKED: &str = "https://schemas.openid.net/secevent/caep/event-type/session-revoked";

const OPERATOR: &str = "lifeguard-operator";
const SIDECAR: &str = "lifeguard-sidecar";
const CLIENT: i32 = 3;

/// A token issued a minute ago (a revocation "before now" covers it).
fn older_token(user: &User) -> String {
    let now = jiff::Timestamp::now().as_second();
    user.token_with(|c| {
        c["iat"] = json!(now - 60);
        c["nbf"] = json!(now - 65);
    })
}

fn revocation_path(name: &str) -> String {
    format!("/apis/lifeguard.dev/v1alpha1/principalrevocations/{name}")
}

/// A cluster of `sidecars` whose operator (with `config`) and sidecars export to `receiver`,
/// with the test policy in force everywhere and applied by the leader (its status is in sync).
async fn traced_cluster(receiver: &OtlpReceiver, sidecars: usize, config: Option<&str>) -> Cluster {
    let cluster = Cluster::start_with_env(sidecars, config, &receiver.env("grpc")).await;
    cluster
        .emulator
        .apply_yaml(&policy(&cluster.jwks.url, "write_rows"))
        .await;
    cluster.all_ready_with("ready: policy").await;
    cluster
        .wait_for(
            &format!("/apis/lifeguard.dev/v1alpha1/namespaces/{NS}/mcpserverpolicies/{APP}"),
            "every sidecar in sync (the leader writes status)",
            |o| o["status"]["sidecarsInSync"] == sidecars,
        )
        .await;
    cluster
}

/// A long task of `user` on sidecar `index`.
async fn running_task(cluster: &Cluster, index: usize, user: &User) -> String {
    support::create_task(
        &cluster.members[index].client,
        &older_token(user),
        "write_rows",
        json!({"count": 100000, "intervalMs": 20}),
    )
    .await
}

fn annotation_of(object: &Value) -> Option<String> {
    object["metadata"]["annotations"][ANNOTATION]
        .as_str()
        .map(str::to_owned)
}

/// `(trace id, span id)` of a `traceparent`.
fn ids(traceparent: &str) -> (String, String) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!((parts[0], parts[3]), ("00", "01"), "{traceparent}");
    (parts[1].to_owned(), parts[2].to_owned())
}

fn in_trace<'a>(spans: &'a [ReceivedSpan], trace: &str, name: &str) -> Vec<&'a ReceivedSpan> {
    spans
        .iter()
        .filter(|s| s.trace_id == trace && s.name == name)
        .collect()
}

/// The upstream `tasks/cancel` sent inside `apply`.
fn cancel_under<'a>(spans: &'a [ReceivedSpan], apply: &ReceivedSpan) -> Option<&'a ReceivedSpan> {
    spans.iter().find(|s| {
        s.name == "tasks/cancel"
            && s.kind == CLIENT
            && s.trace_id == apply.trace_id
            && s.parent_span_id == apply.span_id
    })
}

/// Whether `sidecars` sidecars applied `revocation` in `trace` as children of `parent`, each
/// with a `tasks/cancel` inside.
fn applied_everywhere(
    spans: &[ReceivedSpan],
    trace: &str,
    parent: &str,
    revocation: &str,
    sidecars: usize,
) -> bool {
    let applied: Vec<_> = in_trace(spans, trace, "lifeguard.revocation.apply")
        .into_iter()
        .filter(|s| {
            s.parent_span_id == parent && s.attributes["lifeguard.revocation.name"] == revocation
        })
        .collect();
    applied.len() >= sidecars && applied.iter().all(|a| cancel_under(spans, a).is_some())
}

/// Checks every sidecar's part of the trace: an internal `lifeguard.revocation.apply` span of
/// `lifeguard-sidecar`, a child of `parent`, that counted the cancelled task, and inside it
/// the first `tasks/cancel` sent upstream (a client span of the same sidecar).
fn assert_applied(spans: &[ReceivedSpan], trace: &str, parent: &str, revocation: &str) {
    for apply in in_trace(spans, trace, "lifeguard.revocation.apply")
        .into_iter()
        .filter(|s| s.attributes["lifeguard.revocation.name"] == revocation)
    {
        assert_eq!(apply.service, SIDECAR, "{apply:#?}");
        assert_eq!(apply.kind, 1, "internal: {apply:#?}");
        assert_eq!(apply.parent_span_id, parent, "{apply:#?}");
        let cancelled: u64 = apply.attributes["lifeguard.revocation.tasks_cancelled"]
            .parse()
            .unwrap_or_else(|_| panic!("no count: {apply:#?}"));
        assert!(cancelled >= 1, "{apply:#?}");
        let cancel = cancel_under(spans, apply).unwrap();
        assert_eq!(cancel.service, SIDECAR);
        assert_eq!(cancel.attributes["mcp.method.name"], "tasks/cancel");
    }
}

/// How many distribution marks `trace` has.
fn distributions(spans: &[ReceivedSpan], trace: &str) -> usize {
    in_trace(spans, trace, "lifeguard.revocation.distribute").len()
}

/// The operator marked, in `trace` under `parent`, the sending of a snapshot carrying
/// `revocation` to each of `pods`.
fn assert_distributed(
    spans: &[ReceivedSpan],
    trace: &str,
    parent: &str,
    revocation: &str,
    pods: &[&str],
) {
    let distributed = in_trace(spans, trace, "lifeguard.revocation.distribute");
    for pod in pods {
        let span = distributed
            .iter()
            .find(|s| s.attributes["k8s.pod.name"] == *pod)
            .unwrap_or_else(|| panic!("no distribution to {pod}: {distributed:#?}"));
        assert_eq!(span.service, OPERATOR);
        assert_eq!(span.kind, 4, "producer: {span:#?}");
        assert_eq!(span.parent_span_id, parent);
        assert_eq!(span.attributes["lifeguard.revocation.name"], revocation);
        assert_eq!(span.attributes["k8s.namespace.name"], NS);
    }
}

/// The operator's mark of completed propagation, with what status records.
async fn assert_propagated(receiver: &OtlpReceiver, trace: &str, parent: &str, sidecars: usize) {
    let spans = receiver
        .wait_for("the operator's mark of completed propagation", |spans| {
            !in_trace(spans, trace, "lifeguard.revocation.propagated").is_empty()
        })
        .await;
    let done = in_trace(&spans, trace, "lifeguard.revocation.propagated")[0];
    assert_eq!(done.service, OPERATOR);
    assert_eq!(done.parent_span_id, parent);
    assert_eq!(
        done.attributes["lifeguard.revocation.target_sidecars"],
        sidecars.to_string()
    );
    assert_eq!(
        done.attributes["lifeguard.revocation.acknowledged_sidecars"],
        sidecars.to_string()
    );
    assert!(
        done.attributes["lifeguard.revocation.propagation_ms"]
            .parse::<i64>()
            .is_ok(),
        "{done:#?}"
    );
}

/// The patches of the object `name` itself (not of its status) other than the test's own
/// server-side applies.
async fn object_patches(cluster: &Cluster, name: &str) -> Vec<Value> {
    let path = revocation_path(name);
    cluster
        .emulator
        .requests()
        .await
        .into_iter()
        .filter(|r| {
            r["method"] == "PATCH"
                && r["path"] == path.as_str()
                && r["contentType"] != "application/apply-patch+yaml"
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pushed_security_event_is_one_trace_from_the_push_to_every_sidecars_cancel() {
    let receiver = OtlpReceiver::start().await;
    let config = two_push_transmitters(&[], &[]);
    let cluster = traced_cluster(&receiver, 2, Some(&config)).await;
    for i in 0..2 {
        running_task(&cluster, i, &alice()).await;
    }

    let now = jiff::Timestamp::now().as_second();
    let claims = json!({
        "iss": TRANSMITTER, "aud": AUDIENCE, "iat": now, "jti": "jti-traced",
        "sub_id": {"format": "iss_sub", "iss": support::ISSUER, "sub": "alice"},
        "events": {SESSION_REVOKED: {"event_timestamp": now - 1}}
    });
    let set = support::cluster::SetSigner::default().sign(&claims, "test-b-ed-1", "secevent+jwt");
    let pushed = cluster
        .operator
        .ca
        .client()
        .post(format!("{}/ssf/push", cluster.operator.url))
        .header("content-type", "application/secevent+jwt")
        .header(
            "traceparent",
            format!("00-{TRANSMITTER_TRACE}-{TRANSMITTER_SPAN}-01"),
        )
        .body(set)
        .send()
        .await
        .unwrap();
    assert_eq!(pushed.status(), 202, "{}", cluster.operator.logs());

    // 202 means the object exists, and it was created with its trace annotation.
    let list = cluster
        .get("/apis/lifeguard.dev/v1alpha1/principalrevocations")
        .await
        .unwrap();
    let object = &list["items"][0];
    let name = object["metadata"]["name"].as_str().unwrap().to_owned();
    let traceparent = annotation_of(object).expect("the annotation is set at creation");
    let (trace, revocation_span) = ids(&traceparent);
    assert_eq!(
        trace, TRANSMITTER_TRACE,
        "the transmitter's trace continues"
    );

    let spans = receiver
        .wait_for(
            "the operator's spans, both sidecars' applications and cancels",
            |spans| {
                applied_everywhere(spans, &trace, &revocation_span, &name, 2)
                    && !in_trace(spans, &trace, "POST /ssf/push").is_empty()
                    && !in_trace(spans, &trace, "lifeguard.revocation").is_empty()
                    && distributions(spans, &trace) >= 2
            },
        )
        .await;
    // The operator: the push's server span, and the revocation's span inside it, which is the
    // span the annotation names.
    let push = in_trace(&spans, &trace, "POST /ssf/push")[0];
    assert_eq!(push.parent_span_id, TRANSMITTER_SPAN);
    let received = in_trace(&spans, &trace, "lifeguard.revocation")[0];
    assert_eq!(received.service, OPERATOR);
    assert_eq!(received.span_id, revocation_span);
    assert_eq!(received.parent_span_id, push.span_id);
    assert_eq!(received.attributes["lifeguard.revocation.name"], name);
    assert_eq!(
        received.attributes["lifeguard.revocation.reason"],
        "sessionRevoked"
    );
    assert_eq!(
        received.attributes["lifeguard.revocation.outcome"],
        "created"
    );
    assert_distributed(
        &spans,
        &trace,
        &revocation_span,
        &name,
        &["reports-0", "reports-1"],
    );
    assert_applied(&spans, &trace, &revocation_span, &name);
    assert_propagated(&receiver, &trace, &revocation_span, 2).await;

    // No span of the trace names the principal.
    for span in receiver.spans().iter().filter(|s| s.trace_id == trace) {
        for (key, value) in &span.attributes {
            assert!(
                !value.contains("alice"),
                "{key} names the subject: {span:#?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persons_revocation_starts_a_trace_the_object_names_and_a_persons_own_trace_is_kept() {
    let receiver = OtlpReceiver::start().await;
    let cluster = traced_cluster(&receiver, 1, None).await;
    running_task(&cluster, 0, &alice()).await;
    running_task(&cluster, 0, &bob()).await;
    let revocation = |name: &str, subject: &str, annotations: &str| {
        format!(
            "apiVersion: lifeguard.dev/v1alpha1\nkind: PrincipalRevocation\nmetadata: {{name: {name}{annotations}}}\nspec:\n  issuer: {}\n  subject: {subject}\n  revokedBefore: \"{}\"\n  reason: adminAction\n  source: {{kind: manual}}\n",
            support::ISSUER,
            jiff::Timestamp::now()
        )
    };

    // Applied without annotation: the operator starts a trace and writes its context onto the
    // object, with a merge patch of the object (not of its status).
    cluster
        .emulator
        .apply_yaml(&revocation("alice-stop", "alice", ""))
        .await;
    let object = cluster
        .wait_for(
            &revocation_path("alice-stop"),
            "the trace annotation",
            |o| annotation_of(o).is_some(),
        )
        .await;
    let (trace, root) = ids(&annotation_of(&object).unwrap());
    let patches = object_patches(&cluster, "alice-stop").await;
    assert_eq!(patches.len(), 1, "{patches:#?}");
    assert_eq!(patches[0]["contentType"], "application/merge-patch+json");

    let spans = receiver
        .wait_for("the sidecar's application and its cancel", |spans| {
            applied_everywhere(spans, &trace, &root, "alice-stop", 1)
                && !in_trace(spans, &trace, "lifeguard.revocation").is_empty()
                && distributions(spans, &trace) >= 1
        })
        .await;
    let started = in_trace(&spans, &trace, "lifeguard.revocation")[0];
    assert_eq!(started.service, OPERATOR);
    assert_eq!(started.span_id, root);
    assert!(
        started.parent_span_id.is_empty(),
        "a new trace: {started:#?}"
    );
    assert_eq!(
        started.attributes["lifeguard.revocation.reason"],
        "adminAction"
    );
    assert_eq!(started.attributes["lifeguard.revocation.annotated"], "true");
    assert_distributed(&spans, &trace, &root, "alice-stop", &["reports-0"]);
    assert_applied(&spans, &trace, &root, "alice-stop");
    assert_propagated(&receiver, &trace, &root, 1).await;

    // Applied with a traceparent of the person's own: it is continued, never replaced, and the
    // operator starts nothing for it.
    let theirs = format!("00-{PERSON_TRACE}-{PERSON_SPAN}-01");
    cluster
        .emulator
        .apply_yaml(&revocation(
            "bob-stop",
            "bob",
            &format!(", annotations: {{{ANNOTATION}: \"{theirs}\"}}"),
        ))
        .await;
    let spans = receiver
        .wait_for("the sidecar's application in the person's trace", |spans| {
            applied_everywhere(spans, PERSON_TRACE, PERSON_SPAN, "bob-stop", 1)
                && distributions(spans, PERSON_TRACE) >= 1
        })
        .await;
    assert_applied(&spans, PERSON_TRACE, PERSON_SPAN, "bob-stop");
    assert_distributed(
        &spans,
        PERSON_TRACE,
        PERSON_SPAN,
        "bob-stop",
        &["reports-0"],
    );
    cluster
        .wait_for(&revocation_path("bob-stop"), "propagated", |o| {
            o["status"]["completedAt"].is_string()
        })
        .await;
    let object = cluster.get(&revocation_path("bob-stop")).await.unwrap();
    assert_eq!(annotation_of(&object), Some(theirs));
    assert!(object_patches(&cluster, "bob-stop").await.is_empty());
    assert!(
        receiver
            .spans()
            .iter()
            .all(|s| s.name != "lifeguard.revocation"
                || s.attributes["lifeguard.revocation.name"] != "bob-stop"),
        "the operator started a trace for an annotated revocation"
    );
}
