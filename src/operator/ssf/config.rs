//! The `securityEvents` section of the operator configuration: which transmitters Lifeguard
//! trusts for security event tokens, how their SETs arrive, and how long the resulting
//! revocations live.
//!
//! Unknown keys are refused (serde names the key in its error), so a typo such as
//! `pollIntervall` never silently falls back to a default.
//!
//! # Endpoint rule
//!
//! `jwksUri` and `pollEndpoint` must be `https://` URLs. Plain `http://` is accepted only for a
//! loopback IP literal (`127.0.0.0/8` or `[::1]`): that is what in-process tests and a local
//! `kubectl port-forward` use, and nothing on the network can read or alter loopback traffic.
//! `localhost` is not accepted as a plain-HTTP host, because a name can resolve elsewhere.

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::api::PolicyDuration;
use crate::identity::KeySet;

// One key of one Secret in the operator's namespace; defined in `api`, shared with the webhook.
pub use crate::api::SecretKeyRef;

/// Default of `maxEventAge`: SETs issued longer ago are refused.
pub const DEFAULT_MAX_EVENT_AGE: Duration = Duration::from_secs(3600);
/// Default of `revocationTtl`: how long session-type revocations live.
pub const DEFAULT_REVOCATION_TTL: Duration = Duration::from_secs(24 * 3600);
/// Default of `pollInterval`.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(5);
/// Shortest `pollInterval` accepted, so a transmitter that answers at once is not hammered.
pub const MIN_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Longest `pollInterval` accepted: revocations must not wait longer than this to arrive.
pub const MAX_POLL_INTERVAL: Duration = Duration::from_secs(3600);

/// Default of `revocationBurst`: revocations a transmitter may create at once.
pub const DEFAULT_REVOCATION_BURST: u32 = 50;
/// Default of `revocationsPerMinute`: the sustained rate after a burst.
pub const DEFAULT_REVOCATIONS_PER_MINUTE: u32 = 300;
/// Default of `maxRevocations`: event-created revocations of one transmitter that may exist.
pub const DEFAULT_MAX_REVOCATIONS: u32 = 1000;
/// Largest `maxRevocations` accepted: every revocation is in every sidecar's snapshot.
pub const MAX_MAX_REVOCATIONS: u32 = 100_000;

/// `securityEvents`: the SSF/CAEP/RISC receiver of the operator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecurityEventsConfig {
    /// The receiver's own identifier: every SET's `aud` must contain it.
    pub audience: String,
    /// SETs whose `iat` is older than this are refused (default 1h).
    #[serde(default = "default_max_event_age")]
    pub max_event_age: PolicyDuration,
    /// `expiresAt` of session-type revocations is `revokedBefore` plus this (default 24h); it
    /// should exceed the longest token lifetime of the revoked issuers.
    #[serde(default = "default_revocation_ttl")]
    pub revocation_ttl: PolicyDuration,
    /// The transmitters whose SETs are accepted, one per issuer.
    #[serde(default)]
    pub transmitters: Vec<TransmitterConfig>,
}

fn default_max_event_age() -> PolicyDuration {
    DEFAULT_MAX_EVENT_AGE.into()
}

fn default_revocation_ttl() -> PolicyDuration {
    DEFAULT_REVOCATION_TTL.into()
}

/// One trusted SET transmitter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TransmitterConfig {
    /// The transmitter's `iss`, compared exactly.
    pub issuer: String,
    /// Where the transmitter publishes its signing keys (exactly one of `jwksUri` and `jwks`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_uri: Option<String>,
    /// The transmitter's signing keys, inline as a JWKS document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks: Option<serde_json::Value>,
    /// How SETs arrive.
    pub delivery: Delivery,
    /// Bearer token the transmitter presents on push (`Authorization: Bearer …`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push_authorization: Option<SecretKeyRef>,
    /// The transmitter's RFC 8936 poll endpoint (poll only, required there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_endpoint: Option<String>,
    /// Pause between polls that returned nothing (poll only, default 5s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_interval: Option<PolicyDuration>,
    /// Bearer token Lifeguard presents when polling (poll only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_authorization: Option<SecretKeyRef>,
    /// Whether this transmitter's RISC `account-enabled` events lift the `accountDisabled`
    /// revocations this same transmitter's events created. Default `false`: only people lift a
    /// revocation (by deleting it); the event is accepted, logged and does nothing. Never
    /// lifts another transmitter's or a person's revocation.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lift_revocations: bool,
    /// Revocations this transmitter may create at once (default 50); see
    /// `revocationsPerMinute`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revocation_burst: Option<u32>,
    /// Revocations this transmitter may create per minute after a burst (default 300). A SET
    /// over the limit is not recorded now: a push is answered `429` with `Retry-After`, a
    /// polled SET stays unacknowledged and is fetched again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revocations_per_minute: Option<u32>,
    /// Event-created revocations of this transmitter that may exist at once (default 1000),
    /// which bounds what its events add to every sidecar's snapshot. A SET that would exceed it
    /// is deferred (`429`, or left unacknowledged) and logged until revocations expire or are
    /// deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_revocations: Option<u32>,
}

