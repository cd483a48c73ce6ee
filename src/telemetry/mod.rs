//! Logs, metrics and traces.

pub mod metrics;
pub mod otel;
pub mod otel_config;
pub mod revocation_spans;
pub mod spans;
pub mod striped;
pub mod task_spans;
pub mod trace_context;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::FilterExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Installs the global tracing subscriber (logs to stderr; stdout is the audit trail's).
/// `RUST_LOG` overrides the default level `info`.
pub fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    // A second init (tests) keeps the first subscriber.
    let _ = result;
}

/// Whether a span or event is this crate's (its target names the crate).
fn is_ours(metadata: &tracing::Metadata<'_>) -> bool {
    metadata.target().starts_with("lifeguard")
}

/// Logs (as [`init_logging`]) and, when the standard `OTEL_*` variables name a collector, trace
/// export (`otel_config`, `otel`) for a serving subcommand whose `service.name` defaults to
/// `default_service`. Keep the guard until the subcommand ends: dropping it flushes the last
/// spans. A variable with a value that makes no sense is an error naming it.
pub fn init(format: LogFormat, default_service: &str) -> anyhow::Result<Option<otel::OtelGuard>> {
    let config = otel_config::from_env(|name| std::env::var(name).ok(), default_service)
        .map_err(anyhow::Error::msg)?;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // The crate's spans are for traces, not logs: the log layer never sees them, so it does not
    // format every span's fields on every request (log lines carry no span context, as they
    // did before spans existed).
    let filter = filter.and(tracing_subscriber::filter::filter_fn(|metadata| {
        !(metadata.is_span() && is_ours(metadata))
    }));
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs = match format {
        LogFormat::Text => logs.with_filter(filter).boxed(),
        LogFormat::Json => logs.json().with_filter(filter).boxed(),
    };
    let mut layers = vec![logs];
    let mut guard = None;
    if let Some(config) = &config {
        let (traces, flush) = otel::install(config)?;
        // Only this crate's spans become OpenTelemetry spans (not hyper's, kube's, ...), and no
        // log event rides along as a span event: logs may name what a span must not.
        let ours = tracing_subscriber::filter::filter_fn(|metadata| {
            metadata.is_span() && is_ours(metadata) && *metadata.level() <= tracing::Level::INFO
        });
        layers.push(traces.with_filter(ours).boxed());
        guard = Some(flush);
    }
    // A second init (tests) keeps the first subscriber.
    let _ = tracing_subscriber::registry().with(layers).try_init();
    if let Some(config) = &config {
        tracing::info!(
            endpoint = %config.endpoint,
            protocol = %config.protocol,
            service = %config.service_name,
            "exporting traces over OTLP"
        );
    }
    Ok(guard)
}
