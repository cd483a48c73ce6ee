//! Every CEL rule of the three CRDs, evaluated locally the way the API server evaluates it:
//! one case that passes and one that fails per rule, transition rules with an old object.
//! `every_cel_rule_has_a_failing_case` keeps this list complete as rules are added.

use std::collections::BTreeSet;

use kube::CustomResourceExt;
use kube::core::cel::Validator;
use serde_json::{Value, json};

use super::{CapabilityException, McpServerPolicy, PrincipalRevocation, rules};

fn schema_of(kind: &str) -> Value {
    let crd = match kind {
        "McpServerPolicy" => McpServerPolicy::crd(),
        "CapabilityException" => CapabilityException::crd(),
        "PrincipalRevocation" => PrincipalRevocation::crd(),
        other => panic!("unknown kind {other}"),
    };
    serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .unwrap(),
    )
    .unwrap()
}

fn policy(spec_extra: Value) -> Value {
    let mut spec = json!({
        "selector": {},
        "resource": "https://reports.example.com/mcp",
        "identity": {"issuers": [{"issuer": "https://idp", "jwksUri": "https://idp/jwks"}]},
    });
    merge(&mut spec, spec_extra);
    json!({"apiVersion": "lifeguard.dev/v1alpha1", "kind": "McpServerPolicy",
           "metadata": {"name": "p", "namespace": "team-a"}, "spec": spec})
}

fn exception(spec_extra: Value) -> Value {
    let mut spec = json!({
        "policyRef": {"name": "reports"}, "capability": "sampling", "clients": ["c"],
        "purpose": "summaries", "modelRoute": "gateway/summaries", "limits": {"maxTokens": 1, "maxIterationsPerTask": 1,
        "maxRequestsPerMinute": 1}, "notBefore": "2026-12-01T00:00:00Z",
        "expiresAt": "2026-12-15T00:00:00Z", "approvalId": "CHG-1", "signature": "h..s",
    });
    merge(&mut spec, spec_extra);
    json!({"apiVersion": "lifeguard.dev/v1alpha1", "kind": "CapabilityException",
           "metadata": {"name": "e", "namespace": "team-a"}, "spec": spec})
}

fn revocation(spec_extra: Value) -> Value {
    let mut spec = json!({
        "issuer": "https://idp", "subject": "alice", "revokedBefore": "2026-11-30T09:00:00Z",
        "reason": "sessionRevoked", "source": {"kind": "manual"},
    });
    merge(&mut spec, spec_extra);
    json!({"apiVersion": "lifeguard.dev/v1alpha1", "kind": "PrincipalRevocation",
           "metadata": {"name": "r"}, "spec": spec})
}

/// Deep-merges `patch` into `base`; `null` in the patch removes the key.
fn merge(base: &mut Value, patch: Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    b.remove(&k);
                } else {
                    merge(b.entry(k).or_insert(Value::Null), v);
                }
            }
        }
        (b, p) => *b = p,
    }
}

/// Messages of the CEL rules that fail for `object` (with `old` for transition rules).
fn failing(object: &Value, old: Option<&Value>) -> Vec<String> {
    let kind = object["kind"].as_str().unwrap();
    match Validator::new().validate(&schema_of(kind), object, old) {
        Ok(()) => vec![],
        Err(errors) => errors.iter().map(|e| e.message.clone()).collect(),
    }
}

struct Case {
    name: &'static str,
    object: Value,
    old: Option<Value>,
    /// `None`: every rule passes.
    fails_with: Option<&'static str>,
}

