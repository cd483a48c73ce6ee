//! Golden files: every case under `tests/fixtures/injection/cases` through the real
//! AdmissionReview wire, compared with `golden/`; see that directory's README.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine;
use serde_json::{Value, json};

use crate::api::McpServerPolicy;
use crate::webhook::admission::{InjectOutcome, inject_response, parse_review, review_json};
use crate::webhook::config::WebhookFileConfig;
use crate::webhook::inject::{Candidate, decide};
use crate::webhook::reasons::SkipReason;

const OWN_NAMESPACE: &str = "lifeguard";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/injection")
}

fn yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn policies() -> Vec<McpServerPolicy> {
    let text = std::fs::read_to_string(fixtures().join("policies.yaml")).unwrap();
    serde_saphyr::from_multiple::<McpServerPolicy>(&text).unwrap()
}

fn config(case: &Value) -> WebhookFileConfig {
    let text = std::fs::read_to_string(fixtures().join("webhook-config.yaml")).unwrap();
    let mut config = WebhookFileConfig::parse("webhook-config.yaml", &text).unwrap();
    if let Some(required) = case.get("injectionRequired").and_then(Value::as_bool) {
        config.defaults.injection_required = required;
    }
    if let Some(otel) = case.get("sidecarOtel") {
        config.sidecar.otel = Some(serde_json::from_value(otel.clone()).unwrap());
    }
    config
}

fn review(pod: &Value, namespace: &str, dry_run: bool) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace, "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod, "oldObject": null, "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        }
    }))
    .unwrap()
}

/// Runs one pod through `/inject`'s logic; returns the response as JSON and the outcome.
fn admit(case: &Value, pod: &Value, dry_run: bool) -> (Value, InjectOutcome) {
    let namespace = case["namespace"].as_str().unwrap();
    let labels: Option<BTreeMap<String, String>> =
        serde_json::from_value(case["namespaceLabels"].clone()).unwrap();
    let policies = policies();
    let in_namespace: Vec<&McpServerPolicy> = policies
        .iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
        .collect();
    let config = config(case);
    let request = parse_review(&review(pod, namespace, dry_run)).unwrap();
    let (response, outcome) = inject_response(&request, |pod, ns| {
        decide(&Candidate {
            pod,
            namespace: ns,
            namespace_labels: labels.as_ref(),
            policies: &in_namespace,
            own_namespace: OWN_NAMESPACE,
            config: &config,
        })
    });
    (review_json(response)["response"].take(), outcome)
}

