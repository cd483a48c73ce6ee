//! Reading Lifeguard objects from multi-document YAML, the files kubectl would apply.
//!
//! Each document is checked the way the API server would check it (kind and apiVersion, field
//! types, unknown fields, the CRD's CEL rules) before it becomes a typed object, and every
//! problem carries its document number and field path.

use std::sync::LazyLock;

use kube::CustomResourceExt;
use kube::core::cel::{CompiledSchema, ErrorKind, Validator, compile_schema};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::api::{API_VERSION, CapabilityException, McpServerPolicy, PrincipalRevocation};

use super::compile::ObjectRef;
use super::problem::{Problem, Problems};

/// A typed Lifeguard object.
#[derive(Clone, Debug, PartialEq)]
pub enum LifeguardObject {
    Policy(Box<McpServerPolicy>),
    Exception(Box<CapabilityException>),
    Revocation(Box<PrincipalRevocation>),
}

impl LifeguardObject {
    /// Kind, namespace (defaulted) and name.
    pub fn object_ref(&self) -> ObjectRef {
        match self {
            Self::Policy(p) => ObjectRef::policy(p),
            Self::Exception(e) => ObjectRef::exception(e),
            Self::Revocation(r) => ObjectRef::revocation(r),
        }
    }
}

/// One non-empty YAML document.
#[derive(Clone, Debug)]
pub struct Document {
    /// 1-based position among the file's non-empty documents.
    pub index: usize,
    /// `kind` as written, when there is one.
    pub kind: Option<String>,
    /// `metadata.namespace` as written, when there is one.
    pub namespace: Option<String>,
    /// `metadata.name` as written, when there is one.
    pub name: Option<String>,
    /// The typed object, when the document is a well-formed Lifeguard object.
    pub object: Option<LifeguardObject>,
    /// Problems found in this document (schema, unknown fields, CEL rules).
    pub problems: Vec<Problem>,
}

/// A file that is not YAML at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not valid YAML: {0}")]
pub struct YamlSyntaxError(pub String);

/// Largest manifest file accepted. Policy files are small; a bound keeps a mistaken path (a log
/// file, a binary) from exhausting memory.
pub const MAX_MANIFEST_BYTES: usize = 4 * 1024 * 1024;

/// Splits `text` into documents and checks each one.
pub fn parse_manifests(text: &str) -> Result<Vec<Document>, YamlSyntaxError> {
    if text.len() > MAX_MANIFEST_BYTES {
        return Err(YamlSyntaxError(format!(
            "file is larger than {} bytes",
            MAX_MANIFEST_BYTES
        )));
    }
    let values: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| {
        let message = e.to_string();
        YamlSyntaxError(message.trim_start_matches("error: ").to_owned())
    })?;
    Ok(values
        .into_iter()
        .filter(|v| !v.is_null())
        .enumerate()
        .map(|(i, v)| check_document(i + 1, v))
        .collect())
}

struct KindSchema {
    compiled: CompiledSchema,
}

fn kind_schema<K: CustomResourceExt>() -> KindSchema {
    let crd = K::crd();
    let schema = crd
        .spec
        .versions
        .first()
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| serde_json::to_value(s).ok())
        .unwrap_or(Value::Null);
    KindSchema {
        compiled: compile_schema(&schema),
    }
}

static POLICY_SCHEMA: LazyLock<KindSchema> = LazyLock::new(kind_schema::<McpServerPolicy>);
static EXCEPTION_SCHEMA: LazyLock<KindSchema> = LazyLock::new(kind_schema::<CapabilityException>);
static REVOCATION_SCHEMA: LazyLock<KindSchema> = LazyLock::new(kind_schema::<PrincipalRevocation>);
static CEL: LazyLock<std::sync::Mutex<Validator>> =
    LazyLock::new(|| std::sync::Mutex::new(Validator::new()));

/// Evaluates the CRD's CEL rules (creation rules only) against a raw object, as the API server
/// would on `kubectl apply`.
fn cel_problems(schema: &KindSchema, value: &Value, p: &mut Problems) {
    let validator = match CEL.lock() {
        Ok(v) => v,
        Err(poisoned) => poisoned.into_inner(),
    };
    if let Err(errors) = validator.validate_compiled(&schema.compiled, value, None) {
        for e in errors.iter() {
            match e.kind {
                ErrorKind::ValidationFailure => p.error(e.field_path.clone(), &e.message),
                _ => p.error(
                    e.field_path.clone(),
                    format!(
                        "validation rule `{}` could not be evaluated: {}",
                        e.rule, e.message
                    ),
                ),
            }
        }
    }
}

