//! Who may touch a task: the policy version the decisions are made under, other principals,
//! tenants and clients, guessed IDs, and tokens that should not work at all.

use std::time::Duration;

use base64::Engine;
use lifeguard::model::TaskId;
use serde_json::{Value, json};

use super::super::audit::field;
use super::super::call::Call;
use super::super::probe::Answer;
use super::{CheckDef, Env, Run, is_task_not_found, short};

pub const POLICY_HASH: CheckDef = CheckDef {
    id: "policy-hash",
    title: "The sidecar enforces the policy file that was reviewed",
    proves: "the hash `lifeguard policy check --mode standalone --output json` computes for the \
             policy file equals the hash `/ready` reports as in force and the `policy_hash` \
             every audit line of a decision carries, so the evidence below was produced under \
             that exact policy version",
    does_not_cover: "that the file is the one a reviewer approved (compare it with your \
                     repository), or other sidecars of the same server",
};

pub const CROSS_PRINCIPAL: CheckDef = CheckDef {
    id: "cross-principal",
    title: "Another user, tenant or client gets exactly the answer for a task that never existed",
    proves: "tasks/get, tasks/cancel and tasks/update of alice's task by bob (same tenant), \
             carol (another tenant), the same subject `alice` in another tenant, and alice \
             through another OAuth client are all answered HTTP 400 `Task not found` \
             (-32602), byte for byte the body and header set of an ID that never existed, and \
             leave the task running",
    does_not_cover: "administrators (`tasks.adminCancelScope` may cancel within a tenant), \
                     other issuers than the one the probe signs for, timing side channels",
};

pub const GUESSED_IDS: CheckDef = CheckDef {
    id: "guessed-ids",
    title: "Guessed, sequential and malformed task IDs learn nothing",
    proves: "random IDs of the sidecar's own shape, the upstream's sequential style \
             (`task-1`…), a one-character change of a real ID and malformed strings (empty, \
             overlong, path and SQL fragments, non-ASCII) all get the one uniform denial, with \
             the same status, body and header names",
    does_not_cover: "response timing (the elapsed times are printed for the reader, not \
                     judged), IDs of other sidecars",
};

pub const TOKENS: CheckDef = CheckDef {
    id: "tokens",
    title: "Expired, foreign and forged tokens are refused on create and on poll",
    proves: "a missing token, an expired one, a wrong audience, an untrusted issuer, a token \
             not yet valid, one without a subject, a tampered signature and an unsigned \
             (`alg: none`) token each get HTTP 401 with `WWW-Authenticate: Bearer … \
             resource_metadata=…` on tools/call and on tasks/get of a real task; expiry says so, \
             every other failure gets one identical description; the task is untouched",
    does_not_cover: "revocation (covered by tests/it/sidecar_revocation.rs), JWKS rotation, \
                     insufficient scopes",
};

