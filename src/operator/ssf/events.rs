//! What a verified SET asks Lifeguard to do. Pure.
//!
//! # Mapping
//!
//! | event type | action |
//! |---|---|
//! | CAEP `session-revoked`, RISC `sessions-revoked` (deprecated alias) | revoke, `sessionRevoked` |
//! | CAEP `credential-change` with `change_type` `revoke` or `delete`, or `update` of a `password` | revoke, `credentialChange` |
//! | CAEP `credential-change`, other changes (`create`, other updates) | none: accepted for the audit trail |
//! | RISC `account-disabled` | revoke, `accountDisabled` (every token refused, no expiry) |
//! | RISC `account-purged` | revoke, `accountPurged` (every token refused, no expiry) |
//! | RISC `credential-compromise` | revoke, `credentialCompromise` |
//! | RISC `account-enabled` | remove the principal's `accountDisabled` revocations |
//! | SSF `verification`, `stream-updated` | none |
//! | anything else | the SET is refused (`invalid_request`, "unsupported event") |
//!
//! Choices made:
//! - **Unsupported events refuse the whole SET** rather than being ignored, so a transmitter
//!   (and whoever watches its delivery errors) learns that Lifeguard did not act on it. Streams
//!   should request only [`SUPPORTED_EVENT_TYPES`].
//! - **Principal** (see [`SubjectId::principal`]): `iss_sub` names its own issuer and subject;
//!   `email`, `opaque` and `account` name the SET issuer's subject with that value; `complex`
//!   takes its `user` and narrows to its `tenant`. A revoking event whose subject names no
//!   principal (a phone number, a device only) is refused as `invalid_request`.
//! - **`revokedBefore`** is the event's `event_timestamp`, else the SET's `iat`. A timestamp
//!   later than `iat` is lowered to `iat`: an event cannot happen after the SET announcing it
//!   was issued, and a transmitter clock running ahead must not revoke tokens issued after
//!   the event.
//! - **`expiresAt`** is `revokedBefore + revocationTtl` for the reasons after which a fresh
//!   login works again (by then every token issued before `revokedBefore` has expired);
//!   `accountDisabled` and `accountPurged` never expire on their own.
//! - **Names** are `ssf-` and the first 20 hex digits of SHA-256 over the issuer, a 0 byte and
//!   the `jti` (plus a 0 byte and the event's index when the SET carries several revoking
//!   events), so a redelivered SET maps to the same object and creates nothing new.
//! - **`account-enabled`** removes only revocations older than the enabling event
//!   ([`RevocationAction::RemoveAccountDisabled::enabled_at`]), so an enable delivered late
//!   cannot lift a newer disable, and only those the same transmitter's events created
//!   ([`created_by`]): one transmitter never undoes another's event, and no event undoes a
//!   person's revocation. Whether a transmitter may lift at all is its `liftRevocations`
//!   setting (default: no, only people lift); the receiver drops the action otherwise.
//!
//! # Which transmitter created a revocation
//!
//! Anyone allowed to write PrincipalRevocations can set `spec.source` and the
//! [`SOURCE_LABEL`] label to anything, so neither alone proves who created an object. The
//! operator believes `spec.source.issuer` only when the object's **name** is the one this
//! module derives from that issuer and `spec.source.jti` ([`object_name`]). Names are
//! immutable, so the mark cannot be moved onto someone else's revocation: editing the source of
//! a transmitter's or a person's revocation makes it match no transmitter. Whoever can create
//! revocations can create one under such a name, but lifting it only undoes their own write.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::api::{
    PrincipalRevocation, PrincipalRevocationSpec, RevocationReason, RevocationSource,
    RevocationSourceKind,
};

use super::set::{MAX_EVENTS_PER_SET, SetError, VerifiedSet, numeric_date};
use super::subject::{Principal, SubjectId};

/// Label put on every revocation the receiver creates.
pub const SOURCE_LABEL: &str = "lifeguard.dev/source";
/// Value of [`SOURCE_LABEL`].
pub const SOURCE_LABEL_VALUE: &str = "security-event";

const CAEP: &str = "https://schemas.openid.net/secevent/caep/event-type/";
const RISC: &str = "https://schemas.openid.net/secevent/risc/event-type/";
const SSF: &str = "https://schemas.openid.net/secevent/ssf/event-type/";

