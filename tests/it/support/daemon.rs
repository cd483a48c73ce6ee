//! One handle for every long-running `lifeguard` process a test starts (sidecar, operator,
//! webhook): its output collected line by line, readiness polled on its admin port, metrics
//! read from there, and the process killed when the handle is dropped.

use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A running process and what it printed, killed (SIGKILL) when dropped.
pub struct Daemon {
    child: Option<Child>,
    /// Every line it printed on stdout and stderr so far.
    pub output: Arc<Mutex<Vec<String>>>,
    /// `http://127.0.0.1:PORT` of its admin endpoint.
    pub admin: String,
    /// What it is, for failure messages (`sidecar`, `operator`).
    what: &'static str,
}

impl Daemon {
    pub fn new(
        what: &'static str,
        child: Child,
        output: Arc<Mutex<Vec<String>>>,
        admin: String,
    ) -> Daemon {
        Daemon {
            child: Some(child),
            output,
            admin,
            what,
        }
    }

    /// Everything it printed so far, one line each.
    pub fn logs(&self) -> String {
        self.output.lock().unwrap().join("\n")
    }

    /// Waits until `GET {admin}{path}` answers 2xx; fails the test with the logs if that does
    /// not happen within `timeout` (a wait for a state, not a timing check).
    pub async fn wait_ready(&self, path: &str, timeout: Duration) {
        let url = format!("{}{path}", self.admin);
        let ready = super::eventually(timeout, async || {
            let r = reqwest::get(&url).await.ok()?;
            r.status().is_success().then_some(())
        })
        .await;
        assert!(
            ready.is_some(),
            "{} never became ready ({url}):\n{}",
            self.what,
            self.logs()
        );
    }

    /// The value of the metric sample line that starts with `sample` (a name, or a name with
    /// labels), from `{admin}/metrics`.
    pub async fn metric(&self, sample: &str) -> Option<f64> {
        let text = reqwest::get(format!("{}/metrics", self.admin))
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines()
            .find(|l| l.starts_with(sample) && l[sample.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    /// SIGKILL: no shutdown code runs. Nothing happens when it is already gone.
    pub fn kill_hard(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill_hard();
    }
}
