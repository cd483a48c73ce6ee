//! `subscriptions/listen`: the filter a client asks for, what the policy allows of it, the
//! acknowledgement, and what each event on the stream is. Pure.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use crate::api::ListenNotification;
use crate::model::Owner;
use crate::policy::{ListenRules, PatternIdentity};

use super::meta;

/// Notification methods a listen stream may carry.
pub mod events {
    pub const ACKNOWLEDGED: &str = "notifications/subscriptions/acknowledged";
    pub const TOOLS_LIST_CHANGED: &str = "notifications/tools/list_changed";
    pub const PROMPTS_LIST_CHANGED: &str = "notifications/prompts/list_changed";
    pub const RESOURCES_LIST_CHANGED: &str = "notifications/resources/list_changed";
    pub const RESOURCE_UPDATED: &str = "notifications/resources/updated";
    pub const TASKS: &str = crate::mcp::methods::NOTIFICATION_TASKS;
}

/// A listen filter (`params.notifications`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListenFilter {
    pub tools_list_changed: bool,
    pub prompts_list_changed: bool,
    pub resources_list_changed: bool,
    pub resource_subscriptions: BTreeSet<String>,
    pub task_ids: BTreeSet<String>,
}

/// Why a filter was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    #[error("params.notifications must be an object")]
    NotAnObject,
    #[error("unknown notification filter `{0}`")]
    UnknownKey(String),
    #[error("notification filter `{0}` has the wrong type")]
    WrongType(&'static str),
    #[error("taskIds requires the io.modelcontextprotocol/tasks extension")]
    TaskIdsWithoutExtension,
    #[error(
        "resource URI {0:?} has dot-segments, encoded separators or backslashes; subscribe to its normalized form"
    )]
    AmbiguousUri(String),
}

/// Whether a resource URI means the same to every reader: no `.`/`..` path segments, no
/// percent-encoded `/`, `\` or `.`, no backslashes. Patterns are matched on the text, so
/// `reports://a/../b/x` would otherwise pass `reports://a/*` and reach `b` at a server that
/// normalizes.
pub fn is_plain_resource_uri(uri: &str) -> bool {
    let lower = uri.to_ascii_lowercase();
    if uri.contains('\\') || ["%2f", "%5c", "%2e"].iter().any(|e| lower.contains(e)) {
        return false;
    }
    let path = uri.split_once("://").map_or(uri, |(_, rest)| rest);
    let path = path.split(['?', '#']).next().unwrap_or_default();
    !path
        .split('/')
        .any(|segment| segment == "." || segment == "..")
}

const MAX_ENTRIES: usize = 1024;

fn string_set(value: &Value, key: &'static str) -> Result<BTreeSet<String>, FilterError> {
    let items = value.as_array().ok_or(FilterError::WrongType(key))?;
    if items.len() > MAX_ENTRIES {
        return Err(FilterError::WrongType(key));
    }
    items
        .iter()
        .map(|v| {
            v.as_str()
                .map(str::to_owned)
                .ok_or(FilterError::WrongType(key))
        })
        .collect()
}

impl ListenFilter {
    /// Parses a client's filter strictly: unknown keys and wrong types are errors.
    pub fn parse_request(
        notifications: Option<&Value>,
        declares_tasks: bool,
    ) -> Result<Self, FilterError> {
        let object = notifications
            .and_then(Value::as_object)
            .ok_or(FilterError::NotAnObject)?;
        let mut filter = Self::default();
        for (key, value) in object {
            match key.as_str() {
                "toolsListChanged" => {
                    filter.tools_list_changed = value
                        .as_bool()
                        .ok_or(FilterError::WrongType("toolsListChanged"))?
                }
                "promptsListChanged" => {
                    filter.prompts_list_changed = value
                        .as_bool()
                        .ok_or(FilterError::WrongType("promptsListChanged"))?
                }
                "resourcesListChanged" => {
                    filter.resources_list_changed = value
                        .as_bool()
                        .ok_or(FilterError::WrongType("resourcesListChanged"))?
                }
                "resourceSubscriptions" => {
                    let uris = string_set(value, "resourceSubscriptions")?;
                    if let Some(bad) = uris.iter().find(|u| !is_plain_resource_uri(u)) {
                        return Err(FilterError::AmbiguousUri(bad.clone()));
                    }
                    filter.resource_subscriptions = uris
                }
                "taskIds" => {
                    if !declares_tasks {
                        return Err(FilterError::TaskIdsWithoutExtension);
                    }
                    filter.task_ids = string_set(value, "taskIds")?;
                }
                other => return Err(FilterError::UnknownKey(other.to_owned())),
            }
        }
        Ok(filter)
    }

