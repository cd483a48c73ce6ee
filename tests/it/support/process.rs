//! Child processes: the example MCP server and the sidecar, killed when dropped.

use super::daemon::Daemon;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::Duration;

use tempfile::TempDir;

use super::{fixture, policy_yaml};

/// The directory of this build profile's binaries (`target/<profile>`).
pub fn profile_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_lifeguard"))
        .parent()
        .expect("binary has a directory")
        .to_owned()
}

/// Path of a Cargo example binary of this build profile. The first call in this process builds
/// every example (or confirms them up to date), and later calls wait for that one build: a plain
/// `cargo test` builds examples, `cargo test --test it NAME` does not, and a test must never run
/// a stale example. One build before any use matters: the tests run side by side in one
/// process, and a build re-links a binary another test may be starting at that moment.
pub fn example_binary(name: &str) -> PathBuf {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    if let Err(e) = BUILT.get_or_init(build_examples) {
        panic!("{e}");
    }
    let path = profile_dir()
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.is_file(),
        "{} is missing: build it with `cargo build --example {name}`",
        path.display()
    );
    path
}

fn build_examples() -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .args(["build", "--quiet", "--examples", "--manifest-path"])
        .arg(super::repo().join("Cargo.toml"));
    if profile_dir().file_name().is_some_and(|p| p == "release") {
        command.arg("--release");
    }
    match command.status() {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(format!("cargo build --examples failed: {status}")),
        // No cargo at hand (test binary run directly): use whatever was built before.
        Err(e) => {
            eprintln!("could not run cargo ({e}); using the examples built before");
            Ok(())
        }
    }
}

/// Runs `command` to completion and returns its output. A guard against hangs, not a
/// performance check: after `give_up` the process is killed and the test fails with the
/// output so far.
pub fn run_to_completion(mut command: Command, what: &str, give_up: Duration) -> Output {
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    let (stdout, stdout_reader) = collect_bytes(child.stdout.take().expect("piped stdout"));
    let (stderr, stderr_reader) = collect_bytes(child.stderr.take().expect("piped stderr"));
    let give_up_at = std::time::Instant::now() + give_up;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if std::time::Instant::now() < give_up_at => {
                std::thread::sleep(Duration::from_millis(100));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                let text = |b: &Arc<Mutex<Vec<u8>>>| {
                    String::from_utf8_lossy(&b.lock().unwrap()).into_owned()
                };
                panic!(
                    "{what} did not finish within {give_up:?} (hung?) and was killed; \
                     stdout so far:\n{}\nstderr so far:\n{}",
                    text(&stdout),
                    text(&stderr)
                );
            }
        }
    };
    let _ = stdout_reader.join();
    let _ = stderr_reader.join();
    let take = |b: Arc<Mutex<Vec<u8>>>| std::mem::take(&mut *b.lock().unwrap());
    Output {
        status,
        stdout: take(stdout),
        stderr: take(stderr),
    }
}

/// Copies everything `stream` yields into a shared buffer, on a thread of its own.
fn collect_bytes(
    mut stream: impl Read + Send + 'static,
) -> (Arc<Mutex<Vec<u8>>>, std::thread::JoinHandle<()>) {
    let buffer = Arc::new(Mutex::new(Vec::new()));
    let sink = buffer.clone();
    let reader = std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        while let Ok(n) = stream.read(&mut chunk)
            && n > 0
        {
            sink.lock().unwrap().extend_from_slice(&chunk[..n]);
        }
    });
    (buffer, reader)
}

/// Spawns `command`, collecting its stdout/stderr lines; returns the child and the shared line
/// buffer, plus a receiver that gets every line as it arrives.
pub fn spawn_collecting(
    mut command: Command,
) -> (Child, Arc<Mutex<Vec<String>>>, mpsc::Receiver<String>) {
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().expect("spawn child process");
    let lines = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::channel();
    for stream in [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let lines = lines.clone();
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                let _ = tx.send(line.clone());
                lines.lock().unwrap().push(line);
            }
        });
    }
    (child, lines, rx)
}

