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

/// One admission webhook call the emulator made (`GET /__emulator/admissions`).
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionCall {
    /// The webhook's `name`.
    pub webhook: String,
    /// The name of its MutatingWebhookConfiguration or ValidatingWebhookConfiguration.
    pub configuration: String,
    /// `mutating` or `validating`.
    #[serde(rename = "type")]
    pub kind: String,
    /// 0, or 1 when a `reinvocationPolicy: IfNeeded` webhook was called again.
    pub round: u8,
    /// The AdmissionReview's `request.uid`.
    pub uid: String,
    /// CREATE, UPDATE or DELETE.
    pub operation: String,
    pub namespace: String,
    /// `""` on a CREATE with `generateName` (the name is chosen after mutating admission).
    pub name: String,
    pub dry_run: bool,
    /// Where the review was POSTed (without `?timeout=`); `None` when no address was known.
    pub url: Option<String>,
    /// `None` when the call failed.
    pub allowed: Option<bool>,
    /// The webhook answered a non-empty JSONPatch, which was applied.
    pub patched: bool,
    pub warnings: Vec<String>,
    /// A denial's `{code, reason, message}` as the client received it.
    pub status: Option<Value>,
    /// Why the call failed (`failed calling webhook "NAME": ...`).
    pub error: Option<String>,
    /// The call failed and `failurePolicy: Ignore` admitted the request anyway.
    pub ignored: bool,
}

/// A response of `KubeEmulator::send`.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    pub headers: http::HeaderMap,
    /// The body as JSON (a string when it is not JSON).
    pub body: Value,
}

impl RawResponse {
    /// The raw `Warning` header values, in order (kube-apiserver's form: `299 - "TEXT"`).
    pub fn warning_headers(&self) -> Vec<String> {
        self.headers
            .get_all(http::header::WARNING)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect()
    }

    /// The texts of the `Warning` headers, unquoted and unescaped.
    pub fn warnings(&self) -> Vec<String> {
        self.warning_headers()
            .iter()
            .map(|h| warning_text(h).unwrap_or_else(|| panic!("malformed Warning header {h:?}")))
            .collect()
    }
}

/// The text of a `Warning: 299 - "TEXT"` header value (`\"` and `\\` unescaped).
pub fn warning_text(header: &str) -> Option<String> {
    let quoted = header.strip_prefix("299 - \"")?.strip_suffix('"')?;
    let mut text = String::new();
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        text.push(if c == '\\' { chars.next()? } else { c });
    }
    Some(text)
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

    /// Sends admission webhook calls for `clientConfig.service` `namespace`/`name`:`port` to
    /// `address` (`https://host:port`; the service's `path` is appended). The webhook's
    /// certificate must be valid for that host (kube-apiserver would check
    /// `NAME.NAMESPACE.svc`).
    pub async fn register_service(&self, namespace: &str, name: &str, port: u16, address: &str) {
        self.update_services(json!({ format!("{namespace}/{name}:{port}"): address }))
            .await;
    }

    async fn update_services(&self, changes: Value) {
        let response = self
            .http
            .post(format!("{}/__emulator/services", self.url))
            .json(&changes)
            .send()
            .await
            .expect("POST /__emulator/services");
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        assert!(
            status.is_success(),
            "POST /__emulator/services: {status} {body}"
        );
    }

    /// Every admission webhook call the emulator made, oldest first (validating webhooks of
    /// one request in webhook order, although they are called concurrently).
    pub async fn admissions(&self) -> Vec<AdmissionCall> {
        serde_json::from_value(self.emulator_get("/__emulator/admissions").await)
            .expect("admission calls as recorded by the emulator")
    }

    /// Sends one request to the emulator over plain HTTP (`path` with its query, `body` as JSON
    /// with `content_type`), for what kube-rs does not show: the `Warning` headers.
    pub async fn send(
        &self,
        method: http::Method,
        path: &str,
        content_type: &str,
        body: Option<&Value>,
    ) -> RawResponse {
        let mut request = self
            .http
            .request(method.clone(), format!("{}{path}", self.url));
        if let Some(body) = body {
            request = request
                .header(http::header::CONTENT_TYPE, content_type)
                .body(body.to_string());
        }
        let response = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap_or_default();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        RawResponse {
            status,
            headers,
            body,
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
