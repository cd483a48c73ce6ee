//! A Kubernetes API server emulator on loopback (`tests/kube_emulator/emulator.py`, built on PyPI
//! `kmock`), for whole-system operator tests: kube-rs clients, watchers, reflectors and
//! controllers talk to it through a kubeconfig, as they would to a cluster. What it does not
//! emulate is listed in `tests/kube_emulator/README.md`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{ApiResource, GroupVersionKind};
use kube::discovery::Scope;
use serde_json::{Value, json};
use tempfile::TempDir;

use super::process::{spawn_collecting, wait_for_line};

/// The field manager `apply_yaml` applies with.
pub const TEST_FIELD_MANAGER: &str = "lifeguard-tests";

/// The identity a bearer token stands for in the emulator's TokenReview answers.
#[derive(Clone, Debug)]
pub struct TokenIdentity {
    /// e.g. `system:serviceaccount:NAMESPACE:NAME`
    pub username: String,
    pub uid: String,
    /// `authentication.kubernetes.io/pod-name` in the review's `user.extra`.
    pub pod_name: String,
    /// `authentication.kubernetes.io/pod-uid` in the review's `user.extra`.
    pub pod_uid: String,
    /// The audiences the token was issued for: a review succeeds only when every audience it
    /// asks for is among these.
    pub audiences: Vec<String>,
}

impl TokenIdentity {
    /// A projected service account token of the pod `pod_name` (UID `pod_uid`), running as
    /// `namespace`/`service_account`, issued for `audiences`.
    pub fn service_account(
        namespace: &str,
        service_account: &str,
        pod_name: &str,
        pod_uid: &str,
        audiences: &[&str],
    ) -> Self {
        Self {
            username: format!("system:serviceaccount:{namespace}:{service_account}"),
            uid: format!("sa-uid-{namespace}-{service_account}"),
            pod_name: pod_name.to_owned(),
            pod_uid: pod_uid.to_owned(),
            audiences: audiences.iter().map(|a| (*a).to_owned()).collect(),
        }
    }

    /// The table entry the emulator stores: groups as the API server derives them for a
    /// service account (`system:serviceaccounts`, `system:serviceaccounts:NS`).
    fn entry(&self) -> Value {
        let mut groups = Vec::new();
        if let Some(rest) = self.username.strip_prefix("system:serviceaccount:")
            && let Some((namespace, _)) = rest.split_once(':')
        {
            groups.push("system:serviceaccounts".to_owned());
            groups.push(format!("system:serviceaccounts:{namespace}"));
        }
        groups.push("system:authenticated".to_owned());
        json!({
            "username": self.username,
            "uid": self.uid,
            "groups": groups,
            "extra": {
                "authentication.kubernetes.io/pod-name": [self.pod_name],
                "authentication.kubernetes.io/pod-uid": [self.pod_uid],
            },
            "audiences": self.audiences,
        })
    }
}

/// A running emulator, killed when dropped, with a kubeconfig that points at it.
pub struct KubeEmulator {
    child: Child,
    url: String,
    kubeconfig: PathBuf,
    _dir: TempDir,
    /// What the emulator printed (its access log and any traceback), for diagnostics.
    pub output: Arc<Mutex<Vec<String>>>,
    http: reqwest::Client,
}

/// The interpreter that has the emulator's packages: `LIFEGUARD_TEST_PYTHON`, as
/// `scripts/test.sh` exports it. Unset is a test failure, never a skip.
fn emulator_python() -> PathBuf {
    let Some(path) = std::env::var_os("LIFEGUARD_TEST_PYTHON").map(PathBuf::from) else {
        panic!(
            "LIFEGUARD_TEST_PYTHON is unset: the Kubernetes API emulator needs the Python venv with \
             kmock (tests/interop/requirements.txt). Run the tests through scripts/test.sh, or \
             build the venv as it does and export \
             LIFEGUARD_TEST_PYTHON=$PWD/target/interop-venv/bin/python"
        )
    };
    assert!(
        path.exists(),
        "LIFEGUARD_TEST_PYTHON={} does not exist: run scripts/test.sh, which installs \
         tests/interop/requirements.txt into target/interop-venv",
        path.display()
    );
    path
}

impl KubeEmulator {
    /// Starts the emulator with the repository's CRDs installed, waits until it answers, and
    /// writes a kubeconfig for it.
    pub async fn start() -> Self {
        let repo = super::repo();
        let mut command = Command::new(emulator_python());
        command
            .arg(repo.join("tests/kube_emulator/emulator.py"))
            .args(["--port", "0", "--crds"])
            .arg(repo.join("crds"));
        let (child, output, rx) = spawn_collecting(command);
        let url = wait_for_line(&rx, "listening on ", "the Kubernetes API emulator", &output);
        let dir = tempfile::tempdir().expect("temporary directory for the kubeconfig");
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml(&url)).expect("write the kubeconfig");
        let emulator = Self {
            child,
            url,
            kubeconfig,
            _dir: dir,
            output,
            http: reqwest::Client::new(),
        };
        let version = format!("{}/version", emulator.url);
        let answered = super::eventually(Duration::from_secs(10), async || {
            let response = emulator.http.get(&version).send().await.ok()?;
            response.status().is_success().then_some(())
        })
        .await;
        assert!(
            answered.is_some(),
            "the Kubernetes API emulator at {} does not answer GET /version; output:\n{}",
            emulator.url,
            emulator.logs()
        );
        emulator
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A kubeconfig whose current context points at the emulator (a dummy bearer token, the
    /// `default` namespace).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// A kube-rs client built from `kubeconfig_path()`.
    pub async fn client(&self) -> kube::Client {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig).expect("read the kubeconfig");
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .expect("a kube-rs config from the emulator's kubeconfig");
        kube::Client::try_from(config).expect("a kube-rs client for the emulator")
    }