/// Every event type the receiver accepts (what `classify` knows).
pub const SUPPORTED_EVENT_TYPES: [&str; 9] = [
    "https://schemas.openid.net/secevent/caep/event-type/session-revoked",
    "https://schemas.openid.net/secevent/caep/event-type/credential-change",
    "https://schemas.openid.net/secevent/risc/event-type/account-disabled",
    "https://schemas.openid.net/secevent/risc/event-type/account-purged",
    "https://schemas.openid.net/secevent/risc/event-type/account-enabled",
    "https://schemas.openid.net/secevent/risc/event-type/credential-compromise",
    "https://schemas.openid.net/secevent/risc/event-type/sessions-revoked",
    "https://schemas.openid.net/secevent/ssf/event-type/verification",
    "https://schemas.openid.net/secevent/ssf/event-type/stream-updated",
];

/// One thing to do in the cluster because of a SET.
#[derive(Clone, Debug, PartialEq)]
pub enum RevocationAction {
    /// Create this PrincipalRevocation; an existing object of the same name means a previous
    /// delivery already did (treat AlreadyExists as success).
    Create(Box<PrincipalRevocation>),
    /// Delete the `accountDisabled` PrincipalRevocations of this principal (whatever tenant
    /// they are narrowed to) that events of `transmitter` created ([`created_by`]) with
    /// `revokedBefore` at or before `enabled_at`. Revocations people wrote stay: an IdP
    /// re-enabling an account does not overrule a block an administrator put in Lifeguard.
    RemoveAccountDisabled {
        issuer: String,
        subject: String,
        enabled_at: Time,
        /// The SET's `iss`: only revocations [`created_by`] this transmitter are removed.
        transmitter: String,
    },
}

/// What one event type means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Meaning {
    Revoke(RevocationReason),
    Enable,
    Nothing,
}

fn classify(uri: &str, event: &Value) -> Result<Meaning, SetError> {
    let unsupported = || SetError::UnsupportedEvent(uri.to_owned());
    let (base, name) = [CAEP, RISC, SSF]
        .into_iter()
        .find_map(|base| uri.strip_prefix(base).map(|name| (base, name)))
        .ok_or_else(unsupported)?;
    Ok(match (base, name) {
        (CAEP, "session-revoked") => Meaning::Revoke(RevocationReason::SessionRevoked),
        (CAEP, "credential-change") => credential_change(event)?,
        (RISC, "account-disabled") => Meaning::Revoke(RevocationReason::AccountDisabled),
        (RISC, "account-purged") => Meaning::Revoke(RevocationReason::AccountPurged),
        (RISC, "credential-compromise") => Meaning::Revoke(RevocationReason::CredentialCompromise),
        (RISC, "sessions-revoked") => Meaning::Revoke(RevocationReason::SessionRevoked),
        (RISC, "account-enabled") => Meaning::Enable,
        (SSF, "verification" | "stream-updated") => Meaning::Nothing,
        _ => return Err(unsupported()),
    })
}

fn credential_change(event: &Value) -> Result<Meaning, SetError> {
    let field = |name: &str| event.get(name).and_then(Value::as_str);
    let change = field("change_type").ok_or_else(|| {
        SetError::InvalidEvent("credential-change needs a change_type string".into())
    })?;
    Ok(match change {
        "revoke" | "delete" => Meaning::Revoke(RevocationReason::CredentialChange),
        "update" if field("credential_type") == Some("password") => {
            Meaning::Revoke(RevocationReason::CredentialChange)
        }
        "create" | "update" => Meaning::Nothing,
        other => {
            return Err(SetError::InvalidEvent(format!(
                "credential-change has unknown change_type {other:?}"
            )));
        }
    })
}

/// The actions `set` asks for (see the module documentation). `revocation_ttl` is the
/// configured `revocationTtl`.
pub fn actions_for(
    set: &VerifiedSet,
    revocation_ttl: Duration,
) -> Result<Vec<RevocationAction>, SetError> {
    let meanings = set
        .events
        .iter()
        .map(|(uri, event)| classify(uri, event))
        .collect::<Result<Vec<_>, _>>()?;
    if meanings.iter().all(|m| *m == Meaning::Nothing) {
        return Ok(Vec::new());
    }
    let principal = principal_of(&set.subject)?;
    let issuer = principal
        .issuer
        .clone()
        .unwrap_or_else(|| set.issuer.clone());
    let revoking = meanings
        .iter()
        .filter(|m| matches!(m, Meaning::Revoke(_)))
        .count();
    let mut actions = Vec::new();
    for (index, ((uri, event), meaning)) in set.events.iter().zip(&meanings).enumerate() {
        let at = event_time(set, event)?;
        match meaning {
            Meaning::Nothing => {}
            Meaning::Enable => actions.push(RevocationAction::RemoveAccountDisabled {
                issuer: issuer.clone(),
                subject: principal.subject.clone(),
                enabled_at: at,
                transmitter: set.issuer.clone(),
            }),
            Meaning::Revoke(reason) => {
                let name = object_name(&set.issuer, &set.jti, (revoking > 1).then_some(index));
                let expires_at = (!reason.refuses_all_tokens())
                    .then(|| plus(&at, revocation_ttl))
                    .transpose()?;
                let spec = PrincipalRevocationSpec {
                    issuer: issuer.clone(),
                    subject: Some(principal.subject.clone()),
                    tenant: principal.tenant.clone(),
                    client: None,
                    revoked_before: at,
                    reason: *reason,
                    source: RevocationSource {
                        kind: RevocationSourceKind::SecurityEvent,
                        event_type: Some(uri.clone()),
                        issuer: Some(set.issuer.clone()),
                        jti: Some(set.jti.clone()),
                        txn: set.txn.clone(),
                    },
                    expires_at,
                };
                let mut revocation = PrincipalRevocation::new(&name, spec);
                revocation.metadata.labels = Some(BTreeMap::from([(
                    SOURCE_LABEL.to_owned(),
                    SOURCE_LABEL_VALUE.to_owned(),
                )]));
                actions.push(RevocationAction::Create(Box::new(revocation)));
            }
        }
    }
    Ok(actions)
}

