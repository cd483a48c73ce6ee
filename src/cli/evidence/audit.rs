//! The sidecar's audit trail, read from the side: which lines appeared while a check ran.
//!
//! Clients never learn an audit line's `correlation_id`, so lines are attributed to a check by
//! position: those appended between the check's start and its end (after the writer has gone
//! quiet). Checks run one at a time, so a window holds the lines of that check, plus the odd
//! background event (a sweeper ending an earlier task) that the reader can tell by its fields.
//! Fields are read by name and unknown ones are kept: the trail's shape may grow.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

/// An audit file (JSON lines) being written by the sidecar.
pub struct AuditTrail {
    path: PathBuf,
}

impl AuditTrail {
    pub fn new(path: PathBuf) -> Self {
        Self { path }
    }

    /// The audit events in the file: JSON objects with an `event`. Anything else (log lines,
    /// when the trail is captured with `kubectl logs`) is skipped.
    fn read(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.path)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line.trim()).ok())
            .filter(|v| v.get("event").is_some_and(Value::is_string))
            .collect()
    }

    /// Lines written so far: where a check's window starts.
    pub fn mark(&self) -> usize {
        self.read().len()
    }

    /// The lines after `mark`, once the writer has been quiet for a moment (it writes
    /// asynchronously, so a line may land just after the answer that caused it).
    pub async fn since(&self, mark: usize) -> Vec<Value> {
        let mut seen = self.read().len();
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(150)).await;
            let now = self.read().len();
            if now == seen {
                break;
            }
            seen = now;
        }
        self.read().into_iter().skip(mark).collect()
    }

    /// Waits (up to `timeout`) for a line after `mark` that `matches`.
    pub async fn wait_for(
        &self,
        mark: usize,
        timeout: Duration,
        matches: impl Fn(&Value) -> bool,
    ) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(line) = self.read().into_iter().skip(mark).find(|l| matches(l)) {
                return Some(line);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// `line[field]` as a string, `""` when absent.
pub fn field<'a>(line: &'a Value, field: &str) -> &'a str {
    line.get(field).and_then(Value::as_str).unwrap_or_default()
}
