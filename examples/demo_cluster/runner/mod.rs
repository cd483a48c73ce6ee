//! The pod runner: stands in for the kubelet (and, in `deployments`, the Deployment controller
//! and scheduler; in `services`, kube-proxy) on one demo "node". It runs every pod bound to the
//! node as local processes of this repository's binaries, as `plan` maps the pod's spec, and
//! reports the pod's status to the API. There is no container runtime: an image names a program.

mod deployments;
mod kubelet;
pub mod plan;
mod services;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use plan::PortTable;

/// The node's shared state: what each running pod's ports are and whether it is ready (the
/// Service proxy routes by it), and the Service addresses (pods' specs are rewritten to them).
pub struct Node {
    pub name: String,
    /// Where pods' volumes and logs go: `DIR/NAMESPACE/POD/`.
    pub dir: PathBuf,
    /// Image repository → program.
    pub images: BTreeMap<String, PathBuf>,
    /// Given to every container as $KUBECONFIG in place of in-cluster credentials (the
    /// emulator speaks plain HTTP on loopback).
    pub kubeconfig: PathBuf,
    /// The emulator's base URL, for its test-only endpoints (tokens, service addresses).
    pub emulator: String,
    pub cluster_domain: String,
    pub client: kube::Client,
    pub http: reqwest::Client,
    pods: Mutex<BTreeMap<String, PodRecord>>,
    services: Mutex<BTreeMap<String, SocketAddr>>,
}

/// What the node knows of one running pod.
#[derive(Clone, Debug)]
pub struct PodRecord {
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub ports: PortTable,
    /// Container port names → container ports (for Services' named targetPorts).
    pub named_ports: BTreeMap<String, u16>,
    pub ready: bool,
}

impl Node {
    pub fn new(
        name: &str,
        dir: PathBuf,
        images: BTreeMap<String, PathBuf>,
        kubeconfig: PathBuf,
        emulator: String,
        client: kube::Client,
    ) -> Arc<Self> {
        Arc::new(Self {
            name: name.to_owned(),
            dir,
            images,
            kubeconfig,
            emulator,
            cluster_domain: "cluster.local".to_owned(),
            client,
            http: reqwest::Client::new(),
            pods: Mutex::default(),
            services: Mutex::default(),
        })
    }

    /// Starts the kubelet, the Deployment controller and the Service proxy; they run until the
    /// returned tasks are aborted (every process they started is killed with them).
    pub fn start(self: &Arc<Self>) -> Vec<tokio::task::JoinHandle<()>> {
        vec![
            tokio::spawn(kubelet::run(self.clone())),
            tokio::spawn(deployments::run(self.clone())),
            tokio::spawn(services::run(self.clone())),
        ]
    }

    /// The host port of `port` of the pod `namespace/name` (e.g. where its sidecar's `mcp`
    /// port 8080 is), once the pod runs.
    pub fn host_port(&self, namespace: &str, name: &str, port: u16) -> Option<u16> {
        let pods = self.pods.lock().unwrap();
        pods.values()
            .find(|p| p.namespace == namespace && p.name == name)
            .and_then(|p| p.ports.ports.get(&port).copied())
    }

    /// The loopback address of Service port `namespace/name:port`.
    pub fn service_address(&self, namespace: &str, name: &str, port: u16) -> Option<SocketAddr> {
        self.services
            .lock()
            .unwrap()
            .get(&format!("{namespace}/{name}:{port}"))
            .copied()
    }
}

/// A free port on 127.0.0.1 (the system picks it; it is free when this returns).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("binding 127.0.0.1:0")
}
