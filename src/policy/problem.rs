//! Problems found in Lifeguard objects, each tied to the field that causes it.

use std::fmt;

use serde::Serialize;

/// How serious a problem is. Errors make an object unusable; warnings are worth a look.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        })
    }
}

/// One problem: severity, field path (`spec.tasks.retention.maxTtl`, `spec.identity.issuers[0]`)
/// in the same notation the API server uses, and a message that says what to change.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Problem {
    pub severity: Severity,
    pub path: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}: {}", self.severity, self.message)
        } else {
            write!(f, "{}: {}: {}", self.severity, self.path, self.message)
        }
    }
}

/// Collects problems while walking an object.
#[derive(Debug, Default)]
pub struct Problems(Vec<Problem>);

impl Problems {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn error(&mut self, path: impl Into<String>, message: impl fmt::Display) {
        self.0.push(Problem {
            severity: Severity::Error,
            path: path.into(),
            message: message.to_string(),
        });
    }

    pub fn warning(&mut self, path: impl Into<String>, message: impl fmt::Display) {
        self.0.push(Problem {
            severity: Severity::Warning,
            path: path.into(),
            message: message.to_string(),
        });
    }

    pub fn has_errors(&self) -> bool {
        self.0.iter().any(|p| p.severity == Severity::Error)
    }

    pub fn into_vec(self) -> Vec<Problem> {
        self.0
    }
}

/// Whether any problem in `problems` is an error.
pub fn any_error<'a>(problems: impl IntoIterator<Item = &'a Problem>) -> bool {
    problems.into_iter().any(|p| p.severity == Severity::Error)
}
