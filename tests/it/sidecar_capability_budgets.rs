//! Capability exceptions, budgets half, black box: token budgets, allowed tools, iterations per
//! task and per multi round-trip exchange, requests per minute across concurrent tasks, and
//! expiry and revoked approvals taking effect without a restart.

use crate::support;

use jiff::Timestamp;
use serde_json::{Value, json};
use std::time::Duration;
use support::User;
use support::capability::*;

#[tokio::test]
async fn token_budget_and_unapproved_tools_are_refused_while_others_pass_concurrently() {
    let grant = Grant {
        max_tokens: 100,
        allowed_tools: &["lookup"],
        ..Grant::sampling("budgeted", "console")
    };
    let s = setup("{sampling: exception}", &[grant.signed()]).await;
    let token = User::new("alice", "tenant-a", "console").token();
    let variants = [
        (json!({"maxTokens": 100}), None),
        (json!({"maxTokens": 101}), Some("token_budget")),
        (json!({"maxTokens": 50, "tools": ["lookup"]}), None),
        (
            json!({"maxTokens": 50, "tools": ["lookup", "shell"]}),
            Some("tool_not_allowed"),
        ),
    ];
    let tasks = futures_util::future::join_all(
        variants
            .iter()
            .map(|(args, _)| summarize(&s.client, &token, args.clone())),
    )
    .await;
    let states =
        futures_util::future::join_all(tasks.iter().map(|t| next_state(&s.client, &token, t)))
            .await;
    for ((args, refusal), state) in variants.iter().zip(&states) {
        match refusal {
            None => assert_eq!(state["status"], "input_required", "{args}: {state}"),
            Some(reason) => assert_refused(state, reason),
        }
    }
    let mut reasons = rejections_when(&s.sidecar, 2).await;
    reasons.sort();
    assert_eq!(reasons, ["token_budget", "tool_not_allowed"]);
    let mut trails = refusal_trails(&s.sidecar, 2).await;
    trails.sort();
    assert_eq!(trails, ["token_budget", "tool_not_allowed"]);
    assert_eq!(
        upstream_statuses(&s.server).await,
        ["cancelled", "cancelled", "input_required", "input_required"]
    );
}

#[tokio::test]
async fn iterations_per_task_are_capped() {
    let grant = Grant {
        iterations: 2,
        ..Grant::sampling("two-rounds", "console")
    };
    let s = setup("{sampling: exception}", &[grant.signed()]).await;
    let token = User::new("alice", "tenant-a", "console").token();
    let task = summarize(&s.client, &token, json!({"rounds": 3})).await;
    for round in 1..=2 {
        let key = format!("sample-{round}");
        let state = support::eventually(Duration::from_secs(10), async || {
            let state = next_state(&s.client, &token, &task).await;
            state["inputRequests"].get(&key).is_some().then_some(state)
        })
        .await
        .unwrap_or_else(|| panic!("round {round} asked"));
        assert_eq!(state["status"], "input_required");
        answer(&s.client, &token, &task, &key, sample(&format!("r{round}"))).await;
    }
    // The third round is over the budget: never shown, and the task fails.
    let done = support::eventually(Duration::from_secs(10), async || {
        let state = next_state(&s.client, &token, &task).await;
        assert!(state["inputRequests"].get("sample-3").is_none(), "{state}");
        (state["status"] == "failed").then_some(state)
    })
    .await
    .expect("the task fails");
    assert_refused(&done, "iteration_budget");
    assert_eq!(rejections_when(&s.sidecar, 1).await, ["iteration_budget"]);
    assert_eq!(refusal_trails(&s.sidecar, 1).await, ["iteration_budget"]);
    let allowed = s
        .sidecar
        .audit_events_when(2, |e| e["event"] == "capability.allowed")
        .await;
    assert_eq!(allowed.len(), 2, "{allowed:?}");
    assert_eq!(allowed[1]["detail"]["budgetLeft"]["iterations"], 0);
    assert_eq!(upstream_statuses(&s.server).await, ["cancelled"]);
}

