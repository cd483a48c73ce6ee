//! The real `lifeguard webhook` against the API emulator, and AdmissionReview helpers.

use super::daemon::Daemon;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};
use tempfile::TempDir;

use super::kube::KubeEmulator;
use super::operator::{TestCa, free_port, spawn_component_with};
use super::process::wait_for_line;

/// Namespace the tests run the webhook in (never mutated).
pub const WEBHOOK_NAMESPACE: &str = "lifeguard-system";

/// A minimal valid `--config`.
pub fn config_yaml(extra: &str) -> String {
    format!(
        "sidecar:\n  image: ghcr.io/lifeguard-dev/lifeguard:test\ncontrolPlane:\n  url: https://lifeguard-operator.lifeguard-system.svc:8443\n  caConfigMap: {{name: lifeguard-ca, key: ca.crt}}\n{extra}"
    )
}

/// A running webhook, killed when dropped.
pub struct Webhook {
    pub daemon: Daemon,
    /// Holds the certificate and configuration files while the webhook runs.
    _dir: Arc<TempDir>,
    pub ca: Arc<TestCa>,
    /// `https://127.0.0.1:PORT`
    pub url: String,
    /// `http://127.0.0.1:PORT` of /healthz, /readyz, /metrics.
    pub admin: String,
}

impl Webhook {
    /// Starts a webhook against `emulator` with `config` as its `--config` file.
    pub async fn start(emulator: &KubeEmulator, config: &str) -> Self {
        Self::start_with_args(emulator, config, &[]).await
    }

    /// [`Webhook::start`] with extra command-line flags.
    pub async fn start_with_args(emulator: &KubeEmulator, config: &str, args: &[&str]) -> Self {
        let dir = Arc::new(tempfile::tempdir().unwrap());
        let ca = Arc::new(TestCa::new(dir.path()));
        let (cert, key) = (ca.cert_path.clone(), ca.key_path.clone());
        Self::launch(emulator, config, dir, ca, (&cert, &key), args, &[]).await
    }

    /// [`Webhook::start`] with environment variables (e.g. the `OTEL_*` trace settings).
    pub async fn start_with_env(
        emulator: &KubeEmulator,
        config: &str,
        env: &[(String, String)],
    ) -> Self {
        let dir = Arc::new(tempfile::tempdir().unwrap());
        let ca = Arc::new(TestCa::new(dir.path()));
        let (cert, key) = (ca.cert_path.clone(), ca.key_path.clone());
        Self::launch(emulator, config, dir, ca, (&cert, &key), &[], env).await
    }

    /// Starts a webhook serving the certificate at the given paths.
    pub async fn start_with_certificate(
        emulator: &KubeEmulator,
        config: &str,
        dir: Arc<TempDir>,
        ca: Arc<TestCa>,
        cert: &Path,
        key: &Path,
    ) -> Self {
        Self::launch(emulator, config, dir, ca, (cert, key), &[], &[]).await
    }

    async fn launch(
        emulator: &KubeEmulator,
        config: &str,
        dir: Arc<TempDir>,
        ca: Arc<TestCa>,
        (cert, key): (&Path, &Path),
        args: &[&str],
        env: &[(String, String)],
    ) -> Self {
        let config_path = dir.path().join("webhook.yaml");
        std::fs::write(&config_path, config).unwrap();
        let listen: SocketAddr = free_port();
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let (child, output, rx) = spawn_component_with(
            "webhook",
            emulator.kubeconfig_path(),
            WEBHOOK_NAMESPACE,
            listen,
            (cert, key),
            Some(&config_path),
            &args,
            env,
        );
        let admin = wait_for_line(&rx, "admin on ", "webhook", &output);
        let webhook = Self {
            daemon: Daemon::new("webhook", child, output, admin.clone()),
            _dir: dir,
            ca,
            url: format!("https://{listen}"),
            admin,
        };
        webhook.wait_ready().await;
        webhook
    }

    /// Waits until /readyz answers 200.
    pub async fn wait_ready(&self) {
        self.daemon
            .wait_ready("/readyz", Duration::from_secs(30))
            .await;
    }

    pub fn logs(&self) -> String {
        self.daemon.logs()
    }

    /// POSTs an AdmissionReview to `path` (`/inject` or `/validate`); returns the review's
    /// `response`.
    pub async fn review(&self, path: &str, review: &Value) -> Value {
        let response = self
            .ca
            .client()
            .post(format!("{}{path}", self.url))
            .json(review)
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}\n{}", self.logs()));
        assert_eq!(response.status(), 200, "POST {path}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(body["kind"], "AdmissionReview");
        assert_eq!(body["response"]["uid"], review["request"]["uid"]);
        body["response"].clone()
    }

    /// The value of a metric sample line starting with `sample`.
    pub async fn metric(&self, sample: &str) -> Option<f64> {
        self.daemon.metric(sample).await
    }
}

/// Group, version, kind and resource of an admitted object.
pub struct Resource {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub resource: &'static str,
}

pub const POD: Resource = Resource {
    group: "",
    version: "v1",
    kind: "Pod",
    resource: "pods",
};
pub const POLICY: Resource = Resource {
    group: "lifeguard.dev",
    version: "v1alpha1",
    kind: "McpServerPolicy",
    resource: "mcpserverpolicies",
};
pub const EXCEPTION: Resource = Resource {
    group: "lifeguard.dev",
    version: "v1alpha1",
    kind: "CapabilityException",
    resource: "capabilityexceptions",
};

/// An AdmissionReview request for `object` of `what` in `namespace`.
pub fn admission_review(
    uid: &str,
    what: &Resource,
    namespace: Option<&str>,
    operation: &str,
    object: &Value,
    old_object: Option<&Value>,
) -> Value {
    let Resource {
        group,
        version,
        kind,
        resource,
    } = what;
    let mut review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": resource},
            "requestKind": {"group": group, "version": version, "kind": kind},
            "requestResource": {"group": group, "version": version, "resource": resource},
            "name": object["metadata"]["name"],
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
            "object": object,
            "oldObject": old_object,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        }
    });
    // Like the API server: `name` is omitted (not null) for a pod with only `generateName`.
    if review["request"]["name"].is_null() {
        review["request"].as_object_mut().unwrap().remove("name");
    }
    review
}

/// A Pod CREATE review.
pub fn pod_review(uid: &str, namespace: &str, pod: &Value) -> Value {
    admission_review(uid, &POD, Some(namespace), "CREATE", pod, None)
}

/// The decoded JSONPatch of a response (`[]` when there is none).
pub fn patch_of(response: &Value) -> Value {
    let Some(encoded) = response["patch"].as_str() else {
        return json!([]);
    };
    assert_eq!(response["patchType"], "JSONPatch");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .expect("patch is base64");
    serde_json::from_slice(&bytes).expect("patch is JSON")
}

/// `pod` with `patch` applied.
pub fn apply_patch(pod: &Value, patch: &Value) -> Value {
    let mut out = pod.clone();
    let patch: json_patch::Patch = serde_json::from_value(patch.clone()).unwrap();
    json_patch::patch(&mut out, &patch).unwrap();
    out
}