/// Waits for a line of the child's output containing `marker` (up to 30 s, or until the
/// child's output ends) and returns what follows the marker; fails with all the output
/// collected otherwise.
pub fn wait_for_line(
    rx: &mpsc::Receiver<String>,
    marker: &str,
    what: &str,
    lines: &Arc<Mutex<Vec<String>>>,
) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(line) => {
                if let Some(pos) = line.find(marker) {
                    return line[pos + marker.len()..].trim().to_owned();
                }
            }
            Err(_) => break,
        }
    }
    panic!(
        "{what} did not print `{marker}`; output:\n{}",
        lines.lock().unwrap().join("\n")
    );
}

pub struct ExampleServer {
    child: Child,
    /// `http://127.0.0.1:PORT/mcp`
    pub url: String,
    /// `http://127.0.0.1:PORT`
    pub base: String,
}

impl ExampleServer {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts the example server with `args` added to its command line.
    pub fn start_with(args: &[&str]) -> Self {
        Self::launch(Command::new(example_binary("example_server")), args)
    }

    /// Starts the example server on the loopback of network namespace `netns` (its URLs are
    /// that namespace's: for a sidecar there, not for the test).
    pub fn start_in(netns: &str) -> Self {
        let binary = example_binary("example_server");
        Self::launch(super::netns::Lab::command(netns, binary), &[])
    }

    fn launch(mut command: Command, args: &[&str]) -> Self {
        command.args(["--listen", "127.0.0.1:0"]).args(args);
        let (child, output, rx) = spawn_collecting(command);
        let url = wait_for_line(&rx, "listening on ", "example server", &output);
        let base = url.trim_end_matches("/mcp").to_owned();
        Self { child, url, base }
    }
}

impl ExampleServer {
    /// A debug endpoint of the example server (`/_example/…`), as JSON.
    pub async fn debug(&self, path: &str) -> serde_json::Value {
        reqwest::get(format!("{}{path}", self.base))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// The requests the server logged (`/_example/requests`) with MCP method `method`, oldest
    /// first.
    pub async fn requests(&self, method: &str) -> Vec<serde_json::Value> {
        self.debug("/_example/requests")
            .await
            .as_array()
            .expect("requests array")
            .iter()
            .filter(|r| r["mcpMethod"] == method)
            .cloned()
            .collect()
    }

    /// The rows `write_rows` wrote whose `field` is `value`.
    pub async fn rows_where(&self, field: &str, value: &str) -> Vec<serde_json::Value> {
        self.debug("/_example/rows")
            .await
            .as_array()
            .expect("rows array")
            .iter()
            .filter(|r| r[field] == value)
            .cloned()
            .collect()
    }

    /// The rows `write_rows` wrote with `label`.
    pub async fn rows_labelled(&self, label: &str) -> Vec<serde_json::Value> {
        self.rows_where("label", label).await
    }

    /// Makes the server emit a notification (`POST /_example/emit`).
    pub async fn emit(&self, event: serde_json::Value) {
        let response = reqwest::Client::new()
            .post(format!("{}/_example/emit", self.base))
            .json(&event)
            .send()
            .await
            .expect("POST /_example/emit");
        assert_eq!(response.status(), 200, "emit {event}");
    }
}

impl Drop for ExampleServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Options of a test sidecar.
#[derive(Clone, Default)]
pub struct SidecarOptions {
    /// YAML appended under `spec:` of the test policy.
    pub spec: String,
    /// Extra documents appended to the policy file.
    pub extra_documents: String,
    /// Fetch the issuer's keys from this URL instead of the fixture JWKS file.
    pub jwks_uri: Option<String>,
    /// `--approver-keys`: the trusted approvers of capability exceptions.
    pub approver_keys: Option<PathBuf>,
    /// More command-line arguments of the sidecar (e.g. its connection limits).
    pub args: Vec<String>,
    /// `--ledger` instead of the SQLite file in the sidecar's directory (e.g. `postgres://…`).
    pub ledger: Option<String>,
    /// Run in a network namespace instead of the test's own, listening there.
    pub place: Option<Place>,
    /// Environment variables of the sidecar (e.g. the `OTEL_*` trace export settings).
    pub env: Vec<(String, String)>,
    /// YAML inserted after the test issuer's `jwksFile` line: more fields of the issuer
    /// (8-space indent), then of `spec.identity` (4-space indent).
    pub identity: String,
}

/// Where a sidecar runs: a network namespace (`support::netns`) and the address it listens on
/// there (its client and admin ports; its `--upstream` must be that namespace's loopback).
#[derive(Clone, Debug)]
pub struct Place {
    pub netns: String,
    pub host: std::net::Ipv4Addr,
}

pub struct Sidecar {
    pub daemon: Daemon,
    pub dir: Arc<TempDir>,
    pub url: String,
    pub admin: String,
    pub policy_path: PathBuf,
    pub ledger_path: PathBuf,
    pub audit_path: PathBuf,
    pub upstream: String,
    /// How it was started, kept for restarts.
    launch: Launch,
}

/// A sidecar's command line beyond the standard arguments, and its environment.
#[derive(Clone, Debug, Default)]
struct Launch {
    /// Where the policy comes from: `--policy FILE`, or the cluster-mode flags.
    source_args: Vec<String>,
    extra_args: Vec<String>,
    env: Vec<(String, String)>,
    /// `--ledger`, when not the SQLite file in the sidecar's directory.
    ledger: Option<String>,
    /// A network namespace to run in, instead of the test's own loopback.
    place: Option<Place>,
}

/// Options of a test sidecar in cluster mode (`--control-plane`).
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// `https://127.0.0.1:PORT` of the (fake) control plane.
    pub control_plane: String,
    /// `--control-plane-ca`, if any.
    pub ca: Option<PathBuf>,
    /// `--token-file`.
    pub token_file: PathBuf,
    pub pod_namespace: String,
    pub pod_name: String,
    /// More command-line arguments.
    pub args: Vec<String>,
    /// Environment variables of the sidecar (e.g. `SSL_CERT_FILE`).
    pub env: Vec<(String, String)>,
}

