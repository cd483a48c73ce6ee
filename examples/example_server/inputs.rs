//! Input responses (the answers to `inputRequests`), checked the way the official Python SDK
//! checks them: each answer must be the result type of the request it answers —
//! `CreateMessageResult` for `sampling/createMessage`, `ListRootsResult` for `roots/list`,
//! `ElicitResult` for `elicitation/create` — and anything else (an `{"error": …}` object, `{}`,
//! `null`, a result of the wrong type) is `-32602 Invalid request parameters` with HTTP 400.
//! Members the schema does not name are ignored, as pydantic ignores them.
//!
//! The 2026-07-28 schema has no error or decline form for sampling or roots: `InputResponse =
//! CreateMessageResult | ListRootsResult | ElicitResult`. Only an elicitation can be declined
//! (`action: "decline"`).

use serde_json::{Map, Value, json};

use crate::rpc::RpcError;

/// The result type an input request's answer must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    Sampling,
    Roots,
    Elicitation,
}

impl Expected {
    /// The answer type of an input request with `method`.
    pub fn of_method(method: &str) -> Option<Self> {
        match method {
            "sampling/createMessage" => Some(Self::Sampling),
            "roots/list" => Some(Self::Roots),
            "elicitation/create" => Some(Self::Elicitation),
            _ => None,
        }
    }

    /// The answer type of the input request `request` (`{method, params}`).
    pub fn of_request(request: &Value) -> Option<Self> {
        request
            .get("method")
            .and_then(Value::as_str)
            .and_then(Self::of_method)
    }

    fn type_name(self) -> &'static str {
        match self {
            Self::Sampling => "CreateMessageResult",
            Self::Roots => "ListRootsResult",
            Self::Elicitation => "ElicitResult",
        }
    }

    /// Whether `answer` is a well-formed answer of this type; the first problem otherwise.
    pub fn check(self, answer: &Value) -> Result<(), String> {
        let Some(object) = answer.as_object() else {
            return Err(format!("{} must be an object", self.type_name()));
        };
        let problem = match self {
            Self::Sampling => sampling_problem(object),
            Self::Roots => roots_problem(object),
            Self::Elicitation => elicit_problem(object),
        };
        match problem {
            None => Ok(()),
            Some(p) => Err(format!("{}: {p}", self.type_name())),
        }
    }
}

/// `CreateMessageResult`: `role`, `content` (one block or an array of blocks), `model`, and an
/// optional string `stopReason`.
fn sampling_problem(o: &Map<String, Value>) -> Option<String> {
    match o.get("role").and_then(Value::as_str) {
        Some("user" | "assistant") => {}
        _ => return Some("`role` must be \"user\" or \"assistant\"".into()),
    }
    let content_ok = match o.get("content") {
        Some(Value::Array(blocks)) => blocks.iter().all(content_block_ok),
        Some(block) => content_block_ok(block),
        None => false,
    };
    if !content_ok {
        return Some("`content` must be a content block or an array of content blocks".into());
    }
    if !o.get("model").is_some_and(Value::is_string) {
        return Some("`model` is required and must be a string".into());
    }
    if o.get("stopReason").is_some_and(|r| !r.is_string()) {
        return Some("`stopReason` must be a string".into());
    }
    None
}

fn content_block_ok(block: &Value) -> bool {
    match block.get("type").and_then(Value::as_str) {
        Some("text") => block.get("text").is_some_and(Value::is_string),
        Some(_) => true,
        None => false,
    }
}

/// `ListRootsResult`: `roots`, an array of `{uri: "file://…", name?}`.
fn roots_problem(o: &Map<String, Value>) -> Option<String> {
    let Some(roots) = o.get("roots").and_then(Value::as_array) else {
        return Some("`roots` is required and must be an array".into());
    };
    let root_ok = |root: &Value| {
        root.get("uri")
            .and_then(Value::as_str)
            .is_some_and(|uri| uri.starts_with("file://"))
            && root.get("name").is_none_or(Value::is_string)
    };
    (!roots.iter().all(root_ok))
        .then(|| "every root needs a `file://` `uri` (and a string `name`, if any)".into())
}

/// `ElicitResult`: `action` (`accept`, `decline` or `cancel`), optional object `content`.
fn elicit_problem(o: &Map<String, Value>) -> Option<String> {
    match o.get("action").and_then(Value::as_str) {
        Some("accept" | "decline" | "cancel") => {}
        _ => return Some("`action` must be \"accept\", \"decline\" or \"cancel\"".into()),
    }
    o.get("content")
        .is_some_and(|c| !c.is_object())
        .then(|| "`content` must be an object".into())
}

