use std::sync::Mutex;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use serde_json::{Value, json};
use tokio::sync::Notify;

use super::*;
use crate::operator::ssf::test_receiver::{RecordingSink, config, receiver};
use crate::operator::ssf::test_support::{ATTACKER_KEY, claims, sign, sign_with, with};

/// An in-process RFC 8936 transmitter: every poll returns the unacknowledged SETs (so a SET
/// the receiver neither acknowledged nor refused comes again), holding an empty answer for
/// `hold` when the receiver allows it.
struct Transmitter {
    queue: Mutex<BTreeMap<String, String>>,
    requests: Mutex<Vec<(Instant, Value)>>,
    bearers: Mutex<Vec<Option<String>>>,
    hold: Option<Duration>,
    arrived: Notify,
}

impl Transmitter {
    fn new(hold: Option<Duration>) -> Arc<Self> {
        Arc::new(Self {
            queue: Mutex::new(BTreeMap::new()),
            requests: Mutex::new(Vec::new()),
            bearers: Mutex::new(Vec::new()),
            hold,
            arrived: Notify::new(),
        })
    }

    fn publish(&self, jti: &str, compact: String) {
        self.queue.lock().unwrap().insert(jti.into(), compact);
        self.arrived.notify_waiters();
    }

    fn requests(&self) -> Vec<Value> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .map(|(_, r)| r.clone())
            .collect()
    }

    fn acked(&self) -> Vec<String> {
        self.requests()
            .iter()
            .flat_map(|r| r["ack"].as_array().cloned().unwrap_or_default())
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    }

    fn set_errs(&self) -> serde_json::Map<String, Value> {
        self.requests()
            .iter()
            .filter_map(|r| r["setErrs"].as_object().cloned())
            .flatten()
            .collect()
    }

    fn answer(&self, max_events: usize) -> Value {
        let queue = self.queue.lock().unwrap();
        let sets: serde_json::Map<String, Value> = queue
            .iter()
            .take(max_events)
            .map(|(jti, set)| (jti.clone(), Value::String(set.clone())))
            .collect();
        json!({"sets": sets, "moreAvailable": queue.len() > max_events})
    }
}

async fn poll(
    State(transmitter): State<Arc<Transmitter>>,
    headers: HeaderMap,
    Json(request): Json<Value>,
) -> Json<Value> {
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    transmitter.bearers.lock().unwrap().push(bearer);
    transmitter
        .requests
        .lock()
        .unwrap()
        .push((Instant::now(), request.clone()));
    {
        let mut queue = transmitter.queue.lock().unwrap();
        for jti in request["ack"].as_array().into_iter().flatten() {
            queue.remove(jti.as_str().unwrap_or_default());
        }
        for jti in request["setErrs"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, _)| k)
        {
            queue.remove(jti);
        }
    }
    let max_events = request["maxEvents"].as_u64().unwrap_or(0) as usize;
    let wait = request["returnImmediately"] == json!(false) && max_events > 0;
    if let Some(hold) = transmitter.hold.filter(|_| wait) {
        let arrived = transmitter.arrived.notified();
        if transmitter.queue.lock().unwrap().is_empty() {
            let _ = tokio::time::timeout(hold, arrived).await;
        }
    }
    Json(transmitter.answer(max_events))
}

struct Setup {
    transmitter: Arc<Transmitter>,
    sink: Arc<RecordingSink>,
    shutdown: CancellationToken,
    client: Option<PollClient>,
}

async fn setup(hold: Option<Duration>, interval: Duration) -> Setup {
    let transmitter = Transmitter::new(hold);
    let app = Router::new()
        .route("/poll", post(poll))
        .with_state(transmitter.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}/poll", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let config = config("poll", &endpoint);
    let (receiver, sink, _) = receiver(&config);
    let client = PollClient::new(receiver, &config.transmitters[0])
        .unwrap()
        .with_settings(PollSettings {
            interval,
            request_timeout: hold.unwrap_or_default() + Duration::from_secs(2),
            min_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(200),
            max_events: 2,
        });
    Setup {
        transmitter,
        sink,
        shutdown: CancellationToken::new(),
        client: Some(client),
    }
}

impl Setup {
    fn start(&mut self) -> JoinHandle<()> {
        self.client.take().unwrap().spawn(self.shutdown.clone())
    }
}

async fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn set_with_jti(jti: &str) -> String {
    sign(&with(claims(), "jti", json!(jti)))
}

