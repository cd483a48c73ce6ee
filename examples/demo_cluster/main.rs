//! `scripts/demo-cluster.sh`: Lifeguard's whole story on a laptop, driven with real kubectl.
//!
//! An API server emulator (tests/kube_emulator, not a cluster) with the CRDs and the webhook
//! configurations rendered from the Helm charts; the operator and the webhook running as the
//! chart's Deployments; a pod runner standing in for the kubelet, the scheduler, the Deployment
//! controller and kube-proxy; then the story, narrated (story.rs). docs/install.md, "Try it
//! without a cluster", says what is real and what is stood in for.
//!
//! Usage: demo_cluster [--keep] [--state DIR]   (scripts/demo-cluster.sh builds and runs it)

mod cluster;
mod idp;
mod runner;
mod story;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

#[derive(Parser)]
#[command(about = "Lifeguard's control plane on an API emulator, driven with real kubectl")]
struct Args {
    /// Leave everything running after the story, for your own kubectl commands (Ctrl-C stops it).
    #[arg(long)]
    keep: bool,
    /// Where the demo keeps its kubeconfig, manifests, pods' volumes and logs (cleared at start).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/target/demo-cluster"))]
    state: PathBuf,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    println!(
        "Starting the API emulator, the demo identity provider and the pod runner (state: {})",
        args.state.display()
    );
    let cluster = match cluster::Cluster::start(&args.state).await {
        Ok(cluster) => cluster,
        Err(e) => {
            eprintln!("demo-cluster: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let mut story = story::Story::new(&cluster);
    let told = tokio::select! {
        told = story.tell() => told,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("\ninterrupted: stopping every process");
            return ExitCode::from(130);
        }
    };
    if let Err(e) = told {
        eprintln!(
            "\ndemo-cluster: {e:#}\nlogs of every process: {}",
            cluster.state.display()
        );
        return ExitCode::FAILURE;
    }
    if args.keep {
        println!(
            "\nEverything keeps running (API emulator: {}). In another terminal:\n\n  export KUBECONFIG={} PATH={}:$PATH\n  kubectl get pods -A\n  kubectl lifeguard status -n team-a\n\n\
             Pods' logs: {}/pods/NAMESPACE/POD/CONTAINER.log (the emulator has no `kubectl logs`).\n\
             Press Ctrl-C to stop every process.",
            cluster.emulator_url,
            cluster.kubeconfig.display(),
            cluster.bin.display(),
            cluster.state.display(),
        );
        let _ = tokio::signal::ctrl_c().await;
        println!("stopping every process");
    }
    ExitCode::SUCCESS
}
