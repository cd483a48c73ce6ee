//! `SidecarAuthenticator::authenticate`: one TokenReview for audience `lifeguard`, then the
//! pod the review names (from the cache, or a GET when the cache lacks it or has another
//! uid), and one named refusal per way it can go wrong.

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use crate::operator::auth::{EXTRA_POD_NAME, EXTRA_POD_UID, SidecarAuthenticator};

use super::api_server::{Exchange, mock_client};
use super::fixtures::{NS, identity, pod, pod_store};

const TOKEN: &str = "projected-token";
const REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews?";
const SERVICE_ACCOUNT: &str = "system:serviceaccount:team-a:reports";

fn pod_url() -> String {
    format!("/api/v1/namespaces/{NS}/pods/reports-0")
}

fn review_request() -> Value {
    json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
        "metadata": {},
        "spec": {"token": TOKEN, "audiences": ["lifeguard"]}
    })
}

/// The API server's answer: the request plus `status`.
fn reviewed(status: Value) -> Value {
    let mut answer = review_request();
    answer["status"] = status;
    answer
}

/// A review that authenticates `username` for `audiences` with `extra`.
fn review_status(username: &str, audiences: &[&str], extra: Value) -> Value {
    json!({
        "authenticated": true,
        "audiences": audiences,
        "user": {"username": username, "uid": "sa-uid", "extra": extra}
    })
}

fn bound_extra() -> Value {
    json!({EXTRA_POD_NAME: ["reports-0"], EXTRA_POD_UID: ["uid-reports-0"]})
}

fn good_review() -> Value {
    review_status(SERVICE_ACCOUNT, &["lifeguard"], bound_extra())
}

fn pod_json(uid: &str, service_account: &str) -> Value {
    let mut pod = serde_json::to_value(pod("reports-0")).unwrap_or_default();
    pod["metadata"]["uid"] = json!(uid);
    pod["spec"]["serviceAccountName"] = json!(service_account);
    pod
}

#[derive(Clone, Copy, Debug)]
enum Scenario {
    /// Reviewed, pod not in the cache yet: fetched.
    Accepted,
    /// Reviewed, pod in the cache with the same uid: no GET.
    AcceptedFromCache,
    /// The cache has a recreated pod's predecessor (another uid): the API server decides.
    StaleCache,
    NotAuthenticated,
    WrongAudience,
    /// The API server does not support audiences and answers without them.
    NoAudiences,
    NotServiceAccount,
    NotPodBound,
    PodNotFound,
    PodUidMismatch,
    ServiceAccountMismatch,
    ReviewApiError,
    PodApiError,
}

impl Scenario {
    fn cached(self) -> Vec<Pod> {
        match self {
            Self::AcceptedFromCache => vec![pod("reports-0")],
            Self::StaleCache => {
                let mut old = pod("reports-0");
                old.metadata.uid = Some("uid-old".into());
                vec![old]
            }
            _ => vec![],
        }
    }

    fn script(self) -> Vec<Exchange> {
        let review = Exchange::post(REVIEWS, review_request());
        let refused = |status: Value| vec![review_with(status)];
        let get_pod = Exchange::get(pod_url());
        match self {
            Self::Accepted | Self::StaleCache => vec![
                review_with(good_review()),
                get_pod.ok(pod_json("uid-reports-0", "reports")),
            ],
            Self::AcceptedFromCache => vec![review_with(good_review())],
            Self::NotAuthenticated => refused(json!({
                "authenticated": false, "error": "token has expired", "user": {}
            })),
            Self::WrongAudience => refused(review_status(
                SERVICE_ACCOUNT,
                &["https://kubernetes.default.svc"],
                bound_extra(),
            )),
            Self::NoAudiences => {
                let mut status = good_review();
                if let Some(fields) = status.as_object_mut() {
                    fields.remove("audiences");
                }
                refused(status)
            }
            Self::NotServiceAccount => {
                refused(review_status("alice", &["lifeguard"], bound_extra()))
            }
            Self::NotPodBound => refused(review_status(SERVICE_ACCOUNT, &["lifeguard"], json!({}))),
            Self::PodNotFound => vec![review_with(good_review()), get_pod.not_found()],
            Self::PodUidMismatch => vec![
                review_with(good_review()),
                get_pod.ok(pod_json("uid-other", "reports")),
            ],
            Self::ServiceAccountMismatch => vec![
                review_with(good_review()),
                get_pod.ok(pod_json("uid-reports-0", "default")),
            ],
            Self::ReviewApiError => vec![review.fail(403, "Forbidden")],
            Self::PodApiError => vec![review_with(good_review()), get_pod.server_error()],
        }
    }

