//! The answer to a forwarded `tasks/get`, translated on the wire.
//!
//! A running task's poll is the request a client repeats most. The sidecar must answer it in
//! its own task ID (never the server's), with its own `ttlMs` and a `pollIntervalMs` no shorter
//! than the policy's floor; everything else the server said passes on. Doing that through a
//! `serde_json::Value` means building a tree of the whole answer, rewriting every string in it
//! and serializing it again. [`translate_poll_answer`] reads only the envelope and the top-level
//! fields of the result (borrowing everything else as raw JSON), rewrites the server's ID where
//! it appears in raw string tokens, and writes the answer once.
//!
//! It produces byte for byte what the tree path produces for the same answer, except that
//! nested values keep the server's own formatting (whitespace, number spelling, and the place
//! of a nested key it renames, which a sorted tree would move). It declines —
//! `None`, and the caller takes the tree path — whenever that equivalence is not plain: an
//! answer that is not a result for this request, repeats a key anywhere (the tree path refuses
//! it), reports a terminal or unknown status or outstanding input requests (which the sidecar
//! settles or screens), or contains the server's ID hidden behind JSON escapes.

use std::borrow::Cow;
use std::fmt;

use serde::Deserializer;
use serde::de::{MapAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::model::TaskStatus;

use super::strict_json::{self, Key};
use super::task::{MIN_SUBSTRING_ID_LEN, ReportedState};

/// A poll answer ready to send, and what the server reported in it.
#[derive(Debug, PartialEq)]
pub struct TranslatedPoll {
    pub state: ReportedState,
    /// The whole JSON-RPC response for the client.
    pub body: Vec<u8>,
}

/// What the answer is translated to.
pub struct PollTerms<'a> {
    /// The id of the client's request (and so of the forwarded one).
    pub request_id: &'a Value,
    pub upstream_id: &'a str,
    pub sidecar_id: &'a str,
    pub ttl_ms: i64,
    pub poll_floor_ms: i64,
}

/// Translates the server's answer to a forwarded `tasks/get` of an unfinished task, or
/// declines (see the module documentation).
pub fn translate_poll_answer(bytes: &[u8], terms: &PollTerms<'_>) -> Option<TranslatedPoll> {
    if !plain_id(terms.upstream_id) || !plain_id(terms.sidecar_id) {
        return None;
    }
    strict_json::check_slice(bytes).ok()?;
    let text = std::str::from_utf8(bytes).ok()?;
    if text.contains(terms.sidecar_id) {
        // The sidecar's ID is fresh; text that already holds it could collide after renaming.
        return None;
    }
    let envelope: Entries<'_> = serde_json::from_str(text).ok()?;
    let mut result = None;
    for (key, raw) in &envelope.0 {
        match key.as_ref() {
            "jsonrpc" => {}
            "id" => {
                let id: Value = serde_json::from_str(raw.get()).ok()?;
                if &id != terms.request_id {
                    return None;
                }
            }
            "result" => result = Some(*raw),
            _ => return None,
        }
    }
    if !envelope.0.iter().any(|(k, _)| k == "id") {
        return None;
    }
    let result: Entries<'_> = serde_json::from_str(result?.get()).ok()?;
    let state = reported_state(&result)?;
    let body = write_answer(&result, terms)?;
    Some(TranslatedPoll { state, body })
}

/// What the result reports, for an unfinished task without input requests.
fn reported_state(result: &Entries<'_>) -> Option<ReportedState> {
    let field = |name: &str| result.0.iter().find(|(k, _)| k == name).map(|(_, v)| *v);
    if field("inputRequests").is_some() {
        return None;
    }
    let status: Cow<'_, str> = serde_json::from_str(field("status")?.get()).ok()?;
    let status = TaskStatus::parse(&status)?;
    if status.is_terminal() || status == TaskStatus::InputRequired {
        return None;
    }
    let status_message = match field("statusMessage") {
        Some(raw) => serde_json::from_str::<Value>(raw.get())
            .ok()?
            .as_str()
            .map(str::to_owned),
        None => None,
    };
    Some(ReportedState {
        status,
        status_message,
        input_keys: Vec::new(),
        payload: None,
    })
}

