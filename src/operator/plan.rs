//! What the cluster's objects mean for the sidecars, computed without IO: which policy each pod
//! gets, the one compiled snapshot per policy, each exception's state and the next instant at
//! which any of that changes by itself. The operator's IO shell feeds it the watch caches and
//! acts on the result; every rule here is tested on plain objects.
//!
//! Replanning is incremental: [`plan_from`] is given the previous plan and reuses a policy's
//! compilation (the same `Arc<CompiledPolicy>`) when everything that compilation read is the
//! same again ([`CompiledFrom`]): the policy, its exceptions in force, the revocations in
//! force for its issuers and their traces. The result is exactly what `plan_from(None, …)`
//! (the tests' `plan`) computes from nothing; only the work differs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use serde_json::value::RawValue;

use crate::api::conditions::reasons;
use crate::api::{
    CapabilityException, CapabilityExceptionSpec, ExceptionCapability, ExceptionState,
    McpServerPolicy, PrincipalRevocation,
};
/// The approver keys as the operator last read them (shared with the webhook).
pub use crate::exception::ApproverKeys;
use crate::exception::verify;
use crate::policy::compile::namespace_of;
use crate::policy::selection::{self, PolicySelector};
use crate::policy::{
    CompileInput, CompileMode, EffectivePolicy, ObjectKey, ObjectKind, Severity, compile,
};

/// Namespace and name of a pod.
pub type PodKey = ObjectKey;

/// Everything the plan is computed from.
#[derive(Clone, Copy, Debug)]
pub struct World<'a> {
    pub policies: &'a [Arc<McpServerPolicy>],
    pub exceptions: &'a [Arc<CapabilityException>],
    pub revocations: &'a [Arc<PrincipalRevocation>],
    pub pods: &'a [Arc<Pod>],
    pub approver_keys: &'a ApproverKeys,
    pub now: Timestamp,
    /// Revocation name → `traceparent` of the revocations whose propagation is traced
    /// (`revocation_traces`).
    pub revocation_traces: &'a BTreeMap<String, String>,
}

/// One policy compiled for its sidecars, shared by all of them.
#[derive(Debug)]
pub struct CompiledPolicy {
    pub effective: EffectivePolicy,
    pub hash: String,
    /// The serialized policy, written into every snapshot as is (serialized once per change,
    /// not once per sidecar).
    pub json: Arc<RawValue>,
    /// Names of the revocations the snapshot carries.
    pub revocations: BTreeSet<String>,
    /// The traced ones among them: name → `traceparent` (the snapshot's `revocationTraces`).
    pub revocation_traces: BTreeMap<String, String>,
    /// The same, serialized once for every snapshot (`None` when empty).
    pub revocation_traces_json: Option<Arc<RawValue>>,
}

/// What the plan says about one McpServerPolicy.
#[derive(Debug)]
pub struct PolicyPlan {
    pub generation: Option<i64>,
    /// `None` when the spec has errors (see `errors`).
    pub compiled: Option<Arc<CompiledPolicy>>,
    pub errors: Vec<String>,
    /// Pods its selector matches (whether or not it wins them).
    pub matched_pods: i32,
    /// An older policy that selects some of the same pods and wins them.
    pub shadowed_by: Option<ObjectKey>,
}

/// What the plan says about one CapabilityException.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExceptionPlan {
    pub generation: Option<i64>,
    pub state: ExceptionState,
    pub approver: Option<String>,
    /// Condition reason (`Active`, `NotYetValid`, `Expired`, `PolicyNotFound`, `NoTrustedKeys`,
    /// `BadSignature`, …).
    pub reason: &'static str,
    pub message: String,
    /// Whether the signature verified (independently of the validity window).
    pub signature_verified: bool,
    /// The capability it opens and the end of its window (for the expiry gauge).
    pub capability: ExceptionCapability,
    pub expires_at: Timestamp,
    /// The other objects of the namespace whose verified signature carries the same signed
    /// grant ([`crate::exception::grant_key`]): copies, which share one budget. Sorted.
    pub duplicates: Vec<String>,
}

