//! The example object authorizer (`examples/example_authorizer`) as a test peer: a real HTTP
//! decision point whose grants file a test rewrites to grant or revoke access mid-run.

use std::path::PathBuf;
use std::process::{Child, Command};

use serde_json::Value;
use tempfile::TempDir;

use super::process::{example_binary, spawn_collecting, wait_for_line};

pub struct Authorizer {
    child: Option<Child>,
    _dir: TempDir,
    grants: PathBuf,
    /// `http://127.0.0.1:PORT/access/v1/evaluation`
    pub url: String,
    /// `http://127.0.0.1:PORT`
    pub base: String,
}

impl Authorizer {
    /// Starts the authorizer with `grants` (YAML, the file's whole content).
    pub fn start(grants: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("grants.yaml");
        std::fs::write(&path, grants).unwrap();
        let mut command = Command::new(example_binary("example_authorizer"));
        command
            .args(["--listen", "127.0.0.1:0", "--grants"])
            .arg(&path);
        let (child, output, rx) = spawn_collecting(command);
        let url = wait_for_line(&rx, "listening on ", "example authorizer", &output);
        let base = url.trim_end_matches("/access/v1/evaluation").to_owned();
        Self {
            child: Some(child),
            _dir: dir,
            grants: path,
            url,
            base,
        }
    }

    /// Replaces the grants (atomically: the authorizer never reads half a file).
    pub fn set_grants(&self, grants: &str) {
        let next = self.grants.with_extension("next");
        std::fs::write(&next, grants).unwrap();
        std::fs::rename(&next, &self.grants).unwrap();
    }

    /// Every decision made so far: `{question, decision, request}`, oldest first.
    pub async fn decisions(&self) -> Vec<Value> {
        reqwest::get(format!("{}/_authorizer/decisions", self.base))
            .await
            .expect("GET /_authorizer/decisions")
            .json()
            .await
            .expect("decisions JSON")
    }

    /// The actions asked about, in order.
    pub async fn actions(&self) -> Vec<String> {
        self.decisions()
            .await
            .iter()
            .map(|d| {
                d["question"]["action"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect()
    }

    /// Stops the authorizer: from now on no decision can be had.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Authorizer {
    fn drop(&mut self) {
        self.stop();
    }
}
