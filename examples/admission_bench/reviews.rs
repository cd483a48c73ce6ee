//! The requests of the load and what each answer must be: pure functions of the request's kind
//! and index, so a response can be checked against the exact request that was sent.
//!
//! The mix, per 20 requests: 16 Pod CREATEs to `/inject` (10 injected, 3 skipped because no
//! policy selects them, 3 skipped because they opt out) and 4 CREATEs to `/validate` (a policy
//! whose selector overlaps no other, a policy overlapping `reports`, two signed
//! CapabilityExceptions). The pods are what a Deployment's ReplicaSet creates once the API
//! server's own admission plugins ran (service account token volume, default tolerations).

use base64::Engine;
use serde_json::{Value, json};

/// Namespace of the pods and policies (labelled `lifeguard.dev/inject=enabled`).
pub const NS: &str = "bench";
/// The policy selecting the injected pods (`app: reports`).
pub const BENCH_POLICY: &str = "reports";
/// The issuer every policy trusts.
pub const ISSUER: &str = "https://idp.bench.example";

/// What a request is, and so which endpoint it goes to and what its answer must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    PodInjected,
    PodNoPolicy,
    PodOptedOut,
    PolicyDisjoint,
    PolicyOverlapping,
    Exception,
}

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind::PodInjected,
        Kind::PodNoPolicy,
        Kind::PodOptedOut,
        Kind::PolicyDisjoint,
        Kind::PolicyOverlapping,
        Kind::Exception,
    ];

    pub fn endpoint(self) -> Endpoint {
        match self {
            Self::PodInjected | Self::PodNoPolicy | Self::PodOptedOut => Endpoint::Inject,
            Self::PolicyDisjoint | Self::PolicyOverlapping | Self::Exception => Endpoint::Validate,
        }
    }

    /// Row label of the report.
    pub fn label(self) -> &'static str {
        match self {
            Self::PodInjected => "pod CREATE, injected",
            Self::PodNoPolicy => "pod CREATE, skipped (NoPolicy)",
            Self::PodOptedOut => "pod CREATE, skipped (OptedOut)",
            Self::PolicyDisjoint => "policy CREATE, no overlap (allowed)",
            Self::PolicyOverlapping => "policy CREATE, overlap (denied)",
            Self::Exception => "signed exception CREATE (allowed)",
        }
    }

    /// Key in the results file.
    pub fn key(self) -> &'static str {
        match self {
            Self::PodInjected => "pod_injected",
            Self::PodNoPolicy => "pod_skipped_no_policy",
            Self::PodOptedOut => "pod_skipped_opted_out",
            Self::PolicyDisjoint => "policy_disjoint",
            Self::PolicyOverlapping => "policy_overlapping",
            Self::Exception => "exception_signed",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Endpoint {
    Inject,
    Validate,
}

impl Endpoint {
    pub const ALL: [Endpoint; 2] = [Endpoint::Inject, Endpoint::Validate];

    pub fn path(self) -> &'static str {
        match self {
            Self::Inject => "/inject",
            Self::Validate => "/validate",
        }
    }

    /// The `endpoint` label of the webhook's metrics.
    pub fn metric_label(self) -> &'static str {
        match self {
            Self::Inject => "inject",
            Self::Validate => "validate",
        }
    }
}

/// One cycle of the mix (20 requests), interleaved so each kind is spread over the cycle.
const CYCLE: [Kind; 20] = {
    use Kind::*;
    [
        PodInjected,
        PodNoPolicy,
        PodInjected,
        PolicyDisjoint,
        PodInjected,
        PodOptedOut,
        PodInjected,
        Exception,
        PodInjected,
        PodNoPolicy,
        PodInjected,
        PodOptedOut,
        PodInjected,
        PolicyOverlapping,
        PodInjected,
        PodNoPolicy,
        PodInjected,
        Exception,
        PodInjected,
        PodOptedOut,
    ]
};

/// The kind of the `index`-th request.
pub fn kind_of(index: u64) -> Kind {
    CYCLE[(index % CYCLE.len() as u64) as usize]
}

