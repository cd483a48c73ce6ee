//! The operator's security-event receiver: OpenID Shared Signals Framework 1.0 with the CAEP
//! and RISC event vocabularies. Security Event Tokens (RFC 8417) arrive by push (RFC 8935,
//! [`push::router`]) or by poll (RFC 8936, [`poll::PollClient`]), are verified against their
//! transmitter's keys ([`set`]), mapped to PrincipalRevocations ([`events`]) and recorded
//! through a [`RevocationSink`] the operator implements with kube.
//!
//! Wiring, in the operator:
//! 1. parse the `securityEvents` section ([`SecurityEventsConfig`]);
//! 2. build one [`SsfReceiver`] with a [`SecretReader`] and a [`RevocationSink`], start
//!    [`SsfReceiver::spawn_key_refresh`] and register [`SsfReceiver::metrics`];
//! 3. serve [`push::router`] when any transmitter pushes;
//! 4. run one [`poll::PollClient`] per [`SsfReceiver::poll_transmitters`] entry.
//!
//! Delivery is at least once; idempotence comes from the object names (a hash of issuer and
//! `jti`) and, within one process, from the set of recently accepted SETs.

pub mod accepted;
pub mod config;
pub mod events;
pub mod metrics;
pub mod poll;
pub mod push;
pub mod rate;
pub mod receiver;
pub mod secrets;
pub mod set;
pub mod subject;

#[cfg(test)]
mod test_receiver;
#[cfg(test)]
mod test_support;

pub use config::{Delivery, SecretKeyRef, SecurityEventsConfig, TransmitterConfig};
pub use events::RevocationAction;
pub use poll::{PollClient, PollSettings, spawn_poll_clients};
pub use push::{PUSH_PATH, router};
pub use receiver::{Deferral, Outcome, RevocationSink, SinkError, SsfReceiver, Via};
pub use secrets::{SecretError, SecretReader};
pub use set::{SetError, VerifiedSet};
pub use subject::SubjectId;