#[tokio::test]
async fn the_per_minute_rate_is_counted_atomically_across_concurrent_tasks() {
    let grant = Grant {
        per_minute: 3,
        ..Grant::sampling("rated", "console")
    };
    let s = setup("{sampling: exception}", &[grant.signed()]).await;
    // Eight principals, so no concurrency quota interferes: the rate is per exception.
    let tokens: Vec<String> = (0..8)
        .map(|i| User::new(&format!("user-{i}"), "tenant-a", "console").token())
        .collect();
    let tasks = futures_util::future::join_all(
        tokens
            .iter()
            .map(|t| summarize(&s.client, t, json!({"maxTokens": 10}))),
    )
    .await;
    let states = futures_util::future::join_all(
        tokens
            .iter()
            .zip(&tasks)
            .map(|(token, t)| next_state(&s.client, token, t)),
    )
    .await;
    let shown = states
        .iter()
        .filter(|s| s["status"] == "input_required")
        .count();
    assert_eq!(shown, 3, "{states:?}");
    let refused: Vec<&Value> = states.iter().filter(|s| s["status"] == "failed").collect();
    assert_eq!(refused.len(), 5, "{states:?}");
    for state in refused {
        assert_refused(state, "rate");
    }
    assert_eq!(rejections_when(&s.sidecar, 5).await, ["rate"; 5]);
    assert_eq!(refusal_trails(&s.sidecar, 5).await, ["rate"; 5]);
    let upstream = upstream_statuses(&s.server).await;
    assert_eq!(
        upstream,
        [vec!["cancelled"; 5], vec!["input_required"; 3]].concat()
    );
}

#[tokio::test]
async fn expiry_and_a_revoked_approval_take_effect_without_a_restart() {
    let grant = Grant {
        expires_at: at(3),
        ..Grant::sampling("short", "console")
    };
    let revocable = Grant {
        approval_id: "CHG-REVOKE-ME",
        ..Grant::sampling("revocable", "roots-app")
    };
    let s = setup(
        "{sampling: exception}",
        &[grant.signed(), revocable.signed()],
    )
    .await;
    let console = User::new("alice", "tenant-a", "console").token();
    let other = User::new("alice", "tenant-a", "roots-app").token();
    let before = summarize(&s.client, &console, json!({})).await;
    assert_eq!(
        next_state(&s.client, &console, &before).await["status"],
        "input_required"
    );
    let revocable_before = summarize(&s.client, &other, json!({})).await;
    assert_eq!(
        next_state(&s.client, &other, &revocable_before).await["status"],
        "input_required"
    );

    // Expiry: no reload happens, the clock alone ends the exception.
    let wait = grant.expires_at.duration_since(Timestamp::now());
    tokio::time::sleep(Duration::try_from(wait).unwrap_or_default() + Duration::from_millis(200))
        .await;
    let after = summarize(&s.client, &console, json!({})).await;
    assert_refused(
        &ends_without_asking(&s.client, &console, &after).await,
        "expired",
    );
    assert_eq!(rejections_when(&s.sidecar, 1).await, ["expired"]);
    // An allowance is re-verified at every use: the request allowed before the expiry is
    // refused at the next poll, for the same reason, and its task fails.
    assert_refused(
        &get(&s.client, &console, &before, true, true).await,
        "expired",
    );
    assert_eq!(rejections_when(&s.sidecar, 2).await, ["expired", "expired"]);

    // Revoking the approval in the trust file is picked up like a policy change: the reload
    // reports the exception out of force.
    let mut trust: Value =
        serde_json::from_str(&std::fs::read_to_string(&s.trust).unwrap()).unwrap();
    trust["revokedApprovals"] = json!(["CHG-REVOKE-ME"]);
    std::fs::write(&s.trust, trust.to_string()).unwrap();
    support::eventually(Duration::from_secs(10), async || {
        s.sidecar
            .logs()
            .lines()
            .any(|l| l.contains("tests/revocable") && l.contains("not in force"))
            .then_some(())
    })
    .await
    .expect("the revocation is loaded");
    let revoked = summarize(&s.client, &other, json!({})).await;
    assert_refused(
        &ends_without_asking(&s.client, &other, &revoked).await,
        "approval_revoked",
    );
    // …and the task allowed before the revocation is refused at its next poll.
    assert_refused(
        &get(&s.client, &other, &revocable_before, true, true).await,
        "approval_revoked",
    );
    assert_eq!(
        rejections_when(&s.sidecar, 4).await,
        ["expired", "expired", "approval_revoked", "approval_revoked"]
    );
    assert_eq!(
        refusal_trails(&s.sidecar, 4).await,
        ["expired", "expired", "approval_revoked", "approval_revoked"]
    );
}

