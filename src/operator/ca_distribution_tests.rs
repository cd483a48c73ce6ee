use k8s_openapi::ByteString;

use super::*;
use crate::operator::config::ConfigMapKeyRef;

fn config() -> CaDistribution {
    CaDistribution {
        secret_name: "lifeguard-operator-tls".into(),
        secret_key: "ca.crt".into(),
        config_map: ConfigMapKeyRef {
            name: "lifeguard-ca".into(),
            key: "ca.pem".into(),
        },
    }
}

/// A self-signed CA certificate and its key, PEM.
fn ca(name: &str) -> (String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn secret(entries: &[(&str, &[u8])]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some("lifeguard-operator-tls".into()),
            namespace: Some("lifeguard-system".into()),
            ..ObjectMeta::default()
        },
        data: Some(
            entries
                .iter()
                .map(|(k, v)| ((*k).to_owned(), ByteString(v.to_vec())))
                .collect(),
        ),
        ..Secret::default()
    }
}

fn ns(name: &str, label: Option<&str>) -> NamespaceFacts {
    let mut meta = ObjectMeta {
        name: Some(name.into()),
        ..ObjectMeta::default()
    };
    if let Some(value) = label {
        meta.labels = Some([(INJECT_LABEL.to_owned(), value.to_owned())].into());
    }
    NamespaceFacts::of(&meta)
}

fn names(set: &BTreeSet<String>) -> Vec<&str> {
    set.iter().map(String::as_str).collect()
}

#[test]
fn a_pem_ca_bundle_is_copied_verbatim() {
    let (one, _) = ca("one");
    let (two, _) = ca("two");
    let bundle = format!("{one}{two}");
    let s = secret(&[("ca.crt", bundle.as_bytes())]);
    assert_eq!(ca_bundle(Some(&s), "ca.crt"), Ok(bundle));
}

#[test]
fn an_unusable_source_is_refused_with_its_reason() {
    let (cert, key) = ca("one");
    let garbage_cert = "-----BEGIN CERTIFICATE-----\nAAECAwQ=\n-----END CERTIFICATE-----\n";
    let with_key = format!("{cert}{key}");
    let cases: [(Option<Secret>, CaSourceProblem); 6] = [
        (None, CaSourceProblem::SecretMissing),
        (
            Some(secret(&[("tls.crt", cert.as_bytes())])),
            CaSourceProblem::KeyMissing("ca.crt".into()),
        ),
        (
            Some(secret(&[("ca.crt", &[0xff, 0xfe, 0x00])])),
            CaSourceProblem::NotText("ca.crt".into()),
        ),
        (
            Some(secret(&[("ca.crt", with_key.as_bytes())])),
            CaSourceProblem::PrivateKey("ca.crt".into()),
        ),
        (
            Some(secret(&[("ca.crt", b"not a certificate")])),
            CaSourceProblem::NoCertificate("ca.crt".into()),
        ),
        (
            Some(secret(&[("ca.crt", garbage_cert.as_bytes())])),
            CaSourceProblem::Unusable("ca.crt".into()),
        ),
    ];
    for (s, problem) in cases {
        assert_eq!(ca_bundle(s.as_ref(), "ca.crt"), Err(problem.clone()));
        assert!(!problem.metric_label().is_empty());
    }
}

#[test]
fn targets_are_opted_in_namespaces_and_namespaces_with_policies() {
    let mut terminating = ns("going", Some("enabled"));
    terminating.terminating = true;
    let namespaces = [
        ns("team-a", Some("enabled")),
        ns("team-b", None),
        ns("team-c", Some("disabled")),
        ns("plain", None),
        terminating,
    ];
    let policies: BTreeSet<String> = ["team-b", "team-c", "not-yet-seen"]
        .map(String::from)
        .into();
    assert_eq!(
        names(&target_namespaces(&namespaces, &policies)),
        ["team-a", "team-b", "team-c"]
    );
    assert!(target_namespaces(&namespaces[3..], &BTreeSet::new()).is_empty());
}

#[test]
fn the_config_map_carries_the_bundle_under_its_key_with_lifeguard_labels() {
    let cm = desired_config_map("team-a", &config(), "PEM");
    assert_eq!(cm.metadata.name.as_deref(), Some("lifeguard-ca"));
    assert_eq!(cm.metadata.namespace.as_deref(), Some("team-a"));
    assert_eq!(cm.data.as_ref().unwrap()["ca.pem"], "PEM");
    let labels = cm.metadata.labels.unwrap();
    assert_eq!(labels["app.kubernetes.io/part-of"], "lifeguard");
    assert_eq!(labels["app.kubernetes.io/managed-by"], "lifeguard-operator");
}

#[test]
fn only_missing_or_different_config_maps_are_planned() {
    let (cert, _) = ca("one");
    let (other, _) = ca("other");
    let s = secret(&[("ca.crt", cert.as_bytes())]);
    let namespaces = [
        ns("fresh", Some("enabled")),
        ns("same", Some("enabled")),
        ns("stale", Some("enabled")),
        ns("unlabelled-cm", Some("enabled")),
        ns("extra-keys", Some("enabled")),
    ];
    let mut observed = BTreeMap::new();
    observed.insert("same".into(), desired_config_map("same", &config(), &cert));
    observed.insert(
        "stale".into(),
        desired_config_map("stale", &config(), &other),
    );
    let mut unlabelled = desired_config_map("unlabelled-cm", &config(), &cert);
    unlabelled.metadata.labels = None;
    observed.insert("unlabelled-cm".into(), unlabelled);
    let mut extra = desired_config_map("extra-keys", &config(), &cert);
    extra
        .data
        .as_mut()
        .unwrap()
        .insert("someone-elses".into(), "x".into());
    extra
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("team".into(), "a".into());
    observed.insert("extra-keys".into(), extra);
    let CaPlan::Apply(writes) = plan(
        &config(),
        &namespaces,
        &BTreeSet::new(),
        Some(&s),
        &observed,
    ) else {
        panic!("a usable source plans writes");
    };
    let planned: Vec<_> = writes
        .iter()
        .map(|c| c.metadata.namespace.as_deref().unwrap())
        .collect();
    assert_eq!(planned, ["fresh", "stale", "unlabelled-cm"]);
    assert!(
        writes
            .iter()
            .all(|c| c.data.as_ref().unwrap()["ca.pem"] == cert)
    );
}

#[test]
fn an_unusable_source_plans_no_write_at_all() {
    let namespaces = [ns("fresh", Some("enabled"))];
    let s = secret(&[("ca.crt", b"rotated to garbage")]);
    assert_eq!(
        plan(
            &config(),
            &namespaces,
            &BTreeSet::new(),
            Some(&s),
            &BTreeMap::new()
        ),
        CaPlan::SourceUnusable(CaSourceProblem::NoCertificate("ca.crt".into()))
    );
    assert_eq!(
        plan(
            &config(),
            &namespaces,
            &BTreeSet::new(),
            None,
            &BTreeMap::new()
        ),
        CaPlan::SourceUnusable(CaSourceProblem::SecretMissing)
    );
}

#[test]
fn retries_back_off_to_a_minute() {
    let delays: Vec<u64> = (1..=8).map(|n| retry_delay(n).as_secs()).collect();
    assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60]);
}
