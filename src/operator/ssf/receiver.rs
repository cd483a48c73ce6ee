//! The receiver both delivery methods share: verify a SET against its transmitter's keys, map
//! it to revocation actions, hand them to the [`RevocationSink`], remember what was accepted.
//!
//! Between mapping and the sink, a transmitter's own limits apply: a `jti` reused for another
//! event is refused; `account-enabled` lifts only with `liftRevocations`; creating revocations
//! costs tokens of the transmitter's bucket ([`super::rate`]) and may not take the number of
//! its revocations beyond `maxRevocations`. Over a limit the SET is deferred, never dropped:
//! the transmitter delivers it again later.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::identity::KeySet;
use crate::identity::store::{KeyStore, REFRESH_INTERVAL, ResolvedSource, key_fetch_client};

use super::accepted::{AcceptedIds, DEFAULT_CAPACITY, Seen, fingerprint};
use super::config::{ConfigError, Delivery, SecurityEventsConfig, TransmitterConfig};
use super::events::{RevocationAction, actions_for};
use super::metrics::SsfMetrics;
use super::rate::TokenBucket;
use super::secrets::{SecretCache, SecretReader};
use super::set::{
    SetError, SetRules, VerifiedSet, excerpt, parse_header, unverified_issuer, verify_set,
};

/// Why the cluster could not record a SET's actions.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SinkError {
    /// Not now (the API server failed or refused): the SET is delivered again.
    #[error("{0}")]
    Unavailable(String),
    /// An object the SET maps to exists with another principal, reason or event: the SET's
    /// `jti` was used before for a different event. The SET is refused.
    #[error("{0}")]
    Conflict(String),
}

/// Where the receiver's actions go. The operator implements it with kube: create each
/// PrincipalRevocation (AlreadyExists counts as success, the name encodes the SET), delete the
/// account-disabled revocations an `account-enabled` event lifts.
///
/// `apply` is called for every accepted SET, also when `actions` is empty (verification
/// events, audit-only credential changes), so the implementation can record the event.
/// Return `Ok` only once the actions are durably recorded: the transmitter is then told to
/// stop delivering the SET.
#[async_trait]
pub trait RevocationSink: Send + Sync {
    async fn apply(&self, set: &VerifiedSet, actions: &[RevocationAction])
    -> Result<(), SinkError>;

    /// The names of the revocations that exist and that events of `transmitter` created
    /// ([`super::events::created_by`]), to hold it to `maxRevocations`. The default knows
    /// none (a sink with no store to ask).
    async fn created_by(&self, transmitter: &str) -> Result<HashSet<String>, SinkError> {
        let _ = transmitter;
        Ok(HashSet::new())
    }
}

/// What became of one SET.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Verified and recorded by the sink.
    Accepted { jti: String },
    /// Verified, and accepted before: nothing was done again.
    Duplicate { jti: String },
    /// Refused for good; the transmitter is told why and must not send it again.
    Refused(SetError),
    /// Not processed now through no fault of the SET; the transmitter delivers it again.
    Deferred(Deferral),
}

/// Why a SET was deferred.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Deferral {
    #[error("the transmitter's keys are not available")]
    KeysUnavailable,
    #[error("the revocation could not be recorded: {0}")]
    Sink(SinkError),
    /// The transmitter created revocations faster than `revocationsPerMinute` allows.
    #[error("the transmitter is creating revocations too fast; retry in {}s", .0.as_secs().max(1))]
    RateLimited(Duration),
    /// The transmitter's revocations would exceed `maxRevocations`.
    #[error(
        "the transmitter already has {existing} revocations and this SET would create {new} more; its limit (maxRevocations) is {limit}"
    )]
    LimitReached {
        existing: usize,
        new: usize,
        limit: u32,
    },
}

impl Outcome {
    /// `(result, err)` labels of the `ssf_sets_received_total` metric.
    pub fn labels(&self) -> (&'static str, &'static str) {
        match self {
            Self::Accepted { .. } => ("accepted", "none"),
            Self::Duplicate { .. } => ("duplicate", "none"),
            Self::Refused(error) => ("refused", error.err_code()),
            Self::Deferred(Deferral::KeysUnavailable) => ("deferred", "keys_unavailable"),
            Self::Deferred(Deferral::Sink(_)) => ("deferred", "sink_failed"),
            Self::Deferred(Deferral::RateLimited(_)) => ("deferred", "rate_limited"),
            Self::Deferred(Deferral::LimitReached { .. }) => ("deferred", "revocation_limit"),
        }
    }
}

