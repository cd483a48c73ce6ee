//! Object-level permission (`tasks.objects`): a task is bound to the owner and the tool, and,
//! for tools whose arguments name an object (a project, a repository, a customer), to that
//! object. The object is read from the arguments at creation and stored with the task; an
//! external decision point is asked about it at creation and on every later get, update,
//! cancel, result read and listen delivery, so a user who loses access to the object mid-run
//! stops seeing the task from the next request on (within the decision cache's TTL).
//!
//! Guarantees:
//! - Fail closed: no answer, a non-2xx answer, an answer without a boolean decision, a timeout,
//!   or a task of a listed tool without a recorded object all refuse the operation.
//! - Only explicit answers are cached ([`cache`]), bounded in time and size; errors never are.
//! - The authorizer is asked only after the ownership check passed, so its answer never tells
//!   a stranger anything about someone else's task; a refusal is the uniform "Task not found".
//! - Administrators cancelling another principal's task (`adminCancelScope`) are not asked
//!   about: the scope is the grant.

mod cache;
pub mod wire;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::identity::Identity;
use crate::ledger::TaskRecord;
use crate::policy::{AuthorizerRules, ObjectRules};
use crate::telemetry::metrics::{ObjectDecisionLabels, SidecarMetrics};
use crate::telemetry::spans;

use cache::DecisionCache;
pub use wire::object_of;

/// The operation asked about (`action.name` / `verb`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Create,
    Read,
    Update,
    Cancel,
    Result,
    Listen,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Read => "read",
            Self::Update => "update",
            Self::Cancel => "cancel",
            Self::Result => "result",
            Self::Listen => "listen",
        }
    }
}

/// One question to the authorizer: may this principal do this to this object?
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Question {
    pub issuer: String,
    pub subject: String,
    pub tenant: String,
    pub client: String,
    pub tool: String,
    pub resource_type: String,
    pub object: String,
    pub action: Action,
}

/// The outcome of asking.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing to ask (the tool names no object), or the authorizer allowed it.
    Allow,
    /// Refused; the reason goes to the audit trail and metrics (`object_denied`,
    /// `object_unknown` for a task of a listed tool without a recorded object).
    Deny(&'static str),
    /// The authorizer could not decide (fail closed); the error is logged.
    Unavailable(String),
}

impl Verdict {
    pub fn allowed(&self) -> bool {
        *self == Self::Allow
    }

    /// The reason of a refusal (`authorizer_unavailable` when no decision was had).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Allow => "allowed",
            Self::Deny(reason) => reason,
            Self::Unavailable(_) => "authorizer_unavailable",
        }
    }
}

/// One authorizer configuration: its HTTP client and its decisions.
struct Authorizer {
    rules: AuthorizerRules,
    /// `Err` when the configuration cannot be used (an unreadable CA file): every question is
    /// answered unavailable.
    http: Result<reqwest::Client, String>,
    cache: DecisionCache,
}

impl Authorizer {
    fn new(rules: &AuthorizerRules) -> Self {
        Self {
            rules: rules.clone(),
            http: build_client(rules),
            cache: DecisionCache::new(rules.cache_ttl.get(), rules.cache_size as usize),
        }
    }
}

fn build_client(rules: &AuthorizerRules) -> Result<reqwest::Client, String> {
    let ca_files: Vec<std::path::PathBuf> = rules.ca_file.iter().map(Into::into).collect();
    let tls = crate::runtime::tls_client::client_config(&ca_files).map_err(|e| e.to_string())?;
    reqwest::Client::builder()
        .user_agent(concat!("lifeguard-sidecar/", env!("CARGO_PKG_VERSION")))
        .redirect(reqwest::redirect::Policy::none())
        .tls_backend_preconfigured(tls)
        .timeout(rules.timeout.get())
        .connect_timeout(rules.timeout.get())
        .pool_idle_timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| format!("cannot build the authorizer client: {e}"))
}

/// Asks the object authorizer, through a cache that belongs to the authorizer configuration in
/// force.
#[derive(Default)]
pub struct ObjectGate {
    current: Mutex<Option<Arc<Authorizer>>>,
}

impl ObjectGate {
    /// The authorizer for `rules`: the one in use when they are unchanged, else a new one (with
    /// an empty cache).
    fn authorizer(&self, rules: &AuthorizerRules) -> Arc<Authorizer> {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        match current.as_ref() {
            Some(a) if a.rules == *rules => a.clone(),
            _ => {
                let fresh = Arc::new(Authorizer::new(rules));
                *current = Some(fresh.clone());
                fresh
            }
        }
    }

