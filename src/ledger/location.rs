//! Where the ledger lives, and so which backend holds it.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use super::{
    LedgerError, LedgerScope, PostgresLedger, PostgresLocation, Result, SqliteLedger, TaskLedger,
};

/// Where a ledger lives; [`LedgerLocation::open`] opens the matching backend.
///
/// Parsed ([`FromStr`]) from the sidecar's `--ledger` value:
///
/// - `sqlite:PATH` or `sqlite://PATH` (so `sqlite:///var/lib/ledger.db` is an absolute path):
///   the SQLite ledger in that file;
/// - `postgres://…` or `postgresql://…`: the PostgreSQL ledger at that libpq-style URL
///   ([`PostgresLocation`]); any other text after a `postgres:`/`postgresql:` prefix is
///   refused;
/// - any other `scheme://…`: refused;
/// - anything else is a plain file path for the SQLite ledger, as before (including paths with
///   a colon, like `backup:1.db`).
///
/// Schemes are case-insensitive. [`Display`](fmt::Display) writes the `sqlite://PATH` form,
/// which parses back to the same location; a PostgreSQL location shows as
/// `postgres://user@host:port/db`, without its password or parameters (so it does not parse
/// back to the same settings).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LedgerLocation {
    /// An SQLite file, created if missing.
    Sqlite(PathBuf),
    /// A PostgreSQL database shared by replicas (its `Debug` and `Display` hide the password).
    Postgres(PostgresLocation),
}

/// Why a ledger location was refused. Never repeats the location itself (a database URL may
/// carry a password).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LocationError {
    #[error("the ledger location is empty")]
    Empty,
    /// A `postgres:`/`postgresql:` location that is not a usable URL; says why without
    /// repeating it.
    #[error("invalid PostgreSQL ledger location: {0}")]
    InvalidPostgres(String),
    #[error(
        "unknown ledger location scheme `{0}`; give a file path or `sqlite:PATH` for the SQLite \
         ledger"
    )]
    UnknownScheme(String),
}

impl LedgerLocation {
    /// Opens (creating if needed) the ledger here for `scope`. For SQLite, the file I/O runs
    /// on the blocking pool; the call fails as [`SqliteLedger::open_scoped`] does. For
    /// PostgreSQL, as [`PostgresLedger::open`] does.
    pub async fn open(&self, scope: LedgerScope) -> Result<Arc<dyn TaskLedger>> {
        match self {
            Self::Sqlite(path) => {
                let path = path.clone();
                let opened =
                    tokio::task::spawn_blocking(move || SqliteLedger::open_scoped(&path, scope))
                        .await
                        .map_err(|e| match e.try_into_panic() {
                            Ok(panic) => std::panic::resume_unwind(panic),
                            Err(e) => {
                                LedgerError::Internal(format!("opening the ledger stopped: {e}"))
                            }
                        })??;
                Ok(Arc::new(opened))
            }
            Self::Postgres(location) => Ok(Arc::new(PostgresLedger::open(location, scope).await?)),
        }
    }
}

/// The URL-style scheme `s` starts with (`letter *(letter / digit / "+" / "-" / ".") ":"`),
/// without its colon.
fn scheme(s: &str) -> Option<&str> {
    let end = s.find(':')?;
    let candidate = &s[..end];
    let mut chars = candidate.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    valid.then_some(candidate)
}

impl FromStr for LedgerLocation {
    type Err = LocationError;

    fn from_str(s: &str) -> std::result::Result<Self, LocationError> {
        if s.is_empty() {
            return Err(LocationError::Empty);
        }
        let Some(scheme) = scheme(s) else {
            return Ok(Self::Sqlite(PathBuf::from(s)));
        };
        let rest = &s[scheme.len() + 1..];
        if scheme.eq_ignore_ascii_case("sqlite") {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if path.is_empty() {
                return Err(LocationError::Empty);
            }
            return Ok(Self::Sqlite(PathBuf::from(path)));
        }
        if scheme.eq_ignore_ascii_case("postgres") || scheme.eq_ignore_ascii_case("postgresql") {
            return s.parse().map(Self::Postgres).map_err(
                |e: super::postgres::InvalidPostgresUrl| {
                    LocationError::InvalidPostgres(e.to_string())
                },
            );
        }
        if rest.starts_with("//") {
            return Err(LocationError::UnknownScheme(scheme.to_ascii_lowercase()));
        }
        // `name:rest` without `//` is an ordinary file name with a colon.
        Ok(Self::Sqlite(PathBuf::from(s)))
    }
}