/// A Deployment's pod as the webhook receives it: two containers (the MCP server with a named
/// `mcp` port, env, probes on that port; a log shipper), an init container, five volumes.
pub fn pod(kind: Kind, index: u64) -> Value {
    let hash = "6f7d9c8b5";
    let mut labels = json!({
        "app": "reports",
        "app.kubernetes.io/name": "reports",
        "app.kubernetes.io/instance": "reports-prod",
        "app.kubernetes.io/version": "2.14.1",
        "app.kubernetes.io/component": "mcp-server",
        "pod-template-hash": hash,
    });
    match kind {
        // The worker of the same application: no policy selects it.
        Kind::PodNoPolicy => labels["app"] = json!("reports-worker"),
        Kind::PodOptedOut => labels["lifeguard.dev/inject"] = json!("disabled"),
        _ => {}
    }
    let probe = |path: &str, period: u32, failures: u32| {
        json!({
            "httpGet": {"path": path, "port": "mcp", "scheme": "HTTP"},
            "initialDelaySeconds": 0, "periodSeconds": period, "timeoutSeconds": 2,
            "successThreshold": 1, "failureThreshold": failures,
        })
    };
    let api_access = json!({"name": "kube-api-access-7xk2p", "readOnly": true,
        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"});
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "generateName": format!("reports-{hash}-"),
            "namespace": NS,
            "labels": labels,
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": "9090",
                "checksum/config": format!("{:064x}", u128::from(index as u32) * 0x9e37_79b9_7f4a_7c15),
            },
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("reports-{hash}"),
                "uid": "0b8c1d2e-3f40-4a5b-9c6d-7e8f9a0b1c2d", "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "serviceAccountName": "reports",
            "initContainers": [{
                "name": "migrate", "image": "registry.example.com/reports-migrate:2.14.1",
                "command": ["/bin/migrate", "--database-url", "$(DATABASE_URL)", "up"],
                "envFrom": [{"secretRef": {"name": "reports-db"}}],
                "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
                "volumeMounts": [api_access],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent",
            }],
            "containers": [
                {
                    "name": "server", "image": "registry.example.com/reports:2.14.1",
                    "args": ["--config", "/etc/reports/config.yaml", "--log-format", "json"],
                    "ports": [
                        {"name": "mcp", "containerPort": 8080, "protocol": "TCP"},
                        {"name": "metrics", "containerPort": 9090, "protocol": "TCP"},
                    ],
                    "env": [
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
                        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}},
                        {"name": "DATABASE_URL", "valueFrom": {"secretKeyRef": {"name": "reports-db", "key": "url"}}},
                        {"name": "CACHE_DIR", "value": "/var/cache/reports"},
                        {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://otel-collector.observability.svc:4317"},
                        {"name": "LOG_LEVEL", "valueFrom": {"configMapKeyRef": {"name": "reports-config", "key": "log-level"}}},
                    ],
                    "envFrom": [{"configMapRef": {"name": "reports-env"}}],
                    "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"cpu": "2", "memory": "1Gi"}},
                    "startupProbe": probe("/healthz", 2, 30),
                    "livenessProbe": probe("/healthz", 10, 3),
                    "readinessProbe": probe("/ready", 5, 3),
                    "volumeMounts": [
                        {"name": "config", "mountPath": "/etc/reports", "readOnly": true},
                        {"name": "cache", "mountPath": "/var/cache/reports"},
                        {"name": "logs", "mountPath": "/var/log/reports"},
                        api_access,
                    ],
                    "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                        "capabilities": {"drop": ["ALL"]}},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent",
                },
                {
                    "name": "log-shipper", "image": "cr.fluentbit.io/fluent/fluent-bit:3.2.4",
                    "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
                    "volumeMounts": [{"name": "logs", "mountPath": "/var/log/reports", "readOnly": true}, api_access],
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent",
                },
            ],
            "volumes": [
                {"name": "config", "configMap": {"name": "reports-config", "defaultMode": 420}},
                {"name": "cache", "emptyDir": {"sizeLimit": "1Gi"}},
                {"name": "logs", "emptyDir": {}},
                {"name": "kube-api-access-7xk2p", "projected": {"defaultMode": 420, "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
                ]}},
            ],
            "securityContext": {"runAsNonRoot": true, "runAsUser": 10001, "fsGroup": 10001,
                "seccompProfile": {"type": "RuntimeDefault"}},
            "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                "weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "reports"}},
                "topologyKey": "kubernetes.io/hostname"},
            }]}},
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            ],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "schedulerName": "default-scheduler", "enableServiceLinks": true,
            "priority": 0, "preemptionPolicy": "PreemptLowerPriority",
        },
    })
}

