//! The report: one JSON document for machines and the same facts as Markdown for reviewers,
//! both named after the UTC time the run started (`evidence-2026-08-01T101500Z.md`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::Value;

use super::probe::Exchange;

/// What a check concluded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Pass,
    Fail,
    /// The check could not run here (it needs an input, or the policy lacks the feature); never
    /// counted as passed.
    NotRun,
}

impl Verdict {
    fn word(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Fail => "FAIL",
            Self::NotRun => "not run",
        }
    }
}

/// One check's record.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckResult {
    pub id: &'static str,
    pub title: &'static str,
    pub proves: &'static str,
    pub does_not_cover: &'static str,
    pub verdict: Verdict,
    /// Why, in one paragraph: the first failure, the reason it did not run, or what held.
    pub reason: String,
    /// Every expectation that did not hold.
    pub failures: Vec<String>,
    /// What the check observed besides its verdict (counts, timings, skipped sub-steps).
    pub notes: Vec<String>,
    pub exchanges: Vec<Exchange>,
    /// The audit lines written while the check ran (empty without --audit-file).
    pub audit: Vec<Value>,
    /// How long the check took, waits included.
    pub elapsed_ms: u64,
}

impl CheckResult {
    pub fn verdict_line(&self) -> String {
        format!(
            "{}: {} ({:.1} s)",
            self.verdict.word(),
            self.reason,
            self.elapsed_ms as f64 / 1000.0
        )
    }
}

/// The policy version as three witnesses tell it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyHashes {
    /// `lifeguard policy check --mode standalone --output json` of the policy file.
    pub policy_check: Option<String>,
    /// Whether `policy_check` must equal the others: only for the file the sidecar reads
    /// (`--policy`); a manifest applied to a cluster compiles there with more inputs.
    pub policy_check_compared: bool,
    /// `--expect-hash`.
    pub expected: Option<String>,
    /// What the sidecar's `/ready` says is in force.
    pub ready: Option<String>,
    /// `policy_hash` of the audit lines of the run (before the reload check changed it).
    pub audit: Option<String>,
}

