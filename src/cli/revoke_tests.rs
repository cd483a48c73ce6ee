use super::*;
use clap::{Parser, ValueEnum};
use serde_json::json;

#[derive(Debug, Parser)]
struct Wrap {
    #[command(flatten)]
    args: RevokeArgs,
}

fn parse(extra: &[&str]) -> Result<RevokeArgs, clap::Error> {
    let mut argv = vec![
        "revoke",
        "--issuer",
        "https://idp.example.com",
        "--subject",
        "alice",
    ];
    argv.extend_from_slice(extra);
    Wrap::try_parse_from(argv).map(|w| w.args)
}

fn at(text: &str) -> Timestamp {
    text.parse().unwrap()
}

const NOW: &str = "2026-12-01T10:00:00.750Z";

fn request(extra: &[&str]) -> RevocationRequest {
    RevocationRequest::from_args(&parse(extra).unwrap(), at(NOW)).unwrap()
}

fn problem(extra: &[&str]) -> String {
    RevocationRequest::from_args(&parse(extra).unwrap(), at(NOW))
        .unwrap_err()
        .to_string()
}

#[test]
fn every_reason_the_crd_accepts_is_a_choice_and_nothing_else() {
    let schema = serde_json::to_value(schemars::schema_for!(RevocationReason)).unwrap();
    let mut crd: Vec<String> = schema["oneOf"]
        .as_array()
        .map(|variants| {
            variants
                .iter()
                .filter_map(|v| v["const"].as_str().or(v["enum"][0].as_str()))
                .map(str::to_owned)
                .collect()
        })
        .or_else(|| {
            schema["enum"]
                .as_array()
                .map(|e| e.iter().map(|v| v.as_str().unwrap().to_owned()).collect())
        })
        .expect("the reason schema lists its values");
    let mut choices: Vec<String> = ReasonArg::value_variants()
        .iter()
        .map(|v| v.to_possible_value().unwrap().get_name().to_owned())
        .collect();
    crd.sort();
    choices.sort();
    assert_eq!(choices, crd);
    for choice in ReasonArg::value_variants() {
        let name = choice.to_possible_value().unwrap().get_name().to_owned();
        assert_eq!(reason_name(RevocationReason::from(*choice)), name);
    }
}

#[test]
fn an_unknown_reason_is_refused_with_the_list_of_reasons() {
    let error = parse(&["--reason", "fired"]).unwrap_err().to_string();
    for reason in [
        "sessionRevoked",
        "credentialChange",
        "accountDisabled",
        "accountPurged",
        "credentialCompromise",
        "adminAction",
    ] {
        assert!(error.contains(reason), "{error}");
    }
}

#[test]
fn timeout_without_wait_is_refused() {
    let error = parse(&["--reason", "adminAction", "--timeout", "5s"])
        .unwrap_err()
        .to_string();
    assert!(error.contains("--wait"), "{error}");
    assert!(parse(&["--reason", "adminAction", "--wait", "--timeout", "5s"]).is_ok());
}

#[test]
fn revoked_before_defaults_to_the_current_whole_second() {
    let r = request(&["--reason", "sessionRevoked"]);
    assert_eq!(r.revoked_before, at("2026-12-01T10:00:00Z"));
    assert_eq!(r.expires_at, None);
    assert_eq!(r.reason, RevocationReason::SessionRevoked);
}

#[test]
fn expires_in_counts_from_revoked_before() {
    let r = request(&[
        "--reason",
        "sessionRevoked",
        "--revoked-before",
        "2026-12-01T09:00:00Z",
        "--expires-in",
        "24h",
    ]);
    assert_eq!(r.expires_at, Some(at("2026-12-02T09:00:00Z")));
}

#[test]
fn bad_input_gets_one_clear_line_per_problem() {
    let all = problem(&[
        "--reason",
        "adminAction",
        "--tenant",
        "",
        "--client",
        " console",
        "--revoked-before",
        "yesterday",
    ]);
    assert!(all.contains("--tenant must not be empty"), "{all}");
    assert!(
        all.contains("--client \" console\" has leading or trailing whitespace"),
        "{all}"
    );
    assert!(
        all.contains("--revoked-before \"yesterday\" is not an RFC 3339 time"),
        "{all}"
    );

    let empty = RevocationRequest::from_args(
        &Wrap::try_parse_from([
            "revoke",
            "--issuer",
            "",
            "--subject",
            "   ",
            "--reason",
            "adminAction",
        ])
        .unwrap()
        .args,
        at(NOW),
    )
    .unwrap_err()
    .to_string();
    assert!(empty.contains("--issuer must not be empty"), "{empty}");
    assert!(empty.contains("--subject must not be empty"), "{empty}");

    let long_subject = "s".repeat(1025);
    let long = RevocationRequest::from_args(
        &Wrap::try_parse_from([
            "revoke",
            "--issuer",
            "i",
            "--subject",
            &long_subject,
            "--reason",
            "adminAction",
        ])
        .unwrap()
        .args,
        at(NOW),
    )
    .unwrap_err()
    .to_string();
    assert!(
        long.contains("--subject is longer than 1024 characters"),
        "{long}"
    );

    let future = problem(&[
        "--reason",
        "adminAction",
        "--revoked-before",
        "2026-12-01T10:00:01Z",
    ]);
    assert!(future.contains("is in the future"), "{future}");
    let fraction = problem(&[
        "--reason",
        "adminAction",
        "--revoked-before",
        "2026-12-01T09:00:00.5Z",
    ]);
    assert!(fraction.contains("fraction of a second"), "{fraction}");
    let expired = problem(&[
        "--reason",
        "adminAction",
        "--revoked-before",
        "2026-11-01T00:00:00Z",
        "--expires-in",
        "1h",
    ]);
    assert!(expired.contains("would already have expired"), "{expired}");
}