/// What one policy's compilation read, kept beside it so the next plan can tell whether
/// compiling again would give the same: the caches' own objects (`Arc`s shared with them, not
/// copies), each list in a fixed order (the caches hand them out in any order).
///
/// The approver keys and the clock are not here because the compiler never reads them: they
/// decide which exceptions are in force and which revocations have expired, and those lists
/// are compared.
#[derive(Debug)]
struct CompiledFrom {
    policy: Arc<McpServerPolicy>,
    /// Its exceptions whose signature verified and whose window is open, by key.
    exceptions: Vec<Arc<CapabilityException>>,
    /// The revocations in force whose issuer it trusts, by name.
    revocations: Vec<Arc<PrincipalRevocation>>,
    /// The traces of those revocations: name → `traceparent`.
    traces: BTreeMap<String, String>,
}

impl CompiledFrom {
    /// Whether both name the same policy as the compiler reads it: metadata name, namespace
    /// and generation, and the spec. An object the cache replaced for a status write or a
    /// label change still counts as the same.
    fn same_policy(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.policy, &other.policy) || {
            let (a, b) = (&self.policy.metadata, &other.policy.metadata);
            a.name == b.name
                && a.namespace == b.namespace
                && a.generation == b.generation
                && self.policy.spec == other.policy.spec
        }
    }

    /// Whether the compiler would read the same policy and exceptions from both (exceptions by
    /// metadata name, namespace and spec): all but the revocations and their traces.
    fn same_but_revocations(&self, other: &Self) -> bool {
        self.same_policy(other)
            && same_list(&self.exceptions, &other.exceptions, |a, b| {
                a.metadata.name == b.metadata.name
                    && a.metadata.namespace == b.metadata.namespace
                    && a.spec == b.spec
            })
    }

    /// Whether the compiler would read the same from both (revocations by name and spec).
    fn same_as(&self, other: &Self) -> bool {
        self.same_but_revocations(other)
            && same_list(&self.revocations, &other.revocations, |a, b| {
                a.metadata.name == b.metadata.name && a.spec == b.spec
            })
            && self.traces == other.traces
    }
}

/// Whether two lists hold the same objects in the same order (the same `Arc`, or equal by
/// `same`).
fn same_list<T>(a: &[Arc<T>], b: &[Arc<T>], same: impl Fn(&T, &T) -> bool) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| Arc::ptr_eq(x, y) || same(x, y))
}

/// The whole plan.
#[derive(Debug, Default)]
pub struct Plan {
    pub policies: BTreeMap<ObjectKey, PolicyPlan>,
    /// The policy each selected pod gets.
    pub pods: HashMap<PodKey, ObjectKey>,
    pub exceptions: BTreeMap<ObjectKey, ExceptionPlan>,
    /// The next instant at which an exception enters or leaves its validity window.
    pub next_change: Option<Timestamp>,
    /// Every traced revocation: name → `traceparent`.
    pub revocation_traces: BTreeMap<String, String>,
    /// How many policies this plan compiled; the others reused the previous plan's
    /// compilation.
    pub compiled_afresh: usize,
    /// How many of those only had their revocations (or the traces of them) change: their
    /// previous compilation was taken with the new revocation rules instead of compiling the
    /// policy again (the result is the same; a revocation that every policy trusts re-hashes
    /// each policy but validates and compiles none).
    pub revocations_only: usize,
    /// What each policy's compilation read (see [`plan_from`]).
    compiled_from: HashMap<ObjectKey, CompiledFrom>,
}

impl Plan {
    /// The compiled policy a pod gets (`None`: no policy selects it, or its policy does not
    /// compile; either way the sidecar enables nothing).
    pub fn policy_for(&self, pod: &PodKey) -> Option<(&ObjectKey, Option<&Arc<CompiledPolicy>>)> {
        let key = self.pods.get(pod)?;
        Some((
            key,
            self.policies.get(key).and_then(|p| p.compiled.as_ref()),
        ))
    }
}

fn key_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> ObjectKey {
    ObjectKey {
        namespace: namespace_of(meta),
        name: meta.name.clone().unwrap_or_default(),
    }
}

