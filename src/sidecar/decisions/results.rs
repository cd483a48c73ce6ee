//! What the server's output becomes under `tasks.results`, before a client reads it or the
//! ledger keeps it. A completed task's result: fields dropped by JSON pointer, strings masked
//! by regular expression, a result over the size limit withheld, or no result at all; whatever
//! is kept is what every later read returns, so minimizing once, before storing, covers
//! returning too. Every other text the server supplies (a task's `statusMessage` and input
//! requests, a failed task's error, a synchronous call's result, error and notifications) gets
//! the masks; a synchronous result also the pointers and `statusOnly` (see
//! [`ResultMinimizer::minimize_sync`]).

use serde_json::{Value, json};

use crate::api::ResultMode;
use crate::policy::ResultRules;

/// Replaces every match of a mask pattern.
pub const MASKED: &str = "[redacted]";

/// `tasks.results` of one policy version, with its patterns compiled.
#[derive(Debug)]
pub struct ResultMinimizer {
    status_only: bool,
    max_bytes: Option<usize>,
    drop: Vec<String>,
    masks: Vec<regex::Regex>,
}

/// A minimized result and what was done to it.
#[derive(Clone, Debug, PartialEq)]
pub struct Minimized {
    /// The CallToolResult to keep.
    pub result: Value,
    /// The statusMessage to record with it, when minimizing has something to say.
    pub status_message: Option<String>,
    /// Pointers that named something and were removed.
    pub dropped: usize,
    /// Matches replaced by [`MASKED`].
    pub masked: usize,
    /// Size of the result after redaction (before withholding), in bytes of JSON.
    pub bytes: usize,
    /// Whether the result was replaced for being over `maxBytes`.
    pub withheld: bool,
}

/// The statusMessage of a task completed under `mode: statusOnly`.
pub const STATUS_ONLY_MESSAGE: &str =
    "Completed. This server's policy keeps no task results (tasks.results.mode: statusOnly).";

/// The only content of a synchronous result under `mode: statusOnly`.
pub const STATUS_ONLY_SYNC_TEXT: &str =
    "This server's policy returns no tool output (tasks.results.mode: statusOnly).";

/// Fields of a task state that are the protocol's, never the server's free text: not masked
/// (a pattern matching a timestamp or an ID must not break the answer).
const TASK_PROTOCOL_FIELDS: &[&str] = &[
    "taskId",
    "status",
    "resultType",
    "createdAt",
    "lastUpdatedAt",
    "ttlMs",
    "pollIntervalMs",
];

/// Fields of a server message's `params` that are the protocol's or the client's own
/// (`progressToken` is the client's, and `level` a fixed vocabulary): not masked.
const NOTIFICATION_PROTOCOL_FIELDS: &[&str] = &["progressToken", "level"];

/// Fields of an input request that are the protocol's: not masked.
const INPUT_REQUEST_PROTOCOL_FIELDS: &[&str] = &["jsonrpc", "id", "method"];

impl ResultMinimizer {
    /// The minimizer of `rules`, or `None` when results are kept as the server gave them.
    /// Patterns that do not compile were refused by the policy compiler; they are skipped.
    pub fn from_rules(rules: &ResultRules) -> Option<Self> {
        if rules.keeps_everything() {
            return None;
        }
        Some(Self {
            status_only: rules.mode == ResultMode::StatusOnly,
            max_bytes: rules
                .max_bytes
                .map(|b| usize::try_from(b).unwrap_or(usize::MAX)),
            drop: rules.drop.clone(),
            masks: rules
                .mask
                .iter()
                .filter_map(|p| crate::policy::validate::mask_regex(p).ok())
                .collect(),
        })
    }

    /// What to keep in place of `result`, a CallToolResult.
    pub fn minimize(&self, mut result: Value) -> Minimized {
        if self.status_only {
            return Minimized {
                result: json!({"content": []}),
                status_message: Some(STATUS_ONLY_MESSAGE.to_owned()),
                dropped: 0,
                masked: 0,
                bytes: 0,
                withheld: false,
            };
        }
        let dropped = self
            .drop
            .iter()
            .filter(|pointer| remove_at(&mut result, pointer))
            .count();
        let masked = if self.masks.is_empty() {
            0
        } else {
            mask_strings(&mut result, &self.masks)
        };
        let bytes = serde_json::to_vec(&result).map_or(usize::MAX, |v| v.len());
        let withheld = self.max_bytes.is_some_and(|max| bytes > max);
        if withheld {
            let max = self.max_bytes.unwrap_or_default();
            let text = format!(
                "The result was withheld: {bytes} bytes exceed this server's limit of {max} (tasks.results.maxBytes)."
            );
            result = json!({"content": [{"type": "text", "text": text}], "isError": true});
        }
        Minimized {
            result,
            status_message: None,
            dropped,
            masked,
            bytes,
            withheld,
        }
    }
}

