//! Checking a set of manifest files as a whole: per-document problems, duplicates, exceptions
//! that target nothing, and a full compile of every McpServerPolicy found. Shared by
//! `lifeguard policy check` and the sidecar's standalone policy loader.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use jiff::Timestamp;
use serde::Serialize;

use crate::api::{CapabilityException, PrincipalRevocation};

use super::compile::{CompileInput, ObjectRef, compile, targets};
use super::effective::EffectivePolicy;
use super::locate::{DocumentLines, document_lines, syntax_error_line};
use super::manifest::{Document, LifeguardObject, YamlSyntaxError, parse_manifests};
use super::problem::{Problem, Problems, Severity};
use super::validate::{CompileMode, validate_exception, validate_revocation};

/// One manifest file's contents, by name.
#[derive(Clone, Debug)]
pub struct ManifestFile {
    pub name: String,
    pub documents: Result<Vec<Document>, YamlSyntaxError>,
    /// Where each document's fields are written (empty when the text is not YAML).
    pub lines: Vec<DocumentLines>,
    /// The line of a YAML syntax error, when the parser says.
    pub syntax_error_line: Option<u32>,
}

impl ManifestFile {
    /// Parses `text` as the file called `name`.
    pub fn parse(name: impl Into<String>, text: &str) -> Self {
        let documents = parse_manifests(text);
        let syntax_error_line = match &documents {
            Err(_) => syntax_error_line(text),
            Ok(_) => None,
        };
        Self {
            name: name.into(),
            documents,
            lines: document_lines(text),
            syntax_error_line,
        }
    }

    /// A file that could not be read.
    pub fn unreadable(name: impl Into<String>, error: &std::io::Error) -> Self {
        Self {
            name: name.into(),
            documents: Err(YamlSyntaxError(format!("cannot read file: {error}"))),
            lines: Vec::new(),
            syntax_error_line: None,
        }
    }

    /// The line of `path` in document `document` (1-based), when known.
    fn line_of(&self, document: usize, path: &str) -> Option<u32> {
        self.lines
            .get(document.checked_sub(1)?)
            .map(|lines| lines.line_of(path))
    }
}

/// A problem located in a file and document.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Finding {
    pub file: String,
    /// 1-based line the problem points at (its field, else the nearest written parent, else
    /// the document's first line); `None` when unknown (an unreadable file).
    pub line: Option<u32>,
    /// 1-based document number; `None` for problems of the whole file.
    pub document: Option<usize>,
    /// `Kind namespace/name` of the object, when known.
    pub object: Option<String>,
    pub problem: Problem,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(doc) = self.document {
            write!(f, ": document {doc}")?;
        }
        if let Some(object) = &self.object {
            write!(f, " ({object})")?;
        }
        write!(f, ": {}", self.problem)
    }
}

/// Findings plus every policy that compiled.
#[derive(Clone, Debug, Default)]
pub struct CheckReport {
    pub findings: Vec<Finding>,
    pub policies: Vec<EffectivePolicy>,
}

impl CheckReport {
    pub fn errors(&self) -> usize {
        self.findings
            .iter()
            .filter(|f| f.problem.severity == Severity::Error)
            .count()
    }

    pub fn warnings(&self) -> usize {
        self.findings.len() - self.errors()
    }
}

/// Where an object was read: its file and document.
#[derive(Clone, Copy)]
struct Location<'a> {
    file: &'a ManifestFile,
    document: usize,
}

impl Location<'_> {
    /// `problem` of the object here, with the line its field path points at.
    fn finding(&self, object: Option<String>, problem: Problem) -> Finding {
        Finding {
            file: self.file.name.clone(),
            line: self.file.line_of(self.document, &problem.path),
            document: Some(self.document),
            object,
            problem,
        }
    }
}

fn describe(document: &Document) -> Option<String> {
    if let Some(object) = &document.object {
        return Some(object.object_ref().to_string());
    }
    let kind = document.kind.as_deref()?;
    Some(match (&document.namespace, &document.name) {
        (Some(ns), Some(name)) => format!("{kind} {ns}/{name}"),
        (None, Some(name)) => format!("{kind} {name}"),
        _ => kind.to_owned(),
    })
}

