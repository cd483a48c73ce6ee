//! Pieces of the human-readable reports and the results files: the heading, the targets and
//! their verdicts, the error summary, and number formats.

use std::fmt::Write as _;

use serde_json::{Value, json};

use super::machine::Machine;
use super::stats::Errors;

/// The first lines of a report: the title, the machine, and, for a smoke run or a debug build,
/// a note that the run only checks that `checks` (e.g. "every phase works").
pub fn heading(o: &mut String, title: &str, mode: &str, m: &Machine, checks: &str) {
    let _ = writeln!(
        o,
        "== Lifeguard {title} benchmark ({mode} mode, {} build) ==",
        m.build
    );
    let _ = writeln!(
        o,
        "machine: {}, {} logical CPUs, Linux {}, {} RAM; commit {}; {}",
        m.cpu,
        m.cpus,
        m.kernel,
        mib(m.mem_total_kib),
        m.git,
        m.started
    );
    if mode == "smoke" || m.build == "debug" {
        let _ = writeln!(
            o,
            "NOTE:    {mode} mode, {} build: checks that {checks}; the numbers mean little",
            m.build
        );
    }
}

/// The end of a report: the errors (`failed` names them, e.g. "error(s)") and the first
/// ones, or `clean` when there were none.
pub fn errors_section<const KEEP: usize, const ECHO: bool>(
    o: &mut String,
    errors: &Errors<KEEP, ECHO>,
    failed: &str,
    clean: &str,
) {
    if errors.count > 0 {
        let _ = writeln!(o, "\nFAILED: {} {failed}; first ones:", errors.count);
        for e in &errors.examples {
            let _ = writeln!(o, "  {e}");
        }
    } else {
        let _ = writeln!(o, "\n{clean}");
    }
}

/// KiB as MiB with one decimal.
pub fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// The three load averages.
pub fn load(l: [f64; 3]) -> String {
    format!("{:.2} {:.2} {:.2}", l[0], l[1], l[2])
}

/// A target from the issue, and what was measured against it; its line in the report prints
/// the numbers with `DECIMALS` decimals (each benchmark names its choice in a type alias).
pub struct Target<const DECIMALS: usize> {
    pub name: String,
    pub measured: f64,
    pub limit: f64,
    pub unit: &'static str,
    /// `true` for "at least" targets (a throughput ratio), else "at most".
    pub at_least: bool,
    /// Why the measurement does not speak to the target (e.g. a smoke run).
    pub not_applicable: Option<String>,
}

impl<const DECIMALS: usize> Target<DECIMALS> {
    pub fn verdict(&self) -> &'static str {
        if self.not_applicable.is_some() {
            "N/A"
        } else if (self.at_least && self.measured >= self.limit)
            || (!self.at_least && self.measured <= self.limit)
        {
            "PASS"
        } else {
            "MISS"
        }
    }

    pub fn line(&self) -> String {
        let cmp = if self.at_least { "≥" } else { "≤" };
        let (m, l, u, d) = (self.measured, self.limit, self.unit, DECIMALS);
        let detail = match self.verdict() {
            "PASS" => format!("margin {:.d$} {u}", (l - m).abs()),
            "MISS" => format!("off by {:.d$} {u}, {:.2}× the limit", (m - l).abs(), m / l),
            _ => self.not_applicable.clone().unwrap_or_default(),
        };
        format!(
            "  [{}] {}: measured {m:.d$} {u} (target {cmp} {l} {u}; {detail})",
            self.verdict(),
            self.name
        )
    }

    pub fn to_json(&self) -> Value {
        json!({
            "target": self.name, "measured": self.measured, "limit": self.limit,
            "unit": self.unit, "comparison": if self.at_least { ">=" } else { "<=" },
            "verdict": self.verdict(), "note": self.not_applicable,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target<const D: usize>(measured: f64, at_least: bool) -> Target<D> {
        Target {
            name: "t".into(),
            measured,
            limit: 2.0,
            unit: "ms",
            at_least,
            not_applicable: None,
        }
    }

    #[test]
    fn lines() {
        assert_eq!(
            target::<1>(1.5, false).line(),
            "  [PASS] t: measured 1.5 ms (target ≤ 2 ms; margin 0.5 ms)"
        );
        assert_eq!(
            target::<2>(3.0, false).line(),
            "  [MISS] t: measured 3.00 ms (target ≤ 2 ms; off by 1.00 ms, 1.50× the limit)"
        );
        assert_eq!(target::<2>(3.0, true).verdict(), "PASS");
    }
}
