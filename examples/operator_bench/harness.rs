//! What the control-plane benchmarks share (this one and `examples/admission_bench`, which
//! includes this file): the Kubernetes API emulator (tests/kube_emulator, Python kmock) and a
//! JSON client for it, a CA that signs a serving certificate for loopback, and a reader of
//! Prometheus text.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::bench_support::procs::{Proc, Quote};

/// Plain JSON over HTTP against the emulator (it needs no credentials).
#[derive(Clone)]
pub struct Api {
    http: reqwest::Client,
    pub base: String,
}

impl Api {
    async fn send(&self, request: reqwest::RequestBuilder, what: &str) -> Result<Value> {
        let response = request.send().await.with_context(|| what.to_owned())?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        if !status.is_success() {
            bail!("{what}: HTTP {status}: {text}");
        }
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    pub async fn post(&self, path: &str, body: &Value) -> Result<Value> {
        let request = self.http.post(format!("{}{path}", self.base)).json(body);
        self.send(request, &format!("POST {path}")).await
    }

    pub async fn merge_patch(&self, path: &str, body: &Value) -> Result<Value> {
        let request = self
            .http
            .patch(format!("{}{path}", self.base))
            .header("content-type", "application/merge-patch+json")
            .body(body.to_string());
        self.send(request, &format!("PATCH {path}")).await
    }

    /// Deletes; an absent object is fine.
    pub async fn delete(&self, path: &str) -> Result<()> {
        let response = self
            .http
            .delete(format!("{}{path}", self.base))
            .send()
            .await
            .with_context(|| format!("DELETE {path}"))?;
        let status = response.status();
        if !status.is_success() && status != reqwest::StatusCode::NOT_FOUND {
            bail!("DELETE {path}: HTTP {status}");
        }
        Ok(())
    }

    pub async fn get(&self, path: &str) -> Result<Value> {
        let request = self.http.get(format!("{}{path}", self.base));
        self.send(request, &format!("GET {path}")).await
    }
}

/// The Python interpreter with the emulator's packages.
fn emulator_python(repo: &Path) -> Result<PathBuf> {
    let path = std::env::var_os("LIFEGUARD_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join("target/interop-venv/bin/python"));
    if !path.exists() {
        bail!(
            "no Python for the Kubernetes API emulator at {} (LIFEGUARD_TEST_PYTHON, else \
             target/interop-venv/bin/python). Build the venv as scripts/test.sh does:\n  \
             python3 -m venv target/interop-venv && target/interop-venv/bin/pip install -r \
             tests/interop/requirements.txt",
            path.display()
        );
    }
    Ok(path)
}

/// The running emulator and a kubeconfig for it.
pub struct Emulator {
    pub proc: Proc,
    pub api: Api,
    pub kubeconfig: PathBuf,
}

impl Emulator {
    pub async fn start(repo: &Path, dir: &Path) -> Result<Self> {
        let mut command = Command::new(emulator_python(repo)?);
        command
            .arg(repo.join("tests/kube_emulator/emulator.py"))
            .args(["--port", "0", "--crds"])
            .arg(repo.join("crds"));
        let proc = Proc::spawn(command, dir, "emulator", Quote::Tail(40))?;
        let url = proc.wait_for("listening on ", Duration::from_secs(60))?;
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n  - name: emulator\n    cluster: {{server: \"{url}\"}}\nusers:\n  - name: emulator\n    user: {{token: emulator-does-not-check-tokens}}\ncontexts:\n  - name: emulator\n    context: {{cluster: emulator, user: emulator, namespace: default}}\ncurrent-context: emulator\n"
            ),
        )
        .context("writing the kubeconfig")?;
        let api = Api {
            http: reqwest::Client::new(),
            base: url,
        };
        api.get("/version")
            .await
            .context("the emulator does not answer /version")?;
        Ok(Self {
            proc,
            api,
            kubeconfig,
        })
    }
}

/// A CA and the serving certificate (localhost, 127.0.0.1) it signed.
pub struct Ca {
    pub ca_pem: String,
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
}

impl Ca {
    pub fn mint(dir: &Path) -> Result<Self> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "lifeguard bench CA");
        let ca = ca_params.self_signed(&ca_key)?;
        let leaf_key = KeyPair::generate()?;
        let mut leaf_params = CertificateParams::new(vec!["localhost".to_owned()])?;
        leaf_params
            .subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse()?));
        let leaf = leaf_params.signed_by(&leaf_key, &Issuer::new(ca_params, ca_key))?;
        let cert_path = dir.join("tls.crt");
        let key_path = dir.join("tls.key");
        std::fs::write(dir.join("ca.crt"), ca.pem())?;
        std::fs::write(&cert_path, leaf.pem())?;
        std::fs::write(&key_path, leaf_key.serialize_pem())?;
        Ok(Self {
            ca_pem: ca.pem(),
            cert_path,
            key_path,
        })
    }

    /// TLS as a sidecar dials the operator: this CA only, HTTP/2 then HTTP/1.1 by ALPN.
    pub fn client_config(&self) -> Result<rustls::ClientConfig> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(self.ca_pem.as_bytes()) {
            roots.add(cert.context("the bench CA")?)?;
        }
        let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }
}

