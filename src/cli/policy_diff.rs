//! `lifeguard policy diff OLD... -- NEW...`: what a change of manifests does to each server's
//! effective policy, and exit status 1 when it loosens security.

use std::process::ExitCode;

use anyhow::Result;
use lifeguard::policy::diff::{PolicyChange, PolicyDiff, diff_policies};
use lifeguard::policy::{CheckReport, CompileMode, check_files};

use super::policy_files::read_manifests;
use super::{CheckMode, DiffFormat, PolicyDiffArgs};

/// Exit status when either side has errors (1 is "loosens").
const INVALID: u8 = 2;

pub fn run(args: &PolicyDiffArgs) -> Result<ExitCode> {
    let mode = match args.mode {
        CheckMode::Cluster => CompileMode::Cluster,
        CheckMode::Standalone => CompileMode::Standalone,
    };
    let now = jiff::Timestamp::now();
    let old = check_files(&read_manifests(&args.old)?, mode, now);
    let new = check_files(&read_manifests(&args.new)?, mode, now);
    if old.errors() > 0 || new.errors() > 0 {
        report_errors("old", &old);
        report_errors("new", &new);
        return Ok(ExitCode::from(INVALID));
    }
    let diffs = diff_policies(&old.policies, &new.policies);
    let loosens = diffs.iter().any(PolicyDiff::loosens);
    match args.output {
        DiffFormat::Json => {
            let out = serde_json::json!({"policies": diffs, "loosens": loosens});
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
        DiffFormat::Text => print_text(&diffs, loosens),
    }
    Ok(if loosens {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn report_errors(side: &str, report: &CheckReport) {
    for finding in report
        .findings
        .iter()
        .filter(|f| f.problem.severity == lifeguard::policy::Severity::Error)
    {
        eprintln!("{side}: {finding}");
    }
}

fn print_text(diffs: &[PolicyDiff], loosens: bool) {
    for diff in diffs {
        match diff.change {
            PolicyChange::Unchanged => println!("McpServerPolicy {}: unchanged", diff.policy),
            PolicyChange::Added => println!(
                "McpServerPolicy {}: added (LOOSENS: its pods get tasks and listen streams they did not have)",
                diff.policy
            ),
            PolicyChange::Removed => println!(
                "McpServerPolicy {}: removed (its pods fail closed: no tasks, no listen)",
                diff.policy
            ),
            PolicyChange::Changed => {
                let loosening = diff
                    .changes
                    .iter()
                    .filter(|c| c.effect == lifeguard::policy::diff::Effect::Loosens)
                    .count();
                println!(
                    "McpServerPolicy {}: {} change(s), {loosening} loosen security",
                    diff.policy,
                    diff.changes.len()
                );
                for change in &diff.changes {
                    println!("  {change}");
                }
            }
        }
    }
    if diffs.is_empty() {
        println!("no McpServerPolicy on either side");
    }
    println!(
        "{}",
        if loosens {
            "result: the change LOOSENS security (exit status 1): ask for a second approver"
        } else {
            "result: nothing loosens security"
        }
    );
}
