//! `lifeguard exception sign | verify | payload`.

use std::fs;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use lifeguard::api::{CapabilityException, ExceptionState};
use lifeguard::exception::{ApproverTrust, describe_header, sign, signing_payload, verify};
use lifeguard::policy::manifest::LifeguardObject;
use lifeguard::policy::{Severity, document_findings};

use super::policy_files::parse_manifest_file;

/// The CapabilityExceptions of a file, with their namespaces. The file is read the way
/// `lifeguard policy check` reads it: a document that does not parse, or that the API server
/// would refuse (schema, unknown field, CEL rule), is an error with the very words, line and
/// object `policy check` prints, never an exception silently left out of the count.
fn exceptions_in(path: &Path) -> Result<(String, Vec<(CapabilityException, String)>)> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let file = parse_manifest_file(path, &text);
    let errors: Vec<String> = document_findings(&file)
        .iter()
        .filter(|f| f.problem.severity == Severity::Error)
        .map(|f| format!("  {f}"))
        .collect();
    if !errors.is_empty() {
        bail!(
            "{} is not a valid manifest ({} error(s), as `lifeguard policy check` reports them):\n{}",
            path.display(),
            errors.len(),
            errors.join("\n")
        );
    }
    let mut found = Vec::new();
    for document in file.documents.iter().flatten() {
        if let Some(LifeguardObject::Exception(e)) = &document.object {
            let namespace = e
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".to_owned());
            found.push(((**e).clone(), namespace));
        }
    }
    Ok((text, found))
}

pub fn sign_file(key: &Path, kid: &str, in_place: bool, file: &Path) -> Result<ExitCode> {
    let (text, found) = exceptions_in(file)?;
    let [(exception, namespace)] = found.as_slice() else {
        bail!(
            "{} holds {} CapabilityExceptions; sign exactly one per file",
            file.display(),
            found.len()
        );
    };
    let key_pem = fs::read(key).with_context(|| format!("reading {}", key.display()))?;
    let signature = sign(&exception.spec, namespace, &key_pem, kid)?;
    // Replace only the value of the `signature:` line, so comments and layout reviewers read
    // stay as they are.
    let mut replaced = 0;
    let signed: Vec<String> = text
        .lines()
        .map(|line| {
            let trimmed = line.trim_start();
            if trimmed.starts_with("signature:") {
                replaced += 1;
                let indent = &line[..line.len() - trimmed.len()];
                format!("{indent}signature: {signature}")
            } else {
                line.to_owned()
            }
        })
        .collect();
    if replaced != 1 {
        bail!(
            "{} must contain exactly one `signature:` line under spec (put a placeholder, e.g. `signature: unsigned`)",
            file.display()
        );
    }
    let output = signed.join("\n") + "\n";
    if in_place {
        fs::write(file, output).with_context(|| format!("writing {}", file.display()))?;
        eprintln!("signed {} as {kid}", file.display());
    } else {
        print!("{output}");
    }
    Ok(ExitCode::SUCCESS)
}

pub fn verify_files(keys: &Path, files: &[std::path::PathBuf]) -> Result<ExitCode> {
    let bytes = fs::read(keys).with_context(|| format!("reading {}", keys.display()))?;
    let trust =
        ApproverTrust::from_json(&bytes).map_err(|e| anyhow::anyhow!("{}: {e}", keys.display()))?;
    let now = jiff::Timestamp::now();
    let mut all_active = true;
    for file in files {
        let found = match exceptions_in(file) {
            Ok((_, found)) => found,
            Err(e) => {
                // One bad file fails the run but does not hide the others' results.
                eprintln!("error: {e:#}");
                all_active = false;
                continue;
            }
        };
        if found.is_empty() {
            println!("{}: no CapabilityException", file.display());
            all_active = false;
        }
        for (exception, namespace) in found {
            let name = exception.metadata.name.clone().unwrap_or_default();
            println!("{}: CapabilityException {namespace}/{name}", file.display());
            if let Some(header) = describe_header(&exception.spec.signature) {
                println!("  header: {header}");
            }
            let verification = verify(&exception.spec, &namespace, &trust, now);
            for check in &verification.checks {
                match &check.result {
                    Ok(detail) => println!("  ok    {}: {detail}", check.check),
                    Err(detail) => println!("  FAIL  {}: {detail}", check.check),
                }
            }
            println!("  state: {:?}", verification.state);
            all_active &= verification.state == ExceptionState::Active;
        }
    }
    Ok(if all_active {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

pub fn payload(file: &Path) -> Result<ExitCode> {
    let (_, found) = exceptions_in(file)?;
    let [(exception, namespace)] = found.as_slice() else {
        bail!(
            "{} must hold exactly one CapabilityException",
            file.display()
        );
    };
    let bytes = signing_payload(&exception.spec, namespace).map_err(|e| anyhow::anyhow!(e))?;
    use std::io::Write;
    std::io::stdout().write_all(&bytes)?;
    Ok(ExitCode::SUCCESS)
}