/// A file that is not YAML (or could not be read), as the finding that reports it.
fn syntax_finding(file: &ManifestFile, error: &YamlSyntaxError) -> Finding {
    Finding {
        file: file.name.clone(),
        line: file.syntax_error_line,
        document: None,
        object: None,
        problem: Problem {
            severity: Severity::Error,
            path: String::new(),
            message: error.to_string(),
        },
    }
}

/// The problems one document has on its own (schema, unknown fields, CEL rules), located.
fn document_problems(file: &ManifestFile, document: &Document) -> Vec<Finding> {
    let here = Location {
        file,
        document: document.index,
    };
    let object_name = describe(document);
    document
        .problems
        .iter()
        .map(|problem| here.finding(object_name.clone(), problem.clone()))
        .collect()
}

/// What is wrong with `file`'s documents before any compile: the YAML syntax error, or each
/// document's own problems, as `check_files` reports them (the same text, line and object), so
/// every command that reads a manifest fails on a bad one with the words `policy check` uses.
pub fn document_findings(file: &ManifestFile) -> Vec<Finding> {
    match &file.documents {
        Err(e) => vec![syntax_finding(file, e)],
        Ok(documents) => documents
            .iter()
            .flat_map(|d| document_problems(file, d))
            .collect(),
    }
}

/// Checks every document of every file and compiles every McpServerPolicy with the exceptions
/// and revocations found alongside it.
pub fn check_files(files: &[ManifestFile], mode: CompileMode, now: Timestamp) -> CheckReport {
    let mut findings = Vec::new();
    let mut located: BTreeMap<ObjectRef, Location<'_>> = BTreeMap::new();
    // Objects whose documents already failed API-server-level checks are still compiled (so
    // every problem shows in one run) but never reported as usable policies.
    let mut rejected: HashSet<ObjectRef> = HashSet::new();
    let mut policies = Vec::new();
    let mut exceptions: Vec<CapabilityException> = Vec::new();
    let mut revocations: Vec<PrincipalRevocation> = Vec::new();

    for file in files {
        let documents = match &file.documents {
            Ok(documents) => documents,
            Err(e) => {
                findings.push(syntax_finding(file, e));
                continue;
            }
        };
        for document in documents {
            let object_name = describe(document);
            let here = Location {
                file,
                document: document.index,
            };
            findings.extend(document_problems(file, document));
            let Some(object) = &document.object else {
                continue;
            };
            let key = object.object_ref();
            if super::problem::any_error(&document.problems) {
                rejected.insert(key.clone());
            }
            if let Some(first) = located.get(&key) {
                findings.push(here.finding(
                    object_name,
                    Problem {
                        severity: Severity::Error,
                        path: "metadata.name".into(),
                        message: format!(
                            "duplicate object: already defined in {} document {}",
                            first.file.name, first.document
                        ),
                    },
                ));
                continue;
            }
            located.insert(key, here);
            match object {
                LifeguardObject::Policy(p) => policies.push((**p).clone()),
                LifeguardObject::Exception(e) => exceptions.push((**e).clone()),
                LifeguardObject::Revocation(r) => revocations.push((**r).clone()),
            }
        }
    }

    let locate = |object: &ObjectRef| located.get(object).copied();
    duplicate_grants(&exceptions, &mut findings, &locate);
    let mut compiled = Vec::new();
    for policy in &policies {
        let compilation = compile(CompileInput {
            policy,
            exceptions: &exceptions,
            revocations: &revocations,
            mode,
            now,
        });
        for p in compilation.problems {
            findings.push(place_finding(locate(&p.object), &p.object, p.problem));
        }
        if !rejected.contains(&ObjectRef::policy(policy)) {
            compiled.extend(compilation.effective);
        }
    }

    // Objects no policy compile looked at still get their own checks.
    for exception in exceptions
        .iter()
        .filter(|e| !policies.iter().any(|p| targets(e, p)))
    {
        let object = ObjectRef::exception(exception);
        let mut p = Problems::new();
        validate_exception(exception, &mut p);
        p.warning(
            "spec.policyRef.name",
            format!(
                "no McpServerPolicy `{}` in namespace `{}` among the checked files",
                exception.spec.policy_ref.name,
                object.namespace.as_deref().unwrap_or_default()
            ),
        );
        push_object_problems(&mut findings, &object, p, &locate);
    }
    if policies.is_empty() {
        for revocation in &revocations {
            let object = ObjectRef::revocation(revocation);
            let mut p = Problems::new();
            validate_revocation(revocation, &mut p);
            push_object_problems(&mut findings, &object, p, &locate);
        }
    }

    CheckReport {
        findings: dedupe(findings),
        policies: compiled,
    }
}

