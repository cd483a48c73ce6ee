//! `--dpop`: the CPU a DPoP-verified call adds to the sidecar (issue 34).
//!
//! The example server and one sidecar in front of it (the bench policy, an SQLite ledger: the
//! sidecar remembers proofs in memory). `tools/call` of `greet`, the same calls through the
//! same sidecar in two variants:
//!
//! - *bearer*: `Authorization: Bearer <token>`, an ordinary token of the bench issuer;
//! - *DPoP*: `Authorization: DPoP <token>`, a token with the same claims plus `cnf.jkt` (the
//!   thumbprint of a key the bench makes, [`DpopKey`]: P-256 for ES256, the default, Ed25519
//!   for EdDSA or RSA-2048 for PS256, `--dpop-alg`), and `DPoP: <proof>`, a proof made for
//!   that one request (`htm` POST, `htu` the policy's `resource`, `ath` the
//!   token's hash, a random `jti`). The sidecar verifies every proof (RFC 9449 §4.3) and
//!   remembers its `jti`: a proof sent twice is refused as a replay, so none is.
//!
//! Both tokens stay the same for the whole run, so the sidecar's token cache answers both after
//! their first call: what differs is the proof (its verification and the replay cache) and
//! what a bound token adds along the path.
//!
//! Signing a proof costs the client about as much as the sidecar spends on a whole bearer call,
//! so every request a run sends — the bearer ones too, so that the client's work is the same
//! for both — is built before the run, and the sidecar's CPU is read after they are built:
//! while it is measured, the client only writes bytes and reads answers.
//!
//! The variants take turns in interleaved rounds — bearer, DPoP, then DPoP, bearer, … — so
//! drift in the machine's conditions hits both alike, under two load shapes: *paced* (a fixed
//! rate both keep up with, `--dpop-rate`, on 8 connections, with cores to spare: the target is
//! judged here) and *closed loop* (`--connections` connections, each sending as soon as its
//! answer arrived, the same number of calls per round for both: the sidecar's maximum).
//!
//! A variant's CPU per call is the sidecar process's CPU time (all threads, /proc/PID/stat)
//! during its rounds, summed, divided by the calls it answered.
//!
//! Before any process starts, the lane also times [`verify_proof`] in its own thread over
//! proofs made beforehand — no network, no sidecar — with the proof key kept from the first
//! proof as the sidecar keeps it ([`ProofKeys`]) and built for every proof, and the signature
//! check alone ([`verify_with`], aws-lc-rs, the key built once): how much of the added cost
//! is the signature.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::Algorithm;
use lifeguard::api::JwsAlgorithm;
use lifeguard::identity::dpop::{ProofCheck, verify_proof};
use lifeguard::identity::dpop_mint::{DpopKey, ProofClaims};
use lifeguard::identity::dpop_signature::{ProofKeys, parse_key, verify_with};
use lifeguard::policy::DpopRules;
use serde_json::{Value, json};

use crate::bench_support::procs::{MachineTicks, clock_ticks_per_sec, cpu_ticks, preflight_noise};
use crate::client::{Conn, Credential, Endpoint, Prebuilt, Template, describe_failure, is_success};
use crate::dpop_report::{DpopLane, DpopResult, InProcess, Timing};
use crate::phases::{Accept, Load, closed_loop_each, paced_each, paced_period};
use crate::procs::{Keys, RESOURCE, Server, Sidecar};
use crate::report::Machine;
use crate::run::Binaries;
use crate::stats::{Errors, Summary};

/// The limit on the sidecar CPU a DPoP-verified call adds, in µs.
pub const ADDED_CPU_LIMIT_US: f64 = 30.0;
/// Connections of the paced load.
pub const PACED_CONNECTIONS: usize = 8;
/// The longest a closed-loop round may take: it ends when its calls are sent.
const CLOSED_GUARD: Duration = Duration::from_secs(600);
/// The method of every proof: `/mcp` takes POST only.
const METHOD: &str = "POST";

/// Sizes of the lane.
pub struct DpopPlan {
    /// Unmeasured paced load per variant before its rounds.
    pub warmup: Duration,
    /// Measured paced load per variant, split over the rounds.
    pub measured: Duration,
    pub rounds: usize,
    /// Calls per second of the paced load.
    pub rate: f64,
    /// Connections of the closed loop.
    pub connections: usize,
    /// Closed-loop calls per variant, split over the rounds (one round's worth more before
    /// them, unmeasured).
    pub closed_calls: usize,
    /// Proofs verified in process.
    pub verifications: usize,
    /// The algorithm of the proofs (and kind of the key).
    pub alg: JwsAlgorithm,
    pub smoke: bool,
}

