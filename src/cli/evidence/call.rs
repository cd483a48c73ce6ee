//! One MCP 2026-07-28 request under construction: conforming by default, and every part of it
//! (id, `_meta`, headers, the raw body) bendable by a check.

use serde_json::{Value, json};

/// The protocol revision every probe request names.
pub const PROTOCOL_VERSION: &str = "2026-07-28";
/// The Tasks extension's identifier, declared in every request's capabilities.
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// One MCP request under construction: a conforming 2026-07-28 request unless a check bends it.
#[derive(Clone, Debug)]
pub struct Call {
    pub label: String,
    method: String,
    params: Value,
    /// `None`: sent as a notification (no `id` member).
    id: Option<Value>,
    token: Option<String>,
    tasks: bool,
    meta: bool,
    headers: Vec<(String, String)>,
    removed: Vec<String>,
    raw_body: Option<String>,
    sse: bool,
}

impl Call {
    pub fn new(label: impl Into<String>, method: &str, params: Value) -> Self {
        Self {
            label: label.into(),
            method: method.to_owned(),
            params,
            id: Some(json!(1)),
            token: None,
            tasks: true,
            meta: true,
            headers: Vec::new(),
            removed: Vec::new(),
            raw_body: None,
            sse: false,
        }
    }

    /// `tools/call` of `tool` by a task-capable client.
    pub fn tool(label: impl Into<String>, tool: &str, arguments: Value) -> Self {
        Self::new(
            label,
            "tools/call",
            json!({"name": tool, "arguments": arguments}),
        )
    }

    /// `tasks/get`, `tasks/cancel` or `tasks/update` of `task_id`.
    pub fn task(label: impl Into<String>, method: &str, task_id: &str) -> Self {
        let mut params = json!({"taskId": task_id});
        if method == "tasks/update" {
            params["inputResponses"] =
                json!({"confirm-1": {"action": "accept", "content": {"confirm": true}}});
        }
        Self::new(label, method, params)
    }

    pub fn token(mut self, token: &str) -> Self {
        self.token = Some(token.to_owned());
        self
    }

    pub fn id(mut self, id: Value) -> Self {
        self.id = Some(id);
        self
    }

    /// Sent without an `id`: a notification.
    pub fn notification(mut self) -> Self {
        self.id = None;
        self
    }

    /// Declare no Tasks extension in this request's capabilities.
    pub fn without_tasks(mut self) -> Self {
        self.tasks = false;
        self
    }

    /// Send `params` exactly as given, without the standard `_meta`.
    pub fn without_meta(mut self) -> Self {
        self.meta = false;
        self
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.removed.push(name.to_ascii_lowercase());
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn without_header(mut self, name: &str) -> Self {
        self.removed.push(name.to_ascii_lowercase());
        self
    }

    /// Send these bytes as the body instead of the message (headers still follow the call).
    pub fn raw_body(mut self, body: String) -> Self {
        self.raw_body = Some(body);
        self
    }

    pub fn accept_sse(mut self) -> Self {
        self.sse = true;
        self
    }

    /// The JSON-RPC message: the standard `_meta` is added unless the params carry one.
    pub fn message(&self) -> Value {
        let mut params = self.params.clone();
        if self.meta && params.get("_meta").is_none() {
            params["_meta"] = request_meta(self.tasks);
        }
        let mut message = json!({"jsonrpc": "2.0", "method": self.method, "params": params});
        if let Some(id) = &self.id {
            message["id"] = id.clone();
        }
        message
    }

    pub(super) fn body(&self) -> String {
        self.raw_body
            .clone()
            .unwrap_or_else(|| self.message().to_string())
    }

    pub(super) fn headers(&self) -> Vec<(String, String)> {
        let mut h = vec![
            ("content-type".to_owned(), "application/json".to_owned()),
            (
                "accept".to_owned(),
                if self.sse {
                    "application/json, text/event-stream".to_owned()
                } else {
                    "application/json".to_owned()
                },
            ),
            (
                "mcp-protocol-version".to_owned(),
                PROTOCOL_VERSION.to_owned(),
            ),
            ("mcp-method".to_owned(), self.method.clone()),
        ];
        let name = match self.method.as_str() {
            "tools/call" | "prompts/get" => self.params["name"].as_str(),
            "resources/read" => self.params["uri"].as_str(),
            "tasks/get" | "tasks/update" | "tasks/cancel" => self.params["taskId"].as_str(),
            _ => None,
        };
        if let Some(name) = name {
            h.push(("mcp-name".to_owned(), mirrored_header_value(name)));
        }
        if let Some(token) = &self.token {
            h.push(("authorization".to_owned(), format!("Bearer {token}")));
        }
        h.retain(|(k, _)| !self.removed.contains(k));
        h.extend(self.headers.iter().cloned());
        h
    }
}

/// The `_meta` a 2026-07-28 client sends with every request.
pub fn request_meta(tasks: bool) -> Value {
    let capabilities = if tasks {
        json!({"extensions": {TASKS_EXTENSION: {}}})
    } else {
        json!({})
    };
    json!({
        "io.modelcontextprotocol/protocolVersion": PROTOCOL_VERSION,
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    })
}

/// A mirrored `Mcp-Name` value: as is when it is visible ASCII, else `=?base64?…?=`.
fn mirrored_header_value(value: &str) -> String {
    use base64::Engine;
    if value.bytes().all(|b| (0x20..0x7f).contains(&b)) && value.trim() == value {
        value.to_owned()
    } else {
        let encoded = base64::engine::general_purpose::STANDARD.encode(value);
        format!("=?base64?{encoded}?=")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_ascii_names_are_mirrored_in_base64() {
        assert_eq!(mirrored_header_value("lgt_abc"), "lgt_abc");
        assert!(mirrored_header_value("tâche").starts_with("=?base64?"));
    }
}
