//! The real `lifeguard operator` against the API emulator, a test CA for its serving
//! certificate, and light sidecars: in-process clients of the distribution endpoint that
//! authenticate and acknowledge like a real sidecar (for tests about the operator alone).

use super::daemon::Daemon;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tempfile::TempDir;

use super::kube::{KubeEmulator, TokenIdentity};
use super::process::{spawn_collecting, wait_for_line};

/// A CA and a serving certificate for 127.0.0.1 / localhost it signed.
pub struct TestCa {
    pub ca_pem: String,
    pub ca_path: PathBuf,
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
}

impl TestCa {
    pub fn new(dir: &std::path::Path) -> Self {
        Self::for_ips(dir, &[])
    }

    /// [`TestCa::new`] whose serving certificate is also valid for `ips` (addresses of a
    /// `support::netns` network).
    pub fn for_ips(dir: &std::path::Path, ips: &[std::net::Ipv4Addr]) -> Self {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "lifeguard test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let leaf_key = KeyPair::generate().unwrap();
        let mut leaf_params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        leaf_params
            .subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
        for ip in ips {
            leaf_params
                .subject_alt_names
                .push(SanType::IpAddress((*ip).into()));
        }
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();
        let ca_path = dir.join("ca.crt");
        let cert_path = dir.join("tls.crt");
        let key_path = dir.join("tls.key");
        std::fs::write(&ca_path, ca.pem()).unwrap();
        std::fs::write(&cert_path, leaf.pem()).unwrap();
        std::fs::write(&key_path, leaf_key.serialize_pem()).unwrap();
        Self {
            ca_pem: ca.pem(),
            ca_path,
            cert_path,
            key_path,
        }
    }

    /// A TLS server configuration presenting the serving certificate (for a test's own HTTPS
    /// endpoints that clients trusting this CA must reach).
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let chain = CertificateDer::pem_file_iter(&self.cert_path)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(&self.key_path).unwrap();
        let mut config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Arc::new(config)
    }

    /// An HTTPS client that trusts this CA.
    pub fn client(&self) -> reqwest::Client {
        reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(self.ca_pem.as_bytes()).unwrap())
            .build()
            .unwrap()
    }
}

/// A free loopback port (so a restarted operator can listen where sidecars dial), below the
/// kernel's ephemeral range: a port bound with port 0 comes from that range, and while a test
/// has the operator down, any outgoing connection of the suite could be given it, so the
/// restart could not bind it again.
pub fn free_port() -> SocketAddr {
    // The ports below Linux's default ephemeral range (32768–60999) and above the usual
    // services', tried from a point that differs between test processes and calls.
    const LOW: u16 = 20_000;
    const HIGH: u16 = 32_767;
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let span = u32::from(HIGH - LOW) + 1;
    let start = std::process::id().wrapping_mul(7919) % span;
    for _ in 0..span {
        let offset =
            (start + u32::from(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))) % span;
        let port = LOW + offset as u16;
        if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            return listener.local_addr().unwrap();
        }
    }
    panic!("no free loopback port in {LOW}–{HIGH}");
}

/// A running operator, killed when dropped.
pub struct Operator {
    pub daemon: Daemon,
    pub dir: Arc<TempDir>,
    pub ca: Arc<TestCa>,
    /// `https://127.0.0.1:PORT`
    pub url: String,
    pub listen: SocketAddr,
    /// `http://127.0.0.1:PORT` of /healthz, /readyz, /metrics.
    pub admin: String,
    kubeconfig: PathBuf,
    config: Option<PathBuf>,
    /// Extra command-line flags (kept across restarts).
    args: Vec<String>,
    /// Its environment beyond the harness's (e.g. the `OTEL_*` trace settings).
    env: Vec<(String, String)>,
}

