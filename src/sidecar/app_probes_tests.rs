use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

const CONTRACT_EXAMPLE: &str = r#"{
  "reports/livez": {"httpGet": {"path": "/healthz", "port": 15080, "scheme": "HTTP",
    "httpHeaders": [{"name": "X", "value": "y"}]}},
  "reports/readyz": {"tcpSocket": {"port": 15080}}
}"#;

fn refusal(json: &str) -> String {
    AppProbes::parse(json).unwrap_err().to_string()
}

#[test]
fn the_contract_example_parses() {
    let probes = AppProbes::parse(CONTRACT_EXAMPLE).unwrap();
    assert_eq!(
        probes.get("reports", "livez"),
        Some(&AppProbe::HttpGet {
            path: PathAndQuery::from_static("/healthz"),
            port: 15080,
            headers: vec![(HeaderName::from_static("x"), HeaderValue::from_static("y"))],
        })
    );
    assert_eq!(
        probes.get("reports", "readyz"),
        Some(&AppProbe::TcpSocket { port: 15080 })
    );
    assert_eq!(probes.get("reports", "startupz"), None);
    assert_eq!(probes.get("reports", "healthz"), None);
    assert_eq!(probes.get("other", "livez"), None);
    assert!(AppProbes::parse("{}").unwrap().is_empty());
}

#[test]
fn paths_default_to_the_root_and_gain_a_leading_slash_as_with_the_kubelet() {
    let probes = AppProbes::parse(
        r#"{"a/livez": {"httpGet": {"port": 1}}, "a/readyz": {"httpGet": {"path": "ready?full=1", "port": 2}}}"#,
    )
    .unwrap();
    let path = |kind| match probes.get("a", kind) {
        Some(AppProbe::HttpGet { path, .. }) => path.as_str().to_owned(),
        other => panic!("{other:?}"),
    };
    assert_eq!(path("livez"), "/");
    assert_eq!(path("readyz"), "/ready?full=1");
}

