//! The control plane: `lifeguard operator`. Watches the three Lifeguard resources and the pods
//! that carry a sidecar, compiles one snapshot per policy, streams it to every sidecar, fans
//! revocations out and collects acknowledgements into status, and turns standard security
//! events (SSF/CAEP/RISC) into PrincipalRevocations.
//!
//! # Data flow
//!
//! watch caches (reflectors) → [`distributor`] (pure [`plan`] on every change and at every
//! exception boundary) → one [`stream::Distribution`] on a `watch` channel → every sidecar's
//! [`stream`] → acknowledgements into [`sessions`] → the status reconcilers in
//! [`controllers`] (leader only, see [`lease`]) via [`status`] and [`propagation`].
//! Security events enter through [`ssf`] and become PrincipalRevocations ([`revocation_sink`]),
//! which flow back in through the watch like any other object. The leader also keeps the CA
//! ConfigMap injected sidecars mount in every opted-in namespace ([`ca_distribution`]).

mod ack_sync;
mod ack_table;
mod auth;
mod ca_distribution;
mod cluster_acks;
pub mod config;
#[cfg(test)]
mod contract_tests;
mod controllers;
mod conventions;
mod distributor;
mod lease;
mod metrics;
mod network_policy;
mod object_metrics;
mod plan;
mod propagation;
mod revocation_sink;
mod revocation_traces;
mod run;
mod sessions;
pub mod ssf;
mod status;
mod stream;
mod watches;

pub use run::{OperatorConfig, run};
