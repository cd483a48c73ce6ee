//! JSON-RPC and header tricks: notifications, id types, batches, duplicate keys, headers that
//! disagree with the body, missing `_meta`. Each gets its documented answer (docs/sidecar.md,
//! "What happens to a request", steps 4 and 5), and none reveals or touches another owner's
//! task.

use serde_json::{Value, json};

use super::super::call::Call;
use super::super::call::request_meta;
use super::super::probe::Answer;
use super::{CheckDef, Env, Run, short};

pub const ENVELOPE: CheckDef = CheckDef {
    id: "envelope",
    title: "Notification, id-type, batch, duplicate-key and header tricks get the documented answer",
    proves: "tasks/get sent as a notification (no id) is 400 -32600, while \
             notifications/cancelled passes; string and number ids are echoed exactly, null, \
             object, array and boolean ids are 400 -32600; batches are 400 -32600; a duplicate \
             key anywhere is 400 -32600; Mcp-Method or Mcp-Name disagreeing with the body is \
             400 -32020; missing `_meta` keys are 400 -32602, a version mismatch -32020, an \
             old version -32022; tasks/list and tasks/result are 404 -32601. No trick aimed at \
             bob's task returns it, and bob's task is still running afterwards",
    does_not_cover: "what the protected server does with a notifications/cancelled it \
                     receives (forwarded as is, the server must scope it), HTTP-level \
                     smuggling below the JSON layer",
};

/// Expects an HTTP status and JSON-RPC error code; returns whether both matched.
fn expect_error(run: &mut Run, label: &str, answer: &Answer, status: u16, code: i64) -> bool {
    run.expect(
        answer.status == status && answer.error_code() == Some(code),
        || {
            format!(
                "{label}: expected HTTP {status} with error {code}, got HTTP {} {}",
                answer.status,
                short(&answer.raw)
            )
        },
    )
}

/// Expects that nothing of bob's task came back.
fn expect_no_task(run: &mut Run, label: &str, answer: &Answer, bobs: &str) {
    run.expect(
        answer.json.get("result").is_none() && !answer.raw.contains("\"status\""),
        || format!("{label}: an answer carried a task: {}", short(&answer.raw)),
    );
    // The ID itself may be echoed in an error's data only if the caller sent it; the sidecar
    // echoes nothing, so its presence would be news worth a look.
    if answer.raw.contains(bobs) {
        run.note(format!(
            "{label}: the answer repeats the task ID the caller sent"
        ));
    }
}

