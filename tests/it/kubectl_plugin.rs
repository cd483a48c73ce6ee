//! The binary as the kubectl plugin `kubectl-lifeguard` (a symlink with that name, as a user
//! installs it), against the API emulator through a kubeconfig: `status` over objects whose
//! status the test writes as the operator would, `revoke` creating exactly one
//! PrincipalRevocation however often it is run, `--wait` following the status to completion or
//! giving up with what is pending, `exception sign | verify`, and refusals of bad input. The
//! last test runs the real operator, whose light sidecars acknowledge the revocation.

use crate::support;

use kube::api::{Api, DeleteParams, Patch, PatchParams};
use lifeguard::api::{McpServerPolicy, PrincipalRevocation};
use serde_json::{Value, json};
use support::kube::KubeEmulator;
use support::kubectl_plugin::*;
use support::operator::{LightSidecar, Operator, TestPod};
use support::{eventually, repo};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_policies_exceptions_and_revocations_as_the_operator_reported_them() {
    let emulator = KubeEmulator::start().await;
    let client = emulator.client().await;
    emulator.apply_yaml(&policy("team-a", "reports")).await;
    emulator.apply_yaml(&policy("team-b", "billing")).await;
    emulator
        .apply_yaml(&exception("summaries", jiff::SignedDuration::from_hours(2)))
        .await;
    emulator
        .apply_yaml(&exception("old", jiff::SignedDuration::from_hours(-1)))
        .await;
    emulator
        .apply_yaml(&manual_revocation("alice-rev", "alice"))
        .await;
    emulator
        .apply_yaml(&manual_revocation("bob-rev", "bob"))
        .await;
    let ready = json!({"status": {
        "observedGeneration": 1, "matchedPods": 3, "sidecarsInSync": 3,
        "policyHash": "3f9a0c12de45aa77bb00",
        "conditions": [condition("Ready", true, "AllInSync", "3 of 3 sidecars run this policy")],
    }});
    Api::<McpServerPolicy>::namespaced(client.clone(), "team-a")
        .patch_status("reports", &PatchParams::default(), &Patch::Merge(ready))
        .await
        .unwrap();
    Api::<lifeguard::api::CapabilityException>::namespaced(client.clone(), "team-a")
        .patch_status(
            "summaries",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"state": "Active", "approver": "security-approver-1",
                "conditions": [condition("Ready", true, "Active", "")]}}),
            ),
        )
        .await
        .unwrap();
    patch_revocation_status(&emulator, "alice-rev", propagating(1, 3)).await;
    patch_revocation_status(&emulator, "bob-rev", propagated(2)).await;

    let plugin = Plugin::install();
    let kubeconfig = Some(emulator.kubeconfig_path());
    let run = plugin.run(kubeconfig, &["status", "-n", "team-a"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let out = &run.stdout;
    assert!(
        out.contains("McpServerPolicies in namespace team-a:"),
        "{out}"
    );
    row(
        out,
        &[
            "team-a",
            "reports",
            "True",
            "AllInSync",
            "3",
            "3/3",
            "3f9a0c12de45",
        ],
    )
    .unwrap_or_else(|| panic!("policy row:\n{out}"));
    assert!(
        !out.contains("billing"),
        "another namespace's policy:\n{out}"
    );
    let summaries = row(
        out,
        &["team-a", "summaries", "reports", "sampling", "Active"],
    )
    .unwrap_or_else(|| panic!("exception row:\n{out}"));
    assert!(summaries.contains("security-approver-1"), "{summaries}");
    assert!(
        summaries.contains("1h59m") || summaries.contains("2h"),
        "expires in about two hours: {summaries}"
    );
    assert!(
        !out.contains(" old "),
        "an expired exception is listed:\n{out}"
    );
    assert!(out.contains("(1 expired exception not shown)"), "{out}");
    row(
        out,
        &[
            "alice-rev",
            support::ISSUER,
            "alice",
            "sessionRevoked",
            "1/3",
        ],
    )
    .unwrap_or_else(|| panic!("revocation row:\n{out}"));
    assert!(
        !out.contains("bob-rev"),
        "a completed revocation is listed:\n{out}"
    );
    assert!(out.contains("(1 completed revocation not shown)"), "{out}");

    // Without -n: the context's namespace (`default`), which holds nothing.
    let run = plugin.run(kubeconfig, &["status"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout
            .contains("No McpServerPolicies in namespace default."),
        "{run:?}"
    );
    assert!(
        run.stdout.contains("alice-rev"),
        "revocations are cluster-wide: {run:?}"
    );

    // -A -o json: every namespace, every object, with flags.
    let run = plugin
        .run(kubeconfig, &["status", "-A", "-o", "json"])
        .await;
    assert_eq!(run.code, 0, "{run:?}");
    let report: Value = serde_json::from_str(&run.stdout).expect("JSON on stdout");
    assert_eq!(report["namespace"], Value::Null);
    let policies: Vec<(&str, &str)> = report["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["namespace"].as_str().unwrap(),
                p["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(policies, [("team-a", "reports"), ("team-b", "billing")]);
    assert_eq!(report["policies"][0]["sidecarsInSync"], 3);
    assert_eq!(report["policies"][1]["ready"], "Unknown");
    assert_eq!(report["exceptions"].as_array().unwrap().len(), 2);
    let complete: Vec<(&str, bool)> = report["revocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap(),
                r["complete"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(complete, [("alice-rev", false), ("bob-rev", true)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubeconfig_context_decides_the_cluster_and_namespace_like_kubectl() {
    let emulator = KubeEmulator::start().await;
    emulator.apply_yaml(&policy("team-a", "reports")).await;
    let plugin = Plugin::install();
    let kubeconfig = two_context_kubeconfig(&emulator, plugin.dir.path());

    // $KUBECONFIG's current context: unreachable, said so, non-zero.
    let run = plugin.run(Some(&kubeconfig), &["status"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr
            .contains("cannot reach the Kubernetes API server of context \"broken\""),
        "{run:?}"
    );
    // --context picks the emulator and its namespace.
    let run = plugin
        .run(Some(&kubeconfig), &["status", "--context", "emulator"])
        .await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout
            .contains("McpServerPolicies in namespace team-a:"),
        "{run:?}"
    );
    assert!(
        row(&run.stdout, &["team-a", "reports", "Unknown"]).is_some(),
        "{run:?}"
    );
    // --kubeconfig without $KUBECONFIG.
    let path = kubeconfig.to_str().unwrap();
    let run = plugin
        .run(
            None,
            &["status", "--kubeconfig", path, "--context", "emulator"],
        )
        .await;
    assert_eq!(run.code, 0, "{run:?}");
    // A context that does not exist, and no kubeconfig at all.
    let run = plugin
        .run(Some(&kubeconfig), &["status", "--context", "nope"])
        .await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("\"nope\""), "{run:?}");
    let run = plugin.run(None, &["status"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr
            .contains("pass --kubeconfig FILE or set $KUBECONFIG"),
        "{run:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_crds_status_and_revoke_say_what_to_install() {
    let plugin = Plugin::install();
    let (url, _emulator) = emulator_without_crds(plugin.dir.path()).await;
    let kubeconfig = plugin.dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"{url}\"}}}}]\n\
             users: [{{name: u, user: {{token: t}}}}]\n\
             contexts: [{{name: bare, context: {{cluster: c, user: u}}}}]\ncurrent-context: bare\n"
        ),
    )
    .unwrap();
    let run = plugin.run(Some(&kubeconfig), &["status"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr.contains("the Lifeguard CRDs are not installed"),
        "{run:?}"
    );
    assert!(
        run.stderr.contains("mcpserverpolicies.lifeguard.dev"),
        "{run:?}"
    );
    let run = plugin
        .run(
            Some(&kubeconfig),
            &[
                "revoke",
                "--issuer",
                "i",
                "--subject",
                "s",
                "--reason",
                "adminAction",
            ],
        )
        .await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr
            .contains("principalrevocations.lifeguard.dev not served"),
        "{run:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_creates_one_manual_revocation_however_often_it_is_run() {
    let emulator = KubeEmulator::start().await;
    let plugin = Plugin::install();
    let kubeconfig = Some(emulator.kubeconfig_path());
    let revoked_before = (jiff::Timestamp::now() - jiff::SignedDuration::from_mins(5))
        .round(jiff::Unit::Second)
        .unwrap()
        .to_string();
    let args = |reason: &'static str| -> Vec<String> {
        [
            "revoke",
            "--issuer",
            support::ISSUER,
            "--subject",
            "alice",
            "--tenant",
            "tenant-a",
            "--client",
            "console",
            "--reason",
            reason,
            "--revoked-before",
            &revoked_before,
            "--expires-in",
            "24h",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
    };
    let first_args = args("credentialCompromise");
    let first_args: Vec<&str> = first_args.iter().map(String::as_str).collect();
    let run = plugin.run(kubeconfig, &first_args).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains(" created"), "{run:?}");
    let name = revocation_name(&run.stdout);
    assert!(name.starts_with("manual-"), "{name}");
    let stored = revocations(&emulator).await;
    assert_eq!(stored.len(), 1);
    let object = serde_json::to_value(&stored[0]).unwrap();
    assert_eq!(object["metadata"]["name"], name.as_str());
    assert_eq!(
        object["metadata"]["labels"]["lifeguard.dev/source"],
        "manual"
    );
    let expires_at = (revoked_before.parse::<jiff::Timestamp>().unwrap()
        + jiff::SignedDuration::from_hours(24))
    .to_string();
    assert_eq!(
        object["spec"],
        json!({
            "issuer": support::ISSUER, "subject": "alice", "tenant": "tenant-a",
            "client": "console", "revokedBefore": revoked_before,
            "reason": "credentialCompromise", "source": {"kind": "manual"},
            "expiresAt": expires_at,
        })
    );

    // The same request again: found, reported, nothing added.
    let run = plugin.run(kubeconfig, &first_args).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout.contains(&format!("{name} already exists")),
        "{run:?}"
    );
    assert_eq!(revocations(&emulator).await.len(), 1);

    // The same principal and instant with another reason: refused, naming the difference.
    let other = args("adminAction");
    let other: Vec<&str> = other.iter().map(String::as_str).collect();
    let run = plugin.run(kubeconfig, &other).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr
            .contains("its reason is credentialCompromise (asked: adminAction)"),
        "{run:?}"
    );
    assert_eq!(revocations(&emulator).await.len(), 1);

    // Without --revoked-before: now, in whole seconds; -o json prints the object on stdout.
    let before = jiff::Timestamp::now().round(jiff::Unit::Second).unwrap()
        - jiff::SignedDuration::from_secs(1);
    let run = plugin
        .run(
            kubeconfig,
            &[
                "revoke",
                "--issuer",
                support::ISSUER,
                "--subject",
                "bob",
                "--reason",
                "accountDisabled",
                "-o",
                "json",
            ],
        )
        .await;
    let after = jiff::Timestamp::now();
    assert_eq!(run.code, 0, "{run:?}");
    let printed: Value = serde_json::from_str(&run.stdout).expect("the object as JSON");
    assert_eq!(printed["spec"]["subject"], "bob");
    assert!(run.stderr.contains(" created"), "{run:?}");
    let at: jiff::Timestamp = printed["spec"]["revokedBefore"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(before <= at && at <= after, "{before} <= {at} <= {after}");
    assert_eq!(revocations(&emulator).await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_wait_shows_propagation_until_the_status_says_propagated() {
    let emulator = KubeEmulator::start().await;
    let plugin = Plugin::install();
    let mut waiting = Waiting::start(
        &plugin,
        emulator.kubeconfig_path(),
        &[
            "revoke",
            "--issuer",
            support::ISSUER,
            "--subject",
            "alice",
            "--reason",
            "sessionRevoked",
            "--wait",
            "--timeout",
            "2m",
        ],
    );
    let created = waiting.line(" created").await;
    let name = revocation_name(&created);
    waiting.line("waiting for the Lifeguard operator").await;
    patch_revocation_status(&emulator, &name, propagating(1, 2)).await;
    waiting
        .line("propagating: 1 of 2 targeted sidecars applied it")
        .await;
    patch_revocation_status(&emulator, &name, propagated(2)).await;
    let done = waiting.line("propagated: ").await;
    assert_eq!(
        done,
        "propagated: 2 of 2 targeted sidecars applied it in 150 ms (2 tasks cancelled, 1 listen streams closed)"
    );
    let (code, stderr) = waiting.finish().await;
    assert_eq!(code, 0, "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_wait_gives_up_at_the_timeout_saying_what_is_pending() {
    let emulator = KubeEmulator::start().await;
    let plugin = Plugin::install();
    let kubeconfig = Some(emulator.kubeconfig_path());
    let revoked_before = (jiff::Timestamp::now() - jiff::SignedDuration::from_mins(1))
        .round(jiff::Unit::Second)
        .unwrap()
        .to_string();
    let args = [
        "revoke",
        "--issuer",
        support::ISSUER,
        "--subject",
        "alice",
        "--reason",
        "adminAction",
        "--revoked-before",
        &revoked_before,
        "--wait",
        "--timeout",
        "1s",
    ];
    // No operator: nothing ever reports.
    let run = plugin.run(kubeconfig, &args).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("timed out after 1s"), "{run:?}");
    assert!(run.stderr.contains("has not reported on it yet"), "{run:?}");

    // One of three sidecars applied it: the rerun finds the object and names what is pending.
    let name = revocation_name(&run.stdout);
    patch_revocation_status(&emulator, &name, propagating(1, 3)).await;
    let run = plugin.run(kubeconfig, &args).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stdout.contains("already exists"), "{run:?}");
    assert!(
        run.stderr
            .contains("1 of 3 targeted sidecars applied it; 2 still pending"),
        "{run:?}"
    );
    assert_eq!(revocations(&emulator).await.len(), 1);

    // Deleted while waiting: said so, non-zero.
    let mut waiting = Waiting::start(
        &plugin,
        emulator.kubeconfig_path(),
        &[
            "revoke",
            "--issuer",
            support::ISSUER,
            "--subject",
            "alice",
            "--reason",
            "adminAction",
            "--revoked-before",
            &revoked_before,
            "--wait",
        ],
    );
    waiting.line("propagating: 1 of 3").await;
    Api::<PrincipalRevocation>::all(emulator.client().await)
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    let (code, stderr) = waiting.finish().await;
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("was deleted"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_a_clear_error_and_creates_nothing() {
    let emulator = KubeEmulator::start().await;
    let plugin = Plugin::install();
    let kubeconfig = Some(emulator.kubeconfig_path());
    let revoke = |extra: &[&'static str]| {
        let mut args = vec!["revoke", "--issuer", support::ISSUER, "--subject", "alice"];
        args.extend_from_slice(extra);
        args
    };
    let cases: Vec<(Vec<&str>, &[&str])> = vec![
        (
            revoke(&["--reason", "fired"]),
            &[
                "invalid value 'fired' for '--reason <REASON>'",
                "sessionRevoked",
                "credentialChange",
                "accountDisabled",
                "accountPurged",
                "credentialCompromise",
                "adminAction",
            ],
        ),
        (
            vec![
                "revoke",
                "--issuer",
                support::ISSUER,
                "--reason",
                "adminAction",
            ],
            &["name at least one of --subject, --tenant and --client"],
        ),
        (
            vec![
                "revoke",
                "--issuer",
                " ",
                "--subject",
                "alice",
                "--reason",
                "adminAction",
            ],
            &["--issuer must not be empty"],
        ),
        (
            revoke(&[
                "--reason",
                "adminAction",
                "--revoked-before",
                "2999-01-01T00:00:00Z",
            ]),
            &["is in the future"],
        ),
        (
            revoke(&[
                "--reason",
                "adminAction",
                "--revoked-before",
                "last tuesday",
            ]),
            &["RFC 3339"],
        ),
        (
            revoke(&["--reason", "adminAction", "--timeout", "5s"]),
            &["--wait"],
        ),
        (
            revoke(&["--reason", "adminAction", "--wait", "--timeout", "soon"]),
            &["--timeout"],
        ),
        (
            vec!["status", "-n", "team-a", "-A"],
            &["cannot be used with"],
        ),
        (
            vec!["status", "-o", "yaml"],
            &["possible values: table, json"],
        ),
    ];
    for (args, expected) in cases {
        let run = plugin.run(kubeconfig, &args).await;
        assert_eq!(run.code, 2, "{args:?}: {run:?}");
        for text in expected {
            assert!(
                run.stderr.contains(text),
                "{args:?}: missing {text:?} in {run:?}"
            );
        }
    }
    assert!(revocations(&emulator).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_is_kubectl_lifeguard_and_lifeguard_has_the_same_commands() {
    let emulator = KubeEmulator::start().await;
    let plugin = Plugin::install();
    let run = plugin.run(None, &["--help"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout.contains("Usage: kubectl lifeguard <COMMAND>"),
        "{run:?}"
    );
    for command in ["status", "revoke", "exception"] {
        assert!(row(&run.stdout, &[command]).is_some(), "{command}: {run:?}");
    }
    // The plugin is not the server binary's whole command line.
    let run = plugin.run(None, &["operator", "--help"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    // `lifeguard status` under the binary's own name.
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_lifeguard"))
        .args(["status", "--kubeconfig"])
        .arg(emulator.kubeconfig_path())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert!(
        stdout.contains("No McpServerPolicies in namespace default."),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exception_sign_and_verify_work_under_the_plugin_name() {
    let plugin = Plugin::install();
    let text =
        std::fs::read_to_string(repo().join("examples/policies/valid/capabilityexception.yaml"))
            .unwrap();
    let now = jiff::Timestamp::now();
    let text = text
        .replace(
            "notBefore: \"2026-12-01T00:00:00Z\"",
            &format!(
                "notBefore: \"{}\"",
                now - jiff::SignedDuration::from_hours(1)
            ),
        )
        .replace(
            "expiresAt: \"2026-12-15T00:00:00Z\"",
            &format!(
                "expiresAt: \"{}\"",
                now + jiff::SignedDuration::from_hours(1)
            ),
        );
    let file = plugin.dir.path().join("exception.yaml");
    std::fs::write(&file, text).unwrap();
    let file = file.to_str().unwrap();
    let key = repo().join("examples/approvers/example-approver.pem");
    let keys = repo().join("examples/approvers/approvers.jwks.json");
    let run = plugin
        .run(
            None,
            &[
                "exception",
                "sign",
                "--key",
                key.to_str().unwrap(),
                "--kid",
                "security-approver-1",
                "--in-place",
                file,
            ],
        )
        .await;
    assert_eq!(run.code, 0, "{run:?}");
    let verify = [
        "exception",
        "verify",
        "--keys",
        keys.to_str().unwrap(),
        file,
    ];
    let run = plugin.run(None, &verify).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("ok    signature"), "{run:?}");
    assert!(run.stdout.contains("state: Active"), "{run:?}");
    // An edit after signing is caught.
    let edited = std::fs::read_to_string(file)
        .unwrap()
        .replace("maxTokens: 2000", "maxTokens: 200000");
    std::fs::write(file, edited).unwrap();
    let run = plugin.run(None, &verify).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stdout.contains("FAIL  signature"), "{run:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_the_real_operator_revoke_wait_completes_and_status_shows_the_sidecars_in_sync() {
    let emulator = KubeEmulator::start().await;
    let operator = Operator::start(&emulator, None).await;
    emulator.apply_yaml(&policy("team-a", "reports")).await;
    let mut pods = Vec::new();
    for i in 0..2 {
        let name = format!("reports-{i}");
        pods.push(
            TestPod::create(&emulator, "team-a", &name, &[("app", "reports")], "reports").await,
        );
    }
    let sidecars: Vec<LightSidecar> = pods
        .iter()
        .map(|p| LightSidecar::connect(&operator, p, ("team-a", &p.name), 1))
        .collect();
    for sidecar in &sidecars {
        eventually(WAIT, async || {
            sidecar.last().filter(|s| s["policy"].is_object())
        })
        .await
        .unwrap_or_else(|| panic!("no policy snapshot:\n{}", operator.logs()));
    }

    let plugin = Plugin::install();
    let kubeconfig = Some(emulator.kubeconfig_path());
    let run = plugin
        .run(
            kubeconfig,
            &[
                "revoke",
                "--issuer",
                support::ISSUER,
                "--subject",
                "alice",
                "--reason",
                "sessionRevoked",
                "--wait",
                "--timeout",
                "60s",
            ],
        )
        .await;
    assert_eq!(run.code, 0, "{run:?}\n{}", operator.logs());
    assert!(
        run.stdout
            .contains("propagated: 2 of 2 targeted sidecars applied it"),
        "{run:?}"
    );
    assert!(run.stdout.contains("(2 tasks cancelled"), "{run:?}");

    let shown = eventually(WAIT, async || {
        let run = plugin.run(kubeconfig, &["status", "-n", "team-a"]).await;
        (run.code == 0 && row(&run.stdout, &["team-a", "reports", "True", "2/2"]).is_some())
            .then_some(run)
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "status never showed the policy in sync:\n{}",
            operator.logs()
        )
    });
    assert!(
        shown.stdout.contains("(1 completed revocation not shown)"),
        "{shown:?}"
    );
}
