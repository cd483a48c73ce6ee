//! Python-based protocol peers (FastMCP with the Tasks extension), installed by
//! `scripts/test.sh` into `target/interop-venv` from the pinned `tests/interop/requirements.txt`.

use std::path::PathBuf;
use std::process::{Child, Command};

use super::process::{spawn_collecting, wait_for_line};

/// The interpreter of the interop virtualenv. Missing is a test failure, never a skip: the
/// interop tests are part of the suite.
pub fn python() -> PathBuf {
    let path = std::env::var_os("LIFEGUARD_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| super::repo().join("target/interop-venv/bin/python"));
    assert!(
        path.exists(),
        "{} is missing: run scripts/test.sh, which installs the Python interop peers \
         (tests/interop/requirements.txt) into target/interop-venv",
        path.display()
    );
    path
}

/// A FastMCP server of `tests/interop/` (by default `fastmcp_server.py`). It binds port 0 itself
/// and prints the URL it listens on, so no other process can take the port in between.
pub struct FastMcpServer {
    child: Child,
    pub url: String,
}

impl FastMcpServer {
    pub async fn start() -> Self {
        Self::start_script("fastmcp_server.py").await
    }

    /// Starts `tests/interop/{script}`, which must print `listening on URL` once it serves.
    pub async fn start_script(script: &str) -> Self {
        let mut command = Command::new(python());
        command.arg(super::repo().join("tests/interop").join(script));
        let (child, output, rx) = spawn_collecting(command);
        let url = wait_for_line(&rx, "listening on ", "the FastMCP server", &output);
        Self { child, url }
    }
}

impl Drop for FastMcpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `tests/interop/fastmcp_client.py URL TOKEN`; returns (success, stdout lines as JSON,
/// stderr).
pub async fn run_fastmcp_client(url: &str, token: &str) -> (bool, Vec<serde_json::Value>, String) {
    run_fastmcp_script("fastmcp_client.py", url, token).await
}

/// Runs `tests/interop/<script>` with `URL TOKEN`, as [`run_fastmcp_client`]: whether it
/// succeeded, the JSON lines it printed, its stderr.
pub async fn run_fastmcp_script(
    script: &str,
    url: &str,
    token: &str,
) -> (bool, Vec<serde_json::Value>, String) {
    let output = tokio::process::Command::new(python())
        .arg(super::repo().join("tests/interop").join(script))
        .arg(url)
        .arg(token)
        .output()
        .await
        .expect("run the FastMCP client");
    let lines = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    (
        output.status.success(),
        lines,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}
