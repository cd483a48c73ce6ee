//! Where a benchmark ran and the targets it reports (shared by this benchmark and
//! `examples/admission_bench`, which includes this file).

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
    pub fn probe(repo: &std::path::Path) -> Self {
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

/// A target from the issue, and what was measured against it.
pub struct Target {
    pub name: String,
    pub measured: f64,
    pub limit: f64,
    pub unit: &'static str,
    /// Why the measurement does not speak to the target (e.g. a smoke run).
    pub not_applicable: Option<String>,
}

impl Target {
    pub fn verdict(&self) -> &'static str {
        if self.not_applicable.is_some() {
            "N/A"
        } else if self.measured <= self.limit {
            "PASS"
        } else {
            "MISS"
        }
    }

    pub fn line(&self) -> String {
        let (m, l, u) = (self.measured, self.limit, self.unit);
        let detail = match self.verdict() {
            "PASS" => format!("margin {:.1} {u}", l - m),
            "MISS" => format!("off by {:.1} {u}, {:.2}× the limit", m - l, m / l),
            _ => self.not_applicable.clone().unwrap_or_default(),
        };
        format!(
            "  [{}] {}: measured {m:.1} {u} (target ≤ {l} {u}; {detail})",
            self.verdict(),
            self.name
        )
    }

    pub fn to_json(&self) -> Value {
        json!({
            "target": self.name, "measured": self.measured, "limit": self.limit,
            "unit": self.unit, "comparison": "<=", "verdict": self.verdict(),
            "note": self.not_applicable,
        })
    }
}
