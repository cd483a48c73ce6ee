//! The Helm charts (`charts/lifeguard`, `charts/lifeguard-crds`), checked offline.
//!
//! - The CRD chart's templates are the committed `crds/*.yaml` plus the annotation
//!   `helm.sh/resource-policy: keep`, byte for byte (checked here, in Rust).
//! - `tests/chart/check_chart.py` (PyPI `helm-python-sdk`, which embeds Helm v4, and
//!   `kubernetes-validate`) lints both charts strictly, renders them with the default values and
//!   every certificate mode, validates each manifest against the oldest and newest supported
//!   Kubernetes, compares the default rendering with `tests/chart/golden/default.yaml`, checks the
//!   properties a reviewer looks for, and validates every example custom resource against the
//!   CRDs' schemas. Helm's `lookup` (certificates kept across upgrades) runs against the
//!   Kubernetes API emulator of `tests/kube_emulator/`.
//! - The generated certificates complete a TLS handshake through Lifeguard's own TLS code.
//!
//! `LIFEGUARD_UPDATE_GOLDEN=1 cargo test --test it helm_chart::` rewrites the CRD chart's templates
//! and the golden file instead of comparing them.

use crate::support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use lifeguard::runtime::tls::ReloadingCertificate;
use lifeguard::runtime::tls_client::client_config;
use rustls_pki_types::ServerName;

const UPDATE_ENV: &str = "LIFEGUARD_UPDATE_GOLDEN";
const KEEP_ANNOTATION: &str = "  annotations:\n    helm.sh/resource-policy: keep\n";

fn updating() -> bool {
    std::env::var_os(UPDATE_ENV).is_some_and(|v| v == "1")
}

/// The CRD chart's template for the committed CRD `file` with content `crd`: the generated
/// header replaced by one naming the source, and the keep annotation added to `metadata`.
fn chart_template(file: &str, crd: &str) -> Result<String, String> {
    if crd.contains("{{") {
        return Err(format!(
            "crds/{file} contains `{{{{`, which Helm would read as a template action"
        ));
    }
    let body: String = crd
        .lines()
        .skip_while(|line| line.starts_with('#'))
        .map(|line| format!("{line}\n"))
        .collect();
    let Some((head, rest)) = body.split_once("\nmetadata:\n") else {
        return Err(format!("crds/{file} has no top-level `metadata:` line"));
    };
    if rest.starts_with("  annotations:") {
        return Err(format!(
            "crds/{file} already has metadata.annotations: teach chart_template to merge them"
        ));
    }
    Ok(format!(
        "# crds/{file} with `helm.sh/resource-policy: keep`, so `helm uninstall` never deletes\n\
         # the CRD (and with it every object of its kind). Written by\n\
         # `{UPDATE_ENV}=1 cargo test --test it helm_chart::`; do not edit.\n\
         {head}\nmetadata:\n{KEEP_ANNOTATION}{rest}"
    ))
}