/// How a SET reached the receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via<'a> {
    /// Pushed to `/ssf/push`; its transmitter must be configured for push.
    Push,
    /// Returned by polling this transmitter; the SET must be that transmitter's.
    Poll(&'a str),
}

enum TransmitterKeys {
    Inline(Arc<KeySet>),
    Remote(Arc<KeyStore>),
}

struct Transmitter {
    config: TransmitterConfig,
    keys: TransmitterKeys,
    bucket: TokenBucket,
    /// Held from counting the transmitter's revocations until its new ones are created, so
    /// concurrent SETs cannot together exceed `maxRevocations`.
    creating: tokio::sync::Mutex<()>,
}

/// Unix seconds now; replaceable for tests.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

fn system_clock() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// The security-event receiver: one per operator process, shared by the push endpoint and the
/// poll clients.
pub struct SsfReceiver {
    audience: String,
    max_event_age: Duration,
    revocation_ttl: Duration,
    transmitters: HashMap<String, Transmitter>,
    secrets: SecretCache,
    sink: Arc<dyn RevocationSink>,
    accepted: AcceptedIds,
    metrics: SsfMetrics,
    clock: Clock,
}

impl SsfReceiver {
    /// A receiver for a `securityEvents` section (validated here). Remote key sets load on
    /// first use, or at once with [`SsfReceiver::spawn_key_refresh`].
    pub fn new(
        config: &SecurityEventsConfig,
        secrets: Arc<dyn SecretReader>,
        sink: Arc<dyn RevocationSink>,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        let http = key_fetch_client();
        let mut transmitters = HashMap::new();
        for (index, transmitter) in config.transmitters.iter().enumerate() {
            let keys = match (&transmitter.jwks_uri, &transmitter.jwks) {
                (Some(uri), _) => TransmitterKeys::Remote(Arc::new(KeyStore::new(
                    ResolvedSource::Uri(uri.clone()),
                    http.clone(),
                ))),
                (None, document) => {
                    // `validate` made sure the document is present and parses.
                    let keys = serde_json::to_vec(document)
                        .map_err(|e| e.to_string())
                        .and_then(|bytes| KeySet::from_jwks(&bytes).map_err(|e| e.to_string()))
                        .map_err(|reason| ConfigError {
                            field: format!("transmitters[{index}].jwks"),
                            reason,
                        })?;
                    TransmitterKeys::Inline(Arc::new(keys))
                }
            };
            transmitters.insert(
                transmitter.issuer.clone(),
                Transmitter {
                    config: transmitter.clone(),
                    keys,
                    bucket: TokenBucket::new(
                        transmitter.revocation_burst(),
                        transmitter.revocations_per_minute(),
                        Instant::now(),
                    ),
                    creating: tokio::sync::Mutex::new(()),
                },
            );
        }
        Ok(Self {
            audience: config.audience.clone(),
            max_event_age: config.max_event_age.get(),
            revocation_ttl: config.revocation_ttl.get(),
            transmitters,
            secrets: SecretCache::new(secrets),
            sink,
            accepted: AcceptedIds::new(DEFAULT_CAPACITY),
            metrics: SsfMetrics::default(),
            clock: Arc::new(system_clock),
        })
    }

