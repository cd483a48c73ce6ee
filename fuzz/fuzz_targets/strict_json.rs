//! Fuzz target: the strict JSON parser (`mcp::strict_json`) and the JSON-RPC envelope checks
//! (`mcp::jsonrpc::parse_request`, `classify`), on any bytes a client or server may send.
//!
//! Asserts: `from_slice` and `check_slice` agree; an accepted document is what serde_json reads
//! and re-serializes to itself; what serde_json reads is refused only for a duplicate key; an accepted request keeps the body's method and id and is
//! accepted again after re-serialization; a refused one is a parse error or an invalid request
//! with a message, whose error response serializes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lifeguard::mcp::codes;
use lifeguard::mcp::jsonrpc::{self, MessageKind};
use lifeguard::mcp::strict_json::{self, StrictJsonError};
use serde_json::{Value, json};

fuzz_target!(|data: &[u8]| {
    let strict = strict_json::from_slice(data);
    let checked = strict_json::check_slice(data);
    match (&strict, &checked) {
        (Ok(_), Ok(())) | (Err(StrictJsonError::Syntax(_)), Err(StrictJsonError::Syntax(_))) => {}
        (Err(StrictJsonError::DuplicateKey(a)), Err(StrictJsonError::DuplicateKey(b))) => {
            assert_eq!(a, b, "both parsers name the same duplicate")
        }
        _ => panic!("from_slice {strict:?} and check_slice {checked:?} disagree"),
    }
    let lenient: Result<Value, _> = serde_json::from_slice(data);
    match &strict {
        Ok(value) => {
            assert_eq!(
                lenient.as_ref().ok(),
                Some(value),
                "serde_json reads the same value"
            );
            let text = serde_json::to_vec(value).expect("a parsed value serializes");
            let again = strict_json::from_slice(&text).expect("a serialized value is strict JSON");
            assert_eq!(&again, value, "re-serialization round-trips");
            // Upstream messages are classified against a request id; any value is classified.
            for id in [json!(1), json!("a"), Value::Null] {
                let _ = jsonrpc::classify(value, &id);
            }
        }
        // Parsing stops at the first duplicate: what follows it may be anything.
        Err(StrictJsonError::DuplicateKey(_)) => {}
        Err(StrictJsonError::Syntax(message)) => {
            assert!(lenient.is_err(), "serde_json also refuses {data:?}");
            assert!(!message.is_empty());
        }
    }

    match jsonrpc::parse_request(data) {
        Ok(request) => {
            let message = strict.as_ref().expect("an accepted request is strict JSON");
            assert_eq!(&request.message, message);
            assert_eq!(message["jsonrpc"], "2.0");
            assert_eq!(message["method"].as_str(), Some(request.method.as_str()));
            assert_eq!(request.id.as_ref(), message.get("id"));
            if let Some(id) = &request.id {
                assert!(id.is_string() || id.is_number(), "id {id}");
            }
            // The answer carries the id as sent, and serializes.
            let answer = jsonrpc::result_message(&request.response_id(), json!({}));
            let answer_text = serde_json::to_vec(&answer).expect("an answer serializes");
            let answer = strict_json::from_slice(&answer_text).expect("an answer is strict JSON");
            assert_eq!(
                answer["id"],
                request.response_id(),
                "the id is echoed unchanged"
            );
            if !request.is_notification() {
                assert_eq!(
                    jsonrpc::classify(&answer, &request.response_id()),
                    MessageKind::ResponseToRequest
                );
            }
            let text = serde_json::to_vec(message).expect("a request serializes");
            let again = jsonrpc::parse_request(&text).expect("a forwarded request is accepted");
            assert_eq!(again, request);
        }
        Err(error) => {
            assert!(
                error.code == codes::PARSE_ERROR || error.code == codes::INVALID_REQUEST,
                "code {}",
                error.code
            );
            assert!(!error.message.is_empty());
            if error.code == codes::PARSE_ERROR {
                assert!(matches!(strict, Err(StrictJsonError::Syntax(_))));
            }
            let answer = jsonrpc::error_message(&Value::Null, &error);
            serde_json::to_vec(&answer).expect("an error answer serializes");
        }
    }
});