impl Sidecar {
    pub async fn start(upstream: &str, options: SidecarOptions) -> Self {
        let dir = Arc::new(tempfile::tempdir().unwrap());
        let jwks = dir.path().join("jwks.json");
        std::fs::copy(fixture("keys/issuer-jwks.json"), &jwks).unwrap();
        let policy_path = dir.path().join("policy.yaml");
        let mut text = policy_yaml(&jwks, &options.spec);
        if !options.identity.is_empty() {
            let line = format!("jwksFile: {}\n", jwks.display());
            text = text.replace(&line, &format!("{line}{}", options.identity));
        }
        if let Some(uri) = &options.jwks_uri {
            text = text.replace(
                &format!("jwksFile: {}", jwks.display()),
                &format!("jwksUri: {uri}"),
            );
        }
        if !options.extra_documents.is_empty() {
            text.push_str("---\n");
            text.push_str(&options.extra_documents);
        }
        std::fs::write(&policy_path, text).unwrap();
        let mut extra_args = Vec::new();
        if let Some(keys) = &options.approver_keys {
            extra_args.push("--approver-keys".to_owned());
            extra_args.push(keys.display().to_string());
        }
        extra_args.extend(options.args.iter().cloned());
        let launch = Launch {
            source_args: policy_args(&policy_path),
            extra_args,
            ledger: options.ledger.clone(),
            place: options.place.clone(),
            env: options.env.clone(),
        };
        let sidecar = Self::spawn(dir, policy_path, upstream, launch);
        sidecar.wait_ready().await;
        sidecar
    }

    /// Starts a sidecar in cluster mode on a fresh directory. Returns once it listens: it is not
    /// ready before its first snapshot, so this does not wait for that.
    pub fn start_cluster(upstream: &str, options: ClusterOptions) -> Self {
        Self::start_cluster_at(upstream, options, None)
    }

    /// [`Sidecar::start_cluster`] in `place` (a network namespace) when given.
    pub fn start_cluster_at(upstream: &str, options: ClusterOptions, place: Option<Place>) -> Self {
        let dir = Arc::new(tempfile::tempdir().unwrap());
        let policy_path = dir.path().join("no-policy-file-in-cluster-mode");
        let mut source_args = vec!["--control-plane".to_owned(), options.control_plane];
        if let Some(ca) = &options.ca {
            source_args.push("--control-plane-ca".to_owned());
            source_args.push(ca.display().to_string());
        }
        source_args.extend([
            "--token-file".to_owned(),
            options.token_file.display().to_string(),
            "--pod-namespace".to_owned(),
            options.pod_namespace,
            "--pod-name".to_owned(),
            options.pod_name,
        ]);
        let launch = Launch {
            source_args,
            extra_args: options.args,
            env: options.env,
            ledger: None,
            place,
        };
        Self::spawn(dir, policy_path, upstream, launch)
    }