    /// Reads an upstream acknowledgement leniently (unknown keys and bad entries ignored).
    pub fn parse_ack(notifications: Option<&Value>) -> Self {
        let Some(object) = notifications.and_then(Value::as_object) else {
            return Self::default();
        };
        let flag = |k: &str| object.get(k).and_then(Value::as_bool).unwrap_or(false);
        let set = |k: &str| -> BTreeSet<String> {
            object
                .get(k)
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        Self {
            tools_list_changed: flag("toolsListChanged"),
            prompts_list_changed: flag("promptsListChanged"),
            resources_list_changed: flag("resourcesListChanged"),
            resource_subscriptions: set("resourceSubscriptions"),
            task_ids: set("taskIds"),
        }
    }

    /// The part of this filter the policy allows the listener `who`. Task IDs are kept here;
    /// ownership is decided against the ledger by the caller.
    pub fn allowed_by(&self, rules: &ListenRules, who: &PatternIdentity<'_>) -> Self {
        let allows = |n: ListenNotification| rules.notifications.contains(&n);
        Self {
            tools_list_changed: self.tools_list_changed
                && allows(ListenNotification::ToolsListChanged),
            prompts_list_changed: self.prompts_list_changed
                && allows(ListenNotification::PromptsListChanged),
            resources_list_changed: self.resources_list_changed
                && allows(ListenNotification::ResourcesListChanged),
            resource_subscriptions: self
                .resource_subscriptions
                .iter()
                .filter(|uri| rules.allows_resource(uri, who))
                .cloned()
                .collect(),
            task_ids: if allows(ListenNotification::TaskIds) {
                self.task_ids.clone()
            } else {
                BTreeSet::new()
            },
        }
    }

    /// What both filters contain.
    pub fn intersect(&self, other: &Self) -> Self {
        Self {
            tools_list_changed: self.tools_list_changed && other.tools_list_changed,
            prompts_list_changed: self.prompts_list_changed && other.prompts_list_changed,
            resources_list_changed: self.resources_list_changed && other.resources_list_changed,
            resource_subscriptions: self
                .resource_subscriptions
                .intersection(&other.resource_subscriptions)
                .cloned()
                .collect(),
            task_ids: self
                .task_ids
                .intersection(&other.task_ids)
                .cloned()
                .collect(),
        }
    }

    /// Whether nothing at all is subscribed.
    pub fn is_empty(&self) -> bool {
        !self.tools_list_changed
            && !self.prompts_list_changed
            && !self.resources_list_changed
            && self.resource_subscriptions.is_empty()
            && self.task_ids.is_empty()
    }

    /// Whether everything in this filter is still allowed by `rules` for `who` (task IDs
    /// aside).
    pub fn still_allowed_by(&self, rules: &ListenRules, who: &PatternIdentity<'_>) -> bool {
        let allowed = self.allowed_by(rules, who);
        allowed.tools_list_changed == self.tools_list_changed
            && allowed.prompts_list_changed == self.prompts_list_changed
            && allowed.resources_list_changed == self.resources_list_changed
            && allowed.resource_subscriptions == self.resource_subscriptions
            && allowed.task_ids == self.task_ids
    }

    /// Whether a stream acknowledged with this filter may stay open under new `rules`: every
    /// notification kind and resource subscription must still be allowed, and task IDs need
    /// `taskIds` to still be listed.
    pub fn survives(&self, rules: &ListenRules, who: &PatternIdentity<'_>) -> bool {
        let mut without_tasks = self.clone();
        without_tasks.task_ids.clear();
        without_tasks.still_allowed_by(rules, who)
            && (self.task_ids.is_empty()
                || rules.notifications.contains(&ListenNotification::TaskIds))
    }

    /// The same filter with each task ID mapped (IDs mapped to `None` are dropped).
    pub fn map_task_ids(&self, map: impl Fn(&str) -> Option<String>) -> Self {
        let mut out = self.clone();
        out.task_ids = self.task_ids.iter().filter_map(|id| map(id)).collect();
        out
    }

    /// How many subscriptions the filter holds.
    pub fn entries(&self) -> usize {
        usize::from(self.tools_list_changed)
            + usize::from(self.prompts_list_changed)
            + usize::from(self.resources_list_changed)
            + self.resource_subscriptions.len()
            + self.task_ids.len()
    }

    /// The filter as `params.notifications` (only what is subscribed).
    pub fn to_wire(&self) -> Value {
        let mut m = Map::new();
        if self.tools_list_changed {
            m.insert("toolsListChanged".into(), json!(true));
        }
        if self.prompts_list_changed {
            m.insert("promptsListChanged".into(), json!(true));
        }
        if self.resources_list_changed {
            m.insert("resourcesListChanged".into(), json!(true));
        }
        if !self.resource_subscriptions.is_empty() {
            m.insert(
                "resourceSubscriptions".into(),
                json!(self.resource_subscriptions),
            );
        }
        if !self.task_ids.is_empty() {
            m.insert("taskIds".into(), json!(self.task_ids));
        }
        Value::Object(m)
    }
}

/// What an event on a listen stream is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenEvent {
    Acknowledged,
    ToolsListChanged,
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated(String),
    Task(String),
    /// Anything else (progress, logs, unknown): never delivered on a listen stream.
    Other,
}