impl ResultMinimizer {
    /// Whether texts other than a completed result change at all (masks are configured).
    pub fn masks_text(&self) -> bool {
        !self.masks.is_empty()
    }

    /// Whether a synchronous answer can change ([`Self::minimize_sync`]): not under rules
    /// that only bound what is stored (`maxBytes`).
    pub fn changes_sync(&self) -> bool {
        self.status_only || !self.drop.is_empty() || !self.masks.is_empty()
    }

    /// Masks one server-supplied text (a `statusMessage`); how many matches it replaced.
    pub fn mask_text(&self, text: &mut String) -> usize {
        mask_str(text, &self.masks)
    }

    /// Masks the server's free text in a task state (a `tasks/get` result, the params of
    /// `notifications/tasks`, a CreateTaskResult, an `input_required` result): every string
    /// but the protocol's fields, and in `inputRequests` every string but each request's
    /// `method`. How many matches it replaced.
    pub fn mask_task_state(&self, state: &mut Value) -> usize {
        if self.masks.is_empty() {
            return 0;
        }
        let Some(fields) = state.as_object_mut() else {
            return mask_strings(state, &self.masks);
        };
        let mut count = 0;
        for (key, value) in fields.iter_mut() {
            if TASK_PROTOCOL_FIELDS.contains(&key.as_str()) {
                continue;
            }
            if key == "inputRequests"
                && let Some(requests) = value.as_object_mut()
            {
                for request in requests.values_mut() {
                    count += mask_except(request, INPUT_REQUEST_PROTOCOL_FIELDS, &self.masks);
                }
                continue;
            }
            count += mask_strings(value, &self.masks);
        }
        count
    }

    /// Masks every string of a JSON-RPC error object (`message`, `data`).
    pub fn mask_error(&self, error: &mut Value) -> usize {
        if self.masks.is_empty() {
            return 0;
        }
        mask_strings(error, &self.masks)
    }

    /// Masks the params of a notification the server sends on a request's stream
    /// (`notifications/progress`, `notifications/message`), but not its `progressToken`
    /// (the client's) or `level`.
    pub fn mask_notification(&self, message: &mut Value) -> usize {
        match message.get_mut("params") {
            Some(params) if !self.masks.is_empty() => {
                mask_except(params, NOTIFICATION_PROTOCOL_FIELDS, &self.masks)
            }
            _ => 0,
        }
    }

    /// A synchronous CallToolResult as the client receives it. Nothing is stored, so
    /// `maxBytes` (a bound on what the ledger keeps) does not apply; pointers and masks do, as
    /// for a task's result. Under `statusOnly` the client gets what a task's reader gets, no
    /// output: one text block saying so, with the server's `isError` (and `resultType`) kept,
    /// so that calling without a task is no way around the policy.
    pub fn minimize_sync(&self, mut result: Value) -> Value {
        if self.status_only {
            let mut kept = json!({"content": [{"type": "text", "text": STATUS_ONLY_SYNC_TEXT}]});
            for field in ["resultType", "isError"] {
                if let Some(value) = result.get_mut(field) {
                    kept[field] = value.take();
                }
            }
            return kept;
        }
        for pointer in &self.drop {
            remove_at(&mut result, pointer);
        }
        if !self.masks.is_empty() {
            mask_strings(&mut result, &self.masks);
        }
        result
    }
}

/// Masks every string of `value`, except the values of `skip` when `value` is an object.
fn mask_except(value: &mut Value, skip: &[&str], masks: &[regex::Regex]) -> usize {
    match value.as_object_mut() {
        Some(fields) => fields
            .iter_mut()
            .filter(|(key, _)| !skip.contains(&key.as_str()))
            .map(|(_, v)| mask_strings(v, masks))
            .sum(),
        None => mask_strings(value, masks),
    }
}

