//! The kubelet part of the pod runner: every pod bound to the node runs as local processes, in
//! the kubelet's order (init containers one by one, a native sidecar counted as started once its
//! startup probe passes, then the app containers), restarted when they exit, probed for
//! readiness every second, with the pod's status written back to the API.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::process::{Child, Command};

use super::plan::{self, ContainerPlan, PodPlan, PortTable, Probe};
use super::{Node, PodRecord, free_port};

const POLL: Duration = Duration::from_millis(500);

pub async fn run(node: Arc<Node>) {
    let pods: Api<Pod> = Api::all(node.client.clone());
    let mut running: BTreeMap<String, tokio::task::JoinHandle<()>> = BTreeMap::new();
    loop {
        match pods.list(&ListParams::default()).await {
            Ok(list) => {
                let mut present = BTreeSet::new();
                for pod in list {
                    let bound = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
                    if bound != Some(node.name.as_str())
                        || pod.metadata.deletion_timestamp.is_some()
                    {
                        continue;
                    }
                    let Some(uid) = pod.metadata.uid.clone() else {
                        continue;
                    };
                    present.insert(uid.clone());
                    running.entry(uid.clone()).or_insert_with(|| {
                        let value = serde_json::to_value(&pod).expect("a Pod serializes");
                        tokio::spawn(run_pod(node.clone(), uid, value))
                    });
                }
                // A pod that is gone (or being deleted) stops: aborting its task drops its
                // processes, which are killed on drop.
                running.retain(|uid, task| {
                    let keep = present.contains(uid);
                    if !keep {
                        task.abort();
                        node.pods.lock().unwrap().remove(uid);
                    }
                    keep
                });
            }
            Err(e) => eprintln!("pod runner: listing pods: {e}"),
        }
        tokio::time::sleep(POLL).await;
    }
}

/// One container's process and what the kubelet reports of it.
struct Container {
    plan: ContainerPlan,
    log: PathBuf,
    child: Option<Child>,
    restarts: u32,
    started_at: String,
    /// Its startup probe passed (or it has none and it runs).
    started: bool,
    ready: bool,
    /// A run-to-completion init container that exited 0.
    completed: bool,
}

impl Container {
    fn new(plan: ContainerPlan, pod_dir: &Path) -> Self {
        let log = pod_dir.join(format!("{}.log", plan.name));
        Self {
            plan,
            log,
            child: None,
            restarts: 0,
            started_at: String::new(),
            started: false,
            ready: false,
            completed: false,
        }
    }

    fn spawn(&mut self, node: &Node) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let child = Command::new(&self.plan.program)
            .args(&self.plan.args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("KUBECONFIG", &node.kubeconfig)
            .envs(self.plan.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", self.plan.program.display()))?;
        self.child = Some(child);
        self.started_at = now();
        self.started = self.plan.startup.is_none();
        self.ready = false;
        Ok(())
    }

    /// Restarts the process when it exited (init containers that completed stay completed).
    fn keep_running(&mut self, node: &Node, init: bool) {
        let exited = match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(Some(status))) => Some(status),
            Some(Ok(None)) => None,
            Some(Err(_)) | None => Some(std::process::ExitStatus::default()),
        };
        let Some(status) = exited else { return };
        if init && !self.plan.native_sidecar && status.success() && self.child.is_some() {
            self.completed = true;
            self.child = None;
            return;
        }
        if self.child.is_some() {
            self.restarts += 1;
        }
        if let Err(e) = self.spawn(node) {
            eprintln!("pod runner: {e:#}");
        }
    }

    async fn probe(&mut self, http: &reqwest::Client) {
        if self.child.is_none() {
            self.ready = false;
            return;
        }
        if !self.started
            && let Some(probe) = &self.plan.startup
        {
            self.started = passes(http, probe).await;
        }
        self.ready = self.started
            && match &self.plan.readiness {
                Some(probe) => passes(http, probe).await,
                None => true,
            };
    }

    fn status(&self) -> Value {
        let state = if self.completed {
            json!({"terminated": {"exitCode": 0, "reason": "Completed"}})
        } else if self.child.is_some() {
            json!({"running": {"startedAt": self.started_at}})
        } else {
            json!({"waiting": {"reason": "PodInitializing"}})
        };
        json!({
            "name": self.plan.name,
            "image": self.plan.image,
            "imageID": "",
            "ready": self.ready,
            "started": self.started,
            "restartCount": self.restarts,
            "state": state,
        })
    }
}