impl TransmitterConfig {
    /// `revocationBurst`, or its default.
    pub fn revocation_burst(&self) -> u32 {
        self.revocation_burst.unwrap_or(DEFAULT_REVOCATION_BURST)
    }

    /// `revocationsPerMinute`, or its default.
    pub fn revocations_per_minute(&self) -> u32 {
        self.revocations_per_minute
            .unwrap_or(DEFAULT_REVOCATIONS_PER_MINUTE)
    }

    /// `maxRevocations`, or its default.
    pub fn max_revocations(&self) -> u32 {
        self.max_revocations.unwrap_or(DEFAULT_MAX_REVOCATIONS)
    }

    /// `pollInterval`, or its default.
    pub fn poll_interval(&self) -> Duration {
        self.poll_interval
            .as_ref()
            .map_or(DEFAULT_POLL_INTERVAL, PolicyDuration::get)
    }
}

/// SET delivery method.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Delivery {
    /// RFC 8935: the transmitter POSTs each SET to `/ssf/push`.
    Push,
    /// RFC 8936: Lifeguard polls the transmitter's endpoint.
    Poll,
}

impl Delivery {
    /// Bounded label for metrics.
    pub fn label(self) -> &'static str {
        match self {
            Self::Push => "push",
            Self::Poll => "poll",
        }
    }
}

/// Why a `securityEvents` section was refused; the message names the offending field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("securityEvents.{field}: {reason}")]
pub struct ConfigError {
    /// Path of the field below `securityEvents`, e.g. `transmitters[0].pollEndpoint`.
    pub field: String,
    pub reason: String,
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        reason: reason.into(),
    }
}

impl SecurityEventsConfig {
    /// Checks what serde cannot: required combinations, URLs, the inline key sets.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.audience.trim().is_empty() {
            return Err(invalid("audience", "must not be empty"));
        }
        if self.max_event_age.get().is_zero() {
            return Err(invalid("maxEventAge", "must be longer than 0s"));
        }
        if self.revocation_ttl.get().is_zero() {
            return Err(invalid("revocationTtl", "must be longer than 0s"));
        }
        let mut issuers = HashSet::new();
        for (index, transmitter) in self.transmitters.iter().enumerate() {
            let at = |key: &str| format!("transmitters[{index}].{key}");
            if transmitter.issuer.is_empty() {
                return Err(invalid(at("issuer"), "must not be empty"));
            }
            if !issuers.insert(transmitter.issuer.as_str()) {
                return Err(invalid(
                    at("issuer"),
                    format!("`{}` is listed twice", transmitter.issuer),
                ));
            }
            transmitter.validate_keys(&at)?;
            transmitter.validate_delivery(&at)?;
            transmitter.validate_limits(&at)?;
        }
        Ok(())
    }
}

impl TransmitterConfig {
    fn validate_keys(&self, at: &dyn Fn(&str) -> String) -> Result<(), ConfigError> {
        match (&self.jwks_uri, &self.jwks) {
            (Some(uri), None) => {
                check_endpoint(uri).map_err(|reason| invalid(at("jwksUri"), reason))
            }
            (None, Some(document)) => {
                let bytes =
                    serde_json::to_vec(document).map_err(|e| invalid(at("jwks"), e.to_string()))?;
                KeySet::from_jwks(&bytes)
                    .map(drop)
                    .map_err(|e| invalid(at("jwks"), e.to_string()))
            }
            (Some(_), Some(_)) => Err(invalid(
                at("jwksUri"),
                "set either jwksUri or jwks, not both",
            )),
            (None, None) => Err(invalid(at("jwksUri"), "one of jwksUri or jwks is required")),
        }
    }

