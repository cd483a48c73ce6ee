//! Proof-of-possession-bound tasks, black box: a real DPoP client (Python, joserfc) against the
//! real sidecar. A task created with a DPoP-bound token belongs to that key: a stolen bearer
//! copy of the token, the same user's bearer token and the same user's other key all get
//! nowhere; proofs that are replayed, made for another method or URI, or for another token
//! are refused; server nonces work; an issuer that requires binding refuses bearer tokens.

use crate::support;
use crate::support::alice;

use serde_json::{Value, json};
use support::dpop::{DpopClient, DpopReply};
use support::{McpClient, RESOURCE, Sidecar, SidecarOptions};

const TASK_TOOLS: &str = r#"  tasks:
    tools: [slow_compute, confirm_action]
    minPollInterval: 100ms
"#;

async fn sidecar_with(identity: &str) -> (support::ExampleServer, Sidecar, McpClient) {
    let server = support::ExampleServer::start();
    let sidecar = Sidecar::start(
        &server.url,
        SidecarOptions {
            spec: TASK_TOOLS.into(),
            identity: identity.into(),
            ..Default::default()
        },
    )
    .await;
    let client = McpClient::new(&sidecar.url);
    (server, sidecar, client)
}

fn challenge(headers: &http::HeaderMap) -> String {
    headers
        .get_all("www-authenticate")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect::<Vec<_>>()
        .join(" | ")
}

fn task_id(reply: &DpopReply) -> String {
    assert_eq!(reply.status, 200, "{reply:?}");
    reply.result()["taskId"].as_str().unwrap().to_owned()
}

fn assert_task_not_found(reply: &support::client::Reply, who: &str) {
    assert_eq!(reply.status, 400, "{who}: {reply:?}");
    assert_eq!(reply.body["error"]["message"], "Task not found", "{who}");
}

#[tokio::test]
async fn a_stolen_copy_of_a_dpop_bound_token_cannot_read_answer_or_cancel_the_task() {
    let (_server, sidecar, client) = sidecar_with("").await;
    let url = sidecar.url.clone();
    let mut owner = DpopClient::start(&url).await;
    let token = owner.token_for(&alice());

    let created = owner
        .call(
            &token,
            "tools/call",
            json!({"name": "slow_compute", "arguments": {"seconds": 30}}),
        )
        .await;
    let id = task_id(&created);
    let read = owner.call(&token, "tasks/get", json!({"taskId": id})).await;
    assert_eq!(read.status, 200, "{read:?}");
    assert_eq!(read.result()["taskId"], id.as_str());

    // The token copied from a log, used as a bearer token: refused before anything is read.
    for method in ["tasks/get", "tasks/cancel"] {
        let stolen = client.task(&token, method, &id).await;
        assert_eq!(stolen.status, 401, "{method}: {stolen:?}");
        let challenge = challenge(&stolen.headers);
        assert!(
            challenge.starts_with("DPoP error=\"invalid_token\""),
            "{challenge}"
        );
    }
    let stolen_update = client
        .request(
            "tasks/update",
            json!({"taskId": id, "inputResponses": {"x": {"action": "accept"}}}),
        )
        .token(&token)
        .send()
        .await;
    assert_eq!(stolen_update.status, 401, "{stolen_update:?}");
    // With the DPoP scheme but no proof of the key (the thief has none).
    let no_proof = client
        .request("tasks/get", json!({"taskId": id}))
        .header("authorization", &format!("DPoP {token}"))
        .send()
        .await;
    assert_eq!(no_proof.status, 401);
    assert!(
        challenge(&no_proof.headers).contains("error=\"invalid_dpop_proof\""),
        "{}",
        challenge(&no_proof.headers)
    );
    // A proof of the thief's own key for the stolen token.
    let mut thief = DpopClient::start(&url).await;
    let wrong_key = thief
        .call(&token, "tasks/cancel", json!({"taskId": id}))
        .await;
    assert_eq!(wrong_key.status, 401, "{wrong_key:?}");
    assert!(
        wrong_key
            .header("www-authenticate")
            .contains("error=\"invalid_dpop_proof\"")
    );

    // The same user with a bearer token, and with another key bound into a token of their
    // own: another caller for this task, told what everyone is told.
    let bearer = client.get_task(&alice().token(), &id).await;
    assert_task_not_found(&bearer, "alice's bearer token");
    let cancel = client.cancel_task(&alice().token(), &id).await;
    assert_task_not_found(&cancel, "alice's bearer cancel");
    let other_token = thief.token_for(&alice());
    let other_key = thief
        .call(&other_token, "tasks/get", json!({"taskId": id}))
        .await;
    assert_eq!(other_key.status, 400, "{other_key:?}");
    assert_eq!(other_key.body["error"]["message"], "Task not found");

    // Still the owner's, still running.
    let read = owner.call(&token, "tasks/get", json!({"taskId": id})).await;
    assert_eq!(read.result()["status"], "working", "{read:?}");
    let cancelled = owner
        .call(&token, "tasks/cancel", json!({"taskId": id}))
        .await;
    assert_eq!(cancelled.status, 200, "{cancelled:?}");

    // The audit names the key the task is bound to.
    let created = sidecar
        .audit_event(|e| e["event"] == "task.created")
        .await
        .expect("task.created audited");
    assert_eq!(
        created["detail"]["keyBinding"],
        format!("jkt:{}", owner.jkt),
        "{created}"
    );
    let refused = sidecar
        .audit_event(|e| e["reason"] == "foreign_key")
        .await
        .expect("the foreign key audited");
    assert_eq!(refused["decision"], "deny");
}

