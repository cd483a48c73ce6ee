//! Who is calling: bearer JWTs validated locally against the policy's trusted issuers.

pub mod cache;
pub mod client_cert;
pub mod delegation;
pub mod dpop;
pub mod dpop_mint;
pub mod dpop_nonce;
pub mod dpop_signature;
pub mod jwt;
pub mod keys;
pub mod mint;
pub mod store;

pub use jwt::{AuthError, Identity, Scheme, bearer_token, credential, validate_token};
pub use keys::{KeySet, KeySetError};
