//! Bounds on how much work one principal can start: concurrency quotas under a burst, and
//! idempotent creation.

use futures_util::future::join_all;
use serde_json::json;

use super::super::audit::field;
use super::super::call::Call;
use super::super::probe::Answer;
use super::{CheckDef, Env, Run, short};

pub const QUOTA: CheckDef = CheckDef {
    id: "quota",
    title: "20 concurrent creations by one principal: exactly the quota is accepted",
    proves: "of 20 tools/call sent at once by one principal, exactly \
             `tasks.concurrency.perPrincipal` become tasks and the rest get HTTP 429 with \
             `Retry-After` and JSON-RPC -31429 naming the `principal` quota; a cancelled \
             task's slot is free again once it ended, and only that one",
    does_not_cover: "the tenant, client and server quotas (same mechanism, other counters), \
                     several sidecar replicas sharing a ledger (tests/it/scale_out.rs)",
};

pub const IDEMPOTENCY: CheckDef = CheckDef {
    id: "idempotency",
    title: "One Idempotency-Key, one task, per owner",
    proves: "repeating a creation with the same `Idempotency-Key`, one after another or five \
             at once, returns the same task ID; the same key from another principal, or \
             another key, makes a new task (keys are hashed with their owner and tool)",
    does_not_cover: "keys derived from the arguments (`deriveFromRequest`), the window's \
                     expiry",
};

fn is_quota_refusal(answer: &Answer) -> bool {
    answer.status == 429
        && answer.error_code() == Some(-31429)
        && answer.json["error"]["data"]["scope"] == "principal"
        && answer.header("retry-after").is_some()
}

/// `quota`.
pub async fn quota(env: &Env, run: &mut Run) {
    if !env.task_tools_allowed(run, &["slow_compute"]) {
        return;
    }
    let expected = env.tasks().map(|t| t.concurrency);
    if let Some(limits) = expected {
        if limits.per_principal >= 20 {
            run.skip(format!(
                "perPrincipal is {}: 20 creations cannot exceed it",
                limits.per_principal
            ));
            return;
        }
        let others = [limits.per_tenant, limits.per_client, limits.per_server];
        if others.iter().any(|l| *l < limits.per_principal) {
            run.note("a tenant, client or server quota is below perPrincipal: it may refuse first");
        }
    }
    let dave = env.people.dave.as_str();
    let call = |n: usize, what: &str| {
        Call::tool(
            format!("dave: {what} #{n}"),
            "slow_compute",
            json!({"seconds": 300, "label": format!("{}-quota-{what}-{n}", env.nonce)}),
        )
        .token(dave)
    };
    let calls: Vec<Call> = (1..=20).map(|n| call(n, "burst")).collect();
    let outcomes = join_all(calls.iter().map(|c| env.probe.send(c))).await;
    let mut accepted = Vec::new();
    for (exchange, answer) in outcomes {
        let label = exchange.label.clone();
        run.record(exchange);
        match answer.result()["taskId"].as_str() {
            Some(id) if answer.status == 200 => accepted.push(id.to_owned()),
            _ => {
                run.expect(is_quota_refusal(&answer), || {
                    format!(
                        "{label}: expected HTTP 429, Retry-After and -31429 scope principal, got \
                         HTTP {} {}",
                        answer.status,
                        short(&answer.raw)
                    )
                });
            }
        }
    }
    let refused = 20 - accepted.len();
    run.note(format!("{} accepted, {refused} refused", accepted.len()));
    match expected {
        Some(limits) => {
            run.expect(accepted.len() == limits.per_principal as usize, || {
                format!(
                    "expected exactly {} tasks (perPrincipal), got {}",
                    limits.per_principal,
                    accepted.len()
                )
            });
        }
        None => {
            run.expect(!accepted.is_empty() && refused > 0, || {
                format!("{} of 20 accepted: no quota is in force", accepted.len())
            });
            run.note("without the policy the exact quota was not compared");
        }
    }
    if accepted.is_empty() || refused == 0 {
        for id in &accepted {
            env.cancel_and_wait(run, dave, id).await;
        }
        return;
    }

    // A slot comes back when a task has ended: one cancel, one more task, and no more.
    let freed = accepted.remove(0);
    env.cancel_and_wait(run, dave, &freed).await;
    let refill = run.send(&env.probe, call(1, "after one cancel")).await;
    match refill.result()["taskId"].as_str() {
        Some(id) if refill.status == 200 => accepted.push(id.to_owned()),
        _ => run.fail(format!(
            "after one task ended, a creation should be accepted, got HTTP {} {}",
            refill.status,
            short(&refill.raw)
        )),
    }
    let over = run.send(&env.probe, call(2, "after one cancel")).await;
    run.expect(is_quota_refusal(&over), || {
        format!(
            "the one freed slot was taken: the next creation should be refused, got HTTP {} {}",
            over.status,
            short(&over.raw)
        )
    });
    if let Some(id) = over.result()["taskId"].as_str() {
        accepted.push(id.to_owned());
    }
    for id in &accepted {
        env.cancel_and_wait(run, dave, id).await;
    }
    let fresh = run.send(&env.probe, call(1, "after all ended")).await;
    run.expect(fresh.status == 200, || {
        format!(
            "after every task ended, a creation should be accepted, got HTTP {} {}",
            fresh.status,
            short(&fresh.raw)
        )
    });
    if let Some(id) = fresh.result()["taskId"].as_str() {
        env.cancel_and_wait(run, dave, id).await;
    }
    run.summary(format!(
        "{} of 20 accepted, {refused} refused with the documented 429; slots came back as tasks \
         ended",
        20 - refused
    ));
}

