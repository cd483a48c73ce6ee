//! A tiny object authorizer for Lifeguard's `tasks.objects`: an HTTP decision point that
//! answers OpenID AuthZEN access evaluations (`POST /access/v1/evaluation`, answer
//! `{"decision": bool}`) and Kubernetes SubjectAccessReviews
//! (`POST /apis/authorization.k8s.io/v1/subjectaccessreviews`, answer `status.allowed`) from a
//! grants file.
//!
//! The grants file is read again for every decision, so editing it grants or revokes access at
//! once (tests revoke a grant mid-run this way); a grants file that cannot be read or parsed
//! answers HTTP 500, which a sidecar treats as "no decision" and refuses (fail closed).
//!
//! Like the example MCP server it does NOT use the `lifeguard` library crate: it is an
//! independent peer of the protocol it speaks.
//!
//! Run: `cargo run --example example_authorizer -- --grants examples/authorizer/grants.yaml`

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Parser;
use serde::Deserialize;
use serde_json::{Value, json};

/// Command-line flags.
#[derive(Debug, Parser)]
#[command(
    name = "example_authorizer",
    about = "Lifeguard's example object authorizer (AuthZEN evaluation and SubjectAccessReview)"
)]
struct Args {
    /// Address to listen on; port 0 picks a free port (the chosen one is printed).
    #[arg(long, default_value = "127.0.0.1:8181")]
    listen: SocketAddr,
    /// YAML or JSON file of grants, read again for every decision.
    #[arg(long)]
    grants: PathBuf,
}

/// The grants file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Grants {
    #[serde(default)]
    grants: Vec<Grant>,
}

/// One grant: who may do what to which object. Omitted fields match anything.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Grant {
    subject: String,
    #[serde(default)]
    issuer: Option<String>,
    #[serde(default)]
    tenant: Option<String>,
    #[serde(default)]
    client: Option<String>,
    /// Resource type (`resource.type`); omitted matches any.
    #[serde(default, rename = "type")]
    resource_type: Option<String>,
    /// The object, or `*` for every object of the type.
    object: String,
    /// Operations granted; omitted grants all.
    #[serde(default)]
    actions: Option<Vec<String>>,
}

/// A question, whichever shape it came in.
#[derive(Debug, Clone, serde::Serialize)]
struct Question {
    issuer: String,
    subject: String,
    tenant: String,
    client: String,
    resource_type: String,
    object: String,
    action: String,
    tool: String,
}

impl Grant {
    fn covers(&self, q: &Question) -> bool {
        let matches = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        self.subject == q.subject
            && matches(&self.issuer, &q.issuer)
            && matches(&self.tenant, &q.tenant)
            && matches(&self.client, &q.client)
            && matches(&self.resource_type, &q.resource_type)
            && (self.object == "*" || self.object == q.object)
            && self
                .actions
                .as_ref()
                .is_none_or(|a| a.iter().any(|x| x == &q.action))
    }
}

#[derive(Clone)]
struct AppState {
    grants: PathBuf,
    /// Every decision made, oldest first (served at `GET /_authorizer/decisions`).
    log: Arc<Mutex<Vec<Value>>>,
}

fn read_grants(path: &PathBuf) -> Result<Grants, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_saphyr::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn text(value: &Value, pointer: &str) -> String {
    match value.pointer(pointer) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(items)) => items
            .first()
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        _ => String::new(),
    }
}

/// Decides `question` and logs the decision with the request as received (and its W3C
/// `traceparent`, when it carried one); `Err` is why no decision could be made (answered as
/// HTTP 500).
fn decide(
    state: &AppState,
    question: Question,
    request: Value,
    headers: &HeaderMap,
) -> Result<bool, String> {
    let grants =
        read_grants(&state.grants).inspect_err(|e| eprintln!("cannot read grants: {e}"))?;
    let allowed = grants.grants.iter().any(|g| g.covers(&question));
    let traceparent = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let line = json!({
        "question": question,
        "decision": allowed,
        "request": request,
        "traceparent": traceparent,
    });
    println!("{line}");
    let _ = std::io::stdout().flush();
    state
        .log
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(line);
    Ok(allowed)
}

async fn evaluation(
    State(state): State<AppState>,
    headers: HeaderMap,
    Json(request): Json<Value>,
) -> Response {
    let question = Question {
        issuer: text(&request, "/subject/properties/issuer"),
        subject: text(&request, "/subject/id"),
        tenant: text(&request, "/subject/properties/tenant"),
        client: text(&request, "/subject/properties/client"),
        resource_type: text(&request, "/resource/type"),
        object: text(&request, "/resource/id"),
        action: text(&request, "/action/name"),
        tool: text(&request, "/resource/properties/tool"),
    };
    match decide(&state, question, request, &headers) {
        Ok(decision) => Json(json!({"decision": decision})).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
    }
}

async fn subject_access_review(
    State(state): State<AppState>,
    headers: HeaderMap,
    Json(request): Json<Value>,
) -> Response {
    let question = Question {
        issuer: text(&request, "/spec/extra/lifeguard.dev~1issuer"),
        subject: text(&request, "/spec/user"),
        tenant: text(&request, "/spec/extra/lifeguard.dev~1tenant"),
        client: text(&request, "/spec/extra/lifeguard.dev~1client"),
        resource_type: text(&request, "/spec/resourceAttributes/resource"),
        object: text(&request, "/spec/resourceAttributes/name"),
        action: text(&request, "/spec/resourceAttributes/verb"),
        tool: text(&request, "/spec/extra/lifeguard.dev~1tool"),
    };
    match decide(&state, question, request.clone(), &headers) {
        Ok(allowed) => {
            let mut review = request;
            review["status"] = json!({"allowed": allowed});
            Json(review).into_response()
        }
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
    }
}

async fn decisions(State(state): State<AppState>) -> Json<Value> {
    Json(Value::Array(
        state.log.lock().unwrap_or_else(|e| e.into_inner()).clone(),
    ))
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if let Err(e) = read_grants(&args.grants) {
        eprintln!(
            "warning: the grants file cannot be used yet ({e}); every decision fails until it can"
        );
    }
    let state = AppState {
        grants: args.grants,
        log: Arc::default(),
    };
    let app = Router::new()
        .route("/access/v1/evaluation", post(evaluation))
        .route(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            post(subject_access_review),
        )
        .route("/_authorizer/decisions", get(decisions))
        .with_state(state);
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cannot listen on {}: {e}", args.listen);
            std::process::exit(1);
        }
    };
    let address = listener.local_addr().unwrap_or(args.listen);
    println!("listening on http://{address}/access/v1/evaluation");
    let _ = std::io::stdout().flush();
    if let Err(e) = axum::serve(listener, app).await {
        eprintln!("server error: {e}");
        std::process::exit(1);
    }
}
