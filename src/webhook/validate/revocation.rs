//! PrincipalRevocation: sanity of the cut-off and expiry, which CEL cannot judge without a
//! clock.
//!
//! Rules (each applied on CREATE, and on UPDATE only when the field it reads changes):
//!
//! - **`revokedBefore` at most [`CLOCK_SKEW`] ahead of now, else deny.** A revocation refuses
//!   tokens issued *at or before* the cut-off. A cut-off in the future also refuses every token
//!   issued from now until then, fresh sign-ins included: for session-type reasons that turns
//!   "end these sessions" into "lock the principal out until that date", which is what
//!   `accountDisabled` is for, and is almost always a mistyped date. The skew allows for the
//!   writer's clock running ahead (the operator's security-event receiver refuses SETs more than
//!   5 minutes ahead for the same reason).
//! - **`revokedBefore` older than [`LONGEST_TOKEN_LIFETIME`] warns** (except for
//!   `accountDisabled`/`accountPurged`, which refuse every token whatever the cut-off): tokens
//!   issued before it have normally expired already, so the cut-off refuses nothing that still
//!   works; usually the intended instant is the incident or now.
//! - **`expiresAt` already passed warns**: the operator deletes an expired revocation as soon as
//!   it sees it, so it revokes nothing. Not a denial: a security event that arrives late
//!   produces exactly this, and refusing it would make the receiver retry forever.
//! - **Whitespace around `issuer`, `subject`, `tenant` or `client` warns**: they are compared
//!   with token claims byte for byte.
//! - The compiler's checks ([`crate::policy::validate::validate_revocation`]): errors deny,
//!   warnings warn.
//!
//! The issuer is not required to be a URL: policies may trust any issuer string, and a
//! revocation must be able to name each of them.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

use crate::api::PrincipalRevocation;
use crate::policy::problem::{Problems, Severity};
use crate::policy::validate as compiler;

use super::{Findings, Verdict, reasons};

/// How far ahead of the webhook's clock `revokedBefore` may be.
pub const CLOCK_SKEW: Duration = Duration::from_secs(5 * 60);

/// The longest lifetime of an access token Lifeguard assumes (the operator's default
/// `securityEvents.revocationTtl`): a cut-off older than this refuses no token still in use.
pub const LONGEST_TOKEN_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// Validates a PrincipalRevocation against the rules in this module's documentation.
pub fn validate_revocation(
    new: &PrincipalRevocation,
    old: Option<&PrincipalRevocation>,
    now: Timestamp,
) -> Verdict {
    let spec = &new.spec;
    let mut findings = Findings::default();

    let mut compiled = Findings::default();
    let mut problems = Problems::new();
    compiler::validate_revocation(new, &mut problems);
    for problem in problems.into_vec() {
        let message = format!("{}: {}", problem.path, problem.message);
        match problem.severity {
            Severity::Error => compiled.deny(reasons::INVALID_SPEC, message),
            Severity::Warning => compiled.warn(reasons::SPEC_WARNING, message),
        }
    }
    findings.extend(compiled.introduced_unless(old.is_some_and(|o| o.spec == *spec)));

    let cutoff = spec.revoked_before.0;
    if old.is_none_or(|o| o.spec.revoked_before.0 != cutoff) {
        if cutoff > now + signed(CLOCK_SKEW) {
            findings.deny(
                reasons::REVOKED_BEFORE_IN_FUTURE,
                format!(
                    "spec.revokedBefore: {cutoff} is more than 5 minutes ahead of now ({now}); a future cut-off would also refuse tokens not issued yet, fresh sign-ins included (use accountDisabled to lock a principal out); set the time of the incident, or now"
                ),
            );
        } else if cutoff < now - signed(LONGEST_TOKEN_LIFETIME) && !spec.reason.refuses_all_tokens()
        {
            findings.warn(
                reasons::REVOKED_BEFORE_STALE,
                format!(
                    "spec.revokedBefore: {cutoff} is more than 24h ago; tokens issued before it have normally expired already, so it refuses no token still in use (did you mean the time of the incident, or now?)"
                ),
            );
        }
    }

    if let Some(expires) = &spec.expires_at
        && old.is_none_or(|o| o.spec.expires_at.as_ref() != Some(expires))
        && expires.0 <= now
    {
        findings.warn(
            reasons::ALREADY_EXPIRED,
            format!(
                "spec.expiresAt: {} has passed; the operator deletes the revocation as soon as it sees it, so it revokes nothing",
                expires.0
            ),
        );
    }

    for (field, value) in [
        ("issuer", Some(&spec.issuer)),
        ("subject", spec.subject.as_ref()),
        ("tenant", spec.tenant.as_ref()),
        ("client", spec.client.as_ref()),
    ] {
        if let Some(value) = value
            && value.trim() != value
        {
            findings.warn(
                reasons::WHITESPACE,
                format!(
                    "spec.{field}: has leading or trailing whitespace; it is compared with token claims exactly, so it will likely match nothing"
                ),
            );
        }
    }
    findings.verdict()
}

fn signed(d: Duration) -> SignedDuration {
    SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX)
}
