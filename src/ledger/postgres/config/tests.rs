//! Parsing and showing `postgres://` locations.

use super::*;

fn parse(s: &str) -> PostgresLocation {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

#[test]
fn urls_parse_with_libpq_defaults() {
    let l = parse("postgres://lifeguard:hunter2@db.internal:6543/ledger");
    assert_eq!(
        l.to_string(),
        "postgres://lifeguard@db.internal:6543/ledger"
    );
    assert_eq!(l.ssl_mode(), SslMode::Prefer);
    assert_eq!(l.pool_size(), DEFAULT_POOL_SIZE);
    assert_eq!(l.connect_timeout(), DEFAULT_CONNECT_TIMEOUT);
    assert!(l.has_password());
    assert_eq!(l.pg().get_application_name(), Some("lifeguard"));
    assert_eq!(l.pg().get_keepalives_idle(), DEFAULT_KEEPALIVES_IDLE);
    let own = parse("postgres://h/db?keepalives_idle=600&keepalives=0");
    assert_eq!(own.pg().get_keepalives_idle(), Duration::from_secs(600));
    assert!(!own.pg().get_keepalives());
    // A silent partition gives up a statement in flight after this, not the kernel's 15 min.
    assert_eq!(
        l.pg().get_tcp_user_timeout(),
        Some(&DEFAULT_TCP_USER_TIMEOUT)
    );
    let own = parse("postgres://h/db?tcp_user_timeout=30");
    assert_eq!(
        own.pg().get_tcp_user_timeout(),
        Some(&Duration::from_secs(30))
    );

    let l = parse(
        "PostgreSQL://u@h1:1,h2:2/db?sslmode=verify-full&sslrootcert=/ca.pem\
         &pool_max_size=3&connect_timeout=4&application_name=me",
    );
    assert_eq!(l.to_string(), "postgres://u@h1:1,h2:2/db");
    assert_eq!(l.ssl_mode(), SslMode::VerifyFull);
    assert_eq!(l.root_cert(), &RootCert::File("/ca.pem".into()));
    assert_eq!(l.pool_size(), 3);
    assert_eq!(l.connect_timeout(), Duration::from_secs(4));
    assert_eq!(l.pg().get_application_name(), Some("me"));
    assert!(!l.has_password());
    assert_eq!(
        l.pg().get_ssl_mode(),
        tokio_postgres::config::SslMode::Require
    );

    let l = parse("postgresql://[::1]/x?sslmode=verify-ca&sslrootcert=system");
    assert_eq!(l.to_string(), "postgres://[::1]:5432/x");
    assert_eq!(l.ssl_mode(), SslMode::VerifyCa);
    assert_eq!(l.root_cert(), &RootCert::System);
    let l = parse("postgres:///ledger?host=%2Fvar%2Frun%2Fpostgresql&user=me");
    assert_eq!(
        l.to_string(),
        "postgres://me@/var/run/postgresql:5432/ledger"
    );
    assert_eq!(l.first_host(), "localhost");
    let l = parse("postgres://db");
    assert_eq!(l.to_string(), "postgres://db:5432/");
    assert_eq!(parse("postgres://").first_host(), "localhost");
    let l = parse("postgres://u@h/db?sslmode=disable&passfile=/etc/pgpass");
    assert_eq!(l.ssl_mode(), SslMode::Disable);
    assert_eq!(l.passfile(), Some(&PathBuf::from("/etc/pgpass")));
}

#[test]
fn bad_urls_are_refused_without_repeating_them() {
    for (text, says) in [
        ("postgres://u:hunter2@h/db?sslmode=allow", "sslmode"),
        ("postgres://u:hunter2@h/db?sslmode=bogus", "sslmode"),
        ("postgres://u:hunter2@h/db?sslcert=/c.pem", "sslcert"),
        ("postgres://u:hunter2@h/db?pool_max_size=0", "pool_max_size"),
        ("postgres://u:hunter2@h/db?bogus=1", "bogus"),
        ("postgres://u:hunter2@h:notaport/db", "invalid"),
        (
            "postgres://u:hunter2@h/db?password=hunter2&port=x",
            "invalid",
        ),
        ("postgres://u:hunt%65r2@h/db?x%zz=1", "percent"),
        ("postgres:hunter2", "postgres://"),
        ("mysql://u:hunter2@h/db", "postgres://"),
    ] {
        let err = text.parse::<PostgresLocation>().unwrap_err().to_string();
        assert!(err.contains(says), "{text}: {err}");
        assert!(!err.contains("hunter2"), "{text}: {err}");
    }
}

#[test]
fn the_password_never_shows() {
    for text in [
        "postgres://lifeguard:hunter2@db:5432/ledger?sslmode=require",
        "postgres://lifeguard:hunt%65r2@db/ledger",
        "postgres://lifeguard@db/ledger?password=hunter2",
        "postgres://hunter2:hunter2@db/hunter2",
    ] {
        let l = parse(text);
        for shown in [l.to_string(), format!("{l:?}"), format!("{l:#?}")] {
            assert!(!shown.contains("hunter2"), "{text}: {shown}");
            assert!(!shown.contains("hunt%65r2"), "{text}: {shown}");
        }
        assert!(format!("{l:?}").contains("***"), "{l:?}");
        assert_eq!(l.redact("x hunter2 y"), "x *** y");
    }
    let sourced = parse("postgres://u@db/x").with_password("s3cret");
    assert!(!format!("{sourced:?} {sourced}").contains("s3cret"));
    assert_eq!(sourced.redact("s3cret"), "***");
}
