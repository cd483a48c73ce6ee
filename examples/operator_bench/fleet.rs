//! The light sidecars: in-process clients of the operator's distribution endpoint, one HTTPS
//! connection each (their own `reqwest::Client`), authenticated with their pod's token, that
//! read the NDJSON snapshots and acknowledge every one like a real sidecar (session, version,
//! the hash of the parsed policy, one entry per revocation it carries).
//!
//! Each acknowledgement the operator accepted (204) is recorded with the instant its answer
//! arrived. A measurement registers a [`Want`] just before it acts and then waits until every
//! sidecar has acknowledged a snapshot that satisfies it; the latest of those instants is the
//! propagation's end.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use lifeguard::distribution::{
    ACK_PATH, Ack, RevocationApplied, SILENCE_TIMEOUT, STREAM_PATH, StreamQuery,
};
use lifeguard::policy::EffectivePolicy;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::sync::Semaphore;

use crate::cluster::{BenchPod, NS};

/// A failed acknowledgement is sent again after this long (as `lifeguard sidecar` does)…
const ACK_RETRY: Duration = Duration::from_secs(1);
/// …at most this many times in all.
const ACK_ATTEMPTS: u32 = 60;

/// What a snapshot's policy says, as far as the bench cares.
#[derive(Debug)]
pub struct PolicyInfo {
    /// `EffectivePolicy::hash()` of the parsed policy (what a real sidecar acknowledges).
    pub hash: String,
    /// Names of the revocations it carries.
    pub revocations: Vec<String>,
}

/// One accepted acknowledgement.
#[derive(Clone, Debug)]
pub struct Acked {
    /// When the sidecar sent it (the snapshot was in force).
    pub sent: Instant,
    /// When the operator's answer (204) arrived: the operator has recorded it.
    pub at: Instant,
    /// `None`: the snapshot carried no policy.
    pub policy: Option<Arc<PolicyInfo>>,
}

impl Acked {
    fn hash(&self) -> Option<&str> {
        self.policy.as_ref().map(|p| p.hash.as_str())
    }

    fn carries(&self, revocation: &str) -> bool {
        self.policy
            .as_ref()
            .is_some_and(|p| p.revocations.iter().any(|r| r == revocation))
    }
}

/// What a measurement waits for every sidecar to acknowledge.
#[derive(Clone, Debug)]
pub enum Want {
    /// A snapshot carrying this revocation.
    Carries(String),
    /// A snapshot without this revocation.
    Lacks(String),
    /// A snapshot whose policy hash differs from this one.
    HashOtherThan(Option<String>),
}

impl Want {
    fn met(&self, acked: &Acked) -> bool {
        match self {
            Self::Carries(name) => acked.carries(name),
            Self::Lacks(name) => !acked.carries(name),
            Self::HashOtherThan(old) => acked.hash() != old.as_deref(),
        }
    }
}

struct Goal {
    id: u64,
    want: Want,
    /// Per sidecar: (sent, accepted) of its first acknowledgement that satisfied the goal.
    at: Vec<Option<(Instant, Instant)>>,
    remaining: usize,
}

/// When the sidecars satisfied a goal.
#[derive(Clone, Copy, Debug)]
pub struct Reached {
    /// The first acknowledgement accepted.
    pub first: Instant,
    /// The last acknowledgement accepted: the end of the propagation.
    pub last: Instant,
    /// The last acknowledgement sent (every sidecar had the snapshot in force by then).
    pub last_sent: Instant,
}

/// Not every sidecar acknowledged in time.
#[derive(Clone, Debug)]
pub struct Shortfall {
    pub acknowledged: usize,
    pub of: usize,
    pub want: String,
}

impl std::fmt::Display for Shortfall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} sidecars acknowledged {}",
            self.acknowledged, self.of, self.want
        )
    }
}

impl std::error::Error for Shortfall {}

/// Counters over the whole run.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    pub snapshots: u64,
    pub acks: u64,
    pub ack_failures: u64,
    pub stream_failures: u64,
    pub refusals: u64,
    /// Largest serialized policy a snapshot carried (bytes).
    pub largest_policy: u64,
}