/// Starts `lifeguard <subcommand>` (`operator` or `webhook`: they take the same flags) with its
/// output collected, `extra` flags (e.g. the listener's limits) and `env` (e.g. the `OTEL_*`
/// trace settings); the caller waits for what it needs.
#[allow(clippy::too_many_arguments)]
pub fn spawn_component_with(
    subcommand: &str,
    kubeconfig: &std::path::Path,
    namespace: &str,
    listen: SocketAddr,
    (cert, key): (&std::path::Path, &std::path::Path),
    config: Option<&std::path::Path>,
    extra: &[String],
    env: &[(String, String)],
) -> (
    Child,
    Arc<Mutex<Vec<String>>>,
    std::sync::mpsc::Receiver<String>,
) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lifeguard"));
    command
        .arg(subcommand)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--namespace", namespace])
        .args(["--listen", &listen.to_string()])
        .args(["--admin", "127.0.0.1:0"])
        .arg("--tls-cert")
        .arg(cert)
        .arg("--tls-key")
        .arg(key)
        .env("RUST_LOG", "info,kube=warn");
    if let Some(path) = config {
        command.arg("--config").arg(path);
    }
    command.args(extra);
    command.envs(env.iter().map(|(k, v)| (k, v)));
    spawn_collecting(command)
}

/// Namespace the tests run the operator in.
pub const OPERATOR_NAMESPACE: &str = "lifeguard-system";

impl Operator {
    /// Starts an operator against `emulator` with `config` as its `--config` file (if any).
    pub async fn start(emulator: &KubeEmulator, config: Option<&str>) -> Self {
        Self::start_with_args(emulator, config, &[]).await
    }

    /// [`Operator::start`] with extra command-line flags.
    pub async fn start_with_args(
        emulator: &KubeEmulator,
        config: Option<&str>,
        args: &[&str],
    ) -> Self {
        Self::start_with_env(emulator, config, args, &[]).await
    }

    /// [`Operator::start_with_args`] with environment variables (e.g. the `OTEL_*` settings).
    pub async fn start_with_env(
        emulator: &KubeEmulator,
        config: Option<&str>,
        args: &[&str],
        env: &[(String, String)],
    ) -> Self {
        let dir = Arc::new(tempfile::tempdir().unwrap());
        let ca = Arc::new(TestCa::new(dir.path()));
        let config = config.map(|text| {
            let path = dir.path().join("operator.yaml");
            std::fs::write(&path, text).unwrap();
            path
        });
        Self::launch(
            dir,
            ca,
            free_port(),
            emulator.kubeconfig_path().to_owned(),
            config,
            args.iter().map(|a| (*a).to_owned()).collect(),
            env.to_vec(),
        )
        .await
    }

    /// An operator whose distribution endpoint listens on `ip` (an address of a
    /// `support::netns` network, so a test can cut the sidecars off from it), its certificate
    /// valid for `ip` and for `also` (e.g. where the test serves a JWKS over this CA).
    pub async fn start_on(
        emulator: &KubeEmulator,
        config: Option<&str>,
        ip: std::net::Ipv4Addr,
        also: &[std::net::Ipv4Addr],
    ) -> Self {
        let dir = Arc::new(tempfile::tempdir().unwrap());
        let ca = Arc::new(TestCa::for_ips(dir.path(), &[&[ip][..], also].concat()));
        let config = config.map(|text| {
            let path = dir.path().join("operator.yaml");
            std::fs::write(&path, text).unwrap();
            path
        });
        let listen = std::net::TcpListener::bind((ip, 0))
            .unwrap()
            .local_addr()
            .unwrap();
        let kubeconfig = emulator.kubeconfig_path().to_owned();
        Self::launch(dir, ca, listen, kubeconfig, config, Vec::new(), Vec::new()).await
    }

