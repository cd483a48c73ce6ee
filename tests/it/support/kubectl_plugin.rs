//! Helpers of the kubectl plugin tests: the plugin installed under its name, runs of it,
//! objects and statuses written as the operator would, and an emulator without the CRDs.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::support::kube::KubeEmulator;
use crate::support::{ISSUER, repo};
use kube::api::{Api, ListParams, Patch, PatchParams};
use lifeguard::api::PrincipalRevocation;
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

pub const WAIT: Duration = Duration::from_secs(60);

/// `kubectl-lifeguard` in a directory of its own, and an empty HOME (no ~/.kube/config).
pub struct Plugin {
    pub dir: TempDir,
    pub path: PathBuf,
}

/// What a finished run printed.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Plugin {
    pub fn install() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubectl-lifeguard");
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_lifeguard"), &path).unwrap();
        std::fs::create_dir(dir.path().join("home")).unwrap();
        Self { dir, path }
    }

    /// The plugin with `args`, `$KUBECONFIG` set to `kubeconfig` (unset for `None`).
    pub fn command(&self, kubeconfig: Option<&Path>, args: &[&str]) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.path);
        command
            .args(args)
            .env_remove("KUBECONFIG")
            .env("HOME", self.dir.path().join("home"))
            .env_remove("KUBERNETES_SERVICE_HOST")
            .kill_on_drop(true);
        if let Some(kubeconfig) = kubeconfig {
            command.env("KUBECONFIG", kubeconfig);
        }
        command
    }

    pub async fn run(&self, kubeconfig: Option<&Path>, args: &[&str]) -> Run {
        let output = self.command(kubeconfig, args).output().await.unwrap();
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

/// The line of `text` that holds every one of `cells` (a table row).
pub fn row<'a>(text: &'a str, cells: &[&str]) -> Option<&'a str> {
    text.lines().find(|line| {
        cells
            .iter()
            .all(|c| line.split_whitespace().any(|w| w == *c))
    })
}

/// The name in `principalrevocation.lifeguard.dev/NAME created|already exists`.
pub fn revocation_name(stdout: &str) -> String {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("principalrevocation.lifeguard.dev/"))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no object named in:\n{stdout}"))
        .to_owned()
}

pub fn condition(type_: &str, ok: bool, reason: &str, message: &str) -> Value {
    json!({
        "type": type_, "status": if ok { "True" } else { "False" }, "reason": reason,
        "message": message, "observedGeneration": 1,
        "lastTransitionTime": jiff::Timestamp::now().to_string(),
    })
}

pub async fn revocations(emulator: &KubeEmulator) -> Vec<PrincipalRevocation> {
    Api::<PrincipalRevocation>::all(emulator.client().await)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
}

/// Writes `status` to a PrincipalRevocation, as the operator does.
pub async fn patch_revocation_status(emulator: &KubeEmulator, name: &str, status: Value) {
    Api::<PrincipalRevocation>::all(emulator.client().await)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .unwrap_or_else(|e| panic!("patch status of {name}: {e}"));
}

pub fn propagating(acknowledged: i32, target: i32) -> Value {
    let message = format!("{acknowledged} of {target} targeted sidecars applied it");
    json!({
        "observedGeneration": 1, "targetSidecars": target, "acknowledgedSidecars": acknowledged,
        "tasksCancelled": acknowledged, "streamsClosed": 0,
        "conditions": [condition("Ready", false, "Propagating", &message),
                       condition("Propagated", false, "Propagating", &message)],
    })
}

pub fn propagated(target: i32) -> Value {
    let message = format!("{target} of {target} targeted sidecars applied it");
    json!({
        "observedGeneration": 1, "targetSidecars": target, "acknowledgedSidecars": target,
        "tasksCancelled": target, "streamsClosed": 1, "propagationMillis": 150,
        "completedAt": jiff::Timestamp::now().to_string(),
        "conditions": [condition("Ready", true, "Applied", &message),
                       condition("Propagated", true, "Applied", &message)],
    })
}

pub fn policy(namespace: &str, name: &str) -> String {
    format!(
        r#"apiVersion: lifeguard.dev/v1alpha1
kind: McpServerPolicy
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  selector: {{matchLabels: {{app: {name}}}}}
  resource: http://127.0.0.1/mcp
  identity:
    issuers:
      - issuer: {issuer}
        jwksUri: http://127.0.0.1:9/jwks
"#,
        issuer = ISSUER
    )
}

