//! Python-based protocol peers (FastMCP with the Tasks extension), installed by
//! `scripts/test.sh` into `target/interop-venv` from the pinned `tests/interop/requirements.txt`.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

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

/// A free loopback port (bound and released; the peer binds it right after).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// The FastMCP server of `tests/interop/fastmcp_server.py`.
pub struct FastMcpServer {
    child: Child,
    pub url: String,
}

impl FastMcpServer {
    pub async fn start() -> Self {
        let port = free_port();
        let child = Command::new(python())
            .arg(super::repo().join("tests/interop/fastmcp_server.py"))
            .arg(port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the FastMCP server");
        let server = Self {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        };
        let up = super::eventually(Duration::from_secs(30), async || {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .ok()
                .map(|_| ())
        })
        .await;
        assert!(
            up.is_some(),
            "the FastMCP server did not start on port {port}"
        );
        server
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
    let output = tokio::process::Command::new(python())
        .arg(super::repo().join("tests/interop/fastmcp_client.py"))
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