    async fn launch(
        dir: Arc<TempDir>,
        ca: Arc<TestCa>,
        listen: SocketAddr,
        kubeconfig: PathBuf,
        config: Option<PathBuf>,
        args: Vec<String>,
        env: Vec<(String, String)>,
    ) -> Self {
        let (child, output, rx) = spawn_component_with(
            "operator",
            &kubeconfig,
            OPERATOR_NAMESPACE,
            listen,
            (&ca.cert_path, &ca.key_path),
            config.as_deref(),
            &args,
            &env,
        );
        let admin = wait_for_line(&rx, "admin on ", "operator", &output);
        let operator = Self {
            daemon: Daemon::new("operator", child, output, admin.clone()),
            dir,
            ca,
            url: format!("https://{listen}"),
            listen,
            admin,
            kubeconfig,
            config,
            args,
            env,
        };
        operator.wait_ready().await;
        operator
    }

    /// Waits until /readyz answers 200.
    pub async fn wait_ready(&self) {
        self.daemon
            .wait_ready("/readyz", Duration::from_secs(30))
            .await;
    }

    pub fn logs(&self) -> String {
        self.daemon.logs()
    }

    /// The value of a metric sample line starting with `sample` (e.g.
    /// `lifeguard_operator_leader`).
    pub async fn metric(&self, sample: &str) -> Option<f64> {
        self.daemon.metric(sample).await
    }

    /// `kill -9`.
    pub fn kill_hard(&mut self) {
        self.daemon.kill_hard();
    }

    /// Starts a new process (after killing this one if it runs) on the same port,
    /// certificate and configuration.
    pub async fn restart(&mut self) {
        self.kill_hard();
        let (dir, ca, listen) = (self.dir.clone(), self.ca.clone(), self.listen);
        let (kubeconfig, config) = (self.kubeconfig.clone(), self.config.clone());
        let (args, env) = (self.args.clone(), self.env.clone());
        *self = Self::launch(dir, ca, listen, kubeconfig, config, args, env).await;
    }
}

/// A pod in the emulator with a token the emulator's TokenReview accepts for it.
pub struct TestPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub token: String,
}

impl TestPod {
    /// Creates pod `name` in `namespace` with `labels`, run by service account `sa`, and a
    /// token bound to it for audience `lifeguard`.
    pub async fn create(
        emulator: &KubeEmulator,
        namespace: &str,
        name: &str,
        labels: &[(&str, &str)],
        sa: &str,
    ) -> Self {
        let uid = emulator.create_pod(namespace, name, labels, sa).await;
        let token = format!("token-{namespace}-{name}-{uid}");
        emulator
            .add_token(
                &token,
                TokenIdentity::service_account(namespace, sa, name, &uid, &["lifeguard"]),
            )
            .await;
        Self {
            namespace: namespace.into(),
            name: name.into(),
            uid,
            token,
        }
    }
}

/// What a light sidecar saw.
#[derive(Default)]
pub struct Seen {
    pub snapshots: Vec<Value>,
    /// HTTP statuses of refused stream requests.
    pub refusals: Vec<u16>,
    pub acks: Vec<u16>,
}

