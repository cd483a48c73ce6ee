//! The process callgrind measures: an in-process sidecar in front of a server that answers from
//! memory, and a client sending one request after another, in phases.
//!
//! Every phase ends with a call of [`perf_gate_phase_boundary`]; `scripts/perf-gate.sh` runs
//! this process with `--dump-before=*perf_gate_phase_boundary*`, so callgrind writes the
//! instructions of the whole process (every thread: the sidecar's workers, its ledger and audit
//! threads, the server, the client) since the previous boundary to one numbered file per phase.
//! The phases, in the order of those files, are written to `phases.json`.
//!
//! Per request kind and lane (the server directly, or through the sidecar) a warm-up phase
//! (connections open, caches and pools filled) comes before the measured one. Whatever a
//! request leaves behind once answered (its audit line, a ledger write) is counted in the next
//! phase: the warm-up's tail in the measured phase, the measured phase's tail in the next
//! warm-up, so a measured phase holds as many requests' work as it sent.

use std::path::Path;

use anyhow::{Result, bail, ensure};
use jsonwebtoken::Algorithm;
use lifeguard::runtime::workers::Workers;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::client::{Conn, Endpoint, Template, is_success};
use crate::in_process::{self, MemoryServer};
use crate::procs::{self, Keys, TASK_TOOL};
use crate::sse::SseConn;

/// The request kinds the gate counts, in the order they run.
pub const KINDS: [Kind; 5] = [
    Kind::Greet,
    Kind::TasksGet,
    Kind::TaskCreation,
    Kind::Refusal,
    Kind::ListenDelivery,
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `tools/call` of a synchronous tool, forwarded.
    Greet,
    /// `tasks/get` of the caller's working task, forwarded.
    TasksGet,
    /// `tools/call` of a task tool: a task recorded in the ledger.
    TaskCreation,
    /// `tasks/get` of another principal's task: the uniform denial, never forwarded.
    Refusal,
    /// One resource update, from the server's listen stream to the client's.
    ListenDelivery,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Greet => "greet",
            Self::TasksGet => "tasks/get",
            Self::TaskCreation => "task creation",
            Self::Refusal => "refusal",
            Self::ListenDelivery => "listen delivery",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        KINDS.into_iter().find(|k| k.name() == name)
    }

    /// Whether the kind also runs against the server directly (a refusal never reaches it).
    pub fn has_direct_lane(self) -> bool {
        self != Self::Refusal
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Lane {
    /// The client talks to the server itself.
    Direct,
    /// The client talks to the sidecar in front of the server.
    Sidecar,
}

/// One phase, as `phases.json` lists them: the `n`th entry is what callgrind's `n`th dump
/// holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    /// Request kind ([`Kind::name`]); none for the set-up.
    pub kind: Option<String>,
    pub lane: Option<Lane>,
    /// Whether the phase is one the gate counts (not a warm-up or the set-up).
    pub measured: bool,
    /// Requests of this kind sent in the phase, including planted ones.
    pub requests: u64,
    /// Requests the phase stands for: its per-request count divides by this.
    pub counted: u64,
}

/// A regression planted on purpose, to show the gate catches it: in the measured sidecar phase
/// of `kind`, every request whose number is a multiple of `every` is sent twice (so
/// `every = 5` adds 20 % more requests than are counted).
#[derive(Clone, Copy, Debug)]
pub struct Plant {
    pub kind: Kind,
    pub every: u64,
}

pub struct Plan {
    pub warmup: u64,
    pub requests: u64,
    pub plant: Option<Plant>,
}

/// Marks the end of a phase: callgrind dumps what was counted since the last call on entry.
/// Never inlined, so that there is a function to enter.
#[inline(never)]
pub fn perf_gate_phase_boundary(phase: &Phase) {
    std::hint::black_box(phase);
}

/// The URI the listen phases subscribe to.
const URI: &str = "example://bench/perf-gate";

/// Runs every phase on `workers`; returns them in order.
pub async fn run(repo: &Path, work: &Path, workers: &Workers, plan: &Plan) -> Result<Vec<Phase>> {
    let keys = Keys::load(repo)?;
    let shutdown = CancellationToken::new();
    let server = MemoryServer::start(workers, shutdown.clone()).await?;
    let sidecar = in_process::start_sidecar(
        work,
        &keys,
        &procs::policy_yaml(),
        server.addr,
        workers,
        shutdown.clone(),
    )
    .await?;
    let direct = Endpoint {
        addr: server.addr,
        path: "/mcp".into(),
    };
    let caller = keys.token(Algorithm::RS256, "perf-gate", "bench", "bench-client")?;
    let other = keys.token(Algorithm::RS256, "someone-else", "bench", "bench-client")?;
    let own_task = procs::running_task(&sidecar, &caller).await?;
    let foreign_task = procs::running_task(&sidecar, &other).await?;
    let ids = TaskIds {
        own: own_task,
        foreign: foreign_task,
    };

    let mut phases = Vec::new();
    end_phase(
        &mut phases,
        Phase {
            kind: None,
            lane: None,
            measured: false,
            requests: 0,
            counted: 0,
        },
    );
    for kind in KINDS {
        let lanes: &[Lane] = if kind.has_direct_lane() {
            &[Lane::Direct, Lane::Sidecar]
        } else {
            &[Lane::Sidecar]
        };
        for &lane in lanes {
            let endpoint = match lane {
                Lane::Direct => &direct,
                Lane::Sidecar => &sidecar,
            };
            let mut load = Load::open(kind, endpoint, &caller, &ids, &server).await?;
            let phase = |measured: bool, requests: u64, counted: u64| Phase {
                kind: Some(kind.name().to_owned()),
                lane: Some(lane),
                measured,
                requests,
                counted,
            };
            load.send(plan.warmup, None).await?;
            end_phase(&mut phases, phase(false, plan.warmup, plan.warmup));
            let plant = plan
                .plant
                .filter(|p| p.kind == kind && lane == Lane::Sidecar)
                .map(|p| p.every);
            let sent = load.send(plan.requests, plant).await?;
            end_phase(&mut phases, phase(true, sent, plan.requests));
        }
    }
    shutdown.cancel();
    Ok(phases)
}

