//! The control plane: `lifeguard operator`. Watches the three Lifeguard resources and the pods
//! that carry a sidecar, compiles one snapshot per policy, streams it to every sidecar, fans
//! revocations out and collects acknowledgements into status, and turns standard security
//! events (SSF/CAEP/RISC) into PrincipalRevocations.
pub mod plan;
pub mod auth;
pub mod propagation;
pub mod sessions;
pub mod status;