#[test]
fn the_name_is_a_hash_of_the_principal_and_the_instant() {
    let base = request(&["--reason", "sessionRevoked"]);
    let name = base.name();
    assert!(
        name.starts_with("manual-") && name.len() == "manual-".len() + 20,
        "{name}"
    );
    // Reason and expiry do not change it (a retry with another reason is found and refused).
    assert_eq!(request(&["--reason", "accountDisabled"]).name(), name);
    // The same instant written with another offset is the same revocation.
    assert_eq!(
        request(&[
            "--reason",
            "sessionRevoked",
            "--revoked-before",
            "2026-12-01T11:00:00+01:00"
        ])
        .name(),
        name
    );
    let mut others = vec![
        request(&[
            "--reason",
            "sessionRevoked",
            "--revoked-before",
            "2026-12-01T09:59:59Z",
        ])
        .name(),
        request(&["--reason", "sessionRevoked", "--tenant", "t1"]).name(),
        request(&["--reason", "sessionRevoked", "--client", "t1"]).name(),
        RevocationRequest {
            subject: Some("bob".into()),
            ..base.clone()
        }
        .name(),
        RevocationRequest {
            issuer: "https://other.example.com".into(),
            ..base.clone()
        }
        .name(),
    ];
    others.push(name);
    let count = others.len();
    others.sort();
    others.dedup();
    assert_eq!(others.len(), count, "every field changes the name");
}

#[test]
fn the_object_is_a_manual_revocation_of_exactly_what_was_asked() {
    let r = request(&[
        "--reason",
        "credentialCompromise",
        "--tenant",
        "tenant-a",
        "--client",
        "console",
        "--expires-in",
        "12h",
    ]);
    let object = serde_json::to_value(r.object()).unwrap();
    assert_eq!(object["apiVersion"], "lifeguard.dev/v1alpha1");
    assert_eq!(object["kind"], "PrincipalRevocation");
    assert_eq!(object["metadata"]["name"], r.name());
    assert_eq!(
        object["metadata"]["labels"],
        json!({"lifeguard.dev/source": "manual"})
    );
    assert!(object["metadata"].get("namespace").is_none());
    assert_eq!(
        object["spec"],
        json!({
            "issuer": "https://idp.example.com",
            "subject": "alice",
            "tenant": "tenant-a",
            "client": "console",
            "revokedBefore": "2026-12-01T10:00:00Z",
            "reason": "credentialCompromise",
            "source": {"kind": "manual"},
            "expiresAt": "2026-12-01T22:00:00Z",
        })
    );
}

#[test]
fn an_existing_object_is_this_request_when_principal_reason_and_expiry_match() {
    let asked = request(&["--reason", "sessionRevoked"]).object().spec;
    assert!(differences(&asked, &asked).is_empty());
    // Someone moved revokedBefore later (allowed by the CRD): it still covers the request.
    let later = PrincipalRevocationSpec {
        revoked_before: Time(at("2026-12-01T10:05:00Z")),
        ..asked.clone()
    };
    assert!(differences(&later, &asked).is_empty());
    let other = PrincipalRevocationSpec {
        reason: RevocationReason::AccountDisabled,
        expires_at: Some(Time(at("2026-12-02T00:00:00Z"))),
        subject: Some("bob".into()),
        ..asked.clone()
    };
    let found = differences(&other, &asked);
    assert_eq!(
        found,
        vec![
            "it revokes bob at https://idp.example.com".to_owned(),
            "its reason is accountDisabled (asked: sessionRevoked)".to_owned(),
            "its expiresAt is 2026-12-02T00:00:00Z (asked: none)".to_owned(),
        ]
    );
}

fn revocation(generation: i64, status: serde_json::Value) -> PrincipalRevocation {
    let mut r = request(&["--reason", "sessionRevoked"]).object();
    r.metadata.generation = Some(generation);
    r.status = serde_json::from_value(status).unwrap();
    r
}

fn propagated(status: &str, generation: i64) -> serde_json::Value {
    json!({
        "type": "Propagated", "status": status, "reason": "x", "message": "m",
        "observedGeneration": generation, "lastTransitionTime": "2026-12-01T10:00:01Z",
    })
}