#[test]
fn crd_chart_templates_are_the_committed_crds_with_the_keep_annotation() {
    let repo = support::repo();
    let crds = repo.join("crds");
    let templates = repo.join("charts/lifeguard-crds/templates");
    let mut names: Vec<String> = fs::read_dir(&crds)
        .expect("crds/ exists")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    names.sort();
    assert_eq!(
        names.len(),
        3,
        "expected the three Lifeguard CRDs, found {names:?}"
    );

    let mut problems = Vec::new();
    for name in &names {
        let crd = fs::read_to_string(crds.join(name)).unwrap();
        let expected = chart_template(name, &crd).unwrap_or_else(|e| panic!("{e}"));
        let path = templates.join(name);
        if updating() {
            fs::write(&path, &expected).unwrap();
            continue;
        }
        match fs::read_to_string(&path) {
            Ok(actual) if actual == expected => {}
            Ok(_) => problems.push(format!("{} differs from crds/{name}", path.display())),
            Err(e) => problems.push(format!("{} cannot be read: {e}", path.display())),
        }
    }
    for entry in fs::read_dir(&templates).expect("charts/lifeguard-crds/templates exists") {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if !names.contains(&name) {
            problems.push(format!(
                "charts/lifeguard-crds/templates/{name} has no counterpart in crds/"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{}\nRegenerate with: {UPDATE_ENV}=1 cargo test --test it helm_chart::",
        problems.join("\n")
    );
}

#[test]
fn chart_template_adds_the_annotation_and_refuses_what_it_cannot_copy() {
    let crd = "# generated\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n\
               metadata:\n  name: things.example.dev\nspec: {}\n";
    let template = chart_template("things.yaml", crd).unwrap();
    assert!(
        template.starts_with("# crds/things.yaml with"),
        "{template}"
    );
    assert!(
        template.ends_with(
            "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  \
             annotations:\n    helm.sh/resource-policy: keep\n  name: things.example.dev\n\
             spec: {}\n"
        ),
        "{template}"
    );
    assert!(!template.contains("# generated"));

    let err = chart_template("t.yaml", "metadata:\n  name: x\n  description: '{{ x }}'\n");
    assert!(err.unwrap_err().contains("template action"));
    let err = chart_template("t.yaml", "apiVersion: v1\nkind: X\nspec: {}\n");
    assert!(err.unwrap_err().contains("no top-level `metadata:`"));
    let err = chart_template("t.yaml", "kind: X\nmetadata:\n  annotations:\n    a: b\n");
    assert!(
        err.unwrap_err()
            .contains("already has metadata.annotations")
    );
}

/// Runs one part of `tests/chart/check_chart.py` and fails with its whole output.
fn check_chart(part: &str) {
    check_chart_with(part, &[]);
}

fn check_chart_with(part: &str, env: &[(&str, &Path)]) {
    let script = support::repo().join("tests/chart/check_chart.py");
    let output = Command::new(support::python::python())
        .arg(&script)
        .arg(part)
        .envs(env.iter().copied())
        .current_dir(support::repo())
        .output()
        .expect("run tests/chart/check_chart.py");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "check_chart.py {part} failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    // The script ends every successful part with this line; its absence means it stopped early.
    assert!(
        stdout.contains(&format!("check_chart {part}: ok")),
        "check_chart.py {part} did not finish:\n{stdout}\n{stderr}"
    );
    eprintln!("{stdout}");
}

#[test]
fn charts_pass_strict_lint_for_the_oldest_and_newest_kubernetes() {
    check_chart("lint");
}

#[test]
fn rendered_charts_validate_hold_their_guarantees_and_match_the_golden_file() {
    check_chart("render");
}

#[test]
fn values_schema_and_templates_refuse_bad_values_with_clear_messages() {
    check_chart("refusals");
}

#[test]
fn generated_certificates_survive_an_upgrade_and_renew_together() {
    check_chart("upgrade");
}

#[test]
fn every_example_custom_resource_validates_against_its_crd_schema() {
    check_chart("examples");
}

/// Completes a TLS handshake in memory: Lifeguard's server code presenting `dir`'s pair, and
/// Lifeguard's client code trusting `dir/ca.crt` and expecting `name`.
async fn handshake(dir: &Path, name: &str) -> Result<(), String> {
    let certificate = ReloadingCertificate::load(&dir.join("tls.crt"), &dir.join("tls.key"))
        .map_err(|e| format!("the server does not load the pair: {e}"))?;
    let acceptor =
        tokio_rustls::TlsAcceptor::from(Arc::new(Arc::new(certificate).server_config(false)));
    let client = client_config(&[dir.join("ca.crt")]).map_err(|e| e.to_string())?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    let server_name = ServerName::try_from(name.to_owned()).map_err(|e| e.to_string())?;
    let (server, client) = tokio::join!(
        acceptor.accept(server_io),
        connector.connect(server_name, client_io)
    );
    client.map_err(|e| format!("client: {e}"))?;
    server.map_err(|e| format!("server: {e}"))?;
    Ok(())
}

#[tokio::test]
async fn generated_certificates_work_with_lifeguards_tls_for_the_service_names() {
    let dir = tempfile::tempdir().unwrap();
    check_chart_with("dump-tls", &[("LIFEGUARD_CHART_TLS_DIR", dir.path())]);
    for (secret, service) in [
        ("lifeguard-operator-tls", "lifeguard-operator"),
        ("lifeguard-webhook-tls", "lifeguard-webhook"),
    ] {
        let folder: PathBuf = dir.path().join(secret);
        for name in [
            format!("{service}.lifeguard-system.svc"),
            format!("{service}.lifeguard-system.svc.cluster.local"),
        ] {
            handshake(&folder, &name)
                .await
                .unwrap_or_else(|e| panic!("{secret} for {name}: {e}"));
        }
        // The client really checks the name: another Service's name is refused.
        let wrong = handshake(&folder, "other.lifeguard-system.svc").await;
        assert!(wrong.is_err(), "{secret} was accepted for another name");
    }
}

/// `otel.*` reaches the operator's and webhook's containers as the standard variables, and every
/// injected sidecar through the webhook's configuration, which the webhook accepts.
#[test]
fn otel_values_reach_the_operator_the_webhook_and_the_injected_sidecars() {
    let values = serde_json::json!({"otel": {
        "endpoint": "http://otel-collector.observability:4317",
        "protocol": "grpc", "sampler": "parentbased_traceidratio", "samplerArg": "0.1",
    }});
    let docs = support::chart::render(&values);
    let env_of = |name: &str| -> Vec<(String, String)> {
        let deployment = docs
            .iter()
            .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no Deployment {name}"));
        deployment["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| {
                Some((
                    e["name"].as_str()?.to_owned(),
                    e["value"].as_str()?.to_owned(),
                ))
            })
            .collect()
    };
    for deployment in ["lifeguard-operator", "lifeguard-webhook"] {
        let env = env_of(deployment);
        for (name, value) in [
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "http://otel-collector.observability:4317",
            ),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.1"),
        ] {
            assert!(
                env.contains(&(name.to_owned(), value.to_owned())),
                "{deployment}: {name} missing from {env:?}"
            );
        }
    }
    let config = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "lifeguard-webhook-config")
        .unwrap();
    let (key, text) = config["data"].as_object().unwrap().iter().next().unwrap();
    let parsed = lifeguard::webhook::config::WebhookFileConfig::parse(key, text.as_str().unwrap())
        .unwrap_or_else(|e| panic!("the webhook refuses the chart's config: {e}"));
    let otel = parsed.sidecar.otel.expect("sidecar.otel");
    assert_eq!(otel.endpoint, "http://otel-collector.observability:4317");
    assert_eq!(otel.sampler_arg.as_deref(), Some("0.1"));

    // Without an endpoint, nothing about traces is rendered.
    let plain = support::chart::render(&serde_json::json!({}));
    let text = serde_json::to_string(&plain).unwrap();
    assert!(
        !text.contains("OTEL_"),
        "OTEL_ variables rendered without otel.endpoint"
    );
}
