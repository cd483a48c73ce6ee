//! `subscriptions/listen`: a stream carries only what its listener owns and the policy allows.

use std::time::{Duration, Instant};

use lifeguard::model::TaskId;
use lifeguard::policy::PatternIdentity;
use serde_json::{Value, json};

use super::super::call::Call;
use super::{ALICE, CheckDef, Env, Run, short};

pub const LISTEN: CheckDef = CheckDef {
    id: "listen",
    title: "Listen streams carry only the listener's own events, and bad filters are refused",
    proves: "alice subscribing to her task, bob's task and a forged ID is acknowledged for her \
             task only, and every task event on her stream is about her task, status only; bob \
             subscribing to alice's task gets an empty acknowledgement and the closing result; \
             notification types and resource URIs the policy does not allow are dropped from \
             the acknowledgement (and their events never arrive); `taskIds` without the Tasks \
             extension is 400 -32021, unknown filter keys and dot-segment URIs 400 -32602; \
             streams beyond `listen.maxStreamsPerPrincipal` get HTTP 429 -31429 `streams`",
    does_not_cover: "stream closing on revocation, token expiry and policy withdrawal \
                     (tests/it/sidecar_listen.rs), slow consumers",
};

const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

fn listen_call(label: &str, token: &str, id: Value, notifications: Value) -> Call {
    Call::new(
        label,
        "subscriptions/listen",
        json!({"notifications": notifications}),
    )
    .token(token)
    .id(id)
    .accept_sse()
}

