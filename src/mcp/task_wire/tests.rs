use serde_json::json;

use super::*;
use crate::mcp::jsonrpc::result_message;
use crate::mcp::task::{parse_reported_state, present_task};

const SIDECAR: &str = "lgt_0123456789abcdef";

fn terms<'a>(id: &'a Value, upstream: &'a str) -> PollTerms<'a> {
    PollTerms {
        request_id: id,
        upstream_id: upstream,
        sidecar_id: SIDECAR,
        ttl_ms: 14_400_000,
        poll_floor_ms: 2_000,
    }
}

/// What the tree path (parse, `present_task`, serialize) answers.
fn tree_path(answer: &Value, terms: &PollTerms<'_>) -> (ReportedState, Vec<u8>) {
    let mut result = answer["result"].clone();
    let state = parse_reported_state(&result).unwrap();
    present_task(
        &mut result,
        terms.upstream_id,
        terms.sidecar_id,
        terms.ttl_ms,
        Some(terms.poll_floor_ms),
    );
    let body = serde_json::to_vec(&result_message(terms.request_id, result)).unwrap();
    (state, body)
}

/// The same answer as the tree path: byte for byte, or (`same_bytes: false`, when a nested key
/// is renamed and the tree path re-sorts it) the same JSON.
fn assert_same_as_tree_path(answer: Value, upstream: &str) {
    assert_like_tree_path(answer, upstream, true)
}

fn assert_like_tree_path(answer: Value, upstream: &str, same_bytes: bool) {
    let id = answer["id"].clone();
    let terms = terms(&id, upstream);
    let bytes = serde_json::to_vec(&answer).unwrap();
    let translated =
        translate_poll_answer(&bytes, &terms).unwrap_or_else(|| panic!("declined {answer}"));
    let (state, body) = tree_path(&answer, &terms);
    assert_eq!(translated.state, state, "{answer}");
    assert_eq!(
        serde_json::from_slice::<Value>(&translated.body).unwrap(),
        serde_json::from_slice::<Value>(&body).unwrap(),
        "{answer}"
    );
    if same_bytes {
        assert_eq!(
            String::from_utf8(translated.body).unwrap(),
            String::from_utf8(body).unwrap(),
            "{answer}"
        );
    }
}

#[test]
fn a_working_poll_is_translated_exactly_as_the_tree_path_does() {
    let upstream = "task-7f3a9c";
    for answer in [
        json!({"jsonrpc":"2.0","id":7,"result":{"taskId":upstream,"status":"working",
            "createdAt":"2026-12-02T07:00:00.000Z","ttlMs":60000,"pollIntervalMs":500}}),
        // The poll interval is the larger of the server's and the floor; missing fields appear.
        json!({"jsonrpc":"2.0","id":"a","result":{"taskId":upstream,"status":"working",
            "pollIntervalMs":9000}}),
        json!({"jsonrpc":"2.0","id":1.5,"result":{"status":"working"}}),
        // The server's ID is rewritten wherever the tree path rewrites it.
        json!({"jsonrpc":"2.0","id":7,"result":{"taskId":upstream,"status":"working",
            "statusMessage":format!("step 3 of {upstream} (again {upstream})"),
            "_meta":{"links":[upstream, {"of":upstream}]},
            upstream: 1}}),
        // Escapes that do not hide the ID pass as they are.
        json!({"jsonrpc":"2.0","id":7,"result":{"taskId":upstream,"status":"working",
            "statusMessage":"line one\nline \"two\" \u{e9}"}}),
        // Numbers and nesting the server chose.
        json!({"jsonrpc":"2.0","id":7,"result":{"taskId":upstream,"status":"working",
            "progress":{"done":3,"total":10,"ratio":0.3,"stages":[]}}}),
    ] {
        assert_same_as_tree_path(answer, upstream);
    }
}

#[test]
fn a_renamed_nested_key_keeps_its_place() {
    // The tree path sorts the renamed key anew; on the wire it stays where the server put it.
    let upstream = "task-7f3a9c";
    assert_like_tree_path(
        json!({"jsonrpc":"2.0","id":7,"result":{"taskId":upstream,"status":"working",
            "_meta":{"links":[upstream], upstream: {"ref": format!("x{upstream}")}}}}),
        upstream,
        false,
    );
}

#[test]
fn short_ids_are_replaced_only_as_whole_strings() {
    let upstream = "42";
    assert_same_as_tree_path(
        json!({"jsonrpc":"2.0","id":7,"result":{"taskId":"42","status":"working",
            "statusMessage":"42 of 420","parts":["42","142"]}}),
        upstream,
    );
    let id = json!(7);
    let bytes = br#"{"jsonrpc":"2.0","id":7,"result":{"taskId":"42","status":"working","statusMessage":"\u0034\u0032"}}"#;
    assert!(
        translate_poll_answer(bytes, &terms(&id, upstream)).is_none(),
        "the ID spelled with escapes is left to the tree path"
    );
    let bytes = br#"{"jsonrpc":"2.0","id":7,"result":{"taskId":"42","status":"working","statusMessage":"\u0034\u00322"}}"#;
    assert!(
        translate_poll_answer(bytes, &terms(&id, upstream)).is_some(),
        "an escaped string that is not the short ID needs no rewriting"
    );
}