/// Classifies an upstream message on a listen stream.
pub fn classify_event(message: &Value) -> ListenEvent {
    let params = message.get("params");
    match message.get("method").and_then(Value::as_str) {
        Some(events::ACKNOWLEDGED) => ListenEvent::Acknowledged,
        Some(events::TOOLS_LIST_CHANGED) => ListenEvent::ToolsListChanged,
        Some(events::PROMPTS_LIST_CHANGED) => ListenEvent::PromptsListChanged,
        Some(events::RESOURCES_LIST_CHANGED) => ListenEvent::ResourcesListChanged,
        Some(events::RESOURCE_UPDATED) => params
            .and_then(|p| p.get("uri"))
            .and_then(Value::as_str)
            .map(|u| ListenEvent::ResourceUpdated(u.to_owned()))
            .unwrap_or(ListenEvent::Other),
        Some(events::TASKS) => params
            .and_then(|p| p.get("taskId"))
            .and_then(Value::as_str)
            .map(|t| ListenEvent::Task(t.to_owned()))
            .unwrap_or(ListenEvent::Other),
        _ => ListenEvent::Other,
    }
}

impl ListenFilter {
    /// Whether an event of this kind is part of the subscription.
    pub fn admits(&self, event: &ListenEvent) -> bool {
        match event {
            ListenEvent::ToolsListChanged => self.tools_list_changed,
            ListenEvent::PromptsListChanged => self.prompts_list_changed,
            ListenEvent::ResourcesListChanged => self.resources_list_changed,
            ListenEvent::ResourceUpdated(uri) => self.resource_subscriptions.contains(uri),
            ListenEvent::Task(id) => self.task_ids.contains(id),
            ListenEvent::Acknowledged | ListenEvent::Other => false,
        }
    }
}

/// Sets `params._meta["io.modelcontextprotocol/subscriptionId"]` to the listen request's id.
pub fn tag(message: &mut Value, subscription_id: &Value) {
    if !message.get("params").is_some_and(Value::is_object) {
        message["params"] = json!({});
    }
    let params = &mut message["params"];
    if !params.get("_meta").is_some_and(Value::is_object) {
        params["_meta"] = json!({});
    }
    params["_meta"][meta::SUBSCRIPTION_ID] = subscription_id.clone();
}

/// The acknowledgement frame: the first thing a listener receives.
pub fn acknowledgement(filter: &ListenFilter, subscription_id: &Value) -> Value {
    let mut message = json!({
        "jsonrpc": "2.0",
        "method": events::ACKNOWLEDGED,
        "params": {"notifications": filter.to_wire()},
    });
    tag(&mut message, subscription_id);
    message
}