/// Condition reason and message of an exception whose signature verified, in `state` (its
/// place in the validity window).
pub fn window_condition(
    state: ExceptionState,
    spec: &CapabilityExceptionSpec,
) -> (&'static str, String) {
    match state {
        ExceptionState::NotYetValid => (
            reasons::NOT_YET_VALID,
            format!("valid from {}", spec.not_before.0),
        ),
        ExceptionState::Expired => (
            reasons::EXPIRED,
            format!("expired at {}", spec.expires_at.0),
        ),
        // `Invalid` does not arise for a verified signature.
        ExceptionState::Active | ExceptionState::Invalid => (
            reasons::ACTIVE,
            format!("in force until {}", spec.expires_at.0),
        ),
    }
}

fn exception_plan(
    exception: &CapabilityException,
    policy_exists: bool,
    keys: &ApproverKeys,
    now: Timestamp,
) -> ExceptionPlan {
    let generation = exception.metadata.generation;
    let invalid = |reason: &'static str, message: String| ExceptionPlan {
        generation,
        state: ExceptionState::Invalid,
        approver: None,
        reason,
        message,
        signature_verified: false,
        capability: exception.spec.capability,
        expires_at: exception.spec.expires_at.0,
        duplicates: Vec::new(),
    };
    if !policy_exists {
        return invalid(
            reasons::POLICY_NOT_FOUND,
            format!(
                "McpServerPolicy {}/{} does not exist",
                namespace_of(&exception.metadata),
                exception.spec.policy_ref.name
            ),
        );
    }
    // What the CRD's CEL rules refuse at admission (objects stored before a rule existed
    // reach us anyway) grants nothing: the compiler leaves such an exception out.
    let mut problems = crate::policy::problem::Problems::new();
    crate::policy::validate::validate_exception(exception, &mut problems);
    if let Some(error) = problems.into_vec().into_iter().find(|p| {
        p.severity == crate::policy::problem::Severity::Error && p.path != "spec.signature"
    }) {
        return invalid(
            reasons::INVALID_SPEC,
            format!("{}: {}", error.path, error.message),
        );
    }
    let trust = match keys {
        ApproverKeys::Missing => {
            return invalid(
                reasons::NO_TRUSTED_KEYS,
                "the operator has no approver keys (approverKeys Secret missing)".into(),
            );
        }
        ApproverKeys::Unusable(why) => {
            return invalid(
                reasons::NO_TRUSTED_KEYS,
                format!("the approver keys are unusable: {why}"),
            );
        }
        ApproverKeys::Loaded { trust, .. } => trust,
    };
    let v = verify(
        &exception.spec,
        &namespace_of(&exception.metadata),
        trust,
        now,
    );
    let failed_check = v
        .checks
        .iter()
        .find_map(|c| c.result.as_ref().err().map(|e| format!("{}: {e}", c.check)));
    let (reason, message) = match (v.state, v.reason) {
        (ExceptionState::Invalid, code) => (
            match code {
                "unknown_key" => reasons::UNKNOWN_KEY,
                "key_revoked" => reasons::KEY_REVOKED,
                "wrong_server" => reasons::WRONG_SERVER,
                "approval_revoked" => reasons::APPROVAL_REVOKED,
                _ => reasons::BAD_SIGNATURE,
            },
            failed_check.unwrap_or_else(|| "the signature does not verify".into()),
        ),
        (state, _) => window_condition(state, &exception.spec),
    };
    ExceptionPlan {
        generation,
        signature_verified: v.approver.is_some(),
        state: v.state,
        approver: v.approver,
        reason,
        message,
        capability: exception.spec.capability,
        expires_at: exception.spec.expires_at.0,
        duplicates: Vec::new(),
    }
}

/// Marks every verified exception that shares its signed grant with another object of its
/// namespace (a copy under another name: budgets are the grant's, so the copy gains nothing,
/// but it is flagged for the people who review grants).
fn flag_duplicate_grants(
    exceptions: &[Arc<CapabilityException>],
    plans: &mut BTreeMap<ObjectKey, ExceptionPlan>,
) {
    let mut by_grant: BTreeMap<(String, String), Vec<ObjectKey>> = BTreeMap::new();
    for exception in exceptions {
        let key = key_of(&exception.metadata);
        if plans.get(&key).is_some_and(|p| p.signature_verified) {
            let grant = crate::exception::grant_key(&exception.spec, &key.namespace);
            by_grant
                .entry((key.namespace.clone(), grant))
                .or_default()
                .push(key);
        }
    }
    for keys in by_grant.values().filter(|keys| keys.len() > 1) {
        for key in keys {
            if let Some(plan) = plans.get_mut(key) {
                plan.duplicates = keys
                    .iter()
                    .filter(|k| *k != key)
                    .map(|k| k.name.clone())
                    .collect();
            }
        }
    }
}