fn decoded_patch(response: &Value) -> Value {
    let encoded = response["patch"].as_str().unwrap_or("W10=");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

fn apply(pod: &Value, patch: &Value) -> Value {
    let mut out = pod.clone();
    let patch: json_patch::Patch = serde_json::from_value(patch.clone()).unwrap();
    json_patch::patch(&mut out, &patch).unwrap();
    out
}

#[test]
fn golden_every_case_matches_its_golden_file() {
    let update = std::env::var_os("LIFEGUARD_UPDATE_GOLDEN").is_some();
    let mut cases: Vec<PathBuf> = std::fs::read_dir(fixtures().join("cases"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    cases.sort();
    assert!(cases.len() >= 15, "cases went missing: {cases:?}");
    let mut mismatches = Vec::new();
    for path in cases {
        let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
        let case = yaml(&path);
        let pod = &case["pod"];
        let (response, _) = admit(&case, pod, false);
        let patch = decoded_patch(&response);
        let mut golden = json!({
            "allowed": response["allowed"],
            "warnings": response.get("warnings").cloned().unwrap_or(json!([])),
            "patch": patch,
        });
        if response["allowed"] == json!(false) {
            golden["message"] = response["status"]["message"].clone();
        } else {
            golden["pod"] = apply(pod, &patch);
        }
        let golden_path = fixtures().join("golden").join(format!("{name}.yaml"));
        let rendered = format!(
            "# Generated from cases/{name}.yaml; see ../README.md.\n{}",
            serde_saphyr::to_string(&golden).unwrap()
        );
        if update {
            std::fs::write(&golden_path, &rendered).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&golden_path).unwrap_or_default();
        if expected != rendered {
            mismatches.push(format!(
                "{name}:\n--- expected\n{expected}\n+++ got\n{rendered}"
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "golden mismatch (LIFEGUARD_UPDATE_GOLDEN=1 regenerates):\n{}",
        mismatches.join("\n")
    );
}

#[test]
fn golden_injection_is_idempotent_and_dry_run_identical() {
    for name in [
        "injected-native",
        "injected-regular-container",
        "injected-pod-label-opt-in",
        "injected-port-collision",
        "injected-shared-ledger",
        "injected-shared-ledger-port-collision",
        "injected-task-state-shared",
        "injected-upstream-http2",
        "injected-client-http2",
        "injected-status-annotation-only",
    ] {
        let case = yaml(&fixtures().join("cases").join(format!("{name}.yaml")));
        let pod = &case["pod"];
        let (real, outcome) = admit(&case, pod, false);
        let (dry, _) = admit(&case, pod, true);
        assert_eq!(outcome, InjectOutcome::Injected, "{name}");
        assert_eq!(
            real, dry,
            "{name}: a dry run must answer exactly as the real request"
        );
        let injected = apply(pod, &decoded_patch(&real));
        let (again, outcome) = admit(&case, &injected, false);
        assert_eq!(
            outcome,
            InjectOutcome::Skipped(SkipReason::AlreadyInjected),
            "{name}"
        );
        assert_eq!(
            decoded_patch(&again),
            json!([]),
            "{name}: second pass must be a no-op"
        );
        assert!(again.get("warnings").is_none(), "{name}");
    }
}

#[test]
fn golden_skip_reasons_are_reported_as_annotation_and_warning() {
    for (name, reason) in [
        ("skip-host-network", SkipReason::HostNetwork),
        ("skip-opted-out", SkipReason::OptedOut),
        ("skip-not-opted-in", SkipReason::NotOptedIn),
        ("skip-no-policy", SkipReason::NoPolicy),
        ("skip-no-named-port", SkipReason::NoNamedPort),
        ("skip-unsupported-probe", SkipReason::UnsupportedProbe),
        ("skip-system-namespace", SkipReason::SystemNamespace),
        ("skip-lifeguard-component", SkipReason::LifeguardComponent),
        ("skip-already-injected", SkipReason::AlreadyInjected),
        (
            "skip-shared-process-namespace",
            SkipReason::SharedProcessNamespace,
        ),
        ("skip-ambiguous-port", SkipReason::AmbiguousPort),
        ("skip-foreign-sidecar", SkipReason::ForeignSidecar),
        ("skip-foreign-volume-mount", SkipReason::ForeignSidecar),
    ] {
        let case = yaml(&fixtures().join("cases").join(format!("{name}.yaml")));
        let (response, outcome) = admit(&case, &case["pod"], false);
        assert_eq!(outcome, InjectOutcome::Skipped(reason), "{name}");
        assert_eq!(response["allowed"], json!(true), "{name}");
        let patch = decoded_patch(&response);
        if reason.is_reported() {
            let patched = apply(&case["pod"], &patch);
            assert_eq!(
                patched["metadata"]["annotations"]["lifeguard.dev/injection-skipped"],
                json!(reason.as_str()),
                "{name}"
            );
            assert!(
                patched["metadata"]["annotations"]
                    .get("lifeguard.dev/status")
                    .is_none(),
                "{name}: a skipped pod never claims a sidecar"
            );
            let warnings = response["warnings"].as_array().unwrap();
            assert_eq!(warnings.len(), 1, "{name}");
            assert!(
                warnings[0].as_str().unwrap().contains(reason.as_str()),
                "{name}"
            );
        } else {
            assert_eq!(patch, json!([]), "{name}: empty patch");
            assert!(response.get("warnings").is_none(), "{name}: no warning");
        }
    }
}

#[test]
fn golden_required_policies_deny_with_the_reason() {
    for (name, reason, policy) in [
        ("deny-required-opted-out", SkipReason::OptedOut, "billing"),
        ("deny-default-required", SkipReason::NoNamedPort, "reports"),
        (
            "deny-required-shared-process-namespace",
            SkipReason::SharedProcessNamespace,
            "billing",
        ),
        (
            "deny-required-ambiguous-port",
            SkipReason::AmbiguousPort,
            "billing",
        ),
        (
            "deny-required-foreign-sidecar",
            SkipReason::ForeignSidecar,
            "billing",
        ),
        (
            "deny-required-lifeguard-component",
            SkipReason::LifeguardComponent,
            "billing",
        ),
    ] {
        let case = yaml(&fixtures().join("cases").join(format!("{name}.yaml")));
        let (response, outcome) = admit(&case, &case["pod"], false);
        assert_eq!(outcome, InjectOutcome::Denied(reason), "{name}");
        assert_eq!(response["allowed"], json!(false));
        let message = response["status"]["message"].as_str().unwrap();
        assert!(
            message.contains(reason.as_str()) && message.contains(policy),
            "{message}"
        );
    }
}

#[test]
fn golden_non_pod_or_non_create_requests_pass_untouched() {
    let case = yaml(&fixtures().join("cases/injected-native.yaml"));
    let mut body: Value = serde_json::from_slice(&review(&case["pod"], "team-a", false)).unwrap();
    body["request"]["operation"] = json!("UPDATE");
    let request = parse_review(&serde_json::to_vec(&body).unwrap()).unwrap();
    let (response, outcome) = inject_response(&request, |_, _| panic!("not consulted"));
    assert_eq!(outcome, InjectOutcome::Ignored);
    assert!(response.allowed && response.patch.is_none());
}

#[test]
fn golden_shared_ledger_comes_from_the_secret_and_the_hop_is_advertised() {
    let case = yaml(&fixtures().join("cases/injected-shared-ledger.yaml"));
    let (response, outcome) = admit(&case, &case["pod"], false);
    assert_eq!(outcome, InjectOutcome::Injected);
    let pod = apply(&case["pod"], &decoded_patch(&response));
    let sidecar = &pod["spec"]["initContainers"][0];
    assert_eq!(sidecar["name"], json!("lifeguard-sidecar"));

    let args: Vec<&str> = sidecar["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        !args.iter().any(|a| a.starts_with("--ledger")),
        "an argument would override LIFEGUARD_LEDGER: {args:?}"
    );
    let listen = args.iter().position(|a| *a == "--internal-listen").unwrap();
    assert_eq!(args[listen + 1], "0.0.0.0:15021");

    let env = sidecar["env"].as_array().unwrap();
    let index = |name: &str| env.iter().position(|e| e["name"] == json!(name)).unwrap();
    let ledger = &env[index("LIFEGUARD_LEDGER")];
    assert!(ledger.get("value").is_none(), "never the value: {ledger}");
    assert_eq!(
        ledger["valueFrom"],
        json!({"secretKeyRef": {"name": "jobs-ledger", "key": "DATABASE_URL"}})
    );
    assert_eq!(
        env[index("LIFEGUARD_LEDGER_SCOPE")]["value"],
        json!("team-a/jobs")
    );
    assert_eq!(
        env[index("POD_IP")]["valueFrom"],
        json!({"fieldRef": {"fieldPath": "status.podIP"}})
    );
    assert!(
        index("POD_IP") < index("LIFEGUARD_INTERNAL_ADVERTISE"),
        "$(POD_IP) expands only from variables declared before it"
    );
    assert_eq!(
        env[index("LIFEGUARD_INTERNAL_ADVERTISE")]["value"],
        json!("$(POD_IP):15021")
    );
    assert!(
        sidecar["ports"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "lifeguard-hop", "containerPort": 15021, "protocol": "TCP"}))
    );
}

/// One change to a pod.
type Edit<'a> = Box<dyn Fn(&mut Value) + 'a>;

/// Every change to an injected pod that the webhook would not have made turns "already
/// injected" into "not injected": the status annotation and the names prove nothing.
#[test]
fn golden_a_pod_that_only_looks_injected_is_not_injected() {
    for name in [
        "injected-native",
        "injected-regular-container",
        "injected-shared-ledger",
        "injected-port-collision",
    ] {
        let case = yaml(&fixtures().join("cases").join(format!("{name}.yaml")));
        let pod = &case["pod"];
        let (real, _) = admit(&case, pod, false);
        let injected = apply(pod, &decoded_patch(&real));
        let list = if injected["spec"]["initContainers"]
            .as_array()
            .is_some_and(|l| l.iter().any(|c| c["name"] == "lifeguard-sidecar"))
        {
            "initContainers"
        } else {
            "containers"
        };
        let sidecar_index = injected["spec"][list]
            .as_array()
            .unwrap()
            .iter()
            .position(|c| c["name"] == "lifeguard-sidecar")
            .unwrap();
        let sidecar = format!("/spec/{list}/{sidecar_index}");
        let edits: Vec<(&str, Edit<'_>)> = vec![
            (
                "image",
                Box::new(|p| {
                    p.pointer_mut(&format!("{sidecar}/image"))
                        .map(|v| *v = json!("evil/pause:1"))
                        .unwrap()
                }),
            ),
            (
                "command",
                Box::new(|p| {
                    p.pointer_mut(&sidecar).unwrap()["command"] = json!(["sleep", "inf"]);
                }),
            ),
            (
                "an arg",
                Box::new(|p| {
                    p.pointer_mut(&format!("{sidecar}/args/2"))
                        .map(|v| *v = json!("https://evil.example.com"))
                        .unwrap();
                }),
            ),
            (
                "an env var",
                Box::new(|p| {
                    p.pointer_mut(&format!("{sidecar}/env"))
                        .unwrap()
                        .as_array_mut()
                        .unwrap()
                        .push(json!({"name": "RUST_LOG", "value": "off"}));
                }),
            ),
            (
                "the security context",
                Box::new(|p| {
                    p.pointer_mut(&format!("{sidecar}/securityContext/runAsUser"))
                        .map(|v| *v = json!(0))
                        .unwrap();
                }),
            ),
            (
                "the listen port",
                Box::new(|p| {
                    p.pointer_mut(&format!("{sidecar}/ports/0/containerPort"))
                        .map(|v| *v = json!(9999))
                        .unwrap();
                }),
            ),
            (
                "a hostPort",
                Box::new(|p| {
                    p.pointer_mut(&format!("{sidecar}/ports/0")).unwrap()["hostPort"] =
                        json!(30080);
                }),
            ),
            (
                "the token volume",
                Box::new(|p| {
                    let v = p["spec"]["volumes"].as_array_mut().unwrap();
                    let t = v
                        .iter_mut()
                        .find(|v| v["name"] == "lifeguard-token")
                        .unwrap();
                    *t = json!({"name": "lifeguard-token", "secret": {"secretName": "stolen"}});
                }),
            ),
            (
                "a volume removed",
                Box::new(|p| {
                    p["spec"]["volumes"]
                        .as_array_mut()
                        .unwrap()
                        .retain(|v| v["name"] != "lifeguard-ca");
                }),
            ),
            (
                "the status annotation",
                Box::new(|p| {
                    p["metadata"]["annotations"]
                        .as_object_mut()
                        .unwrap()
                        .remove("lifeguard.dev/status");
                }),
            ),
            (
                "the upstream env of the MCP container",
                Box::new(|p| {
                    p["spec"]["containers"][0]["env"]
                        .as_array_mut()
                        .unwrap()
                        .retain(|e| e["name"] != "LIFEGUARD_UPSTREAM_PORT");
                }),
            ),
            (
                "the MCP port still declared",
                Box::new(|p| {
                    p["spec"]["containers"][0]["ports"] =
                        json!([{"name": "mcp", "containerPort": 7000}]);
                }),
            ),
            (
                "a second sidecar",
                Box::new(|p| {
                    let c = p.pointer(&sidecar).unwrap().clone();
                    p["spec"]["containers"].as_array_mut().unwrap().push(c);
                }),
            ),
            (
                "a mount of the token",
                Box::new(|p| {
                    p["spec"]["containers"][0]["volumeMounts"] =
                        json!([{"name": "lifeguard-token", "mountPath": "/t"}]);
                }),
            ),
            (
                "shareProcessNamespace",
                Box::new(|p| {
                    p["spec"]["shareProcessNamespace"] = json!(true);
                }),
            ),
        ];
        for (what, edit) in edits {
            let mut forged = injected.clone();
            edit(&mut forged);
            let (response, outcome) = admit(&case, &forged, false);
            assert!(
                matches!(
                    outcome,
                    InjectOutcome::Skipped(r) if r != SkipReason::AlreadyInjected
                ) || matches!(outcome, InjectOutcome::Denied(_)),
                "{name}, {what}: {outcome:?} {response}"
            );
            assert!(
                response.get("warnings").is_some(),
                "{name}, {what}: reported"
            );
        }
    }
}
