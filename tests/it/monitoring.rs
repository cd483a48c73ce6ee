//! The monitoring the chart ships (the Grafana dashboard and the PrometheusRule) speaks only of
//! metrics Lifeguard exposes, with labels they carry.
//!
//! The chart is rendered with both enabled (`tests/chart/check_chart.py emit`, Helm v4); every
//! PromQL expression of a panel, a dashboard variable and an alert is parsed with
//! `promql-parser`. The names come from the real binary: a sidecar, an operator and a webhook
//! are started and made to do the work the panels show (a task answered under a
//! CapabilityException, a refused request, a policy acknowledged, a revocation a stuck sidecar
//! never applies, a pod admission), then their `/metrics` are scraped. Each selector's metric
//! must be exposed; each label it matches, groups by or names in a legend or annotation must be
//! a label of a scraped sample or one Prometheus adds to every target ([`TARGET_LABELS`]).

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use promql_parser::parser::{self, Expr, LabelModifier};
use serde_json::{Value, json};
use support::capability::{Grant, answer, finish, next_state, sample, summarize};
use support::kube::KubeEmulator;
use support::operator::{LightSidecar, Operator, TestPod, signed_exception};
use support::webhook::{Webhook, config_yaml, pod_review};
use support::{User, eventually};

/// Labels Prometheus attaches from service discovery (the Prometheus Operator's ServiceMonitor
/// and PodMonitor set these), which the dashboard filters and groups by.
const TARGET_LABELS: &[&str] = &[
    "namespace",
    "pod",
    "container",
    "service",
    "endpoint",
    "job",
    "instance",
];
/// Grafana's built-in interval variables, as Grafana would substitute them.
const GRAFANA_INTERVALS: &[(&str, &str)] = &[
    ("$__rate_interval", "2m"),
    ("$__interval", "30s"),
    ("$__range", "6h"),
];
const NS: &str = "team-a";
const WAIT: Duration = Duration::from_secs(20);

/// Series names the binaries expose, with the label names seen on their samples (`None`: the
/// family was declared but had no sample, so its labels are unknown).
#[derive(Debug, Default)]
struct Exposed(BTreeMap<String, Option<BTreeSet<String>>>);

impl Exposed {
    /// Reads one exposition text (Prometheus text or OpenMetrics).
    fn absorb(&mut self, text: &str) {
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (family, kind) = rest.split_once(' ').expect("# TYPE name type");
                let suffixes: &[&str] = match kind.trim() {
                    "counter" => &["_total"],
                    "histogram" | "gaugehistogram" => &["_bucket", "_sum", "_count"],
                    "summary" => &["", "_sum", "_count"],
                    "info" => &["_info"],
                    _ => &[""],
                };
                for suffix in suffixes {
                    self.0.entry(format!("{family}{suffix}")).or_insert(None);
                }
            } else if !line.starts_with('#') && !line.trim().is_empty() {
                let (name, labels) = parse_sample(line);
                self.0
                    .entry(name)
                    .or_insert(None)
                    .get_or_insert_default()
                    .extend(labels);
            }
        }
    }
}

/// The name and label names of one sample line.
fn parse_sample(line: &str) -> (String, Vec<String>) {
    let end = line.find(['{', ' ']).expect("a sample has a value");
    let name = line[..end].to_owned();
    let mut labels = Vec::new();
    if line[end..].starts_with('{') {
        let mut rest = &line[end + 1..];
        while !rest.starts_with('}') {
            let (label, after) = rest.split_once("=\"").expect("label=\"value\"");
            labels.push(label.trim_start_matches(',').to_owned());
            // The value ends at the first quote not escaped by a backslash.
            let mut escaped = false;
            let close = after
                .char_indices()
                .find(|(_, c)| {
                    let end = *c == '"' && !escaped;
                    escaped = *c == '\\' && !escaped;
                    end
                })
                .map(|(i, _)| i)
                .expect("a closed label value");
            rest = after[close + 1..].trim_start_matches(',');
        }
    }
    (name, labels)
}

/// One query of the dashboard or the rules, with the label names its text refers to outside
/// PromQL (legend `{{label}}`, annotation `$labels.label`).
#[derive(Debug)]
struct Query {
    place: String,
    expr: String,
    template_labels: Vec<String>,
}

/// What the expression selects and groups by.
#[derive(Debug, Default)]
struct Uses {
    /// (metric name, label names matched)
    selectors: Vec<(Option<String>, Vec<String>)>,
    /// Labels of `by`, `without`, `on` and `ignoring` clauses.
    grouping: Vec<String>,
}

