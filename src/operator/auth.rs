//! Who is on the other end of a policy stream: the sidecar's projected ServiceAccount token is
//! checked with a `TokenReview` (audience `lifeguard`), and the review must name a pod that
//! exists with that uid and service account. The pod's identity comes only from the review;
//! what the sidecar claims is compared with it, never trusted. There is no mode without the
//! review.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use sha2::{Digest, Sha256};

use crate::distribution::{PodIdentity, TOKEN_AUDIENCE};

/// `user.extra` key the API server sets to the pod a bound token was issued for.
pub const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
/// `user.extra` key with that pod's uid.
pub const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";
const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";

/// How long a successful review is reused for acknowledgements on the same token, at most
/// (streams are always reviewed afresh).
const CACHE_TTL: Duration = Duration::from_secs(60);
/// Each entry's life is [`CACHE_TTL`] less a random part of this (uniform, millisecond steps),
/// so it lasts between 45 and 60 s: the reviews of 1,000 sidecars that connected together
/// (an operator restart, a rollout) expire spread over 15 s instead of at one instant, and the
/// acknowledgements after that are not 1,000 TokenReviews at once. Never longer than
/// `CACHE_TTL`, so a review is still reused for at most a minute.
const CACHE_JITTER: Duration = Duration::from_secs(15);
const CACHE_MAX: usize = 20_000;

/// The longest a stream stays open: the longest projected-token life the webhook configures
/// (`sidecar.tokenExpirationSeconds`, at most an hour), so every sidecar is reviewed afresh at
/// least hourly, also when its token's expiry cannot be read (bound ServiceAccount tokens always
/// carry `exp`; this covers other authenticators) or lies further out.
pub const STREAM_LIFE_MAX: Duration = Duration::from_secs(3600);
/// The shortest life a stream is given, even when its token's `exp` has passed by the
/// operator's clock (the API server, which has just accepted the token, may run behind it):
/// a sidecar is made to reconnect at most this often.
pub const STREAM_LIFE_MIN: Duration = Duration::from_secs(30);

/// How a bearer token is keyed wherever the operator remembers one (the review cache, the
/// tokens open streams were opened with): its SHA-256, never the token.
pub fn token_digest(token: &str) -> [u8; 32] {
    Sha256::digest(token).into()
}

/// The `exp` claim (seconds since the epoch) of a token the API server has just authenticated.
/// Read without verifying the signature: the review verified these exact bytes. `None` when
/// the token is not a JWT or carries no integer `exp`.
pub fn token_expiry(token: &str) -> Option<i64> {
    #[derive(serde::Deserialize)]
    struct Expiry {
        exp: i64,
    }
    jsonwebtoken::dangerous::insecure_decode_claims::<Expiry>(token)
        .ok()
        .map(|claims| claims.exp)
}

/// How long a stream opened at `now_secs` with a token expiring at `expiry` stays open before
/// the operator ends it, so that the sidecar reconnects with the token the kubelet has rotated
/// in meanwhile: until the token expires, within [`STREAM_LIFE_MIN`]..=[`STREAM_LIFE_MAX`].
pub fn stream_life(expiry: Option<i64>, now_secs: i64) -> Duration {
    let left = expiry.map_or(STREAM_LIFE_MAX, |exp| {
        Duration::from_secs(u64::try_from(exp.saturating_sub(now_secs)).unwrap_or(0))
    });
    left.clamp(STREAM_LIFE_MIN, STREAM_LIFE_MAX)
}

/// Successful reviews by token digest, each with the instant it stops being reused.
#[derive(Default)]
struct ReviewCache {
    entries: HashMap<[u8; 32], (PodIdentity, Instant)>,
}

impl ReviewCache {
    /// The identity a review of `digest` established, unless it expired at `now`.
    fn get(&self, digest: &[u8; 32], now: Instant) -> Option<PodIdentity> {
        self.entries
            .get(digest)
            .filter(|(_, expires)| now < *expires)
            .map(|(identity, _)| identity.clone())
    }

    /// Keeps a review made at `now`, until a jittered instant (see [`CACHE_JITTER`]).
    fn insert(&mut self, digest: [u8; 32], identity: PodIdentity, now: Instant) {
        if self.entries.len() >= CACHE_MAX {
            self.entries.retain(|_, (_, expires)| now < *expires);
            if self.entries.len() >= CACHE_MAX {
                self.entries.clear();
            }
        }
        self.entries
            .insert(digest, (identity, expiry(now, random_u64())));
    }
}

