//! The owner's token expires while her task runs: the task is hers by identity, not by token.

use std::time::{Duration, Instant};

use lifeguard::identity::jwt::LEEWAY_SECS;
use serde_json::json;

use super::super::audit::field;
use super::super::call::Call;
use super::super::probe::Answer;
use super::{ALICE, CheckDef, Env, Run, is_task_not_found, is_terminal, short};

pub const TOKEN_EXPIRES_MID_TASK: CheckDef = CheckDef {
    id: "token-expires-mid-task",
    title: "The owner's token expires while her task runs",
    proves: "a task started with an alice token that expires seconds later keeps running: once \
             the token is past its `exp` (plus the sidecar's clock-skew leeway) tasks/get and \
             tasks/cancel with it get HTTP 401 \"The access token expired\" and change nothing; \
             a freshly minted token of the same alice polls the same task (still running) and \
             cancels it: a task belongs to its owner's identity (issuer, subject, tenant, \
             client), not to the token that created it; bob's fresh token still gets `Task not \
             found`; `lifeguard_denials_total{reason=\"expired\"}` counts the refusals (the audit \
             trail's `auth.denied`/`expired` line is rate-limited per minute)",
    does_not_cover: "`tasks.identityLease` (a task whose owner stops coming back is cancelled) \
                     and `upstream.identity: delegation` (assertions end with the token): \
                     tests/it/sidecar_delegation.rs; listen streams closing at expiry \
                     (tests/it/sidecar_listen.rs)",
};

/// The counter of refusals of expired tokens on the admin port.
const EXPIRED_DENIALS: &str = r#"lifeguard_denials_total{reason="expired"}"#;

/// How long after creation the short token's validity (with the leeway) ends.
const LIFETIME_LEFT: i64 = 4;

/// How long the check waits for the sidecar to start refusing the token, past its end.
const REFUSAL_WAIT: Duration = Duration::from_secs(20);

fn is_expired_refusal(answer: &Answer) -> bool {
    answer.status == 401
        && answer
            .header("www-authenticate")
            .is_some_and(|c| c.contains("The access token expired"))
}