#[tokio::test]
async fn replayed_and_mismatched_proofs_are_refused() {
    let (_server, sidecar, _client) = sidecar_with("").await;
    let url = sidecar.url.clone();
    let mut client = DpopClient::start(&url).await;
    let token = client.token_for(&alice());
    let list = |reply: &DpopReply| (reply.status, reply.header("www-authenticate").to_owned());

    let first = client.call(&token, "tools/list", json!({})).await;
    assert_eq!(first.status, 200, "{first:?}");
    let replayed = client
        .call_with(&token, "tools/list", json!({}), |c| {
            c["replay"] = json!(first.proof)
        })
        .await;
    let (status, challenge) = list(&replayed);
    assert_eq!(status, 401);
    assert!(
        challenge.contains("error=\"invalid_dpop_proof\"") && challenge.contains("used before"),
        "{challenge}"
    );

    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "htm GET",
            json!({"htu": RESOURCE, "htm": "GET"}),
            "another HTTP method",
        ),
        (
            "htu of another server",
            json!({"htu": "https://elsewhere.example/mcp"}),
            "another URI",
        ),
        (
            "htu of the sidecar's own address",
            json!({"htu": url}),
            "another URI",
        ),
        (
            "ath of another token",
            json!({"htu": RESOURCE, "ath_of": "another-token"}),
            "hash of the access token",
        ),
        ("no ath", json!({"htu": RESOURCE, "ath_of": null}), "`ath`"),
        (
            "iat ten minutes old",
            json!({"htu": RESOURCE, "iat_offset": -600}),
            "iat",
        ),
    ];
    for (what, proof, says) in cases {
        let reply = client
            .call_with(&token, "tools/list", json!({}), |c| c["proof"] = proof)
            .await;
        let (status, challenge) = list(&reply);
        assert_eq!(status, 401, "{what}: {reply:?}");
        assert!(
            challenge.contains("error=\"invalid_dpop_proof\"") && challenge.contains(says),
            "{what}: {challenge}"
        );
        assert!(challenge.contains("algs=\"ES256"), "{what}: {challenge}");
    }
    // A proper proof still works after all that.
    let again = client.call(&token, "tools/list", json!({})).await;
    assert_eq!(again.status, 200, "{again:?}");
}

