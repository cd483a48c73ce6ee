//! The per-request protocol checks that run before anything reaches the protected server.
//!
//! Stateless MCP judges every request on its own: the protocol version and client capabilities
//! come from this request's `_meta` (never from earlier ones), and the mirrored headers must agree
//! with the body so that intermediaries routing on headers and the server reading the body see
//! the same request.

use http::{HeaderMap, StatusCode};
use serde_json::{Value, json};

use super::header_value::decode_mirrored;
use super::jsonrpc::{ErrorObject, Request};
use super::refusal::Refusal;
use super::{TASKS_EXTENSION, codes, headers, meta, methods};

/// What a request is, as far as Lifeguard's decisions go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestKind {
    ToolsCall {
        tool: String,
    },
    TaskGet {
        task_id: String,
    },
    TaskUpdate {
        task_id: String,
    },
    TaskCancel {
        task_id: String,
    },
    Listen,
    /// Anything else (`server/discover`, `tools/list`, `resources/read`, notifications…).
    Other,
}

/// Facts established by the checks, used by the later stages.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestFacts {
    pub protocol_version: String,
    /// The request declared the Tasks extension in its own client capabilities.
    pub declares_tasks: bool,
    /// The request's declared client capabilities (`{}` when none).
    pub capabilities: Value,
    pub kind: RequestKind,
}