#[test]
fn nested_formatting_is_kept_and_still_means_the_same() {
    let upstream = "task-7f3a9c";
    let id = json!(3);
    let bytes = br#"{ "result" : { "status" : "working", "taskId" : "task-7f3a9c", "detail" : { "n" : 1e3, "s" : [ "task-7f3a9c" ] } }, "id" : 3, "jsonrpc" : "2.0" }"#;
    let translated = translate_poll_answer(bytes, &terms(&id, upstream)).unwrap();
    let answer: Value = serde_json::from_slice(bytes).unwrap();
    let (_, tree) = tree_path(&answer, &terms(&id, upstream));
    assert_eq!(
        serde_json::from_slice::<Value>(&translated.body).unwrap(),
        serde_json::from_slice::<Value>(&tree).unwrap()
    );
    let text = String::from_utf8(translated.body).unwrap();
    assert!(!text.contains(upstream), "{text}");
    assert!(
        text.contains(r#"{ "n" : 1e3, "s" : [ "lgt_0123456789abcdef" ] }"#),
        "{text}"
    );
}

#[test]
fn declines_what_the_tree_path_must_decide() {
    let upstream = "task-7f3a9c";
    let id = json!(7);
    let declined = [
        // Not the response to this request.
        r#"{"jsonrpc":"2.0","id":8,"result":{"taskId":"task-7f3a9c","status":"working"}}"#,
        r#"{"jsonrpc":"2.0","id":"7","result":{"taskId":"task-7f3a9c","status":"working"}}"#,
        r#"{"jsonrpc":"2.0","result":{"taskId":"task-7f3a9c","status":"working"}}"#,
        r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32602,"message":"no such task"}}"#,
        r#"{"jsonrpc":"2.0","id":7,"method":"x","result":{"status":"working"}}"#,
        r#"[{"jsonrpc":"2.0","id":7,"result":{"status":"working"}}]"#,
        // Repeated keys, at any depth, are refused by the tree path.
        r#"{"jsonrpc":"2.0","id":7,"result":{"status":"working","status":"completed"}}"#,
        r#"{"jsonrpc":"2.0","id":7,"result":{"status":"working","x":{"a":1,"a":2}}}"#,
        // Terminal, unknown or input-requiring states are settled or screened.
        r#"{"jsonrpc":"2.0","id":7,"result":{"taskId":"task-7f3a9c","status":"completed","result":{}}}"#,
        r#"{"jsonrpc":"2.0","id":7,"result":{"taskId":"task-7f3a9c","status":"failed"}}"#,
        r#"{"jsonrpc":"2.0","id":7,"result":{"taskId":"task-7f3a9c","status":"paused"}}"#,
        r#"{"jsonrpc":"2.0","id":7,"result":{"taskId":"task-7f3a9c","status":7}}"#,
        r#"{"jsonrpc":"2.0","id":7,"result":{"taskId":"task-7f3a9c","status":"input_required","inputRequests":{"a":{}}}}"#,
        r#"{"jsonrpc":"2.0","id":7,"result":{"taskId":"task-7f3a9c","status":"working","inputRequests":{}}}"#,
        // The server's ID behind escapes.
        r#"{"jsonrpc":"2.0","id":7,"result":{"status":"working","statusMessage":"of \u0074ask-7f3a9c"}}"#,
        // Text that already holds the sidecar's ID.
        r#"{"jsonrpc":"2.0","id":7,"result":{"status":"working","lgt_0123456789abcdef":1}}"#,
        // Not JSON, or trailing data.
        r#"{"jsonrpc":"2.0","id":7,"result":{"status":"working"}"#,
        r#"{"jsonrpc":"2.0","id":7,"result":{"status":"working"}} {}"#,
    ];
    for text in declined {
        assert!(
            translate_poll_answer(text.as_bytes(), &terms(&id, upstream)).is_none(),
            "{text}"
        );
    }
    let odd_id = terms(&id, "task\"7");
    let text = r#"{"jsonrpc":"2.0","id":7,"result":{"status":"working"}}"#;
    assert!(translate_poll_answer(text.as_bytes(), &odd_id).is_none());
}

#[test]
fn the_status_message_and_state_are_reported() {
    let id = json!(7);
    let text = r#"{"jsonrpc":"2.0","id":7,"result":{"taskId":"u-1","status":"working","statusMessage":"half way"}}"#;
    let translated = translate_poll_answer(text.as_bytes(), &terms(&id, "u-1")).unwrap();
    assert_eq!(
        translated.state,
        ReportedState {
            status: TaskStatus::Working,
            status_message: Some("half way".into()),
            input_keys: Vec::new(),
            payload: None,
        }
    );
}