/// `listen`.
pub async fn listen(env: &Env, run: &mut Run) {
    if env.facts.is_some() && env.listen_rules().is_none() {
        run.skip("the policy has no `listen` section");
        return;
    }
    if !env.task_tools_allowed(run, &["write_rows"]) {
        return;
    }
    let p = &env.people;
    let args = |who: &str| json!({"count": 6, "intervalMs": 200, "label": format!("{}-listen-{who}", env.nonce)});
    let Some(mine) = env
        .create_task(
            run,
            "alice starts write_rows",
            &p.alice,
            "write_rows",
            args("a"),
        )
        .await
    else {
        return;
    };
    let Some(bobs) = env
        .create_task(
            run,
            "bob starts write_rows",
            &p.bob,
            "write_rows",
            args("b"),
        )
        .await
    else {
        return;
    };
    let forged = TaskId::generate()
        .map(|t| t.to_string())
        .unwrap_or_default();
    let own_uri = "example://tenant-a/evidence";
    let foreign_uri = "example://tenant-b/evidence";
    let asked = json!({
        "taskIds": [mine, bobs, forged],
        "toolsListChanged": true,
        "promptsListChanged": true,
        "resourceSubscriptions": [own_uri, foreign_uri],
    });
    let sub_id = json!(format!("{}-listen", env.nonce));
    let call = listen_call(
        "alice listens to her task, bob's, a forged one, and more",
        &p.alice,
        sub_id.clone(),
        asked,
    );
    let mut stream = env.probe.open_stream(&call).await;
    run.expect(stream.status == 200, || {
        format!("alice's listen: expected HTTP 200, got {}", stream.status)
    });
    let ack = stream
        .next(Duration::from_secs(5))
        .await
        .unwrap_or(Value::Null);
    run.expect(
        ack["method"] == "notifications/subscriptions/acknowledged"
            && ack["params"]["_meta"][SUBSCRIPTION_ID] == sub_id,
        || format!("the first frame must be the acknowledgement with the subscription id: {ack}"),
    );
    let acked = &ack["params"]["notifications"];
    run.expect(acked["taskIds"] == json!([mine]), || {
        format!(
            "only alice's task may be acknowledged, got taskIds {}",
            acked["taskIds"]
        )
    });
    let mut expect_resource_events = false;
    if let Some(rules) = env.listen_rules() {
        use lifeguard::api::ListenNotification as N;
        let who = PatternIdentity {
            subject: ALICE.subject,
            tenant: ALICE.tenant,
            client: ALICE.client,
        };
        let allowed: Vec<&str> = [own_uri, foreign_uri]
            .into_iter()
            .filter(|u| rules.allows_resource(u, &who))
            .collect();
        expect_resource_events = allowed.contains(&own_uri);
        let got = acked["resourceSubscriptions"].clone();
        let want = if allowed.is_empty() {
            Value::Null
        } else {
            json!(allowed)
        };
        run.expect(got == want, || {
            format!("resource subscriptions acknowledged {got}, the policy allows {want}")
        });
        for (flag, kind) in [
            ("toolsListChanged", N::ToolsListChanged),
            ("promptsListChanged", N::PromptsListChanged),
        ] {
            let allowed = rules.notifications.contains(&kind);
            run.expect((acked[flag] == true) == allowed, || {
                format!(
                    "{flag} acknowledged {} but the policy allows it: {allowed}",
                    acked[flag]
                )
            });
        }
    } else {
        run.note("without the policy only the task IDs of the acknowledgement were judged");
    }
    let emitted = emit_events(env, run, own_uri, foreign_uri).await;
    // Read until alice's task is reported completed (and the allowed update arrived).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut frames = Vec::new();
    let mut done = false;
    let mut own_update = false;
    let waiting_for_update = emitted && expect_resource_events;
    while Instant::now() < deadline && !stream.ended() {
        if done && (own_update || !waiting_for_update) {
            break;
        }
        let Some(frame) = stream.next(Duration::from_secs(1)).await else {
            continue;
        };
        if frame["method"] == "notifications/tasks" && frame["params"]["status"] == "completed" {
            done = true;
        }
        if frame["params"]["uri"] == own_uri {
            own_update = true;
        }
        frames.push(frame);
    }
    run.record(stream.finish());
    let task_frames: Vec<&Value> = frames
        .iter()
        .filter(|f| f["method"] == "notifications/tasks")
        .collect();
    run.expect(!task_frames.is_empty(), || {
        "no notifications/tasks frame about alice's task arrived".to_owned()
    });
    for frame in &task_frames {
        run.expect(frame["params"]["taskId"] == mine.as_str(), || {
            format!(
                "a task event not about alice's task: {}",
                short(&frame.to_string())
            )
        });
        run.expect(
            frame["params"].get("result").is_none() && frame["params"].get("error").is_none(),
            || {
                format!(
                    "a task event carried a result or an error: {}",
                    short(&frame.to_string())
                )
            },
        );
    }
    for frame in &frames {
        run.expect(frame["params"]["uri"] != foreign_uri, || {
            format!("an event about a resource the policy denies: {frame}")
        });
        run.expect(
            frame["method"] != "notifications/prompts/list_changed"
                || acked["promptsListChanged"] == true,
            || "a prompts list_changed event that was not acknowledged".to_owned(),
        );
        if frame.get("method").is_some() {
            run.expect(frame["params"]["_meta"][SUBSCRIPTION_ID] == sub_id, || {
                format!(
                    "a frame without the subscription id: {}",
                    short(&frame.to_string())
                )
            });
        }
    }
    if emitted && expect_resource_events {
        run.expect(own_update, || {
            "the allowed resource update never arrived".to_owned()
        });
    }
    run.note(format!("{} frames after the acknowledgement", frames.len()));

    // Bob asks only for alice's task: nothing is left, so the stream ends at once.
    let bob_id = json!("bob-listen");
    let call = listen_call(
        "bob listens to alice's task",
        &p.bob,
        bob_id.clone(),
        json!({"taskIds": [mine]}),
    );
    let mut stream = env.probe.open_stream(&call).await;
    let bob_frames = stream.drain(Duration::from_secs(3)).await;
    run.record(stream.finish());
    let empty_ack = bob_frames.first().is_some_and(|f| {
        f["method"] == "notifications/subscriptions/acknowledged"
            && f["params"]["notifications"].get("taskIds").is_none()
    });
    let closed = bob_frames
        .last()
        .is_some_and(|f| f["id"] == bob_id && f["result"]["resultType"] == "complete");
    run.expect(empty_ack && closed && bob_frames.len() == 2, || {
        format!("bob: expected an empty acknowledgement and the closing result, got {bob_frames:?}")
    });

    refusals(env, run).await;
    stream_quota(env, run).await;
    for (token, id) in [(&p.alice, &mine), (&p.bob, &bobs)] {
        env.cancel_and_wait(run, token, id).await;
    }
    run.summary("alice heard only her own task; bob got nothing; bad filters were refused");
}