pub fn exception(name: &str, expires_in: jiff::SignedDuration) -> String {
    let now = jiff::Timestamp::now();
    format!(
        r#"apiVersion: lifeguard.dev/v1alpha1
kind: CapabilityException
metadata: {{name: {name}, namespace: team-a}}
spec:
  policyRef: {{name: reports}}
  capability: sampling
  clients: [console]
  purpose: summaries
  modelRoute: gateway/summaries
  limits: {{maxTokens: 100, maxIterationsPerTask: 1, maxRequestsPerMinute: 10}}
  notBefore: "{}"
  expiresAt: "{}"
  approvalId: CHG-1
  signature: x..y
"#,
        now - jiff::SignedDuration::from_hours(48),
        now + expires_in
    )
}

pub fn manual_revocation(name: &str, subject: &str) -> String {
    format!(
        r#"apiVersion: lifeguard.dev/v1alpha1
kind: PrincipalRevocation
metadata: {{name: {name}}}
spec:
  issuer: {}
  subject: {subject}
  revokedBefore: "{}"
  reason: sessionRevoked
  source: {{kind: manual}}
"#,
        ISSUER,
        jiff::Timestamp::now()
    )
}

/// A kubeconfig whose current context points at a closed port and whose `emulator` context
/// (namespace `team-a`) points at the emulator.
pub fn two_context_kubeconfig(emulator: &KubeEmulator, dir: &Path) -> PathBuf {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1
kind: Config
clusters:
  - {{name: dead, cluster: {{server: \"{dead}\"}}}}
  - {{name: emulator, cluster: {{server: \"{}\"}}}}
users:
  - {{name: someone, user: {{token: t}}}}
contexts:
  - {{name: broken, context: {{cluster: dead, user: someone}}}}
  - {{name: emulator, context: {{cluster: emulator, user: someone, namespace: team-a}}}}
current-context: broken
",
            emulator.url()
        ),
    )
    .unwrap();
    path
}

/// An emulator serving no Lifeguard CRDs: its URL, and the process (killed on drop).
pub async fn emulator_without_crds(dir: &Path) -> (String, tokio::process::Child) {
    let crds = dir.join("no-crds");
    std::fs::create_dir(&crds).unwrap();
    let python = std::env::var_os("LIFEGUARD_TEST_PYTHON")
        .expect("LIFEGUARD_TEST_PYTHON names the emulator's Python (see tests/it/support/kube.rs)");
    let mut child = tokio::process::Command::new(python)
        .arg(repo().join("tests/kube_emulator/emulator.py"))
        .args(["--port", "0", "--crds"])
        .arg(&crds)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = tokio::time::timeout(WAIT, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(url) = line.strip_prefix("listening on ") {
                return url.trim().to_owned();
            }
        }
        panic!("the emulator exited before listening");
    })
    .await
    .expect("the emulator listens");
    (url, child)
}

/// Runs `revoke --wait` and hands over its stdout line by line.
pub struct Waiting {
    child: tokio::process::Child,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
    seen: Vec<String>,
}

impl Waiting {
    pub fn start(plugin: &Plugin, kubeconfig: &Path, args: &[&str]) -> Self {
        let mut child = plugin
            .command(Some(kubeconfig), args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        let mut reader = BufReader::new(child.stdout.take().unwrap()).lines();
        tokio::spawn(async move {
            while let Ok(Some(line)) = reader.next_line().await {
                let _ = tx.send(line);
            }
        });
        Self {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a line containing `text`; returns it.
    pub async fn line(&mut self, text: &str) -> String {
        let found = tokio::time::timeout(WAIT, async {
            while let Some(line) = self.lines.recv().await {
                self.seen.push(line.clone());
                if line.contains(text) {
                    return Some(line);
                }
            }
            None
        })
        .await;
        found
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("no line with {text:?}; saw:\n{}", self.seen.join("\n")))
    }

    /// The exit code and stderr.
    pub async fn finish(mut self) -> (i32, String) {
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("revoke --wait ends")
            .unwrap();
        let mut stderr = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .await
            .unwrap();
        (status.code().unwrap_or(-1), stderr)
    }
}
