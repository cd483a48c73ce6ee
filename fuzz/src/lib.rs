//! What the fuzz targets share: the test fixtures they sign and verify with, a fixed clock,
//! how one input is cut into several fields, and a poller for streams that are always ready.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

/// The test issuer's Ed25519 private key (kid `test-ed-1` in [`ISSUER_JWKS`]).
pub const ISSUER_ED25519: &[u8] = include_bytes!("../../tests/fixtures/keys/issuer-ed25519.pem");
/// The test issuer's public keys: `test-ed-1` (Ed25519) and `test-rsa-1` (RSA).
pub const ISSUER_JWKS: &[u8] = include_bytes!("../../tests/fixtures/keys/issuer-jwks.json");
/// The kid of [`ISSUER_ED25519`].
pub const ISSUER_KID: &str = "test-ed-1";
/// The issuer every target's trust is configured for.
pub const ISSUER: &str = "https://idp.test";
/// The audience (resource) every target's trust is configured for.
pub const AUDIENCE: &str = "https://mcp.test/mcp";
/// "Now" for every target, Unix seconds (2027-01-15): inputs are judged at a fixed instant so
/// that a crash reproduces.
pub const NOW: i64 = 1_800_000_000;

/// The first byte chooses a target's mode; the rest is the mode's input.
pub fn mode(data: &[u8]) -> Option<(u8, &[u8])> {
    data.split_first().map(|(m, rest)| (*m, rest))
}

/// Cuts `data` at NUL bytes into exactly `N` fields (missing ones are empty; the last keeps any
/// further NULs).
pub fn fields<const N: usize>(data: &[u8]) -> [&[u8]; N] {
    let mut out = [&data[..0]; N];
    let mut rest = data;
    for (i, slot) in out.iter_mut().enumerate() {
        if i + 1 == N {
            *slot = rest;
            break;
        }
        match rest.iter().position(|&b| b == 0) {
            Some(at) => {
                *slot = &rest[..at];
                rest = &rest[at + 1..];
            }
            None => {
                *slot = rest;
                rest = &rest[rest.len()..];
            }
        }
    }
    out
}

/// Runs a future that never waits (a decoder over bytes already in memory) to completion.
/// Panics if it does wait: nothing would ever wake it.
pub fn run_ready<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("a future over in-memory bytes is pending"),
    }
}

/// A deterministic sequence of chunk lengths (1..=max) derived from `seed`, for cutting one
/// input into chunks in a way that changes with the input.
pub fn chunk_lengths(seed: u8, max: usize) -> impl Iterator<Item = usize> {
    let mut state = u32::from(seed) | 0x9e37_0000;
    std::iter::repeat_with(move || {
        // xorshift32
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        (state as usize % max.max(1)) + 1
    })
}
