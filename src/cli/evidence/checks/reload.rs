//! A policy change while work runs: the tool is taken out of `tasks.tools` in the policy file
//! the sidecar reloads, then the file is broken on purpose, then restored.

use std::time::{Duration, Instant};

use serde_json::json;

use super::super::audit::field;
use super::super::call::Call;
use super::super::policy::{compile, replace_file, without_task_tool};
use super::{CheckDef, Env, Run, is_task_not_found, is_terminal, short};

/// Named `disable-mid-run` before 2026-12: it never disabled a user, it withdraws a tool from
/// `tasks.tools` (the user disabled mid-run is `user-disabled-mid-run`).
pub const TOOL_REMOVED_MID_RUN: CheckDef = CheckDef {
    id: "tool-removed-mid-run",
    title: "Taking a tool out of tasks.tools while its task runs",
    proves: "with slow_compute removed from `tasks.tools` in the reloaded file, the new policy \
             is in force within seconds (its hash on /ready and in the audit lines); a new call \
             of the tool no longer becomes a task (it runs synchronously); the task already \
             running stays its owner's: she can poll and cancel it, others still get `Task not \
             found`; a broken file is refused and the last good policy stays; restoring the \
             file brings tasks back",
    does_not_cover: "cluster mode, where policy arrives from the operator (tests/\
                     sidecar_control_plane.rs); removing the whole `tasks` section",
};

/// How long a reload may take before the check gives up (docs: about half a second).
pub(super) const RELOAD_WAIT: Duration = Duration::from_secs(10);

/// `tool-removed-mid-run`.
pub async fn tool_removed_mid_run(env: &Env, run: &mut Run) {
    let Some(facts) = &env.facts else {
        run.skip("needs --policy (the policy file the sidecar reloads)");
        return;
    };
    if !facts.live {
        run.skip("needs --policy: --expect-policy is read only");
        return;
    }
    if !env.task_tools_allowed(run, &["slow_compute"]) {
        return;
    }
    let Some(edited) = without_task_tool(&facts.text, "slow_compute") else {
        run.skip("the policy file has no flow-style `tools: [...]` list under `tasks` to edit");
        return;
    };
    let disabled_hash = match compile(&facts.path, &edited) {
        Ok(policy) => policy.hash(),
        Err(e) => {
            run.fail(format!("the edited policy does not compile: {e:#}"));
            return;
        }
    };
    let alice = env.people.alice.as_str();
    let Some(running) = env
        .create_task(
            run,
            "alice starts slow_compute (120 s)",
            alice,
            "slow_compute",
            json!({"seconds": 120, "label": format!("{}-reload", env.nonce)}),
        )
        .await
    else {
        return;
    };

    run.note(format!(
        "policy file edited: tools without slow_compute (hash {disabled_hash})"
    ));
    if let Err(e) = replace_file(&facts.path, &edited) {
        run.fail(format!("{e:#}"));
        env.cancel_and_wait(run, alice, &running).await;
        return;
    }
    let reloaded = wait_for_policy(env, run, &disabled_hash, false).await;
    run.expect(reloaded, || {
        format!(
            "the edited policy was not in force within {} s",
            RELOAD_WAIT.as_secs()
        )
    });
    let mark = env.audit.as_ref().map(|a| a.mark());
    if reloaded {
        under_the_edited_policy(env, run, &running).await;
    }
    if let Some(lines) = super::audit_lines_since(env, mark).await {
        for line in &lines {
            run.expect(field(line, "policy_hash") == disabled_hash, || {
                format!("an audit line after the reload names another policy: {line}")
            });
        }
    }

    // A broken file changes nothing.
    let broken = "apiVersion: lifeguard.dev/v1alpha1\nkind: McpServerPolicy\nspec: {{{{\n";
    if replace_file(&facts.path, broken).is_ok() {
        run.note("policy file replaced by a broken one");
        tokio::time::sleep(Duration::from_millis(1500)).await;
        if let Some(admin) = &env.admin {
            let hash = admin.policy_hash().await;
            run.expect(hash.as_deref() == Some(disabled_hash.as_str()), || {
                format!("after a broken file /ready reports {hash:?}, not the last good policy")
            });
        }
        let answer = run
            .send(
                &env.probe,
                Call::task(
                    "alice polls her task under the broken file",
                    "tasks/get",
                    &running,
                )
                .token(alice),
            )
            .await;
        run.expect(answer.status == 200, || {
            format!(
                "the last good policy stays in force: got HTTP {}",
                answer.status
            )
        });
    }

    // Restore, always, and see tasks come back.
    match replace_file(&facts.path, &facts.text) {
        Ok(()) => run.note("policy file restored"),
        Err(e) => run.fail(format!("RESTORING THE POLICY FILE FAILED: {e:#}")),
    }
    let restored = wait_for_policy(env, run, &facts.hash, true).await;
    run.expect(restored, || {
        format!(
            "the restored policy was not in force within {} s",
            RELOAD_WAIT.as_secs()
        )
    });
    let again = run
        .send(
            &env.probe,
            Call::tool(
                "alice calls slow_compute after the restore",
                "slow_compute",
                json!({"seconds": 30, "label": format!("{}-restored", env.nonce)}),
            )
            .token(alice),
        )
        .await;
    run.expect(again.result()["resultType"] == "task", || {
        format!(
            "after the restore the call should become a task again: {}",
            short(&again.raw)
        )
    });
    if let Some(id) = again.result()["taskId"].as_str() {
        env.cancel_and_wait(run, alice, id).await;
    }
    run.summary(
        "the edit applied within seconds, new calls ran synchronously, the running task stayed \
         its owner's and cancellable, a broken file was ignored, the restore brought tasks back",
    );
}