    fn spawn(dir: Arc<TempDir>, policy_path: PathBuf, upstream: &str, launch: Launch) -> Self {
        let ledger_path = dir.path().join("ledger.db");
        let audit_path = dir.path().join("audit.jsonl");
        let binary = env!("CARGO_BIN_EXE_lifeguard");
        let (mut command, host) = match &launch.place {
            Some(place) => (
                super::netns::Lab::command(&place.netns, binary),
                place.host.to_string(),
            ),
            None => (Command::new(binary), "127.0.0.1".to_owned()),
        };
        let listen = format!("{host}:0");
        command
            .arg("sidecar")
            .args(&launch.source_args)
            .args([
                "--upstream",
                upstream,
                "--listen",
                &listen,
                "--admin",
                &listen,
            ])
            .arg("--ledger")
            .arg(match &launch.ledger {
                Some(location) => location.clone(),
                None => ledger_path.display().to_string(),
            })
            .arg("--audit-file")
            .arg(&audit_path)
            .args(&launch.extra_args)
            .envs(launch.env.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "info");
        let (child, output, rx) = spawn_collecting(command);
        let url = wait_for_line(&rx, "listening on ", "sidecar", &output);
        let admin = wait_for_line(&rx, "admin on ", "sidecar", &output);
        Self {
            daemon: Daemon::new("sidecar", child, output, admin.clone()),
            dir,
            url,
            admin,
            policy_path,
            ledger_path,
            audit_path,
            upstream: upstream.to_owned(),
            launch,
        }
    }

    pub async fn wait_ready(&self) {
        self.daemon
            .wait_ready("/ready", Duration::from_secs(15))
            .await;
    }

    pub fn logs(&self) -> String {
        self.daemon.logs()
    }

    pub fn audit(&self) -> Vec<serde_json::Value> {
        super::audit_events(&self.audit_path)
    }

    /// The first audit event matching `matches`, waiting up to 3 s for it: the sidecar writes
    /// audit lines asynchronously, so one may land just after the answer that caused it.
    pub async fn audit_event(
        &self,
        matches: impl Fn(&serde_json::Value) -> bool,
    ) -> Option<serde_json::Value> {
        super::eventually(Duration::from_secs(3), async || {
            self.audit().into_iter().find(|e| matches(e))
        })
        .await
    }

    /// The audit events matching `matches` once at least `count` were written (or after 3 s).
    pub async fn audit_events_when(
        &self,
        count: usize,
        matches: impl Fn(&serde_json::Value) -> bool,
    ) -> Vec<serde_json::Value> {
        let found = || -> Vec<serde_json::Value> {
            self.audit().into_iter().filter(|e| matches(e)).collect()
        };
        super::eventually(Duration::from_secs(3), async || {
            let events = found();
            (events.len() >= count).then_some(events)
        })
        .await
        .unwrap_or_else(found)
    }

    /// SIGKILL: no shutdown code runs.
    pub fn kill_hard(&mut self) {
        self.daemon.kill_hard();
    }

    /// Kills this sidecar hard and starts a new one on the same ledger and policy source,
    /// waiting until it is ready.
    pub async fn restart_after_kill(self) -> Self {
        let sidecar = self.respawn_after_kill();
        sidecar.wait_ready().await;
        sidecar
    }

    /// Kills this sidecar hard and starts a new one on the same ledger and policy source;
    /// returns once it listens.
    pub fn respawn_after_kill(mut self) -> Self {
        self.kill_hard();
        let dir = self.dir.clone();
        let policy = self.policy_path.clone();
        let upstream = self.upstream.clone();
        let launch = std::mem::take(&mut self.launch);
        Self::spawn(dir, policy, &upstream, launch)
    }

    /// `GET /ready` of the admin port: status and body.
    pub async fn ready(&self) -> (u16, String) {
        let response = reqwest::get(format!("{}/ready", self.admin))
            .await
            .expect("GET /ready");
        let status = response.status().as_u16();
        (status, response.text().await.unwrap_or_default())
    }

    pub fn policy_file(&self) -> &Path {
        &self.policy_path
    }
}

/// `--policy FILE`.
fn policy_args(policy_path: &Path) -> Vec<String> {
    vec!["--policy".to_owned(), policy_path.display().to_string()]
}
