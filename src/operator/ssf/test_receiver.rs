//! A receiver over the test fixtures, with a sink that records calls and can be told to fail.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::config::{SecretKeyRef, SecurityEventsConfig};
use super::events::RevocationAction;
use super::receiver::{RevocationSink, SinkError, SsfReceiver};
use super::secrets::test_support::MapSecrets;
use super::set::VerifiedSet;
use super::test_support::{AUD, ISS, JWKS, NOW};

/// Records every `apply`; fails while `failing` is set.
#[derive(Default)]
pub struct RecordingSink {
    pub calls: Mutex<Vec<(String, Vec<RevocationAction>)>>,
    pub failing: AtomicBool,
}

impl RecordingSink {
    pub fn jtis(&self) -> Vec<String> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .map(|(jti, _)| jti.clone())
            .collect()
    }

    pub fn fail(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }
}

#[async_trait]
impl RevocationSink for RecordingSink {
    async fn apply(
        &self,
        set: &VerifiedSet,
        actions: &[RevocationAction],
    ) -> Result<(), SinkError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(SinkError::Unavailable(
                "the API server is unavailable".into(),
            ));
        }
        self.calls
            .lock()
            .unwrap()
            .push((set.jti.clone(), actions.to_vec()));
        Ok(())
    }
}

pub fn push_secret() -> SecretKeyRef {
    SecretKeyRef {
        secret_name: "idp-push".into(),
        key: "token".into(),
    }
}

pub const PUSH_TOKEN: &str = "push-token-123";

/// The `securityEvents` section of the tests: the fixture issuer with inline keys, delivering
/// as `delivery` (`push` with a bearer, or `poll` from `poll_endpoint`).
pub fn config(delivery: &str, poll_endpoint: &str) -> SecurityEventsConfig {
    let jwks: serde_json::Value = serde_json::from_slice(JWKS).unwrap();
    let mut transmitter = serde_json::json!({"issuer": ISS, "jwks": jwks, "delivery": delivery});
    if delivery == "push" {
        transmitter["pushAuthorization"] =
            serde_json::json!({"secretName": "idp-push", "key": "token"});
    } else {
        transmitter["pollEndpoint"] = poll_endpoint.into();
        transmitter["pollAuthorization"] =
            serde_json::json!({"secretName": "idp-poll", "key": "token"});
    }
    serde_json::from_value(serde_json::json!({"audience": AUD, "transmitters": [transmitter]}))
        .unwrap()
}

/// A receiver for `config` at the tests' fixed time, with its sink and secrets.
pub fn receiver(
    config: &SecurityEventsConfig,
) -> (Arc<SsfReceiver>, Arc<RecordingSink>, Arc<MapSecrets>) {
    let sink = Arc::new(RecordingSink::default());
    let secrets = Arc::new(MapSecrets::with(&push_secret(), PUSH_TOKEN));
    secrets.set(
        &SecretKeyRef {
            secret_name: "idp-poll".into(),
            key: "token".into(),
        },
        "poll-token-456",
    );
    let receiver = SsfReceiver::new(config, secrets.clone(), sink.clone())
        .unwrap()
        .with_clock(Arc::new(|| NOW));
    (Arc::new(receiver), sink, secrets)
}
