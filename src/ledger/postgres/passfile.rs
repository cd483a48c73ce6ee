//! Where the password comes from when the URL has none, as libpq does it: the URL's password,
//! else `PGPASSWORD`, else the password file (the URL's `passfile`, else `PGPASSFILE`, else
//! `~/.pgpass`).
//!
//! A password file has lines `hostname:port:database:username:password`; `*` matches anything in
//! the first four fields, `\` escapes `:` and `\`, `#` starts a comment line, and the first
//! matching line wins. A file that group or others can read is ignored with a warning (libpq
//! refuses it too); so is one that is not a regular file.

use std::path::{Path, PathBuf};

use super::config::PostgresLocation;

/// The password sources outside the URL, read from the environment once at open.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PasswordSources {
    /// `PGPASSWORD`.
    pub pgpassword: Option<String>,
    /// `PGPASSFILE`.
    pub pgpassfile: Option<PathBuf>,
    /// `$HOME`, for the default `~/.pgpass`.
    pub home: Option<PathBuf>,
    /// `$USER`, the user when the URL names none (as PostgreSQL clients default to it).
    pub os_user: Option<String>,
}

impl PasswordSources {
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        Self {
            pgpassword: var("PGPASSWORD").and_then(|v| v.into_string().ok()),
            pgpassfile: var("PGPASSFILE").map(PathBuf::from),
            home: var("HOME").map(PathBuf::from),
            os_user: var("USER")
                .or_else(|| var("LOGNAME"))
                .and_then(|v| v.into_string().ok()),
        }
    }

    /// The password file to read: the URL's `passfile`, `PGPASSFILE`, or `~/.pgpass`.
    fn file(&self, location: &PostgresLocation) -> Option<PathBuf> {
        location
            .passfile()
            .cloned()
            .or_else(|| self.pgpassfile.clone())
            .or_else(|| self.home.as_ref().map(|home| home.join(".pgpass")))
    }
}

/// The location with its password: the URL's, else `PGPASSWORD`, else the password file's
/// entry for its first host, port, database and user. Unchanged when none has one.
pub fn resolve(location: &PostgresLocation, sources: &PasswordSources) -> PostgresLocation {
    if location.has_password() {
        return location.clone();
    }
    if let Some(password) = sources.pgpassword.as_deref().filter(|p| !p.is_empty()) {
        return location.with_password(password);
    }
    let Some(file) = sources.file(location) else {
        return location.clone();
    };
    let user = location
        .user()
        .map(str::to_owned)
        .or_else(|| sources.os_user.clone())
        .unwrap_or_default();
    let database = location
        .dbname()
        .map_or_else(|| user.clone(), str::to_owned);
    let port = location.first_port().to_string();
    let entry = Entry {
        host: &location.first_host(),
        port: &port,
        database: &database,
        user: &user,
    };
    match read_password_file(&file, &entry) {
        Some(password) => location.with_password(&password),
        None => location.clone(),
    }
}

/// What a password file line is matched against.
#[derive(Clone, Copy, Debug)]
pub struct Entry<'a> {
    pub host: &'a str,
    pub port: &'a str,
    pub database: &'a str,
    pub user: &'a str,
}

/// The password `file` holds for `entry`, if the file is usable and has a matching line.
pub fn read_password_file(file: &Path, entry: &Entry<'_>) -> Option<String> {
    let metadata = match std::fs::metadata(file) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(error) => {
            tracing::warn!(file = %file.display(), %error, "cannot read the password file");
            return None;
        }
    };
    if !metadata.is_file() {
        tracing::warn!(file = %file.display(), "the password file is not a plain file; ignored");
        return None;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if metadata.permissions().mode() & 0o077 != 0 {
            tracing::warn!(
                file = %file.display(),
                "the password file has group or world access; permissions should be u=rw \
                 (0600) or less; ignored"
            );
            return None;
        }
    }
    match std::fs::read_to_string(file) {
        Ok(text) => lookup(&text, entry),
        Err(error) => {
            tracing::warn!(file = %file.display(), %error, "cannot read the password file");
            None
        }
    }
}

/// The password of the first line of `text` matching `entry`.
pub fn lookup(text: &str, entry: &Entry<'_>) -> Option<String> {
    let wanted = [entry.host, entry.port, entry.database, entry.user];
    text.lines()
        .map(|line| line.strip_suffix('\r').unwrap_or(line))
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .find_map(|line| {
            let mut rest = line;
            for want in wanted {
                let (field, wildcard, after) = field(rest)?;
                if !wildcard && field != want {
                    return None;
                }
                rest = after?;
            }
            // The password runs to the next unescaped colon (or the end of the line).
            Some(field(rest)?.0)
        })
}

