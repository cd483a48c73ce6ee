//! Where a benchmark ran: the machine, the build and the commit, and the file system under a
//! directory (the sidecar's ledger must be on disk).

use std::path::Path;

use serde_json::{Value, json};

/// Where the bench ran.
pub struct Machine {
    pub cpu: String,
    pub cpus: usize,
    pub kernel: String,
    pub mem_total_kib: u64,
    pub build: &'static str,
    pub git: String,
    pub started: String,
}

fn first_line_value(path: &str, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
}

impl Machine {
    /// This machine, this build, and the commit checked out in `repo`.
    pub fn probe(repo: &Path) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let git = std::process::Command::new("git")
            .arg("-C")
            .arg(repo)
            .args(["rev-parse", "--short", "HEAD"])
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_owned())
            .unwrap_or_default();
        Self {
            cpu: first_line_value("/proc/cpuinfo", "model name")
                .unwrap_or_else(|| "unknown".into()),
            cpus: cpuinfo
                .lines()
                .filter(|l| l.starts_with("processor"))
                .count(),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_owned())
                .unwrap_or_default(),
            mem_total_kib: first_line_value("/proc/meminfo", "MemTotal")
                .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
                .unwrap_or(0),
            build: if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            },
            git,
            started: jiff::Timestamp::now().to_string(),
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "cpu_model": self.cpu, "logical_cpus": self.cpus, "kernel": self.kernel,
            "mem_total_kib": self.mem_total_kib, "build": self.build, "git_commit": self.git,
            "started": self.started,
        })
    }
}

/// The mount a directory is on.
pub struct Disk {
    pub path: String,
    /// File system type ("unknown" when no mount matches).
    pub fs: String,
    pub device: String,
}

impl Disk {
    /// The mount holding `dir` (the longest matching mount point of /proc/mounts).
    pub fn of(dir: &Path) -> Self {
        let canonical = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        let mut best: Option<(usize, String, String)> = None;
        for line in mounts.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 3 || !canonical.starts_with(f[1]) {
                continue;
            }
            if best.as_ref().is_none_or(|(len, _, _)| f[1].len() > *len) {
                best = Some((f[1].len(), f[2].to_owned(), f[0].to_owned()));
            }
        }
        let (fs, device) = best
            .map(|(_, fs, dev)| (fs, dev))
            .unwrap_or_else(|| ("unknown".into(), "unknown".into()));
        Self {
            path: dir.display().to_string(),
            fs,
            device,
        }
    }

    /// Whether it is a memory file system (tmpfs, ramfs).
    pub fn in_memory(&self) -> bool {
        matches!(self.fs.as_str(), "tmpfs" | "ramfs")
    }
}