#[tokio::test]
async fn iterations_bound_multi_round_trip_exchanges_across_retries() {
    // maxIterationsPerTask 2: outside tasks, every new call is a new request, so the budget is
    // counted per principal and tool (within a window), not per call.
    let grant = Grant {
        iterations: 2,
        ..Grant::sampling("exchanges", "console")
    };
    let s = setup("{sampling: exception}", &[grant.signed()]).await;
    let console = User::new("alice", "tenant-a", "console").token();
    let mut no_task = meta(true, false);
    no_task["io.modelcontextprotocol/clientCapabilities"] = json!({"sampling": {}});
    let call = || {
        s.client
            .request(
                "tools/call",
                json!({"name": "summarize_with_sampling",
                       "arguments": {"text": "numbers", "maxTokens": 100},
                       "_meta": no_task}),
            )
            .token(&console)
            .send()
    };
    for round in 1..=2 {
        let asked = call().await;
        assert_eq!(
            asked.result()["resultType"],
            "input_required",
            "round {round}: {asked:?}"
        );
    }
    let third = call().await;
    assert!(third.body.get("result").is_none(), "{third:?}");
    support::capability::assert_refusal_error(&third.body["error"], "iteration_budget");
}

#[tokio::test]
async fn a_cloned_exception_shares_the_budget_of_its_signed_grant() {
    // The same signed grant applied under a second name: the name is not signed, so the copy
    // verifies. Budgets are the grant's: two requests per minute in all, not two per object.
    // (One policy file carrying both is refused outright, like `lifeguard policy check` does;
    // the copy replaces the original here, as a re-apply under a new name would.)
    let original = Grant {
        per_minute: 2,
        ..Grant::sampling("original", "console")
    };
    let s = setup("{sampling: exception}", &[original.signed()]).await;
    let ask = async |i: usize| {
        let token = User::new(&format!("cloner-{i}"), "tenant-a", "console").token();
        let task = summarize(&s.client, &token, json!({"maxTokens": 10})).await;
        next_state(&s.client, &token, &task).await
    };
    for i in 0..2 {
        assert_eq!(ask(i).await["status"], "input_required");
    }
    let policy = std::fs::read_to_string(s.sidecar.policy_file()).unwrap();
    assert!(policy.contains("name: original"), "{policy}");
    std::fs::write(
        s.sidecar.policy_file(),
        policy.replace("name: original", "name: clone"),
    )
    .unwrap();
    support::eventually(Duration::from_secs(10), async || {
        s.sidecar
            .logs()
            .lines()
            .any(|l| l.contains("tests/clone") && l.contains("capability exception active"))
            .then_some(())
    })
    .await
    .expect("the copy is loaded");
    for i in 2..4 {
        assert_refused(&ask(i).await, "rate");
    }
    assert_eq!(rejections_when(&s.sidecar, 2).await, ["rate"; 2]);
}

#[tokio::test]
async fn the_cost_budget_is_spent_by_the_max_tokens_of_allowed_requests() {
    // maxCostUnits 250: a sampling request costs the maxTokens it asks for, reserved when it
    // is allowed. 100 + 100 fit, a third 100 does not; a smaller request still fits.
    let grant = Grant::sampling("costed", "console");
    let signed = grant.signed_edited(|yaml| {
        yaml.replace(
            "maxRequestsPerMinute: 100}",
            "maxRequestsPerMinute: 100, maxCostUnits: 250}",
        )
    });
    assert!(signed.contains("maxCostUnits: 250"), "{signed}");
    let s = setup("{sampling: exception}", &[signed]).await;
    let mut outcomes = Vec::new();
    for (i, max_tokens) in [100, 100, 100, 50].into_iter().enumerate() {
        let token = User::new(&format!("spender-{i}"), "tenant-a", "console").token();
        let task = summarize(&s.client, &token, json!({"maxTokens": max_tokens})).await;
        outcomes.push(next_state(&s.client, &token, &task).await);
    }
    let statuses: Vec<&str> = outcomes
        .iter()
        .map(|o| o["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses,
        [
            "input_required",
            "input_required",
            "failed",
            "input_required"
        ],
        "{outcomes:?}"
    );
    assert_refused(&outcomes[2], "cost_budget");
    assert_eq!(rejections_when(&s.sidecar, 1).await, ["cost_budget"]);
    let allowed = s
        .sidecar
        .audit_events_when(3, |e| e["event"] == "capability.allowed")
        .await;
    let left: Vec<&Value> = allowed
        .iter()
        .map(|e| &e["detail"]["budgetLeft"]["costUnits"])
        .collect();
    assert_eq!(left, [&json!(150), &json!(50), &json!(0)], "{allowed:?}");
}
