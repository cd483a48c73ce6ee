//! Which buckets a request is charged against (pure): every family of `spec.rateLimits` that
//! applies to it — the top-level buckets for every request, its method class's, and for
//! `tools/call` its tool's — at each scope that counts its caller.

use crate::mcp::methods;
use crate::model::Owner;
use crate::policy::rate_limits::{Bucket, MethodClass, RateLimitRules, Scope, ScopedBuckets};

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

/// Every bucket a request of `method` (for `tools/call`, of `tool`) by `owner` is charged
/// against under `rules`, in a fixed order (family, then scope).
pub fn charges_for(
    rules: &RateLimitRules,
    owner: &Owner,
    method: &str,
    tool: Option<&str>,
) -> Vec<Charge> {
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
    add(Family::All, &rules.all);
    if let Some(class) = MethodClass::of(method)
        && let Some(buckets) = rules.methods.get(&class)
    {
        add(Family::Method(class), buckets);
    }
    if method == methods::TOOLS_CALL
        && let Some(tool) = tool
        && let Some(buckets) = rules.tools.get(tool)
    {
        add(Family::Tool(tool.to_owned()), buckets);
    }
    charges
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

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
        let charges = charges_for(
            &rules(),
            &owner("t", "c"),
            "tools/call",
            Some("generate_report"),
        );
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
        let other = charges_for(&rules(), &owner("t", "c"), "tools/call", Some("greet"));
        assert_eq!(other.len(), 4);
    }

    #[test]
    fn polls_are_charged_to_task_reads_and_other_methods_only_to_all() {
        let polls = charges_for(&rules(), &owner("t", "c"), "tasks/get", None);
        assert_eq!(
            polls.last().unwrap().family,
            Family::Method(MethodClass::TaskReads)
        );
        assert_eq!(polls.len(), 5);
        let listing = charges_for(&rules(), &owner("t", "c"), "tools/list", None);
        assert_eq!(listing.len(), 4);
        // A tool name on another method does not select tool limits.
        let odd = charges_for(
            &rules(),
            &owner("t", "c"),
            "prompts/get",
            Some("generate_report"),
        );
        assert_eq!(odd.len(), 4);
    }

    #[test]
    fn without_a_tenant_or_client_claim_those_scopes_are_not_counted() {
        let charges = charges_for(&rules(), &owner("", ""), "tools/list", None);
        assert_eq!(
            described(&charges),
            [("all".into(), "principal"), ("all".into(), "server")]
        );
    }

    #[test]
    fn bucket_ids_keep_families_scopes_and_parties_apart() {
        let charges = charges_for(
            &rules(),
            &owner("t", "c"),
            "tools/call",
            Some("generate_report"),
        );
        let ids: std::collections::BTreeSet<String> =
            charges.iter().map(Charge::bucket_id).collect();
        assert_eq!(ids.len(), charges.len());
    }
}
