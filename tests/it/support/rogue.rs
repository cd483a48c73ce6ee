//! Helpers for the hardening tests: the example server's full request log
//! (`/_example/rogue/requests`, every header and body that reached it), requests the standard
//! client cannot send (raw header lists), tokens of other issuers, and the sidecar's metrics.

use std::path::Path;

use jsonwebtoken::Algorithm;
use serde_json::{Value, json};

use super::client::{McpClient, PROTOCOL_VERSION};
use super::{ExampleServer, Sidecar, User};

/// One `POST /mcp` the example server received.
#[derive(Clone, Debug)]
pub struct Received(pub Value);

impl Received {
    /// The body as the server read it (`null` when it was not JSON).
    pub fn body(&self) -> &Value {
        &self.0["body"]
    }

    pub fn method(&self) -> Option<&str> {
        self.body()["method"].as_str()
    }

    /// Every header as (lowercase name, value); Authorization values are redacted.
    pub fn headers(&self) -> Vec<(String, String)> {
        self.0["headers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|h| {
                (
                    h[0].as_str().unwrap_or_default().to_owned(),
                    h[1].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }

    /// The value of the (first) header `name`.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers()
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
    }

    /// How many Authorization headers it carried.
    pub fn authorizations(&self) -> u64 {
        self.0["authorizations"].as_u64().unwrap_or(0)
    }
}

impl ExampleServer {
    /// Every `POST /mcp` the server received, oldest first (the last 1000).
    pub async fn received(&self) -> Vec<Received> {
        self.debug("/_example/rogue/requests")
            .await
            .as_array()
            .expect("request log array")
            .iter()
            .cloned()
            .map(Received)
            .collect()
    }
}

impl Sidecar {
    /// The value of one sample of the admin `/metrics` exposition, e.g.
    /// `lifeguard_anomalies_total{reason="response_mismatch"}`; 0 when absent.
    pub async fn metric(&self, sample: &str) -> f64 {
        let text = reqwest::get(format!("{}/metrics", self.admin))
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("metrics text");
        text.lines()
            .find_map(|line| line.strip_prefix(sample)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// `lifeguard_anomalies_total{reason="<reason>"}`.
    pub async fn anomalies(&self, reason: &str) -> f64 {
        self.metric(&format!("lifeguard_anomalies_total{{reason=\"{reason}\"}}"))
            .await
    }
}

impl User {
    /// A token like [`User::token`], but from `issuer`, signed with the Ed25519 key at `key`
    /// under `kid`.
    pub fn token_of_issuer(&self, issuer: &str, key: &Path, kid: &str) -> String {
        let now = jiff::Timestamp::now().as_second();
        let claims = json!({
            "iss": issuer, "aud": super::RESOURCE, "sub": self.subject, "tid": self.tenant,
            "client_id": self.client, "scope": self.scopes,
            "iat": now, "nbf": now - 5, "exp": now + 3600,
        });
        let key = std::fs::read(key).unwrap();
        lifeguard::identity::mint::mint_token(&key, Algorithm::EdDSA, Some(kid), &claims).unwrap()
    }
}

/// Posts `body` to the sidecar with exactly `headers` besides the content headers and the MCP
/// protocol version (names may repeat, and keep their case and underscores); returns the status
/// and the body as JSON (`null` when it is not).
pub async fn post_with_headers(
    client: &McpClient,
    headers: &[(&str, &str)],
    body: &Value,
) -> (u16, Value) {
    post_raw_with_headers(client, headers, body.to_string()).await
}

/// [`post_with_headers`] with a body given as text.
pub async fn post_raw_with_headers(
    client: &McpClient,
    headers: &[(&str, &str)],
    body: String,
) -> (u16, Value) {
    let mut map = reqwest::header::HeaderMap::new();
    for (name, value) in [
        ("content-type", "application/json"),
        ("accept", "application/json"),
        ("mcp-protocol-version", PROTOCOL_VERSION),
    ]
    .iter()
    .chain(headers)
    {
        map.append(
            reqwest::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            reqwest::header::HeaderValue::from_str(value).unwrap(),
        );
    }
    let response = reqwest::Client::new()
        .post(&client.url)
        .headers(map)
        .body(body)
        .send()
        .await
        .expect("HTTP request");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}