    fn validate_delivery(&self, at: &dyn Fn(&str) -> String) -> Result<(), ConfigError> {
        match self.delivery {
            Delivery::Push => {
                let poll_only = [
                    ("pollEndpoint", self.poll_endpoint.is_some()),
                    ("pollInterval", self.poll_interval.is_some()),
                    ("pollAuthorization", self.poll_authorization.is_some()),
                ];
                if let Some((key, _)) = poll_only.iter().find(|(_, set)| *set) {
                    return Err(invalid(at(key), "only allowed with delivery: poll"));
                }
                if let Some(secret) = &self.push_authorization {
                    check_secret_ref(secret).map_err(|r| invalid(at("pushAuthorization"), r))?;
                }
            }
            Delivery::Poll => {
                if self.push_authorization.is_some() {
                    return Err(invalid(
                        at("pushAuthorization"),
                        "only allowed with delivery: push",
                    ));
                }
                let endpoint = self
                    .poll_endpoint
                    .as_deref()
                    .ok_or_else(|| invalid(at("pollEndpoint"), "required with delivery: poll"))?;
                check_endpoint(endpoint).map_err(|r| invalid(at("pollEndpoint"), r))?;
                let interval = self.poll_interval();
                if !(MIN_POLL_INTERVAL..=MAX_POLL_INTERVAL).contains(&interval) {
                    return Err(invalid(at("pollInterval"), "must be between 1s and 1h"));
                }
                if let Some(secret) = &self.poll_authorization {
                    check_secret_ref(secret).map_err(|r| invalid(at("pollAuthorization"), r))?;
                }
            }
        }
        Ok(())
    }
}

impl TransmitterConfig {
    fn validate_limits(&self, at: &dyn Fn(&str) -> String) -> Result<(), ConfigError> {
        let limits = [
            ("revocationBurst", self.revocation_burst, 10_000),
            ("revocationsPerMinute", self.revocations_per_minute, 60_000),
            ("maxRevocations", self.max_revocations, MAX_MAX_REVOCATIONS),
        ];
        for (key, value, most) in limits {
            if let Some(value) = value
                && !(1..=most).contains(&value)
            {
                return Err(invalid(at(key), format!("must be between 1 and {most}")));
            }
        }
        Ok(())
    }
}

fn check_secret_ref(secret: &SecretKeyRef) -> Result<(), String> {
    if secret.secret_name.is_empty() || secret.secret_name.len() > 253 {
        return Err("secretName must have 1 to 253 characters".into());
    }
    if secret.key.is_empty() || secret.key.len() > 253 {
        return Err("key must have 1 to 253 characters".into());
    }
    Ok(())
}

/// Applies the endpoint rule of the module documentation.
pub fn check_endpoint(text: &str) -> Result<(), String> {
    let url = url::Url::parse(text).map_err(|e| format!("`{text}` is not a URL: {e}"))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err("must not carry credentials; use the authorization secret".into());
    }
    match url.scheme() {
        "https" if url.host().is_some() => Ok(()),
        "http" if is_loopback_literal(&url) => Ok(()),
        "http" => Err("must use https (plain http only for 127.0.0.1 or [::1])".into()),
        other => Err(format!("scheme `{other}` is not allowed; use https")),
    }
}

