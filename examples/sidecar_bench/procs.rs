//! The processes under test (the example MCP server and the sidecar) and their setup (policy,
//! keys, tokens); shared with `examples/scale_out_bench`, which includes this file.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use jsonwebtoken::Algorithm;
use serde_json::json;

use crate::bench_support::procs::{Proc, Quote};
use crate::client::{self, Conn, Endpoint, Template};

pub const ISSUER: &str = "https://idp.bench";
pub const RESOURCE: &str = "http://127.0.0.1/mcp";
pub const TASK_TOOL: &str = "slow_compute";

/// The bench policy: the test issuer, `slow_compute` as the task tool, concurrency limits at
/// the CRD maximum so no quota refuses a bench request, TTLs and deadlines longer than a run,
/// listen streams on `example://bench/*` resources, and poll pacing off (1 ns) so every measured `tasks/get` goes to the server: the sidecar
/// answers polls faster than `minPollInterval` from the ledger, which would measure the cheap
/// path instead.
pub fn policy_yaml() -> String {
    policy_yaml_with("")
}

/// [`policy_yaml`] with `extra` (YAML lines indented under `spec:`, e.g. `rateLimits`) added.
pub fn policy_yaml_with(extra: &str) -> String {
    format!(
        r#"apiVersion: lifeguard.dev/v1alpha1
kind: McpServerPolicy
metadata: {{name: bench, namespace: bench}}
spec:
  selector: {{}}
  resource: {RESOURCE}
  identity:
    issuers:
      - issuer: {ISSUER}
        jwksFile: jwks.json
  tasks:
    tools: [{TASK_TOOL}]
    retention: {{defaultTtl: 4h, maxTtl: 4h}}
    deadline: {{default: 4h, max: 4h}}
    minPollInterval: 1ns
    concurrency: {{perPrincipal: 1000000, perTenant: 1000000, perClient: 1000000, perServer: 1000000}}
  listen:
    notifications: [resourceSubscriptions]
    resourceSubscriptions: {{allow: ["example://bench/*"]}}
    maxStreamsPerPrincipal: {STREAMS_PER_PRINCIPAL}
    maxStreamDuration: 4h
{extra}"#
    )
}

/// The arguments of replica `r{i}` of the bench server on the PostgreSQL `ledger`: one ledger
/// scope, its replica id, and its internal hop on a free port.
pub fn replica_args(ledger: &str, i: usize) -> Vec<String> {
    let replica = format!("r{i}");
    let args = [
        "--ledger",
        ledger,
        "--ledger-scope",
        "bench/bench",
        "--replica-id",
        &replica,
        "--internal-listen",
        "127.0.0.1:0",
    ];
    args.iter().map(|s| s.to_string()).collect()
}

/// Listen streams each bench principal opens (the policy's cap).
pub const STREAMS_PER_PRINCIPAL: usize = 16;

/// Key material of the test issuer (tests/fixtures/keys).
pub struct Keys {
    pub jwks: Vec<u8>,
    pub rsa_pem: Vec<u8>,
    pub ed_pem: Vec<u8>,
}

impl Keys {
    pub fn load(repo: &Path) -> Result<Self> {
        let read = |name: &str| {
            let path = repo.join("tests/fixtures/keys").join(name);
            std::fs::read(&path).with_context(|| format!("reading {}", path.display()))
        };
        Ok(Self {
            jwks: read("issuer-jwks.json")?,
            rsa_pem: read("issuer-rsa.pem")?,
            ed_pem: read("issuer-ed25519.pem")?,
        })
    }

    /// A token for `subject` in `tenant` via `client`, valid for 6 hours.
    pub fn token(
        &self,
        alg: Algorithm,
        subject: &str,
        tenant: &str,
        client: &str,
    ) -> Result<String> {
        self.mint(alg, &claims(subject, tenant, client))
    }

    /// [`Keys::token`] bound to the DPoP key whose RFC 7638 thumbprint is `jkt` (the claim
    /// `cnf.jkt`, RFC 9449 §6.1): the sidecar accepts it only with a proof of that key.
    pub fn bound_token(
        &self,
        alg: Algorithm,
        subject: &str,
        tenant: &str,
        client: &str,
        jkt: &str,
    ) -> Result<String> {
        let mut claims = claims(subject, tenant, client);
        claims["cnf"] = json!({"jkt": jkt});
        self.mint(alg, &claims)
    }

    fn mint(&self, alg: Algorithm, claims: &serde_json::Value) -> Result<String> {
        let (pem, kid) = match alg {
            Algorithm::EdDSA => (&self.ed_pem, "test-ed-1"),
            _ => (&self.rsa_pem, "test-rsa-1"),
        };
        lifeguard::identity::mint::mint_token(pem, alg, Some(kid), claims)
            .with_context(|| format!("minting a {alg:?} token"))
    }
}

/// Creates one task of [`TASK_TOOL`] that runs for a day through `endpoint` and returns its id
/// (for the phases that poll a working task).
pub async fn running_task(endpoint: &Endpoint, token: &str) -> Result<String> {
    let mut conn = Conn::connect(endpoint.addr).await?;
    let args = json!({"seconds": 86_400});
    let template = Template::tool_call(endpoint, token, TASK_TOOL, args, true);
    let status = conn.send(template.bytes()).await?;
    conn.body_json()
        .filter(|_| status == 200)
        .and_then(|v| {
            v.pointer("/result/taskId")
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned)
        })
        .with_context(|| {
            let why = client::describe_failure(status, conn.body());
            format!("creating a running task at {}: {why}", endpoint.addr)
        })
}

