//! Talking to a cluster the way `kubectl` does, for `status` and `revoke`: the kubeconfig
//! (`--kubeconfig`, else `$KUBECONFIG`, else `~/.kube/config`, else the in-cluster
//! configuration), its current or `--context`, and errors that say what to do about them.

use std::path::PathBuf;

use anyhow::{Context, Result, anyhow};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// Which cluster to talk to: the flags every kubectl plugin takes.
#[derive(Debug, Clone, clap::Args)]
pub struct KubectlArgs {
    /// kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else the in-cluster
    /// configuration).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// kubeconfig context (default: the current context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// kubeconfig cluster (default: the context's).
    #[arg(long, value_name = "NAME")]
    pub cluster: Option<String>,
    /// kubeconfig user (default: the context's).
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
}

/// How results are printed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Aligned columns and sentences, for people.
    #[default]
    Table,
    /// One JSON document on stdout, for scripts.
    Json,
}

/// A client for the chosen cluster, and how to name that cluster in messages.
pub struct Cluster {
    pub client: Client,
    /// The context's namespace (`default` when it names none).
    pub default_namespace: String,
    /// e.g. `context "kind-dev" (https://127.0.0.1:6443)`, or `the in-cluster API server`.
    pub description: String,
}

impl KubectlArgs {
    fn options(&self) -> KubeConfigOptions {
        KubeConfigOptions {
            context: self.context.clone(),
            cluster: self.cluster.clone(),
            user: self.user.clone(),
        }
    }

    fn names_a_kubeconfig_entry(&self) -> bool {
        self.context.is_some() || self.cluster.is_some() || self.user.is_some()
    }

    /// Reads the kubeconfig and builds a client (no request is made yet).
    pub async fn connect(&self) -> Result<Cluster> {
        let options = self.options();
        let kubeconfig = match &self.kubeconfig {
            Some(path) => Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?,
            None => match Kubeconfig::read() {
                Ok(kubeconfig) => kubeconfig,
                Err(e) if self.names_a_kubeconfig_entry() => {
                    return Err(anyhow::Error::new(e).context(
                        "reading the kubeconfig ($KUBECONFIG, else ~/.kube/config) named by --context/--cluster/--user",
                    ));
                }
                Err(no_kubeconfig) => {
                    let config = Config::incluster().map_err(|in_cluster| {
                        anyhow!(
                            "no kubeconfig ({no_kubeconfig}) and not running in a pod \
                             ({in_cluster}): pass --kubeconfig FILE or set $KUBECONFIG"
                        )
                    })?;
                    return cluster(config, "the in-cluster API server".into());
                }
            },
        };
        let context = options
            .context
            .clone()
            .or_else(|| kubeconfig.current_context.clone())
            .unwrap_or_default();
        let config = Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .with_context(|| format!("using kubeconfig context {context:?}"))?;
        let description = format!("context {context:?} ({})", config.cluster_url);
        cluster(config, description)
    }
}

fn cluster(config: Config, description: String) -> Result<Cluster> {
    let default_namespace = config.default_namespace.clone();
    let client = Client::try_from(config).context("building the Kubernetes client")?;
    Ok(Cluster {
        client,
        default_namespace,
        description,
    })
}

/// The plural names of the Lifeguard resources, as discovery lists them.
pub const POLICIES: &str = "mcpserverpolicies";
pub const EXCEPTIONS: &str = "capabilityexceptions";
pub const REVOCATIONS: &str = "principalrevocations";

impl Cluster {
    /// Fails with a message naming what is missing unless the API server serves every resource
    /// in `plurals` under `lifeguard.dev/v1alpha1` (discovery, as kubectl does first).
    pub async fn ensure_served(&self, plurals: &[&str]) -> Result<()> {
        let served = match self
            .client
            .list_api_group_resources(lifeguard::api::API_VERSION)
            .await
        {
            Ok(list) => list.resources.into_iter().map(|r| r.name).collect(),
            Err(kube::Error::Api(status)) if status.code == 404 => Vec::new(),
            Err(e) => return Err(self.explain(e, "asking which Lifeguard resources are served")),
        };
        let missing = missing_resources(&served, plurals);
        if missing.is_empty() {
            return Ok(());
        }
        Err(anyhow!(
            "the Lifeguard CRDs are not installed in {}: {} not served. Install them with \
             `kubectl apply -f crds/` (or the lifeguard-crds Helm chart)",
            self.description,
            missing
                .iter()
                .map(|plural| format!("{plural}.{}", lifeguard::api::GROUP))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }

    /// `error` as a sentence about this cluster, keeping the cause.
    pub fn explain(&self, error: kube::Error, doing: &str) -> anyhow::Error {
        let summary = describe(&error, &self.description);
        anyhow::Error::new(error).context(format!("{summary} ({doing})"))
    }
}

/// The resources of `wanted` that `served` lacks, in `wanted`'s order.
pub fn missing_resources<'a>(served: &[String], wanted: &[&'a str]) -> Vec<&'a str> {
    wanted
        .iter()
        .copied()
        .filter(|plural| !served.iter().any(|s| s == plural))
        .collect()
}

/// What went wrong, in words a kubectl user acts on.
pub fn describe(error: &kube::Error, cluster: &str) -> String {
    match error {
        kube::Error::Api(status) => match status.code {
            401 => format!(
                "the API server of {cluster} did not accept the credentials (401 Unauthorized): {}",
                status.message
            ),
            403 => format!(
                "forbidden by the API server of {cluster} (check your RBAC permissions): {}",
                status.message
            ),
            code => format!(
                "the API server of {cluster} answered {code} {}: {}",
                status.reason, status.message
            ),
        },
        kube::Error::HyperError(_) | kube::Error::Service(_) => {
            format!("cannot reach the Kubernetes API server of {cluster}")
        }
        _ => format!("talking to the API server of {cluster} failed"),
    }
}

/// Writes `text` to stdout. A reader that went away (`| head`) ends the output quietly
/// instead of failing the command.
pub fn print_stdout(text: &str) -> Result<()> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::new(e).context("writing to stdout"))
        }
        _ => Ok(()),
    }
}

/// A single-threaded runtime for one command.
pub fn block_on<T>(future: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(future)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            reason: reason.into(),
            message: message.into(),
            ..Default::default()
        }))
    }

    #[test]
    fn missing_resources_keeps_the_order_asked_for() {
        let served = vec!["mcpserverpolicies".to_owned(), "other".to_owned()];
        assert_eq!(
            missing_resources(&served, &[REVOCATIONS, POLICIES, EXCEPTIONS]),
            vec![REVOCATIONS, EXCEPTIONS]
        );
        assert!(missing_resources(&served, &[POLICIES]).is_empty());
    }

    #[test]
    fn api_errors_are_described_by_what_the_user_can_do() {
        let c = "context \"dev\"";
        assert!(describe(&api_error(401, "Unauthorized", "x"), c).contains("credentials"));
        let forbidden = describe(
            &api_error(403, "Forbidden", "cannot list principalrevocations"),
            c,
        );
        assert!(forbidden.contains("RBAC") && forbidden.contains("cannot list"));
        let other = describe(&api_error(500, "InternalError", "boom"), c);
        assert_eq!(
            other,
            "the API server of context \"dev\" answered 500 InternalError: boom"
        );
    }
}
