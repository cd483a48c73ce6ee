//! The listen phase: many concurrent `subscriptions/listen` streams, resource events fanned out
//! to them at a fixed delivery rate, measured directly against the example server and through
//! the sidecar, one lane after the other.
//!
//! Stream `i` subscribes to `example://bench/g{i % groups}`; every tick the emitter asks the
//! example server (`POST /_example/emit`) for one `resources/updated` event of the next group,
//! so each event reaches `streams / groups` listeners and deliveries per second =
//! source events per second × fan-out. Per group, events arrive in the order they were emitted,
//! so the k-th receipt on a stream belongs to the k-th emission of its group: delivery latency is
//! receipt time minus the time just before the emit request left. What the sidecar adds is the
//! difference between the lanes.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::bench_support::procs::{Memory, Proc};
use crate::stats::{Added, Summary, us, us_signed};

/// Sizes of the listen phase.
#[derive(Clone, Debug)]
pub struct ListenPlan {
    pub streams: usize,
    /// Distinct subscriptions; fan-out per event = streams / groups.
    pub groups: usize,
    /// Events delivered per second, summed over all streams.
    pub deliveries_per_sec: u32,
    /// Emission time excluded from the latency samples (connections warm up).
    pub warmup: Duration,
    /// Emission time measured.
    pub duration: Duration,
}

impl ListenPlan {
    pub fn fan_out(&self) -> usize {
        (self.streams / self.groups.max(1)).max(1)
    }

    /// Source events emitted per second.
    pub fn events_per_sec(&self) -> f64 {
        f64::from(self.deliveries_per_sec) / self.fan_out() as f64
    }

    pub fn to_json(&self) -> Value {
        json!({
            "streams": self.streams, "groups": self.groups, "fan_out": self.fan_out(),
            "deliveries_per_second": self.deliveries_per_sec,
            "source_events_per_second": self.events_per_sec(),
            "warmup_seconds": self.warmup.as_secs_f64(), "seconds": self.duration.as_secs_f64(),
        })
    }
}

/// One lane's outcome.
pub struct ListenLane {
    pub name: &'static str,
    pub latency: Summary,
    /// Deliveries the emissions called for, and those that arrived.
    pub expected: u64,
    pub delivered: u64,
    /// Seconds from the first listen request to the last acknowledgement.
    pub open_secs: f64,
    /// CPU of the sidecar and the example server over the emission window, in cores.
    pub sidecar_cores: f64,
    pub server_cores: f64,
    /// Peak sidecar VmRSS sampled during the lane, with every stream open before emission,
    /// and before the first stream opened.
    pub sidecar_rss_peak: Memory,
    pub sidecar_rss_open: Memory,
    pub sidecar_rss_before: Memory,
}

impl ListenLane {
    /// KiB of sidecar VmRSS per open stream (open − before, over the streams).
    pub fn kib_per_stream(&self, streams: usize) -> f64 {
        self.sidecar_rss_open
            .rss_kib
            .saturating_sub(self.sidecar_rss_before.rss_kib) as f64
            / streams.max(1) as f64
    }
}

/// The lanes and what the sidecar adds.
pub struct ListenResult {
    pub plan: ListenPlan,
    pub direct: ListenLane,
    pub via: ListenLane,
    pub added: Added,
    /// Every stream over one HTTP/2 connection to a sidecar of its own (`--client-http2 on`),
    /// and what it adds over the direct lane.
    pub via_http2: Option<(ListenLane, Added)>,
}

/// What the lane talks to.
pub struct LaneTarget<'a> {
    pub name: &'static str,
    /// The MCP endpoint (`http://…/mcp`) the streams open on.
    pub url: String,
    /// The example server's base URL, for `/_example/emit`.
    pub server_base: String,
    pub tokens: &'a [String],
    pub sidecar: &'a Proc,
    pub server: &'a Proc,
    pub ticks_per_sec: u64,
    /// The streams' client speaks HTTP/2 by prior knowledge: one connection carries them all.
    pub http2: bool,
}

fn group_uri(group: usize) -> String {
    format!("example://bench/g{group}")
}

