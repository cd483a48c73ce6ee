//! RFC 8936 poll delivery: one [`PollClient`] per poll transmitter.
//!
//! Each request carries the acknowledgements and errors of the previous batch:
//! `{"ack": [...], "setErrs": {jti: {"err", "description"}}, "maxEvents": 100,
//! "returnImmediately": false}`. A jti is acknowledged only once the sink recorded its SET
//! (or it was a duplicate); a refused SET goes into `setErrs` and is not retried; a deferred
//! SET (sink or keys unavailable) is neither, so the transmitter delivers it again.
//!
//! Pacing works with both kinds of transmitter:
//! - one that **answers at once**: after an empty answer the client waits until
//!   `pollInterval` has passed since the request started;
//! - one that **long-polls** (holds the request until events come): a held request already
//!   took `pollInterval` or longer, so the next one starts at once. The request timeout
//!   ([`LONG_POLL_ALLOWANCE`] + `pollInterval`) stays above any reasonable hold.
//!
//! After a batch with SETs, or `moreAvailable`, the next request starts at once, which
//! delivers the acknowledgements promptly. When the sink failed, the acknowledgements that
//! are due are sent at once in a request for no events, then the client backs off (at least as
//! long as the transmitter's revocation rate limit asks: over-limit SETs simply wait at the
//! transmitter, unacknowledged). Transport
//! errors back off exponentially with jitter. The client stops when its cancellation token
//! fires; acknowledgements not yet sent then are lost, which only causes a redelivery that
//! the hash-named objects make harmless.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::identity::store::key_fetch_client;

use super::config::{ConfigError, SecretKeyRef, TransmitterConfig};
use super::receiver::{Deferral, Outcome, SsfReceiver, Via};

/// Events asked for per request.
pub const MAX_EVENTS: u32 = 100;
/// What the request timeout allows for a long-polling transmitter's hold, on top of
/// `pollInterval`.
pub const LONG_POLL_ALLOWANCE: Duration = Duration::from_secs(60);
/// Largest poll response read (100 SETs of up to 64 KiB, plus framing).
pub const MAX_RESPONSE_BYTES: usize = 8 * 1024 * 1024;

/// Timing of one poll client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PollSettings {
    /// Least time from one request's start to the next when nothing came.
    pub interval: Duration,
    /// Timeout of one request.
    pub request_timeout: Duration,
    /// First pause after a failure; doubled per further failure up to `max_backoff`.
    pub min_backoff: Duration,
    pub max_backoff: Duration,
    pub max_events: u32,
}

impl PollSettings {
    /// The settings for a configured transmitter.
    pub fn for_transmitter(transmitter: &TransmitterConfig) -> Self {
        let interval = transmitter.poll_interval();
        Self {
            interval,
            request_timeout: LONG_POLL_ALLOWANCE + interval,
            min_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
            max_events: MAX_EVENTS,
        }
    }

    /// The pause after `failures` consecutive failures (≥ 1): exponential, with the upper
    /// half jittered so many receivers do not retry in step.
    fn backoff(&self, failures: u32) -> Duration {
        let exponent = failures.saturating_sub(1).min(16);
        let base = self
            .min_backoff
            .saturating_mul(1 << exponent)
            .min(self.max_backoff);
        let mut random = [0u8; 2];
        let fraction = match getrandom::fill(&mut random) {
            Ok(()) => f64::from(u16::from_le_bytes(random)) / f64::from(u16::MAX),
            Err(_) => 1.0,
        };
        base.mul_f64(0.5 + fraction / 2.0)
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PollRequest<'a> {
    ack: &'a [String],
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    set_errs: &'a BTreeMap<String, SetErr>,
    max_events: u32,
    return_immediately: bool,
}

#[derive(Clone, Debug, Serialize)]
struct SetErr {
    err: &'static str,
    description: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PollResponse {
    #[serde(default)]
    sets: BTreeMap<String, String>,
    #[serde(default)]
    more_available: bool,
}

/// Why one poll request failed.
#[derive(Debug, thiserror::Error)]
enum PollError {
    #[error("cannot read the poll authorization secret: {0}")]
    Secret(String),
    #[error("request failed: {0}")]
    Transport(String),
    #[error("the transmitter answered HTTP {0}")]
    Status(u16),
    #[error("the answer is not a poll response: {0}")]
    Response(String),
}

/// What one exchange brought.
struct Batch {
    received: usize,
    deferred: usize,
    more_available: bool,
    /// The longest wait a rate-limited SET of the batch asked for.
    wait: Duration,
}

/// Polls one transmitter until cancelled.
pub struct PollClient {
    receiver: Arc<SsfReceiver>,
    issuer: String,
    endpoint: String,
    authorization: Option<SecretKeyRef>,
    settings: PollSettings,
    http: reqwest::Client,
    acks: Vec<String>,
    errors: BTreeMap<String, SetErr>,
}

impl PollClient {
    /// A client for a configured poll transmitter.
    pub fn new(
        receiver: Arc<SsfReceiver>,
        transmitter: &TransmitterConfig,
    ) -> Result<Self, ConfigError> {
        let endpoint = transmitter
            .poll_endpoint
            .clone()
            .ok_or_else(|| ConfigError {
                field: "transmitters[].pollEndpoint".into(),
                reason: format!("{} has no poll endpoint", transmitter.issuer),
            })?;
        Ok(Self {
            receiver,
            issuer: transmitter.issuer.clone(),
            endpoint,
            authorization: transmitter.poll_authorization.clone(),
            settings: PollSettings::for_transmitter(transmitter),
            http: key_fetch_client(),
            acks: Vec::new(),
            errors: BTreeMap::new(),
        })
    }