/// `policy-hash`.
pub async fn policy_hash(env: &Env, run: &mut Run) {
    // A file the sidecar reads compiles to the hash it enforces. A manifest applied to a
    // cluster does not: the operator's compile adds metadata.generation and the cluster's
    // revocations, so there `--expect-hash` (status.policyHash) is the witness.
    let check_hash = match &env.facts {
        Some(f) if f.live => Some(f.hash.clone()),
        Some(f) => {
            run.note(format!(
                "policy check of --expect-policy: {} (not compared: a cluster's compile adds \
                 metadata.generation and the cluster's revocations; use --expect-hash)",
                f.hash
            ));
            None
        }
        None => None,
    };
    let ready_hash = match &env.admin {
        Some(admin) => admin.policy_hash().await,
        None => None,
    };
    let mut audit_hash = None;
    if let Some(trail) = &env.audit
        && env.task_tools_allowed(run, &["slow_compute"])
    {
        let mark = trail.mark();
        let label = format!("{}-hash", env.nonce);
        let args = json!({"seconds": 30, "label": label});
        if let Some(id) = env
            .create_task(
                run,
                "alice creates a task (an audited decision)",
                &env.people.alice,
                "slow_compute",
                args,
            )
            .await
        {
            let created = trail
                .wait_for(mark, Duration::from_secs(5), |l| {
                    field(l, "event") == "task.created"
                })
                .await;
            run.expect(created.is_some(), || {
                "no task.created line reached the audit file within 5 s".to_owned()
            });
            audit_hash = created.map(|l| field(&l, "policy_hash").to_owned());
            for line in trail.since(mark).await {
                let hash = field(&line, "policy_hash");
                run.expect(!hash.is_empty(), || {
                    format!("an audit line without policy_hash: {line}")
                });
            }
            env.cancel_and_wait(run, &env.people.alice, &id).await;
        }
    }
    if run.is_skipped() {
        return;
    }
    if let Ok(mut slot) = env.audit_hash.lock() {
        slot.clone_from(&audit_hash);
    }
    let known: Vec<(&str, &String)> = [
        ("policy check", check_hash.as_ref()),
        ("--expect-hash", env.expect_hash.as_ref()),
        ("/ready", ready_hash.as_ref()),
        ("audit policy_hash", audit_hash.as_ref()),
    ]
    .into_iter()
    .filter_map(|(name, h)| h.map(|h| (name, h)))
    .collect();
    for (name, hash) in &known {
        run.note(format!("{name}: {hash}"));
    }
    if env.admin.is_some() && ready_hash.is_none() {
        run.fail("/ready names no policy hash");
    }
    if known.len() < 2 {
        run.skip(
            "fewer than two witnesses of the hash: give two of --policy, --admin, --audit-file",
        );
        return;
    }
    let first = known[0].1;
    run.expect(known.iter().all(|(_, h)| *h == first), || {
        let all: Vec<String> = known.iter().map(|(n, h)| format!("{n} {h}")).collect();
        format!("the policy hashes differ: {}", all.join(", "))
    });
    run.summary(format!(
        "{} witnesses agree on {first}",
        known.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
    ));
}

/// Whether `answer` is the uniform denial with the header names of `reference`.
fn same_denial(run: &mut Run, who: &str, answer: &Answer, reference: &Answer) {
    run.expect(is_task_not_found(answer), || {
        format!(
            "{who}: expected HTTP 400 {{\"code\":-32602,\"message\":\"Task not found\"}}, got HTTP {} {}",
            answer.status,
            short(&answer.raw)
        )
    });
    run.expect(answer.header_names() == reference.header_names(), || {
        format!(
            "{who}: header names {:?} differ from a never-existing ID's {:?}",
            answer.header_names(),
            reference.header_names()
        )
    });
}

