//! The ledger's files are owner-only (0600): they hold task results and the HMAC keys of audit
//! hashes and idempotency keys.
//!
//! SQLite creates a new database file with mode 0644 (less the umask), and its `-wal` and
//! `-shm` files with the database file's mode. So the ledger creates the database file itself,
//! 0600, before SQLite opens it, and the other two follow. Files that already exist with group
//! or other permission bits (made by an earlier build, or by hand) are tightened, with a warning.

use std::path::Path;

use crate::ledger::Result;

/// Creates the database file at `path` owner-only if it is missing, and removes group and
/// other permissions from it and from its `-wal` and `-shm` files where they exist. Fails if a
/// file cannot be created or tightened (e.g. it belongs to another user): the ledger does not
/// run on files others can read. A no-op on platforms without Unix permissions.
#[cfg(unix)]
pub(super) fn make_owner_only(path: &Path) -> Result<()> {
    use std::fs::OpenOptions;
    use std::io::ErrorKind;
    use std::os::unix::fs::OpenOptionsExt;

    use crate::ledger::LedgerError;

    // `create_new`: an existing file is never opened (nor truncated) here, only tightened.
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => return Err(LedgerError::storage("create ledger database file", e)),
    }
    tighten(path)?;
    for suffix in ["-wal", "-shm"] {
        let mut companion = path.as_os_str().to_owned();
        companion.push(suffix);
        tighten(Path::new(&companion))?;
    }
    Ok(())
}

#[cfg(not(unix))]
pub(super) fn make_owner_only(_path: &Path) -> Result<()> {
    Ok(())
}

/// Removes group and other permissions from `file` if it exists and has any.
#[cfg(unix)]
fn tighten(file: &Path) -> Result<()> {
    use std::fs::Permissions;
    use std::io::ErrorKind;
    use std::os::unix::fs::PermissionsExt;

    use crate::ledger::LedgerError;

    let mode = match std::fs::metadata(file) {
        Ok(meta) => meta.permissions().mode() & 0o7777,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(LedgerError::storage("inspect ledger file permissions", e)),
    };
    if mode & 0o077 == 0 {
        return Ok(());
    }
    let owner_only = mode & 0o700;
    std::fs::set_permissions(file, Permissions::from_mode(owner_only)).map_err(|e| {
        LedgerError::storage(
            format!(
                "restrict ledger file {} (mode {mode:o}) to its owner",
                file.display()
            ),
            e,
        )
    })?;
    tracing::warn!(
        file = %file.display(),
        was = format!("{mode:o}"),
        now = format!("{owner_only:o}"),
        "ledger file was accessible to other users; restricted it to its owner"
    );
    Ok(())
}
