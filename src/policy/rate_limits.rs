//! Request-rate limits as the sidecar enforces them (`spec.rateLimits`, compiled): token buckets
//! per principal, tenant, client and server, for every request, per method class and per tool.
//!
//! Pure: which buckets a request is charged against ([`RateLimitRules::buckets_for`]). Keeping
//! the buckets' levels is the sidecar's (`sidecar::rate_limit`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::mcp::methods;
use crate::model::Owner;

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

    fn scoped(&self) -> [(Scope, Option<Bucket>); 4] {
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
            methods::TOOLS_CALL => Some(Self::ToolsCall),
            methods::TASKS_GET | methods::TASKS_LIST | methods::TASKS_RESULT => {
                Some(Self::TaskReads)
            }
            methods::LISTEN => Some(Self::ListenOpens),
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

/// Which family of limits a bucket belongs to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// Every request.
    All,
    Method(MethodClass),
    /// `tools/call` of one tool.
    Tool(String),
}

impl Family {
    /// The bounded label of the family (metrics, audit): `all`, the method class's label, or
    /// `tool` (never the tool's name).
    pub fn label(&self) -> &'static str {
        match self {
            Self::All => "all",
            Self::Method(class) => class.label(),
            Self::Tool(_) => "tool",
        }
    }
}

/// One bucket a request is charged against: the family and scope it belongs to, the key of
/// the bucket within them (empty for the server scope) and its shape.
#[derive(Clone, Debug, PartialEq)]
pub struct Charge {
    pub family: Family,
    pub scope: Scope,
    /// Identifies the counted party within the scope: issuer and subject, tenant or client,
    /// joined with NUL (which no claim holds); empty for the server.
    pub key: String,
    pub bucket: Bucket,
}

impl Charge {
    /// The bucket's identity across processes: family, scope and key in one string.
    pub fn bucket_id(&self) -> String {
        let family = match &self.family {
            Family::All => "all".to_owned(),
            Family::Method(class) => format!("method:{}", class.label()),
            Family::Tool(tool) => format!("tool:{tool}"),
        };
        format!("{family}\u{1}{}\u{1}{}", self.scope.label(), self.key)
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

impl RateLimitRules {
    /// Every bucket a request of `method` (for `tools/call`, of `tool`) by `owner` is charged
    /// against, in a fixed order (family, then scope).
    pub fn buckets_for(&self, owner: &Owner, method: &str, tool: Option<&str>) -> Vec<Charge> {
        let mut charges = Vec::new();
        let mut add = |family: Family, buckets: &ScopedBuckets| {
            for (scope, bucket) in buckets.scoped() {
                let Some(bucket) = bucket else { continue };
                let key = match scope {
                    Scope::Principal => format!("{}\0{}", owner.issuer, owner.subject),
                    Scope::Tenant if owner.tenant.is_empty() => continue,
                    Scope::Tenant => format!("{}\0{}", owner.issuer, owner.tenant),
                    Scope::Client if owner.client.is_empty() => continue,
                    Scope::Client => format!("{}\0{}", owner.issuer, owner.client),
                    Scope::Server => String::new(),
                };
                charges.push(Charge {
                    family: family.clone(),
                    scope,
                    key,
                    bucket,
                });
            }
        };
        add(Family::All, &self.all);
        if let Some(class) = MethodClass::of(method)
            && let Some(buckets) = self.methods.get(&class)
        {
            add(Family::Method(class), buckets);
        }
        if method == methods::TOOLS_CALL
            && let Some(tool) = tool
            && let Some(buckets) = self.tools.get(tool)
        {
            add(Family::Tool(tool.to_owned()), buckets);
        }
        charges
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(rps: f64, burst: u32) -> Option<Bucket> {
        Some(Bucket {
            requests_per_second: rps,
            burst,
        })
    }

    fn owner(tenant: &str, client: &str) -> Owner {
        Owner {
            issuer: "https://idp".into(),
            subject: "alice".into(),
            tenant: tenant.into(),
            client: client.into(),
        }
    }

    fn rules() -> RateLimitRules {
        RateLimitRules {
            all: ScopedBuckets {
                per_principal: bucket(10.0, 20),
                per_tenant: bucket(100.0, 200),
                per_client: bucket(50.0, 100),
                per_server: bucket(1000.0, 2000),
            },
            methods: BTreeMap::from([(
                MethodClass::TaskReads,
                ScopedBuckets {
                    per_principal: bucket(5.0, 5),
                    ..ScopedBuckets::default()
                },
            )]),
            tools: BTreeMap::from([(
                "generate_report".to_owned(),
                ScopedBuckets {
                    per_principal: bucket(1.0, 2),
                    ..ScopedBuckets::default()
                },
            )]),
        }
    }

    fn described(charges: &[Charge]) -> Vec<(String, &'static str)> {
        charges
            .iter()
            .map(|c| (c.family.label().to_owned(), c.scope.label()))
            .collect()
    }

    #[test]
    fn a_tool_call_is_charged_to_every_family_that_names_it() {
        let charges = rules().buckets_for(&owner("t", "c"), "tools/call", Some("generate_report"));
        assert_eq!(
            described(&charges),
            [
                ("all".into(), "principal"),
                ("all".into(), "tenant"),
                ("all".into(), "client"),
                ("all".into(), "server"),
                ("tool".into(), "principal"),
            ]
        );
        assert_eq!(charges[0].key, "https://idp\0alice");
        assert_eq!(charges[3].key, "");
        // Another tool is not charged to generate_report's bucket.
        let other = rules().buckets_for(&owner("t", "c"), "tools/call", Some("greet"));
        assert_eq!(other.len(), 4);
    }

    #[test]
    fn polls_are_charged_to_task_reads_and_other_methods_only_to_all() {
        let polls = rules().buckets_for(&owner("t", "c"), "tasks/get", None);
        assert_eq!(
            polls.last().unwrap().family,
            Family::Method(MethodClass::TaskReads)
        );
        assert_eq!(polls.len(), 5);
        let listing = rules().buckets_for(&owner("t", "c"), "tools/list", None);
        assert_eq!(listing.len(), 4);
        // A tool name on another method does not select tool limits.
        let odd = rules().buckets_for(&owner("t", "c"), "prompts/get", Some("generate_report"));
        assert_eq!(odd.len(), 4);
    }

    #[test]
    fn without_a_tenant_or_client_claim_those_scopes_are_not_counted() {
        let charges = rules().buckets_for(&owner("", ""), "tools/list", None);
        assert_eq!(
            described(&charges),
            [("all".into(), "principal"), ("all".into(), "server")]
        );
    }

    #[test]
    fn bucket_ids_keep_families_scopes_and_parties_apart() {
        let charges = rules().buckets_for(&owner("t", "c"), "tools/call", Some("generate_report"));
        let ids: std::collections::BTreeSet<String> =
            charges.iter().map(Charge::bucket_id).collect();
        assert_eq!(ids.len(), charges.len());
    }

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
}
