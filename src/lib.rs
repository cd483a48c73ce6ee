//! Lifeguard: owner-bound, deadline-bounded, revocable MCP Tasks for every MCP server in a
//! Kubernetes cluster.
//!
//! The crate is one binary (`lifeguard`) over a pure core: [`api`] holds the custom resource
//! types, [`policy`] compiles them into the [`policy::EffectivePolicy`] a sidecar enforces.
#![forbid(unsafe_code)]

pub mod api;
pub mod audit;
pub mod exception;
pub mod identity;
pub mod ledger;
pub mod mcp;
pub mod model;
pub mod policy;
pub mod sidecar;
pub mod telemetry;
