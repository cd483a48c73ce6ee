//! What the benchmarks under `examples/` share: `operator_bench`, `admission_bench`,
//! `sidecar_bench` and `scale_out_bench` each include this directory as a module,
//! `#[path = "../bench_support/mod.rs"] mod bench_support;` (it has no `main.rs`, so cargo does
//! not take it for an example of its own).
//!
//! - `cli`: what every `main` does around its run (runtime and exit status, where binaries,
//!   work directories and results files are, Ctrl-C, writing the results file);
//! - `procs`: child processes and what /proc says about them and the machine;
//! - `stats`: nearest-rank percentiles and the error tally;
//! - `machine`: where a benchmark ran;
//! - `report`: pieces of the reports (heading, targets and their verdicts, the error summary);
//! - `otlp`: an OTLP gRPC trace receiver that counts the spans a process under test exports
//!   (`sidecar_bench --tracing`; any benchmark of a process that exports spans can use it);
//! - `postgres`: a database of the benchmark's own on a PostgreSQL server (`scale_out_bench`,
//!   `sidecar_bench --rate-limits`).
//!
//! What only two benchmarks share stays with one of them, and the other includes it by path:
//! `operator_bench/harness.rs` (the API emulator, the CA, the control-plane process) and
//! `operator_bench/stats.rs` (durations in ms) in `admission_bench`; `sidecar_bench/procs.rs`
//! (the example server and the sidecar under test), `client.rs` and `stats.rs` (nanoseconds) in
//! `scale_out_bench`.

// Each benchmark uses part of this: what one leaves unused is not dead in another.
#![allow(dead_code)]

pub mod cli;
pub mod machine;
pub mod otlp;
pub mod postgres;
pub mod procs;
pub mod report;
pub mod stats;