#[tokio::test]
async fn server_nonces_are_asked_for_and_used_when_the_policy_requires_them() {
    let (_server, sidecar, _client) = sidecar_with("    dpop: {requireNonce: true}\n").await;
    let url = sidecar.url.clone();
    let mut client = DpopClient::start(&url).await;
    let token = client.token_for(&alice());

    // The first request has no nonce: the sidecar answers use_dpop_nonce with one, and the
    // client retries with it.
    let first = client.call(&token, "tools/list", json!({})).await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.attempts, 2, "retried once with the server's nonce");
    assert!(
        !first.header("dpop-nonce").is_empty(),
        "a nonce for next time"
    );
    // The next request uses the nonce it was given: no refusal.
    let second = client.call(&token, "tools/list", json!({})).await;
    assert_eq!((second.status, second.attempts), (200, 1), "{second:?}");

    // A nonce the server never issued.
    let forged = client
        .call_with(&token, "tools/list", json!({}), |c| {
            c["proof"]["nonce"] = json!("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA");
            c["retry_nonce"] = json!(false);
        })
        .await;
    assert_eq!(forged.status, 401, "{forged:?}");
    assert!(
        forged
            .header("www-authenticate")
            .starts_with("DPoP error=\"use_dpop_nonce\"")
    );
    assert!(!forged.header("dpop-nonce").is_empty());
}