impl DpopPlan {
    pub fn new(args: &crate::Args) -> Self {
        let smoke = args.smoke;
        let secs = |full: f64, tiny: f64| if smoke { tiny } else { full };
        Self {
            warmup: Duration::from_secs_f64(secs(2.0, 0.2)),
            measured: Duration::from_secs_f64(args.dpop_secs.unwrap_or(secs(30.0, 0.6))),
            rounds: if smoke { 2 } else { 6 },
            rate: args
                .dpop_rate
                .unwrap_or(if smoke { 200.0 } else { 1_000.0 }),
            connections: args.connections.max(1),
            closed_calls: if smoke { 400 } else { 60_000 },
            verifications: if smoke { 200 } else { 5_000 },
            alg: args.dpop_alg.unwrap_or(JwsAlgorithm::ES256),
            smoke,
        }
    }

    /// Closed-loop calls per variant and round: the same number on every connection.
    fn closed_round(&self) -> usize {
        let per_round = self.closed_calls / self.rounds.max(1);
        per_round.div_ceil(self.connections).max(1) * self.connections
    }

    pub(crate) fn to_json(&self) -> Value {
        json!({
            "warmup_seconds_per_variant": self.warmup.as_secs_f64(),
            "measured_seconds_per_variant": self.measured.as_secs_f64(),
            "rounds": self.rounds, "paced_rate_per_second": self.rate,
            "paced_connections": PACED_CONNECTIONS, "closed_loop_connections": self.connections,
            "closed_loop_calls_per_variant": self.closed_round() * self.rounds.max(1),
            "in_process_proofs": self.verifications,
            "proof_algorithm": self.alg.as_str(),
        })
    }
}

/// How a call proves who sends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// `Authorization: Bearer`, an ordinary token.
    Bearer,
    /// `Authorization: DPoP`, the same claims bound to the bench's key, and a fresh proof.
    Dpop,
}

impl Variant {
    pub const ALL: [Self; 2] = [Self::Bearer, Self::Dpop];

    pub fn name(self) -> &'static str {
        match self {
            Self::Bearer => "bearer",
            Self::Dpop => "DPoP",
        }
    }
}

/// How calls are sent.
#[derive(Clone, Copy)]
enum Shape {
    /// A fixed rate (calls per second), on [`PACED_CONNECTIONS`] connections.
    Paced(f64),
    /// Connections each sending as soon as the previous answer arrived.
    Closed(usize),
}

impl Shape {
    fn name(self) -> String {
        match self {
            Self::Paced(rate) => format!("paced, {rate:.0} calls/s"),
            Self::Closed(connections) => format!("closed loop, {connections} connections"),
        }
    }
}

/// Who the bench calls as: one principal, with an ordinary token, a token bound to its DPoP
/// key, and the key.
struct Caller {
    endpoint: Endpoint,
    bearer: String,
    bound: String,
    key: DpopKey,
    /// The last JSON-RPC id given: every request of the lane has its own.
    id: u64,
}

impl Caller {
    fn new(keys: &Keys, endpoint: &Endpoint, alg: JwsAlgorithm) -> Result<Self> {
        let key = DpopKey::generate_for(alg).context("generating the DPoP key")?;
        let (subject, tenant, client) = ("bench-dpop", "tenant-0", "client-0");
        let jkt = key.thumbprint();
        Ok(Self {
            endpoint: endpoint.clone(),
            bearer: keys.token(Algorithm::RS256, subject, tenant, client)?,
            bound: keys.bound_token(Algorithm::RS256, subject, tenant, client, &jkt)?,
            key,
            id: 0,
        })
    }

    /// One `greet` of `variant`; a DPoP one carries a proof made now.
    fn request(&mut self, variant: Variant) -> Result<Vec<u8>> {
        let proof;
        let credential = match variant {
            Variant::Bearer => Credential::Bearer(&self.bearer),
            Variant::Dpop => {
                proof = proof_for(&self.key, &self.bound, jiff::Timestamp::now().as_second())?;
                Credential::Dpop {
                    token: &self.bound,
                    proof: &proof,
                }
            }
        };
        let args = json!({"name": "bench"});
        let mut template = Template::tool_call_as(&self.endpoint, credential, "greet", args, false);
        self.id += 1;
        template.set_id(self.id);
        Ok(template.bytes().to_vec())
    }