fn typed<T: DeserializeOwned>(value: &Value, p: &mut Problems) -> Option<T> {
    match serde_path_to_error::deserialize::<_, T>(value) {
        Ok(object) => {
            // The API server rejects unknown fields under kubectl's strict field validation;
            // do the same so a typo (`maxTTL`) never silently becomes "use the default".
            let _ = serde_ignored::deserialize::<_, _, T>(value, |path| {
                let path = field_path(&path);
                // kube's generated root types take apiVersion and kind without storing them.
                if path != "apiVersion" && path != "kind" {
                    p.error(path, "unknown field");
                }
            });
            Some(object)
        }
        Err(e) => {
            let path = e.path().to_string();
            let path = if path == "." { String::new() } else { path };
            p.error(path, e.inner());
            None
        }
    }
}

/// Renders a `serde_ignored` path in API-server notation (`spec.issuers[0].claims`).
fn field_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", field_path(parent)),
        Path::Map { parent, key } => {
            let parent = field_path(parent);
            if parent.is_empty() {
                key.clone()
            } else {
                format!("{parent}.{key}")
            }
        }
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => field_path(parent),
    }
}

fn check_document(index: usize, value: Value) -> Document {
    let mut p = Problems::new();
    let kind = value.get("kind").and_then(Value::as_str).map(str::to_owned);
    let name = value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let namespace = value
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let mut document = Document {
        index,
        kind: kind.clone(),
        namespace,
        name,
        object: None,
        problems: Vec::new(),
    };
    if !value.is_object() {
        p.error("", "document is not a YAML mapping");
        document.problems = p.into_vec();
        return document;
    }
    match value.get("apiVersion").and_then(Value::as_str) {
        Some(API_VERSION) => {}
        Some(other) => p.error(
            "apiVersion",
            format!("must be {API_VERSION}, found `{other}`"),
        ),
        None => p.error("apiVersion", format!("is required ({API_VERSION})")),
    }
    let object = match kind.as_deref() {
        Some("McpServerPolicy") => typed::<McpServerPolicy>(&value, &mut p).map(|o| {
            cel_problems(&POLICY_SCHEMA, &value, &mut p);
            LifeguardObject::Policy(Box::new(o))
        }),
        Some("CapabilityException") => typed::<CapabilityException>(&value, &mut p).map(|o| {
            cel_problems(&EXCEPTION_SCHEMA, &value, &mut p);
            LifeguardObject::Exception(Box::new(o))
        }),
        Some("PrincipalRevocation") => typed::<PrincipalRevocation>(&value, &mut p).map(|o| {
            cel_problems(&REVOCATION_SCHEMA, &value, &mut p);
            LifeguardObject::Revocation(Box::new(o))
        }),
        Some(other) => {
            p.error(
                "kind",
                format!(
                    "unsupported kind `{other}`; expected McpServerPolicy, CapabilityException or PrincipalRevocation"
                ),
            );
            None
        }
        None => {
            p.error("kind", "is required");
            None
        }
    };
    document.problems = p.into_vec();
    document.object = object;
    document
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_empty_documents() {
        let docs = parse_manifests("---\n---\nkind: Nope\napiVersion: v1\n---\n").unwrap();
        assert_eq!(docs.len(), 1);
        assert_eq!(docs[0].index, 1);
        assert!(docs[0].problems.iter().any(|p| p.path == "kind"));
        assert!(docs[0].problems.iter().any(|p| p.path == "apiVersion"));
    }

    #[test]
    fn reports_yaml_syntax_errors() {
        assert!(parse_manifests("a: [unclosed\n").is_err());
    }

    #[test]
    fn reports_type_errors_with_their_path() {
        let yaml = r#"
apiVersion: lifeguard.dev/v1alpha1
kind: McpServerPolicy
metadata: {name: x}
spec:
  selector: {}
  resource: https://x.example.com/mcp
  identity: {issuers: [{issuer: https://idp, jwksUri: https://idp/jwks}]}
  tasks: {concurrency: {perPrincipal: many}}
"#;
        let docs = parse_manifests(yaml).unwrap();
        assert!(docs[0].object.is_none());
        assert_eq!(
            docs[0].problems[0].path,
            "spec.tasks.concurrency.perPrincipal"
        );
    }

    #[test]
    fn reports_unknown_fields() {
        let yaml = r#"
apiVersion: lifeguard.dev/v1alpha1
kind: McpServerPolicy
metadata: {name: x}
spec:
  selector: {}
  resource: https://x.example.com/mcp
  identity: {issuers: [{issuer: https://idp, jwksUri: https://idp/jwks}]}
  tasks: {retention: {maxTTL: 1h}}
"#;
        let docs = parse_manifests(yaml).unwrap();
        assert!(docs[0].object.is_some());
        assert_eq!(docs[0].problems.len(), 1, "{:?}", docs[0].problems);
        assert_eq!(docs[0].problems[0].path, "spec.tasks.retention.maxTTL");
        assert_eq!(docs[0].problems[0].message, "unknown field");
    }
}