/// Computes the plan from nothing (what every incremental plan must equal; the operator
/// itself always passes the plan it published last to [`plan_from`]).
#[cfg(test)]
pub fn plan(world: World<'_>) -> Plan {
    plan_from(None, world)
}

/// Computes the plan, reusing from `previous` the compilation of every policy whose inputs are
/// unchanged ([`CompiledFrom`]): the same `Arc<CompiledPolicy>` and errors. The result equals
/// `plan_from(None, world)`, whatever `previous` is.
pub fn plan_from(previous: Option<&Plan>, world: World<'_>) -> Plan {
    let mut out = Plan::default();
    let mut policies: Vec<&Arc<McpServerPolicy>> = world.policies.iter().collect();
    policies.sort_by_key(|p| selection::age_order(p));

    let Assignment {
        pods,
        matched,
        shadowed,
    } = assign_pods(&policies, world.pods);
    out.pods = pods;

    // Exceptions: state at `now`, and the next instant any of them changes by itself.
    let policy_keys: BTreeSet<ObjectKey> = policies.iter().map(|p| key_of(&p.metadata)).collect();
    for exception in world.exceptions {
        let target = ObjectKey {
            namespace: namespace_of(&exception.metadata),
            name: exception.spec.policy_ref.name.clone(),
        };
        let e = exception_plan(
            exception,
            policy_keys.contains(&target),
            world.approver_keys,
            world.now,
        );
        if e.signature_verified {
            for instant in [exception.spec.not_before.0, exception.spec.expires_at.0] {
                if instant > world.now && out.next_change.is_none_or(|n| instant < n) {
                    out.next_change = Some(instant);
                }
            }
        }
        out.exceptions.insert(key_of(&exception.metadata), e);
    }
    flag_duplicate_grants(world.exceptions, &mut out.exceptions);

    // The exceptions in force, by the policy they name, each list in key order.
    let mut active: HashMap<ObjectKey, Vec<(ObjectKey, &Arc<CapabilityException>)>> =
        HashMap::new();
    for exception in world.exceptions {
        let key = key_of(&exception.metadata);
        if out
            .exceptions
            .get(&key)
            .is_some_and(|p| p.state == ExceptionState::Active)
        {
            let target = ObjectKey {
                namespace: namespace_of(&exception.metadata),
                name: exception.spec.policy_ref.name.clone(),
            };
            active.entry(target).or_default().push((key, exception));
        }
    }
    for list in active.values_mut() {
        list.sort_by(|a, b| a.0.cmp(&b.0));
    }
    // The revocations in force, by name.
    let mut revocations: Vec<&Arc<PrincipalRevocation>> = world
        .revocations
        .iter()
        .filter(|r| r.spec.expires_at.as_ref().is_none_or(|e| e.0 > world.now))
        .collect();
    revocations.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));

    for policy in &policies {
        let key = key_of(&policy.metadata);
        let issuers: BTreeSet<&str> = policy
            .spec
            .identity
            .issuers
            .iter()
            .map(|i| i.issuer.as_str())
            .collect();
        let trusted: Vec<Arc<PrincipalRevocation>> = revocations
            .iter()
            .filter(|r| issuers.contains(r.spec.issuer.as_str()))
            .copied()
            .cloned()
            .collect();
        let from = CompiledFrom {
            policy: Arc::clone(policy),
            // An exception names its policy by namespace and name (`compile::targets`): a
            // policy without a name has none.
            exceptions: active
                .get(&key)
                .filter(|_| policy.metadata.name.is_some())
                .map_or_else(Vec::new, |list| {
                    list.iter().map(|(_, e)| Arc::clone(e)).collect()
                }),
            traces: trusted
                .iter()
                .filter_map(|r| {
                    let name = r.metadata.name.clone().unwrap_or_default();
                    let traceparent = world.revocation_traces.get(&name)?.clone();
                    Some((name, traceparent))
                })
                .collect(),
            revocations: trusted,
        };
        // A policy with errors compiles to nothing whatever its exceptions and revocations:
        // its errors are the spec's alone.
        let reused = previous.and_then(|previous| {
            let before = previous.compiled_from.get(&key)?;
            let planned = previous.policies.get(&key)?;
            let same = if planned.compiled.is_some() {
                before.same_as(&from)
            } else {
                before.same_policy(&from)
            };
            same.then_some(planned)
        });
        let (compiled, errors) = match reused {
            Some(before) => (before.compiled.clone(), before.errors.clone()),
            None => {
                out.compiled_afresh += 1;
                let derived = previous
                    .and_then(|previous| revocations_changed_only(previous, &key, &from))
                    .and_then(|(before, errors)| Some((with_revocations(before, &from)?, errors)));
                match derived {
                    Some((compiled, errors)) => {
                        out.revocations_only += 1;
                        (Some(compiled), errors)
                    }
                    None => compile_policy(&from, world.now),
                }
            }
        };
        out.policies.insert(
            key.clone(),
            PolicyPlan {
                generation: policy.metadata.generation,
                compiled,
                errors,
                matched_pods: matched.get(&key).copied().unwrap_or(0),
                shadowed_by: shadowed.get(&key).cloned(),
            },
        );
        out.compiled_from.insert(key, from);
    }
    out.revocation_traces = world.revocation_traces.clone();
    out
}

