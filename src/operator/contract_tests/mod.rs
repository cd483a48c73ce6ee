//! Layer 2 of the testing plan: the exact API contracts of the operator's IO shell. Each test
//! runs one real reconcile (or Lease round, token review, sink call) against a
//! [`kube::Client`] whose transport is tower-test's mock service, and a scripted
//! [`api_server`] asserts every request — method, path and query, content type, JSON body —
//! and answers it. What is not in a script must not be sent: a status that is already right
//! is not rewritten, and a follower writes nothing.

mod api_server;
mod fixtures;

mod auth;
mod exception;
mod lease;
mod network_policy;
mod object_metrics;
mod policy;
mod revocation;
mod revocation_sink;
mod revocation_traces;