/// The response: the result's fields in key order (as the tree path, a sorted map, writes
/// them), with the sidecar's ID, TTL and poll interval.
fn write_answer(result: &Entries<'_>, terms: &PollTerms<'_>) -> Option<Vec<u8>> {
    let mut fields: Vec<(Cow<'_, str>, String)> = Vec::with_capacity(result.0.len() + 3);
    let mut upstream_poll = 0i64;
    for (key, raw) in &result.0 {
        let value = match key.as_ref() {
            "taskId" | "ttlMs" => continue,
            "pollIntervalMs" => {
                upstream_poll = serde_json::from_str::<Value>(raw.get())
                    .ok()?
                    .as_i64()
                    .unwrap_or(0);
                continue;
            }
            _ => rewrite_ids(raw.get(), terms)?,
        };
        let key = if key == terms.upstream_id {
            Cow::Borrowed(terms.sidecar_id)
        } else {
            key.clone()
        };
        fields.push((key, value));
    }
    fields.push((Cow::Borrowed("taskId"), quoted(terms.sidecar_id)));
    fields.push((Cow::Borrowed("ttlMs"), terms.ttl_ms.to_string()));
    fields.push((
        Cow::Borrowed("pollIntervalMs"),
        upstream_poll.max(terms.poll_floor_ms).to_string(),
    ));
    fields.sort_by(|a, b| a.0.cmp(&b.0));
    if fields.windows(2).any(|w| w[0].0 == w[1].0) {
        return None;
    }
    let mut out = Vec::with_capacity(
        fields
            .iter()
            .map(|f| f.0.len() + f.1.len() + 4)
            .sum::<usize>()
            + 64,
    );
    out.extend_from_slice(b"{\"id\":");
    serde_json::to_writer(&mut out, terms.request_id).ok()?;
    out.extend_from_slice(b",\"jsonrpc\":\"2.0\",\"result\":{");
    for (i, (key, value)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        serde_json::to_writer(&mut out, key.as_ref()).ok()?;
        out.push(b':');
        out.extend_from_slice(value.as_bytes());
    }
    out.extend_from_slice(b"}}");
    Some(out)
}

/// An ID whose JSON spelling is the ID itself between quotes, and that cannot be mistaken for
/// part of an escape.
fn plain_id(id: &str) -> bool {
    !id.is_empty() && !id.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20)
}

fn quoted(id: &str) -> String {
    format!("\"{id}\"")
}

/// `raw` (one JSON value) with the server's ID replaced in its strings the way
/// `task::replace_task_id` replaces it in a tree: a string equal to it, and (for IDs of at
/// least [`MIN_SUBSTRING_ID_LEN`] bytes) every occurrence inside a string value; keys only when
/// equal. `None` when an escaped string would need rewriting (the tree path handles it).
fn rewrite_ids(raw: &str, terms: &PollTerms<'_>) -> Option<String> {
    let (upstream, sidecar) = (terms.upstream_id, terms.sidecar_id);
    if !raw.contains(upstream) && !raw.contains('\\') {
        return Some(raw.to_owned());
    }
    let bytes = raw.as_bytes();
    let mut out = String::with_capacity(raw.len() + 16);
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'"' {
            i += 1;
            continue;
        }
        // A string token: find its closing quote.
        let start = i + 1;
        let mut end = start;
        let mut escaped = false;
        while end < bytes.len() && bytes[end] != b'"' {
            if bytes[end] == b'\\' {
                escaped = true;
                end += 1;
            }
            end += 1;
        }
        if end >= bytes.len() {
            return None;
        }
        let is_key = raw[end + 1..].trim_start().starts_with(':');
        let content = &raw[start..end];
        let whole = end + 1;
        if escaped {
            let decoded: String = serde_json::from_str(&raw[i..whole]).ok()?;
            let rewritten = decoded == upstream
                || (!is_key
                    && upstream.len() >= MIN_SUBSTRING_ID_LEN
                    && decoded.contains(upstream));
            if rewritten {
                return None;
            }
        } else if content == upstream {
            out.push_str(&raw[copied..i]);
            out.push_str(&quoted(sidecar));
            copied = whole;
        } else if !is_key && upstream.len() >= MIN_SUBSTRING_ID_LEN && content.contains(upstream) {
            out.push_str(&raw[copied..i]);
            out.push('"');
            out.push_str(&content.replace(upstream, sidecar));
            out.push('"');
            copied = whole;
        }
        i = whole;
    }
    out.push_str(&raw[copied..]);
    Some(out)
}

/// The members of one JSON object in order, values as raw JSON borrowed from the input.
struct Entries<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de> serde::Deserialize<'de> for Entries<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct EntriesVisitor;
        impl<'de> Visitor<'de> for EntriesVisitor {
            type Value = Entries<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries<'de>, A::Error> {
                let mut entries = Vec::new();
                while let Some(key) = map.next_key::<Key<'de>>()? {
                    entries.push((key.0, map.next_value::<&'de RawValue>()?));
                }
                Ok(Entries(entries))
            }
        }
        d.deserialize_map(EntriesVisitor)
    }
}

#[cfg(test)]
mod tests;
