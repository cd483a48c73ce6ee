//! Request-rate limits as the sidecar enforces them (`spec.rateLimits`, compiled): token buckets
//! per principal, tenant, client and server, for every request, per method class and per tool.
//!
//! Pure data: which buckets a request is charged against and keeping their levels is the
//! sidecar's (`sidecar::rate_limit`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One token bucket: `requests_per_second` tokens a second, up to `burst` held. A request takes
/// one token; without one it is refused until the next token is due.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bucket {
    pub requests_per_second: f64,
    pub burst: u32,
}

impl Bucket {
    /// Milliseconds until `missing` more tokens are due (at least 1 when any is missing).
    pub fn wait_ms(&self, missing: f64) -> u64 {
        if missing <= 0.0 {
            return 0;
        }
        let ms = (missing / self.requests_per_second * 1000.0).ceil();
        // Rates are at least 0.001 a second and bursts at most 10^6: far below u64::MAX.
        (ms as u64).max(1)
    }
}

/// The four buckets of one family of limits; `None` is no limit at that scope.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScopedBuckets {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_principal: Option<Bucket>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_tenant: Option<Bucket>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_client: Option<Bucket>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_server: Option<Bucket>,
}

impl ScopedBuckets {
    pub fn is_empty(&self) -> bool {
        self.per_principal.is_none()
            && self.per_tenant.is_none()
            && self.per_client.is_none()
            && self.per_server.is_none()
    }

    /// The four buckets with their scopes.
    pub fn scoped(&self) -> [(Scope, Option<Bucket>); 4] {
        [
            (Scope::Principal, self.per_principal),
            (Scope::Tenant, self.per_tenant),
            (Scope::Client, self.per_client),
            (Scope::Server, self.per_server),
        ]
    }
}

/// The classes of requests a method limit applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum MethodClass {
    /// `tools/call`.
    ToolsCall,
    /// `tasks/get`, `tasks/list`, `tasks/result`: polling.
    TaskReads,
    /// `subscriptions/listen`: opening a stream.
    ListenOpens,
}

impl MethodClass {
    /// The class of `method`, if it has one.
    pub fn of(method: &str) -> Option<Self> {
        match method {
            "tools/call" => Some(Self::ToolsCall),
            "tasks/get" | "tasks/list" | "tasks/result" => Some(Self::TaskReads),
            "subscriptions/listen" => Some(Self::ListenOpens),
            _ => None,
        }
    }

    /// The label of limits of this class (metrics, audit): `tools_call`, `task_reads`,
    /// `listen_opens`.
    pub fn label(self) -> &'static str {
        match self {
            Self::ToolsCall => "tools_call",
            Self::TaskReads => "task_reads",
            Self::ListenOpens => "listen_opens",
        }
    }
}

/// Whose requests a bucket counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// One issuer + subject.
    Principal,
    /// One issuer + tenant (requests without a tenant are not counted here).
    Tenant,
    /// One issuer + OAuth client (requests without a client are not counted here).
    Client,
    /// Everyone.
    Server,
}

impl Scope {
    pub fn label(self) -> &'static str {
        match self {
            Self::Principal => "principal",
            Self::Tenant => "tenant",
            Self::Client => "client",
            Self::Server => "server",
        }
    }
}

/// `spec.rateLimits` with nothing left implicit.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RateLimitRules {
    /// Charged for every request.
    #[serde(default, skip_serializing_if = "ScopedBuckets::is_empty")]
    pub all: ScopedBuckets,
    /// Charged for the requests of a method class, in addition.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub methods: BTreeMap<MethodClass, ScopedBuckets>,
    /// Charged for `tools/call` of one tool, in addition.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tools: BTreeMap<String, ScopedBuckets>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_round_up_to_whole_milliseconds() {
        let b = Bucket {
            requests_per_second: 3.0,
            burst: 1,
        };
        assert_eq!(b.wait_ms(0.0), 0);
        assert_eq!(b.wait_ms(1.0), 334);
        assert_eq!(b.wait_ms(0.0001), 1);
    }

    #[test]
    fn no_rules_serialize_to_nothing_so_existing_policy_hashes_stay() {
        assert_eq!(
            serde_json::to_string(&RateLimitRules::default()).unwrap(),
            "{}"
        );
    }

    #[test]
    fn method_classes_name_their_methods() {
        assert_eq!(MethodClass::of("tools/call"), Some(MethodClass::ToolsCall));
        for read in ["tasks/get", "tasks/list", "tasks/result"] {
            assert_eq!(MethodClass::of(read), Some(MethodClass::TaskReads));
        }
        assert_eq!(
            MethodClass::of("subscriptions/listen"),
            Some(MethodClass::ListenOpens)
        );
        assert_eq!(MethodClass::of("tasks/cancel"), None);
    }
}