/// When a review made at `now` stops being reused: [`CACHE_TTL`] less `random` reduced to a
/// whole number of milliseconds within [`CACHE_JITTER`].
fn expiry(now: Instant, random: u64) -> Instant {
    let steps = u64::try_from(CACHE_JITTER.as_millis()).unwrap_or(u64::MAX);
    let jitter = Duration::from_millis(random % steps.saturating_add(1));
    now + CACHE_TTL.saturating_sub(jitter)
}

/// A random number from the OS (0 when it has none: the full [`CACHE_TTL`], as before jitter).
fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    match getrandom::fill(&mut bytes) {
        Ok(()) => u64::from_le_bytes(bytes),
        Err(_) => 0,
    }
}

/// Why a sidecar was refused. `label` is the bounded metric label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("no bearer token")]
    MissingToken,
    #[error("the token review failed: {0}")]
    ReviewFailed(String),
    #[error("the token is not authenticated: {0}")]
    NotAuthenticated(String),
    #[error("the token is not for audience {TOKEN_AUDIENCE}")]
    WrongAudience,
    #[error("the token does not belong to a service account: {0}")]
    NotServiceAccount(String),
    #[error("the token is not bound to a pod (no pod-name/pod-uid in user.extra)")]
    NotPodBound,
    #[error("pod {0} does not exist")]
    PodNotFound(String),
    #[error("pod {0} has another uid than the token names")]
    PodUidMismatch(String),
    #[error("pod {0} runs as another service account than the token names")]
    ServiceAccountMismatch(String),
    #[error("the sidecar claims to be pod {claimed}, the token belongs to {reviewed}")]
    ClaimMismatch { claimed: String, reviewed: String },
}

impl AuthError {
    pub fn label(&self) -> &'static str {
        match self {
            Self::MissingToken => "missing_token",
            Self::ReviewFailed(_) => "review_failed",
            Self::NotAuthenticated(_) => "not_authenticated",
            Self::WrongAudience => "wrong_audience",
            Self::NotServiceAccount(_) => "not_service_account",
            Self::NotPodBound => "not_pod_bound",
            Self::PodNotFound(_) => "pod_not_found",
            Self::PodUidMismatch(_) => "pod_uid_mismatch",
            Self::ServiceAccountMismatch(_) => "service_account_mismatch",
            Self::ClaimMismatch { .. } => "claim_mismatch",
        }
    }

    /// 401 when the caller is not who it says at all (retry with a fresh token), 403 when it is
    /// authenticated but not allowed this, 503 when the API server could not be asked.
    pub fn status(&self) -> http::StatusCode {
        match self {
            Self::MissingToken | Self::NotAuthenticated(_) | Self::WrongAudience => {
                http::StatusCode::UNAUTHORIZED
            }
            Self::ReviewFailed(_) => http::StatusCode::SERVICE_UNAVAILABLE,
            _ => http::StatusCode::FORBIDDEN,
        }
    }
}

/// What a successful review says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReviewedToken {
    pub namespace: String,
    pub service_account: String,
    pub pod_name: String,
    pub pod_uid: String,
}

/// The TokenReview the operator sends for `token`.
pub fn review_request(token: &str) -> TokenReview {
    TokenReview {
        metadata: Default::default(),
        spec: TokenReviewSpec {
            token: Some(token.to_owned()),
            audiences: Some(vec![TOKEN_AUDIENCE.to_owned()]),
        },
        status: None,
    }
}

fn single<'a>(
    extra: Option<&'a std::collections::BTreeMap<String, Vec<String>>>,
    key: &str,
) -> Option<&'a str> {
    match extra?.get(key)?.as_slice() {
        [one] if !one.is_empty() => Some(one.as_str()),
        _ => None,
    }
}