/// Why a request was refused by the protocol checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    MissingVersionHeader,
    UnsupportedVersion {
        requested: String,
        supported: Vec<String>,
    },
    MissingMeta(&'static str),
    VersionMismatch,
    MissingHeader(&'static str),
    HeaderMismatch(&'static str),
    ParamHeaderMismatch(String),
    MalformedHeader(&'static str),
    MissingParam(&'static str),
    MissingTasksCapability,
    RemovedMethod(String),
    /// A message without `id` whose method is not a client notification of this revision: a
    /// request sent as a notification would reach the server without any of the checks a
    /// request gets (owner, scopes, quotas, ledger).
    NotANotification(String),
}

impl Violation {
    /// HTTP status and JSON-RPC error for this violation, with its structured refusal
    /// ([`Self::refusal`]) in `data`.
    pub fn to_error(&self) -> (StatusCode, ErrorObject) {
        let (status, error) = self.unstructured_error();
        (status, error.with_refusal(&self.refusal()))
    }

    /// The structured refusal: `reason` is [`Self::reason`], and the remediation `none`: the
    /// same request fails the same way however often it is sent (the client must change it).
    pub fn refusal(&self) -> Refusal {
        Refusal::final_(self.reason())
    }

    fn unstructured_error(&self) -> (StatusCode, ErrorObject) {
        use Violation::*;
        let bad = StatusCode::BAD_REQUEST;
        match self {
            MissingVersionHeader => (
                bad,
                ErrorObject::new(
                    codes::HEADER_MISMATCH,
                    "Missing MCP-Protocol-Version header",
                ),
            ),
            UnsupportedVersion {
                requested,
                supported,
            } => (
                bad,
                ErrorObject::new(codes::UNSUPPORTED_VERSION, "Unsupported protocol version")
                    .with_data(json!({"supported": supported, "requested": requested})),
            ),
            MissingMeta(key) => (
                bad,
                ErrorObject::new(
                    codes::INVALID_PARAMS,
                    format!("Invalid params: missing params._meta[\"{key}\"]"),
                ),
            ),
            VersionMismatch => (
                bad,
                ErrorObject::new(
                    codes::HEADER_MISMATCH,
                    "MCP-Protocol-Version header differs from params._meta",
                ),
            ),
            MissingHeader(name) => (
                bad,
                ErrorObject::new(codes::HEADER_MISMATCH, format!("Missing {name} header")),
            ),
            HeaderMismatch(name) => (
                bad,
                ErrorObject::new(
                    codes::HEADER_MISMATCH,
                    format!("{name} header differs from the request body"),
                ),
            ),
            ParamHeaderMismatch(name) => (
                bad,
                ErrorObject::new(
                    codes::HEADER_MISMATCH,
                    format!("Mcp-Param-{name} header differs from the tool arguments"),
                ),
            ),
            MalformedHeader(name) => (
                bad,
                ErrorObject::new(codes::HEADER_MISMATCH, format!("Malformed {name} header")),
            ),
            MissingParam(name) => (
                bad,
                ErrorObject::new(
                    codes::INVALID_PARAMS,
                    format!("Invalid params: missing params.{name}"),
                ),
            ),
            MissingTasksCapability => (
                bad,
                ErrorObject::new(
                    codes::MISSING_CAPABILITY,
                    "This request requires the io.modelcontextprotocol/tasks extension",
                )
                .with_data(json!({
                    "requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}
                })),
            ),
            RemovedMethod(method) => (
                StatusCode::NOT_FOUND,
                ErrorObject::new(
                    codes::METHOD_NOT_FOUND,
                    format!("Method not found: {method}"),
                ),
            ),
            NotANotification(method) => (
                bad,
                ErrorObject::new(
                    codes::INVALID_REQUEST,
                    format!(
                        "Invalid Request: {method} is not a client notification; send it as a request with an id"
                    ),
                ),
            ),
        }
    }

    /// Bounded label for metrics and audit reason codes.
    pub fn reason(&self) -> &'static str {
        use Violation::*;
        match self {
            MissingVersionHeader => "missing_version_header",
            UnsupportedVersion { .. } => "unsupported_version",
            MissingMeta(_) => "missing_meta",
            VersionMismatch => "version_mismatch",
            MissingHeader(_) => "missing_header",
            HeaderMismatch(_) => "header_mismatch",
            ParamHeaderMismatch(_) => "param_header_mismatch",
            MalformedHeader(_) => "malformed_header",
            MissingParam(_) => "missing_param",
            MissingTasksCapability => "missing_tasks_capability",
            RemovedMethod(_) => "removed_method",
            NotANotification(_) => "not_a_notification",
        }
    }
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a [u8]> {
    h.get(name).map(|v| v.as_bytes())
}

/// Whether `capabilities` (a clientCapabilities object) declares the Tasks extension.
pub fn declares_tasks(capabilities: &Value) -> bool {
    capabilities
        .get("extensions")
        .and_then(Value::as_object)
        .is_some_and(|e| e.contains_key(TASKS_EXTENSION))
}

/// The notifications a 2026-07-28 client may send (`ClientNotification` in the schema). Any
/// other message without an `id` is refused: servers that execute JSON-RPC notifications would
/// otherwise run requests no check ever saw.
pub const CLIENT_NOTIFICATIONS: &[&str] = &["notifications/cancelled"];

/// What the checks accept.
#[derive(Clone, Copy, Debug)]
pub struct CheckOptions<'a> {
    pub accepted_versions: &'a [String],
    /// Accept requests that omit `Mcp-Name` (a present one must still match the body). A
    /// compatibility switch for clients that do not mirror the name on every method yet.
    pub allow_missing_name: bool,
}

/// Checks a request's headers and `_meta` against its body and the accepted versions.
pub fn check_request(
    h: &HeaderMap,
    request: &Request,
    options: CheckOptions<'_>,
) -> Result<RequestFacts, Violation> {
    let accepted_versions = options.accepted_versions;
    let version = header(h, headers::PROTOCOL_VERSION).ok_or(Violation::MissingVersionHeader)?;
    let version = std::str::from_utf8(version)
        .map_err(|_| Violation::MalformedHeader("MCP-Protocol-Version"))?
        .trim()
        .to_owned();
    if !accepted_versions.contains(&version) {
        return Err(Violation::UnsupportedVersion {
            requested: version,
            supported: accepted_versions.to_vec(),
        });
    }

    // Header-level checks that hold for notifications as well.
    check_mirrored(h, headers::METHOD, "Mcp-Method", Some(&request.method))?;
    if request.is_notification() {
        if !CLIENT_NOTIFICATIONS.contains(&request.method.as_str()) {
            return Err(Violation::NotANotification(request.method.clone()));
        }
        return Ok(RequestFacts {
            protocol_version: version,
            declares_tasks: false,
            capabilities: json!({}),
            kind: RequestKind::Other,
        });
    }

    let body_version = request
        .meta(meta::PROTOCOL_VERSION)
        .ok_or(Violation::MissingMeta(meta::PROTOCOL_VERSION))?;
    if body_version.as_str() != Some(version.as_str()) {
        return Err(Violation::VersionMismatch);
    }
    let capabilities = request
        .meta(meta::CLIENT_CAPABILITIES)
        .filter(|c| c.is_object())
        .ok_or(Violation::MissingMeta(meta::CLIENT_CAPABILITIES))?
        .clone();
    let tasks = declares_tasks(&capabilities);

    let method = request.method.as_str();
    if method == methods::TASKS_LIST || method == methods::TASKS_RESULT {
        return Err(Violation::RemovedMethod(method.to_owned()));
    }

    // Which body field Mcp-Name mirrors.
    let name_field = match method {
        methods::TOOLS_CALL | methods::PROMPTS_GET => Some("name"),
        methods::RESOURCES_READ => Some("uri"),
        methods::TASKS_GET | methods::TASKS_UPDATE | methods::TASKS_CANCEL => Some("taskId"),
        _ => None,
    };
    let mut name_value = None;
    if let Some(field) = name_field {
        let value = request
            .param_str(field)
            .ok_or(Violation::MissingParam(field))?;
        let tolerated_absence = options.allow_missing_name && !h.contains_key(headers::NAME);
        if !tolerated_absence {
            check_mirrored(h, headers::NAME, "Mcp-Name", Some(value))?;
        }
        name_value = Some(value.to_owned());
    } else if h.contains_key(headers::NAME) {
        // A name header on a method without a name is a mismatch, not something to ignore.
        return Err(Violation::HeaderMismatch("Mcp-Name"));
    }

    if method == methods::TOOLS_CALL {
        check_param_headers(h, request)?;
    }

    let kind = match (method, name_value) {
        (methods::TOOLS_CALL, Some(tool)) => RequestKind::ToolsCall { tool },
        (methods::TASKS_GET, Some(task_id)) => RequestKind::TaskGet { task_id },
        (methods::TASKS_UPDATE, Some(task_id)) => RequestKind::TaskUpdate { task_id },
        (methods::TASKS_CANCEL, Some(task_id)) => RequestKind::TaskCancel { task_id },
        (methods::LISTEN, _) => RequestKind::Listen,
        _ => RequestKind::Other,
    };
    if matches!(
        kind,
        RequestKind::TaskGet { .. }
            | RequestKind::TaskUpdate { .. }
            | RequestKind::TaskCancel { .. }
    ) && !tasks
    {
        return Err(Violation::MissingTasksCapability);
    }

    Ok(RequestFacts {
        protocol_version: version,
        declares_tasks: tasks,
        capabilities,
        kind,
    })
}

fn check_mirrored(
    h: &HeaderMap,
    name: &str,
    display: &'static str,
    expected: Option<&str>,
) -> Result<(), Violation> {
    let mut values = h.get_all(name).iter();
    let Some(raw) = values.next() else {
        return Err(Violation::MissingHeader(display));
    };
    if values.next().is_some() {
        return Err(Violation::MalformedHeader(display));
    }
    let decoded = decode_mirrored(raw.as_bytes()).ok_or(Violation::MalformedHeader(display))?;
    if Some(decoded.as_str()) != expected {
        return Err(Violation::HeaderMismatch(display));
    }
    Ok(())
}

/// Every `Mcp-Param-{Name}` header present must equal the tool argument of that name (matched
/// case-insensitively, as header names are). Which arguments are annotated for mirroring is in
/// the tool's schema, which the sidecar does not hold, so presence cannot be required here; a
/// header that disagrees with the body is always refused.
fn check_param_headers(h: &HeaderMap, request: &Request) -> Result<(), Violation> {
    let arguments = request
        .params()
        .and_then(|p| p.get("arguments"))
        .and_then(Value::as_object);
    for (name, value) in h.iter() {
        let Some(param) = name.as_str().strip_prefix(headers::PARAM_PREFIX) else {
            continue;
        };
        let decoded = decode_mirrored(value.as_bytes())
            .ok_or_else(|| Violation::ParamHeaderMismatch(param.to_owned()))?;
        let argument = arguments.and_then(|args| {
            args.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(param))
                .map(|(_, v)| v)
        });
        let matches = match argument {
            Some(Value::String(s)) => *s == decoded,
            Some(v @ (Value::Number(_) | Value::Bool(_))) => {
                // Scalars mirror as their JSON text (`3`, `true`).
                let rendered = v.to_string();
                rendered == decoded
            }
            _ => false,
        };
        if !matches {
            return Err(Violation::ParamHeaderMismatch(param.to_owned()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;
    use crate::mcp::jsonrpc::parse_request;

    fn versions() -> CheckOptions<'static> {
        static ACCEPTED: std::sync::LazyLock<Vec<String>> =
            std::sync::LazyLock::new(|| vec!["2026-07-28".into()]);
        CheckOptions {
            accepted_versions: &ACCEPTED,
            allow_missing_name: false,
        }
    }

    fn request(method: &str, params: Value) -> Request {
        let mut params = params;
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS_EXTENSION: {}}},
        });
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        parse_request(body.to_string().as_bytes()).unwrap()
    }

    fn headers_for(method: &str, name: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            headers::PROTOCOL_VERSION,
            HeaderValue::from_static("2026-07-28"),
        );
        h.insert(headers::METHOD, HeaderValue::from_str(method).unwrap());
        if let Some(name) = name {
            h.insert(headers::NAME, HeaderValue::from_str(name).unwrap());
        }
        h
    }

    fn violation(h: &HeaderMap, r: &Request) -> Violation {
        check_request(h, r, versions()).unwrap_err()
    }

    #[test]
    fn only_client_notifications_may_come_without_an_id() {
        let notification = |method: &str| {
            let body = json!({"jsonrpc": "2.0", "method": method, "params": {"taskId": "t"}});
            parse_request(body.to_string().as_bytes()).unwrap()
        };
        let cancelled = notification("notifications/cancelled");
        let facts = check_request(
            &headers_for("notifications/cancelled", None),
            &cancelled,
            versions(),
        )
        .expect("the one client notification of 2026-07-28 passes");
        assert_eq!(facts.kind, RequestKind::Other);
        for method in [
            "tasks/cancel",
            "tasks/update",
            "tools/call",
            "notifications/progress",
            "x/y",
        ] {
            assert_eq!(
                violation(&headers_for(method, None), &notification(method)),
                Violation::NotANotification(method.into()),
                "{method}"
            );
        }
        let (status, error) = Violation::NotANotification("tasks/cancel".into()).to_error();
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(error.code, codes::INVALID_REQUEST);
    }

    #[test]
    fn a_consistent_tools_call_passes() {
        let r = request(
            "tools/call",
            json!({"name": "generate_report", "arguments": {"region": "eu"}}),
        );
        let mut h = headers_for("tools/call", Some("generate_report"));
        h.insert("mcp-param-region", HeaderValue::from_static("eu"));
        let facts = check_request(&h, &r, versions()).unwrap();
        assert!(facts.declares_tasks);
        assert_eq!(
            facts.kind,
            RequestKind::ToolsCall {
                tool: "generate_report".into()
            }
        );
    }

    #[test]
    fn version_header_is_required_and_must_be_accepted() {
        let r = request("tools/list", json!({}));
        let mut h = headers_for("tools/list", None);
        h.remove(headers::PROTOCOL_VERSION);
        assert_eq!(violation(&h, &r), Violation::MissingVersionHeader);
        h.insert(
            headers::PROTOCOL_VERSION,
            HeaderValue::from_static("2025-11-25"),
        );
        let v = violation(&h, &r);
        assert!(matches!(v, Violation::UnsupportedVersion { .. }));
        let (status, error) = v.to_error();
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(error.code, codes::UNSUPPORTED_VERSION);
        assert_eq!(error.data.unwrap()["requested"], "2025-11-25");
    }

    #[test]
    fn body_version_and_capabilities_are_required() {
        let mut r = request("tools/list", json!({}));
        r.message["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] =
            json!("2026-08-01");
        let h = headers_for("tools/list", None);
        assert_eq!(violation(&h, &r), Violation::VersionMismatch);
        r.message["params"]["_meta"] =
            json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28"});
        let v = violation(&h, &r);
        assert_eq!(v, Violation::MissingMeta(meta::CLIENT_CAPABILITIES));
        assert_eq!(v.to_error().1.code, codes::INVALID_PARAMS);
    }

    #[test]
    fn method_and_name_headers_must_mirror_the_body() {
        let r = request("tasks/get", json!({"taskId": "lgt_abc"}));
        assert_eq!(
            violation(&headers_for("tasks/cancel", Some("lgt_abc")), &r),
            Violation::HeaderMismatch("Mcp-Method")
        );
        assert_eq!(
            violation(&headers_for("tasks/get", None), &r),
            Violation::MissingHeader("Mcp-Name")
        );
        assert_eq!(
            violation(&headers_for("tasks/get", Some("lgt_other")), &r),
            Violation::HeaderMismatch("Mcp-Name")
        );
        let ok = check_request(&headers_for("tasks/get", Some("lgt_abc")), &r, versions()).unwrap();
        assert_eq!(
            ok.kind,
            RequestKind::TaskGet {
                task_id: "lgt_abc".into()
            }
        );
    }

    #[test]
    fn base64_sentinel_names_are_decoded_before_comparing() {
        let r = request(
            "tools/call",
            json!({"name": "rapport_été", "arguments": {}}),
        );
        let encoded = crate::mcp::header_value::encode_mirrored("rapport_été");
        let h = headers_for("tools/call", Some(&encoded));
        assert!(check_request(&h, &r, versions()).is_ok());
    }

    #[test]
    fn param_headers_must_match_arguments() {
        let r = request(
            "tools/call",
            json!({"name": "t", "arguments": {"Region": "eu", "count": 3}}),
        );
        let mut h = headers_for("tools/call", Some("t"));
        h.insert("mcp-param-region", HeaderValue::from_static("us"));
        assert_eq!(
            violation(&h, &r),
            Violation::ParamHeaderMismatch("region".into())
        );
        h.insert("mcp-param-region", HeaderValue::from_static("eu"));
        h.insert("mcp-param-count", HeaderValue::from_static("3"));
        assert!(check_request(&h, &r, versions()).is_ok());
        h.insert("mcp-param-missing", HeaderValue::from_static("x"));
        assert_eq!(
            violation(&h, &r),
            Violation::ParamHeaderMismatch("missing".into())
        );
    }

    #[test]
    fn task_methods_need_the_extension_on_this_request() {
        let mut r = request("tasks/get", json!({"taskId": "lgt_abc"}));
        r.message["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] = json!({});
        let v = violation(&headers_for("tasks/get", Some("lgt_abc")), &r);
        assert_eq!(v, Violation::MissingTasksCapability);
        let (_, error) = v.to_error();
        assert_eq!(error.code, codes::MISSING_CAPABILITY);
        assert_eq!(
            error.data.unwrap(),
            json!({"requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
                   "reason": "missing_tasks_capability", "remediation": "none"})
        );
    }

    #[test]
    fn every_violation_carries_its_reason_and_no_remediation() {
        let all = [
            Violation::MissingVersionHeader,
            Violation::UnsupportedVersion {
                requested: "2025-11-25".into(),
                supported: vec!["2026-07-28".into()],
            },
            Violation::MissingMeta("x"),
            Violation::VersionMismatch,
            Violation::MissingHeader("Mcp-Method"),
            Violation::HeaderMismatch("Mcp-Method"),
            Violation::ParamHeaderMismatch("Region".into()),
            Violation::MalformedHeader("Mcp-Name"),
            Violation::MissingParam("name"),
            Violation::MissingTasksCapability,
            Violation::RemovedMethod("tasks/list".into()),
            Violation::NotANotification("tools/call".into()),
        ];
        for v in all {
            let data = v.to_error().1.data.expect("structured data");
            assert_eq!(data["reason"], v.reason(), "{v:?}");
            assert_eq!(data["remediation"], "none", "{v:?}");
            assert!(data.get("retryAfterMs").is_none(), "{v:?}");
            assert!(
                data.get("policy").is_none(),
                "named where the policy is known: {v:?}"
            );
        }
        // Members a violation had before stay beside the refusal.
        let (_, error) = Violation::UnsupportedVersion {
            requested: "2025-11-25".into(),
            supported: vec!["2026-07-28".into()],
        }
        .to_error();
        let data = error.data.unwrap();
        assert_eq!(data["supported"], json!(["2026-07-28"]));
        assert_eq!(data["reason"], "unsupported_version");
    }

    #[test]
    fn removed_task_methods_are_not_found() {
        let r = request("tasks/list", json!({}));
        let v = violation(&headers_for("tasks/list", None), &r);
        assert_eq!(v.to_error().0, StatusCode::NOT_FOUND);
        assert_eq!(v.to_error().1.code, codes::METHOD_NOT_FOUND);
    }

    #[test]
    fn a_missing_name_header_can_be_tolerated_but_never_a_wrong_one() {
        let r = request("tasks/get", json!({"taskId": "lgt_abc"}));
        let lenient = CheckOptions {
            allow_missing_name: true,
            ..versions()
        };
        assert!(check_request(&headers_for("tasks/get", None), &r, lenient).is_ok());
        assert_eq!(
            check_request(&headers_for("tasks/get", Some("lgt_other")), &r, lenient).unwrap_err(),
            Violation::HeaderMismatch("Mcp-Name")
        );
    }

    #[test]
    fn a_name_header_on_a_nameless_method_is_refused() {
        let r = request("tools/list", json!({}));
        assert_eq!(
            violation(&headers_for("tools/list", Some("x")), &r),
            Violation::HeaderMismatch("Mcp-Name")
        );
    }
}