/// Two objects carrying one signed grant (a copy under another name) are an error: budgets
/// belong to the grant, so the copy grants nothing more, and in a repository it is a mistake
/// or an attempt to multiply what the approver signed.
fn duplicate_grants<'a>(
    exceptions: &[crate::api::CapabilityException],
    findings: &mut Vec<Finding>,
    locate: &impl Fn(&ObjectRef) -> Option<Location<'a>>,
) {
    // One grant: the same spec (signature included) in the same namespace — exactly what the
    // approver signed, since the name is not signed.
    let mut first: HashMap<(String, String), ObjectRef> = HashMap::new();
    for exception in exceptions {
        let object = ObjectRef::exception(exception);
        let namespace = object.namespace.clone().unwrap_or_default();
        let Ok(spec) = serde_json::to_string(&exception.spec) else {
            continue;
        };
        let key = (namespace, spec);
        match first.get(&key) {
            Some(original) => {
                let mut p = Problems::new();
                p.error(
                    "spec.signature",
                    format!(
                        "carries the same signed grant as {original}: a copy under another name shares its budgets and grants nothing more; keep one"
                    ),
                );
                push_object_problems(findings, &object, p, locate);
            }
            None => {
                first.insert(key, object);
            }
        }
    }
}

fn push_object_problems<'a>(
    findings: &mut Vec<Finding>,
    object: &ObjectRef,
    problems: Problems,
    locate: &impl Fn(&ObjectRef) -> Option<Location<'a>>,
) {
    let place = locate(object);
    for problem in problems.into_vec() {
        findings.push(place_finding(place, object, problem));
    }
}

/// A problem of `object`, at the document it was read from (when it was read from one).
fn place_finding(place: Option<Location<'_>>, object: &ObjectRef, problem: Problem) -> Finding {
    match place {
        Some(place) => place.finding(Some(object.to_string()), problem),
        None => Finding {
            file: String::new(),
            line: None,
            document: None,
            object: Some(object.to_string()),
            problem,
        },
    }
}

/// The CRD's CEL rules and the compiler state shared invariants with identical messages, and
/// revocations are checked once per policy; report each distinct problem once, in order.
fn dedupe(findings: Vec<Finding>) -> Vec<Finding> {
    let mut seen = HashSet::new();
    findings
        .into_iter()
        .filter(|f| {
            seen.insert((
                f.file.clone(),
                f.document,
                f.problem.path.clone(),
                f.problem.message.clone(),
            ))
        })
        .collect()
}

/// Why a standalone policy file cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StandaloneError {
    #[error("{} error(s) in the policy file:\n{}", .0.len(), render(.0))]
    Invalid(Vec<Finding>),
    #[error("the policy file must contain exactly one McpServerPolicy, found {0}")]
    PolicyCount(usize),
}

fn render(findings: &[Finding]) -> String {
    findings
        .iter()
        .map(|f| format!("  {f}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Loads the policy of `lifeguard sidecar --policy FILE`: exactly one McpServerPolicy, any
/// CapabilityExceptions and PrincipalRevocations, and no errors at all (a file with any error
/// is refused whole, so a typo can never weaken enforcement). Warnings are returned alongside.
pub fn load_standalone(
    name: &str,
    text: &str,
    now: Timestamp,
) -> Result<(EffectivePolicy, Vec<Finding>), StandaloneError> {
    let file = ManifestFile::parse(name, text);
    let report = check_files(std::slice::from_ref(&file), CompileMode::Standalone, now);
    let (errors, warnings): (Vec<_>, Vec<_>) = report
        .findings
        .into_iter()
        .partition(|f| f.problem.severity == Severity::Error);
    if !errors.is_empty() {
        return Err(StandaloneError::Invalid(errors));
    }
    let count = report.policies.len();
    let mut policies = report.policies;
    match (count, policies.pop()) {
        (1, Some(policy)) => Ok((policy, warnings)),
        _ => Err(StandaloneError::PolicyCount(count)),
    }
}