    /// The refusal's metric label, or `None` when accepted.
    fn refusal(self) -> Option<&'static str> {
        match self {
            Self::Accepted | Self::AcceptedFromCache | Self::StaleCache => None,
            Self::NotAuthenticated => Some("not_authenticated"),
            Self::WrongAudience | Self::NoAudiences => Some("wrong_audience"),
            Self::NotServiceAccount => Some("not_service_account"),
            Self::NotPodBound => Some("not_pod_bound"),
            Self::PodNotFound => Some("pod_not_found"),
            Self::PodUidMismatch => Some("pod_uid_mismatch"),
            Self::ServiceAccountMismatch => Some("service_account_mismatch"),
            Self::ReviewApiError | Self::PodApiError => Some("review_failed"),
        }
    }
}

fn review_with(status: Value) -> Exchange {
    Exchange::post(REVIEWS, review_request()).respond(http::StatusCode::CREATED, reviewed(status))
}

#[tokio::test]
async fn every_review_outcome_sends_exactly_its_requests() {
    for scenario in [
        Scenario::Accepted,
        Scenario::AcceptedFromCache,
        Scenario::StaleCache,
        Scenario::NotAuthenticated,
        Scenario::WrongAudience,
        Scenario::NoAudiences,
        Scenario::NotServiceAccount,
        Scenario::NotPodBound,
        Scenario::PodNotFound,
        Scenario::PodUidMismatch,
        Scenario::ServiceAccountMismatch,
        Scenario::ReviewApiError,
        Scenario::PodApiError,
    ] {
        eprintln!("scenario {scenario:?}");
        let (client, server) = mock_client();
        let served = server.serve(scenario.script());
        let authenticator = SidecarAuthenticator::new(client, pod_store(&scenario.cached()));
        let result = authenticator.authenticate(TOKEN).await;
        drop(authenticator);
        served.verify().await;
        match scenario.refusal() {
            None => assert_eq!(result, Ok(identity("reports-0")), "{scenario:?}"),
            Some(label) => assert_eq!(
                result.as_ref().map_err(|e| e.label()),
                Err(label),
                "{scenario:?}: {result:?}"
            ),
        }
    }
}

#[tokio::test]
async fn an_empty_token_is_refused_without_asking() {
    let (client, server) = mock_client();
    let served = server.serve(vec![]);
    let authenticator = SidecarAuthenticator::new(client, pod_store(&[]));
    let result = authenticator.authenticate("").await;
    drop(authenticator);
    served.verify().await;
    assert_eq!(result.map_err(|e| e.label()), Err("missing_token"));
}

#[tokio::test]
async fn acknowledgements_reuse_a_fresh_review_but_streams_do_not() {
    let (client, server) = mock_client();
    let served = server.serve(vec![review_with(good_review()), review_with(good_review())]);
    let authenticator = SidecarAuthenticator::new(client, pod_store(&[pod("reports-0")]));
    let stream = authenticator.authenticate(TOKEN).await;
    let ack = authenticator.authenticate_cached(TOKEN).await;
    let next_stream = authenticator.authenticate(TOKEN).await;
    drop(authenticator);
    served.verify().await;
    for result in [stream, ack, next_stream] {
        assert_eq!(result, Ok(identity("reports-0")));
    }
}
