//! Fuzz target: the MCP header/body consistency checks (`mcp::checks::check_request`) and the
//! mirrored header values (`mcp::header_value`).
//!
//! Input: a mode byte (bit 0: `allowMissingName`), then header lines `name: value` up to an
//! empty line, then the body.
//!
//! Asserts: a mirrored value decodes to what was encoded; a request that passes has
//! `Mcp-Method` and `Mcp-Name` equal to the body's method and name and the version header equal
//! to `_meta`'s; every refusal is a 4xx with a JSON-RPC error message; and headers mirrored from
//! the body itself (as a conforming client sends them) never fail a header check.
#![no_main]

use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use lifeguard::mcp::checks::{CheckOptions, RequestKind, Violation, check_request};
use lifeguard::mcp::header_value::{decode_mirrored, encode_mirrored};
use lifeguard::mcp::jsonrpc::{Request, parse_request};
use lifeguard::mcp::{PROTOCOL_VERSION, headers, meta, methods};
use lifeguard_fuzz::mode;
use serde_json::Value;

fn split_headers(data: &[u8]) -> (HeaderMap, &[u8]) {
    let (head, body) = match data.windows(2).position(|w| w == b"\n\n") {
        Some(at) => (&data[..at], &data[at + 2..]),
        None => (&data[..0], data),
    };
    let mut map = HeaderMap::new();
    for line in head.split(|&b| b == b'\n') {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let value = &line[colon + 1..];
        let value = value.strip_prefix(b" ").unwrap_or(value);
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(value),
        ) {
            map.append(name, value);
        }
    }
    (map, body)
}

fn round_trips(text: &str) {
    let encoded = encode_mirrored(text);
    assert!(
        HeaderValue::from_str(&encoded).is_ok(),
        "{encoded:?} is a header value"
    );
    assert_eq!(decode_mirrored(encoded.as_bytes()).as_deref(), Some(text));
}

fn name_field(method: &str) -> Option<&'static str> {
    match method {
        methods::TOOLS_CALL | methods::PROMPTS_GET => Some("name"),
        methods::RESOURCES_READ => Some("uri"),
        methods::TASKS_GET | methods::TASKS_UPDATE | methods::TASKS_CANCEL => Some("taskId"),
        _ => None,
    }
}

/// The headers a conforming client sends with `request`.
fn mirrored_headers(request: &Request) -> HeaderMap {
    let mut map = HeaderMap::new();
    let version = request
        .meta(meta::PROTOCOL_VERSION)
        .and_then(Value::as_str)
        .filter(|v| *v == PROTOCOL_VERSION)
        .unwrap_or(PROTOCOL_VERSION);
    let value = |text: &str| HeaderValue::from_str(&encode_mirrored(text)).unwrap();
    map.insert(headers::PROTOCOL_VERSION, value(version));
    map.insert(headers::METHOD, value(&request.method));
    if let Some(name) = name_field(&request.method).and_then(|f| request.param_str(f)) {
        map.insert(headers::NAME, value(name));
    }
    if request.method == methods::TOOLS_CALL
        && let Some(arguments) = request
            .params()
            .and_then(|p| p.get("arguments"))
            .and_then(Value::as_object)
    {
        for (name, argument) in arguments {
            let twins = arguments
                .keys()
                .filter(|k| k.eq_ignore_ascii_case(name))
                .count();
            let rendered = match argument {
                Value::String(s) => s.clone(),
                Value::Number(_) | Value::Bool(_) => argument.to_string(),
                _ => continue,
            };
            let header = format!("{}{name}", headers::PARAM_PREFIX);
            if let (1, Ok(header)) = (twins, HeaderName::from_bytes(header.as_bytes())) {
                map.insert(header, value(&rendered));
            }
        }
    }
    map
}

fn is_header_violation(v: &Violation) -> bool {
    matches!(
        v,
        Violation::MissingVersionHeader
            | Violation::UnsupportedVersion { .. }
            | Violation::MissingHeader(_)
            | Violation::HeaderMismatch(_)
            | Violation::ParamHeaderMismatch(_)
            | Violation::MalformedHeader(_)
    )
}

fuzz_target!(|data: &[u8]| {
    let Some((mode, rest)) = mode(data) else {
        return;
    };
    let (map, body) = split_headers(rest);
    for value in map.values() {
        if let Some(text) = decode_mirrored(value.as_bytes()) {
            round_trips(&text);
        }
    }
    let Ok(request) = parse_request(body) else {
        return;
    };
    round_trips(&request.method);
    let accepted = vec![PROTOCOL_VERSION.to_owned()];
    let options = CheckOptions {
        accepted_versions: &accepted,
        allow_missing_name: mode & 1 == 1,
    };
    match check_request(&map, &request, options) {
        Ok(facts) => {
            let method = map.get(headers::METHOD).expect("Mcp-Method was checked");
            assert_eq!(
                decode_mirrored(method.as_bytes()).as_deref(),
                Some(request.method.as_str())
            );
            assert_eq!(facts.protocol_version, PROTOCOL_VERSION);
            if !request.is_notification() {
                assert_eq!(
                    request.meta(meta::PROTOCOL_VERSION).and_then(Value::as_str),
                    Some(PROTOCOL_VERSION)
                );
            }
            let named = match &facts.kind {
                RequestKind::ToolsCall { tool } => Some(tool),
                RequestKind::TaskGet { task_id }
                | RequestKind::TaskUpdate { task_id }
                | RequestKind::TaskCancel { task_id } => Some(task_id),
                _ => None,
            };
            if let Some(name) = named {
                let field = name_field(&request.method).expect("a named kind has a name field");
                assert_eq!(request.param_str(field), Some(name.as_str()));
                match map.get(headers::NAME) {
                    Some(header) => assert_eq!(
                        decode_mirrored(header.as_bytes()).as_deref(),
                        Some(name.as_str())
                    ),
                    None => assert!(options.allow_missing_name),
                }
            }
        }
        Err(violation) => {
            let (status, error) = violation.to_error();
            assert!(status.is_client_error(), "{violation:?} answers {status}");
            assert!(!error.message.is_empty());
            assert!(!violation.reason().is_empty());
        }
    }
    let conforming = mirrored_headers(&request);
    if let Err(violation) = check_request(&conforming, &request, options) {
        assert!(
            !is_header_violation(&violation),
            "headers mirrored from the body are refused: {violation:?} for {conforming:?}"
        );
    }
});