fn principal_of(subject: &SubjectId) -> Result<Principal, SetError> {
    subject.principal().ok_or_else(|| {
        SetError::InvalidSubject(format!(
            "a {} subject names no principal to revoke",
            subject.format()
        ))
    })
}

/// `event_timestamp`, at most the SET's `iat`; else `iat`.
fn event_time(set: &VerifiedSet, event: &Value) -> Result<Time, SetError> {
    let seconds = match event.get("event_timestamp") {
        None => set.iat,
        Some(value) => numeric_date(value)
            .ok_or_else(|| SetError::InvalidEvent("event_timestamp is not a number".into()))?
            .min(set.iat),
    };
    jiff::Timestamp::from_second(seconds)
        .map(Time)
        .map_err(|_| SetError::InvalidEvent("event_timestamp is out of range".into()))
}

fn plus(at: &Time, ttl: Duration) -> Result<Time, SetError> {
    let span = jiff::SignedDuration::try_from(ttl)
        .map_err(|_| SetError::InvalidEvent("revocation lifetime out of range".into()))?;
    at.0.checked_add(span)
        .map(Time)
        .map_err(|_| SetError::InvalidEvent("revocation expiry out of range".into()))
}

/// The transmitter whose event created `revocation`, when its name proves it (see the module
/// documentation): `spec.source` names a security event's issuer and `jti`, and the object's
/// name is the one derived from them. `None` for people's revocations and for any object whose
/// source was edited.
pub fn created_by(revocation: &PrincipalRevocation) -> Option<&str> {
    let source = &revocation.spec.source;
    if source.kind != RevocationSourceKind::SecurityEvent {
        return None;
    }
    let (issuer, jti) = (source.issuer.as_deref()?, source.jti.as_deref()?);
    let name = revocation.metadata.name.as_deref()?;
    let derived = std::iter::once(None)
        .chain((0..MAX_EVENTS_PER_SET).map(Some))
        .any(|index| object_name(issuer, jti, index) == name);
    derived.then_some(issuer)
}

/// Whether `existing` (found under the name `wanted` was to be created with) records the same
/// event: same principal, reason and source event. `revokedBefore` and `expiresAt` are not
/// compared, because a transmitter that signs a retry anew may change `iat`, from which they
/// derive. Otherwise the name's `jti` was used for a different event.
pub fn same_event(existing: &PrincipalRevocation, wanted: &PrincipalRevocation) -> bool {
    let (a, b) = (&existing.spec, &wanted.spec);
    a.issuer == b.issuer
        && a.subject == b.subject
        && a.tenant == b.tenant
        && a.client == b.client
        && a.reason == b.reason
        && a.source.kind == b.source.kind
        && a.source.event_type == b.source.event_type
        && a.source.issuer == b.source.issuer
        && a.source.jti == b.source.jti
}

/// `ssf-` + 20 hex digits of SHA-256(issuer ‖ 0 ‖ jti [‖ 0 ‖ index]).
pub fn object_name(issuer: &str, jti: &str, event_index: Option<usize>) -> String {
    let mut hash = Sha256::new();
    hash.update(issuer.as_bytes());
    hash.update([0]);
    hash.update(jti.as_bytes());
    if let Some(index) = event_index {
        hash.update([0]);
        hash.update(index.to_string().as_bytes());
    }
    let digest = hash.finalize();
    let hex = hex::encode(&digest[..10]);
    format!("ssf-{hex}")
}

#[cfg(test)]
#[path = "events_tests.rs"]
mod tests;