#[test]
fn what_cannot_be_carried_through_the_sidecar_is_refused_naming_key_and_field() {
    let cases: &[(&str, &[&str])] = &[
        (
            r#"{"a/livez": {"httpGet": {"port": 1, "scheme": "HTTPS"}}}"#,
            &["a/livez", "httpGet.scheme", "HTTPS"],
        ),
        (
            r#"{"a/livez": {"httpGet": {"port": 1, "host": "10.0.0.1"}}}"#,
            &["a/livez", "httpGet.host", "127.0.0.1 only"],
        ),
        (
            r#"{"a/livez": {"tcpSocket": {"port": 1, "host": "db"}}}"#,
            &["tcpSocket.host"],
        ),
        (
            r#"{"a/livez": {"httpGet": {"port": 1, "hots": "x"}}}"#,
            &["a/livez", "httpGet", "unknown field `hots`"],
        ),
        (
            r#"{"a/livez": {"httpGet": {"port": 1}, "timeoutSeconds": 1}}"#,
            &["unknown field `timeoutSeconds`"],
        ),
        (
            r#"{"a/livez": {"httpGet": {"port": 1, "httpHeaders": [{"name": "X", "value": "y", "extra": 1}]}}}"#,
            &["httpHeaders[0]", "unknown field `extra`"],
        ),
        (
            r#"{"a/livez": {"httpGet": {"port": 1, "httpHeaders": [{"name": "bad header", "value": "y"}]}}}"#,
            &["httpHeaders[0].name"],
        ),
        (
            r#"{"a/livez": {"grpc": {"port": 1}}}"#,
            &["only httpGet and tcpSocket"],
        ),
        (
            r#"{"a/livez": {"exec": {"command": ["true"]}}}"#,
            &["only httpGet and tcpSocket"],
        ),
        (
            r#"{"a/livez": {"httpGet": {"port": 1}, "tcpSocket": {"port": 1}}}"#,
            &["exactly one"],
        ),
        (r#"{"a/livez": {}}"#, &["exactly one"]),
        (
            r#"{"a/livez": {"httpGet": {"port": "http"}}}"#,
            &["httpGet.port", "named port"],
        ),
        (
            r#"{"a/livez": {"tcpSocket": {"port": 0}}}"#,
            &["tcpSocket.port", "not a port number"],
        ),
        (
            r#"{"a/livez": {"tcpSocket": {"port": 70000}}}"#,
            &["not a port number"],
        ),
        (r#"{"a/livez": {"httpGet": {}}}"#, &["missing field `port`"]),
        (
            r#"{"reports": {"tcpSocket": {"port": 1}}}"#,
            &["<container>/"],
        ),
        (
            r#"{"reports/healthz": {"tcpSocket": {"port": 1}}}"#,
            &["\"healthz\" is not a probe kind"],
        ),
        (
            r#"{"Reports/livez": {"tcpSocket": {"port": 1}}}"#,
            &["\"Reports\" is not a container name"],
        ),
        (
            r#"{"/livez": {"tcpSocket": {"port": 1}}}"#,
            &["is not a container name"],
        ),
        (r#"[]"#, &["not a JSON object"]),
        (r#"{"a/livez": "#, &["not a JSON object"]),
    ];
    for (json, expected) in cases {
        let message = refusal(json);
        for part in *expected {
            assert!(message.contains(part), "{json}: {message:?} lacks {part:?}");
        }
    }
}

#[test]
fn verdicts_follow_the_kubelet() {
    let status = |outcome: ProbeOutcome| outcome.response().0.as_u16();
    for code in [200, 204, 301, 302, 399] {
        let answered = ProbeOutcome::Answered(StatusCode::from_u16(code).unwrap());
        assert_eq!(status(answered), 200, "{code}");
    }
    for code in [400, 404, 500, 503] {
        let answered = ProbeOutcome::Answered(StatusCode::from_u16(code).unwrap());
        assert_eq!(status(answered), 503, "{code}");
    }
    assert_eq!(status(ProbeOutcome::Connected), 200);
    assert_eq!(status(ProbeOutcome::Unreachable("refused".into())), 503);
    assert_eq!(status(ProbeOutcome::Failed("closed".into())), 503);
    assert_eq!(status(ProbeOutcome::TimedOut), 503);
    assert!(
        ProbeOutcome::Answered(StatusCode::INTERNAL_SERVER_ERROR)
            .response()
            .1
            .contains("500")
    );
}

/// A port nothing listens on.
async fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}

/// Answers one request with `reply` and returns the request head it read.
async fn one_shot_server(reply: &'static str) -> (u16, tokio::task::JoinHandle<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        stream.write_all(reply.as_bytes()).await.unwrap();
        String::from_utf8(head).unwrap()
    });
    (port, task)
}

#[tokio::test]
async fn an_http_probe_sends_the_configured_request_to_loopback() {
    let (port, server) =
        one_shot_server("HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n").await;
    let probe = AppProbe::HttpGet {
        path: PathAndQuery::from_static("/healthz?deep=1"),
        port,
        headers: vec![
            (
                HeaderName::from_static("x-probe"),
                HeaderValue::from_static("yes"),
            ),
            (header::USER_AGENT, HeaderValue::from_static("custom-agent")),
        ],
    };
    assert_eq!(
        run(&probe, PROBE_TIMEOUT).await,
        ProbeOutcome::Answered(StatusCode::NO_CONTENT)
    );
    let head = server.await.unwrap().to_ascii_lowercase();
    assert!(
        head.starts_with("get /healthz?deep=1 http/1.1\r\n"),
        "{head}"
    );
    for line in [
        "x-probe: yes",
        "user-agent: custom-agent",
        &format!("host: 127.0.0.1:{port}"),
        "accept: */*",
        "connection: close",
    ] {
        assert!(head.contains(line), "{head} lacks {line}");
    }
    assert!(!head.contains("kube-probe"), "{head}");
}

#[tokio::test]
async fn an_http_error_status_is_reported_as_such() {
    let (port, _server) =
        one_shot_server("HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\n\r\nboom")
            .await;
    let probe = AppProbe::HttpGet {
        path: PathAndQuery::from_static("/"),
        port,
        headers: Vec::new(),
    };
    assert_eq!(
        run(&probe, PROBE_TIMEOUT).await,
        ProbeOutcome::Answered(StatusCode::INTERNAL_SERVER_ERROR)
    );
}

#[tokio::test]
async fn tcp_probes_see_an_open_or_closed_port() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let open = listener.local_addr().unwrap().port();
    assert_eq!(
        run(&AppProbe::TcpSocket { port: open }, PROBE_TIMEOUT).await,
        ProbeOutcome::Connected
    );
    let closed = closed_port().await;
    assert!(matches!(
        run(&AppProbe::TcpSocket { port: closed }, PROBE_TIMEOUT).await,
        ProbeOutcome::Unreachable(_)
    ));
    let http = AppProbe::HttpGet {
        path: PathAndQuery::from_static("/"),
        port: closed,
        headers: Vec::new(),
    };
    assert!(matches!(
        run(&http, PROBE_TIMEOUT).await,
        ProbeOutcome::Unreachable(_)
    ));
}

#[tokio::test]
async fn an_app_that_accepts_but_never_answers_times_out() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let _held = tokio::spawn(async move {
        let (_stream, _) = listener.accept().await.unwrap();
        std::future::pending::<()>().await;
    });
    let probe = AppProbe::HttpGet {
        path: PathAndQuery::from_static("/"),
        port,
        headers: Vec::new(),
    };
    assert_eq!(
        run(&probe, Duration::from_millis(200)).await,
        ProbeOutcome::TimedOut
    );
}

#[tokio::test]
async fn a_peer_that_closes_without_answering_fails_the_probe() {
    let (port, _server) = one_shot_server("").await;
    let probe = AppProbe::HttpGet {
        path: PathAndQuery::from_static("/"),
        port,
        headers: Vec::new(),
    };
    assert!(matches!(
        run(&probe, PROBE_TIMEOUT).await,
        ProbeOutcome::Failed(_)
    ));
}
