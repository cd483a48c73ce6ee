//! The webhook's own work per request, timed in this process with the library code the
//! webhook runs (this build's profile), one call at a time, after the load: parsing the
//! review, deciding about the pod, the whole `/inject` answer (decision, JSON diff, patch),
//! serializing it, and the two validations. Set against the end-to-end latency it tells how
//! much of it is computation and how much TLS, HTTP and scheduling.
//!
//! The cluster view is what the webhook's watch caches hold: the namespace's policies, and
//! the approver-keys document, parsed at every call as the webhook's cache view does.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use serde_json::Value;

use lifeguard::api::McpServerPolicy;
use lifeguard::exception::ApproverKeys;
use lifeguard::webhook::admission;
use lifeguard::webhook::config::WebhookFileConfig;
use lifeguard::webhook::inject::{self, Candidate};
use lifeguard::webhook::validate::ClusterView;

use crate::report::Latency;
use crate::reviews::{self, Kind, NS};
use crate::world::{self, WEBHOOK_NAMESPACE};

struct View {
    policies: Vec<Arc<McpServerPolicy>>,
    jwks: Vec<u8>,
}

impl ClusterView for View {
    fn policies_in(&self, namespace: &str) -> Vec<Arc<McpServerPolicy>> {
        self.policies
            .iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
            .cloned()
            .collect()
    }

    fn approver_keys(&self) -> ApproverKeys {
        ApproverKeys::from_document(&self.jwks)
    }
}

/// Times `f` once per iteration; `f` returns something to keep the work from being optimized
/// away.
fn time<T>(iterations: usize, mut f: impl FnMut(u64) -> T) -> Latency {
    let mut samples = Vec::with_capacity(iterations);
    for i in 0..iterations {
        let t = Instant::now();
        std::hint::black_box(f(i as u64));
        samples.push(t.elapsed());
    }
    Latency::of(&samples)
}

/// Each component's per-call time, in report order.
pub fn measure(
    repo: &Path,
    policies: usize,
    exception_spec: &Value,
    iterations: usize,
) -> Result<Vec<(&'static str, Latency)>> {
    let config = WebhookFileConfig::parse("webhook.yaml", &world::webhook_config())
        .context("the bench's webhook configuration")?;
    let typed: Vec<Arc<McpServerPolicy>> = world::policy_objects(policies)
        .into_iter()
        .map(|p| serde_json::from_value(p).map(Arc::new))
        .collect::<Result<_, _>>()
        .context("the bench's policies")?;
    let view = View {
        policies: typed,
        jwks: world::approver_jwks(repo)?,
    };
    let ns_labels = BTreeMap::from([("lifeguard.dev/inject".to_owned(), "enabled".to_owned())]);
    let body = |kind: Kind, i: u64| {
        serde_json::to_vec(&reviews::review(kind, i, exception_spec)).unwrap_or_default()
    };
    let decide = |pod: &Value, namespace: &str| {
        let policies = view.policies_in(namespace);
        let refs: Vec<&McpServerPolicy> = policies.iter().map(Arc::as_ref).collect();
        inject::decide(&Candidate {
            pod,
            namespace,
            namespace_labels: Some(&ns_labels),
            policies: &refs,
            own_namespace: WEBHOOK_NAMESPACE,
            config: &config,
        })
    };
    let inject_answer = |kind: Kind, i: u64| {
        let request = admission::parse_review(&body(kind, i)).ok()?;
        Some(admission::inject_response(&request, |pod, ns| decide(pod, ns)).0)
    };
    let validate_answer = |kind: Kind, i: u64| {
        let request = admission::parse_review(&body(kind, i)).ok()?;
        Some(admission::validate_response(&request, &view, jiff::Timestamp::now()).0)
    };
    // Check that the components answer as the webhook does before timing them.
    let injected = inject_answer(Kind::PodInjected, 0).context("parsing a pod review")?;
    reviews::check(Kind::PodInjected, 0, &admission::review_body(injected))
        .map_err(|e| anyhow::anyhow!("in-process /inject: {e}"))?;
    for kind in [
        Kind::PolicyDisjoint,
        Kind::PolicyOverlapping,
        Kind::Exception,
    ] {
        let answer = validate_answer(kind, 0).context("parsing a review")?;
        reviews::check(kind, 0, &admission::review_body(answer))
            .map_err(|e| anyhow::anyhow!("in-process /validate: {e}"))?;
    }

    let pod_body = body(Kind::PodInjected, 0);
    let request = admission::parse_review(&pod_body)
        .map_err(|_| anyhow::anyhow!("the pod review does not parse"))?;
    let raw = admission::raw_object(&request).context("the pod review has an object")?;
    let answer = inject_answer(Kind::PodInjected, 0).context("an /inject answer")?;
    let policy_body = body(Kind::PolicyDisjoint, 0);
    let exception_body = body(Kind::Exception, 0);
    let n = iterations;
    Ok(vec![
        (
            "parse a pod review (JSON → AdmissionRequest)",
            time(n, |_| admission::parse_review(&pod_body).is_ok()),
        ),
        (
            "decide and build the injected pod",
            time(n, |_| decide(&raw, NS).is_ok()),
        ),
        (
            "/inject, injected: parse + decide + JSON diff",
            time(n, |_| {
                let request = admission::parse_review(&pod_body).ok();
                request.map(|r| admission::inject_response(&r, |p, ns| decide(p, ns)).0)
            }),
        ),
        (
            "serialize the /inject answer (patch in base64)",
            time(n, |_| admission::review_body(answer.clone()).len()),
        ),
        (
            "/validate, policy: parse + compile + overlap check",
            time(n, |_| {
                let request = admission::parse_review(&policy_body).ok();
                request.map(|r| admission::validate_response(&r, &view, jiff::Timestamp::now()).0)
            }),
        ),
        (
            "/validate, exception: parse + keys + signature",
            time(n, |_| {
                let request = admission::parse_review(&exception_body).ok();
                request.map(|r| admission::validate_response(&r, &view, jiff::Timestamp::now()).0)
            }),
        ),
        (
            "  of which parsing the approver keys",
            time(n, |_| view.approver_keys().trust().is_some()),
        ),
    ])
}