#[tokio::test]
async fn an_issuer_that_requires_binding_refuses_bearer_tokens_and_says_so() {
    let (_server, sidecar, client) = sidecar_with("        proofOfPossession: required\n").await;
    let url = sidecar.url.clone();

    let bearer = client
        .request("tools/list", json!({}))
        .token(&alice().token())
        .send()
        .await;
    assert_eq!(bearer.status, 401, "{bearer:?}");
    let bearer_challenge = challenge(&bearer.headers);
    assert!(
        bearer_challenge.starts_with("DPoP error=\"invalid_token\"")
            && bearer_challenge.contains("requires DPoP-bound"),
        "{bearer_challenge}"
    );
    // Without any token, only the DPoP scheme is offered.
    let anonymous = client.request("tools/list", json!({})).send().await;
    let anonymous_challenge = challenge(&anonymous.headers);
    assert!(
        anonymous_challenge.starts_with("DPoP algs=") && !anonymous_challenge.contains("Bearer"),
        "{anonymous_challenge}"
    );
    let metadata: Value = reqwest::get(format!(
        "{}/.well-known/oauth-protected-resource/mcp",
        sidecar.url.trim_end_matches("/mcp")
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(metadata["dpop_bound_access_tokens_required"], true);
    assert_eq!(
        metadata["dpop_signing_alg_values_supported"],
        json!(["ES256", "ES384", "EdDSA", "PS256", "RS256"])
    );

    let mut client = DpopClient::start(&url).await;
    let token = client.token_for(&alice());
    let bound = client.call(&token, "tools/list", json!({})).await;
    assert_eq!(bound.status, 200, "{bound:?}");
}

#[tokio::test]
async fn replicas_on_postgresql_share_the_replay_cache_and_the_key_binding() {
    use support::replicas::{ReplicaOptions, Replicas};
    let replicas = Replicas::start(
        2,
        ReplicaOptions {
            spec: TASK_TOOLS.into(),
            ..Default::default()
        },
    )
    .await;
    let mut at_a = DpopClient::start(&replicas.sidecars[0].url).await;
    let token = at_a.token_for(&alice());

    // A proof used at one replica is a replay at the other.
    let first = at_a.call(&token, "tools/list", json!({})).await;
    assert_eq!(first.status, 200, "{first:?}");
    let mut at_b = DpopClient::start(&replicas.sidecars[1].url).await;
    let replayed = at_b
        .call_with(&token, "tools/list", json!({}), |c| {
            c["replay"] = json!(first.proof)
        })
        .await;
    assert_eq!(replayed.status, 401, "{replayed:?}");
    assert!(replayed.header("www-authenticate").contains("used before"));

    // A task bound to A's key, created through replica A, read through replica B (forwarded
    // to its home over the internal hop, where the proof is checked again but not recorded
    // again) with A's key — and refused there to the same user's bearer token.
    let created = at_a
        .call(
            &token,
            "tools/call",
            json!({"name": "slow_compute", "arguments": {"seconds": 30}}),
        )
        .await;
    let id = task_id(&created);
    at_a.url = replicas.sidecars[1].url.clone();
    let read = at_a.call(&token, "tasks/get", json!({"taskId": id})).await;
    assert_eq!(read.status, 200, "{read:?}");
    assert_eq!(read.result()["taskId"], id.as_str());
    let bearer = replicas.client(1).get_task(&alice().token(), &id).await;
    assert_task_not_found(&bearer, "alice's bearer token at replica B");
    let cancelled = at_a
        .call(&token, "tasks/cancel", json!({"taskId": id}))
        .await;
    assert_eq!(cancelled.status, 200, "{cancelled:?}");
}

/// A client certificate as a mesh proxy describes it in `x-forwarded-client-cert` (its
/// `Hash`), and its RFC 8705 thumbprint.
fn client_certificate() -> (String, String) {
    use base64::Engine;
    use sha2::Digest;
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["client.test".into()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let digest = sha2::Sha256::digest(cert.der());
    let xfcc = format!(
        "By=spiffe://cluster.local/ns/tests/sa/server;Hash={};URI=spiffe://cluster.local/ns/tests/sa/client",
        hex::encode(digest)
    );
    let thumbprint = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest);
    (xfcc, thumbprint)
}

#[tokio::test]
async fn a_certificate_bound_token_works_only_with_its_certificate_from_a_trusted_proxy() {
    const XFCC: &str = "x-forwarded-client-cert";
    let (_server, sidecar, client) =
        sidecar_with("    clientCertificates: {header: x-forwarded-client-cert, format: xfcc}\n")
            .await;
    let (xfcc, thumbprint) = client_certificate();
    let (other_xfcc, _) = client_certificate();
    let token = alice().token_with(|claims| claims["cnf"] = json!({"x5t#S256": thumbprint}));

    let created = client
        .request(
            "tools/call",
            json!({"name": "slow_compute", "arguments": {"seconds": 30}}),
        )
        .token(&token)
        .header(XFCC, &xfcc)
        .send()
        .await;
    assert_eq!(created.status, 200, "{created:?}");
    let id = created.result()["taskId"].as_str().unwrap().to_owned();
    let get = |xfcc: Option<&str>, token: &str| {
        let mut request = client
            .request("tasks/get", json!({"taskId": id}))
            .token(token);
        if let Some(xfcc) = xfcc {
            request = request.header(XFCC, xfcc);
        }
        request.send()
    };
    assert_eq!(get(Some(&xfcc), &token).await.status, 200);
    // The token without its certificate, or with another one: refused before the body.
    assert_eq!(get(None, &token).await.status, 401);
    assert_eq!(get(Some(&other_xfcc), &token).await.status, 401);
    // The same user's bearer token, even over the same certificate: not the key's holder.
    assert_task_not_found(
        &get(Some(&xfcc), &alice().token()).await,
        "alice's bearer token",
    );

    // A sidecar that trusts no proxy on loopback drops the header: the token is refused.
    let (_server, untrusting, untrusting_client) = sidecar_with(
        "    clientCertificates: {header: x-forwarded-client-cert, format: xfcc, trustedProxies: [192.0.2.0/24]}\n",
    )
    .await;
    let refused = untrusting_client
        .request("tools/list", json!({}))
        .token(&token)
        .header(XFCC, &xfcc)
        .send()
        .await;
    assert_eq!(refused.status, 401, "{refused:?}");
    assert_eq!(
        untrusting
            .daemon
            .metric("lifeguard_anomalies_total{reason=\"untrusted_certificate_header\"}")
            .await,
        Some(1.0)
    );
    // Without clientCertificates, a certificate-bound token is refused, not taken as bearer.
    let (_server, _plain, plain_client) = sidecar_with("").await;
    let plain = plain_client
        .request("tools/list", json!({}))
        .token(&token)
        .header(XFCC, &xfcc)
        .send()
        .await;
    assert_eq!(plain.status, 401, "{plain:?}");
    drop(sidecar);
}

/// Runs `lifeguard ARGS`, returning stdout (trimmed) or panicking with stderr.
fn lifeguard(args: &[&str]) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_lifeguard"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "lifeguard {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}

#[tokio::test]
async fn dev_token_and_dev_dpop_proof_make_a_bound_token_and_its_proofs() {
    let (_server, sidecar, client) = sidecar_with("").await;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("client-dpop.pem");
    let key_arg = key.to_str().unwrap();
    let issuer_key = support::fixture("keys/issuer-ed25519.pem");
    let issuer_key = issuer_key.to_str().unwrap();
    let dev_token = |extra: &[&str]| {
        let mut args = vec![
            "dev",
            "token",
            "--key",
            issuer_key,
            "--kid",
            "test-ed-1",
            "--issuer",
            support::ISSUER,
            "--audience",
            RESOURCE,
            "--subject",
            "alice",
            "--dpop-key",
            key_arg,
        ];
        args.extend_from_slice(extra);
        lifeguard(&args)
    };
    let token = dev_token(&["--tenant", "t", "--client", "c"]);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600,
        "the new key is private"
    );
    let proof = || {
        lifeguard(&[
            "dev",
            "dpop-proof",
            "--dpop-key",
            key_arg,
            "--htu",
            RESOURCE,
            "--token",
            &token,
        ])
    };
    let send = |proof: String| {
        client
            .request("tools/list", json!({}))
            .header("authorization", &format!("DPoP {token}"))
            .header("dpop", &proof)
            .send()
    };
    let first = proof();
    assert_eq!(send(first.clone()).await.status, 200);
    assert_eq!(send(proof()).await.status, 200, "a second proof");
    assert_eq!(send(first).await.status, 401, "a replayed proof");
    // The key file is reused, not replaced: a second token is bound to the same key.
    let again = dev_token(&[]);
    let cnf = |token: &str| -> Value {
        use base64::Engine;
        let claims = token.split('.').nth(1).unwrap();
        let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(claims)
            .unwrap();
        serde_json::from_slice::<Value>(&claims).unwrap()["cnf"].clone()
    };
    assert_eq!(cnf(&again), cnf(&token));
    // An RSA key on request (PS256 proofs, which the default algorithms accept).
    let rsa_key = dir.path().join("client-rsa.pem");
    let rsa_arg = rsa_key.to_str().unwrap();
    let mut rsa_args: Vec<&str> = vec!["dev", "token", "--key", issuer_key, "--kid", "test-ed-1"];
    rsa_args.extend([
        "--issuer",
        support::ISSUER,
        "--audience",
        RESOURCE,
        "--subject",
        "bob",
    ]);
    rsa_args.extend(["--dpop-key", rsa_arg, "--dpop-alg", "PS256"]);
    let rsa_token = lifeguard(&rsa_args);
    assert_ne!(cnf(&rsa_token), cnf(&token));
    let rsa_proof = lifeguard(&[
        "dev",
        "dpop-proof",
        "--dpop-key",
        rsa_arg,
        "--htu",
        RESOURCE,
        "--token",
        &rsa_token,
    ]);
    let header = rsa_proof.split('.').next().unwrap();
    let header: Value = serde_json::from_slice(
        &base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, header).unwrap(),
    )
    .unwrap();
    assert_eq!(
        (header["alg"].as_str(), header["jwk"]["kty"].as_str()),
        (Some("PS256"), Some("RSA"))
    );
    let answered = client
        .request("tools/list", json!({}))
        .header("authorization", &format!("DPoP {rsa_token}"))
        .header("dpop", &rsa_proof)
        .send()
        .await;
    assert_eq!(answered.status, 200, "{}", answered.raw);
    // A file that is not a key is an error naming it, and is left as it was.
    std::fs::write(dir.path().join("junk.pem"), "junk").unwrap();
    let junk = std::process::Command::new(env!("CARGO_BIN_EXE_lifeguard"))
        .args(["dev", "dpop-proof", "--htu", RESOURCE, "--dpop-key"])
        .arg(dir.path().join("junk.pem"))
        .output()
        .unwrap();
    assert!(!junk.status.success());
    assert!(
        String::from_utf8_lossy(&junk.stderr).contains("junk.pem"),
        "{}",
        String::from_utf8_lossy(&junk.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("junk.pem")).unwrap(),
        "junk"
    );
    drop(sidecar);
}