fn walk(expr: &Expr, uses: &mut Uses) {
    match expr {
        Expr::Aggregate(a) => {
            if let Some(modifier) = &a.modifier {
                let (LabelModifier::Include(l) | LabelModifier::Exclude(l)) = modifier;
                uses.grouping.extend(l.labels.iter().cloned());
            }
            walk(&a.expr, uses);
            if let Some(param) = &a.param {
                walk(param, uses);
            }
        }
        Expr::Unary(u) => walk(&u.expr, uses),
        Expr::Binary(b) => {
            if let Some(matching) = b.modifier.as_ref().and_then(|m| m.matching.as_ref()) {
                uses.grouping
                    .extend(matching.labels().labels.iter().cloned());
            }
            walk(&b.lhs, uses);
            walk(&b.rhs, uses);
        }
        Expr::Paren(p) => walk(&p.expr, uses),
        Expr::Subquery(s) => walk(&s.expr, uses),
        Expr::VectorSelector(v) => uses.selectors.push(selector(v)),
        Expr::MatrixSelector(m) => uses.selectors.push(selector(&m.vs)),
        Expr::Call(c) => c.args.args.iter().for_each(|a| walk(a, uses)),
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
    }
}

fn selector(v: &promql_parser::parser::VectorSelector) -> (Option<String>, Vec<String>) {
    let labels = v
        .matchers
        .matchers
        .iter()
        .chain(v.matchers.or_matchers.iter().flatten())
        .map(|m| m.name.clone())
        .filter(|n| n != "__name__")
        .collect();
    (v.name.clone(), labels)
}

/// `{{label}}` of a Grafana legend, `$labels.label` of an alert annotation.
fn template_labels(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for part in text.split("{{").skip(1) {
        let inner = part.split("}}").next().unwrap_or_default().trim();
        if let Some(label) = inner.strip_prefix("$labels.") {
            found.push(
                label
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_owned(),
            );
        } else if !inner.starts_with('$') && !inner.is_empty() {
            found.push(inner.to_owned());
        }
    }
    found
}

/// The chart rendered with the dashboard and the rules enabled.
fn rendered_monitoring() -> (Value, Value) {
    let values =
        json!({"grafanaDashboard": {"enabled": true}, "prometheusRule": {"enabled": true}});
    let docs = support::chart::render(&values);
    let dashboard = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["data"]["lifeguard.json"].is_string())
        .map(|d| serde_json::from_str(d["data"]["lifeguard.json"].as_str().unwrap()))
        .expect("the dashboard ConfigMap")
        .expect("the dashboard is JSON");
    let rules = docs
        .iter()
        .find(|d| d["kind"] == "PrometheusRule")
        .cloned()
        .expect("the PrometheusRule");
    (dashboard, rules)
}

/// Every query of the dashboard (panels and variables) and of the rules.
fn queries(dashboard: &Value, rules: &Value) -> Vec<Query> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            out.push(Query {
                place: format!("panel {:?} {}", panel["title"], target["refId"]),
                expr: target["expr"].as_str().expect("expr").to_owned(),
                template_labels: template_labels(target["legendFormat"].as_str().unwrap_or("")),
            });
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        let Some(query) = variable["query"]["query"].as_str() else {
            continue;
        };
        // label_values(SELECTOR, LABEL): the selector is PromQL, the label must be on it.
        let inner = query
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
            .unwrap_or_else(|| panic!("variable query {query} is not label_values(…)"));
        let (selector, label) = inner
            .rsplit_once(',')
            .expect("label_values(selector, label)");
        out.push(Query {
            place: format!("variable {}", variable["name"]),
            expr: selector.trim().to_owned(),
            template_labels: vec![label.trim().to_owned()],
        });
    }
    for group in rules["spec"]["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            let notes = rule["annotations"].as_object().expect("annotations");
            out.push(Query {
                place: format!("alert {}", rule["alert"]),
                expr: rule["expr"].as_str().expect("expr").to_owned(),
                template_labels: notes
                    .values()
                    .filter_map(Value::as_str)
                    .flat_map(template_labels)
                    .collect(),
            });
        }
    }
    out
}

/// Problems of one query against what the binaries expose.
fn check(query: &Query, exposed: &Exposed) -> Vec<String> {
    let mut text = query.expr.clone();
    for (variable, value) in GRAFANA_INTERVALS {
        text = text.replace(variable, value);
    }
    let expr = match parser::parse(&text) {
        Ok(expr) => expr,
        Err(e) => return vec![format!("{}: `{}` does not parse: {e}", query.place, text)],
    };
    let mut uses = Uses::default();
    walk(&expr, &mut uses);
    let mut problems = Vec::new();
    if uses.selectors.is_empty() {
        problems.push(format!("{}: selects no metric", query.place));
    }
    let mut available: BTreeSet<String> = TARGET_LABELS.iter().map(|l| l.to_string()).collect();
    for (name, matched) in &uses.selectors {
        let Some(name) = name else {
            problems.push(format!("{}: a selector without a metric name", query.place));
            continue;
        };
        match exposed.0.get(name) {
            None => problems.push(format!("{}: {name} is not exposed", query.place)),
            Some(None) => problems.push(format!(
                "{}: {name} had no sample in this test, so its labels are unchecked: make the \
                 scenario exercise it",
                query.place
            )),
            Some(Some(labels)) => {
                for label in matched {
                    if !labels.contains(label) && !TARGET_LABELS.contains(&label.as_str()) {
                        problems.push(format!(
                            "{}: {name} has no label {label} (it has {labels:?})",
                            query.place
                        ));
                    }
                }
                available.extend(labels.iter().cloned());
            }
        }
    }
    for label in uses.grouping.iter().chain(&query.template_labels) {
        if !available.contains(label) {
            problems.push(format!(
                "{}: label {label} is on none of its metrics",
                query.place
            ));
        }
    }
    problems
}