impl PolicyHashes {
    /// Whether every hash known agrees (and at least two are known).
    fn agree(&self) -> Option<bool> {
        let file = if self.policy_check_compared {
            &self.policy_check
        } else {
            &None
        };
        let known: Vec<&String> = [file, &self.expected, &self.ready, &self.audit]
            .into_iter()
            .flatten()
            .collect();
        (known.len() >= 2).then(|| known.windows(2).all(|w| w[0] == w[1]))
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Build {
    version: &'static str,
    commit: Option<&'static str>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct PolicyInfo {
    file: Option<String>,
    name: Option<String>,
    hashes: PolicyHashes,
    hashes_agree: Option<bool>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Summary {
    passed: usize,
    failed: usize,
    not_run: usize,
}

/// The whole report.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    generated_at: String,
    lifeguard: Build,
    target: String,
    admin: Option<String>,
    policy: PolicyInfo,
    summary: Summary,
    checks: Vec<CheckResult>,
    #[serde(skip)]
    started: jiff::Timestamp,
}

impl Report {
    pub fn new(
        started: jiff::Timestamp,
        target: String,
        admin: Option<String>,
        policy: Option<(String, String)>,
        hashes: PolicyHashes,
        checks: Vec<CheckResult>,
    ) -> Self {
        let count = |v| checks.iter().filter(|c| c.verdict == v).count();
        let summary = Summary {
            passed: count(Verdict::Pass),
            failed: count(Verdict::Fail),
            not_run: count(Verdict::NotRun),
        };
        let (file, name) = policy.unzip();
        Self {
            generated_at: started.to_string(),
            lifeguard: Build {
                version: env!("CARGO_PKG_VERSION"),
                // Set by a release build that knows its commit; plain `cargo build` leaves it out.
                commit: option_env!("LIFEGUARD_GIT_COMMIT"),
            },
            target,
            admin,
            policy: PolicyInfo {
                file,
                name,
                hashes_agree: hashes.agree(),
                hashes,
            },
            summary,
            checks,
            started,
        }
    }

    pub fn count(&self, verdict: Verdict) -> usize {
        self.checks.iter().filter(|c| c.verdict == verdict).count()
    }

    /// Writes both files into `dir` (created if missing); returns their paths.
    pub fn write(&self, dir: &Path) -> Result<(PathBuf, PathBuf)> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let stem = format!("evidence-{}", self.started.strftime("%Y-%m-%dT%H%M%SZ"));
        let md = dir.join(format!("{stem}.md"));
        let json = dir.join(format!("{stem}.json"));
        std::fs::write(&md, self.markdown())
            .with_context(|| format!("writing {}", md.display()))?;
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(&json, text).with_context(|| format!("writing {}", json.display()))?;
        Ok((md, json))
    }

    fn markdown(&self) -> String {
        let mut md = String::new();
        let hashes = &self.policy.hashes;
        let show = |h: &Option<String>| h.clone().unwrap_or_else(|| "—".to_owned());
        let _ = writeln!(md, "# Lifeguard evidence pack\n");
        let _ = writeln!(md, "| | |\n|---|---|");
        let _ = writeln!(md, "| date (UTC) | {} |", self.generated_at);
        let _ = writeln!(
            md,
            "| lifeguard | {}{} |",
            self.lifeguard.version,
            self.lifeguard
                .commit
                .map(|c| format!(" ({c})"))
                .unwrap_or_default()
        );
        let _ = writeln!(md, "| target | `{}` |", self.target);
        let _ = writeln!(
            md,
            "| admin | {} |",
            self.admin
                .as_deref()
                .map_or("—".to_owned(), |a| format!("`{a}`"))
        );
        let _ = writeln!(
            md,
            "| policy | {} {} |",
            self.policy.name.as_deref().unwrap_or("—"),
            self.policy
                .file
                .as_deref()
                .map(|f| format!("(`{f}`)"))
                .unwrap_or_default()
        );
        let _ = writeln!(
            md,
            "| policy hash: `policy check` | `{}`{} |",
            show(&hashes.policy_check),
            if hashes.policy_check_compared || hashes.policy_check.is_none() {
                ""
            } else {
                " (not compared: the file is not what the sidecar reads)"
            }
        );
        if hashes.expected.is_some() {
            let _ = writeln!(
                md,
                "| policy hash: `--expect-hash` | `{}` |",
                show(&hashes.expected)
            );
        }
        let _ = writeln!(md, "| policy hash: `/ready` | `{}` |", show(&hashes.ready));
        let _ = writeln!(
            md,
            "| policy hash: audit `policy_hash` | `{}` |",
            show(&hashes.audit)
        );
        let agree = match self.policy.hashes_agree {
            Some(true) => "yes",
            Some(false) => "**NO**",
            None => "fewer than two known",
        };
        let _ = writeln!(md, "| hashes agree | {agree} |");
        let _ = writeln!(
            md,
            "| result | {} passed, {} failed, {} not run |\n",
            self.summary.passed, self.summary.failed, self.summary.not_run
        );

        let _ = writeln!(md, "## Checks\n\n| check | verdict | why |\n|---|---|---|");
        for check in &self.checks {
            let _ = writeln!(
                md,
                "| [{}](#{}) | {} | {} |",
                check.id,
                check.id,
                check.verdict.word(),
                one_line(&check.reason)
            );
        }
        for check in &self.checks {
            check_section(&mut md, check);
        }
        md
    }
}

fn check_section(md: &mut String, check: &CheckResult) {
    let _ = writeln!(md, "\n## {}\n", check.id);
    let _ = writeln!(md, "**{}**\n", check.title);
    let _ = writeln!(md, "- Proves: {}", check.proves);
    let _ = writeln!(md, "- Does not cover: {}", check.does_not_cover);
    let _ = writeln!(
        md,
        "- Verdict: **{}**: {}",
        check.verdict.word(),
        check.reason
    );
    for failure in &check.failures {
        let _ = writeln!(md, "  - failed: {failure}");
    }
    for note in &check.notes {
        let _ = writeln!(md, "  - note: {note}");
    }
    if !check.exchanges.is_empty() {
        let _ = writeln!(md, "\n### Requests and answers\n");
    }
    for (n, exchange) in check.exchanges.iter().enumerate() {
        let _ = writeln!(
            md,
            "{}. {} ({} ms)\n",
            n + 1,
            exchange.label,
            exchange.elapsed_ms
        );
        let mut block = format!("{} {}\n", exchange.request.method, exchange.request.url);
        for (name, value) in &exchange.request.headers {
            let _ = writeln!(block, "{name}: {value}");
        }
        let _ = writeln!(block, "\n{}", exchange.request.body);
        match (&exchange.answer, &exchange.error) {
            (Some(answer), _) => {
                let _ = writeln!(block, "\n→ HTTP {}", answer.status);
                for (name, value) in &answer.headers {
                    let _ = writeln!(block, "{name}: {value}");
                }
                let _ = writeln!(block, "\n{}", answer.body);
            }
            (None, Some(error)) => {
                let _ = writeln!(block, "\n→ no answer: {error}");
            }
            (None, None) => {}
        }
        fenced(md, "http", &block);
    }
    if !check.audit.is_empty() {
        let _ = writeln!(md, "\n### Audit lines written meanwhile\n");
        let lines: Vec<String> = check.audit.iter().map(Value::to_string).collect();
        fenced(md, "json", &lines.join("\n"));
    }
}

/// A fenced block indented under a list item, with a fence longer than any run of backticks
/// inside (answers are data, and may hold anything).
fn fenced(md: &mut String, lang: &str, text: &str) {
    let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest.max(2) + 1);
    let _ = writeln!(md, "{fence}{lang}");
    let _ = writeln!(md, "{}", text.trim_end());
    let _ = writeln!(md, "{fence}\n");
}

fn one_line(text: &str) -> String {
    text.replace('\n', " ").replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_agree_only_when_every_known_one_matches() {
        let h = |a: Option<&str>, b: Option<&str>, c: Option<&str>| PolicyHashes {
            policy_check: a.map(str::to_owned),
            policy_check_compared: true,
            expected: None,
            ready: b.map(str::to_owned),
            audit: c.map(str::to_owned),
        };
        assert_eq!(h(Some("x"), Some("x"), Some("x")).agree(), Some(true));
        assert_eq!(h(Some("x"), None, Some("y")).agree(), Some(false));
        assert_eq!(h(Some("x"), None, None).agree(), None);
    }

    #[test]
    fn fences_outgrow_backticks_in_the_text() {
        let mut md = String::new();
        fenced(&mut md, "json", "a ```` b");
        assert!(md.starts_with("`````json\n"), "{md}");
    }
}
