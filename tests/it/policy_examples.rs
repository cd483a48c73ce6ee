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

/// The 1-based line of `text` that starts (after indentation) with `prefix`.
fn line_starting(text: &str, prefix: &str) -> usize {
    text.lines()
        .position(|l| l.trim_start().starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starts with {prefix:?}"))
        + 1
}

#[test]
fn findings_name_the_line_of_their_field_in_every_output() {
    let file = "examples/policies/invalid/exception-no-clients.yaml";
    let text = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
    let line = line_starting(&text, "clients:");

    let (code, out) = lifeguard(&["policy", "check", file]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("{file}:{line}: document 1")), "{out}");

    let (code, out) = lifeguard(&["policy", "check", "--output", "json", file]);
    assert_eq!(code, 1, "{out}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["version"], 1);
    assert_eq!(report["findings"][0]["line"], line, "{out}");
    assert_eq!(report["findings"][0]["file"], file);

    let (code, out) = lifeguard(&["policy", "check", "--output", "github", file]);
    assert_eq!(code, 1, "{out}");
    let annotation = out.lines().next().unwrap();
    assert_eq!(
        annotation,
        format!(
            "::error file={file},line={line},title=lifeguard%3A CapabilityException \
             team-a/reports-sampling%3A spec.clients::must list at least one client id"
        ),
        "{out}"
    );
    assert!(
        out.contains("1 file(s), 0 policies compiled: 1 error(s)"),
        "{out}"
    );
}

#[test]
fn check_reads_directories_recursively() {
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("team-a/nested");
    fs::create_dir_all(&nested).unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/policies/valid");
    for name in ["mcpserverpolicy.yaml", "capabilityexception.yaml"] {
        fs::copy(root.join(name), nested.join(name)).unwrap();
    }
    fs::write(dir.path().join("notes.txt"), "not a manifest").unwrap();
    let (code, out) = lifeguard(&["policy", "check", dir.path().to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("2 file(s), 1 policy compiled: 0 error(s)"),
        "{out}"
    );
}

/// Writes `policy` (the valid example edited by `edit`) and the example exception into `dir`.
fn policy_dir(dir: &Path, edit: impl Fn(String) -> String) {
    fs::create_dir_all(dir).unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/policies/valid");
    let policy = fs::read_to_string(root.join("mcpserverpolicy.yaml")).unwrap();
    fs::write(dir.join("policy.yaml"), edit(policy)).unwrap();
    fs::copy(
        root.join("capabilityexception.yaml"),
        dir.join("capabilityexception.yaml"),
    )
    .unwrap();
}

#[test]
fn diff_says_what_changed_and_fails_only_when_security_loosens() {
    let dir = tempfile::tempdir().unwrap();
    let (old, tighter, looser) = (
        dir.path().join("old"),
        dir.path().join("tighter"),
        dir.path().join("looser"),
    );
    policy_dir(&old, |p| p);
    policy_dir(&tighter, |p| p.replace("maxTtl: 1h", "maxTtl: 30m"));
    policy_dir(&looser, |p| {
        p.replace("perPrincipal: 5", "perPrincipal: 10")
            .replace("      bulk_update: [reports:write]\n", "")
    });
    let path = |p: &Path| p.to_str().unwrap().to_owned();

    let (code, out) = lifeguard(&["policy", "diff", &path(&old), "--", &path(&tighter)]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("McpServerPolicy team-a/reports: 1 change(s), 0 loosen security"),
        "{out}"
    );
    assert!(
        out.contains("tightens tasks.retention.maxTtl 1h → 30m"),
        "{out}"
    );
    assert!(out.contains("result: nothing loosens security"), "{out}");

    let (code, out) = lifeguard(&["policy", "diff", &path(&old), "--", &path(&looser)]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("LOOSENS  tasks.concurrency.perPrincipal 5 → 10"),
        "{out}"
    );
    assert!(
        out.contains("LOOSENS  tasks.requiredScopes.bulk_update: removed reports:write"),
        "{out}"
    );

    let (code, out) = lifeguard(&[
        "policy",
        "diff",
        "--output",
        "json",
        &path(&old),
        "--",
        &path(&looser),
    ]);
    assert_eq!(code, 1, "{out}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["loosens"], true);
    let changes = &report["policies"][0]["changes"];
    assert_eq!(changes.as_array().unwrap().len(), 2, "{out}");
    assert_eq!(changes[0]["field"], "tasks.concurrency.perPrincipal");
    assert_eq!(changes[0]["before"], "5");
    assert_eq!(changes[0]["after"], "10");
    assert_eq!(changes[0]["effect"], "loosens");

    // The same manifests: nothing to say, exit 0.
    let (code, out) = lifeguard(&["policy", "diff", &path(&old), "--", &path(&old)]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("McpServerPolicy team-a/reports: unchanged"),
        "{out}"
    );
}

#[test]
fn diff_refuses_invalid_manifests_with_exit_status_2() {
    let dir = tempfile::tempdir().unwrap();
    policy_dir(dir.path(), |p| p);
    let invalid = "examples/policies/invalid/policy-bad-duration.yaml";
    let (code, out) = lifeguard(&[
        "policy",
        "diff",
        dir.path().to_str().unwrap(),
        "--",
        invalid,
    ]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains(&format!("new: {invalid}:")), "{out}");
    let (code, out) = lifeguard(&["policy", "diff", dir.path().to_str().unwrap()]);
    assert_eq!(code, 2, "no NEW side is a usage error: {out}");
}
