//! What the policy promises, learned the way `lifeguard policy check --mode standalone` learns
//! it (the same library call, so the same `hash`), and the edits the reload and revocation
//! checks make.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use lifeguard::policy::{CompileMode, EffectivePolicy, ManifestFile, check_files};

/// The compiled policy of a file, with its hash.
pub struct PolicyFacts {
    pub path: PathBuf,
    /// The file as it was when the pack started: what the reload check restores.
    pub text: String,
    pub policy: EffectivePolicy,
    /// `hash` of `lifeguard policy check --output json`.
    pub hash: String,
    /// The target reloads this very file (`--policy`), so the reload check may edit it.
    pub live: bool,
}

impl PolicyFacts {
    /// Compiles `path`; refuses a file with errors, or with other than one McpServerPolicy.
    pub fn load(path: &Path, live: bool) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let policy = compile(path, &text)?;
        Ok(Self {
            path: path.to_owned(),
            hash: policy.hash(),
            text,
            policy,
            live,
        })
    }

    pub fn first_issuer(&self) -> Option<String> {
        self.policy.issuers.first().map(|i| i.issuer.clone())
    }

    /// Every scope the policy requires of `tools`, space-separated.
    pub fn scopes_for(&self, tools: &[&str]) -> String {
        let Some(tasks) = &self.policy.tasks else {
            return String::new();
        };
        let scopes: BTreeSet<&str> = tools.iter().flat_map(|t| tasks.scopes_for(t)).collect();
        scopes.into_iter().collect::<Vec<_>>().join(" ")
    }
}

/// Compiles one policy file as the standalone sidecar would.
pub fn compile(path: &Path, text: &str) -> Result<EffectivePolicy> {
    let file = ManifestFile::parse(path.display().to_string(), text);
    let report = check_files(&[file], CompileMode::Standalone, jiff::Timestamp::now());
    if report.errors() > 0 {
        let findings: Vec<String> = report.findings.iter().map(|f| f.to_string()).collect();
        bail!(
            "{} does not compile:\n  {}",
            path.display(),
            findings.join("\n  ")
        );
    }
    let mut policies = report.policies.into_iter();
    match (policies.next(), policies.next()) {
        (Some(policy), None) => Ok(policy),
        (None, _) => bail!("{} holds no McpServerPolicy", path.display()),
        (Some(_), Some(_)) => bail!(
            "{} holds more than one McpServerPolicy; a sidecar enforces one",
            path.display()
        ),
    }
}

/// `text` with `tool` removed from the flow-style `tools: [a, b, c]` list under `tasks:`, or
/// `None` when the file has no such list naming it (block-style lists are not edited: the pack
/// changes one line, never reformats a file it does not own).
pub fn without_task_tool(text: &str, tool: &str) -> Option<String> {
    let mut in_tasks = false;
    let mut tasks_indent = 0;
    let mut out = Vec::new();
    let mut edited = false;
    for line in text.lines() {
        let indent = line.len() - line.trim_start().len();
        let trimmed = line.trim_start();
        if trimmed.starts_with("tasks:") {
            in_tasks = true;
            tasks_indent = indent;
        } else if in_tasks && !trimmed.is_empty() && !trimmed.starts_with('#') {
            if indent <= tasks_indent {
                in_tasks = false;
            } else if !edited
                && let Some(list) = trimmed.strip_prefix("tools:")
                && let Some(inner) = list
                    .trim()
                    .strip_prefix('[')
                    .and_then(|l| l.strip_suffix(']'))
            {
                let names: Vec<&str> = inner.split(',').map(str::trim).collect();
                if names.contains(&tool) {
                    let kept: Vec<&str> = names.into_iter().filter(|n| *n != tool).collect();
                    out.push(format!("{}tools: [{}]", &line[..indent], kept.join(", ")));
                    edited = true;
                    continue;
                }
            }
        }
        out.push(line.to_owned());
    }
    edited.then(|| {
        let mut joined = out.join("\n");
        if text.ends_with('\n') {
            joined.push('\n');
        }
        joined
    })
}

/// `text` with one more document: a PrincipalRevocation `name` disabling the account of
/// `subject` at `issuer` (`accountDisabled`: every token refused until the object is removed),
/// as an administrator would add it to a standalone policy file.
pub fn with_account_disabled(text: &str, name: &str, issuer: &str, subject: &str) -> String {
    let quote = |v: &str| serde_json::Value::from(v).to_string();
    let revoked_before = jiff::Timestamp::now().to_string();
    let mut out = text.to_owned();
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&format!(
        "---\napiVersion: lifeguard.dev/v1alpha1\nkind: PrincipalRevocation\nmetadata: {{name: {}}}\n\
         spec:\n  issuer: {}\n  subject: {}\n  revokedBefore: {}\n  reason: accountDisabled\n  \
         source: {{kind: manual}}\n",
        quote(name),
        quote(issuer),
        quote(subject),
        quote(&revoked_before),
    ));
    out
}

/// Replaces `path`'s contents atomically (write beside it, then rename), so the sidecar's
/// reload never reads half a file.
pub fn replace_file(path: &Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("evidence-tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_one_tool_from_the_flow_list_under_tasks() {
        let text = "spec:\n  tasks:\n    tools: [write_rows, slow_compute, confirm_action]\n    minPollInterval: 1s\n";
        assert_eq!(
            without_task_tool(text, "slow_compute").unwrap(),
            "spec:\n  tasks:\n    tools: [write_rows, confirm_action]\n    minPollInterval: 1s\n"
        );
        assert!(without_task_tool(text, "greet").is_none());
    }

    #[test]
    fn a_disabled_account_is_one_more_document_that_compiles() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/evidence/policy.yaml"
        ))
        .unwrap();
        let path = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/evidence/policy.yaml"
        ));
        let before = compile(path, &text).unwrap();
        let edited = with_account_disabled(
            &text,
            "evidence-disable-ev1",
            "https://dev-issuer.lifeguard.local",
            "alice",
        );
        assert!(edited.starts_with(&text));
        let after = compile(path, &edited).expect("compiles");
        assert_ne!(
            before.hash(),
            after.hash(),
            "the revocation is part of the policy"
        );
    }

    #[test]
    fn leaves_lists_outside_tasks_and_block_lists_alone() {
        let elsewhere =
            "spec:\n  other:\n    tools: [slow_compute]\n  tasks:\n    minPollInterval: 1s\n";
        assert!(without_task_tool(elsewhere, "slow_compute").is_none());
        let block = "spec:\n  tasks:\n    tools:\n      - slow_compute\n";
        assert!(without_task_tool(block, "slow_compute").is_none());
    }
}