fn cases() -> Vec<Case> {
    let case = |name, object, old, fails_with| Case {
        name,
        object,
        old,
        fails_with,
    };
    vec![
        case("minimal policy", policy(json!({})), None, None),
        case(
            "both jwks sources",
            policy(
                json!({"identity": {"issuers": [{"issuer": "i", "jwksUri": "https://u", "jwksFile": "f"}]}}),
            ),
            None,
            Some(rules::ISSUER_ONE_JWKS_SOURCE),
        ),
        case(
            "no jwks source",
            policy(json!({"identity": {"issuers": [{"issuer": "i"}]}})),
            None,
            Some(rules::ISSUER_ONE_JWKS_SOURCE),
        ),
        case(
            "required injection with a selector",
            policy(
                json!({"selector": {"matchLabels": {"app": "reports"}}, "injection": {"required": true}}),
            ),
            None,
            None,
        ),
        case(
            "required injection with an expression selector",
            policy(
                json!({"selector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]}, "injection": {"required": true}}),
            ),
            None,
            None,
        ),
        case(
            "optional injection with an empty selector",
            policy(json!({"injection": {"required": false}})),
            None,
            None,
        ),
        case(
            "required injection with an empty selector",
            policy(json!({"selector": {}, "injection": {"required": true}})),
            None,
            Some(rules::REQUIRED_INJECTION_NEEDS_SELECTOR),
        ),
        case(
            "maxTtl equal to defaultTtl",
            policy(json!({"tasks": {"retention": {"defaultTtl": "15m", "maxTtl": "900s"}}})),
            None,
            None,
        ),
        case(
            "maxTtl below defaultTtl",
            policy(json!({"tasks": {"retention": {"defaultTtl": "1h", "maxTtl": "15m"}}})),
            None,
            Some(rules::MAX_TTL_AT_LEAST_DEFAULT),
        ),
        case(
            "deadline max below default",
            policy(json!({"tasks": {"deadline": {"default": "3h", "max": "2h"}}})),
            None,
            Some(rules::DEADLINE_MAX_AT_LEAST_DEFAULT),
        ),
        case(
            "per-tool deadlines within max",
            policy(
                json!({"tasks": {"deadline": {"max": "2h", "perTool": {"a": "2h", "b": "30m"}}}}),
            ),
            None,
            None,
        ),
        case(
            "per-tool deadline over max",
            policy(
                json!({"tasks": {"deadline": {"max": "2h", "perTool": {"a": "1h", "b": "121m"}}}}),
            ),
            None,
            Some(rules::DEADLINE_PER_TOOL_WITHIN_MAX),
        ),
        case(
            "zero minPollInterval",
            policy(json!({"tasks": {"minPollInterval": "0s"}})),
            None,
            Some(rules::DURATION_POSITIVE),
        ),
        case(
            "zero idempotency window",
            policy(json!({"tasks": {"idempotency": {"window": "0ms"}}})),
            None,
            Some(rules::DURATION_POSITIVE),
        ),
        case(
            "result drop entries are JSON pointers",
            policy(json!({"tasks": {"results": {"redact": {"drop": ["/structuredContent/ssn"]}}}})),
            None,
            None,
        ),
        case(
            "result drop entry that is not a pointer",
            policy(json!({"tasks": {"results": {"redact": {"drop": ["structuredContent.ssn"]}}}})),
            None,
            Some(rules::REDACT_DROP_POINTER),
        ),
        case(
            "an object is named by a JSON pointer and the authorizer by an https URL",
            policy(json!({"tasks": {"objects": {
                "authorizer": {"url": "https://authz/access/v1/evaluation", "timeout": "2s", "cacheTtl": "0s"},
                "tools": {"report": {"pointer": "/projectId"}}}}})),
            None,
            None,
        ),
        case(
            "an object that is not a JSON pointer",
            policy(json!({"tasks": {"objects": {
                "authorizer": {"url": "https://authz/e"},
                "tools": {"report": {"pointer": "projectId"}}}}})),
            None,
            Some(rules::OBJECT_POINTER),
        ),
        case(
            "an authorizer over plain http beyond loopback",
            policy(json!({"tasks": {"objects": {
                "authorizer": {"url": "http://authz.svc/e"},
                "tools": {"report": {"pointer": "/p"}}}}})),
            None,
            Some(rules::AUTHORIZER_URL),
        ),
        case(
            "an authorizer on loopback over plain http",
            policy(json!({"tasks": {"objects": {
                "authorizer": {"url": "http://127.0.0.1:8181/access/v1/evaluation"},
                "tools": {"report": {"pointer": "/p"}}}}})),
            None,
            None,
        ),
        case(
            "an authorizer timeout beyond 30s",
            policy(json!({"tasks": {"objects": {
                "authorizer": {"url": "https://authz/e", "timeout": "31s"},
                "tools": {"report": {"pointer": "/p"}}}}})),
            None,
            Some(rules::AUTHORIZER_TIMEOUT),
        ),
        case(
            "an authorizer cache TTL beyond 10m",
            policy(json!({"tasks": {"objects": {
                "authorizer": {"url": "https://authz/e", "cacheTtl": "11m"},
                "tools": {"report": {"pointer": "/p"}}}}})),
            None,
            Some(rules::AUTHORIZER_CACHE_TTL),
        ),
        case(
            "a zero identity lease",
            policy(json!({"tasks": {"identityLease": "0s"}})),
            None,
            Some(rules::DURATION_POSITIVE),
        ),
        case(
            "zero max stream duration",
            policy(json!({"listen": {"maxStreamDuration": "0h"}})),
            None,
            Some(rules::DURATION_POSITIVE),
        ),
        case(
            "the contract's rate limits",
            policy(json!({"rateLimits": {
                "perPrincipal": {"requestsPerSecond": 10, "burst": 20},
                "perServer": {"requestsPerSecond": 1000, "burst": 2000},
                "tools": {"generate_report": {"perPrincipal": {"requestsPerSecond": 1, "burst": 2}},
                          ("t".repeat(128)): {"perClient": {"requestsPerSecond": 0.5}}}}})),
            None,
            None,
        ),
        case(
            "a rate limit for a tool with an empty name",
            policy(
                json!({"rateLimits": {"tools": {"": {"perPrincipal": {"requestsPerSecond": 1}}}}}),
            ),
            None,
            Some(rules::RATE_LIMIT_TOOL_NAME),
        ),
        case(
            "a rate limit for a tool name longer than 128 characters",
            policy(json!({"rateLimits": {"tools": {
                ("t".repeat(129)): {"perPrincipal": {"requestsPerSecond": 1}}}}})),
            None,
            Some(rules::RATE_LIMIT_TOOL_NAME),
        ),
        case(
            "audit file without path",
            policy(json!({"audit": {"sink": "file"}})),
            None,
            Some(rules::AUDIT_FILE_NEEDS_PATH),
        ),
        case(
            "audit file with path",
            policy(json!({"audit": {"sink": "file", "path": "/var/log/audit.jsonl"}})),
            None,
            None,
        ),
        case(
            "ledger secret reference",
            policy(
                json!({"ledger": {"connectionSecretRef": {"name": "reports-ledger.v2", "key": "DATABASE_URL"}}}),
            ),
            None,
            None,
        ),
        case(
            "ledger secret name with capitals and an underscore",
            policy(
                json!({"ledger": {"connectionSecretRef": {"name": "Reports_Ledger", "key": "url"}}}),
            ),
            None,
            Some(rules::SECRET_NAME_DNS_SUBDOMAIN),
        ),
        case(
            "ledger secret name ending in a dot",
            policy(json!({"ledger": {"connectionSecretRef": {"name": "reports.", "key": "url"}}})),
            None,
            Some(rules::SECRET_NAME_DNS_SUBDOMAIN),
        ),
        case(
            "ledger secret key with a slash",
            policy(
                json!({"ledger": {"connectionSecretRef": {"name": "reports-ledger", "key": "pg/url"}}}),
            ),
            None,
            Some(rules::SECRET_DATA_KEY),
        ),
        case(
            "ledger secret key starting with two dots",
            policy(
                json!({"ledger": {"connectionSecretRef": {"name": "reports-ledger", "key": "..data"}}}),
            ),
            None,
            Some(rules::SECRET_DATA_KEY),
        ),
        case(
            "shared upstream task state with a ledger",
            policy(
                json!({"upstream": {"taskState": "shared"}, "ledger": {"connectionSecretRef": {"name": "l", "key": "k"}}}),
            ),
            None,
            None,
        ),
        case(
            // Incoherent across replicas but harmless for one: `policy check` warns instead.
            "shared upstream task state without a ledger",
            policy(json!({"upstream": {"taskState": "shared"}})),
            None,
            None,
        ),
        case("valid exception", exception(json!({})), None, None),
        case(
            "sampling exception without a model route",
            exception(json!({"modelRoute": null})),
            None,
            Some(rules::SAMPLING_NEEDS_MODEL_ROUTE),
        ),
        case(
            "roots exception without a model route",
            exception(json!({"modelRoute": null, "capability": "roots"})),
            None,
            None,
        ),
        case(
            "exception expires before it starts",
            exception(json!({"expiresAt": "2026-11-01T00:00:00Z"})),
            None,
            Some(rules::EXCEPTION_EXPIRES_AFTER_NOT_BEFORE),
        ),
        case(
            "exception with an empty window",
            exception(json!({"expiresAt": "2026-12-01T00:00:00Z"})),
            None,
            Some(rules::EXCEPTION_EXPIRES_AFTER_NOT_BEFORE),
        ),
        case(
            "exception retargeted to another policy",
            exception(json!({"policyRef": {"name": "billing"}})),
            Some(exception(json!({}))),
            Some(rules::IMMUTABLE_POLICY_REF),
        ),
        case(
            "exception capability changed",
            exception(json!({"capability": "roots"})),
            Some(exception(json!({}))),
            Some(rules::IMMUTABLE_CAPABILITY),
        ),
        case(
            "exception limits updated",
            exception(json!({"limits": {"maxTokens": 5}})),
            Some(exception(json!({}))),
            None,
        ),
        case("valid revocation", revocation(json!({})), None, None),
        case(
            "security event without jti",
            revocation(
                json!({"source": {"kind": "securityEvent", "eventType": "t", "issuer": "i"}}),
            ),
            None,
            Some(rules::SECURITY_EVENT_SOURCE_FIELDS),
        ),
        case(
            "security event with its fields",
            revocation(
                json!({"source": {"kind": "securityEvent", "eventType": "t", "issuer": "i", "jti": "j"}}),
            ),
            None,
            None,
        ),
        case(
            "revocation naming nobody",
            revocation(json!({"subject": null})),
            None,
            Some(rules::REVOCATION_NAMES_SOMEONE),
        ),
        case(
            "a whole tenant",
            revocation(json!({"subject": null, "tenant": "t1"})),
            None,
            None,
        ),
        case(
            "a client application",
            revocation(json!({"subject": null, "client": "c1"})),
            None,
            None,
        ),
        case(
            "revoked subject removed",
            revocation(json!({"subject": null, "tenant": "t1"})),
            Some(revocation(json!({"tenant": "t1"}))),
            Some(rules::IMMUTABLE_REVOKED_IDENTITY),
        ),
        case(
            "revoked subject changed",
            revocation(json!({"subject": "bob"})),
            Some(revocation(json!({}))),
            Some(rules::IMMUTABLE_REVOKED_IDENTITY),
        ),
        case(
            "revoked tenant added",
            revocation(json!({"tenant": "t1"})),
            Some(revocation(json!({}))),
            Some(rules::IMMUTABLE_REVOKED_IDENTITY),
        ),
        case(
            "revoked client removed",
            revocation(json!({})),
            Some(revocation(json!({"client": "c1"}))),
            Some(rules::IMMUTABLE_REVOKED_IDENTITY),
        ),
        case(
            "revokedBefore moved later",
            revocation(json!({"revokedBefore": "2026-11-30T10:00:00Z"})),
            Some(revocation(json!({}))),
            None,
        ),
        case(
            "revokedBefore moved earlier",
            revocation(json!({"revokedBefore": "2026-11-30T08:00:00Z"})),
            Some(revocation(json!({}))),
            Some(rules::REVOKED_BEFORE_ONLY_LATER),
        ),
    ]
}

#[test]
fn each_cel_rule_passes_and_fails_where_it_should() {
    for case in cases() {
        let failures = failing(&case.object, case.old.as_ref());
        match case.fails_with {
            None => assert!(
                failures.is_empty(),
                "{}: unexpected {failures:?}",
                case.name
            ),
            Some(message) => assert_eq!(failures, vec![message.to_owned()], "{}", case.name),
        }
    }
}

#[test]
fn every_cel_rule_has_a_failing_case() {
    fn collect(schema: &Value, out: &mut BTreeSet<String>) {
        match schema {
            Value::Object(map) => {
                if let Some(Value::Array(rules)) = map.get("x-kubernetes-validations") {
                    for rule in rules {
                        out.insert(rule["message"].as_str().unwrap_or_default().to_owned());
                    }
                }
                map.values().for_each(|v| collect(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| collect(v, out)),
            _ => {}
        }
    }
    let mut in_crds = BTreeSet::new();
    for kind in [
        "McpServerPolicy",
        "CapabilityException",
        "PrincipalRevocation",
    ] {
        collect(&schema_of(kind), &mut in_crds);
    }
    let tested: BTreeSet<String> = cases()
        .into_iter()
        .filter_map(|c| c.fails_with.map(str::to_owned))
        .collect();
    let untested: Vec<_> = in_crds.difference(&tested).collect();
    assert!(
        untested.is_empty(),
        "CEL rules without a failing case: {untested:?}"
    );
}

/// What the OpenAPI schema (types, bounds, required fields; not CEL) says about `object`.
fn schema_violations(object: &Value) -> Vec<String> {
    let schema = schema_of(object["kind"].as_str().unwrap());
    let validator = jsonschema::validator_for(&schema).unwrap();
    validator
        .iter_errors(object)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

#[test]
fn rate_limit_bounds_are_in_the_schema() {
    let with_bucket = |bucket: Value| {
        policy(json!({"rateLimits": {
            "perPrincipal": bucket.clone(),
            "methods": {"taskReads": {"perTenant": bucket.clone()}},
            "tools": {"generate_report": {"perServer": bucket}}}}))
    };
    for ok in [
        json!({"requestsPerSecond": 10, "burst": 20}),
        json!({"requestsPerSecond": 0.001}),
        json!({"requestsPerSecond": 0.5, "burst": 1}),
        json!({"requestsPerSecond": 1_000_000, "burst": 1_000_000}),
    ] {
        let object = with_bucket(ok.clone());
        assert_eq!(schema_violations(&object), Vec::<String>::new(), "{ok}");
        assert_eq!(failing(&object, None), Vec::<String>::new(), "{ok}");
    }
    for bad in [
        json!({"requestsPerSecond": 0}),
        json!({"requestsPerSecond": -1}),
        json!({"requestsPerSecond": 0.0009}),
        json!({"requestsPerSecond": 1_000_001}),
        json!({"requestsPerSecond": "10"}),
        json!({"requestsPerSecond": 10, "burst": 0}),
        json!({"requestsPerSecond": 10, "burst": 1_000_001}),
        json!({"requestsPerSecond": 10, "burst": 1.5}),
        json!({"burst": 10}),
    ] {
        let violations = schema_violations(&with_bucket(bad.clone()));
        // Once per place the bucket is written: top level, method class, tool.
        assert_eq!(violations.len(), 3, "{bad}: {violations:?}");
        assert!(
            violations[0].starts_with("/spec/rateLimits/"),
            "{bad}: {violations:?}"
        );
    }
    let too_many: serde_json::Map<String, Value> = (0..257)
        .map(|i| {
            (
                format!("tool{i}"),
                json!({"perPrincipal": {"requestsPerSecond": 1}}),
            )
        })
        .collect();
    let object = policy(json!({"rateLimits": {"tools": too_many}}));
    assert_eq!(schema_violations(&object).len(), 1);
}