/// The claims of a bench token for `subject` in `tenant` via `client`, valid for 6 hours.
fn claims(subject: &str, tenant: &str, client: &str) -> serde_json::Value {
    let now = jiff::Timestamp::now().as_second();
    json!({
        "iss": ISSUER, "aud": RESOURCE, "sub": subject, "tid": tenant, "client_id": client,
        "scope": "", "iat": now, "nbf": now - 5, "exp": now + 6 * 3600,
    })
}

/// Waits up to 60 s for a line containing `marker` in the logs of `proc`, which must not exit
/// first; returns the rest of that line.
fn wait_for(proc: &Proc, marker: &str) -> Result<String> {
    let running = |p: &Proc| match p.exited() {
        Ok(Some(status)) => bail!(
            "{} exited ({status}) before printing `{marker}`:\n{}",
            p.name(),
            p.logs()
        ),
        _ => Ok(()),
    };
    match proc.watch_for(marker, Duration::from_secs(60), running)? {
        Some(rest) => Ok(rest),
        None => bail!(
            "{} did not print `{marker}` within 60 s:\n{}",
            proc.name(),
            proc.logs()
        ),
    }
}

/// The bundled example MCP server.
pub struct Server {
    pub proc: Proc,
    pub endpoint: Endpoint,
}

impl Server {
    pub fn start(binary: &Path, dir: &Path) -> Result<Self> {
        let mut command = Command::new(binary);
        command.args(["--listen", "127.0.0.1:0"]);
        let proc = Proc::spawn(command, dir, "example_server", Quote::Whole)?;
        let url = wait_for(&proc, "listening on ")?;
        Ok(Self {
            endpoint: Endpoint::parse(&url)?,
            proc,
        })
    }
}

/// The sidecar under test, with its files.
pub struct Sidecar {
    pub proc: Proc,
    pub endpoint: Endpoint,
    pub admin: std::net::SocketAddr,
    pub ledger: PathBuf,
}

impl Sidecar {
    pub async fn start(
        binary: &Path,
        dir: &Path,
        upstream: &Endpoint,
        keys: &Keys,
        env: &[(String, String)],
        args: &[String],
    ) -> Result<Self> {
        Self::start_with(binary, dir, upstream, keys, env, args, "").await
    }

    /// [`Sidecar::start`] with `spec_extra` added to the bench policy ([`policy_yaml_with`]).
    pub async fn start_with(
        binary: &Path,
        dir: &Path,
        upstream: &Endpoint,
        keys: &Keys,
        env: &[(String, String)],
        args: &[String],
        spec_extra: &str,
    ) -> Result<Self> {
        std::fs::write(dir.join("jwks.json"), &keys.jwks).context("writing jwks.json")?;
        let policy = dir.join("policy.yaml");
        std::fs::write(&policy, policy_yaml_with(spec_extra))
            .context("writing the bench policy")?;
        let ledger = dir.join("ledger.db");
        let mut command = Command::new(binary);
        command
            .arg("sidecar")
            .arg("--policy")
            .arg(&policy)
            .arg("--upstream")
            .arg(format!("http://{}{}", upstream.addr, upstream.path))
            .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"]);
        // The SQLite file in `dir`, unless `args` name another ledger.
        if !args.iter().any(|a| a == "--ledger") {
            command.arg("--ledger").arg(&ledger);
        }
        // Spans are exported only when `env` says so (`--tracing`): an OTLP collector set up in
        // the shell that runs the benchmark must not change what the other phases measure.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("OTEL_") {
                command.env_remove(name);
            }
        }
        command
            .arg("--audit-file")
            .arg(dir.join("audit.jsonl"))
            .args(args)
            .env("RUST_LOG", "info")
            .envs(env.iter().map(|(k, v)| (k, v)));
        let proc = Proc::spawn(command, dir, "sidecar", Quote::Whole)?;
        let url = wait_for(&proc, "lifeguard: listening on ")?;
        let admin_url = wait_for(&proc, "lifeguard: admin on ")?;
        let admin = admin_url
            .trim_start_matches("http://")
            .parse()
            .with_context(|| format!("admin address {admin_url}"))?;
        let sidecar = Self {
            endpoint: Endpoint::parse(&url)?,
            admin,
            ledger,
            proc,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok((200, _)) = client::get(sidecar.admin, "/ready").await {
                return Ok(sidecar);
            }
            if Instant::now() > deadline {
                bail!("the sidecar never became ready:\n{}", sidecar.proc.logs());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// One series of /metrics, e.g. `lifeguard_connections_open` or a counter with its labels
    /// (0 when absent).
    pub async fn series(&self, series: &str) -> Result<f64> {
        let (status, text) = client::get(self.admin, "/metrics").await?;
        if status != 200 {
            bail!("/metrics answered HTTP {status}");
        }
        Ok(text
            .lines()
            .filter_map(|l| l.strip_prefix(series))
            .filter_map(|rest| rest.strip_prefix(' '))
            .find_map(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0))
    }

    /// `_sum` and `_count` of a histogram on /metrics.
    pub async fn histogram(&self, name: &str) -> Result<(f64, f64)> {
        let (status, text) = client::get(self.admin, "/metrics").await?;
        if status != 200 {
            bail!("/metrics answered HTTP {status}");
        }
        let value = |suffix: &str| {
            let key = format!("lifeguard_{name}{suffix}");
            text.lines()
                .filter_map(|l| l.strip_prefix(&key))
                .filter_map(|rest| rest.split_whitespace().next())
                .find_map(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        Ok((value("_sum "), value("_count ")))
    }
}
