//! A user disabled while her task runs: a PrincipalRevocation (`accountDisabled`) is added to
//! the policy file the sidecar reloads, then removed again.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::super::audit::field;
use super::super::call::Call;
use super::super::policy::{compile, replace_file, with_account_disabled};
use super::super::probe::Answer;
use super::reload::{RELOAD_WAIT, wait_for_policy};
use super::{ALICE, CheckDef, Env, Run, is_terminal, short};

pub const USER_DISABLED_MID_RUN: CheckDef = CheckDef {
    id: "user-disabled-mid-run",
    title: "Disabling a user while her task runs",
    proves: "a PrincipalRevocation with reason `accountDisabled` for alice, added to the reloaded \
             policy file, is in force within seconds (its hash on /ready); from then on the \
             token that started her task and a token minted after the revocation both get \
             HTTP 401 on tasks/get, tasks/cancel and tools/call; her listen stream on the task \
             is closed; her running task is cancelled and the server is asked to cancel it \
             (seen with --upstream-debug); bob's task in the same tenant runs on; the audit \
             trail records `revocation.applied` (at least one task cancelled) and `auth.denied` \
             with reason `revoked`; once the revocation is removed alice is let back in and \
             her task reads `cancelled` with a status message naming the revocation",
    does_not_cover: "cluster mode, where revocations come from the operator (`kubectl lifeguard \
                     revoke`, SSF events: tests/it/operator_cluster.rs); session revocations, \
                     where a fresh token works (tests/it/sidecar_revocation.rs); revocations of a \
                     whole tenant or client; the server's own work after the cancel",
};

fn is_refused(answer: &Answer) -> bool {
    answer.status == 401
}

/// `user-disabled-mid-run`.
pub async fn user_disabled_mid_run(env: &Env, run: &mut Run) {
    let Some(facts) = &env.facts else {
        run.skip("needs --policy (the policy file the sidecar reloads)");
        return;
    };
    if !facts.live {
        run.skip("needs --policy: --expect-policy is read only");
        return;
    }
    if !env.task_tools_allowed(run, &["write_rows", "slow_compute"]) {
        return;
    }
    let name = format!("evidence-disable-{}", env.nonce);
    let edited = with_account_disabled(&facts.text, &name, &env.minter.issuer, ALICE.subject);
    let disabled_hash = match compile(&facts.path, &edited) {
        Ok(policy) => policy.hash(),
        Err(e) => {
            run.fail(format!(
                "the policy with the revocation does not compile: {e:#}"
            ));
            return;
        }
    };
    let p = &env.people;
    let Some(alices) = env
        .create_task(
            run,
            "alice starts write_rows (a row every 100 ms for a minute)",
            &p.alice,
            "write_rows",
            json!({"count": 600, "intervalMs": 100, "label": format!("{}-disabled", env.nonce)}),
        )
        .await
    else {
        return;
    };
    let Some(bobs) = env
        .create_task(
            run,
            "bob starts slow_compute (120 s)",
            &p.bob,
            "slow_compute",
            json!({"seconds": 120, "label": format!("{}-bob", env.nonce)}),
        )
        .await
    else {
        env.cancel_and_wait(run, &p.alice, &alices).await;
        return;
    };

    // Alice listens to her task, when the policy lets her.
    let listen_allowed = env.listen_rules().is_some_and(|rules| {
        rules
            .notifications
            .contains(&lifeguard::api::ListenNotification::TaskIds)
    });
    let sub_id = json!(format!("{}-disabled", env.nonce));
    let listen = Call::new(
        "alice listens to her task",
        "subscriptions/listen",
        json!({"notifications": {"taskIds": [alices]}}),
    )
    .token(&p.alice)
    .id(sub_id.clone())
    .accept_sse();
    let mut stream = if listen_allowed {
        let mut stream = env.probe.open_stream(&listen).await;
        let ack = stream
            .next(Duration::from_secs(5))
            .await
            .unwrap_or(Value::Null);
        run.expect(
            stream.status == 200 && ack["params"]["notifications"]["taskIds"] == json!([alices]),
            || format!("alice's listen on her task: HTTP {} {ack}", stream.status),
        );
        Some(stream)
    } else {
        run.note("the policy does not allow `taskIds` listens: stream closing not observed");
        None
    };

    let upstream_mark = env.upstream_mark().await;
    let audit_mark = env.audit.as_ref().map(|a| a.mark());
    run.note(format!(
        "policy file edited: PrincipalRevocation {name} (accountDisabled, subject alice) \
         appended (hash {disabled_hash})"
    ));
    if let Err(e) = replace_file(&facts.path, &edited) {
        run.fail(format!("{e:#}"));
    } else {
        let in_force = match &env.admin {
            Some(_) => wait_for_policy(env, run, &disabled_hash, true).await,
            None => refused_within(env, &alices).await,
        };
        run.expect(in_force, || {
            format!(
                "the revocation was not in force within {} s",
                RELOAD_WAIT.as_secs()
            )
        });
        if in_force {
            while_disabled(env, run, &alices, &bobs, stream.as_mut(), upstream_mark).await;
        }
    }
    if let Some(stream) = stream {
        run.record(stream.finish());
    }
    if let Some(trail) = &env.audit
        && let Some(mark) = audit_mark
    {
        let applied = trail
            .wait_for(mark, Duration::from_secs(10), |l| {
                field(l, "event") == "revocation.applied"
            })
            .await;
        run.expect(
            applied
                .as_ref()
                .is_some_and(|l| l["detail"]["tasksCancelled"].as_u64().unwrap_or(0) >= 1),
            || format!("`revocation.applied` with tasksCancelled >= 1: {applied:?}"),
        );
        let denied = trail
            .wait_for(mark, Duration::from_secs(5), |l| {
                field(l, "event") == "auth.denied" && field(l, "reason") == "revoked"
            })
            .await;
        run.expect(denied.is_some(), || {
            "no `auth.denied` line with reason `revoked`".to_owned()
        });
    }

    // Restore, always, and see alice back in, her task cancelled.
    match replace_file(&facts.path, &facts.text) {
        Ok(()) => run.note("policy file restored (the revocation removed)"),
        Err(e) => run.fail(format!("RESTORING THE POLICY FILE FAILED: {e:#}")),
    }
    let restored = match &env.admin {
        Some(_) => wait_for_policy(env, run, &facts.hash, true).await,
        None => accepted_within(env, &alices).await,
    };
    run.expect(restored, || {
        format!(
            "the restored policy was not in force within {} s",
            RELOAD_WAIT.as_secs()
        )
    });
    let after = run
        .send(
            &env.probe,
            Call::task(
                "alice polls her task once the revocation is removed",
                "tasks/get",
                &alices,
            )
            .token(&p.alice),
        )
        .await;
    let message = after.result()["statusMessage"].as_str().unwrap_or_default();
    run.expect(
        after.status == 200 && after.task_status() == "cancelled" && message.contains("revoked"),
        || {
            format!(
                "alice's task should read cancelled, naming the revocation: HTTP {} {}",
                after.status,
                short(&after.raw)
            )
        },
    );
    env.cancel_and_wait(run, &p.bob, &bobs).await;
    run.summary(
        "the revocation applied within seconds: every alice token was refused, her stream \
         closed and her task cancelled at the server while bob's ran on; removing it let her \
         back in to a cancelled task",
    );
}