/// Which policy each pod gets.
struct Assignment {
    pods: HashMap<PodKey, ObjectKey>,
    /// Pods each policy's selector matches.
    matched: HashMap<ObjectKey, i32>,
    /// The policy that wins some of the pods a policy selects.
    shadowed: HashMap<ObjectKey, ObjectKey>,
}

/// The oldest selecting policy wins a pod; the others are shadowed on that pod. `policies` come
/// oldest first. Each policy's selector is parsed once and asked only about the pods of its
/// namespace — and when it names a label value (`matchLabels`), only about the pods carrying
/// that value, looked up in an index of the namespace's labels built once per plan (a policy
/// for one app no longer tests every pod of a crowded namespace).
fn assign_pods(policies: &[&Arc<McpServerPolicy>], pods: &[Arc<Pod>]) -> Assignment {
    /// A namespace's pods (indexes into `pods`, ascending) and, per label key and value, the
    /// pods carrying it (ascending too).
    #[derive(Default)]
    struct NamespacePods<'a> {
        all: Vec<usize>,
        by_label: HashMap<(&'a str, &'a str), Vec<usize>>,
    }
    let mut by_namespace: HashMap<String, NamespacePods<'_>> = HashMap::new();
    for (i, pod) in pods.iter().enumerate() {
        let index = by_namespace.entry(namespace_of(&pod.metadata)).or_default();
        index.all.push(i);
        for (k, v) in pod.metadata.labels.iter().flatten() {
            index
                .by_label
                .entry((k.as_str(), v.as_str()))
                .or_default()
                .push(i);
        }
    }
    let mut out = Assignment {
        pods: HashMap::new(),
        matched: HashMap::new(),
        shadowed: HashMap::new(),
    };
    // The winner of each pod, by index: the first (oldest) policy that selected it.
    let mut winners: Vec<Option<ObjectKey>> = vec![None; pods.len()];
    for policy in policies {
        let selector = PolicySelector::of(policy);
        let Some(index) = by_namespace.get(selector.namespace()) else {
            continue;
        };
        // Every selected pod carries each of `matchLabels`' values: the first narrows the
        // candidates, the whole selector decides.
        let required = policy.spec.selector.match_labels.iter().flatten().next();
        let candidates: &[usize] = match required {
            Some((k, v)) => index
                .by_label
                .get(&(k.as_str(), v.as_str()))
                .map_or(&[], Vec::as_slice),
            None => &index.all,
        };
        let key = key_of(&policy.metadata);
        for &i in candidates {
            if !selector.selects(selector.namespace(), pods[i].metadata.labels.as_ref()) {
                continue;
            }
            *out.matched.entry(key.clone()).or_default() += 1;
            match &winners[i] {
                None => winners[i] = Some(key.clone()),
                // Candidates come in pod order, as before: the winner named is the one of the
                // first pod on which this policy is shadowed.
                Some(w) => {
                    out.shadowed.entry(key.clone()).or_insert_with(|| w.clone());
                }
            }
        }
    }
    for (pod, winner) in pods.iter().zip(winners) {
        if let Some(w) = winner {
            out.pods.insert(key_of(&pod.metadata), w);
        }
    }
    out
}

