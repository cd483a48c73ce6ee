//! Every example under examples/policies/ through the compiler, the CLI and the generated CRD
//! schemas (OpenAPI structure + CEL rules), as the examples' header comments declare.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

struct Example {
    path: PathBuf,
    text: String,
    expects: Vec<String>,
    crd_schema: Option<String>,
}

fn examples(dir: &str) -> Vec<Example> {
    let mut paths: Vec<PathBuf> = fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(dir))
        .expect("example directory exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "no examples in {dir}");
    paths
        .into_iter()
        .map(|path| {
            let text = fs::read_to_string(&path).unwrap();
            let header = |key: &str| -> Vec<String> {
                text.lines()
                    .filter_map(|l| l.strip_prefix(key))
                    .map(|v| v.trim().to_owned())
                    .collect()
            };
            let expects = header("# expect:");
            let crd_schema = header("# crd-schema:").into_iter().next();
            Example {
                path,
                text,
                expects,
                crd_schema,
            }
        })
        .collect()
}

fn lifeguard(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lifeguard"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run lifeguard");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

fn crd_schema_for(kind: &str) -> Value {
    let file = match kind {
        "McpServerPolicy" => "mcpserverpolicies.yaml",
        "CapabilityException" => "capabilityexceptions.yaml",
        "PrincipalRevocation" => "principalrevocations.yaml",
        other => panic!("no CRD for {other}"),
    };
    let text = fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("crds")
            .join(file),
    )
    .unwrap();
    let crd: Value = serde_saphyr::from_str(&text).unwrap();
    crd.pointer("/spec/versions/0/schema/openAPIV3Schema")
        .cloned()
        .expect("CRD has an openAPIV3Schema")
}

/// What the API server would say about one document: OpenAPI schema violations plus failing
/// CEL rules, both taken from the committed CRD files.
fn crd_violations(document: &Value) -> Vec<String> {
    let kind = document["kind"].as_str().unwrap();
    let schema = crd_schema_for(kind);
    let validator = jsonschema::validator_for(&schema).expect("CRD schema compiles");
    let mut violations: Vec<String> = validator
        .iter_errors(document)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    if let Err(errors) = kube::core::cel::Validator::new().validate(&schema, document, None) {
        violations.extend(errors.iter().map(|e| e.to_string()));
    }
    violations
}

fn documents(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap()
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

#[test]
fn valid_examples_pass_the_cli_the_compiler_and_the_crd_schemas() {
    let valid = examples("examples/policies/valid");
    let files: Vec<String> = valid
        .iter()
        .map(|e| e.path.to_string_lossy().into_owned())
        .collect();
    let mut args = vec!["policy", "check"];
    args.extend(files.iter().map(String::as_str));
    let (code, out) = lifeguard(&args);
    assert_eq!(code, 0, "policy check failed:\n{out}");
    assert!(out.contains("1 policy compiled: 0 error(s)"), "{out}");

    for example in &valid {
        for doc in documents(&example.text) {
            let violations = crd_violations(&doc);
            assert!(
                violations.is_empty(),
                "{} violates its CRD: {violations:?}",
                example.path.display()
            );
        }
    }
}

#[test]
fn every_invalid_example_fails_with_its_documented_message() {
    for example in examples("examples/policies/invalid") {
        let name = example.path.display().to_string();
        assert!(
            !example.expects.is_empty(),
            "{name} has no `# expect:` line"
        );
        let (code, out) = lifeguard(&["policy", "check", &name]);
        assert_eq!(code, 1, "{name} should fail policy check:\n{out}");
        for expected in &example.expects {
            assert!(
                out.contains(expected),
                "{name}: expected `{expected}` in:\n{out}"
            );
        }
    }
}

#[test]
fn invalid_examples_are_refused_by_the_crd_exactly_where_they_say() {
    for example in examples("examples/policies/invalid") {
        let name = example.path.display().to_string();
        let declared = example
            .crd_schema
            .clone()
            .unwrap_or_else(|| panic!("{name} has no `# crd-schema:` line"));
        if declared.starts_with("not-applicable") {
            continue;
        }
        let violations: Vec<String> = documents(&example.text)
            .iter()
            .flat_map(crd_violations)
            .collect();
        match declared.as_str() {
            "rejects" => assert!(
                !violations.is_empty(),
                "{name} says the CRD rejects it, but the schema and CEL rules accept it"
            ),
            "accepts" => assert!(
                violations.is_empty(),
                "{name} says only Lifeguard catches it, but the CRD rejects it: {violations:?}"
            ),
            other => panic!("{name}: unknown crd-schema value `{other}`"),
        }
    }
}

#[test]
fn jwks_file_is_accepted_in_standalone_mode() {
    let (code, out) = lifeguard(&[
        "policy",
        "check",
        "--mode",
        "standalone",
        "examples/policies/invalid/policy-jwks-file-in-cluster.yaml",
    ]);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn json_output_reports_findings_and_policy_hashes() {
    let (code, out) = lifeguard(&[
        "policy",
        "check",
        "--output",
        "json",
        "examples/policies/valid/mcpserverpolicy.yaml",
        "examples/policies/invalid/exception-no-clients.yaml",
    ]);
    assert_eq!(code, 1);
    let report: Value = serde_json::from_str(&out).expect("JSON output");
    assert_eq!(report["errors"], 1, "{out}");
    assert_eq!(report["findings"][0]["problem"]["path"], "spec.clients");
    assert_eq!(
        report["findings"][0]["object"],
        "CapabilityException team-a/reports-sampling"
    );
    assert_eq!(report["policies"][0]["policy"], "team-a/reports");
    assert_eq!(report["policies"][0]["hash"].as_str().unwrap().len(), 64);
}

#[test]
fn unreadable_files_are_errors_not_skips() {
    let (code, out) = lifeguard(&["policy", "check", "examples/policies/does-not-exist.yaml"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("cannot read file"), "{out}");
}

#[test]
fn shared_upstream_task_state_without_a_ledger_is_a_warning_not_an_error() {
    let policy = fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/policies/valid/mcpserverpolicy.yaml"),
    )
    .unwrap()
    .replace(
        "    identity: identityHeaders\n",
        "    identity: identityHeaders\n    taskState: shared\n",
    );
    assert!(policy.contains("taskState: shared"));
    let dir = tempfile::tempdir().unwrap();
    let without = dir.path().join("without-ledger.yaml");
    fs::write(&without, &policy).unwrap();
    let (code, out) = lifeguard(&["policy", "check", without.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("warning: spec.upstream.taskState: is shared but spec.ledger is not set"),
        "{out}"
    );
    assert!(out.contains("0 error(s), 1 warning(s)"), "{out}");

    let with = dir.path().join("with-ledger.yaml");
    fs::write(
        &with,
        format!("{policy}  ledger:\n    connectionSecretRef: {{name: reports-ledger, key: DATABASE_URL}}\n"),
    )
    .unwrap();
    let (code, out) = lifeguard(&["policy", "check", with.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("0 error(s), 0 warning(s)"), "{out}");
    let doc = documents(&fs::read_to_string(&with).unwrap()).remove(0);
    assert_eq!(crd_violations(&doc), Vec::<String>::new());
}
