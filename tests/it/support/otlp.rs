//! A real OTLP trace receiver on loopback: gRPC (`TraceService/Export`), HTTP/protobuf and
//! HTTP/JSON (`POST /v1/traces`), each decoded with the protocol's own generated types
//! (`opentelemetry-proto`), keeping every span received for the test to inspect.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message;

/// One span as a test reads it (IDs in lowercase hex).
#[derive(Clone, Debug)]
pub struct ReceivedSpan {
    /// `grpc`, `http/protobuf` or `http/json`: how it arrived.
    pub protocol: &'static str,
    pub service: String,
    pub resource: BTreeMap<String, String>,
    pub name: String,
    /// 1 internal, 2 server, 3 client (OTLP's `SpanKind`).
    pub kind: i32,
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    pub attributes: BTreeMap<String, String>,
    /// Names of the span's events (log lines would arrive here if they rode along).
    pub events: Vec<String>,
    /// The span's links to other spans.
    pub links: Vec<ReceivedLink>,
}

/// A span link as a test reads it (IDs in lowercase hex).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceivedLink {
    pub trace_id: String,
    pub span_id: String,
    pub attributes: BTreeMap<String, String>,
}

type Received = Arc<Mutex<Vec<ReceivedSpan>>>;

fn text(value: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        Some(AnyValue::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn record(received: &Received, protocol: &'static str, request: ExportTraceServiceRequest) {
    let mut spans = received.lock().unwrap();
    for resource_spans in request.resource_spans {
        let resource: BTreeMap<String, String> = resource_spans
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
            .collect();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                spans.push(ReceivedSpan {
                    protocol,
                    service: resource.get("service.name").cloned().unwrap_or_default(),
                    resource: resource.clone(),
                    name: span.name,
                    kind: span.kind,
                    trace_id: hex::encode(&span.trace_id),
                    span_id: hex::encode(&span.span_id),
                    parent_span_id: hex::encode(&span.parent_span_id),
                    attributes: span
                        .attributes
                        .iter()
                        .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
                        .collect(),
                    events: span.events.iter().map(|e| e.name.clone()).collect(),
                    links: span
                        .links
                        .iter()
                        .map(|link| ReceivedLink {
                            trace_id: hex::encode(&link.trace_id),
                            span_id: hex::encode(&link.span_id),
                            attributes: link
                                .attributes
                                .iter()
                                .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
                                .collect(),
                        })
                        .collect(),
                });
            }
        }
    }
}

struct Grpc(Received);

#[tonic::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        record(&self.0, "grpc", request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

async fn http_export(
    State(received): State<Received>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, HeaderMap, Vec<u8>) {
    let content_type = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let mut answer = HeaderMap::new();
    answer.insert(http::header::CONTENT_TYPE, content_type.parse().unwrap());
    if content_type.starts_with("application/json") {
        match serde_json::from_slice::<ExportTraceServiceRequest>(&body) {
            Ok(request) => {
                record(&received, "http/json", request);
                (StatusCode::OK, answer, b"{}".to_vec())
            }
            Err(e) => (
                StatusCode::BAD_REQUEST,
                HeaderMap::new(),
                e.to_string().into_bytes(),
            ),
        }
    } else if content_type.starts_with("application/x-protobuf") {
        match ExportTraceServiceRequest::decode(body) {
            Ok(request) => {
                record(&received, "http/protobuf", request);
                let response = ExportTraceServiceResponse {
                    partial_success: None,
                };
                (StatusCode::OK, answer, response.encode_to_vec())
            }
            Err(e) => (
                StatusCode::BAD_REQUEST,
                HeaderMap::new(),
                e.to_string().into_bytes(),
            ),
        }
    } else {
        (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            HeaderMap::new(),
            Vec::new(),
        )
    }
}

pub struct OtlpReceiver {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    received: Received,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl OtlpReceiver {
    pub async fn start() -> Self {
        let received: Received = Arc::default();
        let grpc_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let grpc = grpc_listener.local_addr().unwrap();
        let service = TraceServiceServer::new(Grpc(received.clone()));
        let grpc_task = tokio::spawn(async move {
            let incoming = tokio_stream_listener(grpc_listener);
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming)
                .await;
        });
        let http_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http = http_listener.local_addr().unwrap();
        let router = axum::Router::new()
            .route("/v1/traces", axum::routing::post(http_export))
            .with_state(received.clone());
        let http_task = tokio::spawn(async move {
            let _ = axum::serve(http_listener, router).await;
        });
        Self {
            grpc,
            http,
            received,
            tasks: vec![grpc_task, http_task],
        }
    }

    /// The `OTEL_*` variables that send a process's spans here over `protocol`.
    pub fn env(&self, protocol: &str) -> Vec<(String, String)> {
        let endpoint = match protocol {
            "grpc" => format!("http://{}", self.grpc),
            _ => format!("http://{}", self.http),
        };
        vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL".into(), protocol.into()),
        ]
    }

    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.received.lock().unwrap().clone()
    }

    /// Waits (up to 30 s) until the spans received satisfy `done`, and returns them all.
    pub async fn wait_for(
        &self,
        what: &str,
        done: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Vec<ReceivedSpan> {
        let found = super::eventually(Duration::from_secs(30), async || {
            let spans = self.spans();
            done(&spans).then_some(spans)
        })
        .await;
        found.unwrap_or_else(|| panic!("{what}; received: {:#?}", self.spans()))
    }
}

/// The accepted connections of `listener`, as the stream tonic serves.
fn tokio_stream_listener(
    listener: tokio::net::TcpListener,
) -> impl futures_util::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures_util::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    })
}
