//! Validation of `spec.identity.dpop`: how DPoP proofs are checked.

use std::time::Duration;

use crate::api::{DpopSpec, JwsAlgorithm};

use super::problem::Problems;

/// The narrowest `iat` window accepted: below it, ordinary clock skew between client and
/// sidecar refuses honest proofs.
pub const MIN_PROOF_WINDOW: Duration = Duration::from_secs(10);
/// The widest: a captured proof (and the replay cache remembering it) lives this long.
pub const MAX_PROOF_WINDOW: Duration = Duration::from_secs(15 * 60);

pub(super) fn validate_dpop(dpop: Option<&DpopSpec>, p: &mut Problems) {
    let Some(dpop) = dpop else {
        return;
    };
    if let Some(algorithms) = &dpop.algorithms {
        if algorithms.is_empty() {
            p.error(
                "spec.identity.dpop.algorithms",
                "must list at least one algorithm (omit it for the defaults)",
            );
        }
        let mut seen: Vec<JwsAlgorithm> = Vec::new();
        for (i, alg) in algorithms.iter().enumerate() {
            if seen.contains(alg) {
                p.error(
                    format!("spec.identity.dpop.algorithms[{i}]"),
                    format!("{alg:?} is listed twice"),
                );
            }
            seen.push(*alg);
        }
    }
    if let Some(window) = &dpop.proof_window {
        let value = window.get();
        if !(MIN_PROOF_WINDOW..=MAX_PROOF_WINDOW).contains(&value) {
            p.error(
                "spec.identity.dpop.proofWindow",
                format!("must be from 10s to 15m, not {window}"),
            );
        }
    }
}