fn is_loopback_literal(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip).is_loopback(),
        Some(url::Host::Ipv6(ip)) => IpAddr::V6(ip).is_loopback(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<SecurityEventsConfig, String> {
        let config: SecurityEventsConfig =
            serde_saphyr::from_str(yaml).map_err(|e| e.to_string())?;
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }

    const PUSH: &str = r#"
audience: https://lifeguard.example.com/ssf
transmitters:
  - issuer: https://idp.example.com
    jwksUri: https://idp.example.com/jwks
    delivery: push
    pushAuthorization: {secretName: idp-push, key: token}
"#;

    #[test]
    fn reads_a_push_transmitter_with_defaults() {
        let config = parse(PUSH).unwrap();
        assert_eq!(config.max_event_age.get(), DEFAULT_MAX_EVENT_AGE);
        assert_eq!(config.revocation_ttl.get(), DEFAULT_REVOCATION_TTL);
        let t = &config.transmitters[0];
        assert_eq!(t.delivery, Delivery::Push);
        // Safe defaults: events never lift revocations; creation is rate-limited and bounded.
        assert!(!t.lift_revocations);
        assert_eq!(t.revocation_burst(), DEFAULT_REVOCATION_BURST);
        assert_eq!(t.revocations_per_minute(), DEFAULT_REVOCATIONS_PER_MINUTE);
        assert_eq!(t.max_revocations(), DEFAULT_MAX_REVOCATIONS);
        assert_eq!(
            t.push_authorization,
            Some(SecretKeyRef {
                secret_name: "idp-push".into(),
                key: "token".into()
            })
        );
    }

    #[test]
    fn reads_a_poll_transmitter_with_inline_keys() {
        let config = parse(
            r#"
audience: https://lifeguard.example.com/ssf
maxEventAge: 30m
revocationTtl: 12h
transmitters:
  - issuer: https://idp.example.com
    jwks: {keys: [{kty: OKP, crv: Ed25519, x: gx0PmfOoO1_4CAgiq26JMdpruH3ZfWOoI6Nfs-ZCkhI, kid: k1}]}
    delivery: poll
    pollEndpoint: http://127.0.0.1:8080/poll
    pollInterval: 10s
    pollAuthorization: {secretName: idp-poll, key: token}
"#,
        )
        .unwrap();
        assert_eq!(config.max_event_age.get(), Duration::from_secs(1800));
        assert_eq!(config.revocation_ttl.get(), Duration::from_secs(12 * 3600));
        assert_eq!(
            config.transmitters[0].poll_interval(),
            Duration::from_secs(10)
        );
    }

    #[test]
    fn unknown_keys_are_named() {
        let error = parse(&PUSH.replace("delivery: push", "delivery: push\n    pollIntervall: 5s"))
            .unwrap_err();
        assert!(error.contains("pollIntervall"), "{error}");
        let error = parse(&format!("{PUSH}extra: 1\n")).unwrap_err();
        assert!(error.contains("extra"), "{error}");
    }

    #[test]
    fn refuses_invalid_combinations() {
        let cases = [
            (
                PUSH.replace("delivery: push", "delivery: push\n    pollInterval: 5s"),
                "transmitters[0].pollInterval: only allowed with delivery: poll",
            ),
            (
                PUSH.replace("delivery: push", "delivery: poll"),
                "transmitters[0].pushAuthorization: only allowed with delivery: push",
            ),
            (
                PUSH.replace(
                    "delivery: push\n    pushAuthorization: {secretName: idp-push, key: token}",
                    "delivery: poll",
                ),
                "transmitters[0].pollEndpoint: required with delivery: poll",
            ),
            (
                PUSH.replace(
                    "https://idp.example.com/jwks",
                    "http://idp.example.com/jwks",
                ),
                "transmitters[0].jwksUri: must use https",
            ),
            (
                PUSH.replace("https://idp.example.com/jwks", "http://localhost/jwks"),
                "transmitters[0].jwksUri: must use https",
            ),
            (
                PUSH.replace("jwksUri: https://idp.example.com/jwks", "jwks: {keys: []}"),
                "transmitters[0].jwks: the key set contains no usable signature key",
            ),
            (
                PUSH.replace(
                    "    delivery: push",
                    "    jwks: {keys: []}\n    delivery: push",
                ),
                "transmitters[0].jwksUri: set either jwksUri or jwks, not both",
            ),
            (
                PUSH.replace("    jwksUri: https://idp.example.com/jwks\n", ""),
                "transmitters[0].jwksUri: one of jwksUri or jwks is required",
            ),
            (
                PUSH.replace("delivery: push", "delivery: push\n    revocationBurst: 0"),
                "transmitters[0].revocationBurst: must be between 1 and 10000",
            ),
            (
                PUSH.replace(
                    "delivery: push",
                    "delivery: push\n    maxRevocations: 100001",
                ),
                "transmitters[0].maxRevocations: must be between 1 and 100000",
            ),
            (
                PUSH.replace(
                    "audience: https://lifeguard.example.com/ssf",
                    "audience: ''",
                ),
                "securityEvents.audience: must not be empty",
            ),
            (
                format!("{PUSH}{}", &PUSH[PUSH.find("  - issuer").unwrap_or(0)..]),
                "is listed twice",
            ),
        ];
        for (yaml, expected) in cases {
            let error = parse(&yaml).unwrap_err();
            assert!(
                error.contains(expected),
                "{error} should contain {expected}"
            );
        }
    }

    #[test]
    fn poll_interval_is_bounded() {
        let yaml = r#"
audience: a
transmitters:
  - {issuer: i, jwksUri: "https://i/jwks", delivery: poll, pollEndpoint: "https://i/poll", pollInterval: 100ms}
"#;
        assert!(parse(yaml).unwrap_err().contains("between 1s and 1h"));
    }

    #[test]
    fn endpoint_rule() {
        assert!(check_endpoint("https://idp.example.com/poll").is_ok());
        assert!(check_endpoint("http://127.0.0.1:9000/poll").is_ok());
        assert!(check_endpoint("http://[::1]:9000/poll").is_ok());
        assert!(check_endpoint("http://10.0.0.1/poll").is_err());
        assert!(check_endpoint("https://user:pw@idp.example.com/").is_err());
        assert!(check_endpoint("ftp://idp.example.com/").is_err());
        assert!(check_endpoint("not a url").is_err());
    }
}