/// The identity templated resource patterns are expanded from: the listener's own.
pub fn listener(owner: &Owner) -> PatternIdentity<'_> {
    PatternIdentity {
        subject: &owner.subject,
        tenant: &owner.tenant,
        client: &owner.client,
    }
}

/// The graceful end of a listen stream: the result of the listen request.
pub fn final_result(subscription_id: &Value) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": subscription_id,
        "result": {
            "resultType": "complete",
            "_meta": {meta::SUBSCRIPTION_ID: subscription_id},
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::UriPattern;

    const ANYONE: PatternIdentity<'static> = PatternIdentity {
        subject: "alice",
        tenant: "acme",
        client: "console",
    };

    fn rules(notifications: &[ListenNotification], patterns: &[&str]) -> ListenRules {
        ListenRules {
            notifications: notifications.iter().copied().collect(),
            resource_patterns: patterns
                .iter()
                .map(|p| UriPattern::new(p).unwrap())
                .collect(),
            max_streams_per_principal: 4,
            max_stream_duration: std::time::Duration::from_secs(60).into(),
        }
    }

    #[test]
    fn resource_uris_must_be_plain() {
        for ok in [
            "reports://team-a/q3",
            "file:///srv/a.txt",
            "reports://a/x.y",
            "r://a/..b",
        ] {
            assert!(is_plain_resource_uri(ok), "{ok}");
        }
        for bad in [
            "reports://team-a/../team-b/x",
            "reports://team-a/%2e%2e/team-b/x",
            "reports://team-a/%2E./x",
            "reports://team-a%2fteam-b",
            "reports://team-a\\..\\team-b",
            "reports://team-a/./x",
            "reports://team-a/..",
        ] {
            assert!(!is_plain_resource_uri(bad), "{bad}");
            assert_eq!(
                ListenFilter::parse_request(Some(&json!({"resourceSubscriptions": [bad]})), false),
                Err(FilterError::AmbiguousUri(bad.into()))
            );
        }
    }

    #[test]
    fn streams_survive_policy_changes_only_while_everything_stays_allowed() {
        use ListenNotification::*;
        let mut filter = ListenFilter {
            tools_list_changed: true,
            ..Default::default()
        };
        filter.resource_subscriptions.insert("reports://a/1".into());
        let all = rules(
            &[ToolsListChanged, ResourceSubscriptions, TaskIds],
            &["reports://a/*"],
        );
        assert!(filter.survives(&all, &ANYONE));
        assert!(!filter.survives(
            &rules(&[ResourceSubscriptions], &["reports://a/*"]),
            &ANYONE
        ));
        assert!(!filter.survives(
            &rules(
                &[ToolsListChanged, ResourceSubscriptions],
                &["reports://b/*"]
            ),
            &ANYONE
        ));
        filter.task_ids.insert("lgt_1".into());
        assert!(filter.survives(&all, &ANYONE));
        assert!(
            !filter.survives(
                &rules(
                    &[ToolsListChanged, ResourceSubscriptions],
                    &["reports://a/*"]
                ),
                &ANYONE
            ),
            "task IDs need taskIds"
        );
        assert_eq!(filter.entries(), 3);
        let mapped = filter.map_task_ids(|id| (id == "lgt_1").then(|| "up-1".to_owned()));
        assert_eq!(mapped.task_ids.iter().collect::<Vec<_>>(), ["up-1"]);
        assert_eq!(filter.map_task_ids(|_| None).entries(), 2);
    }

    #[test]
    fn parses_strictly_and_requires_the_extension_for_task_ids() {
        let f = ListenFilter::parse_request(
            Some(&json!({"toolsListChanged": true, "resourceSubscriptions": ["a://x"]})),
            false,
        )
        .unwrap();
        assert!(f.tools_list_changed && f.resource_subscriptions.contains("a://x"));
        assert_eq!(
            ListenFilter::parse_request(Some(&json!({"bogus": true})), true),
            Err(FilterError::UnknownKey("bogus".into()))
        );
        assert_eq!(
            ListenFilter::parse_request(Some(&json!({"taskIds": ["t"]})), false),
            Err(FilterError::TaskIdsWithoutExtension)
        );
        assert_eq!(
            ListenFilter::parse_request(Some(&json!({"toolsListChanged": "yes"})), true),
            Err(FilterError::WrongType("toolsListChanged"))
        );
        assert_eq!(
            ListenFilter::parse_request(None, true),
            Err(FilterError::NotAnObject)
        );
    }

    #[test]
    fn policy_drops_what_it_does_not_allow() {
        let asked = ListenFilter::parse_request(
            Some(
                &json!({"toolsListChanged": true, "promptsListChanged": true,
                         "resourceSubscriptions": ["reports://team-a/q3", "reports://team-b/q3"],
                         "taskIds": ["lgt_1"]}),
            ),
            true,
        )
        .unwrap();
        let r = rules(
            &[
                ListenNotification::ToolsListChanged,
                ListenNotification::ResourceSubscriptions,
            ],
            &["reports://team-a/*"],
        );
        let allowed = asked.allowed_by(&r, &ANYONE);
        assert!(allowed.tools_list_changed);
        assert!(!allowed.prompts_list_changed);
        assert_eq!(allowed.resource_subscriptions.len(), 1);
        assert!(
            allowed.task_ids.is_empty(),
            "taskIds not allowed by the policy"
        );
        assert!(!asked.still_allowed_by(&r, &ANYONE));
        assert!(allowed.still_allowed_by(&r, &ANYONE));
    }

    #[test]
    fn templated_patterns_allow_each_listener_its_own_resources_and_streams_keep_them() {
        let asked = ListenFilter::parse_request(
            Some(&json!({"resourceSubscriptions": ["reports://acme/q3", "reports://globex/q3"]})),
            true,
        )
        .unwrap();
        let r = rules(
            &[ListenNotification::ResourceSubscriptions],
            &["reports://{tenant}/*"],
        );
        let acme = Owner {
            issuer: "https://idp".into(),
            subject: "alice".into(),
            tenant: "acme".into(),
            client: "console".into(),
        };
        let globex = Owner {
            tenant: "globex".into(),
            ..acme.clone()
        };
        let for_acme = asked.allowed_by(&r, &listener(&acme));
        assert_eq!(
            for_acme.resource_subscriptions.iter().collect::<Vec<_>>(),
            ["reports://acme/q3"]
        );
        let for_globex = asked.allowed_by(&r, &listener(&globex));
        assert_eq!(
            for_globex.resource_subscriptions.iter().collect::<Vec<_>>(),
            ["reports://globex/q3"]
        );
        assert!(for_acme.survives(&r, &listener(&acme)));
        assert!(!for_acme.survives(&r, &listener(&globex)));
        let no_tenant = Owner {
            tenant: String::new(),
            ..acme
        };
        assert!(
            asked
                .allowed_by(&r, &listener(&no_tenant))
                .resource_subscriptions
                .is_empty(),
            "a listener without a tenant matches no tenant pattern"
        );
    }

    #[test]
    fn events_are_admitted_only_when_subscribed() {
        let f = ListenFilter {
            resource_subscriptions: ["a://1".to_owned()].into(),
            task_ids: ["task-1".to_owned()].into(),
            ..Default::default()
        };
        let task = json!({"method": "notifications/tasks", "params": {"taskId": "task-1"}});
        assert!(f.admits(&classify_event(&task)));
        let other_task = json!({"method": "notifications/tasks", "params": {"taskId": "task-2"}});
        assert!(!f.admits(&classify_event(&other_task)));
        let progress = json!({"method": "notifications/progress", "params": {}});
        assert_eq!(classify_event(&progress), ListenEvent::Other);
        let updated =
            json!({"method": "notifications/resources/updated", "params": {"uri": "a://2"}});
        assert!(!f.admits(&classify_event(&updated)));
        let tools = json!({"method": "notifications/tools/list_changed"});
        assert!(!f.admits(&classify_event(&tools)));
    }

    #[test]
    fn frames_carry_the_subscription_id() {
        let ack = acknowledgement(&ListenFilter::default(), &json!(7));
        assert_eq!(
            ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
            7
        );
        assert_eq!(ack["params"]["notifications"], json!({}));
        let end = final_result(&json!("s-1"));
        assert_eq!(end["id"], "s-1");
        assert_eq!(
            end["result"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
            "s-1"
        );
        let mut n = json!({"method": "notifications/tools/list_changed"});
        tag(&mut n, &json!("s-1"));
        assert_eq!(
            n["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
            "s-1"
        );
    }
}