fn listen_body(id: usize, group: usize) -> String {
    json!({"jsonrpc": "2.0", "id": format!("bench-{id}"), "method": "subscriptions/listen",
        "params": {"notifications": {"resourceSubscriptions": [group_uri(group)]},
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": {}}}})
    .to_string()
}

/// Splits complete SSE events off `buffer`; returns how many carried a resource update.
fn take_updates(buffer: &mut String) -> usize {
    let mut n = 0;
    while let Some(end) = buffer.find("\n\n") {
        if buffer[..end].contains("notifications/resources/updated") {
            n += 1;
        }
        buffer.drain(..end + 2);
    }
    n
}

/// Opens one stream and waits for its acknowledgement.
async fn open(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    id: usize,
    group: usize,
) -> Result<(reqwest::Response, String)> {
    let mut response = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "subscriptions/listen")
        .header("authorization", format!("Bearer {token}"))
        .body(listen_body(id, group))
        .send()
        .await
        .context("listen request")?;
    if response.status() != 200 {
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        bail!("listen stream {id}: HTTP {status}: {body}");
    }
    let mut buffer = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !buffer.contains("notifications/subscriptions/acknowledged") {
        let chunk = tokio::time::timeout_at(deadline, response.chunk())
            .await
            .context("waiting for the acknowledgement")??
            .context("stream ended before the acknowledgement")?;
        buffer.push_str(&String::from_utf8_lossy(&chunk));
    }
    let end = buffer
        .find("notifications/subscriptions/acknowledged")
        .and_then(|at| buffer[at..].find("\n\n").map(|e| at + e + 2))
        .unwrap_or(buffer.len());
    buffer.drain(..end);
    Ok((response, buffer))
}

/// Reads a stream until `stop`, returning the receipt time of every resource update.
async fn read(
    mut response: reqwest::Response,
    mut buffer: String,
    mut stop: watch::Receiver<bool>,
) -> Vec<Instant> {
    let mut receipts = Vec::new();
    for _ in 0..take_updates(&mut buffer) {
        receipts.push(Instant::now());
    }
    loop {
        tokio::select! {
            chunk = response.chunk() => match chunk {
                Ok(Some(chunk)) => {
                    let at = Instant::now();
                    buffer.push_str(&String::from_utf8_lossy(&chunk));
                    for _ in 0..take_updates(&mut buffer) {
                        receipts.push(at);
                    }
                }
                _ => return receipts,
            },
            _ = stop.changed() => return receipts,
        }
    }
}

/// Runs one lane: opens every stream, emits for warmup + duration, and matches receipts to
/// emissions.
pub async fn run_lane(plan: &ListenPlan, target: &LaneTarget<'_>) -> Result<ListenLane> {
    let streams = if target.http2 {
        reqwest::Client::builder().http2_prior_knowledge()
    } else {
        reqwest::Client::builder().pool_max_idle_per_host(0)
    };
    let streams = streams.build().context("HTTP client")?;
    // Emissions go to the example server over HTTP/1.1 whatever the lane.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .context("HTTP client")?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let sidecar_rss_before = target.sidecar.try_memory()?;
    let opened_at = Instant::now();
    let mut readers = Vec::with_capacity(plan.streams);
    // Open in batches: a thousand simultaneous connects measure the accept queue, not listen.
    for batch_start in (0..plan.streams).step_by(100) {
        let batch = batch_start..(batch_start + 100).min(plan.streams);
        let opened = futures_util::future::join_all(batch.map(|i| {
            let token = &target.tokens[i % target.tokens.len()];
            open(&streams, &target.url, token, i, i % plan.groups)
        }))
        .await;
        for (offset, result) in opened.into_iter().enumerate() {
            let (response, buffer) = result?;
            let i = batch_start + offset;
            let handle = tokio::spawn(read(response, buffer, stop_rx.clone()));
            readers.push((i % plan.groups, handle));
        }
    }
    let open_secs = opened_at.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sidecar_rss_open = target.sidecar.try_memory()?;

    // Emit: one event per tick, groups in turn.
    let interval = Duration::from_secs_f64(1.0 / plan.events_per_sec().max(1e-3));
    let emit_url = format!("{}/_example/emit", target.server_base);
    let mut emitted: Vec<Vec<Instant>> = vec![Vec::new(); plan.groups];
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    let measure_from = started + plan.warmup;
    let end = measure_from + plan.duration;
    let mut rss_peak = sidecar_rss_open;
    let mut last_rss = Instant::now();
    let (mut sidecar_ticks, mut server_ticks) = (0, 0);
    let mut tick = 0usize;
    let mut in_window = false;
    while Instant::now() < end {
        ticker.tick().await;
        if !in_window && Instant::now() >= measure_from {
            in_window = true;
            sidecar_ticks = target.sidecar.cpu_ticks();
            server_ticks = target.server.cpu_ticks();
        }
        let group = tick % plan.groups;
        tick += 1;
        emitted[group].push(Instant::now());
        let response = http
            .post(&emit_url)
            .json(&json!({"kind": "resourceUpdated", "uri": group_uri(group)}))
            .send()
            .await
            .context("emit request")?;
        if !response.status().is_success() {
            bail!("emit answered HTTP {}", response.status());
        }
        if last_rss.elapsed() >= Duration::from_millis(250) {
            last_rss = Instant::now();
            let now = target.sidecar.try_memory()?;
            if now.rss_kib > rss_peak.rss_kib {
                rss_peak = now;
            }
        }
    }
    let window = measure_from.elapsed().as_secs_f64().max(1e-9);
    let ticks_per_sec = target.ticks_per_sec.max(1) as f64;
    let sidecar_cores =
        target.sidecar.cpu_ticks().saturating_sub(sidecar_ticks) as f64 / ticks_per_sec / window;
    let server_cores =
        target.server.cpu_ticks().saturating_sub(server_ticks) as f64 / ticks_per_sec / window;
    // Let the last deliveries land, then stop the readers.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let _ = stop_tx.send(true);

    let mut samples = Vec::new();
    let (mut expected, mut delivered) = (0u64, 0u64);
    for (group, handle) in readers {
        let receipts = handle.await.context("reader task")?;
        let emissions = &emitted[group];
        expected += emissions.len() as u64;
        delivered += receipts.len().min(emissions.len()) as u64;
        for (sent, got) in emissions.iter().zip(&receipts) {
            if *sent >= measure_from {
                samples.push(got.saturating_duration_since(*sent).as_nanos() as u64);
            }
        }
    }
    Ok(ListenLane {
        name: target.name,
        latency: Summary::of(&mut samples),
        expected,
        delivered,
        open_secs,
        sidecar_cores,
        server_cores,
        sidecar_rss_peak: rss_peak,
        sidecar_rss_open,
        sidecar_rss_before,
    })
}

impl ListenResult {
    pub fn new(
        plan: ListenPlan,
        direct: ListenLane,
        via: ListenLane,
        via_http2: Option<ListenLane>,
    ) -> Self {
        let added = Added::between(&direct.latency, &via.latency);
        let via_http2 = via_http2.map(|lane| {
            let added = Added::between(&direct.latency, &lane.latency);
            (lane, added)
        });
        Self {
            plan,
            direct,
            via,
            added,
            via_http2,
        }
    }

    /// The lanes through a sidecar: HTTP/1.1, then HTTP/2 when it ran.
    pub fn sidecar_lanes(&self) -> impl Iterator<Item = (&ListenLane, &Added)> {
        std::iter::once((&self.via, &self.added))
            .chain(self.via_http2.as_ref().map(|(lane, added)| (lane, added)))
    }

    /// Lines for the report table.
    pub fn table(&self) -> String {
        let p = &self.plan;
        let mut o = format!(
            "listen: {} streams, {} deliveries/s ({:.0} events/s × fan-out {}), {:.0} s measured\n",
            p.streams,
            p.deliveries_per_sec,
            p.events_per_sec(),
            p.fan_out(),
            p.duration.as_secs_f64()
        );
        let lanes = [
            Some(&self.direct),
            Some(&self.via),
            self.via_http2.as_ref().map(|(l, _)| l),
        ];
        for lane in lanes.into_iter().flatten() {
            let s = &lane.latency;
            o.push_str(&format!(
                "  {:<22} delivered {:>7}/{:<7} p50 {:>8}  p99 {:>8}  p99.9 {:>8}  opened in {:.1} s  sidecar {:.2} cores  server {:.2} cores\n",
                lane.name,
                lane.delivered,
                lane.expected,
                us(s.p50),
                us(s.p99),
                us(s.p999),
                lane.open_secs,
                lane.sidecar_cores,
                lane.server_cores,
            ));
        }
        for (lane, a) in self.sidecar_lanes() {
            o.push_str(&format!(
                "  added ({:<16}) p50 {:>8}  p99 {:>8}  p99.9 {:>8}\n",
                lane.name,
                us_signed(a.p50),
                us_signed(a.p99),
                us_signed(a.p999)
            ));
            o.push_str(&format!(
                "  sidecar VmRSS ({}): {:.1} MiB before, {:.1} MiB with every stream open ({:.1} KiB per stream), peak {:.1} MiB while delivering\n",
                lane.name,
                lane.sidecar_rss_before.rss_kib as f64 / 1024.0,
                lane.sidecar_rss_open.rss_kib as f64 / 1024.0,
                lane.kib_per_stream(self.plan.streams),
                lane.sidecar_rss_peak.rss_kib as f64 / 1024.0
            ));
        }
        o
    }

    pub fn to_json(&self) -> Value {
        let lane = |l: &ListenLane| {
            json!({
                "lane": l.name, "latency": l.latency.to_json(), "expected": l.expected,
                "delivered": l.delivered, "open_seconds": l.open_secs,
                "sidecar_cores": l.sidecar_cores, "server_cores": l.server_cores,
                "sidecar_rss_open": l.sidecar_rss_open.to_json(),
                "sidecar_rss_peak": l.sidecar_rss_peak.to_json(),
                "sidecar_rss_before": l.sidecar_rss_before.to_json(),
                "kib_per_stream": l.kib_per_stream(self.plan.streams),
            })
        };
        json!({
            "plan": self.plan.to_json(),
            "direct": lane(&self.direct),
            "via_sidecar": lane(&self.via),
            "added": self.added.to_json(),
            "via_sidecar_http2": self.via_http2.as_ref().map(|(l, _)| lane(l)),
            "added_http2": self.via_http2.as_ref().map(|(_, a)| a.to_json()),
        })
    }

    /// Deliveries that never arrived, in any lane.
    pub fn lost(&self) -> u64 {
        let lost = |l: &ListenLane| l.expected - l.delivered;
        lost(&self.direct) + self.sidecar_lanes().map(|(l, _)| lost(l)).sum::<u64>()
    }
}

/// Tokens for the listeners: streams are spread over principals so the per-principal cap
/// (`maxStreamsPerPrincipal` in the bench policy) is not what is measured.
pub fn principals_needed(streams: usize, per_principal: usize) -> usize {
    streams.div_ceil(per_principal.max(1))
}