/// `cross-principal`.
pub async fn cross_principal(env: &Env, run: &mut Run) {
    if !env.task_tools_allowed(run, &["slow_compute"]) {
        return;
    }
    let mark = env.audit.as_ref().map(|a| a.mark());
    let p = &env.people;
    let args = json!({"seconds": 60, "label": format!("{}-owned", env.nonce)});
    let Some(id) = env
        .create_task(run, "alice creates a task", &p.alice, "slow_compute", args)
        .await
    else {
        return;
    };
    let never = TaskId::generate()
        .map(|t| t.to_string())
        .unwrap_or_default();
    let reference = run
        .send(
            &env.probe,
            Call::task(
                "reference: alice polls an ID that never existed",
                "tasks/get",
                &never,
            )
            .token(&p.alice),
        )
        .await;
    run.expect(is_task_not_found(&reference), || {
        format!(
            "a never-existing ID: expected the documented HTTP 400 Task not found, got HTTP {} {}",
            reference.status,
            short(&reference.raw)
        )
    });
    let strangers = [
        ("bob (same tenant)", &p.bob),
        ("carol (another tenant)", &p.carol),
        ("alice in another tenant", &p.alice_other_tenant),
        ("alice through another client", &p.alice_other_client),
    ];
    for (who, token) in strangers {
        for method in ["tasks/get", "tasks/update", "tasks/cancel"] {
            let label = format!("{who}: {method} of alice's task");
            let answer = run
                .send(&env.probe, Call::task(&label, method, &id).token(token))
                .await;
            same_denial(run, &label, &answer, &reference);
        }
    }
    for method in ["tasks/update", "tasks/cancel"] {
        let label = format!("reference: alice {method} of an ID that never existed");
        let answer = run
            .send(
                &env.probe,
                Call::task(&label, method, &never).token(&p.alice),
            )
            .await;
        same_denial(run, &label, &answer, &reference);
    }
    let mine = run
        .send(
            &env.probe,
            Call::task("alice polls her task afterwards", "tasks/get", &id).token(&p.alice),
        )
        .await;
    run.expect(
        mine.status == 200 && !super::is_terminal(mine.task_status()),
        || {
            format!(
                "alice's task should still run after the strangers' cancels, got HTTP {} {}",
                mine.status,
                short(&mine.raw)
            )
        },
    );
    if let Some(lines) = super::audit_lines(env, mark, "task.denied").await {
        let reasons: Vec<&str> = lines.iter().map(|l| field(l, "reason")).collect();
        for reason in [
            "foreign_subject",
            "foreign_tenant",
            "foreign_client",
            "unknown",
        ] {
            run.expect(reasons.contains(&reason), || {
                format!("no task.denied line with reason {reason} in the audit trail ({reasons:?})")
            });
        }
    }
    env.cancel_and_wait(run, &p.alice, &id).await;
    run.summary(
        "12 foreign requests got the never-existing ID's answer; the task kept running; the audit \
         trail names the true reasons",
    );
}

/// `guessed-ids`.
pub async fn guessed_ids(env: &Env, run: &mut Run) {
    if !env.task_tools_allowed(run, &["slow_compute"]) {
        return;
    }
    let p = &env.people;
    let args = json!({"seconds": 60, "label": format!("{}-guess", env.nonce)});
    let Some(real) = env
        .create_task(run, "alice creates a task", &p.alice, "slow_compute", args)
        .await
    else {
        return;
    };
    let mut guesses: Vec<(String, String)> = Vec::new();
    for n in 0..8 {
        let id = TaskId::generate()
            .map(|t| t.to_string())
            .unwrap_or_default();
        guesses.push((format!("random ID #{}", n + 1), id));
    }
    for n in 1..=5 {
        guesses.push((
            format!("sequential upstream-style ID task-{n}"),
            format!("task-{n}"),
        ));
    }
    guesses.push(("a bare number".into(), "1".into()));
    let mut flipped = real.clone();
    let last = flipped.pop().unwrap_or('A');
    flipped.push(if last == 'A' { 'B' } else { 'A' });
    guesses.push((
        "alice's real ID with its last character changed".into(),
        flipped,
    ));
    guesses.push(("alice's real ID with a suffix".into(), format!("{real}x")));
    for (label, id) in [
        ("the empty string", String::new()),
        ("the bare prefix", "lgt_".to_owned()),
        ("the prefix and 32 A", format!("lgt_{}", "A".repeat(32))),
        ("an overlong ID", format!("lgt_{}", "A".repeat(400))),
        ("a path", "../../../etc/passwd".to_owned()),
        ("an SQL fragment", "' OR '1'='1".to_owned()),
        ("a percent-encoded NUL", "lgt_%00".to_owned()),
        ("non-ASCII", "lgt_tâche-ünïcode".to_owned()),
    ] {
        guesses.push((label.to_owned(), id));
    }
    let mark = env.audit.as_ref().map(|a| a.mark());
    let reference = run
        .send(
            &env.probe,
            Call::task("first random ID (reference)", "tasks/get", &guesses[0].1).token(&p.alice),
        )
        .await;
    let mut elapsed = Vec::new();
    for (n, (label, id)) in guesses.iter().enumerate() {
        let method = ["tasks/get", "tasks/cancel", "tasks/update"][n % 3];
        let label = format!("alice: {method} of {label}");
        let (exchange, answer) = env
            .probe
            .send(&Call::task(&label, method, id).token(&p.alice))
            .await;
        elapsed.push(exchange.elapsed_ms);
        run.record(exchange);
        same_denial(run, &label, &answer, &reference);
    }
    elapsed.sort_unstable();
    run.note(format!(
        "{} guesses; elapsed min {} ms, median {} ms, max {} ms (for the reader; not judged)",
        elapsed.len(),
        elapsed.first().unwrap_or(&0),
        elapsed.get(elapsed.len() / 2).unwrap_or(&0),
        elapsed.last().unwrap_or(&0)
    ));
    if let Some(lines) = super::audit_lines(env, mark, "task.denied").await {
        let unknown = lines
            .iter()
            .filter(|l| field(l, "reason") == "unknown")
            .count();
        run.expect(unknown >= guesses.len(), || {
            format!(
                "expected {} task.denied lines with reason unknown, found {unknown}",
                guesses.len()
            )
        });
    }
    let mine = run
        .send(
            &env.probe,
            Call::task("alice polls her real task", "tasks/get", &real).token(&p.alice),
        )
        .await;
    run.expect(mine.status == 200, || {
        format!("alice's own task: expected HTTP 200, got {}", mine.status)
    });
    env.cancel_and_wait(run, &p.alice, &real).await;
    run.summary(format!(
        "{} guessed and malformed IDs got one uniform denial",
        guesses.len()
    ));
}

