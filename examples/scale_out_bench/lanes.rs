//! The processes of the scale-out benchmark, its phases, and its report.
//!
//! Processes: one example server measured directly; one server behind a sidecar on SQLite; and
//! three servers behind three sidecars sharing one PostgreSQL database (replicas `r0`, `r1`,
//! `r2` of one server scope, each with its internal hop). The PostgreSQL lane of the latency
//! phases is replica `r0`; the non-home poll asks `r1` about a task homed on `r0`.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use jsonwebtoken::Algorithm;
use serde_json::{Value, json};

use crate::Plan;
use crate::client::{Conn, Endpoint, Template, describe_failure, is_success, timed};
use crate::procs::{Keys, Server, Sidecar, TASK_TOOL, replica_args};
use crate::stats::{Added, Errors, Summary, us, us_signed};

/// Every process of the run.
pub struct Fleet {
    keys: Keys,
    direct: Server,
    _sqlite_server: Server,
    sqlite: Sidecar,
    _pg_servers: Vec<Server>,
    replicas: Vec<Sidecar>,
}

impl Fleet {
    pub async fn start(repo: &Path, profile: &Path, work: &Path, ledger: &str) -> Result<Self> {
        let keys = Keys::load(repo)?;
        let lifeguard = profile.join("lifeguard");
        let example = profile.join("examples/example_server");
        for binary in [&lifeguard, &example] {
            if !binary.is_file() {
                bail!(
                    "{} is missing: build it first (scripts/bench-scale-out.sh does)",
                    binary.display()
                );
            }
        }
        let dir = |name: &str| -> Result<std::path::PathBuf> {
            let d = work.join(name);
            std::fs::create_dir_all(&d)?;
            Ok(d)
        };
        let direct = Server::start(&example, &dir("direct")?)?;
        let sqlite_dir = dir("sqlite")?;
        let sqlite_server = Server::start(&example, &sqlite_dir)?;
        let sqlite = Sidecar::start(
            &lifeguard,
            &sqlite_dir,
            &sqlite_server.endpoint,
            &keys,
            &[],
            &[],
        )
        .await?;
        let mut pg_servers = Vec::new();
        let mut replicas = Vec::new();
        for i in 0..3 {
            let d = dir(&format!("r{i}"))?;
            let server = Server::start(&example, &d)?;
            let args = replica_args(ledger, i);
            let sidecar = Sidecar::start(&lifeguard, &d, &server.endpoint, &keys, &[], &args)
                .await
                .with_context(|| format!("starting replica r{i}"))?;
            pg_servers.push(server);
            replicas.push(sidecar);
        }
        Ok(Self {
            keys,
            direct,
            _sqlite_server: sqlite_server,
            sqlite,
            _pg_servers: pg_servers,
            replicas,
        })
    }

    fn token(&self, subject: &str) -> Result<String> {
        self.keys.token(Algorithm::EdDSA, subject, "bench", "bench")
    }

    pub async fn measure(&self, plan: &Plan) -> Result<Outcome> {
        let mut errors = Errors::default();
        let creation = self.creation(plan, &mut errors).await?;
        let polls = self.polls(plan, &mut errors).await?;
        let throughput = self.throughput(plan, &mut errors).await?;
        Ok(Outcome {
            creation,
            polls,
            throughput,
            errors,
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        })
    }