/// Reads a review's answer: authenticated, for our audience, a service account, bound to a pod.
pub fn interpret_review(status: Option<&TokenReviewStatus>) -> Result<ReviewedToken, AuthError> {
    let status = status.ok_or_else(|| AuthError::ReviewFailed("no status in the answer".into()))?;
    if status.authenticated != Some(true) {
        return Err(AuthError::NotAuthenticated(
            status.error.clone().unwrap_or_else(|| "rejected".into()),
        ));
    }
    // An API server that does not support audiences answers without them; the token is then
    // not known to be ours.
    if !status
        .audiences
        .as_ref()
        .is_some_and(|a| a.iter().any(|x| x == TOKEN_AUDIENCE))
    {
        return Err(AuthError::WrongAudience);
    }
    let user = status
        .user
        .as_ref()
        .ok_or_else(|| AuthError::NotServiceAccount("no user in the review".into()))?;
    let username = user.username.clone().unwrap_or_default();
    let (namespace, service_account) = username
        .strip_prefix(SERVICE_ACCOUNT_PREFIX)
        .and_then(|rest| rest.split_once(':'))
        .filter(|(ns, sa)| !ns.is_empty() && !sa.is_empty() && !sa.contains(':'))
        .ok_or_else(|| AuthError::NotServiceAccount(username.clone()))?;
    let pod_name = single(user.extra.as_ref(), EXTRA_POD_NAME).ok_or(AuthError::NotPodBound)?;
    let pod_uid = single(user.extra.as_ref(), EXTRA_POD_UID).ok_or(AuthError::NotPodBound)?;
    Ok(ReviewedToken {
        namespace: namespace.to_owned(),
        service_account: service_account.to_owned(),
        pod_name: pod_name.to_owned(),
        pod_uid: pod_uid.to_owned(),
    })
}

/// Checks the reviewed token against the pod object the API server has.
pub fn check_pod(reviewed: &ReviewedToken, pod: Option<&Pod>) -> Result<PodIdentity, AuthError> {
    let name = format!("{}/{}", reviewed.namespace, reviewed.pod_name);
    let pod = pod.ok_or_else(|| AuthError::PodNotFound(name.clone()))?;
    if pod.metadata.uid.as_deref() != Some(reviewed.pod_uid.as_str()) {
        return Err(AuthError::PodUidMismatch(name));
    }
    let pod_sa = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.as_deref())
        .unwrap_or("default");
    if pod_sa != reviewed.service_account {
        return Err(AuthError::ServiceAccountMismatch(name));
    }
    Ok(PodIdentity {
        namespace: reviewed.namespace.clone(),
        name: reviewed.pod_name.clone(),
        uid: reviewed.pod_uid.clone(),
        service_account: reviewed.service_account.clone(),
    })
}

/// Compares what the sidecar claims with what the review established.
pub fn check_claim(pod: &PodIdentity, namespace: &str, name: &str) -> Result<(), AuthError> {
    if pod.namespace == namespace && pod.name == name {
        Ok(())
    } else {
        Err(AuthError::ClaimMismatch {
            claimed: format!("{namespace}/{name}"),
            reviewed: format!("{}/{}", pod.namespace, pod.name),
        })
    }
}

/// Reviews tokens against the API server and the pod cache.
pub struct SidecarAuthenticator {
    client: kube::Client,
    pods: Store<Pod>,
    cache: Mutex<ReviewCache>,
}

impl SidecarAuthenticator {
    pub fn new(client: kube::Client, pods: Store<Pod>) -> Self {
        Self {
            client,
            pods,
            cache: Mutex::new(ReviewCache::default()),
        }
    }

    /// A fresh review of `token` (used for every new stream).
    pub async fn authenticate(&self, token: &str) -> Result<PodIdentity, AuthError> {
        if token.is_empty() {
            return Err(AuthError::MissingToken);
        }
        let reviews: Api<TokenReview> = Api::all(self.client.clone());
        let answer = reviews
            .create(&PostParams::default(), &review_request(token))
            .await
            .map_err(|e| AuthError::ReviewFailed(e.to_string()))?;
        let reviewed = interpret_review(answer.status.as_ref())?;
        let cached = self
            .pods
            .get(&ObjectRef::new(&reviewed.pod_name).within(&reviewed.namespace));
        let pod = match cached {
            Some(pod) if pod.metadata.uid.as_deref() == Some(reviewed.pod_uid.as_str()) => {
                Some(pod.as_ref().clone())
            }
            // The cache may lag behind a pod that just started: ask the API server.
            _ => Api::<Pod>::namespaced(self.client.clone(), &reviewed.namespace)
                .get_opt(&reviewed.pod_name)
                .await
                .map_err(|e| AuthError::ReviewFailed(e.to_string()))?,
        };
        let identity = check_pod(&reviewed, pod.as_ref())?;
        super::conventions::locked(&self.cache).insert(
            token_digest(token),
            identity.clone(),
            Instant::now(),
        );
        Ok(identity)
    }