/// An McpServerPolicy: the decoys, the bench policy and the policies under validation alike.
pub fn policy(name: &str, selector: Value) -> Value {
    json!({
        "apiVersion": "lifeguard.dev/v1alpha1", "kind": "McpServerPolicy",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "selector": selector,
            "resource": format!("https://{name}.{NS}.example.com/mcp"),
            "identity": {"issuers": [{"issuer": ISSUER, "jwksUri": format!("{ISSUER}/jwks")}]},
            "tasks": {"enabled": true, "tools": ["generate_report"], "minPollInterval": "2s"},
        },
    })
}

/// The selector of decoy `i`: each selects only its own `app`, written three ways so the
/// overlap check meets `matchLabels`, `In`, `NotIn` and `Exists`.
pub fn decoy_selector(i: usize) -> Value {
    let app = format!("decoy-{i:05}");
    match i % 3 {
        0 => json!({"matchLabels": {"app": app}}),
        1 => json!({"matchExpressions": [
            {"key": "app", "operator": "In", "values": [app, format!("{app}-canary")]},
            {"key": "tier", "operator": "NotIn", "values": ["batch"]},
        ]}),
        _ => {
            json!({"matchLabels": {"app": app}, "matchExpressions": [{"key": "track", "operator": "Exists"}]})
        }
    }
}

/// The selector of the bench policy.
pub fn bench_selector() -> Value {
    json!({"matchLabels": {"app": "reports"}})
}

/// The spec of the CapabilityException the load submits, before signing; `now` is RFC 3339.
pub fn exception_spec(not_before: &str, expires_at: &str) -> Value {
    json!({
        "policyRef": {"name": BENCH_POLICY}, "capability": "sampling",
        "clients": ["reports-console"],
        "tenants": [{"issuer": ISSUER, "tenant": "tenant-a"}],
        "purpose": "generate_report asks the user's model for the executive summary",
        "modelRoute": "gateway/bench/summaries",
        "limits": {"maxTokens": 2000, "maxIterationsPerTask": 3, "maxRequestsPerMinute": 60},
        "allowedTools": [],
        "notBefore": not_before, "expiresAt": expires_at,
        "approvalId": "CHG-BENCH-1",
    })
}

/// The uid of the `index`-th review (unique per run).
pub fn uid(index: u64) -> String {
    format!("00000000-0000-4000-8000-{index:012}")
}

/// The object of the `index`-th review.
pub fn object(kind: Kind, index: u64, signed_exception_spec: &Value) -> Value {
    match kind {
        Kind::PodInjected | Kind::PodNoPolicy | Kind::PodOptedOut => pod(kind, index),
        Kind::PolicyDisjoint => policy(
            &format!("search-{index}"),
            json!({"matchLabels": {"app": format!("search-{index}")},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["mcp"]}]}),
        ),
        Kind::PolicyOverlapping => policy(
            &format!("reports-v2-{index}"),
            json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["reports", "reports-canary"]}]}),
        ),
        Kind::Exception => json!({
            "apiVersion": "lifeguard.dev/v1alpha1", "kind": "CapabilityException",
            "metadata": {"name": format!("reports-sampling-{index}"), "namespace": NS},
            "spec": signed_exception_spec,
        }),
    }
}

