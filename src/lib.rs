//! Lifeguard: owner-bound, deadline-bounded, revocable MCP Tasks for every MCP server in a
//! Kubernetes cluster.
//!
//! The crate is one binary (`lifeguard`) over a pure core: [`api`] holds the custom resource
//! types, [`policy`] compiles them into the [`policy::EffectivePolicy`] a sidecar enforces.
//!
//! # Who may import whom
//!
//! Dependencies point toward the pure core. `tests/architecture.rs` enforces this table and
//! that no sibling modules anywhere in the crate import each other in a cycle; change both
//! together.
//!
//! | module | may import |
//! |---|---|
//! | `model` (domain types), `api` (CRD types), `telemetry`, `runtime` | nothing of the crate |
//! | `policy` (pure compiler) | `api` |
//! | `ledger` (task store) | `model` |
//! | `identity`, `audit`, `mcp` (the wire, pure) | `model`, `api`, `policy` |
//! | `exception` | `model`, `api`, `policy`, `identity`, `audit`, `mcp` |
//! | `distribution` (operator↔sidecar messages, pure) | `policy`, `api` |
//! | `operator` (control plane) | `model`, `api`, `policy`, `identity`, `exception`, `distribution`, `telemetry`, `runtime` |
//! | `webhook` (admission) | `model`, `api`, `policy`, `identity`, `exception`, `telemetry`, `runtime` |
//! | `sidecar` | all of the above except `operator` and `webhook` |
//!
//! `operator`, `sidecar` and `webhook` never import one another: they meet in `policy`
//! (what a policy means) and `distribution` (how it travels).
#![forbid(unsafe_code)]

pub mod api;
pub mod audit;
pub mod distribution;
pub mod exception;
pub mod identity;
pub mod ledger;
pub mod mcp;
pub mod model;
pub mod operator;
pub mod policy;
pub mod runtime;
pub mod sidecar;
pub mod telemetry;
pub mod webhook;