/// Any member of the `InputResponse` union: what a retried request may carry for a key the
/// server does not know (the SDK validates the params against the union before the tool runs).
pub fn check_any(answer: &Value) -> Result<(), String> {
    let mut problems = Vec::new();
    for expected in [Expected::Sampling, Expected::Roots, Expected::Elicitation] {
        match expected.check(answer) {
            Ok(()) => return Ok(()),
            Err(p) => problems.push(p),
        }
    }
    Err(format!("not an InputResponse ({})", problems.join("; ")))
}

/// The error for invalid input responses: `-32602 Invalid request parameters` (the Python SDK's
/// message), with what was wrong per key in `data`.
pub fn invalid(problems: Map<String, Value>) -> RpcError {
    RpcError::invalid_params("Invalid request parameters")
        .with_data(json!({"inputResponses": problems}))
}

/// Checks the `inputResponses` of a retried request (multi round-trip): each member must be an
/// `InputResponse`, and the answers to `asked` (key → expected type) must be of their type.
pub fn check_retry(params: &Value, asked: &[(&str, Expected)]) -> Result<(), RpcError> {
    let responses = match params.get("inputResponses") {
        None => return Ok(()),
        Some(Value::Object(r)) => r,
        Some(_) => {
            return Err(RpcError::invalid_params("Invalid request parameters")
                .with_data(json!({"inputResponses": "must be an object"})));
        }
    };
    let mut problems = Map::new();
    for (key, answer) in responses {
        let checked = match asked.iter().find(|(k, _)| k == key) {
            Some((_, expected)) => expected.check(answer),
            None => check_any(answer),
        };
        if let Err(problem) = checked {
            problems.insert(key.clone(), json!(problem));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(invalid(problems))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Value {
        json!({"role": "assistant", "content": {"type": "text", "text": "hi"}, "model": "m"})
    }

    #[test]
    fn each_answer_must_be_the_result_of_its_request() {
        assert!(Expected::Sampling.check(&sample()).is_ok());
        let mut blocks = sample();
        blocks["content"] = json!([{"type": "text", "text": "a"}, {"type": "image"}]);
        assert!(Expected::Sampling.check(&blocks).is_ok());
        assert!(Expected::Roots.check(&json!({"roots": []})).is_ok());
        assert!(
            Expected::Roots
                .check(&json!({"roots": [{"uri": "file:///a", "name": "a"}]}))
                .is_ok()
        );
        assert!(
            Expected::Elicitation
                .check(&json!({"action": "decline"}))
                .is_ok()
        );
        // Extra members are ignored.
        assert!(
            Expected::Roots
                .check(&json!({"roots": [], "error": {"code": -1}}))
                .is_ok()
        );

        let error = json!({"error": {"code": -32603, "message": "declined"}});
        for expected in [Expected::Sampling, Expected::Roots, Expected::Elicitation] {
            assert!(expected.check(&error).is_err(), "{expected:?}");
            assert!(expected.check(&json!({})).is_err());
            assert!(expected.check(&Value::Null).is_err());
        }
        assert!(check_any(&error).is_err());
        assert!(Expected::Sampling.check(&json!({"roots": []})).is_err());
        assert!(
            Expected::Sampling
                .check(&json!({"action": "decline"}))
                .is_err()
        );
        let mut no_model = sample();
        no_model.as_object_mut().unwrap().remove("model");
        assert!(Expected::Sampling.check(&no_model).is_err());
        assert!(
            Expected::Roots
                .check(&json!({"roots": [{"uri": "/srv/a"}]}))
                .is_err()
        );
        assert!(
            Expected::Elicitation
                .check(&json!({"action": "maybe"}))
                .is_err()
        );
    }

    #[test]
    fn retries_are_checked_against_the_union_and_the_keys_asked() {
        let asked = [("roots-1", Expected::Roots)];
        let ok = json!({"inputResponses": {"roots-1": {"roots": []}, "other": sample()}});
        assert!(check_retry(&ok, &asked).is_ok());
        assert!(check_retry(&json!({}), &asked).is_ok());
        let wrong_type = json!({"inputResponses": {"roots-1": sample()}});
        let e = check_retry(&wrong_type, &asked).unwrap_err();
        assert_eq!(e.code, crate::rpc::INVALID_PARAMS);
        assert_eq!(e.message, "Invalid request parameters");
        assert!(e.data.unwrap()["inputResponses"]["roots-1"].is_string());
        let error = json!({"inputResponses": {"roots-1": {"error": {"code": -32603}}}});
        assert!(check_retry(&error, &asked).is_err());
        let garbage = json!({"inputResponses": {"other": {"error": {}}}});
        assert!(check_retry(&garbage, &asked).is_err());
        assert!(check_retry(&json!({"inputResponses": []}), &asked).is_err());
    }
}
