//! The security-event receiver's two ports into the cluster: PrincipalRevocations are created
//! (and lifted) through the API server, and transmitter credentials are read from Secrets in
//! the operator's namespace.

use std::collections::HashSet;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use tracing::Instrument;

use crate::api::{PrincipalRevocation, RevocationReason};
use crate::telemetry::revocation_spans;

use super::revocation_traces::{TRACEPARENT_ANNOTATION, reason_label};
use super::ssf::events::{SOURCE_LABEL, SOURCE_LABEL_VALUE, created_by, same_event};
use super::ssf::{
    RevocationAction, RevocationSink, SecretError, SecretKeyRef, SecretReader, SinkError,
    VerifiedSet,
};

/// Records revocations as PrincipalRevocation objects. `Ok` means the API server stored them
/// (etcd is durable), which is when RFC 8935 allows answering 202.
pub struct KubeRevocationSink {
    pub client: kube::Client,
}

#[async_trait]
impl RevocationSink for KubeRevocationSink {
    async fn apply(
        &self,
        set: &VerifiedSet,
        actions: &[RevocationAction],
    ) -> Result<(), SinkError> {
        let api: Api<PrincipalRevocation> = Api::all(self.client.clone());
        for action in actions {
            match action {
                RevocationAction::Create(revocation) => create(&api, set, revocation).await?,
                RevocationAction::RemoveAccountDisabled {
                    issuer,
                    subject,
                    enabled_at,
                    transmitter,
                } => {
                    // Label selectors are not relied on (some API servers in tests lack them):
                    // list and filter here. Only this transmitter's own revocations, proven by
                    // their names (`created_by`), never a person's or another transmitter's.
                    let all = api
                        .list(&ListParams::default())
                        .await
                        .map_err(unavailable)?;
                    for r in all.items.iter().filter(|r| {
                        r.spec.reason == RevocationReason::AccountDisabled
                            && r.spec.issuer == *issuer
                            && r.spec.subject.as_ref() == Some(subject)
                            && r.spec.revoked_before.0 <= enabled_at.0
                            && created_by(r) == Some(transmitter.as_str())
                            && r.metadata
                                .labels
                                .as_ref()
                                .and_then(|l| l.get(SOURCE_LABEL))
                                .is_some_and(|v| v == SOURCE_LABEL_VALUE)
                    }) {
                        let name = r.metadata.name.clone().unwrap_or_default();
                        match api.delete(&name, &DeleteParams::default()).await {
                            Ok(_) => {
                                tracing::info!(revocation = %name, %transmitter, "account enabled: revocation lifted")
                            }
                            Err(kube::Error::Api(e)) if e.code == 404 => {}
                            Err(e) => return Err(unavailable(e)),
                        }
                    }
                }
            }
        }
        Ok(())
    }

    async fn created_by(&self, transmitter: &str) -> Result<HashSet<String>, SinkError> {
        let api: Api<PrincipalRevocation> = Api::all(self.client.clone());
        let all = api
            .list(&ListParams::default())
            .await
            .map_err(unavailable)?;
        Ok(all
            .items
            .iter()
            .filter(|r| created_by(r) == Some(transmitter))
            .filter_map(|r| r.metadata.name.clone())
            .collect())
    }
}

fn unavailable(error: kube::Error) -> SinkError {
    SinkError::Unavailable(error.to_string())
}

/// Creates one revocation, in a `lifeguard.revocation` span of the request's trace whose
/// context the object carries as its trace annotation (when spans are exported). An object of
/// the same name that records the same event means an earlier delivery did it; one that
/// records another event means the `jti` was reused.
async fn create(
    api: &Api<PrincipalRevocation>,
    set: &VerifiedSet,
    revocation: &PrincipalRevocation,
) -> Result<(), SinkError> {
    let name = revocation.metadata.name.as_deref().unwrap_or("");
    let span = revocation_spans::received(name, &reason_label(revocation));
    let traced;
    let revocation = match revocation_spans::traceparent_of(&span) {
        Some(traceparent) => {
            let mut annotated = revocation.clone();
            annotated
                .metadata
                .annotations
                .get_or_insert_default()
                .insert(TRACEPARENT_ANNOTATION.to_owned(), traceparent);
            traced = annotated;
            &traced
        }
        None => revocation,
    };
    let result = create_once(api, set, revocation)
        .instrument(span.clone())
        .await;
    let outcome = match &result {
        Ok(true) => "created",
        Ok(false) => "existed",
        Err(_) => "failed",
    };
    revocation_spans::recorded(&span, outcome, result.is_err());
    result.map(|_| ())
}

/// [`create`] without the span: `Ok(true)` when this call created the object, `Ok(false)` when
/// an earlier delivery had.
async fn create_once(
    api: &Api<PrincipalRevocation>,
    set: &VerifiedSet,
    revocation: &PrincipalRevocation,
) -> Result<bool, SinkError> {
    let name = revocation.metadata.name.as_deref().unwrap_or("");
    match api.create(&PostParams::default(), revocation).await {
        Ok(_) => {
            tracing::info!(revocation = name, issuer = %set.issuer, "security event recorded as a PrincipalRevocation");
            Ok(true)
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {
            // Deleted meanwhile: nothing to compare; the earlier delivery did its work.
            let Some(existing) = api.get_opt(name).await.map_err(unavailable)? else {
                return Ok(false);
            };
            if same_event(&existing, revocation) {
                Ok(false)
            } else {
                Err(SinkError::Conflict(format!(
                    "PrincipalRevocation {name} exists and records a different event"
                )))
            }
        }
        Err(e) => Err(unavailable(e)),
    }
}

/// Reads Secrets of the operator's namespace from the watch cache, asking the API server when
/// the cache does not have them (yet).
pub struct KubeSecretReader {
    pub client: kube::Client,
    pub namespace: String,
    pub cache: Store<Secret>,
}

fn value_of(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(key))
                .cloned()
        })
        .map(|s| s.trim().to_owned())
}

#[async_trait]
impl SecretReader for KubeSecretReader {
    async fn read(&self, reference: &SecretKeyRef) -> Result<Option<String>, SecretError> {
        if let Some(secret) = self
            .cache
            .get(&ObjectRef::new(&reference.secret_name).within(&self.namespace))
        {
            return Ok(value_of(&secret, &reference.key));
        }
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let secret = api
            .get_opt(&reference.secret_name)
            .await
            .map_err(|e| SecretError(e.to_string()))?;
        Ok(secret.and_then(|s| value_of(&s, &reference.key)))
    }
}