/// Removes what `pointer` (RFC 6901) names; whether it named something. The whole document
/// (`""`) is never removed.
fn remove_at(doc: &mut Value, pointer: &str) -> bool {
    let Some(split) = pointer.rfind('/') else {
        return false;
    };
    let (parent, last) = (&pointer[..split], &pointer[split + 1..]);
    let key = last.replace("~1", "/").replace("~0", "~");
    match doc.pointer_mut(parent) {
        Some(Value::Object(map)) => map.remove(&key).is_some(),
        Some(Value::Array(items)) => match key.parse::<usize>() {
            // RFC 6901 array indices have no leading zeros (except "0" itself).
            Ok(i) if i < items.len() && (key == "0" || !key.starts_with('0')) => {
                items.remove(i);
                true
            }
            _ => false,
        },
        _ => false,
    }
}

/// Replaces every match of `masks` in every string value of `value`; how many it replaced.
fn mask_strings(value: &mut Value, masks: &[regex::Regex]) -> usize {
    match value {
        Value::String(text) => mask_str(text, masks),
        Value::Array(items) => items.iter_mut().map(|v| mask_strings(v, masks)).sum(),
        Value::Object(map) => map.values_mut().map(|v| mask_strings(v, masks)).sum(),
        _ => 0,
    }
}