async fn scrape(admin: &str) -> String {
    reqwest::get(format!("{admin}/metrics"))
        .await
        .and_then(|r| r.error_for_status())
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text")
}

/// A sidecar that answered a task's sampling request under exception `ok`, and refused
/// another principal's read of that task.
async fn sidecar_metrics() -> String {
    let s = support::capability::setup(
        "{sampling: exception}",
        &[Grant::sampling("ok", "console").signed()],
    )
    .await;
    let alice = User::new("alice", "tenant-a", "console").token();
    let task = summarize(&s.client, &alice, json!({"rounds": 1})).await;
    let asking = next_state(&s.client, &alice, &task).await;
    assert_eq!(asking["status"], "input_required", "{asking}");
    answer(&s.client, &alice, &task, "sample-1", sample("done")).await;
    finish(&s.client, &alice, &task).await;
    let mallory = User::new("mallory", "tenant-a", "console").token();
    let refused = s.client.get_task(&mallory, &task).await;
    assert!(refused.body.get("error").is_some(), "{refused:?}");
    scrape(&s.sidecar.admin).await
}

const POLICY: &str = r#"apiVersion: lifeguard.dev/v1alpha1
kind: McpServerPolicy
metadata: {name: reports, namespace: team-a}
spec:
  selector: {matchLabels: {app: reports}}
  resource: http://127.0.0.1/mcp
  identity:
    issuers:
      - issuer: https://idp.test
        jwksUri: http://127.0.0.1:9/jwks
  tasks: {enabled: true}
  capabilities: {sampling: exception}
"#;

const REVOCATION: &str = r#"apiVersion: lifeguard.dev/v1alpha1
kind: PrincipalRevocation
metadata: {name: alice-revoked}
spec:
  issuer: https://idp.test
  subject: alice
  revokedBefore: "2030-01-01T00:00:00Z"
  reason: sessionRevoked
  source: {kind: manual}
"#;