    /// `each` requests of `variant` for every one of `connections` connections.
    fn prebuilt(
        &mut self,
        variant: Variant,
        connections: usize,
        each: usize,
    ) -> Result<Vec<Prebuilt>> {
        let mut all = Vec::with_capacity(connections);
        for _ in 0..connections {
            let mut requests = Vec::with_capacity(each);
            for _ in 0..each {
                requests.push(self.request(variant)?);
            }
            all.push(Prebuilt::new(requests));
        }
        Ok(all)
    }
}

/// A proof of `key` for a POST to the bench policy's `resource` with `token`, dated `iat`.
fn proof_for(key: &DpopKey, token: &str, iat: i64) -> Result<String> {
    key.proof(&ProofClaims {
        method: METHOD,
        uri: RESOURCE,
        access_token: Some(token),
        iat,
        jti: None,
        nonce: None,
    })
    .context("making a DPoP proof")
}

/// Before measuring: a DPoP call succeeds, its proof sent again is refused as a replay, and
/// the bound token sent as a bearer token is refused: the sidecar verifies what the lane
/// measures.
async fn checked(caller: &mut Caller) -> Result<()> {
    let mut conn = Conn::connect(caller.endpoint.addr).await?;
    let request = caller.request(Variant::Dpop)?;
    let status = conn.send(&request).await?;
    if !is_success(status, conn.body()) {
        bail!(
            "a DPoP call failed ({}): is its proof's htu the policy's resource ({RESOURCE}), \
             its iat within 5 minutes of the sidecar's clock?",
            describe_failure(status, conn.body())
        );
    }
    let status = conn.send(&request).await?;
    if status != 401 {
        bail!(
            "the same DPoP proof sent twice was answered {}, not refused as a replay",
            describe_failure(status, conn.body())
        );
    }
    let mut stolen = Template::tool_call_as(
        &caller.endpoint,
        Credential::Bearer(&caller.bound),
        "greet",
        json!({"name": "bench"}),
        false,
    );
    stolen.set_id(0);
    let status = conn.send(stolen.bytes()).await?;
    if status != 401 {
        bail!(
            "the DPoP-bound token sent as a bearer token was answered {}, not refused",
            describe_failure(status, conn.body())
        );
    }
    Ok(())
}

/// CPU time of the calling thread so far, in ns (the first field of
/// /proc/thread-self/schedstat); `None` when the kernel does not say.
fn thread_cpu_ns() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Times `check` over `items` in this thread: CPU (when the kernel says) and wall time per
/// item; `check` says whether an item passed, and every one must.
fn timed<T>(items: &[T], what: &str, mut check: impl FnMut(&T) -> bool) -> Result<Timing> {
    let (cpu0, started) = (thread_cpu_ns(), Instant::now());
    let passed = items
        .iter()
        .filter(|&i| std::hint::black_box(check(i)))
        .count();
    let wall = started.elapsed();
    let cpu = cpu0.zip(thread_cpu_ns()).map(|(a, b)| b.saturating_sub(a));
    if passed != items.len() {
        bail!(
            "in process: {} of {} {what} failed",
            items.len() - passed,
            items.len()
        );
    }
    let n = items.len().max(1) as f64;
    Ok(Timing {
        cpu_ns_per_call: cpu.map(|ns| ns as f64 / n),
        wall_ns_per_call: wall.as_nanos() as f64 / n,
    })
}

