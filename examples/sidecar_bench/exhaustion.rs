//! The exhaustion phase: a fresh sidecar (own ledger, the limits under test) attacked without
//! tokens the way the adversarial review did, while its memory is watched and an authenticated
//! client keeps calling `greet`.
//!
//! 1. *Attack*: token-less requests announcing a 4 MiB body, sending its first KiB and
//!    withholding the rest (one client address), plus half-sent request heads (another
//!    address); meanwhile `greet` from a third address, on a new connection each time.
//! 2. *Saturation*: more connections than the global cap, from many addresses (under the
//!    per-peer cap), each sending an incomplete head just under the head limit: the worst
//!    case the memory bound of docs/sidecar.md speaks of. Afterwards `greet` must work again.
//!
//! Loopback has a whole /8, so each role connects from its own 127.x address and the per-peer
//! cap applies to each role separately.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinHandle;

use crate::bench_support::procs::Memory;
use crate::client::{self, Conn, Endpoint, Template};
use crate::procs::{Keys, Sidecar};
use crate::report::Target;
use crate::stats::{Errors, Summary, us};

/// What the documented memory bound allows per connection (docs/sidecar.md, "Resource limits
/// and what they bound"): hyper's read buffer grown towards the 32 KiB head limit (under
/// 64 KiB of capacity as it doubles), its 8 KiB write buffer, and the connection's state
/// (hyper's dispatcher, the task, the timer: a few KiB). The bound is the sidecar's idle
/// memory plus this much per connection the cap admits.
pub const CONNECTION_ALLOWANCE_KIB: u64 = 80;
const FOUR_MIB: usize = 4 * 1024 * 1024;

/// Sizes of the phase.
#[derive(Clone, Debug)]
pub struct ExhaustionPlan {
    pub token_less: usize,
    pub half_sent: usize,
    pub max_connections: usize,
    pub per_peer: usize,
    pub header_read: Duration,
    pub body_read: Duration,
    /// Connections of the saturation wave beyond the global cap.
    pub beyond_cap: usize,
    /// Bytes of each incomplete head of the saturation wave (under the 32 KiB head limit).
    pub head_bytes: usize,
}

impl ExhaustionPlan {
    /// The sidecar's defaults and the review's attack in a full run; small and quick in smoke.
    pub fn new(smoke: bool) -> Self {
        if smoke {
            Self {
                token_less: 8,
                half_sent: 40,
                max_connections: 64,
                per_peer: 16,
                header_read: Duration::from_secs(1),
                body_read: Duration::from_secs(1),
                beyond_cap: 8,
                head_bytes: 30 * 1024,
            }
        } else {
            Self {
                token_less: 48,
                half_sent: 300,
                max_connections: 1024,
                per_peer: 64,
                header_read: Duration::from_secs(10),
                body_read: Duration::from_secs(30),
                beyond_cap: 100,
                head_bytes: 30 * 1024,
            }
        }
    }

    fn sidecar_args(&self) -> Vec<String> {
        let secs = |d: Duration| format!("{}ms", d.as_millis());
        vec![
            "--max-connections".into(),
            self.max_connections.to_string(),
            "--max-connections-per-peer".into(),
            self.per_peer.to_string(),
            "--header-read-timeout".into(),
            secs(self.header_read),
            "--body-read-timeout".into(),
            secs(self.body_read),
        ]
    }

    /// The documented bound for these limits over an idle footprint of `idle_mib`, MiB.
    pub fn bound_mib(&self, idle_mib: f64) -> f64 {
        idle_mib + self.max_connections as f64 * CONNECTION_ALLOWANCE_KIB as f64 / 1024.0
    }

    pub fn to_json(&self) -> Value {
        json!({
            "token_less_connections": self.token_less, "half_sent_connections": self.half_sent,
            "max_connections": self.max_connections, "max_connections_per_peer": self.per_peer,
            "header_read_timeout_seconds": self.header_read.as_secs_f64(),
            "body_read_timeout_seconds": self.body_read.as_secs_f64(),
            "saturation_beyond_cap": self.beyond_cap, "saturation_head_bytes": self.head_bytes,
            "connection_allowance_kib": CONNECTION_ALLOWANCE_KIB,
        })
    }
}