impl fmt::Display for LedgerLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sqlite(path) => write!(f, "sqlite://{}", path.display()),
            Self::Postgres(location) => write!(f, "{location}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::ReserveOutcome;
    use crate::ledger::conformance::{UNLIMITED, fresh_owner, reservation};

    fn sqlite(path: &str) -> std::result::Result<LedgerLocation, LocationError> {
        Ok(LedgerLocation::Sqlite(PathBuf::from(path)))
    }

    #[test]
    fn plain_paths_are_sqlite_files() {
        for path in [
            "ledger.db",
            "/var/lib/lifeguard/ledger.db",
            "./data/ledger.db",
            "backup:1.db",
            "C:\\ledger.db",
            " spaced name.db",
            "1http://not-a-scheme",
        ] {
            assert_eq!(path.parse(), sqlite(path), "{path}");
        }
    }

    #[test]
    fn sqlite_scheme_names_a_file() {
        for (text, path) in [
            ("sqlite:ledger.db", "ledger.db"),
            ("sqlite://ledger.db", "ledger.db"),
            ("sqlite:///var/lib/ledger.db", "/var/lib/ledger.db"),
            ("sqlite:/var/lib/ledger.db", "/var/lib/ledger.db"),
            ("SQLite:ledger.db", "ledger.db"),
        ] {
            assert_eq!(text.parse(), sqlite(path), "{text}");
        }
    }

    #[test]
    fn postgres_urls_are_postgres_locations_shown_without_secrets() {
        for (text, shown) in [
            (
                "postgres://lifeguard:hunter2@db.internal:5432/ledger",
                "postgres://lifeguard@db.internal:5432/ledger",
            ),
            (
                "postgresql://db.internal/ledger?sslmode=require&password=hunter2",
                "postgres://db.internal:5432/ledger",
            ),
            (
                "POSTGRES://u:hunter2@db/ledger",
                "postgres://u@db:5432/ledger",
            ),
        ] {
            let location: LedgerLocation = text.parse().unwrap();
            assert!(matches!(location, LedgerLocation::Postgres(_)), "{text}");
            assert_eq!(location.to_string(), shown);
            for output in [location.to_string(), format!("{location:?}")] {
                assert!(!output.contains("hunter2"), "{output}");
            }
        }
    }

    #[test]
    fn other_locations_are_refused_clearly() {
        let refused = |text: &str| text.parse::<LedgerLocation>().unwrap_err();
        for text in [
            "postgres:ledger",
            "postgres://lifeguard:hunter2@db/ledger?sslmode=sometimes",
            "postgresql://lifeguard:hunter2@db:port/ledger",
        ] {
            let err = refused(text);
            assert!(matches!(err, LocationError::InvalidPostgres(_)), "{text}");
            assert!(err.to_string().contains("PostgreSQL"), "{err}");
            assert!(!err.to_string().contains("hunter2"), "{err}");
        }
        assert_eq!(
            refused("mysql://db/ledger"),
            LocationError::UnknownScheme("mysql".into())
        );
        assert_eq!(
            refused("HTTPS://example.com/ledger"),
            LocationError::UnknownScheme("https".into())
        );
        for empty in ["", "sqlite:", "sqlite://"] {
            assert_eq!(refused(empty), LocationError::Empty, "{empty:?}");
        }
    }

    #[test]
    fn display_parses_back() {
        for path in [
            "ledger.db",
            "/var/lib/ledger.db",
            "//double-slash.db",
            "backup:1.db",
            "sqlite:odd.db",
        ] {
            let location = LedgerLocation::Sqlite(PathBuf::from(path));
            let shown = location.to_string();
            assert!(shown.starts_with("sqlite://"), "{shown}");
            assert_eq!(shown.parse(), Ok(location), "{shown}");
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn opens_the_sqlite_ledger() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let location: LedgerLocation = path.to_str().unwrap().parse().unwrap();
        let ledger = location.open(LedgerScope::local()).await.unwrap();
        let outcome = ledger.reserve(reservation(&fresh_owner(), UNLIMITED)).await;
        assert_eq!(outcome.unwrap(), ReserveOutcome::Reserved);
        assert!(path.exists());

        let missing = LedgerLocation::Sqlite(dir.path().join("no/such/dir/ledger.db"));
        let err = missing
            .open(LedgerScope::local())
            .await
            .err()
            .expect("no directory to create it in");
        assert!(matches!(err, LedgerError::Storage { .. }), "{err}");
    }
}
