//! The open-loop load: request `i` is due at `start + i / rate`, whatever happened to the
//! requests before it, and its latency runs from that scheduled instant to the last byte of
//! the answer — so a stall of the webhook (or of this client) shows in the latency of every
//! request that should have been sent meanwhile (no coordinated omission).
//!
//! A dedicated thread keeps the schedule: it builds request `i`'s body ahead of time, sleeps
//! (nanosleep, not tokio's millisecond timer) until the instant, and hands the request to the
//! async runtime, where it runs concurrently with any still waiting for an answer. The client
//! reuses connections as kube-apiserver does with admission webhooks: HTTP/1.1 keep-alive over
//! TLS, a new connection only when every open one is busy (the webhook negotiates HTTP/1.1
//! only: docs/operations.md, "Listener limits").

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use serde_json::Value;

use crate::reviews::{self, Kind};

/// How the load runs.
#[derive(Clone, Debug)]
pub struct Schedule {
    /// Requests per second.
    pub rate: f64,
    /// Unmeasured load before the measured window.
    pub warmup: Duration,
    /// The measured window.
    pub duration: Duration,
    /// Per-request timeout (kube-apiserver's default webhook timeout is 10 s).
    pub timeout: Duration,
}

impl Schedule {
    /// Requests in the warm-up.
    pub fn warmup_requests(&self) -> u64 {
        (self.warmup.as_secs_f64() * self.rate).round() as u64
    }

    /// The measured window's bounds: the first measured request's due instant, and the end
    /// of the schedule.
    pub fn window(&self, start: Instant) -> (Instant, Instant) {
        (
            self.due(start, self.warmup_requests()),
            start + self.warmup + self.duration,
        )
    }

    /// Requests in the warm-up and the measured window.
    pub fn total_requests(&self) -> u64 {
        self.warmup_requests() + (self.duration.as_secs_f64() * self.rate).round() as u64
    }

    /// When request `index` is due, `start` being request 0's instant.
    pub fn due(&self, start: Instant, index: u64) -> Instant {
        start + Duration::from_secs_f64(index as f64 / self.rate)
    }
}

/// One request and what became of it.
#[derive(Clone, Debug)]
pub struct Sample {
    pub kind: Kind,
    /// Inside the measured window (not warm-up).
    pub measured: bool,
    /// From the scheduled instant to the last byte of the answer (or the failure).
    pub latency: Duration,
    /// From the scheduled instant to the request's task starting: the generator's own delay,
    /// included in `latency`.
    pub lag: Duration,
    /// `Err` says what was wrong with the answer.
    pub outcome: Result<(), String>,
    /// The HTTP version of the answer (`HTTP/1.1`, `HTTP/2.0`), when there was one.
    pub version: Option<String>,
    /// When the answer was read (or the request failed).
    pub finished: Instant,
}

/// The client, as kube-apiserver dials an admission webhook.
pub fn client(tls: rustls::ClientConfig, timeout: Duration) -> Result<reqwest::Client> {
    let mut tls = tls;
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let builder = reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .timeout(timeout)
        // client-go's transport keeps up to 25 idle connections per host.
        .pool_max_idle_per_host(25)
        .tcp_nodelay(true);
    builder
        .http1_only()
        .build()
        .context("building the HTTPS client")
}

async fn shot(
    client: reqwest::Client,
    url: String,
    body: Bytes,
    kind: Kind,
    index: u64,
    due: Instant,
    measured: bool,
) -> Sample {
    let lag = Instant::now().saturating_duration_since(due);
    let answer = async {
        let response = client
            .post(&url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| format!("POST {url}: {e}"))?;
        let status = response.status();
        let version = format!("{:?}", response.version());
        let bytes = response
            .bytes()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?;
        Ok::<_, String>((status, version, bytes))
    }
    .await;
    let finished = Instant::now();
    let latency = finished.saturating_duration_since(due);
    let (outcome, version) = match answer {
        Err(e) => (Err(e), None),
        Ok((status, version, _)) if status != http::StatusCode::OK => {
            (Err(format!("HTTP {status} from {url}")), Some(version))
        }
        Ok((_, version, bytes)) => (reviews::check(kind, index, &bytes), Some(version)),
    };
    Sample {
        kind,
        measured,
        latency,
        lag,
        outcome,
        version,
        finished,
    }
}

/// Runs the whole schedule against `base_url` (`https://host:port`), request 0 due at
/// `start`; returns every request's sample once each has been answered or has failed.
pub async fn drive(
    schedule: &Schedule,
    start: Instant,
    client: reqwest::Client,
    base_url: &str,
    exception_spec: Arc<Value>,
) -> Result<Vec<Sample>> {
    let schedule = schedule.clone();
    let total = schedule.total_requests();
    let warm = schedule.warmup_requests();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Sample>();
    let runtime = tokio::runtime::Handle::current();
    let base = base_url.to_owned();
    let pacer = std::thread::Builder::new()
        .name("pacer".into())
        .spawn(move || {
            for index in 0..total {
                if tx.is_closed() {
                    return;
                }
                let kind = reviews::kind_of(index);
                let review = reviews::review(kind, index, &exception_spec);
                let body = Bytes::from(serde_json::to_vec(&review).unwrap_or_default());
                let url = format!("{base}{}", kind.endpoint().path());
                let due = schedule.due(start, index);
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                let tx = tx.clone();
                let client = client.clone();
                runtime.spawn(async move {
                    let sample = shot(client, url, body, kind, index, due, index >= warm).await;
                    let _ = tx.send(sample);
                });
            }
        })
        .context("starting the pacer thread")?;
    let mut samples = Vec::with_capacity(total as usize);
    while let Some(sample) = rx.recv().await {
        samples.push(sample);
    }
    let _ = pacer.join();
    Ok(samples)
}

/// Answers per HTTP version.
pub fn versions(samples: &[Sample]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for s in samples {
        if let Some(v) = &s.version {
            *out.entry(v.clone()).or_insert(0) += 1;
        }
    }
    out
}

/// Established TCP connections whose local port is `port` (the webhook's side of each client
/// connection), from /proc/net/tcp and /proc/net/tcp6.
pub fn established_to(port: u16) -> usize {
    let wanted = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .map(|path| {
            std::fs::read_to_string(path)
                .unwrap_or_default()
                .lines()
                .skip(1)
                .filter(|line| {
                    let f: Vec<&str> = line.split_whitespace().collect();
                    f.len() > 3 && f[1].ends_with(&wanted) && f[3] == "01"
                })
                .count()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn established_connections_are_counted_by_local_port() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let _a = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let _b = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let _accepted = (listener.accept().unwrap(), listener.accept().unwrap());
        assert_eq!(established_to(port), 2);
    }

    #[test]
    fn the_schedule_spaces_requests_evenly() {
        let s = Schedule {
            rate: 100.0,
            warmup: Duration::from_secs(2),
            duration: Duration::from_secs(3),
            timeout: Duration::from_secs(10),
        };
        assert_eq!(s.warmup_requests(), 200);
        assert_eq!(s.total_requests(), 500);
        let t0 = Instant::now();
        assert_eq!(s.due(t0, 250) - t0, Duration::from_millis(2500));
        assert_eq!(s.due(t0, 1) - t0, Duration::from_millis(10));
    }
}