/// [`verify_proof`] over `n` proofs of `alg` made beforehand (every check of RFC 9449 §4.3 but
/// replay, with the rules the bench policy gets: the defaults), and the signature check of the
/// same proofs alone; in this thread, with no other process of the lane running.
fn in_process(keys: &Keys, n: usize, alg: JwsAlgorithm) -> Result<InProcess> {
    eprintln!(
        "phase: dpop, in-process proof verification ({})",
        alg.as_str()
    );
    let key = DpopKey::generate_for(alg).context("generating the DPoP key")?;
    let jkt = key.thumbprint();
    let token = keys.bound_token(Algorithm::RS256, "bench-dpop", "tenant-0", "client-0", &jkt)?;
    let now = jiff::Timestamp::now().as_second();
    let proofs = (0..n.max(1))
        .map(|_| proof_for(&key, &token, now))
        .collect::<Result<Vec<_>>>()?;
    let rules = DpopRules::default();
    let check = ProofCheck {
        method: METHOD,
        target_uri: RESOURCE,
        access_token: &token,
        bound_jkt: &jkt,
        now_secs: now,
        rules: &rules,
        nonce: None,
        keys: None,
    };
    let verify = |proof: &String| verify_proof(proof, &check).is_ok();
    // A first pass warms caches and the allocator; the second is timed.
    timed(&proofs, "proofs", verify)?;
    let verify_key_built = timed(&proofs, "proofs", verify)?;
    // As the sidecar does: the key of the first proof kept for the next ones.
    let kept = ProofKeys::default();
    let check = ProofCheck {
        keys: Some(&kept),
        ..check
    };
    let verify = |proof: &String| verify_proof(proof, &check).is_ok();
    timed(&proofs, "proofs", verify)?;
    let verify = timed(&proofs, "proofs", verify)?;

    let jwk = key.public_jwk();
    let parsed = parse_key(alg, &jwk).map_err(|e| anyhow::anyhow!("the key: {e:?}"))?;
    let signed = proofs
        .iter()
        .map(|p| {
            let (input, signature) = p.rsplit_once('.').context("a proof without a signature")?;
            let signature = URL_SAFE_NO_PAD
                .decode(signature)
                .context("a proof's signature")?;
            Ok((input.as_bytes().to_vec(), signature))
        })
        .collect::<Result<Vec<_>>>()?;
    let signature =
        |(input, signature): &(Vec<u8>, Vec<u8>)| verify_with(&parsed, input, signature).is_ok();
    timed(&signed, "signatures", signature)?;
    let signature = timed(&signed, "signatures", signature)?;
    Ok(InProcess {
        proofs: proofs.len(),
        verify,
        verify_key_built,
        signature,
    })
}

/// CPU ticks of the processes the machine's busy time is compared with.
fn ours(server: &Server, sidecar: &Sidecar) -> u64 {
    sidecar.proc.cpu_ticks() + server.proc.cpu_ticks() + cpu_ticks("/proc/self/stat")
}

/// One variant's measured rounds in one load shape, so far.
#[derive(Default)]
struct Totals {
    load: Load,
    /// Per round: (calls answered, the sidecar's CPU ticks).
    rounds: Vec<(u64, u64)>,
    failed: u64,
}

/// The running processes and what the rounds gathered.
struct Lane<'a> {
    plan: &'a DpopPlan,
    caller: Caller,
    server: Server,
    sidecar: Sidecar,
    errors: Errors,
    lanes: Vec<DpopLane>,
    /// CPU of other processes over the measured rounds (ticks), and the rounds' seconds.
    other_ticks: u64,
    measured_secs: f64,
}