    /// Sequential task creations per lane, in alternating rounds; each round's tasks are
    /// completed afterwards (unmeasured), so the active rows quotas count stay few.
    async fn creation(&self, plan: &Plan, errors: &mut Errors) -> Result<Vec<Summary>> {
        let token = self.token("creator")?;
        let lanes = [
            &self.direct.endpoint,
            &self.sqlite.endpoint,
            &self.replicas[0].endpoint,
        ];
        let mut samples = vec![Vec::new(); lanes.len()];
        let per_round = (plan.create_samples / plan.rounds).max(1);
        for round in 0..plan.rounds {
            for k in 0..lanes.len() {
                let lane = if round % 2 == 0 {
                    k
                } else {
                    lanes.len() - 1 - k
                };
                let endpoint = lanes[lane];
                let template = create_template(endpoint, &token);
                let mut conn = Conn::connect(endpoint.addr).await?;
                let mut created = Vec::with_capacity(per_round);
                for n in 0..per_round {
                    let mut t = template.clone();
                    t.set_id(n as u64);
                    let (status, ns) = timed(&mut conn, t.bytes()).await?;
                    match task_id(status, &conn) {
                        Some(id) => {
                            samples[lane].push(ns);
                            created.push(id);
                        }
                        None => errors.record(describe_failure(status, conn.body())),
                    }
                }
                complete(endpoint, &token, &created, errors).await?;
            }
        }
        Ok(samples.iter_mut().map(|s| Summary::of(s)).collect())
    }

    /// Sequential `tasks/get` of one running task per lane: direct, SQLite, PostgreSQL on the
    /// task's home replica, PostgreSQL through another replica.
    async fn polls(&self, plan: &Plan, errors: &mut Errors) -> Result<Vec<Summary>> {
        let token = self.token("poller")?;
        let running = |endpoint: &Endpoint| {
            let endpoint = endpoint.clone();
            let token = token.clone();
            async move {
                let t = Template::tool_call(
                    &endpoint,
                    &token,
                    TASK_TOOL,
                    json!({"seconds": 86_400, "label": "poll"}),
                    true,
                );
                let mut conn = Conn::connect(endpoint.addr).await?;
                let status = conn.send(t.bytes()).await?;
                task_id(status, &conn).with_context(|| {
                    format!("no running task: {}", describe_failure(status, conn.body()))
                })
            }
        };
        let direct_task = running(&self.direct.endpoint).await?;
        let sqlite_task = running(&self.sqlite.endpoint).await?;
        let pg_task = running(&self.replicas[0].endpoint).await?;
        let lanes = [
            (&self.direct.endpoint, &direct_task),
            (&self.sqlite.endpoint, &sqlite_task),
            (&self.replicas[0].endpoint, &pg_task),
            (&self.replicas[1].endpoint, &pg_task),
        ];
        let mut samples = vec![Vec::new(); lanes.len()];
        let per_round = (plan.poll_samples / plan.rounds).max(1);
        for round in 0..plan.rounds {
            for k in 0..lanes.len() {
                let lane = if round % 2 == 0 {
                    k
                } else {
                    lanes.len() - 1 - k
                };
                let (endpoint, task) = lanes[lane];
                let template = Template::task_get(endpoint, &token, task);
                let mut conn = Conn::connect(endpoint.addr).await?;
                for n in 0..per_round {
                    let mut t = template.clone();
                    t.set_id(n as u64);
                    let (status, ns) = timed(&mut conn, t.bytes()).await?;
                    if is_success(status, conn.body()) {
                        samples[lane].push(ns);
                    } else {
                        errors.record(describe_failure(status, conn.body()));
                    }
                }
            }
        }
        Ok(samples.iter_mut().map(|s| Summary::of(s)).collect())
    }

    /// Closed-loop task creation: `connections` connections (one principal each) on replica
    /// `r0` alone, then spread over the three replicas, in alternating rounds (one, three,
    /// three, one); each round's tasks are completed afterwards. Creations per second.
    async fn throughput(&self, plan: &Plan, errors: &mut Errors) -> Result<[f64; 2]> {
        let tokens: Vec<String> = (0..plan.connections)
            .map(|w| self.token(&format!("load-{w}")))
            .collect::<Result<_>>()?;
        let one = [&self.replicas[0].endpoint];
        let three: Vec<&Endpoint> = self.replicas.iter().map(|r| &r.endpoint).collect();
        let mut totals = [(0u64, Duration::ZERO); 2];
        for fleet in [0, 1, 1, 0] {
            let endpoints: &[&Endpoint] = if fleet == 0 { &one } else { &three };
            let (created, elapsed) =
                closed_loop_creates(endpoints, &tokens, plan.throughput, errors).await?;
            totals[fleet].0 += created.len() as u64;
            totals[fleet].1 += elapsed;
            // Complete them, so the next round starts from few active rows.
            for (i, endpoint) in endpoints.iter().enumerate() {
                let mine: Vec<(String, String)> = created
                    .iter()
                    .filter(|(e, _, _)| *e == i)
                    .map(|(_, w, id)| (tokens[*w].clone(), id.clone()))
                    .collect();
                complete_as(endpoint, &mine, errors).await?;
            }
        }
        Ok(totals.map(|(n, t)| n as f64 / t.as_secs_f64().max(1e-9)))
    }
}

