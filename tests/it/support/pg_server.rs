//! A PostgreSQL server of the test's own, inside a network namespace (`support::netns`): a
//! fresh cluster in a temporary directory (owned by the `postgres` user, trust authentication)
//! listening on the namespace's address, which the test can restart or stop; stopped on drop.
//! The binaries are the newest of `/usr/lib/postgresql/*/bin` (scripts/test.sh installs them).

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::netns::Lab;
use super::process::run_to_completion;

pub struct PgServer {
    netns: String,
    bin: PathBuf,
    dir: tempfile::TempDir,
    pub host: Ipv4Addr,
}

/// The newest PostgreSQL's `bin` directory.
fn bin_dir() -> PathBuf {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, bin)| bin.join("pg_ctl").is_file())
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!(
            "no PostgreSQL server binaries under /usr/lib/postgresql/*/bin: install the \
             postgresql package (scripts/test.sh does as root)"
        )
    })
}

impl PgServer {
    /// Creates a cluster and starts it in `netns`, listening on `host:5432`.
    pub fn start(netns: &str, host: Ipv4Addr) -> PgServer {
        let bin = bin_dir();
        let dir = tempfile::tempdir().unwrap();
        let chown = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(dir.path())
            .status()
            .expect("chown");
        assert!(chown.success(), "chown of the PostgreSQL directory failed");
        let server = PgServer {
            netns: netns.to_owned(),
            bin,
            dir,
            host,
        };
        let data = server.data();
        let mut initdb = server.as_postgres(None, "initdb");
        initdb
            .args(["--auth=trust", "--username=postgres", "--no-sync", "-D"])
            .arg(&data);
        server.check(initdb, "initdb");
        // Reachable only inside the test's namespaces: trust every address there.
        let hba = data.join("pg_hba.conf");
        let mut rules = std::fs::read_to_string(&hba).unwrap();
        rules.push_str("host all all 0.0.0.0/0 trust\n");
        std::fs::write(&hba, rules).unwrap();
        server.pg_ctl("start");
        server
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// `tool` of the PostgreSQL binaries, run as `postgres` (inside `netns` when given).
    fn as_postgres(&self, netns: Option<&str>, tool: &str) -> Command {
        let mut command = match netns {
            Some(ns) => Lab::command(ns, "runuser"),
            None => Command::new("runuser"),
        };
        command
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join(tool));
        command
    }

    fn check(&self, command: Command, what: &str) {
        let out = run_to_completion(command, what, Duration::from_secs(60));
        assert!(
            out.status.success(),
            "{what} failed: {}{}\nserver log:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
    }

    /// `pg_ctl ACTION -w` in the namespace, with the server's options.
    fn pg_ctl(&self, action: &str) {
        let mut command = self.as_postgres(Some(&self.netns), "pg_ctl");
        command
            .arg(action)
            .args(["-w", "-m", "fast", "-D"])
            .arg(self.data())
            .arg("-l")
            .arg(self.log_path())
            .arg("-o")
            .arg(format!(
                "-c listen_addresses={} -p 5432 -k {} -c fsync=off -c max_connections=200",
                self.host,
                self.dir.path().display()
            ));
        self.check(command, &format!("pg_ctl {action}"));
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Restarts the server (fast shutdown: every connection is closed, then it starts again).
    pub fn restart(&self) {
        self.pg_ctl("restart");
    }

    /// The `postgres` database's URL, with `params` (`key=value&…`) appended.
    pub fn url(&self, params: &str) -> String {
        let mut url = format!("postgres://postgres@{}:5432/postgres", self.host);
        if !params.is_empty() {
            url.push('?');
            url.push_str(params);
        }
        url
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let mut command = self.as_postgres(Some(&self.netns), "pg_ctl");
        command
            .args(["stop", "-m", "immediate", "-D"])
            .arg(self.data());
        let _ = command.output();
    }
}
