//! The policy compiler: Lifeguard objects in, one [`EffectivePolicy`] per MCP server out.
//!
//! Pure: no Kubernetes client, no filesystem, no clock. The same code serves the operator, the
//! admission webhook's validation, the sidecar's standalone mode and `lifeguard policy check`.

pub mod check;
pub mod compile;
pub mod effective;
pub mod jws_shape;
pub mod manifest;
pub mod problem;
pub mod uri_pattern;
pub mod validate;

#[cfg(test)]
mod compile_tests;

pub use check::{
    CheckReport, Finding, ManifestFile, StandaloneError, check_files, load_standalone,
};
pub use compile::{Compilation, CompileInput, ObjectKind, ObjectProblem, ObjectRef, compile};
pub use effective::*;
pub use problem::{Problem, Severity};
pub use uri_pattern::UriPattern;
pub use validate::CompileMode;
