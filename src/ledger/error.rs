//! What can go wrong in a ledger, keeping the backend's own error as the source.

use crate::model::ModelError;

/// A backend's underlying error, kept as the [`std::error::Error::source`] of a [`LedgerError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A ledger operation's failure.
///
/// Variants that wrap a backend error keep it as their `source` (downcast it to inspect it, e.g.
/// to `rusqlite::Error`) and also repeat its message in their own, so a log line that prints only
/// the top error still says why.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// A storage operation failed: `context` names what the ledger was doing, `source` is the
    /// backend's error.
    #[error("ledger storage error: {context}: {source}")]
    Storage {
        context: String,
        #[source]
        source: BoxError,
    },
    /// The backend could not do its job and has no underlying error to report: one of its own
    /// guarantees broke (a row it just wrote is gone, its writer thread died, a batch was
    /// aborted by another command) or the database refused a required setting.
    #[error("ledger storage error: {0}")]
    Internal(String),
    /// The database was written by a newer schema version than this build supports; it was not
    /// touched.
    #[error(
        "ledger storage error: ledger database has schema version {found}; this build supports \
         up to {supported} (refusing to touch a newer database)"
    )]
    UnsupportedSchema { found: i64, supported: i64 },
    /// The ledger's database cannot be reached right now: the connection was refused or lost,
    /// the pool found no connection in time, or the server is shutting down or starting up.
    /// The request may be retried once the database is back; if the connection broke during a
    /// commit, the write may or may not have landed (the ledger's reconciliation settles which).
    #[error("ledger database unavailable: {context}: {source}")]
    Unavailable {
        context: String,
        #[source]
        source: BoxError,
    },
    #[error("ledger is closed")]
    Closed,
    #[error("no such reservation")]
    NoReservation,
    /// A task ID or secret could not be drawn from the OS random number generator.
    #[error(transparent)]
    Random(#[from] ModelError),
    /// Stored data cannot be read back: the backend reports a damaged database, or a stored value
    /// does not decode. `source` is the backend's or decoder's error, when there is one.
    #[error("stored data is corrupt: {context}{}", suffix(source.as_ref()))]
    Corrupt {
        context: String,
        #[source]
        source: Option<BoxError>,
    },
    /// The request breaks the contract (e.g. a terminal status passed to `observe`); nothing
    /// was written.
    #[error("invalid ledger request: {0}")]
    InvalidArgument(String),
}

/// `": <cause>"`, or nothing without a cause.
fn suffix(cause: Option<&BoxError>) -> String {
    cause.map(|c| format!(": {c}")).unwrap_or_default()
}

impl LedgerError {
    /// A failed storage operation: what the ledger was doing, and the backend's error.
    pub fn storage(context: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Storage {
            context: context.into(),
            source: source.into(),
        }
    }

    /// The database could not be reached while doing `context`.
    pub fn unavailable(context: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Unavailable {
            context: context.into(),
            source: source.into(),
        }
    }

    /// Whether the failure is the database being out of reach, so the same request may succeed
    /// shortly (as opposed to a failure that repeats).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }

    /// Stored data that the ledger itself finds malformed (no underlying error).
    pub fn corrupt(context: impl Into<String>) -> Self {
        Self::Corrupt {
            context: context.into(),
            source: None,
        }
    }

    /// Stored data that the backend or a decoder reported as malformed.
    pub fn corrupt_because(context: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Corrupt {
            context: context.into(),
            source: Some(source.into()),
        }
    }

    /// Bounded label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Storage { .. } | Self::Internal(_) | Self::UnsupportedSchema { .. } => "storage",
            Self::Unavailable { .. } => "unavailable",
            Self::Closed => "closed",
            Self::NoReservation => "no_reservation",
            Self::Random(_) => "random",
            Self::Corrupt { .. } => "corrupt",
            Self::InvalidArgument(_) => "invalid_argument",
        }
    }
}

pub type Result<T, E = LedgerError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("disk on fire")]
    struct Cause;

    #[test]
    fn storage_errors_name_the_operation_and_keep_the_cause() {
        let err = LedgerError::storage("insert reservation", Cause);
        assert_eq!(
            err.to_string(),
            "ledger storage error: insert reservation: disk on fire"
        );
        let source = err.source().expect("the cause is the source");
        assert!(source.downcast_ref::<Cause>().is_some());
        assert_eq!(err.metric_label(), "storage");
    }

    #[test]
    fn unavailable_errors_say_so_and_keep_the_cause() {
        let err = LedgerError::unavailable("get a ledger database connection", Cause);
        assert_eq!(
            err.to_string(),
            "ledger database unavailable: get a ledger database connection: disk on fire"
        );
        assert!(err.is_unavailable());
        assert!(err.source().is_some_and(|s| s.is::<Cause>()));
        assert_eq!(err.metric_label(), "unavailable");
        assert!(!LedgerError::storage("insert", Cause).is_unavailable());
    }

    #[test]
    fn corrupt_errors_with_and_without_a_cause() {
        let bare = LedgerError::corrupt("half-recorded task ending");
        assert_eq!(
            bare.to_string(),
            "stored data is corrupt: half-recorded task ending"
        );
        assert!(bare.source().is_none());
        let caused = LedgerError::corrupt_because("task scopes is not valid", Cause);
        assert_eq!(
            caused.to_string(),
            "stored data is corrupt: task scopes is not valid: disk on fire"
        );
        assert!(caused.source().is_some_and(|s| s.is::<Cause>()));
        assert_eq!(
            (bare.metric_label(), caused.metric_label()),
            ("corrupt", "corrupt")
        );
    }

    #[test]
    fn causeless_errors_keep_their_labels() {
        let internal = LedgerError::Internal("confirmed task vanished".into());
        assert_eq!(
            internal.to_string(),
            "ledger storage error: confirmed task vanished"
        );
        let schema = LedgerError::UnsupportedSchema {
            found: 99,
            supported: 2,
        };
        assert!(schema.to_string().contains("version 99"), "{schema}");
        for err in [internal, schema] {
            assert!(err.source().is_none());
            assert_eq!(err.metric_label(), "storage");
        }
    }
}