/// `idempotency`.
pub async fn idempotency(env: &Env, run: &mut Run) {
    if !env.task_tools_allowed(run, &["slow_compute"]) {
        return;
    }
    let (alice, bob) = (env.people.alice.as_str(), env.people.bob.as_str());
    let key = format!("{}-idem", env.nonce);
    let args = json!({"seconds": 120, "label": key});
    let create = |label: String, token: &str, key: &str| {
        Call::tool(label, "slow_compute", args.clone())
            .token(token)
            .header("idempotency-key", key)
    };
    let mark = env.audit.as_ref().map(|a| a.mark());
    let first = run
        .send(
            &env.probe,
            create("alice creates with a key".into(), alice, &key),
        )
        .await;
    let Some(id) = first.result()["taskId"].as_str().map(str::to_owned) else {
        run.fail(format!(
            "the first creation made no task: {}",
            short(&first.raw)
        ));
        return;
    };
    let mut made = vec![(alice, id.clone())];
    let again = run
        .send(&env.probe, create("alice repeats it".into(), alice, &key))
        .await;
    run.expect(again.result()["taskId"] == id.as_str(), || {
        format!("the repeat made another task: {}", short(&again.raw))
    });
    let burst: Vec<Call> = (1..=5)
        .map(|n| create(format!("alice repeats it at once #{n}"), alice, &key))
        .collect();
    for (exchange, answer) in join_all(burst.iter().map(|c| env.probe.send(c))).await {
        let label = exchange.label.clone();
        run.record(exchange);
        run.expect(answer.result()["taskId"] == id.as_str(), || {
            format!(
                "{label}: expected the same task, got {}",
                short(&answer.raw)
            )
        });
    }
    for (label, token, key) in [
        ("bob uses alice's key", bob, key.clone()),
        ("alice uses another key", alice, format!("{key}-other")),
    ] {
        let answer = run
            .send(&env.probe, create(label.into(), token, &key))
            .await;
        match answer.result()["taskId"].as_str() {
            Some(other) if answer.status == 200 => {
                run.expect(other != id, || format!("{label}: got alice's task"));
                made.push((token, other.to_owned()));
            }
            _ => run.fail(format!(
                "{label}: expected a new task, got HTTP {} {}",
                answer.status,
                short(&answer.raw)
            )),
        }
    }
    if let Some(lines) = super::audit_lines(env, mark, "task.deduplicated").await {
        let alices = lines
            .iter()
            .filter(|l| field(l, "subject") == "alice")
            .count();
        run.expect(alices == 6, || {
            format!("expected 6 task.deduplicated lines for alice, found {alices}")
        });
    }
    for (token, id) in &made {
        env.cancel_and_wait(run, token, id).await;
    }
    run.summary("7 creations with one key made one task; another owner or key made its own");
}