/// The AdmissionReview of the `index`-th request, as kube-apiserver sends it.
pub fn review(kind: Kind, index: u64, signed_exception_spec: &Value) -> Value {
    let object = object(kind, index, signed_exception_spec);
    let (group, version, k, resource) = match kind {
        Kind::PodInjected | Kind::PodNoPolicy | Kind::PodOptedOut => ("", "v1", "Pod", "pods"),
        Kind::PolicyDisjoint | Kind::PolicyOverlapping => (
            "lifeguard.dev",
            "v1alpha1",
            "McpServerPolicy",
            "mcpserverpolicies",
        ),
        Kind::Exception => (
            "lifeguard.dev",
            "v1alpha1",
            "CapabilityException",
            "capabilityexceptions",
        ),
    };
    let mut request = json!({
        "uid": uid(index),
        "kind": {"group": group, "version": version, "kind": k},
        "resource": {"group": group, "version": version, "resource": resource},
        "requestKind": {"group": group, "version": version, "kind": k},
        "requestResource": {"group": group, "version": version, "resource": resource},
        "name": object["metadata"]["name"],
        "namespace": NS,
        "operation": "CREATE",
        "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller",
            "uid": "5c2b0f7e-1d8a-4a43-9b1e-2f6c8d9e0a1b",
            "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]},
        "object": object,
        "oldObject": null,
        "dryRun": false,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    });
    if kind.endpoint() == Endpoint::Validate {
        request["userInfo"] = json!({"username": "alice@example.com", "groups": ["platform-team", "system:authenticated"]});
    } else if let Some(r) = request.as_object_mut() {
        // A pod with only `generateName`: the API server omits `name`.
        r.remove("name");
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

/// Checks the answer to the `index`-th request: an AdmissionReview for its uid whose verdict,
/// warnings and patch are what its kind calls for.
pub fn check(kind: Kind, index: u64, body: &[u8]) -> Result<(), String> {
    let review: Value =
        serde_json::from_slice(body).map_err(|e| format!("the answer is not JSON: {e}"))?;
    if review["apiVersion"] != "admission.k8s.io/v1" || review["kind"] != "AdmissionReview" {
        return Err(format!("not an AdmissionReview v1: {}", brief(&review)));
    }
    let response = &review["response"];
    if response["uid"] != uid(index).as_str() {
        return Err(format!("uid {} instead of {}", response["uid"], uid(index)));
    }
    let allowed = response["allowed"].as_bool();
    let warnings: Vec<&str> = response["warnings"]
        .as_array()
        .map(|w| w.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let expect = |ok: bool, what: &str| {
        if ok {
            Ok(())
        } else {
            Err(format!("{}: {what}: {}", kind.label(), brief(response)))
        }
    };
    match kind {
        Kind::PodInjected => {
            expect(allowed == Some(true), "not allowed")?;
            expect(warnings.is_empty(), "warnings")?;
            let patched = patched(&pod(kind, index), response)?;
            let sidecar = patched["spec"]["initContainers"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["name"] == "lifeguard-sidecar"));
            expect(
                sidecar,
                "no lifeguard-sidecar init container after the patch",
            )?;
            let status: Value = patched["metadata"]["annotations"]["lifeguard.dev/status"]
                .as_str()
                .and_then(|s| serde_json::from_str(s).ok())
                .unwrap_or(Value::Null);
            expect(
                status["policy"] == BENCH_POLICY,
                "no lifeguard.dev/status naming the policy",
            )
        }
        Kind::PodNoPolicy | Kind::PodOptedOut => {
            let reason = if kind == Kind::PodNoPolicy {
                "NoPolicy"
            } else {
                "OptedOut"
            };
            expect(allowed == Some(true), "not allowed")?;
            expect(
                warnings.len() == 1 && warnings[0].contains(reason),
                "no warning naming the reason",
            )?;
            let patched = patched(&pod(kind, index), response)?;
            expect(
                patched["metadata"]["annotations"]["lifeguard.dev/injection-skipped"] == reason,
                "no injection-skipped annotation with the reason",
            )?;
            expect(
                patched["spec"] == pod(kind, index)["spec"],
                "the spec was changed",
            )
        }
        Kind::PolicyDisjoint | Kind::Exception => {
            expect(allowed == Some(true), "not allowed")?;
            expect(warnings.is_empty(), "warnings")
        }
        Kind::PolicyOverlapping => {
            expect(allowed == Some(false), "allowed")?;
            let message = response["status"]["message"].as_str().unwrap_or("");
            expect(
                message.contains("overlaps") && message.contains(&format!("`{BENCH_POLICY}`")),
                "the denial does not name the overlapped policy",
            )
        }
    }
}

/// `pod` with the response's JSONPatch applied.
fn patched(pod: &Value, response: &Value) -> Result<Value, String> {
    let Some(encoded) = response["patch"].as_str() else {
        return Err(format!("no patch: {}", brief(response)));
    };
    if response["patchType"] != "JSONPatch" {
        return Err(format!("patchType {}", response["patchType"]));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|e| format!("the patch is not base64: {e}"))?;
    let patch: json_patch::Patch =
        serde_json::from_slice(&bytes).map_err(|e| format!("the patch is not a JSONPatch: {e}"))?;
    let mut out = pod.clone();
    json_patch::patch(&mut out, &patch).map_err(|e| format!("the patch does not apply: {e}"))?;
    Ok(out)
}

/// At most 300 characters of a JSON value, for error messages.
fn brief(v: &Value) -> String {
    let text = v.to_string();
    match text.char_indices().nth(300) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mix_is_four_fifths_pods() {
        let count = |k: Kind| (0..20).filter(|&i| kind_of(i) == k).count();
        assert_eq!(count(Kind::PodInjected), 10);
        assert_eq!(count(Kind::PodNoPolicy) + count(Kind::PodOptedOut), 6);
        assert_eq!(
            count(Kind::PolicyDisjoint) + count(Kind::PolicyOverlapping),
            2
        );
        assert_eq!(count(Kind::Exception), 2);
        assert_eq!(kind_of(20), kind_of(0));
    }

    #[test]
    fn the_pod_is_a_realistic_size_and_reviews_are_unique() {
        let size = serde_json::to_vec(&pod(Kind::PodInjected, 7))
            .unwrap()
            .len();
        assert!((3 * 1024..=5 * 1024).contains(&size), "{size} bytes");
        let spec = json!({});
        let a = review(Kind::PodInjected, 1, &spec);
        let b = review(Kind::PodInjected, 2, &spec);
        assert_ne!(a["request"]["uid"], b["request"]["uid"]);
        assert!(a["request"].get("name").is_none());
        let p = review(Kind::PolicyDisjoint, 3, &spec);
        assert_eq!(p["request"]["name"], "search-3");
        assert_eq!(p["request"]["kind"]["kind"], "McpServerPolicy");
    }

    fn answer(index: u64, response: Value) -> Vec<u8> {
        let mut response = response;
        response["uid"] = json!(uid(index));
        serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})).unwrap()
    }

    fn b64(v: &Value) -> String {
        base64::engine::general_purpose::STANDARD.encode(v.to_string())
    }

    #[test]
    fn checks_catch_a_wrong_verdict_uid_or_patch() {
        let ok = answer(5, json!({"allowed": true}));
        assert!(check(Kind::PolicyDisjoint, 5, &ok).is_ok());
        assert!(
            check(Kind::PolicyDisjoint, 6, &ok)
                .unwrap_err()
                .contains("uid")
        );
        assert!(check(Kind::PolicyOverlapping, 5, &ok).is_err());
        assert!(
            check(Kind::PodInjected, 5, &ok)
                .unwrap_err()
                .contains("no patch")
        );
        let skip = json!([{"op": "add", "path": "/metadata/annotations/lifeguard.dev~1injection-skipped", "value": "NoPolicy"}]);
        let skipped = answer(
            1,
            json!({"allowed": true, "patchType": "JSONPatch", "patch": b64(&skip),
                "warnings": ["lifeguard: sidecar not injected: NoPolicy (…)"]}),
        );
        assert!(check(Kind::PodNoPolicy, 1, &skipped).is_ok());
        assert!(check(Kind::PodOptedOut, 1, &skipped).is_err());
        assert!(check(Kind::PodInjected, 1, &skipped).is_err());
        assert!(check(Kind::PodNoPolicy, 1, b"not json").is_err());
    }
}
