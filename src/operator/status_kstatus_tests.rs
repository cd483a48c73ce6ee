//! Every status the operator writes, rendered into its object and read by the kstatus rules
//! (`crate::api::kstatus`, what Flux and `kubectl wait`-style tooling compute): the health a
//! GitOps tool shows for each state of each kind.

use std::sync::Arc;

use serde_json::{Value, json};

use super::*;
use crate::api::kstatus::{KStatus, compute};
use crate::operator::plan::CompiledPolicy;
use crate::policy::{CompileMode, ManifestFile, check_files};

fn now() -> Timestamp {
    "2026-12-03T12:00:00Z".parse().unwrap()
}

/// The object as the API server would return it: `generation` in metadata, the status.
fn object(kind: &str, generation: i64, status: impl serde::Serialize) -> Value {
    json!({
        "apiVersion": "lifeguard.dev/v1alpha1", "kind": kind,
        "metadata": {"name": "x", "namespace": "team-a", "generation": generation},
        "status": serde_json::to_value(status).unwrap(),
    })
}

fn compiled() -> Arc<CompiledPolicy> {
    let text = include_str!("../../examples/policies/valid/mcpserverpolicy.yaml");
    let report = check_files(
        &[ManifestFile::parse("p.yaml", text)],
        CompileMode::Cluster,
        now(),
    );
    let effective = report
        .policies
        .into_iter()
        .next()
        .expect("the example compiles");
    Arc::new(CompiledPolicy {
        hash: effective.hash(),
        json: Arc::from(serde_json::value::to_raw_value(&effective).unwrap()),
        revocations: Default::default(),
        revocation_traces: Default::default(),
        revocation_traces_json: None,
        effective,
    })
}

fn policy_plan(compiled: Option<Arc<CompiledPolicy>>) -> PolicyPlan {
    PolicyPlan {
        generation: Some(4),
        errors: if compiled.is_none() {
            vec!["spec.tasks.retention.maxTtl: must not be shorter than defaultTtl".into()]
        } else {
            Vec::new()
        },
        compiled,
        matched_pods: 3,
        shadowed_by: None,
    }
}

fn policy_object(plan: &PolicyPlan, in_sync: i32) -> Value {
    let sidecars = PolicySidecars {
        assigned: 3,
        in_sync,
    };
    let status = policy_status(plan, sidecars, &Default::default(), now());
    object("McpServerPolicy", 4, status)
}

fn policy_health(plan: &PolicyPlan, in_sync: i32) -> KStatus {
    compute(&policy_object(plan, in_sync)).status
}

#[test]
fn a_policy_is_current_when_every_sidecar_runs_it_in_progress_before_and_failed_when_it_does_not_compile()
 {
    let plan = policy_plan(Some(compiled()));
    assert_eq!(policy_health(&plan, 3), KStatus::Current);
    assert_eq!(policy_health(&plan, 1), KStatus::InProgress);
    let broken = policy_plan(None);
    assert_eq!(policy_health(&broken, 0), KStatus::Failed);
    // No pod selected: nothing to wait for.
    let status = policy_status(
        &plan,
        PolicySidecars {
            assigned: 0,
            in_sync: 0,
        },
        &Default::default(),
        now(),
    );
    assert_eq!(
        compute(&object("McpServerPolicy", 4, status)).status,
        KStatus::Current
    );
}

#[test]
fn a_status_of_an_older_generation_is_in_progress_whatever_it_says() {
    let plan = policy_plan(Some(compiled()));
    let sidecars = PolicySidecars {
        assigned: 3,
        in_sync: 3,
    };
    let status = policy_status(&plan, sidecars, &Default::default(), now());
    // The user applied generation 5; the operator has not written its status yet.
    let health = compute(&object("McpServerPolicy", 5, status));
    assert_eq!(health.status, KStatus::InProgress);
    assert_eq!(
        health.message,
        "McpServerPolicy generation is 5, but latest observed generation is 4"
    );
}

fn exception_health(state: ExceptionState, reason: &'static str) -> KStatus {
    compute(&exception_object(state, reason)).status
}

fn exception_object(state: ExceptionState, reason: &'static str) -> Value {
    let plan = ExceptionPlan {
        generation: Some(1),
        state,
        approver: Some("security-approver-1".into()),
        reason,
        message: format!("state {reason}"),
        signature_verified: !matches!(state, ExceptionState::Invalid),
        capability: crate::api::ExceptionCapability::Sampling,
        expires_at: now(),
        duplicates: Vec::new(),
    };
    let status = exception_status(&plan, &Default::default(), now());
    object("CapabilityException", 1, status)
}

#[test]
fn an_exception_is_current_while_active_in_progress_before_its_window_and_failed_after_or_when_invalid()
 {
    assert_eq!(
        exception_health(ExceptionState::Active, reasons::ACTIVE),
        KStatus::Current
    );
    assert_eq!(
        exception_health(ExceptionState::NotYetValid, reasons::NOT_YET_VALID),
        KStatus::InProgress
    );
    assert_eq!(
        exception_health(ExceptionState::Expired, reasons::EXPIRED),
        KStatus::Failed
    );
    for reason in [
        reasons::BAD_SIGNATURE,
        reasons::UNKNOWN_KEY,
        reasons::KEY_REVOKED,
        reasons::POLICY_NOT_FOUND,
    ] {
        assert_eq!(
            exception_health(ExceptionState::Invalid, reason),
            KStatus::Failed,
            "{reason}"
        );
    }
}

