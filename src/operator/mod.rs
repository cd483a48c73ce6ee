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

pub mod ack_sync;
pub mod ack_table;
pub mod auth;
pub mod ca_distribution;
pub mod cluster_acks;
pub mod config;
#[cfg(test)]
mod contract_tests;
pub mod controllers;
pub mod distributor;
pub mod lease;
pub mod metrics;
pub mod network_policy;
pub mod object_metrics;
pub mod plan;
pub mod propagation;
pub mod revocation_sink;
mod run;
pub mod sessions;
pub mod ssf;
pub mod status;
pub mod stream;

pub use run::{OperatorConfig, run};

/// The one field manager of every write the operator makes (status, child objects, ack tables).
pub const FIELD_MANAGER: &str = "lifeguard-operator";

/// Locks `mutex`, also after a panic elsewhere poisoned it: every structure the operator keeps
/// behind a mutex is updated by single inserts and replacements, so it stays consistent.
pub(crate) fn locked<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}
