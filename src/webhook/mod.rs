//! `lifeguard webhook`: the admission webhook.
//!
//! - `/inject` (Pods, CREATE): decides whether a pod gets the enforcing sidecar ([`opt_in`],
//!   [`inject`]) and answers with the JSONPatch that adds it.
//! - `/validate` (the three CRDs, CREATE/UPDATE): what CEL cannot check ([`validate`]):
//!   exception signatures, overlapping policy selectors, revocation sanity.
//!
//! The decisions are pure functions over the admitted object and a read-only view of the
//! cluster (watch caches); the server ([`server`]) and wiring ([`run`]) are a thin shell.
//! The webhook writes nothing to the API server while admitting (`sideEffects: None`).

pub mod admission;
pub mod config;
pub mod inject;
pub mod metrics;
pub mod opt_in;
pub mod reasons;
pub mod run;
pub mod server;
pub mod validate;

#[cfg(test)]
mod golden_tests;