/// What must hold while the edited policy is in force.
async fn under_the_edited_policy(env: &Env, run: &mut Run, running: &str) {
    let alice = env.people.alice.as_str();
    let label = format!("{}-sync", env.nonce);
    let call = Call::tool(
        "alice calls slow_compute again (no longer a task tool)",
        "slow_compute",
        json!({"seconds": 0.05, "label": label}),
    )
    .token(alice);
    let sync = run.send(&env.probe, call).await;
    run.expect(
        sync.status == 200
            && sync.result()["resultType"] == "complete"
            && sync.result()["content"][0]["text"] == format!("computed {label}").as_str(),
        || {
            format!(
                "expected the call to run synchronously (resultType complete), got HTTP {} {}",
                sync.status,
                short(&sync.raw)
            )
        },
    );
    if let Some(id) = sync.result()["taskId"].as_str() {
        env.cancel_and_wait(run, alice, id).await;
    }
    let polled = run
        .send(
            &env.probe,
            Call::task("alice polls her running task", "tasks/get", running).token(alice),
        )
        .await;
    run.expect(
        polled.status == 200 && !is_terminal(polled.task_status()),
        || {
            format!(
                "alice's running task: HTTP {} {}",
                polled.status,
                short(&polled.raw)
            )
        },
    );
    let bob = run
        .send(
            &env.probe,
            Call::task("bob polls alice's running task", "tasks/get", running)
                .token(&env.people.bob),
        )
        .await;
    run.expect(is_task_not_found(&bob), || {
        format!(
            "bob: expected Task not found, got HTTP {} {}",
            bob.status,
            short(&bob.raw)
        )
    });
    let cancel = run
        .send(
            &env.probe,
            Call::task("alice cancels her running task", "tasks/cancel", running).token(alice),
        )
        .await;
    run.expect(cancel.status == 200, || {
        format!(
            "alice's cancel: HTTP {} {}",
            cancel.status,
            short(&cancel.raw)
        )
    });
    let ended = env
        .poll_until(
            run,
            "alice polls until the cancel is confirmed",
            alice,
            running,
            Duration::from_secs(30),
            |a| is_terminal(a.task_status()),
        )
        .await;
    run.expect(ended.task_status() == "cancelled", || {
        format!("alice's task should end cancelled: {}", short(&ended.raw))
    });
}

/// Waits until the policy with `hash` is in force: by `/ready` when the admin port is known,
/// else by behaviour (a slow_compute call becomes a task exactly when `tasks_on`).
pub(super) async fn wait_for_policy(env: &Env, run: &mut Run, hash: &str, tasks_on: bool) -> bool {
    let deadline = Instant::now() + RELOAD_WAIT;
    while Instant::now() < deadline {
        let seen = match &env.admin {
            Some(admin) => admin.policy_hash().await.as_deref() == Some(hash),
            None => {
                let call = Call::tool(
                    "alice probes whether the reload applied",
                    "slow_compute",
                    json!({"seconds": 0.01, "label": format!("{}-probe", env.nonce)}),
                )
                .token(&env.people.alice);
                let (_, answer) = env.probe.send(&call).await;
                let is_task = answer.result()["resultType"] == "task";
                if let Some(id) = answer.result()["taskId"].as_str() {
                    env.cancel_and_wait(run, &env.people.alice, id).await;
                }
                is_task == tasks_on
            }
        };
        if seen {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}