/// The first field of `s`, unescaped, whether it is the `*` wildcard, and what follows its
/// colon (`None` at the end of the line). `None` for a field cut off by a trailing `\`.
fn field(s: &str) -> Option<(String, bool, Option<&str>)> {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => out.push(chars.next()?.1),
            ':' => return Some((out, &s[..i] == "*", Some(&s[i + 1..]))),
            c => out.push(c),
        }
    }
    let wildcard = s == "*";
    Some((out, wildcard, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENTRY: Entry<'static> = Entry {
        host: "db.internal",
        port: "5432",
        database: "ledger",
        user: "lifeguard",
    };

    #[test]
    fn lines_match_field_by_field_with_wildcards() {
        let file = "\
# comment: db.internal:5432:ledger:lifeguard:commented
other:5432:ledger:lifeguard:wrong-host
db.internal:5433:ledger:lifeguard:wrong-port
db.internal:*:ledger:lifeguard:any-port
db.internal:5432:ledger:lifeguard:later-line
";
        assert_eq!(lookup(file, &ENTRY).as_deref(), Some("any-port"));
        assert_eq!(
            lookup("*:*:*:*:everything\n", &ENTRY).as_deref(),
            Some("everything")
        );
        assert_eq!(
            lookup("*:*:*:someone-else:x\n", &ENTRY),
            None,
            "the user must match"
        );
        assert_eq!(lookup("", &ENTRY), None);
        assert_eq!(
            lookup("db.internal:5432:ledger\n", &ENTRY),
            None,
            "short line"
        );
        assert_eq!(
            lookup("db.internal:5432:ledger:lifeguard:crlf\r\n", &ENTRY).as_deref(),
            Some("crlf")
        );
        assert_eq!(
            lookup("db.internal:5432:ledger:lifeguard:\n", &ENTRY).as_deref(),
            Some(""),
            "an empty password is a password"
        );
    }

    #[test]
    fn backslashes_escape_colons_and_backslashes() {
        let entry = Entry {
            host: "h:1",
            database: "d\\b",
            ..ENTRY
        };
        let file = "h\\:1:5432:d\\\\b:lifeguard:pa\\:ss\\\\word:ignored\n";
        assert_eq!(lookup(file, &entry).as_deref(), Some("pa:ss\\word"));
        // An escaped star is a literal star, not a wildcard.
        assert_eq!(lookup("\\*:*:*:*:x\n", &ENTRY), None);
        let star = Entry { host: "*", ..ENTRY };
        assert_eq!(lookup("\\*:*:*:*:x\n", &star).as_deref(), Some("x"));
        // A line ending in a lone backslash matches nothing.
        assert_eq!(lookup("db.internal:5432:ledger:lifeguard\\", &ENTRY), None);
    }

    fn write(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        path
    }

    #[test]
    fn the_url_beats_pgpassword_which_beats_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = write(dir.path(), "pgpass", "*:*:*:*:from-file\n", 0o600);
        let sources = PasswordSources {
            pgpassword: Some("from-env".into()),
            pgpassfile: Some(file.clone()),
            home: None,
            os_user: None,
        };
        let password = |url: &str, sources: &PasswordSources| {
            let location: PostgresLocation = url.parse().unwrap();
            resolve(&location, sources)
                .pg()
                .get_password()
                .map(|p| String::from_utf8(p.to_vec()).unwrap())
        };
        let url = "postgres://u@db/ledger";
        assert_eq!(
            password("postgres://u:from-url@db/ledger", &sources).as_deref(),
            Some("from-url")
        );
        assert_eq!(password(url, &sources).as_deref(), Some("from-env"));
        let no_env = PasswordSources {
            pgpassword: None,
            ..sources.clone()
        };
        assert_eq!(password(url, &no_env).as_deref(), Some("from-file"));
        // An empty password in the URL or PGPASSWORD counts as none (as in libpq).
        let empty_env = PasswordSources {
            pgpassword: Some(String::new()),
            ..sources.clone()
        };
        assert_eq!(
            password("postgres://u:@db/ledger", &empty_env).as_deref(),
            Some("from-file")
        );
        // The URL's passfile beats PGPASSFILE; ~/.pgpass is the last resort.
        let other = write(dir.path(), "other", "*:*:*:*:from-other\n", 0o600);
        let with_param = format!("{url}?passfile={}", other.display());
        assert_eq!(
            password(&with_param, &no_env).as_deref(),
            Some("from-other")
        );
        write(dir.path(), ".pgpass", "db:5432:ledger:u:from-home\n", 0o600);
        let home_only = PasswordSources {
            home: Some(dir.path().to_owned()),
            ..Default::default()
        };
        assert_eq!(password(url, &home_only).as_deref(), Some("from-home"));
        assert_eq!(password(url, &PasswordSources::default()), None);
        // The database defaults to the user, the user to $USER.
        let by_user = write(dir.path(), "by-user", "db:5432:me:me:mine\n", 0o600);
        let os_user = PasswordSources {
            pgpassfile: Some(by_user),
            os_user: Some("me".into()),
            ..Default::default()
        };
        assert_eq!(password("postgres://db", &os_user).as_deref(), Some("mine"));
    }

    #[cfg(unix)]
    #[test]
    fn a_readable_or_odd_password_file_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let line = "*:*:*:*:secret\n";
        let private = write(dir.path(), "private", line, 0o600);
        assert_eq!(
            read_password_file(&private, &ENTRY).as_deref(),
            Some("secret")
        );
        for mode in [0o640, 0o604, 0o660] {
            let open = write(dir.path(), "open", line, mode);
            assert_eq!(read_password_file(&open, &ENTRY), None, "{mode:o}");
        }
        assert_eq!(read_password_file(dir.path(), &ENTRY), None, "a directory");
        let missing = dir.path().join("missing");
        assert_eq!(read_password_file(&missing, &ENTRY), None);
    }
}
