//! Lifeguard: owner-bound, deadline-bounded, revocable MCP Tasks for every MCP server in a
//! Kubernetes cluster.
//!
//! The crate is one binary (`lifeguard`) over a pure core: [`api`] holds the custom resource
//! types, [`policy`] compiles them into the [`policy::EffectivePolicy`] a sidecar enforces.
//!
//! # Who may import whom
//!
//! Dependencies point toward the pure core. This table is the one source: the architecture test
//! (`tests/it/architecture.rs`) parses it and fails on an import it does not allow, on a
//! permission nothing uses, and on a module it omits. The same test checks that no sibling
//! modules anywhere in the crate (the binary's `cli` included) import each other in a cycle, and
//! the sidecar's layer order (the table in [`sidecar`]'s docs).
//!
//! | module | may import |
//! |---|---|
//! | `model` (domain types), `api` (CRD types), `telemetry`, `runtime` | nothing of the crate |
//! | `policy` (pure compiler) | `api` |
//! | `ledger` (task store) | `model`, `telemetry` (each ledger call a child span of the request's) |
//! | `identity`, `mcp` (the wire, pure) | `model`, `api`, `policy` |
//! | `audit` | `model`, `telemetry` (each event's decision on the request's span) |
//! | `exception` | `model`, `api`, `policy`, `identity`, `mcp` |
//! | `distribution` (operator↔sidecar messages, pure) | `policy` |
//! | `operator` (control plane) | `api`, `policy`, `identity`, `exception`, `distribution`, `telemetry`, `runtime` |
//! | `webhook` (admission) | `api`, `policy`, `exception`, `telemetry`, `runtime` |
//! | `sidecar` | `model`, `api`, `policy`, `identity`, `audit`, `mcp`, `ledger`, `exception`, `distribution`, `telemetry`, `runtime` |
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
