//! `spec.rateLimits` ⇒ [`RateLimitRules`]: the problems a policy's limits can have, each with
//! its field path, and the compiled buckets with every burst made explicit.

use crate::api::rate_limits::{
    BucketSpec, MAX_BURST, MAX_REQUESTS_PER_SECOND, MAX_TOOL_NAME_CHARS, MIN_REQUESTS_PER_SECOND,
    RateLimitsSpec, ScopedLimitsSpec,
};
use crate::api::rules;

use super::problem::Problems;
use super::rate_limits::{Bucket, MethodClass, RateLimitRules, ScopedBuckets};

/// Message of a rate outside 0.001..=1000000 (or not a number at all: YAML's `.nan`, `.inf`).
pub const RATE_OUT_OF_RANGE: &str = "must be a number of requests per second from 0.001 to 1000000";
/// Message of a burst outside 1..=1000000.
pub const BURST_OUT_OF_RANGE: &str = "must be from 1 to 1000000";

/// The burst of a bucket that states none: the rate rounded up, at least 1.
pub fn default_burst(requests_per_second: f64) -> u32 {
    // A valid rate is at most 10^6, so the cast never saturates; `clamp` keeps it so anyway.
    requests_per_second.ceil().clamp(1.0, f64::from(MAX_BURST)) as u32
}

fn bucket(spec: &BucketSpec) -> Bucket {
    Bucket {
        requests_per_second: spec.requests_per_second,
        burst: spec
            .burst
            .unwrap_or_else(|| default_burst(spec.requests_per_second)),
    }
}

fn scoped(spec: &ScopedLimitsSpec) -> ScopedBuckets {
    ScopedBuckets {
        per_principal: spec.per_principal.as_ref().map(bucket),
        per_tenant: spec.per_tenant.as_ref().map(bucket),
        per_client: spec.per_client.as_ref().map(bucket),
        per_server: spec.per_server.as_ref().map(bucket),
    }
}

/// The compiled limits; `None` when the spec names no bucket at all, so a policy without
/// limits (or with an empty `rateLimits`) keeps its hash. Expects a spec without errors.
pub fn compile_rate_limits(spec: &RateLimitsSpec) -> Option<RateLimitRules> {
    let methods = spec.methods.as_ref().map_or_else(Default::default, |m| {
        [
            (MethodClass::ToolsCall, &m.tools_call),
            (MethodClass::TaskReads, &m.task_reads),
            (MethodClass::ListenOpens, &m.listen_opens),
        ]
        .into_iter()
        .filter_map(|(class, limits)| Some((class, scoped(limits.as_ref()?))))
        .filter(|(_, buckets)| !buckets.is_empty())
        .collect()
    });
    let tools = spec
        .tools
        .iter()
        .flatten()
        .map(|(tool, limits)| (tool.clone(), scoped(limits)))
        .filter(|(_, buckets)| !buckets.is_empty())
        .collect();
    let rules = RateLimitRules {
        all: scoped(&spec.top_level()),
        methods,
        tools,
    };
    let empty = rules.all.is_empty() && rules.methods.is_empty() && rules.tools.is_empty();
    (!empty).then_some(rules)
}

/// Which requests a family of buckets is charged for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Family<'a> {
    All,
    Method(&'a str),
    Tool(&'a str),
}

impl Family<'_> {
    /// Whether every request charged to `narrow` is charged to `self` too.
    fn covers(self, narrow: Family<'_>) -> bool {
        match (self, narrow) {
            (Family::All, _) => true,
            (Family::Method("toolsCall"), Family::Tool(_)) => true,
            (Family::Method(a), Family::Method(b)) | (Family::Tool(a), Family::Tool(b)) => a == b,
            _ => false,
        }
    }
}

const SERVER: &str = "perServer";

/// One bucket as written, for the comparisons between buckets.
struct Written<'a> {
    family: Family<'a>,
    scope: &'static str,
    /// Relative to `spec.rateLimits`: `perServer`, `methods.taskReads.perPrincipal`, ….
    name: String,
    bucket: Bucket,
}

