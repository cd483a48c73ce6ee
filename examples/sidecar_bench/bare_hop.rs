//! `--bare-hop`: the sidecar against the floor any proxy hop costs (issue 35).
//!
//! One example server and three proxies in front of it, side by side in one run:
//!
//! - **nginx** (`nginx-light` from Debian, installed with apt-get when missing and the bench
//!   runs as root): `proxy_pass` with upstream keep-alive, the access log off, one worker, and
//!   keep-alive connections never closed for their number of requests (nginx closes them after
//!   1,000 by default, which the other proxies never do);
//! - **hyper** (`examples/bare_proxy`): a minimal hyper reverse proxy, the Rust floor;
//! - **the sidecar** (the bench policy: a token check, policy, ledger and audit on every call).
//!
//! Lanes: `greet` directly and through each proxy, and a forwarded `tasks/get` of a running
//! task through the sidecar. Each lane is a closed loop on `--connections` connections for a
//! fixed time; a round runs every lane once, and the order turns every round (a different lane
//! first each time), so drift in the machine's conditions falls on all lanes alike. A lane's
//! CPU per request is its proxy's CPU time (all threads; nginx's master and worker) over the
//! requests answered; the direct lane reports the server's.
//!
//! Every ratio is taken within a round (the sidecar's CPU per `greet` over nginx's in the same
//! round) and the report gives the median over rounds, as the issue asks.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use jsonwebtoken::Algorithm;
use serde_json::{Value, json};

use crate::bench_support::procs::{Proc, Quote, clock_ticks_per_sec, cpu_ticks};
use crate::bench_support::report::{Target, heading};
use crate::client::{Endpoint, Template};
use crate::phases::{Load, closed_loop_each};
use crate::procs::{Keys, Server, Sidecar, running_task};
use crate::report::Machine;
use crate::run::Binaries;
use crate::stats::Errors;

/// The limits: the sidecar's CPU per `greet` and per forwarded `tasks/get`, as
/// multiples of nginx's per `greet`.
pub const GREET_LIMIT: f64 = 1.2;
pub const TASKS_GET_LIMIT: f64 = 1.5;

pub struct BareHopPlan {
    pub rounds: usize,
    pub per_lane: Duration,
    pub warmup: Duration,
    pub connections: usize,
    pub smoke: bool,
}

impl BareHopPlan {
    pub fn new(args: &crate::Args) -> Self {
        let smoke = args.smoke;
        Self {
            rounds: if smoke { 2 } else { 8 },
            per_lane: Duration::from_secs_f64(if smoke { 0.3 } else { 5.0 }),
            warmup: Duration::from_secs_f64(if smoke { 0.2 } else { 2.0 }),
            connections: args.connections.max(1),
            smoke,
        }
    }
}

/// Who answers a lane, and whose CPU it is charged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hop {
    Direct,
    Nginx,
    Hyper,
    Sidecar,
}

impl Hop {
    fn name(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Nginx => "nginx",
            Self::Hyper => "hyper",
            Self::Sidecar => "sidecar",
        }
    }
}

struct Lane {
    name: String,
    hop: Hop,
    method: &'static str,
    endpoint: Endpoint,
    template: Template,
    /// Per round: requests answered, seconds, CPU ticks of the hop's process(es).
    rounds: Vec<(u64, f64, u64)>,
}

impl Lane {
    fn cpu_us(&self, round: usize, ticks_per_sec: u64) -> f64 {
        let (requests, _, ticks) = self.rounds[round];
        ticks as f64 * 1e6 / ticks_per_sec as f64 / requests.max(1) as f64
    }

    fn rps(&self, round: usize) -> f64 {
        let (requests, secs, _) = self.rounds[round];
        requests as f64 / secs.max(1e-9)
    }
}

