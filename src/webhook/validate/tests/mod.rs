//! Tests of the validating webhook's checks, one file per kind plus the dispatcher.

mod dispatch;
mod exception;
mod fixtures;
mod policy;
mod revocation;
mod selector;
