//! The processes under test (the example MCP server and the sidecar), their setup (policy,
//! keys, tokens), and what /proc tells about them (RSS, CPU time).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use jsonwebtoken::Algorithm;
use serde_json::json;

use crate::client::{self, Endpoint};

pub const ISSUER: &str = "https://idp.bench";
pub const RESOURCE: &str = "http://127.0.0.1/mcp";
pub const TASK_TOOL: &str = "slow_compute";

/// The bench policy: the test issuer, `slow_compute` as the task tool, concurrency limits at
/// the CRD maximum so no quota refuses a bench request, TTLs and deadlines longer than a run,
/// listen streams on `example://bench/*` resources, and poll pacing off (1 ns) so every measured `tasks/get` goes to the server: the sidecar
/// answers polls faster than `minPollInterval` from the ledger, which would measure the cheap
/// path instead.
pub fn policy_yaml() -> String {
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
"#
    )
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
        let now = jiff::Timestamp::now().as_second();
        let claims = json!({
            "iss": ISSUER, "aud": RESOURCE, "sub": subject, "tid": tenant, "client_id": client,
            "scope": "", "iat": now, "nbf": now - 5, "exp": now + 6 * 3600,
        });
        let (pem, kid) = match alg {
            Algorithm::EdDSA => (&self.ed_pem, "test-ed-1"),
            _ => (&self.rsa_pem, "test-rsa-1"),
        };
        lifeguard::identity::mint::mint_token(pem, alg, Some(kid), &claims)
            .with_context(|| format!("minting a {alg:?} token"))
    }
}

/// A child process, killed when dropped; its stdout and stderr go to files.
pub struct Proc {
    child: Child,
    pub pid: u32,
    name: String,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Proc {
    fn spawn(mut command: Command, dir: &Path, name: &str) -> Result<Self> {
        let stdout = dir.join(format!("{name}.stdout"));
        let stderr = dir.join(format!("{name}.stderr"));
        command
            .stdin(Stdio::null())
            .stdout(File::create(&stdout).context("creating a log file")?)
            .stderr(File::create(&stderr).context("creating a log file")?);
        let child = command
            .spawn()
            .with_context(|| format!("starting {name} ({:?})", command.get_program()))?;
        Ok(Self {
            pid: child.id(),
            child,
            name: name.to_owned(),
            stdout,
            stderr,
        })
    }

    /// Both logs, for error messages.
    pub fn logs(&self) -> String {
        let out = std::fs::read_to_string(&self.stdout).unwrap_or_default();
        let err = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        format!(
            "--- {} stdout\n{out}--- {} stderr\n{err}",
            self.name, self.name
        )
    }

    /// Waits for a line containing `marker` in either log; returns the rest of that line.
    fn wait_for(&mut self, marker: &str) -> Result<String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            for path in [&self.stdout, &self.stderr] {
                let text = std::fs::read_to_string(path).unwrap_or_default();
                // Only whole lines: the process may be writing the last one right now.
                for line in text.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
                    if let Some(i) = line.find(marker) {
                        return Ok(line[i + marker.len()..].trim().to_owned());
                    }
                }
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                bail!(
                    "{} exited ({status}) before printing `{marker}`:\n{}",
                    self.name,
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!(
            "{} did not print `{marker}` within 60 s:\n{}",
            self.name,
            self.logs()
        )
    }

    /// Fails if the process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => bail!("{} exited ({status}):\n{}", self.name, self.logs()),
            Err(e) => bail!("cannot check {}: {e}", self.name),
        }
    }

    pub fn status(&self) -> Result<ProcStatus> {
        ProcStatus::read(self.pid)
    }

    pub fn cpu_ticks(&self) -> u64 {
        cpu_ticks(&format!("/proc/{}/stat", self.pid))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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
        let mut proc = Proc::spawn(command, dir, "example_server")?;
        let url = proc.wait_for("listening on ")?;
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
        std::fs::write(dir.join("jwks.json"), &keys.jwks).context("writing jwks.json")?;
        let policy = dir.join("policy.yaml");
        std::fs::write(&policy, policy_yaml()).context("writing the bench policy")?;
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
        command
            .arg("--audit-file")
            .arg(dir.join("audit.jsonl"))
            .args(args)
            .env("RUST_LOG", "info")
            .envs(env.iter().map(|(k, v)| (k, v)));
        let mut proc = Proc::spawn(command, dir, "sidecar")?;
        let url = proc.wait_for("lifeguard: listening on ")?;
        let admin_url = proc.wait_for("lifeguard: admin on ")?;
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

/// Memory of a process from /proc/PID/status.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcStatus {
    pub rss_kib: u64,
    pub hwm_kib: u64,
}

impl ProcStatus {
    pub fn read(pid: u32) -> Result<Self> {
        let path = format!("/proc/{pid}/status");
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        Ok(Self {
            rss_kib: field("VmRSS:"),
            hwm_kib: field("VmHWM:"),
        })
    }

    pub fn to_json(self) -> serde_json::Value {
        json!({"vm_rss_kib": self.rss_kib, "vm_hwm_kib": self.hwm_kib})
    }
}

/// utime + stime of a process (clock ticks) from a /proc stat file.
pub fn cpu_ticks(stat_path: &str) -> u64 {
    let Ok(text) = std::fs::read_to_string(stat_path) else {
        return 0;
    };
    // Fields after the parenthesised command name: state is the first, utime the 12th.
    let Some(rest) = text.rsplit_once(')').map(|(_, r)| r) else {
        return 0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    num(11) + num(12)
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 when unknown).
pub fn clock_ticks_per_sec() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}