    /// Everything the emulator printed so far.
    pub fn logs(&self) -> String {
        self.output.lock().unwrap().join("\n")
    }

    async fn emulator_get(&self, path: &str) -> Value {
        let response = self
            .http
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path} from the emulator: {e}"));
        assert!(response.status().is_success(), "GET {path}: {response:?}");
        response.json().await.expect("JSON from the emulator")
    }

    /// Makes the emulator's TokenReviews accept `token` as `identity` (replacing any entry).
    pub async fn add_token(&self, token: &str, identity: TokenIdentity) {
        let response = self
            .http
            .post(format!("{}/__emulator/tokens", self.url))
            .json(&json!({ token: identity.entry() }))
            .send()
            .await
            .expect("POST /__emulator/tokens");
        assert!(response.status().is_success(), "add_token: {response:?}");
    }

    /// Makes the emulator's TokenReviews reject `token` from now on.
    pub async fn remove_token(&self, token: &str) {
        let response = self
            .http
            .post(format!("{}/__emulator/tokens", self.url))
            .json(&json!({ token: null }))
            .send()
            .await
            .expect("POST /__emulator/tokens");
        assert!(response.status().is_success(), "remove_token: {response:?}");
    }

    /// Every TokenReview the emulator answered, oldest first, as `{apiVersion, kind, metadata,
    /// spec, status}`.
    pub async fn token_reviews(&self) -> Vec<Value> {
        match self.emulator_get("/__emulator/tokenreviews").await {
            Value::Array(reviews) => reviews,
            other => panic!("token reviews are not an array: {other}"),
        }
    }

    /// Every request the emulator received, oldest first, as `{method, path, query,
    /// contentType, accept}`.
    pub async fn requests(&self) -> Vec<Value> {
        match self.emulator_get("/__emulator/requests").await {
            Value::Array(requests) => requests,
            other => panic!("requests are not an array: {other}"),
        }
    }

    /// Creates a minimal pod (one container, the given labels and service account); returns
    /// its UID.
    pub async fn create_pod(
        &self,
        namespace: &str,
        name: &str,
        labels: &[(&str, &str)],
        service_account: &str,
    ) -> String {
        let labels: serde_json::Map<String, Value> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::from(*v)))
            .collect();
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {
                "serviceAccountName": service_account,
                "containers": [{"name": "app", "image": "registry.invalid/app:1"}],
            },
        }))
        .expect("a valid Pod");
        let created = Api::<Pod>::namespaced(self.client().await, namespace)
            .create(&PostParams::default(), &pod)
            .await
            .unwrap_or_else(|e| panic!("create pod {namespace}/{name}: {e}"));
        created.metadata.uid.expect("the emulator assigns a uid")
    }

    /// Deletes a pod (it must exist).
    pub async fn delete_pod(&self, namespace: &str, name: &str) {
        Api::<Pod>::namespaced(self.client().await, namespace)
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("delete pod {namespace}/{name}: {e}"));
    }

    /// Server-side applies every document of `yaml` (any kind; field manager
    /// `TEST_FIELD_MANAGER`, forced), creating what does not exist. Namespaced objects without
    /// a namespace go to `default`. Returns the objects as stored. A `status` is ignored for
    /// kinds with a status subresource, as by a real API server: patch `.../status` for that.
    pub async fn apply_yaml(&self, yaml: &str) -> Vec<DynamicObject> {
        let documents: Vec<Value> =
            serde_saphyr::from_multiple(yaml).unwrap_or_else(|e| panic!("apply_yaml: {e}"));
        let client = self.client().await;
        let mut applied = Vec::new();
        for document in documents.into_iter().filter(|d| !d.is_null()) {
            let api_version = document["apiVersion"].as_str().expect("apiVersion");
            let kind = document["kind"].as_str().expect("kind");
            let name = document["metadata"]["name"]
                .as_str()
                .expect("metadata.name");
            let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
            let gvk = GroupVersionKind::gvk(group, version, kind);
            let namespace = document["metadata"]["namespace"].as_str();
            // The emulator's discovery knows the built-in kinds and the installed CRDs; any
            // other kind is served generically, under the plural kube-rs guesses.
            let (resource, namespaced) = match kube::discovery::pinned_kind(&client, &gvk).await {
                Ok((resource, capabilities)) => (resource, capabilities.scope == Scope::Namespaced),
                Err(_) => (ApiResource::from_gvk(&gvk), namespace.is_some()),
            };
            let api: Api<DynamicObject> = if namespaced {
                Api::namespaced_with(client.clone(), namespace.unwrap_or("default"), &resource)
            } else {
                Api::all_with(client.clone(), &resource)
            };
            let object = api
                .patch(
                    name,
                    &PatchParams::apply(TEST_FIELD_MANAGER).force(),
                    &Patch::Apply(&document),
                )
                .await
                .unwrap_or_else(|e| panic!("apply {kind} {name}: {e}"));
            applied.push(object);
        }
        applied
    }
}

impl Drop for KubeEmulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn kubeconfig_yaml(url: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
  - name: emulator
    cluster:
      server: {url}
users:
  - name: emulator
    user:
      token: emulator-does-not-check-tokens
contexts:
  - name: emulator
    context:
      cluster: emulator
      user: emulator
      namespace: default
current-context: emulator
"
    )
}