#[test]
fn progress_follows_the_operators_status_for_the_current_generation() {
    let mut none = request(&["--reason", "sessionRevoked"]).object();
    assert_eq!(progress(&none), Progress::NotObserved);
    none.status = Some(Default::default());
    assert_eq!(progress(&none), Progress::NotObserved);

    let propagating = revocation(
        1,
        json!({"observedGeneration": 1, "targetSidecars": 3, "acknowledgedSidecars": 1,
               "tasksCancelled": 2, "conditions": [propagated("False", 1)]}),
    );
    assert_eq!(
        progress(&propagating),
        Progress::Propagating {
            acknowledged: 1,
            target: Some(3),
            tasks_cancelled: 2,
            streams_closed: 0
        }
    );
    let complete = revocation(
        1,
        json!({"observedGeneration": 1, "targetSidecars": 3, "acknowledgedSidecars": 3,
               "tasksCancelled": 4, "streamsClosed": 1, "propagationMillis": 240,
               "completedAt": "2026-12-01T10:00:01Z", "conditions": [propagated("True", 1)]}),
    );
    assert_eq!(
        progress(&complete),
        Progress::Complete {
            acknowledged: 3,
            target: 3,
            tasks_cancelled: 4,
            streams_closed: 1,
            propagation_millis: Some(240)
        }
    );
    // revokedBefore moved (generation 2): the old completion does not count.
    let stale = revocation(
        2,
        json!({"observedGeneration": 1, "targetSidecars": 3, "acknowledgedSidecars": 3,
               "conditions": [propagated("True", 1)]}),
    );
    assert_eq!(progress(&stale), Progress::NotObserved);
    let stale_condition = revocation(
        2,
        json!({"observedGeneration": 2, "targetSidecars": 3, "acknowledgedSidecars": 3,
               "conditions": [propagated("True", 1)]}),
    );
    assert!(matches!(
        progress(&stale_condition),
        Progress::Propagating { .. }
    ));
}

#[test]
fn progress_and_timeouts_read_as_sentences() {
    let propagating = Progress::Propagating {
        acknowledged: 1,
        target: Some(3),
        tasks_cancelled: 2,
        streams_closed: 0,
    };
    assert_eq!(
        propagating.to_string(),
        "propagating: 1 of 3 targeted sidecars applied it (2 pending; 2 tasks cancelled, 0 listen streams closed)"
    );
    let complete = Progress::Complete {
        acknowledged: 3,
        target: 3,
        tasks_cancelled: 4,
        streams_closed: 1,
        propagation_millis: Some(240),
    };
    assert_eq!(
        complete.to_string(),
        "propagated: 3 of 3 targeted sidecars applied it in 240 ms (4 tasks cancelled, 1 listen streams closed)"
    );
    let timeout = timeout_message("manual-x", &propagating, "2m");
    assert!(
        timeout.starts_with("timed out after 2m waiting for principalrevocation manual-x to propagate: 1 of 3 targeted sidecars applied it; 2 still pending."),
        "{timeout}"
    );
    let silent = timeout_message("manual-x", &Progress::NotObserved, "5s");
    assert!(silent.contains("is the operator running?"), "{silent}");
}

#[test]
fn the_reason_is_explained_by_what_it_does_to_fresh_tokens() {
    let session = request(&["--reason", "sessionRevoked"]);
    assert_eq!(
        explain_reason(&session),
        "sessionRevoked: tokens issued at or before 2026-12-01T10:00:00Z are refused; tokens issued later work"
    );
    let disabled = request(&["--reason", "accountDisabled"]);
    assert!(explain_reason(&disabled).contains("every token of the principal is refused"));
}

#[test]
fn a_whole_tenant_or_client_application_is_revoked_without_a_subject() {
    let without_subject = |extra: &[&str]| {
        let mut argv = vec!["revoke", "--issuer", "https://idp.example.com"];
        argv.extend_from_slice(extra);
        let args = Wrap::try_parse_from(argv).unwrap().args;
        RevocationRequest::from_args(&args, at(NOW))
    };
    let tenant = without_subject(&["--reason", "adminAction", "--tenant", "tenant-a"]).unwrap();
    assert_eq!(tenant.subject, None);
    let object = tenant.object();
    assert_eq!(object.spec.subject, None);
    assert_eq!(object.spec.tenant.as_deref(), Some("tenant-a"));
    let client = without_subject(&["--reason", "adminAction", "--client", "console"]).unwrap();
    assert_eq!(client.object().spec.client.as_deref(), Some("console"));
    // Names never collide with a subject's revocation of the same tenant.
    assert_ne!(
        tenant.name(),
        request(&["--reason", "adminAction", "--tenant", "tenant-a"]).name()
    );
    assert_ne!(tenant.name(), client.name());
    let nobody = without_subject(&["--reason", "adminAction"])
        .unwrap_err()
        .to_string();
    assert!(
        nobody.contains("name at least one of --subject, --tenant and --client"),
        "{nobody}"
    );
    assert_eq!(
        principal_label(None, Some("tenant-a"), None),
        "* [tenant=tenant-a]"
    );
}
