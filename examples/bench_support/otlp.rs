//! An OTLP trace receiver for the benchmarks: gRPC `TraceService/Export` and HTTP/protobuf
//! (`POST /v1/traces`) on loopback, on a thread and runtime of its own (so its work competes
//! neither with the benchmark's client runtime nor, being in the benchmark's process, with the
//! CPU measured of the process under test). It decodes what the exporter sends with the
//! protocol's own generated types (`opentelemetry-proto`) and keeps only counts: spans by name
//! and kind, and export requests.
//!
//! The test suite's receiver (`tests/it/support/otlp.rs`) keeps every span with its attributes
//! and also speaks HTTP/JSON; a benchmark needs proof that spans arrived and how many, at a
//! rate of tens of thousands per second.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use lifeguard::telemetry::otel_config::OtlpProtocol;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use serde_json::{Value, json};

/// OTLP's `SpanKind` of a server span.
pub const SPAN_KIND_SERVER: i32 = 2;

/// What arrived so far.
#[derive(Default)]
struct Counts {
    spans: AtomicU64,
    exports: AtomicU64,
    /// (span name, kind) → spans.
    by_name: Mutex<BTreeMap<(String, i32), u64>>,
}

impl Counts {
    /// Counts the spans of one export request.
    fn record(&self, request: ExportTraceServiceRequest) {
        let mut n = 0;
        {
            let mut by_name = self.by_name.lock().unwrap_or_else(|e| e.into_inner());
            let spans = request
                .resource_spans
                .into_iter()
                .flat_map(|r| r.scope_spans)
                .flat_map(|s| s.spans);
            for span in spans {
                n += 1;
                *by_name.entry((span.name, span.kind)).or_default() += 1;
            }
        }
        self.spans.fetch_add(n, Ordering::Relaxed);
        self.exports.fetch_add(1, Ordering::Relaxed);
    }
}

struct Grpc(Arc<Counts>);

#[tonic::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.record(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// `POST /v1/traces` with an HTTP/protobuf body: counted like a gRPC export, answered with
/// an empty `ExportTraceServiceResponse` (a body it cannot decode is a 400, which the exporter
/// reports).
async fn http_export(
    axum::extract::State(counts): axum::extract::State<Arc<Counts>>,
    body: axum::body::Bytes,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    use prost::Message;
    match ExportTraceServiceRequest::decode(body) {
        Ok(request) => {
            counts.record(request);
            let answer = ExportTraceServiceResponse {
                partial_success: None,
            };
            (
                [(http::header::CONTENT_TYPE, "application/x-protobuf")],
                answer.encode_to_vec(),
            )
                .into_response()
        }
        Err(e) => (http::StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    }
}

/// The protocols this receiver speaks, as `--tracing-protocol` names them (the exporter's own
/// spelling, `OTEL_EXPORTER_OTLP_PROTOCOL`): gRPC and HTTP/protobuf, not HTTP/JSON.
pub fn parse_protocol(text: &str) -> Result<OtlpProtocol, String> {
    match OtlpProtocol::parse(text) {
        Some(protocol @ (OtlpProtocol::Grpc | OtlpProtocol::HttpProtobuf)) => Ok(protocol),
        _ => Err(format!("{text}: expected grpc or http/protobuf")),
    }
}

/// The receiver; stopped when dropped.
pub struct OtlpReceiver {
    /// gRPC.
    pub addr: SocketAddr,
    /// HTTP/protobuf (`POST /v1/traces`).
    pub http_addr: SocketAddr,
    counts: Arc<Counts>,
    stop: Option<tokio::sync::watch::Sender<bool>>,
    thread: Option<JoinHandle<()>>,
}

fn loopback_listener(what: &str) -> Result<(std::net::TcpListener, SocketAddr)> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .with_context(|| format!("binding the OTLP receiver's {what} port"))?;
    listener
        .set_nonblocking(true)
        .context("the OTLP receiver's socket")?;
    let addr = listener
        .local_addr()
        .context("the OTLP receiver's address")?;
    Ok((listener, addr))
}