/// What became of one attacking connection by the end of its wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    /// The sidecar answered with this status, then closed the connection.
    AnsweredThenClosed(u16),
    /// The sidecar answered and kept the connection open.
    AnsweredOpen(u16),
    /// Closed (or reset) without an answer.
    Closed,
    /// Still open, unanswered.
    Held,
}

/// Everything the phase measured.
#[derive(Debug, Default)]
pub struct ExhaustionResult {
    pub plan: Option<ExhaustionPlan>,
    pub idle: Memory,
    pub attack_peak_kib: u64,
    pub saturation_peak_kib: u64,
    pub hwm_kib: u64,
    pub token_less_401_closed: usize,
    pub token_less_other: Vec<String>,
    pub half_sent_refused: u64,
    pub half_sent_timed_out: u64,
    pub half_sent_held: usize,
    pub greets: Summary,
    pub greet_failures: u64,
    pub saturation_opened: usize,
    pub saturation_open_peak: f64,
    pub saturation_refused: u64,
    pub saturation_held: usize,
    pub recovered: bool,
    pub errors: Errors,
}

/// Connects to `to` from the loopback address `source`.
async fn connect_from(source: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(IpAddr::V4(source), 0))?;
    socket.connect(to).await
}

fn status_of(bytes: &[u8]) -> Option<u16> {
    let line_end = bytes.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(&bytes[..line_end]).ok()?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Waits until the sidecar answers and closes, closes, or `until` passes.
async fn fate(stream: &mut TcpStream, until: Instant) -> Fate {
    let mut got = Vec::new();
    let mut chunk = [0u8; 2048];
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let read = tokio::time::timeout(left, stream.read(&mut chunk)).await;
        match (read, status_of(&got)) {
            (Ok(Ok(n)), _) if n > 0 => got.extend_from_slice(&chunk[..n]),
            (Ok(_), Some(status)) => return Fate::AnsweredThenClosed(status),
            (Ok(_), None) => return Fate::Closed,
            (Err(_), Some(status)) => return Fate::AnsweredOpen(status),
            (Err(_), None) => return Fate::Held,
        }
    }
}

/// The head of a token-less `greet` announcing a 4 MiB body.
fn token_less_head(endpoint: &Endpoint) -> String {
    format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: {}\r\n\
         Mcp-Method: tools/call\r\nMcp-Name: greet\r\nContent-Length: {FOUR_MIB}\r\n\r\n",
        endpoint.path,
        endpoint.addr,
        client::PROTOCOL_VERSION
    )
}

/// An incomplete head of `bytes` bytes (its last header never ends).
fn incomplete_head(endpoint: &Endpoint, bytes: usize) -> Vec<u8> {
    let mut head = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nX-Pad: ",
        endpoint.path, endpoint.addr
    )
    .into_bytes();
    head.resize(bytes.max(head.len()), b'a');
    head
}

/// Sends `first` (and `then`, if any) from `source`, then withholds the rest and waits.
fn attacker(
    source: Ipv4Addr,
    to: SocketAddr,
    first: Arc<Vec<u8>>,
    then: Option<Arc<Vec<u8>>>,
    until: Instant,
) -> JoinHandle<Fate> {
    tokio::spawn(async move {
        let Ok(mut stream) = connect_from(source, to).await else {
            return Fate::Closed;
        };
        if stream.write_all(&first).await.is_err() {
            return Fate::Closed;
        }
        if let Some(then) = then {
            let _ = stream.write_all(&then).await;
        }
        fate(&mut stream, until).await
    })
}