fn create_template(endpoint: &Endpoint, token: &str) -> Template {
    Template::tool_call(
        endpoint,
        token,
        TASK_TOOL,
        json!({"seconds": 0, "label": "create"}),
        true,
    )
}

fn task_id(status: u16, conn: &Conn) -> Option<String> {
    if !is_success(status, conn.body()) {
        return None;
    }
    conn.body_json()?
        .pointer("/result/taskId")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// Polls each task once (they are `slow_compute` of 0 s: done by now), so it ends.
async fn complete(
    endpoint: &Endpoint,
    token: &str,
    ids: &[String],
    errors: &mut Errors,
) -> Result<()> {
    let owned: Vec<(String, String)> = ids
        .iter()
        .map(|id| (token.to_owned(), id.clone()))
        .collect();
    complete_as(endpoint, &owned, errors).await
}

async fn complete_as(
    endpoint: &Endpoint,
    tasks: &[(String, String)],
    errors: &mut Errors,
) -> Result<()> {
    let mut conn = Conn::connect(endpoint.addr).await?;
    for (token, id) in tasks {
        let t = Template::task_get(endpoint, token, id);
        let status = conn.send(t.bytes()).await?;
        if !is_success(status, conn.body()) {
            errors.record(describe_failure(status, conn.body()));
        }
    }
    Ok(())
}

/// Each connection `w` (principal `tokens[w]`) on `endpoints[w % len]` creates tasks until
/// `duration` passed. Returns (endpoint index, worker, task ID) of every creation, and the
/// elapsed time.
async fn closed_loop_creates(
    endpoints: &[&Endpoint],
    tokens: &[String],
    duration: Duration,
    errors: &mut Errors,
) -> Result<(Vec<(usize, usize, String)>, Duration)> {
    let started = Instant::now();
    let deadline = started + duration;
    let mut workers = Vec::new();
    for (w, token) in tokens.iter().enumerate() {
        let e = w % endpoints.len();
        let endpoint = endpoints[e].clone();
        let template = create_template(&endpoint, token);
        let mut conn = Conn::connect(endpoint.addr).await?;
        workers.push(tokio::spawn(async move {
            let mut created = Vec::new();
            let mut errors = Errors::default();
            let mut n = (w as u64) << 32;
            while Instant::now() < deadline {
                n += 1;
                let mut t = template.clone();
                t.set_id(n);
                match conn.send(t.bytes()).await {
                    Ok(status) => match task_id(status, &conn) {
                        Some(id) => created.push((e, w, id)),
                        None => errors.record(describe_failure(status, conn.body())),
                    },
                    Err(err) => {
                        errors.record(format!("{err:#}"));
                        break;
                    }
                }
            }
            (created, errors)
        }));
    }
    let mut all = Vec::new();
    for worker in workers {
        let (created, worker_errors) = worker.await.context("load worker panicked")?;
        all.extend(created);
        errors.merge(worker_errors);
    }
    Ok((all, started.elapsed()))
}

/// What a run measured.
pub struct Outcome {
    /// Creation latency: direct, SQLite, PostgreSQL.
    pub creation: Vec<Summary>,
    /// `tasks/get`: direct, SQLite, PostgreSQL home, PostgreSQL through another replica.
    pub polls: Vec<Summary>,
    /// Creations per second: one replica, three replicas.
    pub throughput: [f64; 2],
    pub errors: Errors,
    pub cores: usize,
}

fn verdict(pass: bool) -> &'static str {
    if pass { "PASS" } else { "MISS" }
}

