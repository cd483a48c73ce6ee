//! The integration tests: one binary, one module per area. Each module starts what it tests
//! for real (the `lifeguard` binary, the example MCP server, PostgreSQL databases, the
//! Kubernetes API emulator, Python and Node peers) through the shared harness in [`support`].
//! One binary links the crate once; CONTRIBUTING.md says where each kind of test lives.
//!
//! Run one area with `cargo test --test it sidecar_tasks::`.

mod support;

mod architecture;
mod bench_smoke;
mod crash_harness;
mod crds_up_to_date;
mod demo_cluster;
mod evidence_pack;
mod example_server;
mod example_server_streams;
mod exception_cli;
mod helm_chart;
mod interop_conformance;
mod interop_fastmcp;
mod kube_emulator;
mod kube_emulator_admission;
mod kube_emulator_kubectl;
mod kubectl_plugin;
mod monitoring;
mod network_faults;
mod operator_ca_distribution;
mod operator_cli;
mod operator_cluster;
mod operator_distribution;
mod policy_examples;
mod scale_out;
mod scale_out_rate_limits;
mod sidecar_app_probes;
mod sidecar_audit_failure;
mod sidecar_audit_trail;
mod sidecar_cancellation;
mod sidecar_capabilities;
mod sidecar_capability_budgets;
mod sidecar_client_http2;
mod sidecar_control_plane;
mod sidecar_delegation;
mod sidecar_denials;
mod sidecar_dpop;
mod sidecar_exhaustion;
mod sidecar_hardening;
mod sidecar_identity;
mod sidecar_ledger_cli;
mod sidecar_lifecycle;
mod sidecar_listen;
mod sidecar_objects;
mod sidecar_rate_limits;
mod sidecar_refusals;
mod sidecar_results;
mod sidecar_revocation;
mod sidecar_sampling_isolation;
mod sidecar_tasks;
mod tracing_export;
mod tracing_revocation;
mod tracing_tasks;
mod webhook_admission;
mod webhook_end_to_end;
mod webhook_injected_sidecar;
