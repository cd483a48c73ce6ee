//! The OpenTelemetry trace pipeline of a serving subcommand: the SDK's tracer provider with the
//! configured sampler and resource, a batch span processor, and the OTLP exporter over the
//! configured protocol. Built only when `otel_config` says spans are exported; otherwise nothing
//! here runs and no span leaves the process.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};

use super::otel_config::{OtelConfig, OtlpProtocol, SamplerChoice};

static EXPORTING: AtomicBool = AtomicBool::new(false);
/// The tracer of the spans recorded with the OpenTelemetry API directly (a request's spans,
/// `spans`), set once by [`install`]: looked up per request through the global provider it
/// would cost a lock and an allocation.
static TRACER: OnceLock<opentelemetry_sdk::trace::Tracer> = OnceLock::new();

/// The tracer [`install`] made, when spans are exported.
pub fn tracer() -> Option<&'static opentelemetry_sdk::trace::Tracer> {
    TRACER.get().filter(|_| exporting())
}

/// Whether spans are exported. The request path asks before doing any tracing work, so with no
/// endpoint it does nothing it did not do before.
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// Flushes and stops the exporter when dropped (at shutdown, so the last spans are sent). Drop
/// it outside any async context: it owns the exporter's runtime.
pub struct OtelGuard {
    provider: SdkTracerProvider,
    /// One thread of its own where the gRPC client's connection lives, whatever runtime the
    /// subcommand runs (the batch processor exports from a thread of its own).
    _runtime: tokio::runtime::Runtime,
}

impl Drop for OtelGuard {
    fn drop(&mut self) {
        EXPORTING.store(false, Ordering::Relaxed);
        if let Err(e) = self.provider.shutdown() {
            eprintln!("OpenTelemetry: flushing the last spans failed: {e}");
        }
    }
}

fn sampler(choice: SamplerChoice) -> Sampler {
    match choice {
        SamplerChoice::AlwaysOn => Sampler::AlwaysOn,
        SamplerChoice::AlwaysOff => Sampler::AlwaysOff,
        SamplerChoice::TraceIdRatio(r) => Sampler::TraceIdRatioBased(r),
        SamplerChoice::ParentBasedAlwaysOn => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
        SamplerChoice::ParentBasedAlwaysOff => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
        SamplerChoice::ParentBasedTraceIdRatio(r) => {
            Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(r)))
        }
    }
}

/// Builds the provider for `config`, installs the W3C Trace Context propagator, and returns the
/// `tracing` layer that turns the crate's spans into OpenTelemetry spans, with the guard that
/// flushes them.
pub fn install<S>(
    config: &OtelConfig,
) -> Result<(
    tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>,
    OtelGuard,
)>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("otel-export")
        .enable_all()
        .build()
        .context("starting the OpenTelemetry exporter's thread")?;
    let entered = runtime.enter();
    let exporter = match config.protocol {
        OtlpProtocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(&config.endpoint)
            .build(),
        OtlpProtocol::HttpProtobuf | OtlpProtocol::HttpJson => {
            let protocol = if config.protocol == OtlpProtocol::HttpJson {
                Protocol::HttpJson
            } else {
                Protocol::HttpBinary
            };
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(protocol)
                .with_endpoint(&config.endpoint)
                .build()
        }
    }
    .with_context(|| {
        format!(
            "building the OTLP {} exporter for {}",
            config.protocol, config.endpoint
        )
    })?;
    // Resource::builder() also reads OTEL_RESOURCE_ATTRIBUTES; the service name is ours.
    let resource = Resource::builder()
        .with_service_name(config.service_name.clone())
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(sampler(config.sampler))
        .with_resource(resource)
        .build();
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    // Also the global provider, for any library instrumented with the OpenTelemetry API. Ours
    // use `TRACER` (a request's spans, `spans`) and the `tracing` layer below (the spans of a
    // revocation's trace, a listen delivery, a cancellation retried from the outbox).
    opentelemetry::global::set_tracer_provider(provider.clone());
    drop(entered);
    let tracer = provider.tracer("lifeguard");
    let _ = TRACER.set(tracer.clone());
    EXPORTING.store(true, Ordering::Relaxed);
    // Only what the spans say: no source location, thread, target or busy/idle attributes on
    // every span (each one more to build and encode). A `tracing` span that is entered is the
    // current OpenTelemetry context too, where the spans recorded with the API directly (the
    // ledger's, an upstream `tasks/cancel`'s) and `spans::audit` find it; no request span is a
    // `tracing` span, so this costs the request path nothing.
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_tracked_inactivity(false)
        .with_context_activation(true);
    Ok((
        layer,
        OtelGuard {
            provider,
            _runtime: runtime,
        },
    ))
}
