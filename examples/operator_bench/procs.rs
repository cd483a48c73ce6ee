//! Child processes (the API emulator, the operator), and what /proc tells about them and the
//! machine: resident memory, CPU time, load average, the busy time of every CPU.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

/// A child process, killed when dropped; its stdout and stderr go to files.
pub struct Proc {
    child: Mutex<Child>,
    pub pid: u32,
    name: String,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Proc {
    pub fn spawn(mut command: Command, dir: &Path, name: &str) -> Result<Self> {
        let stdout = dir.join(format!("{name}.stdout"));
        let stderr = dir.join(format!("{name}.stderr"));
        command
            .stdin(Stdio::null())
            .stdout(File::create(&stdout).context("creating a log file")?)
            .stderr(File::create(&stderr).context("creating a log file")?);
        let child = command
            .spawn()
            .with_context(|| format!("starting {name} ({:?})", command.get_program()))?;
        Ok(Self {
            pid: child.id(),
            child: Mutex::new(child),
            name: name.to_owned(),
            stdout,
            stderr,
        })
    }

    /// The last `lines` lines of both logs, for error messages.
    pub fn logs(&self, lines: usize) -> String {
        let tail = |path: &Path| {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        };
        format!(
            "--- {} stdout (tail)\n{}\n--- {} stderr (tail)\n{}",
            self.name,
            tail(&self.stdout),
            self.name,
            tail(&self.stderr)
        )
    }

    /// Waits for a line containing `marker` in either log; returns the rest of that line.
    pub fn wait_for(&self, marker: &str, within: Duration) -> Result<String> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            for path in [&self.stdout, &self.stderr] {
                let text = std::fs::read_to_string(path).unwrap_or_default();
                // Only whole lines: the process may be writing the last one right now.
                for line in text.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
                    if let Some(i) = line.find(marker) {
                        return Ok(line[i + marker.len()..].trim().to_owned());
                    }
                }
            }
            self.check_alive()?;
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!(
            "{} did not print `{marker}` within {within:?}:\n{}",
            self.name,
            self.logs(40)
        )
    }

    /// Fails if the process has exited.
    pub fn check_alive(&self) -> Result<()> {
        let status = self
            .child
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .try_wait();
        match status {
            Ok(None) => Ok(()),
            Ok(Some(status)) => bail!("{} exited ({status}):\n{}", self.name, self.logs(40)),
            Err(e) => bail!("cannot check {}: {e}", self.name),
        }
    }

    pub fn memory(&self) -> Memory {
        Memory::read(self.pid)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let child = self.child.get_mut().unwrap_or_else(|e| e.into_inner());
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Memory of a process from /proc/PID/status (KiB).
#[derive(Clone, Copy, Debug, Default)]
pub struct Memory {
    pub rss_kib: u64,
    pub hwm_kib: u64,
    pub threads: u64,
}

impl Memory {
    pub fn read(pid: u32) -> Self {
        let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        Self {
            rss_kib: field("VmRSS:"),
            hwm_kib: field("VmHWM:"),
            threads: field("Threads:"),
        }
    }

    pub fn rss_mib(self) -> f64 {
        self.rss_kib as f64 / 1024.0
    }

    pub fn to_json(self) -> Value {
        json!({"vm_rss_kib": self.rss_kib, "vm_hwm_kib": self.hwm_kib, "threads": self.threads})
    }
}

/// utime + stime of a process (clock ticks) from a /proc stat file.
pub fn cpu_ticks(stat_path: &str) -> u64 {
    let Ok(text) = std::fs::read_to_string(stat_path) else {
        return 0;
    };
    // Fields after the parenthesised command name: state is the first, utime the 12th.
    let Some(rest) = text.rsplit_once(')').map(|(_, r)| r) else {
        return 0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    num(11) + num(12)
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 when unknown).
pub fn clock_ticks_per_sec() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

/// Busy (user + nice + system + irq + softirq) ticks of all CPUs together, from /proc/stat.
pub fn machine_busy_ticks() -> u64 {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = text.lines().find(|l| l.starts_with("cpu ")) else {
        return 0;
    };
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    let at = |i: usize| f.get(i).copied().unwrap_or(0);
    at(0) + at(1) + at(2) + at(5) + at(6)
}

/// Cores' worth of CPU other processes use during one second (before anything starts).
pub async fn preflight_noise(ticks_per_sec: u64) -> f64 {
    let rest = Duration::from_secs(1);
    let busy0 = machine_busy_ticks();
    let self0 = cpu_ticks("/proc/self/stat");
    tokio::time::sleep(rest).await;
    let busy1 = machine_busy_ticks();
    let self1 = cpu_ticks("/proc/self/stat");
    let other = busy1
        .saturating_sub(busy0)
        .saturating_sub(self1.saturating_sub(self0));
    other as f64 / ticks_per_sec.max(1) as f64 / rest.as_secs_f64()
}

/// The 1, 5 and 15 minute load averages.
pub fn load_average() -> [f64; 3] {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut f = text
        .split_whitespace()
        .map(|v| v.parse::<f64>().unwrap_or(0.0));
    [
        f.next().unwrap_or(0.0),
        f.next().unwrap_or(0.0),
        f.next().unwrap_or(0.0),
    ]
}

/// The soft limit on open files of this process (children inherit it).
pub fn open_files_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// CPU ticks of the processes that matter, and of the whole machine, at one moment.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ticks {
    pub operator: u64,
    pub emulator: u64,
    pub bench: u64,
    pub machine: u64,
}

impl Ticks {
    pub fn take(operator: u32, emulator: u32) -> Self {
        Self {
            operator: cpu_ticks(&format!("/proc/{operator}/stat")),
            emulator: cpu_ticks(&format!("/proc/{emulator}/stat")),
            bench: cpu_ticks("/proc/self/stat"),
            machine: machine_busy_ticks(),
        }
    }

    /// CPU seconds spent between `self` and `later`.
    pub fn until(&self, later: &Ticks, ticks_per_sec: u64) -> Cpu {
        let s = |a: u64, b: u64| b.saturating_sub(a) as f64 / ticks_per_sec.max(1) as f64;
        let operator = s(self.operator, later.operator);
        let emulator = s(self.emulator, later.emulator);
        let bench = s(self.bench, later.bench);
        let machine = s(self.machine, later.machine);
        Cpu {
            operator,
            emulator,
            bench,
            other: (machine - operator - emulator - bench).max(0.0),
        }
    }
}

/// CPU seconds over an interval.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu {
    pub operator: f64,
    pub emulator: f64,
    pub bench: f64,
    /// Everything else on the machine: noise.
    pub other: f64,
}

impl Cpu {
    pub fn to_json(self) -> Value {
        json!({
            "operator_s": self.operator, "emulator_s": self.emulator,
            "bench_s": self.bench, "other_processes_s": self.other,
        })
    }
}