/// An operator leading with policy `reports` (one sidecar in sync), a verified exception and
/// a revocation its stuck sidecar never applies; and a webhook that answered one admission.
async fn control_plane_metrics() -> (String, String) {
    let emulator = KubeEmulator::start().await;
    let config = "approverKeys: {secretName: lifeguard-approvers, key: approvers.jwks.json}\n";
    let operator = Operator::start(&emulator, Some(config)).await;
    let jwks = std::fs::read_to_string(support::fixture("keys/issuer-jwks.json")).unwrap();
    emulator
        .apply_yaml(
            &json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "lifeguard-approvers", "namespace": "lifeguard-system"},
                "stringData": {"approvers.jwks.json": jwks}
            })
            .to_string(),
        )
        .await;
    emulator.apply_yaml(POLICY).await;
    // Whole seconds, as Kubernetes times are.
    let expires = jiff::Timestamp::from_second(jiff::Timestamp::now().as_second() + 12 * 3600)
        .expect("a time");
    emulator
        .apply_yaml(&signed_exception(
            NS,
            "summaries",
            "reports",
            "2026-01-01T00:00:00Z".parse().unwrap(),
            expires,
        ))
        .await;
    let pod = TestPod::create(&emulator, NS, "reports-0", &[("app", "reports")], "reports").await;
    let sidecar = LightSidecar::connect_never_revoking(&operator, &pod, (NS, "reports-0"));
    eventually(WAIT, async || {
        sidecar.last().filter(|s| s["policy"].is_object())
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "no policy snapshot ({:?}):\n{}",
            sidecar.last(),
            operator.logs()
        )
    });
    emulator.apply_yaml(REVOCATION).await;

    // The leader's per-object gauges show all three objects.
    let wanted = [
        format!("lifeguard_operator_policy_sidecars_selected{{namespace=\"{NS}\",policy=\"reports\"}} 1"),
        format!("lifeguard_operator_policy_sidecars_in_sync{{namespace=\"{NS}\",policy=\"reports\"}} 1"),
        format!(
            "lifeguard_operator_exception_expiry_timestamp_seconds{{namespace=\"{NS}\",exception=\"summaries\",capability=\"sampling\"}} {}.0",
            expires.as_second()
        ),
        "lifeguard_operator_revocation_pending_since_timestamp_seconds{revocation=\"alice-revoked\"} "
            .to_owned(),
    ];
    let mut last = String::new();
    let revocation_status = std::sync::Mutex::new(Value::Null);
    let operator_text = eventually(WAIT, async || {
        last = scrape(&operator.admin).await;
        *revocation_status.lock().unwrap() = reqwest::get(format!(
            "{}/apis/lifeguard.dev/v1alpha1/principalrevocations/alice-revoked",
            emulator.url()
        ))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
        wanted
            .iter()
            .all(|w| last.lines().any(|l| l.starts_with(w.as_str())))
            .then(|| last.clone())
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "the operator never exported {wanted:#?}:\n{last}\n{}\n{:?}",
            operator.logs(),
            revocation_status.lock().unwrap()
        )
    });

    let webhook = Webhook::start(&emulator, &config_yaml("")).await;
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "plain", "namespace": "default"},
        "spec": {"containers": [{"name": "app", "image": "registry.example.com/app:1"}]}
    });
    webhook
        .review("/inject", &pod_review("u-1", "default", &pod))
        .await;
    let webhook_text = scrape(&webhook.admin).await;
    (operator_text, webhook_text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_variable_and_alert_uses_metrics_and_labels_lifeguard_exposes() {
    let (dashboard, rules) = rendered_monitoring();
    let queries = queries(&dashboard, &rules);
    let sidecar = sidecar_metrics().await;
    let (operator, webhook) = control_plane_metrics().await;
    let mut exposed = Exposed::default();
    for text in [&sidecar, &operator, &webhook] {
        exposed.absorb(text);
    }
    let problems: Vec<String> = queries.iter().flat_map(|q| check(q, &exposed)).collect();
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
    // What the dashboard must cover, per the on-call brief (a panel per subject).
    let all: String = queries.iter().map(|q| q.expr.as_str()).collect();
    for metric in [
        "lifeguard_requests_total",
        "lifeguard_denials_total",
        "lifeguard_tasks_terminal_total",
        "lifeguard_operator_revocation_propagation_seconds_bucket",
        "lifeguard_operator_policy_sidecars_in_sync",
        "lifeguard_capability_decisions_total",
        "lifeguard_ledger_write_seconds_bucket",
        "lifeguard_audit_write_errors_total",
        "lifeguard_operator_exception_expiry_timestamp_seconds",
        "lifeguard_operator_revocation_pending_since_timestamp_seconds",
    ] {
        assert!(all.contains(metric), "nothing queries {metric}");
    }
    let alerts: Vec<&str> = queries
        .iter()
        .filter_map(|q| q.place.strip_prefix("alert "))
        .collect();
    assert_eq!(alerts.len(), 5, "{alerts:?}");
}

#[test]
fn the_checker_refuses_unknown_metrics_labels_and_bad_syntax() {
    let mut exposed = Exposed::default();
    exposed.absorb(
        "# TYPE lifeguard_requests counter\n\
         lifeguard_requests_total{method=\"tools/call\",decision=\"allow\"} 3\n\
         # TYPE lifeguard_quiet histogram\n",
    );
    let query = |expr: &str, legend: &str| Query {
        place: "q".into(),
        expr: expr.into(),
        template_labels: template_labels(legend),
    };
    let good = query(
        "sum by (method, namespace) (rate(lifeguard_requests_total{decision=\"allow\"}[$__rate_interval]))",
        "{{method}} {{namespace}}",
    );
    assert_eq!(check(&good, &exposed), Vec::<String>::new());
    for (expr, legend, problem) in [
        ("rate(lifeguard_request_total[5m])", "", "is not exposed"),
        (
            "lifeguard_requests_total{reason=\"x\"}",
            "",
            "has no label reason",
        ),
        (
            "sum by (reason) (lifeguard_requests_total)",
            "",
            "label reason is on none",
        ),
        ("lifeguard_requests_total", "{{status}}", "label status"),
        (
            "sum(rate(lifeguard_requests_total[5m]",
            "",
            "does not parse",
        ),
        ("lifeguard_quiet_bucket", "", "had no sample"),
        ("time()", "", "selects no metric"),
    ] {
        let problems = check(&query(expr, legend), &exposed);
        assert!(
            problems.iter().any(|p| p.contains(problem)),
            "{expr}: {problems:?}"
        );
    }
    assert_eq!(
        template_labels("{{ $labels.namespace }}/{{ $labels.pod }} took {{ $value | humanize }}"),
        ["namespace", "pod"]
    );
}