impl OtlpReceiver {
    /// Binds two ports on 127.0.0.1 (gRPC, HTTP) and serves on a thread of its own.
    pub fn start() -> Result<Self> {
        let (grpc_listener, addr) = loopback_listener("gRPC")?;
        let (http_listener, http_addr) = loopback_listener("HTTP")?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("building the OTLP receiver's runtime")?;
        let counts = Arc::new(Counts::default());
        let service = TraceServiceServer::new(Grpc(counts.clone()));
        let router = axum::Router::new()
            .route("/v1/traces", axum::routing::post(http_export))
            .with_state(counts.clone());
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let thread = std::thread::Builder::new()
            .name("otlp-receiver".into())
            .spawn(move || {
                let until_stopped = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                };
                let grpc_stopped = until_stopped(stopped.clone());
                let grpc = async move {
                    let listener = tokio::net::TcpListener::from_std(grpc_listener)?;
                    let incoming = tonic::transport::server::TcpIncoming::from(listener);
                    tonic::transport::Server::builder()
                        .add_service(service)
                        .serve_with_incoming_shutdown(incoming, grpc_stopped)
                        .await
                        .map_err(std::io::Error::other)
                };
                let http = async move {
                    let listener = tokio::net::TcpListener::from_std(http_listener)?;
                    axum::serve(listener, router)
                        .with_graceful_shutdown(until_stopped(stopped))
                        .await
                };
                let (grpc, http) = runtime.block_on(async { tokio::join!(grpc, http) });
                for e in [grpc.err(), http.err()].into_iter().flatten() {
                    eprintln!("OTLP receiver: {e}");
                }
            })
            .context("starting the OTLP receiver's thread")?;
        Ok(Self {
            addr,
            http_addr,
            counts,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The `OTEL_*` variables that send a process's spans here over `protocol`.
    pub fn env(&self, protocol: OtlpProtocol) -> Vec<(String, String)> {
        let addr = match protocol {
            OtlpProtocol::Grpc => self.addr,
            OtlpProtocol::HttpProtobuf | OtlpProtocol::HttpJson => self.http_addr,
        };
        vec![
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
                format!("http://{addr}"),
            ),
            ("OTEL_EXPORTER_OTLP_PROTOCOL".into(), protocol.to_string()),
        ]
    }

    /// Spans received so far.
    pub fn spans(&self) -> u64 {
        self.counts.spans.load(Ordering::Relaxed)
    }

    /// Export requests received so far.
    pub fn exports(&self) -> u64 {
        self.counts.exports.load(Ordering::Relaxed)
    }

    /// Spans received so far named `name` of `kind` (OTLP's `SpanKind`).
    pub fn spans_named(&self, name: &str, kind: i32) -> u64 {
        let by_name = self
            .counts
            .by_name
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        by_name.get(&(name.to_owned(), kind)).copied().unwrap_or(0)
    }

    /// Spans by name and kind, most first, as JSON.
    pub fn to_json(&self) -> Value {
        let by_name = self
            .counts
            .by_name
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut rows: Vec<_> = by_name.iter().collect();
        rows.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        json!({
            "spans": self.spans(),
            "exports": self.exports(),
            "by_name": rows.into_iter()
                .map(|((name, kind), n)| json!({"name": name, "kind": kind, "spans": n}))
                .collect::<Vec<_>>(),
        })
    }

    /// Waits until `done` says the spans received are complete, or until no span has arrived
    /// for `quiet` (the exporter has nothing more to send), at most `within`; returns whether
    /// `done` was reached.
    pub async fn settle(
        &self,
        done: impl Fn(&Self) -> bool,
        quiet: Duration,
        within: Duration,
    ) -> bool {
        let deadline = Instant::now() + within;
        let (mut last, mut since) = (self.spans(), Instant::now());
        loop {
            if done(self) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline || now - since >= quiet {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            let spans = self.spans();
            if spans != last {
                (last, since) = (spans, Instant::now());
            }
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