impl Outcome {
    fn targets(&self) -> Vec<(&'static str, String, String, bool)> {
        let pg_create = &self.creation[2];
        let home = Added::between(&self.polls[0], &self.polls[2]);
        let other = Added::between(&self.polls[0], &self.polls[3]);
        let ratio = self.throughput[1] / self.throughput[0].max(1e-9);
        vec![
            (
                "durable creation p99 (PostgreSQL)",
                format!("{} µs", us(pg_create.p99)),
                "≤ 5 ms".into(),
                pg_create.p99 <= 5_000_000,
            ),
            (
                "owner poll added p50 (PostgreSQL)",
                format!("{} µs", us_signed(home.p50)),
                "≤ 250 µs".into(),
                home.p50 <= 250_000,
            ),
            (
                "poll through a non-home replica added p50",
                format!("{} µs", us_signed(other.p50)),
                "≤ 1 ms".into(),
                other.p50 <= 1_000_000,
            ),
            (
                "creation throughput, 3 replicas / 1",
                format!(
                    "{:.2} ({:.0} / {:.0} per s)",
                    ratio, self.throughput[1], self.throughput[0]
                ),
                "≥ 2".into(),
                ratio >= 2.0,
            ),
        ]
    }

    pub fn table(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "scale-out benchmark ({} cores)\n\ncreation latency (µs)   p50      p99      p99.9\n",
            self.cores
        ));
        for (name, s) in ["direct", "SQLite", "PostgreSQL"]
            .iter()
            .zip(&self.creation)
        {
            out.push_str(&format!(
                "  {name:<20} {:>8} {:>8} {:>8}\n",
                us(s.p50),
                us(s.p99),
                us(s.p999)
            ));
        }
        out.push_str("\ntasks/get (µs)          p50      p99      added p50\n");
        let lanes = ["direct", "SQLite", "PostgreSQL, home", "PostgreSQL, other"];
        for (name, s) in lanes.iter().zip(&self.polls) {
            let added = Added::between(&self.polls[0], s);
            out.push_str(&format!(
                "  {name:<20} {:>8} {:>8} {:>8}\n",
                us(s.p50),
                us(s.p99),
                us_signed(added.p50)
            ));
        }
        out.push_str(&format!(
            "\ncreation throughput: one replica {:.0}/s, three replicas {:.0}/s\n\ntargets\n",
            self.throughput[0], self.throughput[1]
        ));
        for (name, value, target, pass) in self.targets() {
            out.push_str(&format!(
                "  {name:<44} {value:<28} {target:<8} {}\n",
                verdict(pass)
            ));
        }
        out.push_str(&format!("\nerrors: {}\n", self.errors.count));
        out
    }

    pub fn to_json(&self) -> Value {
        let lanes = |names: &[&str], summaries: &[Summary]| -> Value {
            names
                .iter()
                .zip(summaries)
                .map(|(n, s)| (n.to_string(), s.to_json()))
                .collect::<serde_json::Map<_, _>>()
                .into()
        };
        json!({
            "cores": self.cores,
            "creation": lanes(&["direct", "sqlite", "postgres"], &self.creation),
            "polls": lanes(&["direct", "sqlite", "postgres_home", "postgres_other"], &self.polls),
            "throughput_per_s": {"one_replica": self.throughput[0], "three_replicas": self.throughput[1]},
            "targets": self.targets().into_iter().map(|(name, value, target, pass)| json!({
                "name": name, "value": value, "target": target, "verdict": verdict(pass),
            })).collect::<Vec<_>>(),
            "errors": self.errors.count,
        })
    }
}
