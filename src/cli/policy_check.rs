//! `lifeguard policy check FILE|DIR...`: every problem with file, line, document, field path and
//! reason, as text, JSON (a stable schema, docs/gitops.md) or GitHub workflow commands.

use std::process::ExitCode;

use anyhow::Result;
use lifeguard::policy::{CheckReport, CompileMode, Finding, Severity, check_files};

use super::policy_files::read_manifests;
use super::{CheckMode, OutputFormat, PolicyCheckArgs};

/// Version of the JSON output's schema; bumped only for a change that is not an addition.
const JSON_SCHEMA_VERSION: u32 = 1;

pub fn run(args: &PolicyCheckArgs) -> Result<ExitCode> {
    let files = read_manifests(&args.files)?;
    let mode = match args.mode {
        CheckMode::Cluster => CompileMode::Cluster,
        CheckMode::Standalone => CompileMode::Standalone,
    };
    let report = check_files(&files, mode, jiff::Timestamp::now());
    match args.output {
        OutputFormat::Text => {
            for finding in &report.findings {
                println!("{finding}");
            }
            println!("{}", summary(files.len(), &report));
        }
        OutputFormat::Github => {
            for finding in &report.findings {
                println!("{}", github_annotation(finding));
            }
            println!("{}", summary(files.len(), &report));
        }
        OutputFormat::Json => {
            let out = serde_json::json!({
                "version": JSON_SCHEMA_VERSION,
                "findings": report.findings,
                "errors": report.errors(),
                "warnings": report.warnings(),
                "policies": report.policies.iter().map(|p| serde_json::json!({
                    "policy": p.policy.to_string(),
                    "hash": p.hash(),
                })).collect::<Vec<_>>(),
            });
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
    }
    Ok(if report.errors() == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn summary(files: usize, report: &CheckReport) -> String {
    format!(
        "{files} file(s), {} polic{} compiled: {} error(s), {} warning(s)",
        report.policies.len(),
        if report.policies.len() == 1 {
            "y"
        } else {
            "ies"
        },
        report.errors(),
        report.warnings()
    )
}

/// One finding as a GitHub Actions workflow command (`::error file=…,line=…,title=…::…`), which
/// marks the line in the pull request's diff.
fn github_annotation(finding: &Finding) -> String {
    let level = match finding.problem.severity {
        Severity::Error => "error",
        Severity::Warning => "warning",
    };
    let mut properties = Vec::new();
    if !finding.file.is_empty() {
        properties.push(format!("file={}", escape_property(&finding.file)));
    }
    if let Some(line) = finding.line {
        properties.push(format!("line={line}"));
    }
    let title = match (&finding.object, finding.problem.path.as_str()) {
        (Some(object), "") => format!("lifeguard: {object}"),
        (Some(object), path) => format!("lifeguard: {object}: {path}"),
        (None, "") => "lifeguard".to_owned(),
        (None, path) => format!("lifeguard: {path}"),
    };
    properties.push(format!("title={}", escape_property(&title)));
    format!(
        "::{level} {}::{}",
        properties.join(","),
        escape_data(&finding.problem.message)
    )
}

/// The escaping GitHub's runner undoes in a command's message.
fn escape_data(text: &str) -> String {
    text.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

/// The escaping of a command's property values (also `:` and `,`, which delimit them).
fn escape_property(text: &str) -> String {
    escape_data(text).replace(':', "%3A").replace(',', "%2C")
}

#[cfg(test)]
mod tests {
    use super::*;
    use lifeguard::policy::Problem;

    #[test]
    fn annotations_carry_file_line_and_title_with_delimiters_escaped() {
        let finding = Finding {
            file: "policies/team-a,reports.yaml".into(),
            line: Some(27),
            document: Some(1),
            object: Some("McpServerPolicy team-a/reports".into()),
            problem: Problem {
                severity: Severity::Error,
                path: "spec.tasks.retention.maxTtl".into(),
                message: "must be at most 24h: 100% too long\nsee docs".into(),
            },
        };
        assert_eq!(
            github_annotation(&finding),
            "::error file=policies/team-a%2Creports.yaml,line=27,\
             title=lifeguard%3A McpServerPolicy team-a/reports%3A spec.tasks.retention.maxTtl\
             ::must be at most 24h: 100%25 too long%0Asee docs"
        );
        let file_level = Finding {
            line: None,
            object: None,
            problem: Problem {
                severity: Severity::Warning,
                path: String::new(),
                message: "m".into(),
            },
            ..finding
        };
        assert_eq!(
            github_annotation(&file_level),
            "::warning file=policies/team-a%2Creports.yaml,title=lifeguard::m"
        );
    }
}
