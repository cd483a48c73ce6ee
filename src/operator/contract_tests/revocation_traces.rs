//! `revocation_traces::annotate`: the leader writes a revocation's trace annotation with a
//! merge patch of `metadata.annotations` alone, preconditioned on the `uid` and
//! `resourceVersion` it just read; it reads again after a conflict, and never writes over an
//! annotation someone else put there, nor onto another object of the same name.

use serde_json::{Value, json};

use crate::api::PrincipalRevocation;
use crate::operator::revocation_traces::annotate;

use super::api_server::{Exchange, mock_client};
use super::fixtures::revocation;

const OBJECT: &str = "/apis/lifeguard.dev/v1alpha1/principalrevocations/alice-session";
const PATCH_QUERY: &str = "?&fieldManager=lifeguard-operator";
const OURS: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const THEIRS: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

fn object(resource_version: &str, annotation: Option<&str>) -> Value {
    let mut r = revocation("alice-session", None);
    r.metadata.resource_version = Some(resource_version.into());
    if let Some(value) = annotation {
        r.metadata.annotations = Some(
            [("lifeguard.dev/traceparent".to_owned(), value.to_owned())]
                .into_iter()
                .collect(),
        );
    }
    serde_json::to_value(r).unwrap()
}

fn patch(resource_version: &str) -> Value {
    json!({"metadata": {
        "uid": "uid-alice-session", "resourceVersion": resource_version,
        "annotations": {"lifeguard.dev/traceparent": OURS}
    }})
}

async fn run(uid: &str, script: Vec<Exchange>) -> Result<bool, String> {
    let (client, server) = mock_client();
    let served = server.serve(script);
    let api: kube::Api<PrincipalRevocation> = kube::Api::all(client);
    let result = annotate(&api, "alice-session", uid, OURS).await;
    drop(api);
    served.verify().await;
    result.map_err(|e| e.to_string())
}

#[tokio::test]
async fn the_annotation_is_merged_into_the_object_as_read() {
    let script = vec![
        Exchange::get(OBJECT).ok(object("12", None)),
        Exchange::merge(format!("{OBJECT}{PATCH_QUERY}"), patch("12")).ok(object("13", Some(OURS))),
    ];
    assert_eq!(run("uid-alice-session", script).await, Ok(true));
}

#[tokio::test]
async fn a_conflict_reads_again_and_an_annotation_written_meanwhile_is_kept() {
    let script = vec![
        Exchange::get(OBJECT).ok(object("12", None)),
        Exchange::merge(format!("{OBJECT}{PATCH_QUERY}"), patch("12")).conflict(),
        Exchange::get(OBJECT).ok(object("14", Some(THEIRS))),
    ];
    assert_eq!(run("uid-alice-session", script).await, Ok(false));
}

#[tokio::test]
async fn nothing_is_written_onto_another_object_or_a_gone_one() {
    let other = vec![Exchange::get(OBJECT).ok(object("12", None))];
    assert_eq!(run("uid-of-an-older-object", other).await, Ok(false));
    let gone = vec![Exchange::get(OBJECT).not_found()];
    assert_eq!(run("uid-alice-session", gone).await, Ok(false));
}

#[tokio::test]
async fn an_object_that_keeps_changing_is_left_alone_after_a_few_attempts() {
    let mut script = Vec::new();
    for version in ["12", "13", "14"] {
        script.push(Exchange::get(OBJECT).ok(object(version, None)));
        script.push(Exchange::merge(format!("{OBJECT}{PATCH_QUERY}"), patch(version)).conflict());
    }
    assert_eq!(run("uid-alice-session", script).await, Ok(false));
}

#[tokio::test]
async fn other_failures_are_reported() {
    let script = vec![
        Exchange::get(OBJECT).ok(object("12", None)),
        Exchange::merge(format!("{OBJECT}{PATCH_QUERY}"), patch("12")).fail(403, "Forbidden"),
    ];
    let error = run("uid-alice-session", script).await.unwrap_err();
    assert!(error.contains("Forbidden"), "{error}");
}