/// A minimal sidecar: dials the stream, records snapshots, acknowledges each one (reporting
/// `tasks_per_revocation` cancelled tasks for every revocation it carries).
pub struct LightSidecar {
    pub seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl LightSidecar {
    pub fn connect(
        operator: &Operator,
        pod: &TestPod,
        claimed: (&str, &str),
        tasks_per_revocation: u64,
    ) -> Self {
        Self::spawn(operator, pod, claimed, Some(tasks_per_revocation))
    }

    /// A sidecar that acknowledges its policy but never reports applying a revocation (one
    /// that is stuck), so revocations targeting it stay pending.
    pub fn connect_never_revoking(
        operator: &Operator,
        pod: &TestPod,
        claimed: (&str, &str),
    ) -> Self {
        Self::spawn(operator, pod, claimed, None)
    }

    fn spawn(
        operator: &Operator,
        pod: &TestPod,
        claimed: (&str, &str),
        tasks_per_revocation: Option<u64>,
    ) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let client = operator.ca.client();
        let url = format!(
            "{}/distribution/v1/stream?podNamespace={}&podName={}",
            operator.url, claimed.0, claimed.1
        );
        let ack_url = format!("{}/distribution/v1/ack", operator.url);
        let token = pod.token.clone();
        let record = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let response = client.get(&url).bearer_auth(&token).send().await;
                let Ok(response) = response else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                if !response.status().is_success() {
                    record
                        .lock()
                        .unwrap()
                        .refusals
                        .push(response.status().as_u16());
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                let mut response = response;
                let mut buffer = Vec::new();
                while let Ok(Some(chunk)) = response.chunk().await {
                    buffer.extend_from_slice(&chunk);
                    while let Some(pos) = buffer.iter().position(|b| *b == b'\n') {
                        let line: Vec<u8> = buffer.drain(..=pos).collect();
                        let Ok(message) = serde_json::from_slice::<Value>(&line) else {
                            continue;
                        };
                        if message["type"] != "snapshot" {
                            continue;
                        }
                        let revocations: Vec<Value> = match tasks_per_revocation {
                            Some(tasks) => message["policy"]["revocations"]
                                .as_array()
                                .cloned()
                                .unwrap_or_default()
                                .iter()
                                .map(|r| {
                                    json!({"name": r["name"], "tasksCancelled": tasks, "streamsClosed": 0})
                                })
                                .collect(),
                            None => Vec::new(),
                        };
                        let hash = message["policy"]
                            .as_object()
                            .map(|_| policy_hash(&message["policy"]));
                        let ack = json!({
                            "session": message["session"], "version": message["version"],
                            "policyHash": hash, "revocations": revocations,
                        });
                        record.lock().unwrap().snapshots.push(message);
                        let status = client
                            .post(&ack_url)
                            .bearer_auth(&token)
                            .json(&ack)
                            .send()
                            .await
                            .map(|r| r.status().as_u16())
                            .unwrap_or(0);
                        record.lock().unwrap().acks.push(status);
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Self { seen, task }
    }

    /// The last snapshot received.
    pub fn last(&self) -> Option<Value> {
        self.seen.lock().unwrap().snapshots.last().cloned()
    }
}

impl Drop for LightSidecar {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The hash a sidecar computes for a snapshot's policy (the same function the real one uses).
pub fn policy_hash(policy: &Value) -> String {
    let effective: lifeguard::policy::EffectivePolicy =
        serde_json::from_value(policy.clone()).expect("snapshot policy parses");
    effective.hash()
}

/// A sampling CapabilityException `namespace/name` for `policy`, signed with the test approver
/// key (`tests/fixtures/keys/issuer-ed25519.pem`, kid `test-ed-1`), as YAML-compatible JSON.
pub fn signed_exception(
    namespace: &str,
    name: &str,
    policy: &str,
    not_before: jiff::Timestamp,
    expires: jiff::Timestamp,
) -> String {
    let mut exception: lifeguard::api::CapabilityException = serde_json::from_value(json!({
        "apiVersion": "lifeguard.dev/v1alpha1", "kind": "CapabilityException",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "policyRef": {"name": policy}, "capability": "sampling", "clients": ["console"],
            "purpose": "summaries", "modelRoute": "gateway/summaries",
            "limits": {"maxTokens": 500, "maxIterationsPerTask": 2, "maxRequestsPerMinute": 10},
            "notBefore": not_before.to_string(), "expiresAt": expires.to_string(),
            "approvalId": "CHG-1", "signature": "placeholder"
        }
    }))
    .unwrap();
    let key = std::fs::read(super::fixture("keys/issuer-ed25519.pem")).unwrap();
    exception.spec.signature =
        lifeguard::exception::sign(&exception.spec, namespace, &key, "test-ed-1").unwrap();
    serde_json::to_string(&exception).unwrap()
}
