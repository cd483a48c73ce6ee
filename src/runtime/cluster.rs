//! The Kubernetes client and own namespace of the control-plane components (operator,
//! webhook), resolved the same way for both.

use std::path::Path;

use anyhow::{Context, Result};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// Namespace of the component itself: the flag, else `$POD_NAMESPACE`, else the mounted
/// ServiceAccount's, else `lifeguard-system`.
pub fn own_namespace(flag: Option<&str>) -> String {
    if let Some(ns) = flag {
        return ns.to_owned();
    }
    if let Ok(ns) = std::env::var("POD_NAMESPACE")
        && !ns.is_empty()
    {
        return ns;
    }
    std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "lifeguard-system".to_owned())
}

/// `--kubeconfig`, else the in-cluster configuration, else `$KUBECONFIG` (or
/// `~/.kube/config`).
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("using kubeconfig {}", path.display()))?
        }
        None => match Config::incluster() {
            Ok(c) => c,
            Err(in_cluster) => Config::from_kubeconfig(&KubeConfigOptions::default())
                .await
                .with_context(|| {
                    format!("no --kubeconfig, not in a cluster ({in_cluster}), and no usable $KUBECONFIG")
                })?,
        },
    };
    Client::try_from(config).context("building the Kubernetes client")
}