async fn passes(http: &reqwest::Client, probe: &Probe) -> bool {
    match probe {
        Probe::Http { port, path } => {
            let url = format!("http://127.0.0.1:{port}{path}");
            http.get(url)
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success() || r.status().is_redirection())
        }
        Probe::Tcp { port } => tokio::time::timeout(
            Duration::from_secs(2),
            tokio::net::TcpStream::connect(("127.0.0.1", *port)),
        )
        .await
        .is_ok_and(|r| r.is_ok()),
    }
}

fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

async fn run_pod(node: Arc<Node>, uid: String, pod: Value) {
    let namespace = pod["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default")
        .to_owned();
    let name = pod["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let pod_dir = node.dir.join(&namespace).join(&name);
    let api: Api<Pod> = Api::namespaced(node.client.clone(), &namespace);
    let mut last_status = Value::Null;
    let mut report = async |status: Value| {
        if status != last_status {
            let patch = Patch::Merge(json!({"status": status}));
            match api
                .patch_status(&name, &PatchParams::default(), &patch)
                .await
            {
                Ok(_) => last_status = status,
                Err(e) => eprintln!("pod runner: status of {namespace}/{name}: {e}"),
            }
        }
    };

    // The plan waits for what the pod refers to (a Secret, a ConfigMap, a Service).
    let mut ports = PortTable::default();
    let plan = loop {
        match prepare(&node, &pod, &pod_dir, &mut ports).await {
            Ok(plan) => break plan,
            Err(e) => {
                report(json!({
                    "phase": "Pending",
                    "conditions": [{"type": "PodScheduled", "status": "True"},
                                   {"type": "Ready", "status": "False", "reason": "ContainersNotReady",
                                    "message": format!("{e:#}")}],
                }))
                .await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    node.pods.lock().unwrap().insert(
        uid.clone(),
        PodRecord {
            namespace: namespace.clone(),
            name: name.clone(),
            labels: serde_json::from_value(pod["metadata"]["labels"].clone()).unwrap_or_default(),
            ports: ports.clone(),
            named_ports: named_ports(&pod),
            ready: false,
        },
    );
    let _ = std::fs::write(
        pod_dir.join("ports.json"),
        serde_json::to_string_pretty(&ports.ports).unwrap_or_default(),
    );

    let start_time = now();
    let mut init: Vec<Container> = plan
        .init
        .into_iter()
        .map(|c| Container::new(c, &pod_dir))
        .collect();
    let mut app: Vec<Container> = plan
        .containers
        .into_iter()
        .map(|c| Container::new(c, &pod_dir))
        .collect();
    loop {
        // Init containers one by one: the next starts once this one completed (or, for a
        // native sidecar, started).
        let mut initialized = true;
        for container in &mut init {
            container.keep_running(&node, true);
            container.probe(&node.http).await;
            let done = container.completed || (container.plan.native_sidecar && container.started);
            if !done {
                initialized = false;
                break;
            }
        }
        if initialized {
            for container in &mut app {
                container.keep_running(&node, false);
                container.probe(&node.http).await;
            }
        }
        let sidecars_ready = init
            .iter()
            .filter(|c| c.plan.native_sidecar)
            .all(|c| c.ready);
        let ready = initialized && sidecars_ready && app.iter().all(|c| c.ready);
        if let Some(record) = node.pods.lock().unwrap().get_mut(&uid) {
            record.ready = ready;
        }
        let condition = |kind: &str, status: bool| json!({"type": kind, "status": if status {"True"} else {"False"}});
        report(json!({
            "phase": if initialized { "Running" } else { "Pending" },
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "hostIP": "127.0.0.1",
            "startTime": start_time,
            "conditions": [
                condition("PodScheduled", true),
                condition("Initialized", initialized),
                condition("ContainersReady", ready),
                condition("Ready", ready),
            ],
            "initContainerStatuses": init.iter().map(Container::status).collect::<Vec<_>>(),
            "containerStatuses": app.iter().map(Container::status).collect::<Vec<_>>(),
        }))
        .await;
        tokio::time::sleep(if ready {
            Duration::from_secs(1)
        } else {
            Duration::from_millis(250)
        })
        .await;
    }
}

/// Fetches what the pod refers to, plans it, and writes its volumes (minting its projected
/// tokens in the emulator's TokenReview table).
async fn prepare(
    node: &Node,
    pod: &Value,
    pod_dir: &Path,
    ports: &mut PortTable,
) -> Result<PodPlan> {
    let namespace = pod["metadata"]["namespace"].as_str().unwrap_or("default");
    let mut config_maps = BTreeMap::new();
    for cm in Api::<ConfigMap>::namespaced(node.client.clone(), namespace)
        .list(&ListParams::default())
        .await?
    {
        let key = format!("{namespace}/{}", cm.metadata.name.unwrap_or_default());
        config_maps.insert(key, cm.data.unwrap_or_default());
    }
    let mut secrets = BTreeMap::new();
    for secret in Api::<Secret>::namespaced(node.client.clone(), namespace)
        .list(&ListParams::default())
        .await?
    {
        let value = serde_json::to_value(&secret)?;
        let key = format!("{namespace}/{}", secret.metadata.name.unwrap_or_default());
        secrets.insert(key, plan::secret_data(&value)?);
    }
    let services = node.services.lock().unwrap().clone();
    let cx = plan::Context {
        config_maps: &config_maps,
        secrets: &secrets,
        services: &services,
        images: &node.images,
        pod_dir,
        node_name: &node.name,
        cluster_domain: &node.cluster_domain,
    };
    let plan = plan::plan(pod, &cx, ports, &mut free_port)?;
    for volume in &plan.volumes {
        std::fs::create_dir_all(&volume.dir)?;
        for (path, contents) in &volume.files {
            let file = volume.dir.join(path);
            if let Some(parent) = file.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&file, contents)?;
        }
        for (path, audience) in &volume.tokens {
            let token = mint_token(node, pod, audience).await?;
            std::fs::write(volume.dir.join(path), token)?;
        }
    }
    Ok(plan)
}

/// A projected ServiceAccount token: a random string the emulator's TokenReview table knows as
/// the pod's ServiceAccount, bound to the pod (name and uid), for `audience`.
async fn mint_token(node: &Node, pod: &Value, audience: &str) -> Result<String> {
    let namespace = pod["metadata"]["namespace"].as_str().unwrap_or("default");
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
    let sa = pod["spec"]["serviceAccountName"]
        .as_str()
        .unwrap_or("default");
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes).context("reading random bytes")?;
    let token = format!("demo.{}", hex::encode(bytes));
    let entry = json!({token.clone(): {
        "username": format!("system:serviceaccount:{namespace}:{sa}"),
        "uid": format!("sa-uid-{namespace}-{sa}"),
        "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{namespace}"), "system:authenticated"],
        "extra": {
            "authentication.kubernetes.io/pod-name": [name],
            "authentication.kubernetes.io/pod-uid": [uid],
        },
        "audiences": [audience],
    }});
    node.http
        .post(format!("{}/__emulator/tokens", node.emulator))
        .json(&entry)
        .send()
        .await?
        .error_for_status()
        .context("registering a projected token with the emulator")?;
    Ok(token)
}

fn named_ports(pod: &Value) -> BTreeMap<String, u16> {
    let spec = &pod["spec"];
    spec["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(spec["containers"].as_array().into_iter().flatten())
        .flat_map(|c| c["ports"].as_array().into_iter().flatten())
        .filter_map(|p| {
            Some((
                p["name"].as_str()?.to_owned(),
                u16::try_from(p["containerPort"].as_u64()?).ok()?,
            ))
        })
        .collect()
}