fn revocation_object(done: bool) -> Value {
    let propagation = Propagation {
        target: 4,
        acknowledged: if done { 4 } else { 3 },
        tasks_cancelled: 2,
        streams_closed: 1,
        completed_at: done.then(now),
        propagation_millis: done.then_some(850),
    };
    let status = revocation_status(Some(1), &propagation, &Default::default(), now());
    object("PrincipalRevocation", 1, status)
}

#[test]
fn a_revocation_is_in_progress_until_every_targeted_sidecar_applied_it() {
    let propagating = Propagation {
        target: 4,
        acknowledged: 3,
        tasks_cancelled: 2,
        streams_closed: 1,
        completed_at: None,
        propagation_millis: None,
    };
    let status = revocation_status(Some(1), &propagating, &Default::default(), now());
    assert_eq!(
        compute(&object("PrincipalRevocation", 1, status)).status,
        KStatus::InProgress
    );
    let done = Propagation {
        acknowledged: 4,
        completed_at: Some(now()),
        propagation_millis: Some(850),
        ..propagating
    };
    let status = revocation_status(Some(1), &done, &Default::default(), now());
    let object = object("PrincipalRevocation", 1, status);
    assert_eq!(compute(&object).status, KStatus::Current);
    // `kubectl wait --for=condition=Ready` reads this condition, with the generation it describes.
    let ready = object["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap();
    assert_eq!(ready["status"], "True");
    assert_eq!(ready["observedGeneration"], 1);
}

/// Every state of every kind, with what kstatus and Argo CD's health (the chart's
/// `argocd/health.lua`) make of it.
fn states() -> Vec<(&'static str, Value, KStatus, &'static str)> {
    let plan = policy_plan(Some(compiled()));
    let mut unobserved = policy_object(&plan, 3);
    unobserved["metadata"]["generation"] = json!(5);
    let mut fresh = policy_object(&plan, 3);
    fresh.as_object_mut().unwrap().remove("status");
    vec![
        (
            "policy in sync",
            policy_object(&plan, 3),
            KStatus::Current,
            "Healthy",
        ),
        (
            "policy syncing",
            policy_object(&plan, 1),
            KStatus::InProgress,
            "Progressing",
        ),
        (
            "policy broken",
            policy_object(&policy_plan(None), 0),
            KStatus::Failed,
            "Degraded",
        ),
        (
            "policy unobserved",
            unobserved,
            KStatus::InProgress,
            "Progressing",
        ),
        // kstatus calls an object without status Current; Argo CD waits for the operator.
        (
            "policy without status",
            fresh,
            KStatus::Current,
            "Progressing",
        ),
        (
            "exception active",
            exception_object(ExceptionState::Active, reasons::ACTIVE),
            KStatus::Current,
            "Healthy",
        ),
        (
            "exception not yet valid",
            exception_object(ExceptionState::NotYetValid, reasons::NOT_YET_VALID),
            KStatus::InProgress,
            "Progressing",
        ),
        (
            "exception expired",
            exception_object(ExceptionState::Expired, reasons::EXPIRED),
            KStatus::Failed,
            "Degraded",
        ),
        (
            "exception badly signed",
            exception_object(ExceptionState::Invalid, reasons::BAD_SIGNATURE),
            KStatus::Failed,
            "Degraded",
        ),
        (
            "revocation propagating",
            revocation_object(false),
            KStatus::InProgress,
            "Progressing",
        ),
        (
            "revocation applied",
            revocation_object(true),
            KStatus::Current,
            "Healthy",
        ),
    ]
}

#[test]
fn kstatus_reads_every_state_of_every_kind_as_documented() {
    for (name, object, want, _) in states() {
        assert_eq!(compute(&object).status, want, "{name}: {object:#}");
    }
}

/// The Python of the test environment (`scripts/test.sh` installs lupa into it).
fn python() -> std::path::PathBuf {
    std::env::var_os("LIFEGUARD_TEST_PYTHON")
        .map(Into::into)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/interop-venv/bin/python")
        })
}

#[test]
fn argo_cd_health_lua_reads_every_state_of_every_kind_as_documented() {
    use std::io::Write;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = python();
    assert!(
        python.exists(),
        "{} is missing: run scripts/test.sh, which installs the Python test peers (lupa)",
        python.display()
    );
    let mut child = std::process::Command::new(&python)
        .arg(root.join("tests/argocd/health.py"))
        .arg(root.join("charts/lifeguard/argocd/health.lua"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the Lua runner");
    let cases = states();
    {
        let mut stdin = child.stdin.take().unwrap();
        for (name, object, ..) in &cases {
            writeln!(stdin, "{}", json!({"name": name, "object": object})).unwrap();
        }
    }
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "the Lua runner failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let answers: Vec<Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers.len(), cases.len());
    for ((name, object, _, want), answer) in cases.iter().zip(&answers) {
        assert_eq!(answer["name"], *name);
        assert_eq!(answer["status"], *want, "{name}: {answer} for {object:#}");
    }
    // Degraded and Progressing say why.
    let broken = &answers[2];
    assert!(
        broken["message"]
            .as_str()
            .unwrap()
            .starts_with("CompileError: spec.tasks.retention.maxTtl"),
        "{broken}"
    );
}

#[test]
fn the_argo_cd_values_snippet_carries_the_script_unchanged_for_each_kind() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/lifeguard/argocd");
    let script = std::fs::read_to_string(root.join("health.lua")).unwrap();
    let values: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(root.join("argocd-values.yaml")).unwrap())
            .unwrap();
    for kind in [
        "McpServerPolicy",
        "CapabilityException",
        "PrincipalRevocation",
    ] {
        let key = format!("resource.customizations.health.lifeguard.dev_{kind}");
        assert_eq!(
            values["configs"]["cm"][&key].as_str(),
            Some(script.as_str()),
            "{key} differs from health.lua"
        );
    }
}
