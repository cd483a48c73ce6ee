//! Child processes (killed when dropped, their output in log files), and what /proc says about
//! them and the machine: memory, CPU time, the machine's busy time, load average, limits.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

/// How much of its logs a process's error messages quote.
#[derive(Clone, Copy, Debug)]
pub enum Quote {
    /// Both logs whole (processes that log little: the example server, the sidecar).
    Whole,
    /// The last lines of each (processes that log a lot: the operator with 1,000 sidecars).
    Tail(usize),
}

/// A child process, killed when dropped; its stdout and stderr go to files in its directory.
pub struct Proc {
    child: Mutex<Child>,
    pub pid: u32,
    name: String,
    stdout: PathBuf,
    stderr: PathBuf,
    quote: Quote,
}

impl Proc {
    /// Starts `command` with its output in `dir`/`name`.stdout and .stderr.
    pub fn spawn(mut command: Command, dir: &Path, name: &str, quote: Quote) -> Result<Self> {
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
            quote,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Both logs, whole or their tails (see [`Quote`]), for error messages.
    pub fn logs(&self) -> String {
        let read = |path: &Path| std::fs::read_to_string(path).unwrap_or_default();
        match self.quote {
            Quote::Whole => format!(
                "--- {} stdout\n{}--- {} stderr\n{}",
                self.name,
                read(&self.stdout),
                self.name,
                read(&self.stderr)
            ),
            Quote::Tail(lines) => {
                let tail = |path: &Path| {
                    let text = read(path);
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
        }
    }

    /// The rest of the first whole line of either log that contains `marker`.
    fn printed(&self, marker: &str) -> Option<String> {
        [&self.stdout, &self.stderr].into_iter().find_map(|path| {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            // Only whole lines: the process may be writing the last one right now.
            text.split_inclusive('\n')
                .filter(|l| l.ends_with('\n'))
                .find_map(|line| {
                    let i = line.find(marker)?;
                    Some(line[i + marker.len()..].trim().to_owned())
                })
        })
    }

    /// Looks for a line containing `marker` in either log every 20 ms for `within`, calling
    /// `between` after each look (an error from it ends the wait); the rest of that line, or
    /// `None` when `within` passed.
    pub fn watch_for(
        &self,
        marker: &str,
        within: Duration,
        mut between: impl FnMut(&Self) -> Result<()>,
    ) -> Result<Option<String>> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(rest) = self.printed(marker) {
                return Ok(Some(rest));
            }
            between(self)?;
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(None)
    }

    /// Waits for a line containing `marker` in either log; returns the rest of that line.
    /// Fails when the process exits first or `within` passes.
    pub fn wait_for(&self, marker: &str, within: Duration) -> Result<String> {
        match self.watch_for(marker, within, Self::check_alive)? {
            Some(rest) => Ok(rest),
            None => bail!(
                "{} did not print `{marker}` within {within:?}:\n{}",
                self.name,
                self.logs()
            ),
        }
    }

    /// The exit status, once the process has exited.
    pub fn exited(&self) -> std::io::Result<Option<ExitStatus>> {
        self.child
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .try_wait()
    }

    /// Fails if the process has exited.
    pub fn check_alive(&self) -> Result<()> {
        match self.exited() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => bail!("{} exited ({status}):\n{}", self.name, self.logs()),
            Err(e) => bail!("cannot check {}: {e}", self.name),
        }
    }

    /// Its memory now (zero once it is gone).
    pub fn memory(&self) -> Memory {
        Memory::read(self.pid)
    }

    /// Its memory now; an error once it is gone.
    pub fn try_memory(&self) -> Result<Memory> {
        Memory::try_read(self.pid)
    }

    /// Its CPU time so far (clock ticks).
    pub fn cpu_ticks(&self) -> u64 {
        cpu_ticks(&format!("/proc/{}/stat", self.pid))
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
    fn parse(text: &str) -> Self {
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

    /// The memory of process `pid` (zero when it cannot be read).
    pub fn read(pid: u32) -> Self {
        Self::parse(&std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default())
    }

    /// The memory of process `pid`; an error when it cannot be read.
    pub fn try_read(pid: u32) -> Result<Self> {
        let path = format!("/proc/{pid}/status");
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        Ok(Self::parse(&text))
    }

    pub fn rss_mib(self) -> f64 {
        self.rss_kib as f64 / 1024.0
    }

    /// VmRSS and VmHWM (the sidecar benchmark's results).
    pub fn to_json(self) -> Value {
        json!({"vm_rss_kib": self.rss_kib, "vm_hwm_kib": self.hwm_kib})
    }

    /// VmRSS, VmHWM and the thread count (the operator benchmark's results).
    pub fn to_json_with_threads(self) -> Value {
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

/// CPU time of the whole machine so far, all CPUs together: the `cpu` line of /proc/stat
/// (clock ticks; zero when it cannot be read).
#[derive(Clone, Copy, Debug, Default)]
pub struct MachineTicks {
    pub user: u64,
    pub nice: u64,
    pub system: u64,
    pub irq: u64,
    pub softirq: u64,
    /// Time the hypervisor gave to other guests.
    pub steal: u64,
}

impl MachineTicks {
    pub fn read() -> Self {
        let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let Some(line) = text.lines().find(|l| l.starts_with("cpu ")) else {
            return Self::default();
        };
        let f: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|v| v.parse().unwrap_or(0))
            .collect();
        let at = |i: usize| f.get(i).copied().unwrap_or(0);
        Self {
            user: at(0),
            nice: at(1),
            system: at(2),
            irq: at(5),
            softirq: at(6),
            steal: at(7),
        }
    }

    /// user + nice + system + irq + softirq: busy, as the control-plane benchmarks count it.
    pub fn busy(self) -> u64 {
        self.user + self.nice + self.system + self.irq + self.softirq
    }

    /// user + nice + system: busy, as the sidecar benchmark has always counted it (interrupt
    /// time left out).
    pub fn busy_without_irq(self) -> u64 {
        self.user + self.nice + self.system
    }
}

/// Cores' worth of CPU other processes use during `rest` (before anything starts): the
/// machine's busy ticks, counted by `busy`, less this process's.
pub async fn preflight_noise(
    rest: Duration,
    ticks_per_sec: u64,
    busy: fn(MachineTicks) -> u64,
) -> f64 {
    let busy0 = busy(MachineTicks::read());
    let self0 = cpu_ticks("/proc/self/stat");
    tokio::time::sleep(rest).await;
    let busy1 = busy(MachineTicks::read());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_fields() {
        let m = Memory::parse("Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nThreads:\t7\n");
        assert_eq!((m.rss_kib, m.hwm_kib, m.threads), (1024, 2048, 7));
        assert_eq!(m.rss_mib(), 1.0);
        assert_eq!(Memory::parse("").rss_kib, 0);
    }
}
