//! The Python DPoP client of `tests/interop/dpop_client.py` (joserfc): a key of its own,
//! proofs it makes as RFC 9449 says, MCP requests it sends itself. Driven by one JSON command
//! per line.

use std::process::Stdio;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use super::{RESOURCE, User};

pub struct DpopClient {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    /// The sidecar's `/mcp` URL the client sends to; its proofs name [`RESOURCE`] (`htu`), the
    /// URI clients address, as behind an ingress.
    pub url: String,
    /// The client key's RFC 7638 thumbprint, as joserfc computes it.
    pub jkt: String,
}

/// What the client got back.
#[derive(Debug)]
pub struct DpopReply {
    pub status: u16,
    pub headers: Value,
    pub body: Value,
    /// The last proof it sent.
    pub proof: String,
    /// 2 when it retried with a server nonce.
    pub attempts: u64,
}

impl DpopReply {
    pub fn header(&self, name: &str) -> &str {
        self.headers[name].as_str().unwrap_or_default()
    }

    pub fn result(&self) -> &Value {
        &self.body["result"]
    }
}

impl DpopClient {
    pub async fn start(url: &str) -> Self {
        let mut child = Command::new(super::python::python())
            .arg(super::repo().join("tests/interop/dpop_client.py"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the Python DPoP client");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut client = Self {
            child,
            stdin,
            stdout,
            url: url.to_owned(),
            jkt: String::new(),
        };
        let key = client.command(json!({"op": "key"})).await;
        client.jkt = key["jkt"].as_str().unwrap().to_owned();
        client
    }

    async fn command(&mut self, command: Value) -> Value {
        let mut line = command.to_string();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).await.unwrap();
        let answer = self
            .stdout
            .next_line()
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("the DPoP client exited: {:?}", self.child.try_wait()));
        serde_json::from_str(&answer).unwrap()
    }

    /// A token of `user` bound to this client's key (`cnf.jkt`).
    pub fn token_for(&self, user: &User) -> String {
        let jkt = self.jkt.clone();
        user.token_with(move |claims| claims["cnf"] = json!({"jkt": jkt}))
    }

    /// Sends `method` with `params`, as `DPoP <token>` with a proper proof, amended by `edit`
    /// (fields of the command: `proof` overrides, `scheme`, `replay`, `retry_nonce`).
    pub async fn call_with(
        &mut self,
        token: &str,
        method: &str,
        params: Value,
        edit: impl FnOnce(&mut Value),
    ) -> DpopReply {
        let mut command = json!({
            "op": "call", "url": self.url, "token": token, "method": method,
            "params": params, "proof": {"htu": RESOURCE},
        });
        edit(&mut command);
        let answer = self.command(command).await;
        DpopReply {
            status: answer["status"].as_u64().unwrap() as u16,
            headers: answer["headers"].clone(),
            body: answer["body"].clone(),
            proof: answer["proof"].as_str().unwrap_or_default().to_owned(),
            attempts: answer["attempts"].as_u64().unwrap_or(0),
        }
    }

    pub async fn call(&mut self, token: &str, method: &str, params: Value) -> DpopReply {
        self.call_with(token, method, params, |_| {}).await
    }
}