fn end_phase(phases: &mut Vec<Phase>, phase: Phase) {
    perf_gate_phase_boundary(&phase);
    phases.push(phase);
}

struct TaskIds {
    own: String,
    foreign: String,
}

/// What one phase sends, on one connection.
enum Load<'a> {
    /// A request and the answer it must get.
    Request {
        conn: Conn,
        template: Template,
        expect: Expect,
    },
    /// A resource event from the server, read from a listen stream.
    Listen {
        stream: SseConn,
        server: &'a MemoryServer,
    },
}

#[derive(Clone, Copy)]
enum Expect {
    Success,
    /// The uniform denial: this HTTP status and a JSON-RPC error, every time.
    Denial(u16),
}

impl<'a> Load<'a> {
    async fn open(
        kind: Kind,
        endpoint: &Endpoint,
        token: &str,
        ids: &TaskIds,
        server: &'a MemoryServer,
    ) -> Result<Self> {
        let request = |template: Template, expect| async move {
            let conn = Conn::connect(endpoint.addr).await?;
            anyhow::Ok(Self::Request {
                conn,
                template,
                expect,
            })
        };
        match kind {
            Kind::Greet => {
                let t =
                    Template::tool_call(endpoint, token, "greet", json!({"name": "gate"}), false);
                request(t, Expect::Success).await
            }
            Kind::TasksGet => {
                request(
                    Template::task_get(endpoint, token, &ids.own),
                    Expect::Success,
                )
                .await
            }
            Kind::TaskCreation => {
                let args = json!({"seconds": 86400});
                let t = Template::tool_call(endpoint, token, TASK_TOOL, args, true);
                request(t, Expect::Success).await
            }
            Kind::Refusal => {
                let template = Template::task_get(endpoint, token, &ids.foreign);
                let mut conn = Conn::connect(endpoint.addr).await?;
                let status = conn.send(template.bytes()).await?;
                ensure!(
                    !is_success(status, conn.body()),
                    "another principal's task was not refused: HTTP {status}"
                );
                request(template, Expect::Denial(status)).await
            }
            Kind::ListenDelivery => {
                let listen = Template::mcp(
                    endpoint,
                    token,
                    "subscriptions/listen",
                    None,
                    json!({"notifications": {"resourceSubscriptions": [URI]}}),
                    false,
                );
                let mut stream = SseConn::open(endpoint.addr, listen.bytes()).await?;
                let ack = stream.next_frame().await?;
                ensure!(
                    ack["method"] == "notifications/subscriptions/acknowledged"
                        && ack["params"]["notifications"]["resourceSubscriptions"] == json!([URI]),
                    "the listen stream was not acknowledged with its subscription: {ack}"
                );
                Ok(Self::Listen { stream, server })
            }
        }
    }

    /// Sends `count` requests (and with `plant_every`, each `plant_every`th one twice); returns
    /// how many went out.
    async fn send(&mut self, count: u64, plant_every: Option<u64>) -> Result<u64> {
        let mut sent = 0;
        for n in 1..=count {
            let times = match plant_every {
                Some(every) if n % every == 0 => 2,
                _ => 1,
            };
            for _ in 0..times {
                self.one(n).await?;
                sent += 1;
            }
        }
        Ok(sent)
    }

    async fn one(&mut self, n: u64) -> Result<()> {
        match self {
            Self::Request {
                conn,
                template,
                expect,
            } => {
                template.set_id(n);
                let status = conn.send(template.bytes()).await?;
                let body = conn.body();
                let as_expected = match expect {
                    Expect::Success => is_success(status, body),
                    Expect::Denial(denial) => {
                        status == *denial && body.windows(8).any(|w| w == b"\"error\":")
                    }
                };
                if !as_expected {
                    bail!(
                        "unexpected answer: HTTP {status} {}",
                        String::from_utf8_lossy(&body[..body.len().min(300)])
                    );
                }
                Ok(())
            }
            Self::Listen { stream, server } => {
                ensure!(server.emit(URI) > 0, "no listen stream took the event");
                let frame = stream.next_frame().await?;
                ensure!(
                    frame["method"] == "notifications/resources/updated"
                        && frame["params"]["uri"] == URI,
                    "the listen stream delivered something else: {frame}"
                );
                Ok(())
            }
        }
    }
}