/// Samples the sidecar's VmRSS every 20 ms until stopped; returns the peak (KiB).
fn rss_sampler(pid: u32, stop: Arc<AtomicBool>) -> JoinHandle<u64> {
    tokio::spawn(async move {
        let mut peak = 0;
        while !stop.load(Ordering::Relaxed) {
            if let Ok(s) = Memory::try_read(pid) {
                peak = peak.max(s.rss_kib);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        peak
    })
}

/// One authenticated `greet` on a new connection; its latency in ns when it succeeded.
async fn greet_once(endpoint: &Endpoint, template: &Template) -> Result<u64, String> {
    let mut conn = Conn::connect(endpoint.addr)
        .await
        .map_err(|e| format!("{e:#}"))?;
    let (status, ns) = client::timed(&mut conn, template.bytes())
        .await
        .map_err(|e| format!("{e:#}"))?;
    if client::is_success(status, conn.body()) {
        Ok(ns)
    } else {
        Err(client::describe_failure(status, conn.body()))
    }
}

/// Joins attacker tasks, tallying their fates.
async fn fates(handles: Vec<JoinHandle<Fate>>) -> Vec<Fate> {
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.unwrap_or(Fate::Held));
    }
    out
}

/// Runs the phase against a fresh sidecar in front of `upstream`.
pub async fn run(
    plan: &ExhaustionPlan,
    lifeguard: &Path,
    work: &Path,
    upstream: &Endpoint,
    keys: &Keys,
    owner_token: &str,
) -> Result<ExhaustionResult> {
    eprintln!("phase: exhaustion (unauthenticated connection flood)");
    let dir = work.join("exhaustion");
    std::fs::create_dir_all(&dir).context("creating the exhaustion work directory")?;
    let args = plan.sidecar_args();
    let sidecar = Sidecar::start(lifeguard, &dir, upstream, keys, &[], &args).await?;
    let via = sidecar.endpoint.clone();
    let greet = Template::tool_call(&via, owner_token, "greet", json!({"name": "bench"}), false);
    let mut result = ExhaustionResult {
        plan: Some(plan.clone()),
        ..ExhaustionResult::default()
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    result.idle = sidecar.proc.try_memory()?;
    attack(plan, &sidecar, &greet, &mut result).await?;
    saturate(plan, &sidecar, &greet, &mut result).await?;
    result.hwm_kib = sidecar.proc.try_memory()?.hwm_kib;
    Ok(result)
}

const PER_PEER_REFUSED: &str =
    r#"lifeguard_connections_refused_total{reason="max_connections_per_peer"}"#;
const TOTAL_REFUSED: &str = r#"lifeguard_connections_refused_total{reason="max_connections"}"#;
const HEADER_TIMED_OUT: &str = r#"lifeguard_connections_timed_out_total{reason="header_read"}"#;

/// Step 1: token-less bodies and half-sent heads, with `greet` calls throughout.
async fn attack(
    plan: &ExhaustionPlan,
    sidecar: &Sidecar,
    greet: &Template,
    result: &mut ExhaustionResult,
) -> Result<()> {
    let to = sidecar.endpoint.addr;
    let refused_before = sidecar.series(PER_PEER_REFUSED).await?;
    let timed_out_before = sidecar.series(HEADER_TIMED_OUT).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = rss_sampler(sidecar.proc.pid, stop.clone());
    let until = Instant::now() + plan.header_read + Duration::from_secs(10);
    let head = Arc::new(token_less_head(&sidecar.endpoint).into_bytes());
    let first_kib = Arc::new(vec![b' '; 1024]);
    let token_less: Vec<_> = (0..plan.token_less)
        .map(|_| {
            let source = Ipv4Addr::new(127, 0, 0, 2);
            attacker(source, to, head.clone(), Some(first_kib.clone()), until)
        })
        .collect();
    let half = head[..head.len() / 2].to_vec();
    let half = Arc::new(half);
    let half_sent: Vec<_> = (0..plan.half_sent)
        .map(|_| attacker(Ipv4Addr::new(127, 0, 0, 3), to, half.clone(), None, until))
        .collect();
    let mut samples = Vec::new();
    loop {
        match greet_once(&sidecar.endpoint, greet).await {
            Ok(ns) => samples.push(ns),
            Err(why) => {
                result.greet_failures += 1;
                result
                    .errors
                    .record(format!("exhaustion: greet during the attack: {why}"));
            }
        }
        let done = token_less.iter().chain(&half_sent).all(|h| h.is_finished());
        if done || Instant::now() >= until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for fate in fates(token_less).await {
        match fate {
            Fate::AnsweredThenClosed(401) => result.token_less_401_closed += 1,
            other => result.token_less_other.push(format!("{other:?}")),
        }
    }
    result.half_sent_held = fates(half_sent)
        .await
        .into_iter()
        .filter(|f| *f != Fate::Closed)
        .count();
    stop.store(true, Ordering::Relaxed);
    result.attack_peak_kib = sampler.await.unwrap_or(0);
    result.greets = Summary::of(&mut samples);
    result.half_sent_refused = (sidecar.series(PER_PEER_REFUSED).await? - refused_before) as u64;
    result.half_sent_timed_out =
        (sidecar.series(HEADER_TIMED_OUT).await? - timed_out_before) as u64;
    if !result.token_less_other.is_empty() {
        let fates = result.token_less_other.join(", ");
        result.errors.record(format!(
            "exhaustion: token-less requests not answered 401 and closed: {fates}"
        ));
    }
    if result.half_sent_held > 0 {
        result.errors.record(format!(
            "exhaustion: {} half-sent requests still held at the end",
            result.half_sent_held
        ));
    }
    Ok(())
}

/// The `n`-th saturation source address: 127.0.(1 + n / 250).(1 + n % 250).
fn saturation_source(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 1 + (n / 250) as u8, 1 + (n % 250) as u8)
}

/// Step 2: more connections than the cap, each holding an incomplete head near the limit.
async fn saturate(
    plan: &ExhaustionPlan,
    sidecar: &Sidecar,
    greet: &Template,
    result: &mut ExhaustionResult,
) -> Result<()> {
    let to = sidecar.endpoint.addr;
    let refused_before = sidecar.series(TOTAL_REFUSED).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = rss_sampler(sidecar.proc.pid, stop.clone());
    let total = plan.max_connections + plan.beyond_cap;
    let per_address = plan.per_peer.saturating_sub(1).max(1);
    let until = Instant::now() + plan.header_read + Duration::from_secs(15);
    let head = Arc::new(incomplete_head(&sidecar.endpoint, plan.head_bytes));
    let handles: Vec<_> = (0..total)
        .map(|i| {
            attacker(
                saturation_source(i / per_address),
                to,
                head.clone(),
                None,
                until,
            )
        })
        .collect();
    result.saturation_opened = total;
    // Watch the open connections until the wave has been let go.
    while !handles.iter().all(|h| h.is_finished()) && Instant::now() < until {
        let open = sidecar.series("lifeguard_connections_open").await?;
        result.saturation_open_peak = result.saturation_open_peak.max(open);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    result.saturation_held = fates(handles)
        .await
        .into_iter()
        .filter(|f| *f != Fate::Closed)
        .count();
    stop.store(true, Ordering::Relaxed);
    result.saturation_peak_kib = sampler.await.unwrap_or(0);
    result.saturation_refused = (sidecar.series(TOTAL_REFUSED).await? - refused_before) as u64;
    if result.saturation_held > 0 {
        result.errors.record(format!(
            "exhaustion: {} saturating connections still held at the end",
            result.saturation_held
        ));
    }
    match greet_once(&sidecar.endpoint, greet).await {
        Ok(_) => result.recovered = true,
        Err(why) => result
            .errors
            .record(format!("exhaustion: greet after the saturation: {why}")),
    }
    Ok(())
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

impl ExhaustionResult {
    /// Peak VmRSS over the whole phase (the fresh process's high-water mark), MiB.
    pub fn peak_mib(&self) -> f64 {
        mib(self
            .hwm_kib
            .max(self.attack_peak_kib)
            .max(self.saturation_peak_kib))
    }

    /// The documented bound over the idle memory measured before the attack, MiB.
    pub fn bound_mib(&self) -> f64 {
        let idle = mib(self.idle.rss_kib);
        self.plan.as_ref().map_or(0.0, |p| p.bound_mib(idle))
    }

    pub fn target(&self) -> Target {
        let bound = self.bound_mib();
        Target {
            name: "sidecar VmRSS peak under an unauthenticated connection flood (documented bound)"
                .into(),
            measured: self.peak_mib(),
            limit: (bound * 10.0).round() / 10.0,
            unit: "MiB",
            at_least: false,
            not_applicable: None,
        }
    }

    pub fn table(&self) -> String {
        let Some(p) = &self.plan else {
            return String::new();
        };
        let g = &self.greets;
        format!(
            "exhaustion: a fresh sidecar, limits {} connections, {} per peer, header read {:?}, \
             body read {:?}\n\
             \x20 token-less, 4 MiB announced, 1 KiB sent  {:>5} from 127.0.0.2: {} answered 401 \
             and closed{}\n\
             \x20 half-sent request heads                  {:>5} from 127.0.0.3: {} refused at \
             accept (per-peer cap), {} closed at the header-read timeout, {} still held\n\
             \x20 greet meanwhile (127.0.0.1, new connection each): {} ok, {} failed, p50 {} µs, \
             max {} µs\n\
             \x20 saturation: {} incomplete {} KiB heads from many addresses: at most {} open at \
             once, {} refused (max_connections), {} still held; greet afterwards: {}\n\
             \x20 sidecar VmRSS: idle {:.1} MiB, peak {:.1} MiB in the attack, {:.1} MiB at the \
             cap; VmHWM {:.1} MiB; bound: idle + {} × {} KiB = {:.1} MiB\n\n",
            p.max_connections,
            p.per_peer,
            p.header_read,
            p.body_read,
            p.token_less,
            self.token_less_401_closed,
            if self.token_less_other.is_empty() {
                String::new()
            } else {
                format!(", other: {}", self.token_less_other.join(", "))
            },
            p.half_sent,
            self.half_sent_refused,
            self.half_sent_timed_out,
            self.half_sent_held,
            g.n,
            self.greet_failures,
            us(g.p50),
            us(g.max),
            self.saturation_opened,
            p.head_bytes / 1024,
            self.saturation_open_peak,
            self.saturation_refused,
            self.saturation_held,
            if self.recovered { "ok" } else { "FAILED" },
            mib(self.idle.rss_kib),
            mib(self.attack_peak_kib),
            mib(self.saturation_peak_kib),
            mib(self.hwm_kib),
            p.max_connections,
            CONNECTION_ALLOWANCE_KIB,
            self.bound_mib(),
        )
    }

    pub fn to_json(&self) -> Value {
        json!({
            "plan": self.plan.as_ref().map(ExhaustionPlan::to_json),
            "idle": self.idle.to_json(),
            "attack_peak_rss_kib": self.attack_peak_kib,
            "saturation_peak_rss_kib": self.saturation_peak_kib,
            "vm_hwm_kib": self.hwm_kib,
            "bound_mib": self.bound_mib(),
            "token_less_answered_401_and_closed": self.token_less_401_closed,
            "token_less_other": self.token_less_other,
            "half_sent_refused": self.half_sent_refused,
            "half_sent_timed_out": self.half_sent_timed_out,
            "half_sent_held": self.half_sent_held,
            "greet_during_attack": self.greets.to_json(),
            "greet_failures": self.greet_failures,
            "saturation_opened": self.saturation_opened,
            "saturation_open_peak": self.saturation_open_peak,
            "saturation_refused": self.saturation_refused,
            "saturation_held": self.saturation_held,
            "recovered": self.recovered,
        })
    }
}