/// nginx as a child process with a configuration of its own in `dir`; `None` (and why) when
/// it is not installed and cannot be.
/// A smoke run uses nginx only when it is installed already.
fn start_nginx(
    dir: &Path,
    upstream: &Endpoint,
    install: bool,
) -> Result<std::result::Result<(Proc, Endpoint), String>> {
    let Some(binary) = nginx_binary(install) else {
        return Ok(Err(if install {
            "nginx is not installed and could not be (apt-get install nginx-light needs root)"
        } else {
            "nginx is not installed (a smoke run does not install it)"
        }
        .into()));
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let d = dir.display();
    let config = format!(
        "worker_processes 1;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/nginx-error.log warn;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n  access_log off;\n  keepalive_requests 100000000;\n  keepalive_timeout 300s;\n  client_body_temp_path {d}/client-body;\n  \
         proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  \
         scgi_temp_path {d}/scgi;\n  \
         upstream mcp {{ server {}; keepalive 64; keepalive_requests 100000000; \
         keepalive_timeout 300s; }}\n  \
         server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      proxy_pass http://mcp;\n      \
         proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n    }}\n  }}\n}}\n",
        upstream.addr
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, config).context("writing nginx.conf")?;
    let mut command = Command::new(&binary);
    command.arg("-p").arg(dir).arg("-c").arg(&path);
    let proc = Proc::spawn(command, dir, "nginx", Quote::Whole)?;
    let endpoint = Endpoint {
        addr: format!("127.0.0.1:{port}").parse()?,
        path: upstream.path.clone(),
    };
    for _ in 0..200 {
        if std::net::TcpStream::connect(endpoint.addr).is_ok() {
            return Ok(Ok((proc, endpoint)));
        }
        proc.check_alive()?;
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("nginx never accepted connections:\n{}", proc.logs())
}

/// The nginx binary, installing `nginx-light` first when it is missing and this runs as root.
fn nginx_binary(install: bool) -> Option<PathBuf> {
    let found = || {
        ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
    };
    if let Some(path) = found() {
        return Some(path);
    }
    if !install {
        return None;
    }
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next().map(|u| u == "0"))
        .unwrap_or(false);
    if !root {
        return None;
    }
    eprintln!("bare hop: installing nginx-light with apt-get");
    let installed = Command::new("sh")
        .args([
            "-c",
            "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
             nginx-light >/dev/null && (service nginx stop >/dev/null 2>&1 || true)",
        ])
        .status()
        .is_ok_and(|s| s.success());
    if installed { found() } else { None }
}

/// CPU ticks of `pid` and its child processes (nginx's worker).
fn ticks_with_children(pid: u32) -> u64 {
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    cpu_ticks(&format!("/proc/{pid}/stat"))
        + children
            .split_whitespace()
            .filter_map(|c| c.parse::<u32>().ok())
            .map(|c| cpu_ticks(&format!("/proc/{c}/stat")))
            .sum::<u64>()
}

pub struct BareHopResult {
    mode: &'static str,
    machine: Machine,
    ticks_per_sec: u64,
    lanes: Vec<Lane>,
    nginx_missing: Option<String>,
    pub errors: Errors,
    plan: (usize, f64, usize),
}

pub async fn run(
    plan: BareHopPlan,
    mode: &'static str,
    machine: Machine,
    repo: &Path,
    work: &Path,
    bins: &Binaries,
    bare_proxy: &Path,
) -> Result<BareHopResult> {
    let keys = Keys::load(repo)?;
    let server = Server::start(&bins.example, work)?;
    let dir = work.join("bare-hop");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let sidecar = Sidecar::start(
        &bins.lifeguard,
        &dir,
        &server.endpoint,
        &keys,
        &bins.sidecar_env,
        &[],
    )
    .await
    .context("starting the sidecar")?;
    let mut command = Command::new(bare_proxy);
    command
        .arg("--upstream")
        .arg(format!("http://{}", server.endpoint.addr));
    let hyper = Proc::spawn(command, &dir, "bare_proxy", Quote::Whole)?;
    let hyper_url = hyper.wait_for("bare_proxy: listening on ", Duration::from_secs(30))?;
    let mut hyper_endpoint = Endpoint::parse(&hyper_url)?;
    hyper_endpoint.path = server.endpoint.path.clone();
    let nginx = start_nginx(&dir, &server.endpoint, !plan.smoke)?;

    let token = keys.token(Algorithm::RS256, "bare-hop", "bench", "bench-client")?;
    let greet =
        |e: &Endpoint| Template::tool_call(e, &token, "greet", json!({"name": "bench"}), false);
    let lane = |hop: Hop, method: &'static str, endpoint: &Endpoint, template: Template| Lane {
        name: format!(
            "{method} {}",
            if hop == Hop::Direct {
                "direct".to_owned()
            } else {
                format!("via {}", hop.name())
            }
        ),
        hop,
        method,
        endpoint: endpoint.clone(),
        template,
        rounds: Vec::new(),
    };
    let mut lanes = vec![lane(
        Hop::Direct,
        "greet",
        &server.endpoint,
        greet(&server.endpoint),
    )];
    let nginx_missing = match &nginx {
        Ok((_, endpoint)) => {
            lanes.push(lane(Hop::Nginx, "greet", endpoint, greet(endpoint)));
            None
        }
        Err(why) => {
            eprintln!("bare hop: no nginx lane: {why}");
            Some(why.clone())
        }
    };
    lanes.push(lane(
        Hop::Hyper,
        "greet",
        &hyper_endpoint,
        greet(&hyper_endpoint),
    ));
    lanes.push(lane(
        Hop::Sidecar,
        "greet",
        &sidecar.endpoint,
        greet(&sidecar.endpoint),
    ));
    let task = running_task(&sidecar.endpoint, &token).await?;
    lanes.push(lane(
        Hop::Sidecar,
        "tasks/get",
        &sidecar.endpoint,
        Template::task_get(&sidecar.endpoint, &token, &task),
    ));

    let pid_of = |hop: Hop| match hop {
        Hop::Direct => server.proc.pid,
        Hop::Nginx => nginx.as_ref().map_or(0, |(p, _)| p.pid),
        Hop::Hyper => hyper.pid,
        Hop::Sidecar => sidecar.proc.pid,
    };
    let mut errors = Errors::default();
    for lane in &mut lanes {
        let mut load = Load::default();
        let each = vec![lane.template.clone(); plan.connections];
        closed_loop_each(&lane.endpoint, each, plan.warmup, &mut load).await?;
        errors.merge(load.errors);
    }
    for round in 0..plan.rounds {
        let n = lanes.len();
        for k in 0..n {
            let lane = &mut lanes[(round + k) % n];
            let pid = pid_of(lane.hop);
            let mut load = Load::default();
            let each = vec![lane.template.clone(); plan.connections];
            let before = ticks_with_children(pid);
            closed_loop_each(&lane.endpoint, each, plan.per_lane, &mut load).await?;
            let ticks = ticks_with_children(pid) - before;
            lane.rounds
                .push((load.requests, load.elapsed.as_secs_f64(), ticks));
            errors.merge(load.errors);
        }
        eprintln!("bare hop: round {} of {} done", round + 1, plan.rounds);
    }
    server.proc.check_alive()?;
    sidecar.proc.check_alive()?;
    hyper.check_alive()?;
    Ok(BareHopResult {
        mode,
        machine,
        ticks_per_sec: clock_ticks_per_sec(),
        lanes,
        nginx_missing,
        errors,
        plan: (plan.rounds, plan.per_lane.as_secs_f64(), plan.connections),
    })
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

impl BareHopResult {
    fn lane(&self, hop: Hop, method: &str) -> Option<&Lane> {
        self.lanes
            .iter()
            .find(|l| l.hop == hop && l.method == method)
    }

    /// Per round: `a`'s CPU per request over `b`'s; their median.
    fn cpu_ratio(&self, a: &Lane, b: &Lane) -> f64 {
        let t = self.ticks_per_sec;
        median(
            (0..a.rounds.len())
                .map(|r| a.cpu_us(r, t) / b.cpu_us(r, t))
                .collect(),
        )
    }

    /// Per round: a proxied lane's requests per second over the direct lane's; their median.
    fn throughput_ratio(&self, lane: &Lane) -> Option<f64> {
        let direct = self.lane(Hop::Direct, "greet")?;
        Some(median(
            (0..lane.rounds.len())
                .map(|r| lane.rps(r) / direct.rps(r))
                .collect(),
        ))
    }

    fn targets(&self) -> Vec<Target<2>> {
        let not_applicable = if self.mode == "smoke" {
            Some("a smoke run".to_owned())
        } else {
            self.nginx_missing
                .as_ref()
                .map(|why| format!("no nginx lane: {why}"))
        };
        let (Some(greet), Some(get)) = (
            self.lane(Hop::Sidecar, "greet"),
            self.lane(Hop::Sidecar, "tasks/get"),
        ) else {
            return Vec::new();
        };
        let nginx = self.lane(Hop::Nginx, "greet");
        let ratio = |lane: &Lane| nginx.map_or(f64::NAN, |n| self.cpu_ratio(lane, n));
        let target = |name: &str, measured: f64, limit: f64, at_least: bool| Target {
            name: name.to_owned(),
            measured,
            limit,
            unit: "×",
            at_least,
            not_applicable: not_applicable.clone(),
        };
        let sidecar_throughput = self.throughput_ratio(greet).unwrap_or(f64::NAN);
        let nginx_throughput = nginx
            .and_then(|n| self.throughput_ratio(n))
            .unwrap_or(f64::NAN);
        vec![
            target(
                "sidecar CPU per greet over nginx's (median of rounds)",
                ratio(greet),
                GREET_LIMIT,
                false,
            ),
            target(
                "sidecar CPU per forwarded tasks/get over nginx's per greet",
                ratio(get),
                TASKS_GET_LIMIT,
                false,
            ),
            target(
                "sidecar throughput ratio over nginx's (greet, via ÷ direct)",
                sidecar_throughput / nginx_throughput,
                1.0,
                true,
            ),
        ]
    }

    pub fn table(&self) -> String {
        use std::fmt::Write as _;
        let mut o = String::new();
        heading(
            &mut o,
            "bare-hop",
            self.mode,
            &self.machine.host,
            "every lane answers",
        );
        let (rounds, secs, connections) = self.plan;
        let _ = writeln!(
            o,
            "{rounds} interleaved rounds of {secs} s per lane, {connections} connections, closed loop\n"
        );
        let _ = writeln!(
            o,
            "{:<24} {:>12} {:>12} {:>10} {:>10} {:>10}",
            "lane", "CPU µs/req", "req/s", "÷ nginx", "÷ hyper", "÷ direct"
        );
        let nginx = self.lane(Hop::Nginx, "greet");
        let hyper = self.lane(Hop::Hyper, "greet");
        for lane in &self.lanes {
            let cpu = median(
                (0..lane.rounds.len())
                    .map(|r| lane.cpu_us(r, self.ticks_per_sec))
                    .collect(),
            );
            let rps = median((0..lane.rounds.len()).map(|r| lane.rps(r)).collect());
            let over = |other: Option<&Lane>| match other {
                Some(o) if lane.hop != Hop::Direct => format!("{:.2}×", self.cpu_ratio(lane, o)),
                _ => "-".into(),
            };
            let throughput = match self.throughput_ratio(lane) {
                Some(t) if lane.hop != Hop::Direct => format!("{t:.2}"),
                _ => "-".into(),
            };
            let _ = writeln!(
                o,
                "{:<24} {cpu:>12.1} {rps:>12.0} {:>10} {:>10} {throughput:>10}",
                lane.name,
                over(nginx),
                over(hyper)
            );
        }
        let _ = writeln!(
            o,
            "(direct: the example server's CPU; the others: the proxy's alone)\n"
        );
        if let Some(why) = &self.nginx_missing {
            let _ = writeln!(o, "NO NGINX LANE: {why}");
        }
        for t in self.targets() {
            let _ = writeln!(o, "{}", t.line());
        }
        crate::bench_support::report::errors_section(
            &mut o,
            &self.errors,
            "request(s) failed",
            "no errors",
        );
        o
    }

    pub fn to_json(&self) -> Value {
        let t = self.ticks_per_sec;
        json!({
            "mode": self.mode,
            "machine": self.machine.to_json(),
            "plan": {"rounds": self.plan.0, "seconds_per_lane": self.plan.1, "connections": self.plan.2},
            "nginx_missing": self.nginx_missing,
            "lanes": self.lanes.iter().map(|l| json!({
                "lane": l.name, "hop": l.hop.name(), "method": l.method,
                "rounds": (0..l.rounds.len()).map(|r| json!({
                    "requests": l.rounds[r].0, "seconds": l.rounds[r].1, "cpu_ticks": l.rounds[r].2,
                    "cpu_us_per_request": l.cpu_us(r, t), "requests_per_second": l.rps(r),
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "targets": self.targets().iter().map(Target::to_json).collect::<Vec<_>>(),
            "errors": self.errors.count,
            "passed": self.errors.count == 0,
        })
    }
}