/// Replaces every match of `masks` in `text`; how many it replaced.
fn mask_str(text: &mut String, masks: &[regex::Regex]) -> usize {
    let mut count = 0;
    for mask in masks {
        let found = mask.find_iter(text).count();
        if found > 0 {
            count += found;
            *text = mask.replace_all(text, MASKED).into_owned();
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minimizer(
        mode: ResultMode,
        max: Option<u32>,
        drop: &[&str],
        mask: &[&str],
    ) -> ResultMinimizer {
        ResultMinimizer::from_rules(&ResultRules {
            mode,
            max_bytes: max,
            drop: drop.iter().map(|s| (*s).to_owned()).collect(),
            mask: mask.iter().map(|s| (*s).to_owned()).collect(),
        })
        .expect("rules that change something")
    }

    fn report() -> Value {
        json!({
            "content": [{"type": "text", "text": "Customer 123-45-6789 owes 10; call 555-0100"}],
            "structuredContent": {"customer": {"name": "Ann", "ssn": "123-45-6789"},
                                  "a/b": 1, "rows": [1, 2, 3]}
        })
    }

    #[test]
    fn default_rules_keep_results_untouched() {
        assert!(ResultMinimizer::from_rules(&ResultRules::default()).is_none());
    }

    #[test]
    fn pointers_drop_fields_and_array_items_and_ignore_what_is_not_there() {
        let m = minimizer(
            ResultMode::Full,
            None,
            &[
                "/structuredContent/customer/ssn",
                "/structuredContent/a~1b",
                "/structuredContent/rows/1",
                "/structuredContent/rows/01",
                "/nothing/here",
                "",
            ],
            &[],
        );
        let out = m.minimize(report());
        assert_eq!(out.dropped, 3);
        assert_eq!(
            out.result["structuredContent"],
            json!({"customer": {"name": "Ann"}, "rows": [1, 3]})
        );
        assert!(!out.withheld);
    }

    #[test]
    fn masks_replace_every_match_in_every_string() {
        let m = minimizer(
            ResultMode::Full,
            None,
            &[],
            &[r"\b\d{3}-\d{2}-\d{4}\b", r"555-\d{4}"],
        );
        let out = m.minimize(report());
        assert_eq!(out.masked, 3);
        assert_eq!(
            out.result["content"][0]["text"],
            "Customer [redacted] owes 10; call [redacted]"
        );
        assert_eq!(out.result["structuredContent"]["customer"]["ssn"], MASKED);
        assert_eq!(out.result["structuredContent"]["rows"], json!([1, 2, 3]));
    }

    #[test]
    fn a_result_over_the_limit_after_redaction_is_withheld_as_an_error_result() {
        let small = minimizer(ResultMode::Full, Some(64), &[], &[]).minimize(report());
        assert!(small.withheld);
        assert_eq!(small.result["isError"], true);
        let text = small.result["content"][0]["text"].as_str().unwrap();
        assert!(text.contains(&format!("{} bytes", small.bytes)), "{text}");
        assert!(text.contains("limit of 64"), "{text}");
        // Redaction runs first: dropping the bulk brings it under the limit.
        let fits = minimizer(
            ResultMode::Full,
            Some(64),
            &["/content", "/structuredContent/customer"],
            &[],
        )
        .minimize(report());
        assert!(!fits.withheld, "{fits:?}");
        assert_eq!(
            fits.result,
            json!({"structuredContent": {"a/b": 1, "rows": [1, 2, 3]}})
        );
    }

    #[test]
    fn task_states_have_their_free_text_masked_and_their_protocol_fields_kept() {
        let m = minimizer(ResultMode::Full, None, &[], &[r"\d{4}"]);
        let mut state = json!({
            "taskId": "lgt_1234", "status": "input_required", "resultType": "task",
            "createdAt": "2026-12-04T10:00:00Z", "lastUpdatedAt": "2026-12-04T10:00:01Z",
            "ttlMs": 60000, "pollIntervalMs": 1000,
            "statusMessage": "account 1234 and 5678",
            "_meta": {"note": "card 9999"},
            "inputRequests": {"q-1234": {"method": "elicitation/create", "id": "1234",
                                         "params": {"message": "confirm 4321?"}}}
        });
        assert_eq!(m.mask_task_state(&mut state), 4);
        assert_eq!(state["statusMessage"], "account [redacted] and [redacted]");
        assert_eq!(state["_meta"]["note"], "card [redacted]");
        let request = &state["inputRequests"]["q-1234"];
        assert_eq!(request["params"]["message"], "confirm [redacted]?");
        assert_eq!(request["method"], "elicitation/create");
        assert_eq!(request["id"], "1234");
        assert_eq!(state["taskId"], "lgt_1234");
        assert_eq!(state["createdAt"], "2026-12-04T10:00:00Z");
        assert_eq!(state["lastUpdatedAt"], "2026-12-04T10:00:01Z");
        // No masks: nothing changes, nothing is walked.
        let none = minimizer(ResultMode::Full, Some(10), &[], &[]);
        let before = state.clone();
        assert_eq!(none.mask_task_state(&mut state), 0);
        assert_eq!(state, before);
        assert!(!none.masks_text());
    }

    #[test]
    fn errors_and_notifications_are_masked_but_not_the_clients_progress_token() {
        let m = minimizer(ResultMode::Full, None, &[], &[r"acct-\d+"]);
        let mut error = json!({"code": -32603, "message": "card acct-1 declined",
                               "data": {"detail": ["acct-22"]}});
        assert_eq!(m.mask_error(&mut error), 2);
        assert_eq!(error["message"], "card [redacted] declined");
        assert_eq!(error["data"]["detail"][0], MASKED);
        let mut progress = json!({"jsonrpc": "2.0", "method": "notifications/progress",
            "params": {"progressToken": "acct-7", "progress": 1, "message": "reading acct-8"}});
        assert_eq!(m.mask_notification(&mut progress), 1);
        assert_eq!(progress["params"]["progressToken"], "acct-7");
        assert_eq!(progress["params"]["message"], "reading [redacted]");
        let mut text = "acct-1 and acct-2".to_owned();
        assert_eq!(m.mask_text(&mut text), 2);
        assert_eq!(text, "[redacted] and [redacted]");
    }

    #[test]
    fn synchronous_results_get_pointers_and_masks_but_no_size_limit() {
        let m = minimizer(
            ResultMode::Full,
            Some(10),
            &["/structuredContent/customer/ssn"],
            &[r"555-\d{4}"],
        );
        assert!(m.changes_sync());
        let out = m.minimize_sync(report());
        assert_eq!(
            out["content"][0]["text"],
            "Customer 123-45-6789 owes 10; call [redacted]"
        );
        assert_eq!(out["structuredContent"]["customer"], json!({"name": "Ann"}));
        // maxBytes bounds what is stored; a synchronous result is never stored.
        assert!(out.get("isError").is_none(), "not withheld: {out}");
        assert!(!minimizer(ResultMode::Full, Some(10), &[], &[]).changes_sync());
    }

    #[test]
    fn status_only_withholds_a_synchronous_output_but_keeps_its_status() {
        let m = minimizer(ResultMode::StatusOnly, None, &[], &[]);
        assert!(m.changes_sync());
        let mut failed = report();
        failed["isError"] = json!(true);
        failed["resultType"] = json!("complete");
        let out = m.minimize_sync(failed);
        assert_eq!(
            out,
            json!({"resultType": "complete", "isError": true,
                   "content": [{"type": "text", "text": STATUS_ONLY_SYNC_TEXT}]})
        );
    }

    #[test]
    fn status_only_keeps_nothing_and_says_so() {
        let out = minimizer(ResultMode::StatusOnly, None, &[], &[]).minimize(report());
        assert_eq!(out.result, json!({"content": []}));
        assert_eq!(out.status_message.as_deref(), Some(STATUS_ONLY_MESSAGE));
    }
}