/// Sum of every sample of `name` (with or without labels) in a Prometheus text exposition.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let rest = if rest.starts_with('{') {
                &rest[rest.find('}')? + 1..]
            } else {
                rest
            };
            rest.strip_prefix(' ')?
                .split_whitespace()
                .next()?
                .parse::<f64>()
                .ok()
        })
        .sum()
}

/// A control-plane process under test: `lifeguard operator` or `lifeguard webhook`, which take
/// the same flags.
pub struct Component {
    pub proc: Proc,
    /// `https://127.0.0.1:PORT`
    pub url: String,
    /// `http://127.0.0.1:PORT` (/readyz, /metrics)
    pub admin: String,
}

impl Component {
    /// Starts `lifeguard <subcommand>` in `namespace` with `config` and `extra` arguments,
    /// serving `ca`'s certificate, and waits until /readyz answers 200.
    #[allow(clippy::too_many_arguments)]
    pub async fn start(
        binary: &Path,
        subcommand: &str,
        namespace: &str,
        config: &Path,
        extra: &[String],
        dir: &Path,
        emulator: &Emulator,
        ca: &Ca,
    ) -> Result<Self> {
        let listen = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let mut command = Command::new(binary);
        command
            .arg(subcommand)
            .arg("--kubeconfig")
            .arg(&emulator.kubeconfig)
            .args(["--namespace", namespace])
            .args(["--listen", &listen.to_string()])
            .args(["--admin", "127.0.0.1:0"])
            .arg("--tls-cert")
            .arg(&ca.cert_path)
            .arg("--tls-key")
            .arg(&ca.key_path)
            .arg("--config")
            .arg(config)
            .args(extra)
            .env("RUST_LOG", "info,kube=warn");
        let proc = Proc::spawn(command, dir, subcommand, Quote::Tail(40))?;
        let admin = proc.wait_for("admin on ", Duration::from_secs(60))?;
        let component = Self {
            proc,
            url: format!("https://{listen}"),
            admin,
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let ready = reqwest::get(format!("{}/readyz", component.admin))
                .await
                .is_ok_and(|r| r.status() == 200);
            if ready {
                return Ok(component);
            }
            if Instant::now() > deadline {
                bail!(
                    "the {subcommand} never became ready:\n{}",
                    component.proc.logs()
                );
            }
            component.proc.check_alive()?;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The component's /metrics text (empty when it does not answer).
    pub async fn metrics_text(&self) -> String {
        match reqwest::get(format!("{}/metrics", self.admin)).await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }
}