    /// May `identity` do `action` to the object of `record`? Tasks of tools the policy names no
    /// object for are allowed without asking.
    pub async fn for_task(
        &self,
        rules: Option<&ObjectRules>,
        server: &str,
        identity: &Identity,
        record: &TaskRecord,
        action: Action,
        metrics: &SidecarMetrics,
    ) -> Verdict {
        let Some(rules) = rules else {
            return Verdict::Allow;
        };
        let Some(pointer) = rules.for_tool(&record.tool) else {
            return Verdict::Allow;
        };
        let Some(object) = record.object.as_deref() else {
            // Created before the tool named an object: nothing to ask about, so refused.
            count(metrics, "deny", "unknown_object");
            return Verdict::Deny("object_unknown");
        };
        let question = question(
            identity,
            &record.tool,
            &pointer.resource_type,
            object,
            action,
        );
        self.decide(&rules.authorizer, server, question, metrics)
            .await
    }

    /// Asks `question` (or answers it from the cache).
    pub async fn decide(
        &self,
        rules: &AuthorizerRules,
        server: &str,
        question: Question,
        metrics: &SidecarMetrics,
    ) -> Verdict {
        let authorizer = self.authorizer(rules);
        let span = spans::authorizer(question.action.as_str());
        if let Some(allowed) = authorizer.cache.get(&question, Instant::now()) {
            let decision = if allowed { "allow" } else { "deny" };
            span.decided("cache", decision);
            count(metrics, decision, "cache");
            return verdict(allowed);
        }
        let started = Instant::now();
        let answer = {
            let asked = std::pin::pin!(ask(&authorizer, server, &question));
            span.run(asked).await
        };
        metrics
            .authorizer_seconds
            .observe(started.elapsed().as_secs_f64());
        match answer {
            Ok(allowed) => {
                authorizer.cache.insert(question, allowed, Instant::now());
                let decision = if allowed { "allow" } else { "deny" };
                span.decided("authorizer", decision);
                count(metrics, decision, "authorizer");
                verdict(allowed)
            }
            Err(error) => {
                span.decided("authorizer", "error");
                count(metrics, "error", "authorizer");
                tracing::warn!(%error, url = %rules.url, "the object authorizer gave no decision; refusing (fail closed)");
                Verdict::Unavailable(error)
            }
        }
    }
}

/// The question about `object` of `tool` asked for `identity`.
pub fn question(
    identity: &Identity,
    tool: &str,
    resource_type: &str,
    object: &str,
    action: Action,
) -> Question {
    let owner = &identity.owner;
    Question {
        issuer: owner.issuer.clone(),
        subject: owner.subject.clone(),
        tenant: owner.tenant.clone(),
        client: owner.client.clone(),
        tool: tool.to_owned(),
        resource_type: resource_type.to_owned(),
        object: object.to_owned(),
        action,
    }
}

fn verdict(allowed: bool) -> Verdict {
    if allowed {
        Verdict::Allow
    } else {
        Verdict::Deny("object_denied")
    }
}

fn count(metrics: &SidecarMetrics, decision: &'static str, source: &'static str) {
    metrics
        .object_decisions
        .get_or_create(&ObjectDecisionLabels { decision, source })
        .inc();
}

/// Largest authorizer answer read.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

async fn ask(authorizer: &Authorizer, server: &str, question: &Question) -> Result<bool, String> {
    let http = authorizer.http.as_ref().map_err(Clone::clone)?;
    let rules = &authorizer.rules;
    let body = wire::request_body(rules.format, question, server);
    let mut request = http
        .post(&rules.url)
        .headers(spans::current_context_headers())
        .json(&body);
    if let Some(path) = &rules.token_file {
        let token = tokio::fs::read_to_string(path)
            .await
            .map_err(|e| format!("cannot read the authorizer token file {path}: {e}"))?;
        request = request.bearer_auth(token.trim());
    }
    let response = request
        .send()
        .await
        .map_err(|e| format!("asking the authorizer failed: {e}"))?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("the authorizer answered HTTP {status}"));
    }
    if response
        .content_length()
        .is_some_and(|n| n > MAX_ANSWER_BYTES as u64)
    {
        return Err("the authorizer's answer is too large".into());
    }
    let bytes = response
        .bytes()
        .await
        .map_err(|e| format!("reading the authorizer's answer failed: {e}"))?;
    if bytes.len() > MAX_ANSWER_BYTES {
        return Err("the authorizer's answer is too large".into());
    }
    wire::decision(rules.format, &bytes).map_err(|e| e.to_string())
}
