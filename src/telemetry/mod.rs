//! Logs and metrics.

pub mod metrics;
pub mod striped;

use tracing_subscriber::EnvFilter;

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
