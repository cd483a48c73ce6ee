//! Who is calling: bearer JWTs validated locally against the policy's trusted issuers.

pub mod cache;
pub mod delegation;
pub mod jwt;
pub mod keys;
pub mod mint;
pub mod store;

pub use jwt::{AuthError, Identity, bearer_token, validate_token};
pub use keys::{KeySet, KeySetError};
