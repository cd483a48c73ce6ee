//! How tasks end: a cancel that stops the work, terminal states nobody can change, results
//! read once, deadlines the server cannot outrun.

use std::time::Duration;

use serde_json::{Value, json};

use super::super::audit::field;
use super::super::call::Call;
use super::super::probe::Answer;
use super::{CheckDef, Env, Run, is_terminal, short};

pub const CANCEL_THEN_WRITES: CheckDef = CheckDef {
    id: "cancel-then-writes",
    title: "After a confirmed cancel no more rows are written, and the task stays cancelled",
    proves: "write_rows (a row every 50 ms) cancelled by its owner reads `cancelled` once the \
             server confirmed; the rows resource (read through the sidecar) gains no row after \
             that; a later tasks/update is acknowledged without effect and a second cancel is \
             the same empty acknowledgement, the status staying `cancelled` (terminal states \
             are immutable)",
    does_not_cover: "servers that ignore tasks/cancel (the sidecar then reports the truth \
                     only after --cancel-confirm-timeout, see docs/sidecar.md), side effects \
                     outside the rows resource",
};

pub const READ_ONCE: CheckDef = CheckDef {
    id: "read-once",
    title: "A completed result is kept exactly as long as the policy says",
    proves: "with `tasks.retention.deleteResultAfterRetrieval: true`, the first tasks/get of a \
             completed task returns its result and every later one reports `completed` with \
             \"The result was deleted after it was retrieved\" and no result; with `false`, \
             every read returns the same stored result",
    does_not_cover: "TTL expiry (minutes by default), result minimization (`tasks.results`), \
                     two racing first reads (tests/it/sidecar_results.rs)",
};

pub const DEADLINE: CheckDef = CheckDef {
    id: "deadline",
    title: "A task past its deadline fails, whatever the server does",
    proves: "confirm_action, which waits for an answer forever, is ended by the sidecar at its \
             `tasks.deadline` (per tool): it reads `failed` with statusMessage \"Deadline \
             exceeded…\", and a later answer from its owner changes nothing",
    does_not_cover: "deadlines longer than 20 s (the check does not wait for them), deadlines \
                     surviving a sidecar restart (tests/it/sidecar_lifecycle.rs)",
};

/// The rows `write_rows` wrote with `label`, read as `resources/read example://rows` through
/// the sidecar; `None` when the resource cannot be read.
async fn rows(env: &Env, label: &str, record: Option<&mut Run>) -> Option<usize> {
    let call = Call::new(
        "alice reads example://rows through the sidecar",
        "resources/read",
        json!({"uri": "example://rows"}),
    )
    .token(&env.people.alice);
    let (exchange, answer) = env.probe.send(&call).await;
    if let Some(run) = record {
        run.record(exchange);
    }
    let text = answer.result()["contents"][0]["text"].as_str()?;
    let rows: Value = serde_json::from_str(text).ok()?;
    Some(
        rows.as_array()?
            .iter()
            .filter(|r| r["label"] == label)
            .count(),
    )
}

fn is_empty_ack(answer: &Answer) -> bool {
    answer.status == 200 && *answer.result() == json!({"resultType": "complete"})
}