/// Compiles one policy from what [`CompiledFrom`] names: its snapshot (`None` when the spec
/// has errors) and the errors of the McpServerPolicy itself.
fn compile_policy(
    from: &CompiledFrom,
    now: Timestamp,
) -> (Option<Arc<CompiledPolicy>>, Vec<String>) {
    let exceptions: Vec<CapabilityException> =
        from.exceptions.iter().map(|e| e.as_ref().clone()).collect();
    let revocations: Vec<PrincipalRevocation> = from
        .revocations
        .iter()
        .map(|r| r.as_ref().clone())
        .collect();
    let compilation = compile(CompileInput {
        policy: &from.policy,
        exceptions: &exceptions,
        revocations: &revocations,
        mode: CompileMode::Cluster,
        now,
    });
    let errors: Vec<String> = compilation
        .problems
        .iter()
        .filter(|p| {
            p.problem.severity == Severity::Error && p.object.kind == ObjectKind::McpServerPolicy
        })
        .map(|p| p.problem.to_string())
        .collect();
    let compiled = compilation
        .effective
        .and_then(|effective| finish(effective, &from.traces));
    (compiled, errors)
}

/// The previous compilation of `key` and its errors, when what changed since is only the
/// revocations in force for its issuers or their traces.
fn revocations_changed_only<'p>(
    previous: &'p Plan,
    key: &ObjectKey,
    from: &CompiledFrom,
) -> Option<(&'p CompiledPolicy, Vec<String>)> {
    let before = previous.compiled_from.get(key)?;
    let planned = previous.policies.get(key)?;
    let compiled = planned.compiled.as_deref()?;
    before
        .same_but_revocations(from)
        .then(|| (compiled, planned.errors.clone()))
}

/// `before` with the revocation rules of `from`'s revocations: what compiling the same policy
/// and exceptions with them gives ([`crate::policy::compile`] builds revocation rules from
/// nothing else, and sorts them by name).
fn with_revocations(before: &CompiledPolicy, from: &CompiledFrom) -> Option<Arc<CompiledPolicy>> {
    let mut effective = before.effective.clone();
    effective.revocations = from
        .revocations
        .iter()
        .map(|r| crate::policy::compile::revocation_rule(r))
        .collect();
    effective.revocations.sort_by(|a, b| a.name.cmp(&b.name));
    finish(effective, &from.traces)
}

/// A compiled policy from its effective policy: serialized once (the same bytes are hashed
/// and sent), with the traces of the revocations it carries.
fn finish(
    effective: EffectivePolicy,
    traces: &BTreeMap<String, String>,
) -> Option<Arc<CompiledPolicy>> {
    let json = serde_json::to_string(&effective).ok()?;
    let hash = EffectivePolicy::hash_of_serialized(json.as_bytes());
    let json = RawValue::from_string(json).ok()?;
    let revocations: BTreeSet<String> = effective
        .revocations
        .iter()
        .map(|r| r.name.clone())
        .collect();
    let revocation_traces = traces_of(&revocations, traces);
    Some(Arc::new(CompiledPolicy {
        hash,
        revocation_traces_json: (!revocation_traces.is_empty())
            .then(|| serde_json::value::to_raw_value(&revocation_traces).ok())
            .flatten()
            .map(Arc::from),
        revocation_traces,
        revocations,
        effective,
        json: Arc::from(json),
    }))
}

/// The traces of `revocations` among every revocation's `traces`.
fn traces_of(
    revocations: &BTreeSet<String>,
    traces: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    traces
        .iter()
        .filter(|(name, _)| revocations.contains(name.as_str()))
        .map(|(name, traceparent)| (name.clone(), traceparent.clone()))
        .collect()
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
