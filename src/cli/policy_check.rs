//! `lifeguard policy check FILE...`: every problem with file, document, field path and reason.

use std::fs;
use std::process::ExitCode;

use anyhow::Result;
use lifeguard::policy::{CompileMode, ManifestFile, check_files};

use super::{CheckMode, OutputFormat, PolicyCheckArgs};

pub fn run(args: &PolicyCheckArgs) -> Result<ExitCode> {
    let files: Vec<ManifestFile> = args
        .files
        .iter()
        .map(|path| {
            let name = path.display().to_string();
            match fs::read_to_string(path) {
                Ok(text) => ManifestFile::parse(name, &text),
                Err(e) => ManifestFile {
                    name,
                    documents: Err(lifeguard::policy::manifest::YamlSyntaxError(format!(
                        "cannot read file: {e}"
                    ))),
                },
            }
        })
        .collect();
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
            println!(
                "{} file(s), {} polic{} compiled: {} error(s), {} warning(s)",
                files.len(),
                report.policies.len(),
                if report.policies.len() == 1 {
                    "y"
                } else {
                    "ies"
                },
                report.errors(),
                report.warnings()
            );
        }
        OutputFormat::Json => {
            let out = serde_json::json!({
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
