//! Fuzz target: the upstream SSE decoder as the sidecar runs it (the event-stream parser over
//! the server's body, the per-event bound, then each event's data as strict JSON and the
//! message classification; `sidecar::largest_upstream_event`, `mcp::strict_json`,
//! `mcp::jsonrpc::classify`).
//!
//! Input: a seed byte for the chunking, then the body bytes.
//!
//! Asserts: the body cut into one chunk, into single bytes and into varying chunks yields the
//! same events (or the same error) and the same largest-event size; the largest event is never
//! larger than the body; an event relayed to the client (JSON data re-encoded as the relay
//! does) decodes back to the same message.
#![no_main]

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream;
use http_body::Frame;
use http_body_util::StreamBody;
use libfuzzer_sys::fuzz_target;
use lifeguard::mcp::jsonrpc::classify;
use lifeguard::mcp::strict_json;
use lifeguard::sidecar::largest_upstream_event;
use lifeguard_fuzz::{chunk_lengths, mode, run_ready};
use serde_json::json;
use sse_stream::{Sse, SseStream};

/// Decodes `chunks` as one event stream: the events, and the error that ended it, if any.
fn decode(chunks: Vec<Bytes>) -> (Vec<Sse>, Option<String>) {
    let frames = stream::iter(
        chunks
            .into_iter()
            .map(|c| Ok::<_, std::convert::Infallible>(Frame::data(c))),
    );
    let mut events = SseStream::new(StreamBody::new(frames));
    run_ready(async {
        let mut out = Vec::new();
        while let Some(event) = events.next().await {
            match event {
                Ok(event) => out.push(event),
                Err(error) => return (out, Some(error.to_string())),
            }
        }
        (out, None)
    })
}

fn cut(body: &[u8], lengths: impl Iterator<Item = usize>) -> Vec<Bytes> {
    let mut chunks = Vec::new();
    let mut rest = body;
    for length in lengths {
        if rest.is_empty() {
            break;
        }
        let (chunk, after) = rest.split_at(length.min(rest.len()));
        chunks.push(Bytes::copy_from_slice(chunk));
        rest = after;
    }
    chunks
}

fuzz_target!(|data: &[u8]| {
    let Some((seed, body)) = mode(data) else {
        return;
    };
    let whole = vec![Bytes::copy_from_slice(body)];
    let bytes = cut(body, std::iter::repeat(1));
    let varied = cut(body, chunk_lengths(seed, 64));

    let largest = largest_upstream_event([body]);
    assert!(largest <= body.len());
    for chunking in [&bytes, &varied] {
        assert_eq!(
            largest_upstream_event(chunking.iter().map(|c| c.as_ref())),
            largest,
            "the bound depends on the chunking"
        );
    }

    let expected = decode(whole);
    assert_eq!(
        decode(bytes),
        expected,
        "one-byte chunks decode differently"
    );
    assert_eq!(decode(varied), expected, "varied chunks decode differently");

    for event in &expected.0 {
        let Some(data) = &event.data else {
            continue;
        };
        let Ok(message) = strict_json::from_str(data) else {
            continue;
        };
        let _ = classify(&message, &json!(1));
        // What the relay sends on: the message re-serialized as one `message` event.
        let relayed = Sse::default().event("message").data(message.to_string());
        let encoded = relayed.clone().encode().expect("a relayed event encodes");
        let (again, error) = decode(vec![encoded]);
        assert_eq!(error, None);
        assert_eq!(again, vec![relayed]);
        let back = strict_json::from_str(again[0].data.as_deref().unwrap()).unwrap();
        assert_eq!(back, message);
    }
});