/// Makes the example server emit a prompts list change and updates of an allowed and a denied
/// resource; `false` without `--upstream-debug`.
async fn emit_events(env: &Env, run: &mut Run, own: &str, foreign: &str) -> bool {
    let Some(url) = env.debug_url("/_example/emit") else {
        run.note("without --upstream-debug no resource or list events were emitted");
        return false;
    };
    for event in [
        json!({"kind": "promptsListChanged"}),
        json!({"kind": "resourceUpdated", "uri": foreign}),
        json!({"kind": "resourceUpdated", "uri": own}),
    ] {
        match env.probe.post_json(url.clone(), &event).await {
            Ok(200) => run.note(format!("the example server emitted {event}")),
            Ok(status) => run.fail(format!("POST /_example/emit {event}: HTTP {status}")),
            Err(e) => run.fail(format!("{e:#}")),
        }
    }
    true
}

async fn refusals(env: &Env, run: &mut Run) {
    let alice = env.people.alice.as_str();
    let cases = [
        (
            "alice asks for taskIds without declaring the Tasks extension",
            json!({"taskIds": ["lgt_x"]}),
            false,
            -32021,
        ),
        (
            "alice asks with an unknown filter key",
            json!({"everything": true}),
            true,
            -32602,
        ),
        (
            "alice asks for a resource URI with a dot segment",
            json!({"resourceSubscriptions": ["example://tenant-a/../tenant-b/evidence"]}),
            true,
            -32602,
        ),
        (
            "alice asks for a percent-encoded dot segment",
            json!({"resourceSubscriptions": ["example://tenant-a/%2e%2e/tenant-b/evidence"]}),
            true,
            -32602,
        ),
        (
            "alice sends taskIds that are not a list",
            json!({"taskIds": "lgt_x"}),
            true,
            -32602,
        ),
    ];
    for (label, filter, tasks, code) in cases {
        let mut call = listen_call(label, alice, json!(label), filter);
        if !tasks {
            call = call.without_tasks();
        }
        let mut stream = env.probe.open_stream(&call).await;
        let status = stream.status;
        let body = stream.body().await;
        run.record(stream.finish());
        run.expect(status == 400 && body["error"]["code"] == code, || {
            format!("{label}: expected HTTP 400 with {code}, got HTTP {status} {body}")
        });
    }
}

/// Opens streams up to the policy's cap, then one more (as carol, whose streams no other
/// step holds).
async fn stream_quota(env: &Env, run: &mut Run) {
    let Some(rules) = env.listen_rules() else {
        run.note("without the policy the stream cap was not probed");
        return;
    };
    let cap = rules.max_streams_per_principal as usize;
    if cap > 16 {
        run.note(format!(
            "maxStreamsPerPrincipal is {cap}: the cap was not probed"
        ));
        return;
    }
    if !rules
        .notifications
        .contains(&lifeguard::api::ListenNotification::ToolsListChanged)
    {
        run.note("the policy does not allow toolsListChanged: the stream cap was not probed");
        return;
    }
    let carol = env.people.carol.as_str();
    let filter = json!({"toolsListChanged": true});
    let mut open = Vec::new();
    for n in 1..=cap {
        let call = listen_call(
            &format!("carol opens stream {n} of {cap}"),
            carol,
            json!(n),
            filter.clone(),
        );
        let mut stream = env.probe.open_stream(&call).await;
        let ack = stream.next(Duration::from_secs(5)).await;
        run.expect(stream.status == 200 && ack.is_some(), || {
            format!(
                "carol's stream {n}: HTTP {} without an acknowledgement",
                stream.status
            )
        });
        open.push(stream);
    }
    let call = listen_call("carol opens one stream too many", carol, json!(0), filter);
    let mut over = env.probe.open_stream(&call).await;
    let status = over.status;
    let body = over.body().await;
    run.record(over.finish());
    run.expect(
        status == 429
            && body["error"]["code"] == -31429
            && body["error"]["data"]["scope"] == "streams",
        || {
            format!(
                "stream {}: expected HTTP 429 -31429 scope streams, got HTTP {status} {body}",
                cap + 1
            )
        },
    );
    for stream in open {
        run.record(stream.finish());
    }
}