/// `cancel-then-writes`.
pub async fn cancel_then_writes(env: &Env, run: &mut Run) {
    if !env.task_tools_allowed(run, &["write_rows"]) {
        return;
    }
    let alice = env.people.alice.as_str();
    let label = format!("{}-rows", env.nonce);
    let args = json!({"count": 1000, "intervalMs": 50, "label": label});
    let Some(id) = env
        .create_task(run, "alice starts write_rows", alice, "write_rows", args)
        .await
    else {
        return;
    };
    let mark = env.audit.as_ref().map(|a| a.mark());
    // The work must be seen running before the cancel means anything.
    let mut started = None;
    for _ in 0..100 {
        match rows(env, &label, None).await {
            Some(n) if n >= 3 => {
                started = Some(n);
                break;
            }
            None => break,
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let before = rows(env, &label, Some(run)).await;
    if !run.expect(started.is_some() && before.is_some(), || {
        "the rows resource shows no rows of the task (is this the example server?)".to_owned()
    }) {
        env.cancel_and_wait(run, alice, &id).await;
        return;
    }
    let ack = run
        .send(
            &env.probe,
            Call::task("alice cancels it", "tasks/cancel", &id).token(alice),
        )
        .await;
    run.expect(is_empty_ack(&ack), || {
        format!(
            "tasks/cancel: expected HTTP 200 {{\"resultType\":\"complete\"}}, got HTTP {} {}",
            ack.status,
            short(&ack.raw)
        )
    });
    let confirmed = env
        .poll_until(
            run,
            "alice polls until the cancel is confirmed",
            alice,
            &id,
            Duration::from_secs(30),
            |a| is_terminal(a.task_status()),
        )
        .await;
    run.expect(confirmed.task_status() == "cancelled", || {
        format!(
            "expected status cancelled, got {} ({})",
            confirmed.task_status(),
            short(&confirmed.raw)
        )
    });
    let at_confirmation = rows(env, &label, Some(run)).await.unwrap_or_default();
    // Twenty rows' worth of time: any work still going on would show.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let later = rows(env, &label, Some(run)).await.unwrap_or_default();
    run.expect(later == at_confirmation, || {
        format!(
            "{} rows were written after the cancel was confirmed ({at_confirmation} → {later})",
            later.saturating_sub(at_confirmation)
        )
    });
    run.expect(at_confirmation < 1000, || {
        "the task wrote all its rows: the cancel stopped nothing".to_owned()
    });
    run.note(format!(
        "rows when the work was seen running: {}; at confirmation: {at_confirmation}; 1 s later: \
         {later}",
        before.unwrap_or_default()
    ));

    let upstream = env.upstream_mark().await;
    let update = run
        .send(
            &env.probe,
            Call::task(
                "alice sends tasks/update to the cancelled task",
                "tasks/update",
                &id,
            )
            .token(alice),
        )
        .await;
    run.expect(is_empty_ack(&update), || {
        format!(
            "tasks/update of a terminal task: documented as acknowledged and not forwarded, got \
             HTTP {} {}",
            update.status,
            short(&update.raw)
        )
    });
    let again = run
        .send(
            &env.probe,
            Call::task("alice cancels it again", "tasks/cancel", &id).token(alice),
        )
        .await;
    run.expect(is_empty_ack(&again), || {
        format!(
            "a second tasks/cancel: got HTTP {} {}",
            again.status,
            short(&again.raw)
        )
    });
    let after = run
        .send(
            &env.probe,
            Call::task("alice polls it once more", "tasks/get", &id).token(alice),
        )
        .await;
    run.expect(after.task_status() == "cancelled", || {
        format!("the status changed after the update: {}", short(&after.raw))
    });
    match env.upstream_since(upstream, "tasks/update").await {
        Some(reached) => {
            run.expect(reached == 0, || {
                "the tasks/update of the cancelled task reached the server".to_owned()
            });
        }
        None => run.note("without --upstream-debug the server's side was not inspected"),
    }
    if let Some(lines) = super::audit_lines(env, mark, "task.updated").await {
        run.expect(
            lines
                .iter()
                .any(|l| field(l, "reason") == "terminal_ignored"),
            || "no task.updated line with reason terminal_ignored".to_owned(),
        );
    }
    if let Some(lines) = super::audit_lines(env, mark, "task.cancelled").await {
        run.expect(lines.len() == 1, || {
            format!("expected one task.cancelled line, found {}", lines.len())
        });
    }
    run.summary(format!(
        "no row after the confirmed cancel ({at_confirmation} rows, then none); update and \
         second cancel changed nothing"
    ));
}

/// `read-once`.
pub async fn read_once(env: &Env, run: &mut Run) {
    let Some(tasks) = env.tasks() else {
        run.skip(if env.facts.is_none() {
            "needs --policy or --expect-policy to know tasks.retention"
        } else {
            "the policy enables no tasks"
        });
        return;
    };
    let delete = tasks.delete_result_after_retrieval;
    if !env.task_tools_allowed(run, &["slow_compute"]) {
        return;
    }
    let alice = env.people.alice.as_str();
    let label = format!("{}-once", env.nonce);
    let mark = env.audit.as_ref().map(|a| a.mark());
    let Some(id) = env
        .create_task(
            run,
            "alice starts a short task",
            alice,
            "slow_compute",
            json!({"seconds": 0.2, "label": label}),
        )
        .await
    else {
        return;
    };
    let first = env
        .poll_until(
            run,
            "alice polls until it completes",
            alice,
            &id,
            Duration::from_secs(15),
            |a| is_terminal(a.task_status()),
        )
        .await;
    let expected_text = format!("computed {label}");
    run.expect(
        first.task_status() == "completed"
            && first.result()["result"]["content"][0]["text"] == expected_text.as_str(),
        || {
            format!(
                "the first completed read should carry the result: {}",
                short(&first.raw)
            )
        },
    );
    for n in 2..=3 {
        let later = run
            .send(
                &env.probe,
                Call::task(format!("alice reads it again (read {n})"), "tasks/get", &id)
                    .token(alice),
            )
            .await;
        if delete {
            run.expect(
                later.task_status() == "completed"
                    && later.result().get("result").is_none()
                    && later.result()["statusMessage"]
                        == "The result was deleted after it was retrieved",
                || {
                    format!(
                        "read {n}: expected completed without a result, got {}",
                        short(&later.raw)
                    )
                },
            );
        } else {
            run.expect(later.result()["result"] == first.result()["result"], || {
                format!("read {n}: the stored result changed: {}", short(&later.raw))
            });
        }
    }
    if delete && let Some(lines) = super::audit_lines(env, mark, "task.result_read").await {
        run.expect(lines.len() == 1, || {
            format!("expected one task.result_read line, found {}", lines.len())
        });
    }
    run.summary(if delete {
        "the result was delivered once, then reported deleted"
    } else {
        "every read returned the same stored result (deleteResultAfterRetrieval: false)"
    });
}

/// `deadline`.
pub async fn deadline(env: &Env, run: &mut Run) {
    let Some(tasks) = env.tasks() else {
        run.skip(if env.facts.is_none() {
            "needs --policy or --expect-policy to know the deadline"
        } else {
            "the policy enables no tasks"
        });
        return;
    };
    if !env.task_tools_allowed(run, &["confirm_action"]) {
        return;
    }
    let limit = tasks.deadline_for("confirm_action");
    if limit > Duration::from_secs(20) {
        run.skip(format!(
            "confirm_action's deadline is {} s; the check waits at most 20 s (set \
             tasks.deadline.perTool.confirm_action)",
            limit.as_secs()
        ));
        return;
    }
    let alice = env.people.alice.as_str();
    let mark = env.audit.as_ref().map(|a| a.mark());
    let Some(id) = env
        .create_task(
            run,
            "alice starts confirm_action (it waits for an answer forever)",
            alice,
            "confirm_action",
            json!({"action": format!("{}-deadline", env.nonce)}),
        )
        .await
    else {
        return;
    };
    let ended = env
        .poll_until(
            run,
            "alice polls until the task ends",
            alice,
            &id,
            limit + Duration::from_secs(20),
            |a| is_terminal(a.task_status()),
        )
        .await;
    let message = ended.result()["statusMessage"].as_str().unwrap_or_default();
    run.expect(
        ended.task_status() == "failed" && message.starts_with("Deadline exceeded"),
        || {
            format!(
                "expected failed with \"Deadline exceeded…\", got {}",
                short(&ended.raw)
            )
        },
    );
    let answer = run
        .send(
            &env.probe,
            Call::task(
                "alice answers the input request too late",
                "tasks/update",
                &id,
            )
            .token(alice),
        )
        .await;
    run.expect(is_empty_ack(&answer), || {
        format!(
            "a late tasks/update: got HTTP {} {}",
            answer.status,
            short(&answer.raw)
        )
    });
    let after = run
        .send(
            &env.probe,
            Call::task("alice polls once more", "tasks/get", &id).token(alice),
        )
        .await;
    run.expect(after.task_status() == "failed", || {
        format!(
            "the status changed after the late answer: {}",
            short(&after.raw)
        )
    });
    if let Some(lines) = super::audit_lines(env, mark, "task.cancelled").await {
        run.expect(
            lines.iter().any(|l| field(l, "reason") == "deadline"),
            || "no task.cancelled line with reason deadline".to_owned(),
        );
    }
    run.summary(format!(
        "the task failed at its {} ms deadline and stayed failed",
        limit.as_millis()
    ));
}
