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
//! | `sidecar` | all of the above |
//!
//! The operator and the webhook (next) sit beside `sidecar`: the three never import one
//! another; they meet in `policy` (what a policy means) and, for the operator and the sidecar,
//! in the distribution messages (how it travels).
#![forbid(unsafe_code)]

pub mod api;
pub mod audit;
pub mod exception;
pub mod identity;
pub mod ledger;
pub mod mcp;
pub mod model;
pub mod policy;
pub mod runtime;
pub mod sidecar;
pub mod telemetry;
