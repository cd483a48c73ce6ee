"""What a reviewer checks in the chart's monitoring objects (the Grafana dashboard ConfigMap, the
PrometheusRule, the ServiceMonitors and the sidecars' PodMonitor), as functions from the rendered
objects to a list of problems. Driven by check_chart.py. That every PromQL expression parses and
names only metrics the binaries expose is checked in Rust (tests/it/monitoring.rs)."""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DASHBOARD_FILE = REPO / "charts/lifeguard/dashboards/lifeguard.json"
RUNBOOK = REPO / "docs/operations.md"
# The webhook names the sidecar's admin port; the PodMonitor must scrape exactly that name.
INJECTED_GOLDEN = REPO / "tests/fixtures/injection/golden/injected-native.yaml"
SEVERITIES = {"critical", "warning", "info"}
PROM_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


def heading_anchors(markdown):
    """GitHub's anchors of the headings of a Markdown text."""
    anchors = set()
    for line in markdown.splitlines():
        match = re.match(r"^#{1,6} +(.*?) *$", line)
        if match:
            text = re.sub(r"[^\w\- ]", "", match.group(1).lower())
            anchors.add(text.replace(" ", "-"))
    return anchors


def _of(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def check_dashboard(docs, values):
    settings = values.get("grafanaDashboard", {})
    maps = [d for d in _of(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]
    if not settings.get("enabled"):
        return [f"dashboard ConfigMap rendered while disabled"] if maps else []
    if len(maps) != 1:
        return [f"expected one dashboard ConfigMap, found {len(maps)}"]
    problems = []
    meta = maps[0]["metadata"]
    wanted = settings.get("labels", {"grafana_dashboard": "1"})
    for key, value in wanted.items():
        if meta.get("labels", {}).get(key) != value:
            problems.append(f"dashboard ConfigMap lacks label {key}={value}")
    if meta["namespace"] != (settings.get("namespace") or meta["namespace"]):
        problems.append(f"dashboard ConfigMap in {meta['namespace']}")
    try:
        dashboard = json.loads(maps[0]["data"]["lifeguard.json"])
    except (KeyError, json.JSONDecodeError) as e:
        return problems + [f"dashboard ConfigMap has no valid lifeguard.json: {e}"]
    if dashboard != json.loads(DASHBOARD_FILE.read_text()):
        problems.append("the ConfigMap's dashboard differs from dashboards/lifeguard.json")
    variables = {v["name"]: v for v in dashboard.get("templating", {}).get("list", [])}
    if variables.get("datasource", {}).get("type") != "datasource":
        problems.append("the dashboard has no datasource variable")
    if not dashboard.get("uid"):
        problems.append("the dashboard has no uid (Grafana would make a new one per load)")
    ids = [p["id"] for p in dashboard["panels"]]
    if len(ids) != len(set(ids)):
        problems.append(f"panel ids repeat: {ids}")
    for panel in dashboard["panels"]:
        where = f"panel {panel.get('title')!r}"
        grid = panel["gridPos"]
        if grid["x"] + grid["w"] > 24:
            problems.append(f"{where} is wider than the grid")
        if panel["type"] == "row":
            continue
        if panel.get("datasource", {}).get("uid") != "${datasource}":
            problems.append(f"{where} does not use the datasource variable")
        if not panel.get("description"):
            problems.append(f"{where} has no description")
        targets = panel.get("targets", [])
        if not targets or not all(t.get("expr", "").strip() for t in targets):
            problems.append(f"{where} has a target without a query")
        if len({t["refId"] for t in targets}) != len(targets):
            problems.append(f"{where} repeats a refId")
    return problems


def check_rules(docs, values):
    settings = values.get("prometheusRule", {})
    rules_docs = _of(docs, "PrometheusRule")
    if not settings.get("enabled"):
        return ["PrometheusRule rendered while disabled"] if rules_docs else []
    if len(rules_docs) != 1:
        return [f"expected one PrometheusRule, found {len(rules_docs)}"]
    problems = []
    anchors = heading_anchors(RUNBOOK.read_text())
    names = []
    for group in rules_docs[0]["spec"]["groups"]:
        for rule in group["rules"]:
            name = rule.get("alert")
            names.append(name)
            where = f"alert {name}"
            if not name or not name.startswith("Lifeguard"):
                problems.append(f"{where}: alert names start with Lifeguard")
            if not rule.get("expr", "").strip():
                problems.append(f"{where} has no expr")
            if "for" in rule and not PROM_DURATION.match(str(rule["for"])):
                problems.append(f"{where}: `for: {rule['for']}` is not a Prometheus duration")
            if rule.get("labels", {}).get("severity") not in SEVERITIES:
                problems.append(f"{where}: severity {rule.get('labels', {}).get('severity')}")
            notes = rule.get("annotations", {})
            for key in ("summary", "description", "runbook_url"):
                if not notes.get(key):
                    problems.append(f"{where} has no {key}")
            anchor = notes.get("runbook_url", "").partition("#")[2]
            if anchor not in anchors:
                problems.append(f"{where}: runbook anchor #{anchor} is not a heading of "
                                "docs/operations.md")
    if len(names) != len(set(names)):
        problems.append(f"alert names repeat: {names}")
    return problems


def check_scrape_targets(docs, values):
    settings = values.get("serviceMonitor", {})
    pod_monitors = _of(docs, "PodMonitor")
    wanted = bool(settings.get("enabled")) and settings.get("sidecars", True)
    problems = []
    if bool(pod_monitors) != wanted:
        problems.append(f"PodMonitor rendered is {bool(pod_monitors)}, wanted {wanted}")
    injected = INJECTED_GOLDEN.read_text()
    for monitor in pod_monitors:
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            if f"name: {endpoint['port']}\n" not in injected:
                problems.append(f"the PodMonitor scrapes port {endpoint['port']}, which the "
                                "webhook does not declare on the sidecar")
        if monitor["spec"].get("namespaceSelector") != {"any": True}:
            problems.append("the sidecars' PodMonitor does not look in every namespace")
    for monitor in _of(docs, "ServiceMonitor"):
        component = monitor["metadata"]["labels"].get("app.kubernetes.io/component")
        honor = all(e.get("honorLabels") for e in monitor["spec"]["endpoints"])
        if honor != (component == "operator"):
            problems.append(f"ServiceMonitor of the {component}: honorLabels is {honor} (the "
                            "operator's per-object gauges carry their own `namespace`)")
    return problems


def check_monitoring(docs, values):
    return check_dashboard(docs, values) + check_rules(docs, values) + \
        check_scrape_targets(docs, values)