/// A token of alice with `edit` applied to its claims, labelled.
fn alice_token(env: &Env, label: &str, edit: impl FnOnce(&mut Value)) -> String {
    let token = env
        .minter
        .token_with(&super::ALICE, edit)
        .unwrap_or_default();
    env.probe.label(&token, label);
    token
}

/// `tokens`.
pub async fn tokens(env: &Env, run: &mut Run) {
    if !env.task_tools_allowed(run, &["slow_compute"]) {
        return;
    }
    let p = &env.people;
    let args = json!({"seconds": 60, "label": format!("{}-tokens", env.nonce)});
    let Some(id) = env
        .create_task(run, "alice creates a task", &p.alice, "slow_compute", args)
        .await
    else {
        return;
    };
    let now = jiff::Timestamp::now().as_second();
    let tampered = {
        // The signature's first character: its last one may hold only padding bits, which a
        // lenient decoder ignores.
        let mut t = p.alice.clone();
        if let Some(dot) = t.rfind('.')
            && let Some(c) = t[dot + 1..].chars().next()
        {
            let flipped = if c == 'A' { "B" } else { "A" };
            t.replace_range(dot + 1..dot + 1 + c.len_utf8(), flipped);
        }
        env.probe.label(&t, "alice token with a tampered signature");
        t
    };
    let unsigned = {
        let b64 = |v: &Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string().as_bytes())
        };
        let claims = json!({"iss": env.minter.issuer, "aud": env.minter.audience, "sub": "alice",
                            "tid": "tenant-a", "client_id": "console", "iat": now, "exp": now + 3600});
        let t = format!(
            "{}.{}.",
            b64(&json!({"alg": "none", "typ": "JWT"})),
            b64(&claims)
        );
        env.probe.label(&t, "unsigned alg:none token");
        t
    };
    let expired = alice_token(env, "expired alice token", |c| {
        c["iat"] = json!(now - 7200);
        c["nbf"] = json!(now - 7200);
        c["exp"] = json!(now - 3600);
    });
    let invalid: Vec<(&str, String)> = vec![
        (
            "wrong audience",
            alice_token(env, "alice token for another audience", |c| {
                c["aud"] = json!("https://elsewhere.invalid/mcp");
            }),
        ),
        (
            "untrusted issuer",
            alice_token(env, "alice token of an untrusted issuer", |c| {
                c["iss"] = json!("https://evil.invalid");
            }),
        ),
        (
            "not yet valid",
            alice_token(env, "alice token valid only in an hour", |c| {
                c["nbf"] = json!(now + 3600);
            }),
        ),
        (
            "no subject",
            alice_token(env, "token without a subject", |c| {
                if let Some(o) = c.as_object_mut() {
                    o.remove("sub");
                }
            }),
        ),
        ("tampered signature", tampered),
        ("alg none", unsigned),
    ];
    let upstream = env.upstream_mark().await;
    let requests = |token: Option<&str>, what: &str| {
        let create = Call::tool(
            format!("{what}: tools/call"),
            "slow_compute",
            json!({"seconds": 60, "label": format!("{}-refused", env.nonce)}),
        );
        let poll = Call::task(
            format!("{what}: tasks/get of alice's task"),
            "tasks/get",
            &id,
        );
        match token {
            Some(t) => [create.token(t), poll.token(t)],
            None => [create, poll],
        }
    };
    // Missing: a challenge without an error code.
    for call in requests(None, "no token") {
        let answer = run.send(&env.probe, call.clone()).await;
        let challenge = answer
            .header("www-authenticate")
            .unwrap_or_default()
            .to_owned();
        run.expect(answer.status == 401, || {
            format!("{}: expected HTTP 401, got {}", call.label, answer.status)
        });
        run.expect(
            challenge.starts_with("Bearer ")
                && challenge.contains("resource_metadata=\"")
                && !challenge.contains("error="),
            || format!("{}: challenge {challenge:?}", call.label),
        );
    }
    // Expired: says so.
    for call in requests(Some(&expired), "expired token") {
        let answer = run.send(&env.probe, call.clone()).await;
        let challenge = answer
            .header("www-authenticate")
            .unwrap_or_default()
            .to_owned();
        run.expect(answer.status == 401, || {
            format!("{}: expected HTTP 401, got {}", call.label, answer.status)
        });
        run.expect(
            challenge.contains("error=\"invalid_token\"")
                && challenge.contains("error_description=\"The access token expired\"")
                && challenge.contains("resource_metadata=\""),
            || format!("{}: challenge {challenge:?}", call.label),
        );
    }
    // Everything else: one identical answer, so nothing is learnt about keys or issuers.
    let mut first: Option<(String, Value)> = None;
    for (what, token) in &invalid {
        for call in requests(Some(token), what) {
            let answer = run.send(&env.probe, call.clone()).await;
            let challenge = answer
                .header("www-authenticate")
                .unwrap_or_default()
                .to_owned();
            run.expect(answer.status == 401, || {
                format!("{}: expected HTTP 401, got {}", call.label, answer.status)
            });
            run.expect(
                challenge.contains("error=\"invalid_token\"")
                    && challenge.contains(
                        "error_description=\"The access token is not valid for this server\"",
                    )
                    && challenge.contains("resource_metadata=\""),
                || format!("{}: challenge {challenge:?}", call.label),
            );
            match &first {
                None => first = Some((challenge, answer.json.clone())),
                Some((c, body)) => {
                    run.expect(*c == challenge && *body == answer.json, || {
                        format!(
                            "{}: answer differs from the other invalid tokens'",
                            call.label
                        )
                    });
                }
            }
        }
    }
    match env.upstream_since(upstream, "tools/call").await {
        Some(reached) => {
            run.expect(reached == 0, || {
                format!("{reached} refused tools/call requests reached the server")
            });
        }
        None => run.note("without --upstream-debug the server's side was not inspected"),
    }
    let mine = run
        .send(
            &env.probe,
            Call::task("alice (valid token) polls her task", "tasks/get", &id).token(&p.alice),
        )
        .await;
    run.expect(
        mine.status == 200 && !super::is_terminal(mine.task_status()),
        || {
            format!(
                "alice's task afterwards: HTTP {} {}",
                mine.status,
                short(&mine.raw)
            )
        },
    );
    env.cancel_and_wait(run, &p.alice, &id).await;
    run.summary("8 kinds of bad token refused with the documented 401 on create and poll");
}
