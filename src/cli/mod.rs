//! The `lifeguard` command line: argument definitions and thin handlers over the library.

pub mod crdgen;
pub mod policy_check;

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// Lifeguard: owner-bound, deadline-bounded, revocable MCP Tasks on Kubernetes.
#[derive(Debug, Parser)]
#[command(name = "lifeguard", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write the CustomResourceDefinitions derived from the Rust types.
    Crdgen(CrdgenArgs),
    /// Work with policy manifests.
    #[command(subcommand)]
    Policy(PolicyCommand),
}

#[derive(Debug, clap::Args)]
pub struct CrdgenArgs {
    /// Directory to write one YAML file per CRD into.
    #[arg(long, default_value = "crds")]
    pub out_dir: PathBuf,
    /// Print all CRDs as one multi-document YAML stream instead of writing files.
    #[arg(long, conflicts_with = "out_dir")]
    pub stdout: bool,
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Check manifest files (McpServerPolicy, CapabilityException, PrincipalRevocation) the way
    /// the API server and Lifeguard would, and compile every policy found. Exits 1 on any error.
    Check(PolicyCheckArgs),
}

#[derive(Debug, clap::Args)]
pub struct PolicyCheckArgs {
    /// Multi-document YAML files, as you would `kubectl apply -f`.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Where the policy will run: `cluster` refuses `jwksFile`, `standalone` allows it.
    #[arg(long, value_enum, default_value_t = CheckMode::Cluster)]
    pub mode: CheckMode,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CheckMode {
    Cluster,
    Standalone,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
}