#[tokio::test]
async fn acknowledges_processed_sets_and_reports_refused_ones() {
    let interval = Duration::from_millis(200);
    let mut setup = setup(None, interval).await;
    let t = setup.transmitter.clone();
    t.publish("jti-a", set_with_jti("jti-a"));
    t.publish("jti-b", set_with_jti("jti-b"));
    let forged = with(claims(), "jti", json!("jti-c"));
    let forged = sign_with(
        &forged,
        jsonwebtoken::Algorithm::EdDSA,
        ATTACKER_KEY,
        Some("test-ed-1"),
        "secevent+jwt",
    );
    t.publish("jti-c", forged);
    let client = setup.start();

    eventually("the queue to drain", || t.queue.lock().unwrap().is_empty()).await;
    let mut acked = t.acked();
    acked.sort();
    assert_eq!(acked, ["jti-a", "jti-b"]);
    assert_eq!(t.set_errs().keys().collect::<Vec<_>>(), ["jti-c"]);
    assert_eq!(t.set_errs()["jti-c"]["err"], "invalid_key");
    let mut applied = setup.sink.jtis();
    applied.sort();
    assert_eq!(applied, ["jti-a", "jti-b"]);
    let first = &t.requests()[0];
    assert_eq!(
        (
            first["maxEvents"].clone(),
            first["returnImmediately"].clone()
        ),
        (json!(2), json!(false))
    );
    assert!(
        t.bearers
            .lock()
            .unwrap()
            .iter()
            .all(|b| b.as_deref() == Some("Bearer poll-token-456"))
    );

    // Once nothing comes, polls are spaced by the interval.
    let drained = t.requests.lock().unwrap().len();
    tokio::time::sleep(interval * 4).await;
    let times: Vec<Instant> = t.requests.lock().unwrap()[drained..]
        .iter()
        .map(|(at, _)| *at)
        .collect();
    assert!((2..=5).contains(&times.len()), "{} polls", times.len());
    for gap in times.windows(2).map(|w| w[1] - w[0]) {
        assert!(gap >= interval.mul_f64(0.9), "{gap:?}");
    }
    setup.shutdown.cancel();
    client.await.unwrap();
}

#[tokio::test]
async fn a_long_polling_transmitter_gets_acknowledgements_promptly() {
    let hold = Duration::from_secs(3);
    let mut setup = setup(Some(hold), Duration::from_millis(100)).await;
    let t = setup.transmitter.clone();
    let client = setup.start();
    eventually("the first poll", || !t.requests().is_empty()).await;
    // The request is held; an event arriving now is answered at once, and its ack comes
    // with the next (again held) request, long before the hold would end.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let published = Instant::now();
    t.publish("jti-a", set_with_jti("jti-a"));
    eventually("the acknowledgement", || t.acked() == ["jti-a"]).await;
    assert!(published.elapsed() < hold / 2, "{:?}", published.elapsed());
    assert_eq!(setup.sink.jtis(), ["jti-a"]);
    // Held requests are not cut short by the client's timeout.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(t.requests().len() <= 3, "{}", t.requests().len());
    setup.shutdown.cancel();
    client.await.unwrap();
}

#[tokio::test]
async fn a_sink_failure_leaves_the_set_unacknowledged_until_it_succeeds() {
    let mut setup = setup(None, Duration::from_millis(50)).await;
    let t = setup.transmitter.clone();
    setup.sink.fail(true);
    t.publish("jti-a", set_with_jti("jti-a"));
    let client = setup.start();
    eventually("a few deliveries", || t.requests().len() >= 3).await;
    assert!(t.acked().is_empty());
    assert!(t.set_errs().is_empty());
    assert!(setup.sink.jtis().is_empty());
    setup.sink.fail(false);
    eventually("the acknowledgement", || t.acked() == ["jti-a"]).await;
    assert_eq!(setup.sink.jtis(), ["jti-a"]);
    setup.shutdown.cancel();
    client.await.unwrap();
}

#[tokio::test]
async fn backs_off_while_the_transmitter_is_unreachable() {
    let config = config("poll", "http://127.0.0.1:9/poll");
    let (receiver, _, _) = receiver(&config);
    let settings = PollSettings {
        interval: Duration::from_millis(10),
        request_timeout: Duration::from_secs(1),
        min_backoff: Duration::from_millis(40),
        max_backoff: Duration::from_millis(80),
        max_events: 10,
    };
    for failures in 1..6 {
        let pause = settings.backoff(failures);
        assert!(
            pause >= Duration::from_millis(20) && pause <= Duration::from_millis(80),
            "{pause:?}"
        );
    }
    let shutdown = CancellationToken::new();
    let client = PollClient::new(receiver, &config.transmitters[0])
        .unwrap()
        .with_settings(settings)
        .spawn(shutdown.clone());
    tokio::time::sleep(Duration::from_millis(100)).await;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(1), client)
        .await
        .unwrap()
        .unwrap();
}
