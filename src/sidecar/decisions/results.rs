//! What a completed task's result becomes before the ledger keeps it (`tasks.results`):
//! fields dropped by JSON pointer, strings masked by regular expression, a result over the
//! size limit withheld, or no result at all. Whatever is kept is what every later read
//! returns, so minimizing once, before storing, covers returning too.

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
        Value::String(text) => {
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
        Value::Array(items) => items.iter_mut().map(|v| mask_strings(v, masks)).sum(),
        Value::Object(map) => map.values_mut().map(|v| mask_strings(v, masks)).sum(),
        _ => 0,
    }
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
    fn status_only_keeps_nothing_and_says_so() {
        let out = minimizer(ResultMode::StatusOnly, None, &[], &[]).minimize(report());
        assert_eq!(out.result, json!({"content": []}));
        assert_eq!(out.status_message.as_deref(), Some(STATUS_ONLY_MESSAGE));
    }
}