    /// Replaces the timing (tests use short intervals).
    pub fn with_settings(mut self, settings: PollSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Runs [`PollClient::run`] on a task.
    pub fn spawn(self, shutdown: CancellationToken) -> JoinHandle<()> {
        tokio::spawn(self.run(shutdown))
    }

    /// Polls until `shutdown` fires.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut transport_failures = 0u32;
        let mut sink_failures = 0u32;
        loop {
            let started = Instant::now();
            let exchanged = tokio::select! {
                _ = shutdown.cancelled() => return,
                exchanged = self.exchange(self.settings.max_events, false) => exchanged,
            };
            let pause = match exchanged {
                Err(error) => {
                    transport_failures = transport_failures.saturating_add(1);
                    tracing::warn!(issuer = %self.issuer, %error, "polling for security events failed");
                    self.settings.backoff(transport_failures)
                }
                Ok(batch) if batch.deferred > 0 => {
                    transport_failures = 0;
                    sink_failures = sink_failures.saturating_add(1);
                    if !self.acks.is_empty() || !self.errors.is_empty() {
                        let acknowledged = tokio::select! {
                            _ = shutdown.cancelled() => return,
                            acknowledged = self.exchange(0, true) => acknowledged,
                        };
                        if let Err(error) = acknowledged {
                            tracing::debug!(issuer = %self.issuer, %error, "sending acknowledgements failed");
                        }
                    }
                    self.settings.backoff(sink_failures).max(batch.wait)
                }
                Ok(batch) => {
                    transport_failures = 0;
                    sink_failures = 0;
                    if batch.received > 0 || batch.more_available {
                        Duration::ZERO
                    } else {
                        self.settings.interval.saturating_sub(started.elapsed())
                    }
                }
            };
            if !pause.is_zero() {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(pause) => {}
                }
            }
        }
    }

    /// One request: sends the pending acknowledgements and errors, processes the SETs that
    /// come back. Pending acknowledgements are kept when the request fails in transit.
    async fn exchange(
        &mut self,
        max_events: u32,
        return_immediately: bool,
    ) -> Result<Batch, PollError> {
        let body = PollRequest {
            ack: &self.acks,
            set_errs: &self.errors,
            max_events,
            return_immediately,
        };
        let mut request = self
            .http
            .post(&self.endpoint)
            .timeout(self.settings.request_timeout)
            .json(&body);
        if let Some(secret) = &self.authorization {
            let token = self
                .receiver
                .secrets()
                .get(secret)
                .await
                .map_err(|e| PollError::Secret(e.to_string()))?
                .ok_or_else(|| {
                    PollError::Secret(format!("{} does not exist", secret.secret_name))
                })?;
            request = request.bearer_auth(&*token);
        }
        let mut response = request
            .send()
            .await
            .map_err(|e| PollError::Transport(e.to_string()))?;
        let status = response.status();
        if status == reqwest::StatusCode::BAD_REQUEST {
            // The transmitter refused the request itself; sending the same acknowledgements
            // again would be refused again. Unacknowledged SETs are simply redelivered.
            self.acks.clear();
            self.errors.clear();
        }
        if !status.is_success() {
            return Err(PollError::Status(status.as_u16()));
        }
        self.acks.clear();
        self.errors.clear();
        let mut bytes = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| PollError::Transport(e.to_string()))?
        {
            if bytes.len() + chunk.len() > MAX_RESPONSE_BYTES {
                return Err(PollError::Response(format!(
                    "larger than {MAX_RESPONSE_BYTES} bytes"
                )));
            }
            bytes.extend_from_slice(&chunk);
        }
        let answer: PollResponse =
            serde_json::from_slice(&bytes).map_err(|e| PollError::Response(e.to_string()))?;
        Ok(self.process(answer).await)
    }

    async fn process(&mut self, answer: PollResponse) -> Batch {
        let mut batch = Batch {
            received: answer.sets.len(),
            deferred: 0,
            more_available: answer.more_available,
            wait: Duration::ZERO,
        };
        for (jti, compact) in answer.sets {
            match self
                .receiver
                .receive(&compact, Via::Poll(&self.issuer))
                .await
            {
                Outcome::Accepted { jti: set_jti } | Outcome::Duplicate { jti: set_jti } => {
                    if set_jti != jti {
                        tracing::warn!(issuer = %self.issuer, "a polled SET is keyed by another jti than its own");
                    }
                    self.acks.push(jti);
                }
                Outcome::Refused(error) => {
                    let refusal = SetErr {
                        err: error.err_code(),
                        description: error.description(),
                    };
                    self.errors.insert(jti, refusal);
                }
                Outcome::Deferred(deferral) => {
                    batch.deferred += 1;
                    if let Deferral::RateLimited(wait) = deferral {
                        batch.wait = batch.wait.max(wait);
                    }
                }
            }
        }
        batch
    }
}

/// Starts one [`PollClient`] per poll transmitter of `receiver`.
pub fn spawn_poll_clients(
    receiver: &Arc<SsfReceiver>,
    shutdown: &CancellationToken,
) -> Result<Vec<JoinHandle<()>>, ConfigError> {
    receiver
        .poll_transmitters()
        .iter()
        .map(|transmitter| {
            PollClient::new(receiver.clone(), transmitter).map(|c| c.spawn(shutdown.clone()))
        })
        .collect()
}

#[cfg(test)]
#[path = "poll_tests.rs"]
mod tests;