    /// Replaces the clock (Unix seconds) used for `iat` checks.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    pub fn metrics(&self) -> &SsfMetrics {
        &self.metrics
    }

    pub(super) fn secrets(&self) -> &SecretCache {
        &self.secrets
    }

    /// The configuration of the transmitter with this issuer.
    pub fn transmitter(&self, issuer: &str) -> Option<&TransmitterConfig> {
        self.transmitters.get(issuer).map(|t| &t.config)
    }

    /// The transmitters that push, each with its `pushAuthorization` (if any).
    pub fn push_transmitters(&self) -> impl Iterator<Item = &TransmitterConfig> {
        self.transmitters
            .values()
            .map(|t| &t.config)
            .filter(|t| t.delivery == Delivery::Push)
    }

    /// The transmitters Lifeguard polls (one poll client each).
    pub fn poll_transmitters(&self) -> Vec<TransmitterConfig> {
        self.transmitters
            .values()
            .filter(|t| t.config.delivery == Delivery::Poll)
            .map(|t| t.config.clone())
            .collect()
    }

    /// Loads every remote key set now, then again every [`REFRESH_INTERVAL`] until `shutdown`.
    /// A failed load keeps the previous keys (and is retried on the next unknown `kid`).
    pub fn spawn_key_refresh(self: &Arc<Self>, shutdown: CancellationToken) {
        let receiver = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let Some(this) = receiver.upgrade() else {
                    return;
                };
                this.refresh_keys().await;
                drop(this);
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(REFRESH_INTERVAL) => {}
                }
            }
        });
    }

    /// Loads every remote key set now.
    pub async fn refresh_keys(&self) {
        for (issuer, transmitter) in &self.transmitters {
            if let TransmitterKeys::Remote(store) = &transmitter.keys
                && let Err(error) = store.refresh().await
            {
                tracing::warn!(%issuer, %error, "cannot load the transmitter's keys");
            }
        }
    }

    /// Verifies a compact SET, applies it through the sink unless it was accepted before, and
    /// counts the outcome.
    pub async fn receive(&self, compact: &str, via: Via<'_>) -> Outcome {
        let outcome = self.process(compact, via).await;
        let delivery = match via {
            Via::Push => Delivery::Push,
            Via::Poll(_) => Delivery::Poll,
        };
        let (result, err) = outcome.labels();
        self.metrics.count(delivery.label(), result, err);
        match &outcome {
            Outcome::Refused(error) => {
                tracing::info!(delivery = delivery.label(), err = error.err_code(), %error, "security event refused");
            }
            Outcome::Deferred(reason) => {
                tracing::warn!(delivery = delivery.label(), %reason, "security event deferred");
            }
            Outcome::Accepted { .. } | Outcome::Duplicate { .. } => {}
        }
        outcome
    }

    async fn process(&self, compact: &str, via: Via<'_>) -> Outcome {
        let transmitter = match self.transmitter_for(compact, via) {
            Ok(transmitter) => transmitter,
            Err(error) => return Outcome::Refused(error),
        };
        let set = match self.verify(compact, transmitter).await {
            Ok(set) => set,
            Err(outcome) => return outcome,
        };
        let actions = match actions_for(&set, self.revocation_ttl) {
            Ok(actions) => actions,
            Err(error) => return Outcome::Refused(error),
        };
        let content = fingerprint(&set);
        match self.accepted.seen(&set.issuer, &set.jti, &content) {
            Seen::New => {}
            Seen::Same => return Outcome::Duplicate { jti: set.jti },
            Seen::Different => return Outcome::Refused(SetError::JtiReused(excerpt(&set.jti))),
        }
        let actions = permitted(&transmitter.config, &set, actions);
        let creating = match self.admit_creations(transmitter, &actions).await {
            Ok(guard) => guard,
            Err(deferral) => return Outcome::Deferred(deferral),
        };
        match self.sink.apply(&set, &actions).await {
            Ok(()) => {}
            Err(SinkError::Conflict(reason)) => {
                tracing::warn!(issuer = %set.issuer, jti = %excerpt(&set.jti), %reason, "a SET reuses the jti of a different event; refused");
                return Outcome::Refused(SetError::JtiReused(excerpt(&set.jti)));
            }
            Err(error) => return Outcome::Deferred(Deferral::Sink(error)),
        }
        drop(creating);
        self.accepted.insert(&set.issuer, &set.jti, content);
        tracing::info!(
            issuer = %set.issuer,
            jti = %set.jti,
            events = ?set.events.iter().map(|(uri, _)| uri.as_str()).collect::<Vec<_>>(),
            actions = actions.len(),
            "security event accepted"
        );
        Outcome::Accepted { jti: set.jti }
    }

    /// Holds a SET that creates revocations to its transmitter's rate and `maxRevocations`.
    /// Returns the guard to keep until the revocations are created.
    async fn admit_creations<'t>(
        &self,
        transmitter: &'t Transmitter,
        actions: &[RevocationAction],
    ) -> Result<Option<tokio::sync::MutexGuard<'t, ()>>, Deferral> {
        let names: Vec<&str> = actions
            .iter()
            .filter_map(|action| match action {
                RevocationAction::Create(r) => r.metadata.name.as_deref(),
                RevocationAction::RemoveAccountDisabled { .. } => None,
            })
            .collect();
        if names.is_empty() {
            return Ok(None);
        }
        let cost = u32::try_from(names.len()).unwrap_or(u32::MAX);
        transmitter
            .bucket
            .take(cost, Instant::now())
            .map_err(Deferral::RateLimited)?;
        let guard = transmitter.creating.lock().await;
        let existing = self
            .sink
            .created_by(&transmitter.config.issuer)
            .await
            .map_err(Deferral::Sink)?;
        let new = names.iter().filter(|n| !existing.contains(**n)).count();
        let limit = transmitter.config.max_revocations();
        if new > 0 && existing.len() + new > limit as usize {
            tracing::error!(
                issuer = %transmitter.config.issuer,
                existing = existing.len(),
                new,
                limit,
                "the transmitter reached maxRevocations: its revocation-creating SETs wait until revocations expire or are deleted"
            );
            return Err(Deferral::LimitReached {
                existing: existing.len(),
                new,
                limit,
            });
        }
        Ok(Some(guard))
    }

    /// The transmitter a SET claims to come from, checked against how it arrived.
    fn transmitter_for(&self, compact: &str, via: Via<'_>) -> Result<&Transmitter, SetError> {
        parse_header(compact)?;
        let issuer = unverified_issuer(compact)?;
        let transmitter = self
            .transmitters
            .get(&issuer)
            .ok_or_else(|| SetError::UnknownIssuer(excerpt(&issuer)))?;
        match via {
            Via::Push if transmitter.config.delivery != Delivery::Push => {
                Err(SetError::WrongDelivery(issuer))
            }
            Via::Poll(polled) if polled != issuer => Err(SetError::UnknownIssuer(excerpt(&issuer))),
            _ => Ok(transmitter),
        }
    }

    async fn verify(
        &self,
        compact: &str,
        transmitter: &Transmitter,
    ) -> Result<VerifiedSet, Outcome> {
        let rules = SetRules {
            issuer: &transmitter.config.issuer,
            audience: &self.audience,
            max_event_age: self.max_event_age,
        };
        let now = (self.clock)();
        let store = match &transmitter.keys {
            TransmitterKeys::Inline(keys) => {
                return verify_set(compact, &rules, keys, now).map_err(Outcome::Refused);
            }
            TransmitterKeys::Remote(store) => store,
        };
        let keys = match store.current() {
            Some(keys) => keys,
            None => {
                store.refresh_for_unknown_key().await;
                store
                    .current()
                    .ok_or(Outcome::Deferred(Deferral::KeysUnavailable))?
            }
        };
        match verify_set(compact, &rules, &keys, now) {
            // Rate limited per transmitter: a fetch at most every MIN_REFETCH_INTERVAL.
            Err(SetError::UnknownKey(_)) if store.refresh_for_unknown_key().await => {
                let keys = store
                    .current()
                    .ok_or(Outcome::Deferred(Deferral::KeysUnavailable))?;
                verify_set(compact, &rules, &keys, now).map_err(Outcome::Refused)
            }
            other => other.map_err(Outcome::Refused),
        }
    }
}

/// `actions` without the lifts a transmitter may not make: without `liftRevocations` an
/// `account-enabled` event is accepted for the record and lifts nothing.
fn permitted(
    transmitter: &TransmitterConfig,
    set: &VerifiedSet,
    actions: Vec<RevocationAction>,
) -> Vec<RevocationAction> {
    if transmitter.lift_revocations {
        return actions;
    }
    let before = actions.len();
    let kept: Vec<_> = actions
        .into_iter()
        .filter(|a| !matches!(a, RevocationAction::RemoveAccountDisabled { .. }))
        .collect();
    if kept.len() < before {
        tracing::info!(
            issuer = %set.issuer,
            jti = %excerpt(&set.jti),
            "account-enabled accepted without lifting anything: the transmitter does not have liftRevocations; a person lifts the revocation by deleting it"
        );
    }
    kept
}

#[cfg(test)]
#[path = "receiver_tests.rs"]
mod tests;