/// What must hold while alice's account is disabled.
async fn while_disabled(
    env: &Env,
    run: &mut Run,
    alices: &str,
    bobs: &str,
    stream: Option<&mut super::super::probe::Stream<'_>>,
    upstream_mark: Option<u64>,
) {
    let p = &env.people;
    let fresh = match env.minter.token_with(&ALICE, |_| {}) {
        Ok(token) => {
            env.probe
                .label(&token, "alice token minted after the revocation");
            token
        }
        Err(e) => {
            run.fail(format!("minting a fresh token: {e:#}"));
            return;
        }
    };
    let calls = [
        Call::task(
            "alice polls with the token that started it",
            "tasks/get",
            alices,
        )
        .token(&p.alice),
        Call::task("alice polls with a fresh token", "tasks/get", alices).token(&fresh),
        Call::task("alice cancels with a fresh token", "tasks/cancel", alices).token(&fresh),
        Call::tool(
            "alice starts new work with a fresh token",
            "slow_compute",
            json!({"seconds": 1, "label": format!("{}-disabled-new", env.nonce)}),
        )
        .token(&fresh),
    ];
    for call in calls {
        let label = call.label.clone();
        let answer = run.send(&env.probe, call).await;
        run.expect(is_refused(&answer), || {
            format!(
                "{label}: expected HTTP 401, got HTTP {} {}",
                answer.status,
                short(&answer.raw)
            )
        });
        if let Some(id) = answer.result()["taskId"].as_str() {
            env.cancel_and_wait(run, &p.alice, id).await;
        }
    }
    if let Some(stream) = stream {
        // The stream ends with the graceful closing result, within a bound.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut closing = None;
        while Instant::now() < deadline && !stream.ended() {
            match stream.next(Duration::from_secs(1)).await {
                Some(frame) if frame["result"]["resultType"] == "complete" => {
                    closing = Some(frame);
                }
                _ => {}
            }
        }
        run.expect(closing.is_some() && stream.ended(), || {
            format!(
                "alice's listen stream should close with the closing result: closed {}, result \
                 {closing:?}",
                stream.ended()
            )
        });
    }
    let bob = run
        .send(
            &env.probe,
            Call::task("bob polls his own task", "tasks/get", bobs).token(&p.bob),
        )
        .await;
    run.expect(bob.status == 200 && !is_terminal(bob.task_status()), || {
        format!(
            "bob's task should run on: HTTP {} {}",
            bob.status,
            short(&bob.raw)
        )
    });
    // The server is asked to cancel alice's task (seen in its own request log).
    if upstream_mark.is_some() {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut cancels = 0;
        while Instant::now() < deadline {
            cancels = env
                .upstream_since(upstream_mark, "tasks/cancel")
                .await
                .unwrap_or(0);
            if cancels > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        run.expect(cancels > 0, || {
            "the server received no tasks/cancel for alice's task".to_owned()
        });
    } else {
        run.note("without --upstream-debug the server's side was not inspected");
    }
}

/// Without the admin port: waits until alice's token is refused.
async fn refused_within(env: &Env, task: &str) -> bool {
    poll_alice(env, task, |a| a.status == 401).await
}

/// Without the admin port: waits until alice's token is accepted again.
async fn accepted_within(env: &Env, task: &str) -> bool {
    poll_alice(env, task, |a| a.status == 200).await
}

async fn poll_alice(env: &Env, task: &str, done: impl Fn(&Answer) -> bool) -> bool {
    let deadline = Instant::now() + RELOAD_WAIT;
    while Instant::now() < deadline {
        let call = Call::task("alice polls (waiting for the reload)", "tasks/get", task)
            .token(&env.people.alice);
        let (_, answer) = env.probe.send(&call).await;
        if done(&answer) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}