#[derive(Default)]
struct State {
    last: Vec<Option<Acked>>,
    /// When each sidecar started dialling (its turn came), and first acknowledged.
    dialled: Vec<Option<Instant>>,
    first_ack: Vec<Option<Instant>>,
    goals: Vec<Goal>,
    next_goal: u64,
    counters: Counters,
    first_errors: Vec<String>,
}

/// Every light sidecar's latest acknowledgement, and the goals being waited for.
pub struct Fleet {
    pub size: usize,
    state: Mutex<State>,
    /// Policy JSON → its hash and revocations. Every sidecar of the `bench` policy receives the
    /// same bytes; each would hash the same document to the same value, so it is parsed and
    /// hashed once per distinct document (this keeps the bench's CPU, which shares the two
    /// cores with the operator, low).
    memo: Mutex<HashMap<String, Arc<PolicyInfo>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Fleet {
    pub fn new(size: usize) -> Arc<Self> {
        Arc::new(Self {
            size,
            state: Mutex::new(State {
                last: vec![None; size],
                dialled: vec![None; size],
                first_ack: vec![None; size],
                ..State::default()
            }),
            memo: Mutex::new(HashMap::new()),
        })
    }

    fn policy_info(&self, raw: &str) -> Result<Arc<PolicyInfo>> {
        if let Some(info) = lock(&self.memo).get(raw) {
            return Ok(info.clone());
        }
        let effective: EffectivePolicy = serde_json::from_str(raw)?;
        let info = Arc::new(PolicyInfo {
            hash: effective.hash(),
            revocations: effective
                .revocations
                .iter()
                .map(|r| r.name.clone())
                .collect(),
        });
        {
            let mut state = lock(&self.state);
            let size = raw.len() as u64;
            state.counters.largest_policy = state.counters.largest_policy.max(size);
        }
        let mut memo = lock(&self.memo);
        if memo.len() > 64 {
            memo.clear();
        }
        memo.insert(raw.to_owned(), info.clone());
        Ok(info)
    }

    fn acked(&self, index: usize, acked: Acked) {
        let mut state = lock(&self.state);
        state.counters.acks += 1;
        state.first_ack[index].get_or_insert(acked.at);
        for goal in state.goals.iter_mut() {
            if goal.at[index].is_none() && goal.want.met(&acked) {
                goal.at[index] = Some((acked.sent, acked.at));
                goal.remaining -= 1;
            }
        }
        state.last[index] = Some(acked);
    }

    fn failed(&self, what: String, count: impl FnOnce(&mut Counters)) {
        let mut state = lock(&self.state);
        count(&mut state.counters);
        if state.first_errors.len() < 5 {
            state.first_errors.push(what);
        }
    }

    pub fn counters(&self) -> Counters {
        lock(&self.state).counters
    }

    pub fn first_errors(&self) -> Vec<String> {
        lock(&self.state).first_errors.clone()
    }

    /// Starts counting acknowledgements that satisfy `want` (only those from now on).
    pub fn expect(&self, want: Want) -> u64 {
        let mut state = lock(&self.state);
        let id = state.next_goal;
        state.next_goal += 1;
        let size = self.size;
        state.goals.push(Goal {
            id,
            want,
            at: vec![None; size],
            remaining: size,
        });
        id
    }

    /// Waits until every sidecar satisfied goal `id`, or `timeout`; the goal is dropped
    /// either way. On timeout, says how many got there.
    pub async fn wait(&self, id: u64, timeout: Duration) -> Result<Reached, Shortfall> {
        let deadline = Instant::now() + timeout;
        loop {
            {
                let mut state = lock(&self.state);
                let Some(pos) = state.goals.iter().position(|g| g.id == id) else {
                    return Err(Shortfall {
                        acknowledged: 0,
                        of: self.size,
                        want: format!("goal {id}"),
                    });
                };
                let done = state.goals[pos].remaining == 0;
                if done || Instant::now() > deadline {
                    let goal = state.goals.swap_remove(pos);
                    let times: Vec<(Instant, Instant)> =
                        goal.at.iter().flatten().copied().collect();
                    if !done {
                        return Err(Shortfall {
                            acknowledged: times.len(),
                            of: self.size,
                            want: format!("{:?}", goal.want),
                        });
                    }
                    let now = Instant::now();
                    let accepted = times.iter().map(|t| t.1);
                    return Ok(Reached {
                        first: accepted.clone().min().unwrap_or(now),
                        last: accepted.max().unwrap_or(now),
                        last_sent: times.iter().map(|t| t.0).max().unwrap_or(now),
                    });
                }
            }
            // The instants are taken when each acknowledgement is answered; how often this
            // looks does not change them.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The policy hash every sidecar acknowledged last, if they all agree.
    pub fn common_hash(&self) -> Option<Option<String>> {
        let state = lock(&self.state);
        let mut hashes = state
            .last
            .iter()
            .map(|a| a.as_ref().map(|a| a.hash().map(str::to_owned)));
        let first = hashes.next()??;
        hashes.all(|h| h.as_ref() == Some(&first)).then_some(first)
    }

    /// How many sidecars have acknowledged anything yet.
    pub fn synced(&self) -> usize {
        lock(&self.state).last.iter().flatten().count()
    }

    /// Per sidecar that got there: time from its turn to dial to its first accepted
    /// acknowledgement (TLS, the operator's TokenReview, the first snapshot, the ack); and the
    /// last first acknowledgement of all.
    pub fn initial_sync(&self) -> (Vec<Duration>, Option<Instant>) {
        let state = lock(&self.state);
        let each = state
            .dialled
            .iter()
            .zip(&state.first_ack)
            .filter_map(|(d, a)| Some(a.as_ref()?.duration_since(*d.as_ref()?)))
            .collect();
        (each, state.first_ack.iter().flatten().max().copied())
    }

    fn dialling(&self, index: usize) {
        lock(&self.state).dialled[index].get_or_insert_with(Instant::now);
    }
}

/// A snapshot line, as far as the bench reads it.
#[derive(Deserialize)]
struct Line<'a> {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    session: String,
    #[serde(default)]
    version: u64,
    #[serde(default, borrow)]
    policy: Option<&'a RawValue>,
}

/// Where and how every sidecar dials.
#[derive(Clone)]
pub struct Dial {
    pub operator: String,
    pub tls: rustls::ClientConfig,
}

/// Starts one sidecar task per pod. At most `parallel` sidecars are between dialling and
/// their first acknowledgement at any time, so the bench spreads the operator's TokenReviews
/// instead of sending all of them at once.
pub fn launch(
    fleet: &Arc<Fleet>,
    pods: &[BenchPod],
    dial: &Dial,
    parallel: usize,
) -> Result<Vec<tokio::task::JoinHandle<()>>> {
    let gate = Arc::new(Semaphore::new(parallel.max(1)));
    let mut tasks = Vec::with_capacity(pods.len());
    for (index, pod) in pods.iter().enumerate() {
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(dial.tls.clone())
            .connect_timeout(Duration::from_secs(10))
            .build()?;
        let query = serde_urlencoded_query(&StreamQuery {
            pod_namespace: NS.to_owned(),
            pod_name: pod.name.clone(),
        });
        let sidecar = Sidecar {
            index,
            fleet: fleet.clone(),
            client,
            stream_url: format!("{}{STREAM_PATH}?{query}", dial.operator),
            ack_url: format!("{}{ACK_PATH}", dial.operator),
            token: pod.token.clone(),
        };
        let gate = gate.clone();
        tasks.push(tokio::spawn(async move {
            let permit = gate.acquire_owned().await.ok();
            sidecar.run(permit).await;
        }));
    }
    Ok(tasks)
}

fn serde_urlencoded_query(q: &StreamQuery) -> String {
    url::form_urlencoded::Serializer::new(String::new())
        .append_pair("podNamespace", &q.pod_namespace)
        .append_pair("podName", &q.pod_name)
        .finish()
}

struct Sidecar {
    index: usize,
    fleet: Arc<Fleet>,
    client: reqwest::Client,
    stream_url: String,
    ack_url: String,
    token: String,
}

impl Sidecar {
    async fn run(self, mut permit: Option<tokio::sync::OwnedSemaphorePermit>) {
        self.fleet.dialling(self.index);
        loop {
            let response = self
                .client
                .get(&self.stream_url)
                .bearer_auth(&self.token)
                .send()
                .await;
            let mut response = match response {
                Ok(r) if r.status().is_success() => r,
                Ok(r) => {
                    let what = format!("stream refused: HTTP {}", r.status());
                    self.fleet.failed(what, |c| c.refusals += 1);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
                Err(e) => {
                    let what = format!("stream request failed: {e}");
                    self.fleet.failed(what, |c| c.stream_failures += 1);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let mut buffer = Vec::new();
            loop {
                let chunk = match tokio::time::timeout(SILENCE_TIMEOUT, response.chunk()).await {
                    Ok(Ok(Some(chunk))) => chunk,
                    Ok(Ok(None)) => break,
                    Ok(Err(e)) => {
                        let what = format!("stream broke: {e}");
                        self.fleet.failed(what, |c| c.stream_failures += 1);
                        break;
                    }
                    Err(_) => {
                        let what = "stream silent for the silence timeout".to_owned();
                        self.fleet.failed(what, |c| c.stream_failures += 1);
                        break;
                    }
                };
                buffer.extend_from_slice(&chunk);
                while let Some(pos) = buffer.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buffer.drain(..=pos).collect();
                    if self.handle(&line).await {
                        permit.take();
                    }
                }
            }
            let what = "stream ended".to_owned();
            self.fleet.failed(what, |c| c.stream_failures += 1);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Reads one line; acknowledges a snapshot. True when an acknowledgement was accepted.
    async fn handle(&self, line: &[u8]) -> bool {
        let Ok(message) = serde_json::from_slice::<Line<'_>>(line) else {
            self.fleet
                .failed("unreadable stream line".into(), |c| c.stream_failures += 1);
            return false;
        };
        if message.kind != "snapshot" {
            return false;
        }
        let policy = match message.policy.map(|raw| self.fleet.policy_info(raw.get())) {
            None => None,
            Some(Ok(info)) => Some(info),
            Some(Err(e)) => {
                let what = format!("snapshot policy does not parse: {e}");
                self.fleet.failed(what, |c| c.stream_failures += 1);
                return false;
            }
        };
        lock(&self.fleet.state).counters.snapshots += 1;
        let ack = Ack {
            session: message.session,
            version: message.version,
            policy_hash: policy.as_ref().map(|p| p.hash.clone()),
            revocations: policy
                .as_ref()
                .map(|p| {
                    p.revocations
                        .iter()
                        .map(|name| RevocationApplied {
                            name: name.clone(),
                            tasks_cancelled: 0,
                            streams_closed: 0,
                        })
                        .collect()
                })
                .unwrap_or_default(),
        };
        // As a real sidecar does: a failed acknowledgement is sent again a second later (it
        // stays owed until the operator takes it).
        let sent = Instant::now();
        for attempt in 1..=ACK_ATTEMPTS {
            let answer = self
                .client
                .post(&self.ack_url)
                .bearer_auth(&self.token)
                .json(&ack)
                .timeout(Duration::from_secs(60))
                .send()
                .await;
            let at = Instant::now();
            let what = match answer {
                Ok(r) if r.status().is_success() => {
                    self.fleet.acked(self.index, Acked { sent, at, policy });
                    return true;
                }
                Ok(r) => format!("ack refused: HTTP {}", r.status()),
                Err(e) => format!("ack failed: {e}"),
            };
            let what = format!("{what} (attempt {attempt})");
            self.fleet.failed(what, |c| c.ack_failures += 1);
            tokio::time::sleep(ACK_RETRY).await;
        }
        false
    }
}
