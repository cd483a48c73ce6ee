//! The demo's identity provider, outside the "cluster": it publishes the development issuer's
//! JWKS over HTTP on loopback (the policy's `jwksUri`), issues access tokens with
//! `lifeguard dev token`, and, as the Shared Signals transmitter the operator is configured to
//! trust, signs Security Event Tokens with the same development key. Never trust that key
//! anywhere else: its private half is in the repository (examples/standalone/).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

pub const ISSUER: &str = "https://dev-issuer.lifeguard.local";
/// The `aud` every SET carries (the operator's `securityEvents.audience`).
pub const SSF_AUDIENCE: &str = "https://lifeguard-demo.example/ssf";
pub const SESSION_REVOKED: &str =
    "https://schemas.openid.net/secevent/caep/event-type/session-revoked";

pub struct IdentityProvider {
    pub jwks_uri: String,
    pub jwks: Value,
    key: PathBuf,
    lifeguard: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for IdentityProvider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl IdentityProvider {
    pub async fn start(repo: &Path, lifeguard: &Path) -> Result<Self> {
        let standalone = repo.join("examples/standalone");
        let jwks_text = std::fs::read_to_string(standalone.join("dev-jwks.json"))?;
        let jwks: Value = serde_json::from_str(&jwks_text)?;
        let router = axum::Router::new().route(
            "/.well-known/jwks.json",
            axum::routing::get(move || {
                let body = jwks_text.clone();
                async move { ([(http::header::CONTENT_TYPE, "application/json")], body) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(Self {
            jwks_uri: format!("http://{address}/.well-known/jwks.json"),
            jwks,
            key: standalone.join("dev-issuer-key.pem"),
            lifeguard: lifeguard.to_owned(),
            task,
        })
    }

    /// An access token for `subject` of `tenant` for the server at `audience`, issued a minute
    /// ago (so a revocation of "everything issued before now" covers it).
    pub fn token(&self, subject: &str, tenant: &str, audience: &str) -> Result<String> {
        let output = std::process::Command::new(&self.lifeguard)
            .args(["dev", "token", "--kid", "dev-1", "--issuer", ISSUER])
            .arg("--key")
            .arg(&self.key)
            .args([
                "--audience",
                audience,
                "--subject",
                subject,
                "--tenant",
                tenant,
            ])
            .args(["--client", "console", "--scope", "", "--issued-ago", "1m"])
            .output()
            .context("running lifeguard dev token")?;
        if !output.status.success() {
            bail!(
                "lifeguard dev token: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(String::from_utf8(output.stdout)?.trim().to_owned())
    }

    /// A CAEP session-revoked SET for `subject`, signed as the transmitter.
    pub fn session_revoked(&self, subject: &str, jti: &str) -> Result<String> {
        let now = jiff::Timestamp::now().as_second();
        let claims = json!({
            "iss": ISSUER, "aud": SSF_AUDIENCE, "iat": now, "jti": jti,
            "sub_id": {"format": "iss_sub", "iss": ISSUER, "sub": subject},
            "events": {SESSION_REVOKED: {"event_timestamp": now, "initiating_entity": "admin"}},
        });
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
        header.kid = Some("dev-1".to_owned());
        header.typ = Some("secevent+jwt".to_owned());
        let key = jsonwebtoken::EncodingKey::from_ed_pem(&std::fs::read(&self.key)?)?;
        Ok(jsonwebtoken::encode(&header, &claims, &key)?)
    }
}