/// `token-expires-mid-task`.
pub async fn token_expires_mid_task(env: &Env, run: &mut Run) {
    if !env.task_tools_allowed(run, &["slow_compute"]) {
        return;
    }
    // Issued a minute ago, valid for a little more than the leeway: the sidecar accepts it for
    // another few seconds, then refuses it as expired.
    let now = jiff::Timestamp::now().as_second();
    let expires = now - LEEWAY_SECS as i64 + LIFETIME_LEFT;
    let short_lived = match env.minter.token_with(&ALICE, |c| {
        c["iat"] = json!(now - 60);
        c["nbf"] = json!(now - 60);
        c["exp"] = json!(expires);
    }) {
        Ok(token) => token,
        Err(e) => {
            run.fail(format!("minting the short-lived token: {e:#}"));
            return;
        }
    };
    env.probe
        .label(&short_lived, "alice token expiring in seconds");
    run.note(format!(
        "the short-lived token: iat now-60 s, exp now{:+} s; with the sidecar's {LEEWAY_SECS} s \
         leeway it is accepted until about {LIFETIME_LEFT} s from now",
        expires - now
    ));
    let Some(task) = env
        .create_task(
            run,
            "alice starts slow_compute (120 s) with a token about to expire",
            &short_lived,
            "slow_compute",
            json!({"seconds": 120, "label": format!("{}-expiry", env.nonce)}),
        )
        .await
    else {
        return;
    };
    let mark = env.audit.as_ref().map(|a| a.mark());
    let denied_before = match &env.admin {
        Some(admin) => admin.series(EXPIRED_DENIALS).await,
        None => None,
    };

    // Poll with the same token until the sidecar refuses it (bounded).
    let deadline = Instant::now() + Duration::from_secs(LIFETIME_LEFT as u64) + REFUSAL_WAIT;
    let mut polls = 0;
    let refused = loop {
        polls += 1;
        let call = Call::task("alice polls with her expiring token", "tasks/get", &task)
            .token(&short_lived);
        let (exchange, answer) = env.probe.send(&call).await;
        if answer.status != 200 || Instant::now() >= deadline {
            run.record(exchange);
            break answer;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    run.note(format!(
        "{polls} polls with the expiring token until it was refused (the last one shown)"
    ));
    run.expect(polls > 1, || {
        "the token was refused on the first poll: it should have been valid for a few seconds"
            .to_owned()
    });
    run.expect(is_expired_refusal(&refused), || {
        format!(
            "the expired token: expected HTTP 401 with \"The access token expired\", got HTTP {} \
             {:?} {}",
            refused.status,
            refused.header("www-authenticate"),
            short(&refused.raw)
        )
    });
    let cancel = run
        .send(
            &env.probe,
            Call::task(
                "alice cancels with her expired token",
                "tasks/cancel",
                &task,
            )
            .token(&short_lived),
        )
        .await;
    run.expect(is_expired_refusal(&cancel), || {
        format!(
            "tasks/cancel with the expired token: expected HTTP 401, got HTTP {} {}",
            cancel.status,
            short(&cancel.raw)
        )
    });

    // The task is hers, not the token's.
    let fresh = &env.people.alice;
    let polled = run
        .send(
            &env.probe,
            Call::task("alice polls with a fresh token", "tasks/get", &task).token(fresh),
        )
        .await;
    run.expect(
        polled.status == 200 && !is_terminal(polled.task_status()),
        || {
            format!(
                "with a fresh token alice should see her task still running: HTTP {} {}",
                polled.status,
                short(&polled.raw)
            )
        },
    );
    let bob = run
        .send(
            &env.probe,
            Call::task("bob polls alice's task", "tasks/get", &task).token(&env.people.bob),
        )
        .await;
    run.expect(is_task_not_found(&bob), || {
        format!(
            "bob: expected Task not found, got HTTP {} {}",
            bob.status,
            short(&bob.raw)
        )
    });
    let cancelled = run
        .send(
            &env.probe,
            Call::task("alice cancels with a fresh token", "tasks/cancel", &task).token(fresh),
        )
        .await;
    run.expect(cancelled.status == 200, || {
        format!(
            "alice's cancel with a fresh token: HTTP {} {}",
            cancelled.status,
            short(&cancelled.raw)
        )
    });
    let ended = env
        .poll_until(
            run,
            "alice polls until the cancel is confirmed",
            fresh,
            &task,
            Duration::from_secs(30),
            |a| is_terminal(a.task_status()),
        )
        .await;
    run.expect(ended.task_status() == "cancelled", || {
        format!("alice's task should end cancelled: {}", short(&ended.raw))
    });

    // Refusals anyone can cause are audited once per kind a minute (the rest are summarized,
    // docs/sidecar.md "Audit trail"), so the `tokens` check may have used this minute's line;
    // the exact count is the metric.
    if let Some(lines) = super::audit_lines(env, mark, "auth.denied").await {
        let audited = lines.iter().any(|l| field(l, "reason") == "expired");
        run.note(if audited {
            "the audit trail has an `auth.denied` line with reason `expired`"
        } else {
            "no new `auth.denied`/`expired` line: an earlier one this minute covers the kind \
             (refusals anyone can cause are rate-limited in the trail)"
        });
    }
    if let (Some(admin), Some(before)) = (&env.admin, denied_before) {
        let after = admin.series(EXPIRED_DENIALS).await.unwrap_or(before);
        run.expect(after >= before + 2.0, || {
            format!(
                "{EXPIRED_DENIALS} should count the expired poll and cancel: {before} → {after}"
            )
        });
    }
    run.summary(
        "the expired token was refused (401, \"The access token expired\") while the task ran \
         on; a fresh token of the same owner polled and cancelled it; bob still got Task not \
         found",
    );
}