impl Lane<'_> {
    /// One run of `variant` in `shape`: its requests built, then sent, the sidecar's CPU read
    /// around the sending alone. Returns the answers, the sidecar's CPU ticks and the calls
    /// that failed (named in `self.errors`).
    async fn run(
        &mut self,
        shape: Shape,
        variant: Variant,
        measured: bool,
    ) -> Result<(Load, u64, u64)> {
        let plan = self.plan;
        let endpoint = self.sidecar.endpoint.clone();
        let mut load = Load::default();
        let (requests, duration) = match shape {
            Shape::Paced(rate) => {
                let duration = if measured {
                    plan.measured / plan.rounds.max(1) as u32
                } else {
                    plan.warmup
                };
                let period = paced_period(PACED_CONNECTIONS, rate);
                // A connection's ticks fall at most once per period within the duration.
                let each = (duration.as_secs_f64() / period.as_secs_f64()).ceil() as usize + 1;
                let requests = self.caller.prebuilt(variant, PACED_CONNECTIONS, each)?;
                (requests, duration)
            }
            Shape::Closed(connections) => {
                let each = plan.closed_round() / connections;
                let requests = self.caller.prebuilt(variant, connections, each)?;
                (requests, CLOSED_GUARD)
            }
        };
        let started = Instant::now();
        let machine0 = MachineTicks::read().busy_without_irq();
        let ours0 = ours(&self.server, &self.sidecar);
        let sidecar0 = self.sidecar.proc.cpu_ticks();
        match shape {
            Shape::Paced(rate) => {
                let accept = Accept::Successes;
                paced_each(&endpoint, requests, rate, duration, accept, &mut load).await?;
            }
            Shape::Closed(_) => closed_loop_each(&endpoint, requests, duration, &mut load).await?,
        }
        let ticks = self.sidecar.proc.cpu_ticks().saturating_sub(sidecar0);
        if measured {
            let busy = MachineTicks::read()
                .busy_without_irq()
                .saturating_sub(machine0);
            let ours = ours(&self.server, &self.sidecar).saturating_sub(ours0);
            self.other_ticks += busy.saturating_sub(ours);
            self.measured_secs += started.elapsed().as_secs_f64();
        }
        let errs = std::mem::take(&mut load.errors);
        let failed = errs.count;
        if failed > 0 {
            let mut named = Errors::default();
            for e in &errs.examples {
                named.record(format!("{} {}: {e}", variant.name(), shape.name()));
            }
            named.count = failed;
            self.errors.merge(named);
        }
        Ok((load, ticks, failed))
    }

    /// One load shape: a warm-up of each variant, then the interleaved rounds.
    async fn window(&mut self, shape: Shape) -> Result<()> {
        eprintln!("phase: dpop, {}", shape.name());
        for variant in Variant::ALL {
            self.run(shape, variant, false).await?;
        }
        let mut totals: Vec<Totals> = Variant::ALL.iter().map(|_| Totals::default()).collect();
        for round in 0..self.plan.rounds.max(1) {
            let order = if round % 2 == 0 {
                Variant::ALL
            } else {
                [Variant::Dpop, Variant::Bearer]
            };
            for variant in order {
                let (mut load, ticks, failed) = self.run(shape, variant, true).await?;
                let i = Variant::ALL.iter().position(|v| *v == variant).unwrap_or(0);
                let total = &mut totals[i];
                total.rounds.push((load.requests, ticks));
                total.failed += failed;
                total.load.add_round(&mut load);
            }
        }
        for (variant, mut total) in Variant::ALL.into_iter().zip(totals) {
            self.lanes.push(DpopLane {
                shape: shape.name(),
                variant,
                calls: total.load.requests,
                failed: total.failed,
                secs: total.load.elapsed.as_secs_f64(),
                ticks: total.rounds.iter().map(|&(_, t)| t).sum(),
                rounds: total.rounds,
                latency: Summary::of(&mut total.load.samples),
            });
        }
        Ok(())
    }
}

/// Runs the lane.
pub async fn run(
    plan: DpopPlan,
    mode: &'static str,
    machine: Machine,
    repo: &Path,
    work: &Path,
    bins: &Binaries,
) -> Result<DpopResult> {
    let keys = Keys::load(repo)?;
    let ticks_per_sec = clock_ticks_per_sec();
    let rest = Duration::from_secs_f64(if plan.smoke { 0.3 } else { 2.0 });
    let preflight_other_cores =
        preflight_noise(rest, ticks_per_sec, MachineTicks::busy_without_irq).await;
    if preflight_other_cores > 0.1 {
        eprintln!("warning: other processes use {preflight_other_cores:.2} cores: expect noise");
    }
    let in_process = in_process(&keys, plan.verifications, plan.alg)?;

    let server = Server::start(&bins.example, work)?;
    let dir = work.join("dpop");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let sidecar = Sidecar::start(
        &bins.lifeguard,
        &dir,
        &server.endpoint,
        &keys,
        &bins.sidecar_env,
        &[],
    )
    .await
    .context("starting the sidecar")?;
    let mut caller = Caller::new(&keys, &sidecar.endpoint, plan.alg)?;
    checked(&mut caller).await?;

    let mut lane = Lane {
        plan: &plan,
        caller,
        server,
        sidecar,
        errors: Errors::default(),
        lanes: Vec::new(),
        other_ticks: 0,
        measured_secs: 0.0,
    };
    for shape in [Shape::Paced(plan.rate), Shape::Closed(plan.connections)] {
        lane.window(shape).await?;
    }
    lane.sidecar.proc.check_alive()?;
    lane.server.proc.check_alive()?;
    let Lane {
        errors,
        lanes,
        other_ticks,
        measured_secs,
        ..
    } = lane;
    Ok(DpopResult {
        mode,
        machine,
        ticks_per_sec,
        preflight_other_cores,
        other_cores: other_ticks as f64 / ticks_per_sec.max(1) as f64 / measured_secs.max(1e-9),
        lanes,
        in_process,
        errors,
        sidecar_env: bins
            .sidecar_env
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect(),
        plan,
    })
}