/// Checks `spec.rateLimits`: rates, bursts, tool names; warns about entries that limit nothing
/// and buckets that can never refuse a request a wider bucket would admit.
pub fn validate_rate_limits(spec: &RateLimitsSpec, p: &mut Problems) {
    const BASE: &str = "spec.rateLimits";
    let mut written = Vec::new();
    let mut any = check_scoped(&spec.top_level(), Family::All, "", p, &mut written);
    for (class, limits) in spec.methods.iter().flat_map(|m| m.classes()) {
        let Some(limits) = limits else { continue };
        let prefix = format!("methods.{class}.");
        if check_scoped(limits, Family::Method(class), &prefix, p, &mut written) {
            any = true;
        } else {
            p.warning(format!("{BASE}.methods.{class}"), NO_BUCKET);
        }
    }
    if let Some(tools) = &spec.tools {
        if tools
            .keys()
            .any(|t| !(1..=MAX_TOOL_NAME_CHARS).contains(&t.chars().count()))
        {
            p.error(format!("{BASE}.tools"), rules::RATE_LIMIT_TOOL_NAME);
        }
        for (tool, limits) in tools {
            let prefix = format!("tools.{tool}.");
            check_tool_name(tool, &format!("{BASE}.tools.{tool}"), p);
            if check_scoped(limits, Family::Tool(tool), &prefix, p, &mut written) {
                any = true;
            } else {
                p.warning(format!("{BASE}.tools.{tool}"), NO_BUCKET);
            }
        }
    }
    if !any {
        p.warning(BASE, "names no bucket, so no request is limited");
    }
    for narrow in &written {
        let wider = written.iter().find(|wide| {
            !std::ptr::eq(*wide, narrow)
                && wide.family.covers(narrow.family)
                && (wide.scope == narrow.scope || wide.scope == SERVER)
                && wide.bucket.requests_per_second <= narrow.bucket.requests_per_second
                && wide.bucket.burst <= narrow.bucket.burst
        });
        if let Some(wide) = wider {
            p.warning(
                format!("{BASE}.{}", narrow.name),
                format!(
                    "never refuses a request on its own: {} ({}/s, burst {}) is charged for every request this bucket is and is at least as tight",
                    wide.name, wide.bucket.requests_per_second, wide.bucket.burst
                ),
            );
        }
    }
}

const NO_BUCKET: &str = "names no bucket, so it limits nothing";

/// Checks the buckets of one family and records the valid ones; whether it has any bucket.
fn check_scoped<'a>(
    limits: &ScopedLimitsSpec,
    family: Family<'a>,
    prefix: &str,
    p: &mut Problems,
    written: &mut Vec<Written<'a>>,
) -> bool {
    let mut any = false;
    for (scope, spec) in limits.buckets() {
        let Some(spec) = spec else { continue };
        any = true;
        let name = format!("{prefix}{scope}");
        let rate = spec.requests_per_second;
        let mut ok = true;
        if !(rate.is_finite()
            && (MIN_REQUESTS_PER_SECOND..=MAX_REQUESTS_PER_SECOND).contains(&rate))
        {
            p.error(
                format!("spec.rateLimits.{name}.requestsPerSecond"),
                RATE_OUT_OF_RANGE,
            );
            ok = false;
        }
        if spec.burst.is_some_and(|b| !(1..=MAX_BURST).contains(&b)) {
            p.error(format!("spec.rateLimits.{name}.burst"), BURST_OUT_OF_RANGE);
            ok = false;
        }
        if ok {
            written.push(Written {
                family,
                scope,
                name,
                bucket: bucket(spec),
            });
        }
    }
    any
}

/// A limit for a tool is an error when its name cannot be a tool name at all (whitespace or
/// control characters), and a warning when it strays from the characters the MCP specification
/// recommends (the server may still name a tool so). The length is the CEL rule's.
fn check_tool_name(tool: &str, path: &str, p: &mut Problems) {
    if tool.is_empty() {
        return;
    }
    if tool.chars().any(|c| c.is_whitespace() || c.is_control()) {
        p.error(
            path,
            "is not a tool name: tool names have no spaces or control characters",
        );
    } else if !tool
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    {
        p.warning(
            path,
            "has characters MCP tool names should not have (only ASCII letters, digits, '_', '-' and '.'): the limit applies only if the server names a tool exactly so",
        );
    }
}

#[cfg(test)]
#[path = "compile_rate_limits_tests.rs"]
mod tests;
