//! The kube-proxy part of the pod runner: every Service port gets a listener on 127.0.0.1 (its
//! "ClusterIP"), and each connection is forwarded, as bytes, to a ready pod the Service selects
//! (round robin). TLS passes through untouched, so clients verify the pods' own certificates.
//! The emulator learns each address (`POST /__emulator/services`), so webhooks configured with
//! a `clientConfig.service` are called there.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Api;
use kube::api::ListParams;
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};

use super::Node;

/// Where a Service port sends connections.
#[derive(Clone)]
struct Route {
    namespace: String,
    selector: BTreeMap<String, String>,
    target: IntOrString,
    /// `sessionAffinity: ClientIP`: every connection from one client address goes to the same
    /// pod while it is ready. Every client here is 127.0.0.1, so all go to one pod.
    client_ip_affinity: bool,
}

pub async fn run(node: Arc<Node>) {
    let api: Api<Service> = Api::all(node.client.clone());
    let mut routes: BTreeMap<String, Arc<std::sync::Mutex<Route>>> = BTreeMap::new();
    loop {
        match api.list(&ListParams::default()).await {
            Ok(list) => {
                for service in list {
                    let namespace = service.metadata.namespace.clone().unwrap_or_default();
                    let name = service.metadata.name.clone().unwrap_or_default();
                    let Some(spec) = service.spec else { continue };
                    for port in spec.ports.into_iter().flatten() {
                        let key = format!("{namespace}/{name}:{}", port.port);
                        let route = Route {
                            namespace: namespace.clone(),
                            selector: spec.selector.clone().unwrap_or_default(),
                            target: port.target_port.unwrap_or(IntOrString::Int(port.port)),
                            client_ip_affinity: spec.session_affinity.as_deref()
                                == Some("ClientIP"),
                        };
                        match routes.get(&key) {
                            Some(existing) => *existing.lock().unwrap() = route,
                            None => match listen(&node, &key, route).await {
                                Ok(shared) => {
                                    routes.insert(key, shared);
                                }
                                Err(e) => eprintln!("pod runner: Service {key}: {e:#}"),
                            },
                        }
                    }
                }
            }
            Err(e) => eprintln!("pod runner: listing services: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn listen(
    node: &Arc<Node>,
    key: &str,
    route: Route,
) -> anyhow::Result<Arc<std::sync::Mutex<Route>>> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    node.http
        .post(format!("{}/__emulator/services", node.emulator))
        .json(&json!({key: format!("https://{address}")}))
        .send()
        .await?
        .error_for_status()?;
    node.services
        .lock()
        .unwrap()
        .insert(key.to_owned(), address);
    let shared = Arc::new(std::sync::Mutex::new(route));
    let (node, route) = (node.clone(), shared.clone());
    let next = Arc::new(AtomicUsize::new(0));
    let sticky = Arc::new(std::sync::Mutex::new(None::<SocketAddr>));
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let (endpoints, affinity) = {
                let route = route.lock().unwrap();
                (endpoints(&node, &route), route.client_ip_affinity)
            };
            if endpoints.is_empty() {
                continue; // no ready pod: the connection is refused by closing it
            }
            let target = match *sticky.lock().unwrap() {
                Some(pinned) if affinity && endpoints.contains(&pinned) => pinned,
                _ => endpoints[next.fetch_add(1, Ordering::Relaxed) % endpoints.len()],
            };
            if affinity {
                *sticky.lock().unwrap() = Some(target);
            }
            tokio::spawn(async move {
                if let Ok(mut outbound) = TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    Ok(shared)
}

/// The host addresses of the ready pods the route selects, in name order.
fn endpoints(node: &Node, route: &Route) -> Vec<SocketAddr> {
    let pods = node.pods.lock().unwrap();
    let mut selected: Vec<_> = pods
        .values()
        .filter(|p| p.ready && p.namespace == route.namespace)
        .filter(|p| {
            route
                .selector
                .iter()
                .all(|(k, v)| p.labels.get(k) == Some(v))
        })
        .filter(|_| !route.selector.is_empty())
        .collect();
    selected.sort_by(|a, b| a.name.cmp(&b.name));
    selected
        .into_iter()
        .filter_map(|p| {
            let port = match &route.target {
                IntOrString::Int(n) => u16::try_from(*n).ok()?,
                IntOrString::String(name) => *p.named_ports.get(name)?,
            };
            let host = *p.ports.ports.get(&port)?;
            Some(SocketAddr::from(([127, 0, 0, 1], host)))
        })
        .collect()
}