    /// A review of `token` no older than a minute (45 to 60 s, see [`CACHE_JITTER`]; used for
    /// acknowledgements whose token opened no stream on this replica, see
    /// `Sessions::pod_of_stream_token`).
    pub async fn authenticate_cached(&self, token: &str) -> Result<PodIdentity, AuthError> {
        let digest = token_digest(token);
        let cached = super::conventions::locked(&self.cache).get(&digest, Instant::now());
        match cached {
            Some(identity) => Ok(identity),
            None => self.authenticate(token).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::authentication::v1::UserInfo;
    use std::collections::{BTreeMap, BTreeSet};

    fn status(username: &str, audiences: &[&str], extra: &[(&str, &str)]) -> TokenReviewStatus {
        TokenReviewStatus {
            authenticated: Some(true),
            audiences: Some(audiences.iter().map(|a| a.to_string()).collect()),
            error: None,
            user: Some(UserInfo {
                username: Some(username.into()),
                uid: Some("sa-uid".into()),
                groups: None,
                extra: Some(
                    extra
                        .iter()
                        .map(|(k, v)| (k.to_string(), vec![v.to_string()]))
                        .collect::<BTreeMap<_, _>>(),
                ),
            }),
        }
    }

    fn bound() -> TokenReviewStatus {
        status(
            "system:serviceaccount:team-a:reports",
            &["lifeguard"],
            &[(EXTRA_POD_NAME, "reports-0"), (EXTRA_POD_UID, "uid-1")],
        )
    }

    fn pod(uid: &str, sa: Option<&str>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "reports-0", "namespace": "team-a", "uid": uid},
            "spec": {"containers": [], "serviceAccountName": sa}
        }))
        .unwrap()
    }

    fn identity(n: usize) -> PodIdentity {
        PodIdentity {
            namespace: "team-a".into(),
            name: format!("reports-{n}"),
            uid: format!("uid-{n}"),
            service_account: "reports".into(),
        }
    }

    fn digest(n: usize) -> [u8; 32] {
        Sha256::digest(format!("token-{n}")).into()
    }

    #[test]
    fn reviews_kept_at_the_same_instant_expire_at_different_instants_within_the_bound() {
        let now = Instant::now();
        let mut cache = ReviewCache::default();
        for n in 0..1_000 {
            cache.insert(digest(n), identity(n), now);
        }
        let expiries: BTreeSet<Instant> = cache.entries.values().map(|(_, e)| *e).collect();
        let (earliest, latest) = (now + CACHE_TTL - CACHE_JITTER, now + CACHE_TTL);
        assert!(
            expiries.iter().all(|e| (earliest..=latest).contains(e)),
            "every expiry within [TTL − jitter, TTL]"
        );
        // 1,000 draws over 15,001 millisecond steps: spread, not one instant. (All equal, or
        // fewer than 900 distinct instants, has a probability far below 1e-30.)
        assert!(
            expiries.len() >= 900,
            "{} distinct expiries",
            expiries.len()
        );
        let spread = *expiries.last().unwrap() - *expiries.first().unwrap();
        assert!(spread >= CACHE_JITTER / 2, "spread {spread:?}");

        // Every review is reused until its own instant and not after; before the earliest
        // bound all are reused, at the TTL none is.
        let alive = |at: Instant| {
            (0..1_000)
                .filter(|n| cache.get(&digest(*n), at).is_some())
                .count()
        };
        assert_eq!(alive(earliest - Duration::from_millis(1)), 1_000);
        assert_eq!(alive(latest), 0);
        let midway = alive(now + CACHE_TTL - CACHE_JITTER / 2);
        assert!(
            (1..1_000).contains(&midway),
            "{midway} alive halfway through the jitter"
        );
        assert_eq!(cache.get(&digest(7), now), Some(identity(7)));
    }

    #[test]
    fn the_jitter_is_whole_milliseconds_and_never_beyond_its_bound() {
        let now = Instant::now();
        assert_eq!(expiry(now, 0), now + CACHE_TTL);
        assert_eq!(expiry(now, 1), now + CACHE_TTL - Duration::from_millis(1));
        assert_eq!(expiry(now, 15_000), now + CACHE_TTL - CACHE_JITTER);
        assert_eq!(expiry(now, 15_001), now + CACHE_TTL);
        assert_eq!(
            expiry(now, u64::MAX),
            now + CACHE_TTL - Duration::from_millis(u64::MAX % 15_001)
        );
    }

    /// A JWT with `claims` as its payload (header and signature are not read).
    fn jwt(claims: &serde_json::Value) -> String {
        use base64::Engine as _;
        let encode = |v: &serde_json::Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
        };
        format!(
            "{}.{}.c2ln",
            encode(&serde_json::json!({"alg": "RS256", "kid": "k"})),
            encode(claims)
        )
    }

    #[test]
    fn a_tokens_expiry_is_read_from_its_exp_claim_and_nothing_else_counts() {
        let exp = 1_780_000_000;
        let bound = jwt(&serde_json::json!({"aud": ["lifeguard"], "exp": exp, "iat": exp - 600}));
        assert_eq!(token_expiry(&bound), Some(exp));
        for unreadable in [
            "opaque-token".to_string(),
            jwt(&serde_json::json!({"aud": ["lifeguard"]})),
            jwt(&serde_json::json!({"exp": "tomorrow"})),
            jwt(&serde_json::json!({"exp": 1.5e300})),
            "a.b.c".to_string(),
            String::new(),
        ] {
            assert_eq!(token_expiry(&unreadable), None, "{unreadable}");
        }
    }

    #[test]
    fn a_stream_lives_until_its_token_expires_within_its_bounds() {
        let now = 1_780_000_000;
        assert_eq!(stream_life(Some(now + 600), now), Duration::from_secs(600));
        assert_eq!(stream_life(Some(now + 3600), now), STREAM_LIFE_MAX);
        // A token past its expiry by this clock, or about to be: the floor.
        assert_eq!(stream_life(Some(now + 5), now), STREAM_LIFE_MIN);
        assert_eq!(stream_life(Some(now - 100), now), STREAM_LIFE_MIN);
        assert_eq!(stream_life(Some(i64::MIN), now), STREAM_LIFE_MIN);
        // A far or unknown expiry: reviewed again within the hour all the same.
        assert_eq!(stream_life(Some(now + 86_400), now), STREAM_LIFE_MAX);
        assert_eq!(stream_life(Some(i64::MAX), now), STREAM_LIFE_MAX);
        assert_eq!(stream_life(None, now), STREAM_LIFE_MAX);
        assert_eq!(
            STREAM_LIFE_MAX.as_secs(),
            u64::try_from(*crate::webhook::config::TOKEN_EXPIRATION_RANGE.end()).unwrap()
        );
    }

    #[test]
    fn the_review_request_asks_for_the_lifeguard_audience() {
        let r = review_request("tok");
        assert_eq!(r.spec.token.as_deref(), Some("tok"));
        assert_eq!(r.spec.audiences, Some(vec!["lifeguard".to_string()]));
    }

    #[test]
    fn a_bound_service_account_token_of_an_existing_pod_is_accepted() {
        let reviewed = interpret_review(Some(&bound())).unwrap();
        let identity = check_pod(&reviewed, Some(&pod("uid-1", Some("reports")))).unwrap();
        assert_eq!(
            identity,
            PodIdentity {
                namespace: "team-a".into(),
                name: "reports-0".into(),
                uid: "uid-1".into(),
                service_account: "reports".into()
            }
        );
        assert!(check_claim(&identity, "team-a", "reports-0").is_ok());
        let err = check_claim(&identity, "team-a", "reports-1").unwrap_err();
        assert_eq!(err.label(), "claim_mismatch");
        assert_eq!(err.status(), http::StatusCode::FORBIDDEN);
    }

    #[test]
    fn every_refusal_is_named() {
        let mut unauthenticated = bound();
        unauthenticated.authenticated = Some(false);
        assert_eq!(
            interpret_review(Some(&unauthenticated))
                .unwrap_err()
                .label(),
            "not_authenticated"
        );
        let wrong_audience = status(
            "system:serviceaccount:team-a:reports",
            &["https://kubernetes.default.svc"],
            &[(EXTRA_POD_NAME, "reports-0"), (EXTRA_POD_UID, "uid-1")],
        );
        assert_eq!(
            interpret_review(Some(&wrong_audience)).unwrap_err().label(),
            "wrong_audience"
        );
        let user = status("alice", &["lifeguard"], &[]);
        assert_eq!(
            interpret_review(Some(&user)).unwrap_err().label(),
            "not_service_account"
        );
        let unbound = status("system:serviceaccount:team-a:reports", &["lifeguard"], &[]);
        assert_eq!(
            interpret_review(Some(&unbound)).unwrap_err().label(),
            "not_pod_bound"
        );
        let reviewed = interpret_review(Some(&bound())).unwrap();
        assert_eq!(
            check_pod(&reviewed, None).unwrap_err().label(),
            "pod_not_found"
        );
        assert_eq!(
            check_pod(&reviewed, Some(&pod("uid-2", Some("reports"))))
                .unwrap_err()
                .label(),
            "pod_uid_mismatch"
        );
        assert_eq!(
            check_pod(&reviewed, Some(&pod("uid-1", None)))
                .unwrap_err()
                .label(),
            "service_account_mismatch"
        );
    }
}
