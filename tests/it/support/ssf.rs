//! Security events for the operator's black-box tests: two push transmitters sharing the
//! fixture keys, signed SETs, and pushing them to the operator's `/ssf/push`.

use serde_json::{Value, json};

use super::cluster::{Cluster, SetSigner};

pub const TRANSMITTER: &str = "https://ssf.idp.test";
pub const AUDIENCE: &str = "https://lifeguard.test/ssf";
pub const SECOND_TRANSMITTER: &str = "https://ssf2.idp.test";
pub const ACCOUNT_DISABLED: &str =
    "https://schemas.openid.net/secevent/risc/event-type/account-disabled";
pub const ACCOUNT_ENABLED: &str =
    "https://schemas.openid.net/secevent/risc/event-type/account-enabled";

/// Two push transmitters (without push bearer, sharing the fixture keys), each with `extra`
/// settings appended (YAML lines at transmitter level).
pub fn two_push_transmitters(first: &[&str], second: &[&str]) -> String {
    let jwks = std::fs::read_to_string(super::fixture("keys/issuer-b-jwks.json")).unwrap();
    let jwks: Value = serde_json::from_str(&jwks).unwrap();
    let transmitter = |issuer: &str, extra: &[&str]| {
        let mut t = format!("    - issuer: {issuer}\n      jwks: {jwks}\n      delivery: push\n");
        for line in extra {
            t.push_str(&format!("      {line}\n"));
        }
        t
    };
    format!(
        "securityEvents:\n  audience: {AUDIENCE}\n  transmitters:\n{}{}",
        transmitter(TRANSMITTER, first),
        transmitter(SECOND_TRANSMITTER, second)
    )
}

/// A SET of `transmitter` with one `event` about `subject` at the token issuer.
pub fn event_set(transmitter: &str, jti: &str, subject: &str, event: &str) -> String {
    let now = jiff::Timestamp::now().as_second();
    let claims = json!({
        "iss": transmitter, "aud": AUDIENCE, "iat": now, "jti": jti,
        "sub_id": {"format": "iss_sub", "iss": super::ISSUER, "sub": subject},
        "events": {event: {"event_timestamp": now - 1}}
    });
    SetSigner::default().sign(&claims, "test-b-ed-1", "secevent+jwt")
}

pub async fn push_set(cluster: &Cluster, set: String) -> reqwest::Response {
    cluster
        .operator
        .ca
        .client()
        .post(format!("{}/ssf/push", cluster.operator.url))
        .header("content-type", "application/secevent+jwt")
        .body(set)
        .send()
        .await
        .unwrap()
}

pub async fn revocation_names(cluster: &Cluster) -> Vec<String> {
    let list = cluster
        .get("/apis/lifeguard.dev/v1alpha1/principalrevocations")
        .await
        .unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["metadata"]["name"].as_str().unwrap().to_owned())
        .collect()
}
