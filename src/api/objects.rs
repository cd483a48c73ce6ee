//! `tasks.objects`: object-level permission. A task is bound to who asked and which tool; these
//! fields also bind it to *what it acts on* (a project, a repository, a customer), named by a
//! JSON pointer into the tool's arguments, and ask an external decision point about that object
//! at creation and on every later get, update, cancel, result read and listen delivery.

use std::collections::BTreeMap;

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::duration::PolicyDuration;
use super::rules;

/// The objects tools act on, and the decision point asked about them.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ObjectsSpec {
    /// The external authorizer asked about every operation on an object.
    pub authorizer: AuthorizerSpec,

    /// Per tool, where its arguments name the object it acts on. A call of a listed tool whose
    /// arguments lack the object is refused (invalid params); tools not listed are bound to
    /// owner and tool only.
    #[schemars(extend("maxProperties" = 256))]
    pub tools: BTreeMap<String, ToolObject>,
}

/// Where one tool's arguments name its object.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    cel,
    validation = Rule::new("self.pointer.startsWith('/')")
        .message(rules::OBJECT_POINTER)
        .field_path(".pointer")
)]
pub struct ToolObject {
    /// JSON pointer (RFC 6901) into the call's `arguments`, e.g. `/projectId`. The value must be
    /// a string, number or boolean of at most 1024 bytes.
    #[schemars(length(min = 1, max = 512))]
    pub pointer: String,

    /// The resource type the authorizer is told (`resource.type`), e.g. `project`. Default: the
    /// tool's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    pub r#type: Option<String>,
}

/// An HTTP decision point in the shape of an OpenID AuthZEN access evaluation or a Kubernetes
/// SubjectAccessReview.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    cel,
    validation = Rule::new("self.url.startsWith('https://') || self.url.startsWith('http://127.0.0.1') || self.url.startsWith('http://localhost') || self.url.startsWith('http://[::1]')")
        .message(rules::AUTHORIZER_URL)
        .field_path(".url")
)]
pub struct AuthorizerSpec {
    /// Where evaluations are POSTed, e.g. `https://authz.example/access/v1/evaluation`. Plain
    /// `http` only to a loopback address (an authorizer in the same pod).
    #[schemars(length(min = 1, max = 2048))]
    pub url: String,

    /// The request and answer shape: `authzen` (default; answer `{"decision": bool}`) or
    /// `subjectAccessReview` (answer `status.allowed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<AuthorizerFormat>,

    /// Longest wait for one decision; past it the operation is refused as unavailable (fail
    /// closed). Default `1s`, at most `30s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s') && duration(self) <= duration('30s')").message(rules::AUTHORIZER_TIMEOUT))]
    pub timeout: Option<PolicyDuration>,

    /// How long a decision (allow or deny) is reused for the same principal, object and
    /// operation. `0s` asks every time. Default `5s`, at most `10m`. Errors are never cached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) <= duration('10m')").message(rules::AUTHORIZER_CACHE_TTL))]
    pub cache_ttl: Option<PolicyDuration>,

    /// Most decisions cached; the oldest are dropped first. Default 10000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000000))]
    pub cache_size: Option<u32>,

    /// PEM file of the CA certificates that verify an `https` authorizer, in the sidecar's
    /// filesystem (mount it from a ConfigMap). Default: the system's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub ca_file: Option<String>,

    /// File whose content is sent as `Authorization: Bearer …` (e.g. a projected service account
    /// token), read again for every request so rotated tokens are picked up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub token_file: Option<String>,
}

/// Request and answer shape of the authorizer.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub enum AuthorizerFormat {
    #[default]
    Authzen,
    SubjectAccessReview,
}