/// `envelope`.
pub async fn envelope(env: &Env, run: &mut Run) {
    if !env.task_tools_allowed(run, &["slow_compute"]) {
        return;
    }
    let p = &env.people;
    let args = |who: &str| json!({"seconds": 60, "label": format!("{}-env-{who}", env.nonce)});
    let Some(mine) = env
        .create_task(
            run,
            "alice creates a task",
            &p.alice,
            "slow_compute",
            args("a"),
        )
        .await
    else {
        return;
    };
    let Some(bobs) = env
        .create_task(run, "bob creates a task", &p.bob, "slow_compute", args("b"))
        .await
    else {
        env.cancel_and_wait(run, &p.alice, &mine).await;
        return;
    };
    let alice = p.alice.as_str();
    let get = |label: &str, id: &str| Call::task(label, "tasks/get", id).token(alice);
    let upstream = env.upstream_mark().await;

    // Notifications: only notifications/cancelled may come without an id.
    for (label, id) in [
        ("alice: tasks/get of her task as a notification", &mine),
        ("alice: tasks/get of bob's task as a notification", &bobs),
    ] {
        let answer = run.send(&env.probe, get(label, id).notification()).await;
        expect_error(run, label, &answer, 400, -32600);
        expect_no_task(run, label, &answer, &bobs);
    }
    let cancel_note = Call::new(
        "alice: tasks/cancel of bob's task as a notification",
        "tasks/cancel",
        json!({"taskId": bobs}),
    )
    .token(alice)
    .notification();
    let answer = run.send(&env.probe, cancel_note).await;
    expect_error(run, "tasks/cancel as a notification", &answer, 400, -32600);
    let allowed = Call::new(
        "alice: notifications/cancelled (the one client notification)",
        "notifications/cancelled",
        json!({"requestId": 99, "reason": "evidence"}),
    )
    .token(alice)
    .notification();
    let answer = run.send(&env.probe, allowed).await;
    run.expect((200..300).contains(&answer.status), || {
        format!(
            "notifications/cancelled: expected it to pass (2xx), got HTTP {} {}",
            answer.status,
            short(&answer.raw)
        )
    });

    // Ids: strings and numbers are echoed exactly; anything else is an invalid request.
    for id in [
        json!("evidence-id"),
        json!(7),
        json!(-3),
        json!(7.5),
        json!(""),
    ] {
        let label = format!("alice: tasks/get of her task with id {id}");
        let answer = run
            .send(&env.probe, get(&label, &mine).id(id.clone()))
            .await;
        run.expect(answer.status == 200 && answer.json["id"] == id, || {
            format!(
                "{label}: expected HTTP 200 echoing id {id}, got HTTP {} {}",
                answer.status,
                short(&answer.raw)
            )
        });
        let label = format!("alice: tasks/get of bob's task with id {id}");
        let answer = run
            .send(&env.probe, get(&label, &bobs).id(id.clone()))
            .await;
        run.expect(
            super::is_task_not_found(&answer) && answer.json["id"] == id,
            || {
                format!(
                    "{label}: expected Task not found echoing the id, got {}",
                    short(&answer.raw)
                )
            },
        );
    }
    for id in [
        json!(null),
        json!({}),
        json!({"id": 1}),
        json!([1]),
        json!(true),
    ] {
        let label = format!("alice: tasks/get of bob's task with id {id}");
        let answer = run.send(&env.probe, get(&label, &bobs).id(id)).await;
        expect_error(run, &label, &answer, 400, -32600);
        expect_no_task(run, &label, &answer, &bobs);
    }
    // Numbers beyond 64 bits: whatever the parser makes of them, bob's task stays hidden.
    let base = get("", &bobs).message();
    for digits in ["123456789012345678901234567890", "1e400", "-0"] {
        let label = format!("alice: tasks/get of bob's task with id {digits}");
        let body = base
            .to_string()
            .replacen("\"id\":1", &format!("\"id\":{digits}"), 1);
        let answer = run
            .send(&env.probe, get(&label, &bobs).raw_body(body))
            .await;
        run.expect(answer.status >= 400, || {
            format!("{label}: expected a refusal, got HTTP {}", answer.status)
        });
        expect_no_task(run, &label, &answer, &bobs);
        // JSON-RPC wants the id back as sent; the docs promise nothing for numbers no 64-bit
        // parser holds, so a changed spelling is reported, not judged.
        let echoed = answer.json["id"].to_string();
        if echoed != digits {
            run.note(format!("id {digits} came back as {echoed}"));
        }
    }

    // Batches are not part of 2026-07-28.
    let one = get("", &bobs).message();
    let two = get("", &mine).message();
    for (label, body) in [
        ("a batch of bob's tasks/get", json!([one])),
        ("a batch of bob's and alice's tasks/get", json!([one, two])),
        ("an empty batch", json!([])),
    ] {
        let label = format!("alice: {label}");
        let answer = run
            .send(&env.probe, get(&label, &bobs).raw_body(body.to_string()))
            .await;
        expect_error(run, &label, &answer, 400, -32600);
        expect_no_task(run, &label, &answer, &bobs);
    }

    // Duplicate keys: the sidecar and the server could read different values.
    let meta = request_meta(true);
    for (label, body, header_id) in [
        (
            "taskId twice (bob's, then alice's)",
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{{"taskId":"{bobs}","taskId":"{mine}","_meta":{meta}}}}}"#
            ),
            &mine,
        ),
        (
            "taskId twice (alice's, then bob's)",
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{{"taskId":"{mine}","taskId":"{bobs}","_meta":{meta}}}}}"#
            ),
            &mine,
        ),
        (
            "method twice (tasks/cancel, then tasks/get)",
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tasks/cancel","params":{{"taskId":"{bobs}","_meta":{meta}}},"method":"tasks/get"}}"#
            ),
            &bobs,
        ),
    ] {
        let label = format!("alice: {label}");
        let answer = run
            .send(&env.probe, get(&label, header_id).raw_body(body))
            .await;
        expect_error(run, &label, &answer, 400, -32600);
        expect_no_task(run, &label, &answer, &bobs);
    }

    // Mirrored headers that disagree with the body.
    let mismatches = [
        (
            "Mcp-Method tasks/get over a tasks/cancel body (bob's task)",
            Call::task("", "tasks/cancel", &bobs)
                .token(alice)
                .header("mcp-method", "tasks/get"),
        ),
        (
            "Mcp-Name alice's task over a body naming bob's",
            get("", &bobs).header("mcp-name", &mine),
        ),
        (
            "Mcp-Name bob's task over a body naming alice's",
            get("", &mine).header("mcp-name", &bobs),
        ),
        (
            "no Mcp-Method header",
            get("", &mine).without_header("mcp-method"),
        ),
        (
            "no MCP-Protocol-Version header",
            get("", &mine).without_header("mcp-protocol-version"),
        ),
    ];
    for (label, call) in mismatches {
        let label = format!("alice: {label}");
        let mut call = call;
        call.label.clone_from(&label);
        let answer = run.send(&env.probe, call).await;
        expect_error(run, &label, &answer, 400, -32020);
        expect_no_task(run, &label, &answer, &bobs);
    }
    let old = get("alice: MCP-Protocol-Version 2025-11-25", &mine)
        .header("mcp-protocol-version", "2025-11-25");
    let answer = run.send(&env.probe, old).await;
    expect_error(run, "an old protocol version", &answer, 400, -32022);

    // _meta: both keys, in this request, every time.
    let with_meta = |meta: Option<Value>| {
        let mut params = json!({"taskId": mine});
        if let Some(meta) = meta {
            params["_meta"] = meta;
        }
        Call::new("", "tasks/get", params)
            .token(alice)
            .without_meta()
    };
    let tasks_caps = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    let cases = [
        ("no _meta at all", None, -32602),
        (
            "_meta without clientCapabilities",
            Some(json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28"})),
            -32602,
        ),
        (
            "_meta without protocolVersion",
            Some(json!({"io.modelcontextprotocol/clientCapabilities": tasks_caps})),
            -32602,
        ),
        (
            "_meta naming another version than the header",
            Some(
                json!({"io.modelcontextprotocol/protocolVersion": "2025-11-25",
                        "io.modelcontextprotocol/clientCapabilities": tasks_caps}),
            ),
            -32020,
        ),
    ];
    for (label, meta, code) in cases {
        let label = format!("alice: tasks/get of her task, {label}");
        let mut call = with_meta(meta);
        call.label.clone_from(&label);
        let answer = run.send(&env.probe, call).await;
        expect_error(run, &label, &answer, 400, code);
    }
    let undeclared = get(
        "alice: tasks/get without declaring the Tasks extension",
        &mine,
    )
    .without_tasks();
    let answer = run.send(&env.probe, undeclared).await;
    expect_error(
        run,
        "tasks/get without the Tasks extension",
        &answer,
        400,
        -32021,
    );
    for removed in ["tasks/list", "tasks/result"] {
        let label = format!("alice: {removed} (removed in 2026-07-28)");
        let answer = run
            .send(
                &env.probe,
                Call::new(&label, removed, json!({})).token(alice),
            )
            .await;
        expect_error(run, &label, &answer, 404, -32601);
    }

    // No trick got a cancel through to the server.
    match env.upstream_since(upstream, "tasks/cancel").await {
        Some(reached) => {
            run.expect(reached == 0, || {
                format!("{reached} tasks/cancel requests reached the server")
            });
        }
        None => run.note("without --upstream-debug the server's side was not inspected"),
    }
    // Bob's task went through all of that untouched.
    let after = run
        .send(
            &env.probe,
            Call::task("bob polls his task afterwards", "tasks/get", &bobs).token(&p.bob),
        )
        .await;
    run.expect(
        after.status == 200 && !super::is_terminal(after.task_status()),
        || {
            format!(
                "bob's task afterwards: HTTP {} {}",
                after.status,
                short(&after.raw)
            )
        },
    );
    env.cancel_and_wait(run, &p.alice, &mine).await;
    env.cancel_and_wait(run, &p.bob, &bobs).await;
    run.summary("every envelope and header trick got its documented answer; bob's task stayed hidden and running");
}
