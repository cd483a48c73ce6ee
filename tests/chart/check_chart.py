#!/usr/bin/env python3
"""Offline checks of charts/lifeguard and charts/lifeguard-crds, driven by tests/it/helm_chart.rs.

    check_chart.py lint|render|refusals|examples|upgrade|dump-tls

Helm comes from PyPI `helm-python-sdk` (Helm v4 in a shared library: no helm binary, no
cluster), Kubernetes schemas from PyPI `kubernetes-validate`. Each part prints what it checked
and ends with `check_chart PART: ok`; any problem is listed and the exit status is 1.

LIFEGUARD_UPDATE_GOLDEN=1 rewrites tests/chart/golden/default.yaml instead of comparing.
"""

from __future__ import annotations

import base64
import datetime
import difflib
import functools
import os
import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ beside chart_properties.py in the work tree

try:
    import helm_python as helm
    import jsonschema
    import kubernetes_validate
    import kubernetes_validate.utils as kv
    import yaml
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    import chart_properties as props
    import monitoring_properties
except ImportError as missing:
    sys.exit(f"check_chart.py: {missing}; this interpreter ({sys.executable}) lacks the pinned "
             "packages: pip install -r tests/interop/requirements.txt (scripts/test.sh does)")

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts/lifeguard"
CRD_CHART = REPO / "charts/lifeguard-crds"
GOLDEN = REPO / "tests/chart/golden/default.yaml"
RELEASE, NAMESPACE = "lifeguard", "lifeguard-system"
# The oldest and newest Kubernetes the chart supports: Chart.yaml's kubeVersion and the README
# say the same. 1.33 is the oldest the CRDs support (README.md, "Installing the CRDs").
KUBE_VERSIONS = ("1.33.0", "1.37.0")
# Kinds kubernetes-validate ships no schema for (they come from cert-manager and the Prometheus
# Operator); every other kind must validate.
FOREIGN_KINDS = {("cert-manager.io/v1", "Issuer"), ("cert-manager.io/v1", "Certificate"),
                 ("monitoring.coreos.com/v1", "ServiceMonitor"),
                 ("monitoring.coreos.com/v1", "PodMonitor"),
                 ("monitoring.coreos.com/v1", "PrometheusRule")}
LIFEGUARD_KINDS = {"McpServerPolicy", "CapabilityException", "PrincipalRevocation"}

# kubernetes-validate re-reads its multi-megabyte schema files on every call.
kv.schema_contents = functools.lru_cache(maxsize=None)(kv.schema_contents)


class Loader(yaml.SafeLoader):
    """YAML as the API server reads it: timestamps stay strings."""


Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load_all(text):
    return [d for d in yaml.load_all(text, Loader=Loader) if d]


def test_ca_pem():
    """A throwaway CA certificate for the existingSecret scenario."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "existing-ca")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM).decode()


EXISTING = {"certificates": {"mode": "existingSecret", "existingSecret": {
    "operatorSecretName": "corp-operator-tls", "webhookSecretName": "corp-webhook-tls",
    "caBundle": test_ca_pem()}}}

# Values per scenario: the defaults, each certificate mode, and every toggle at once.
SCENARIOS = {
    "default": {},
    "certManager": {"certificates": {"mode": "certManager"}},
    "certManager-issuer": {"certificates": {"mode": "certManager", "certManager": {
        "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}}}},
    "existingSecret": EXISTING,
    "everything": {
        "image": {"digest": "sha256:" + "ab" * 32},
        "approverKeys": {"jwks": '{"keys": []}'},
        "operator": {
            "config": {
                "bypassPrevention": {"networkPolicy": "optIn", "sidecarPorts": ["mcp", 15020]},
                "securityEvents": {"audience": "https://lifeguard.example.com/ssf",
                                   "transmitters": [{"issuer": "https://idp.example.com",
                                                     "jwksUri": "https://idp.example.com/jwks",
                                                     "delivery": "push"}]}},
            "service": {"type": "LoadBalancer"},
            "extraEnv": [{"name": "SSL_CERT_FILE", "value": "/etc/idp-ca/ca.crt"}],
            "extraVolumes": [{"name": "idp-ca", "configMap": {"name": "idp-ca"}}],
            "extraVolumeMounts": [{"name": "idp-ca", "mountPath": "/etc/idp-ca",
                                   "readOnly": True}],
            "tolerations": [{"key": "dedicated", "operator": "Exists"}],
        },
        "webhook": {"replicas": 3, "antiAffinity": "hard", "excludeNamespaces": ["monitoring"], "injectionScope": "all",
                    "priorityClassName": "system-cluster-critical", "timeoutSeconds": 5},
        "sidecar": {"native": False, "tokenExpirationSeconds": 3600},
        "injection": {"requiredByDefault": True},
        "networkPolicy": {"enabled": True, "metricsFrom": [{"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": "monitoring"}}}]},
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
        "grafanaDashboard": {"enabled": True, "namespace": "monitoring",
                             "annotations": {"grafana_folder": "Lifeguard"}},
        "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"},
                           "revocationObjectiveSeconds": 10},
        "imagePullSecrets": [{"name": "registry"}],
    },
    "monitoring-only": {
        "grafanaDashboard": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "serviceMonitor": {"enabled": True, "sidecars": False},
    },
}


class Problems(list):
    def extend_for(self, scope, items):
        self.extend(f"{scope}: {item}" for item in items)


def render(chart_dir, values=None):
    with helm.Chart.load(str(chart_dir)) as chart:
        return chart.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)


def manifests(rendered):
    """(template path, text) of every manifest, in path order, as `helm template` prints them."""
    out = []
    for path, text in sorted(rendered.items()):
        text = text.strip()
        if path.endswith("NOTES.txt") or not text:
            continue
        out.append((path, (text[3:].lstrip() if text.startswith("---") else text) + "\n"))
    return out


def kube_validate(docs, scope, problems):
    checked = set()
    for doc in docs:
        for version in KUBE_VERSIONS:
            try:
                kv.validate(doc, version, strict=True)
                checked.add(doc["kind"])
            except kv.SchemaNotFoundError:
                if (doc["apiVersion"], doc["kind"]) not in FOREIGN_KINDS:
                    problems.append(f"{scope}: no Kubernetes {version} schema for "
                                    f"{doc['apiVersion']} {doc['kind']}")
            except kv.ValidationError as e:
                path = ".".join(str(p) for p in e.path)
                problems.append(f"{scope}: {doc['kind']}/{doc['metadata']['name']} is invalid "
                                f"for Kubernetes {version}: {path}: {e.message}")
    return checked


MASKED = re.compile(r"^(\s*(?:tls\.crt|tls\.key|ca\.crt|caBundle): )\S+$", re.MULTILINE)


def golden_text(rendered):
    """The default rendering with the generated key material masked (it differs per render)."""
    out = "".join(f"---\n# Source: {path}\n{text}" for path, text in manifests(rendered))
    return MASKED.sub(r"\1<generated>", out)


def check_golden(rendered, problems):
    text = golden_text(rendered)
    if os.environ.get("LIFEGUARD_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
        print(f"  wrote {GOLDEN.relative_to(REPO)}")
        return
    if not GOLDEN.exists():
        problems.append(f"{GOLDEN.relative_to(REPO)} is missing; write it with "
                        "LIFEGUARD_UPDATE_GOLDEN=1 cargo test --test it helm_chart::")
        return
    expected = GOLDEN.read_text()
    if text != expected:
        diff = difflib.unified_diff(expected.splitlines(), text.splitlines(), "golden",
                                    "rendered", lineterm="", n=2)
        problems.append("the default rendering differs from the golden file (review, then "
                        "LIFEGUARD_UPDATE_GOLDEN=1 cargo test --test it helm_chart::):\n"
                        + "\n".join(list(diff)[:80]))


def check_scenario(name, values, problems):
    docs = load_all("---\n".join(t for _, t in manifests(render(CHART, values))))
    validated = kube_validate(docs, name, problems)
    merged = {**SCENARIOS["default"], **values}
    mode = merged.get("certificates", {}).get("mode", "generated")
    services = {s["metadata"]["name"]: s for s in props.of_kind(docs, "Service")}
    bypass = merged.get("operator", {}).get("config", {}).get("bypassPrevention", {}).get(
        "networkPolicy", "disabled") != "disabled"
    excluded = merged.get("webhook", {}).get("excludeNamespaces", [])
    checks = [
        props.check_labels(docs),
        props.check_security_contexts(docs),
        props.check_rbac(docs, bypass),
        props.check_workloads(docs, NAMESPACE, services),
        props.check_webhook_configurations(docs, NAMESPACE, services, excluded,
                                           merged.get("webhook", {}).get("injectionScope",
                                                                         "optedIn")),
        props.check_configs(docs, NAMESPACE, services),
        props.check_certificates(docs, NAMESPACE, mode, values),
        monitoring_properties.check_monitoring(docs, merged),
    ]
    for found in checks:
        problems.extend_for(name, found)
    kinds = {d["kind"] for d in docs}
    toggled = {"NetworkPolicy": "networkPolicy", "ServiceMonitor": "serviceMonitor"}
    for kind, key in toggled.items():
        if (kind in kinds) != bool(merged.get(key, {}).get("enabled")):
            problems.append(f"{name}: {kind} rendered is {kind in kinds}, toggle {key}.enabled")
    if "NetworkPolicy" in kinds:
        for policy in props.of_kind(docs, "NetworkPolicy"):
            deployment = props.one(docs, "Deployment", props.component(policy))
            if not props.selector_matches(policy["spec"]["podSelector"],
                                          props.pod_labels(deployment)):
                problems.append(f"{name}: NetworkPolicy {policy['metadata']['name']} selects "
                                "no Lifeguard pod")
    print(f"  {name}: {len(docs)} objects, Kubernetes {' and '.join(KUBE_VERSIONS)} schemas "
          f"for {len(validated)} kinds, not for {sorted(kinds - validated) or 'none'}")
    return docs


def crd_chart(problems):
    """The CRD chart renders the committed CRDs (plus the keep annotation) and they validate."""
    docs = load_all("---\n".join(t for _, t in manifests(render(CRD_CHART))))
    kube_validate(docs, "lifeguard-crds", problems)
    committed = {}
    for path in sorted((REPO / "crds").glob("*.yaml")):
        crd = load_all(path.read_text())[0]
        committed[crd["metadata"]["name"]] = crd
    rendered = {d["metadata"]["name"]: d for d in docs}
    if rendered.keys() != committed.keys():
        problems.append(f"lifeguard-crds renders {sorted(rendered)}, crds/ has {sorted(committed)}")
    for name, crd in rendered.items():
        annotations = crd["metadata"].pop("annotations", {})
        if annotations != {"helm.sh/resource-policy": "keep"}:
            problems.append(f"lifeguard-crds {name}: annotations {annotations}")
        if crd != committed.get(name):
            problems.append(f"lifeguard-crds {name} differs from crds/")
    print(f"  lifeguard-crds: {len(docs)} CRDs equal to crds/, annotated keep")
    return docs


def part_render():
    problems = Problems()
    crd_chart(problems)
    for name, values in SCENARIOS.items():
        check_scenario(name, values, problems)
    check_golden(render(CHART), problems)
    return problems


# Values the schema must refuse, with a fragment of the message that must name the problem.
SCHEMA_REFUSALS = [
    ({"certificates": {"mode": "bogus"}}, "/certificates/mode"),
    ({"sidecar": {"tokenExpirationSeconds": 599}}, "/sidecar/tokenExpirationSeconds"),
    ({"sidecar": {"tokenExpirationSeconds": 3601}}, "/sidecar/tokenExpirationSeconds"),
    ({"webhook": {"timeoutSeconds": 31}}, "/webhook/timeoutSeconds"),
    ({"operator": {"replica": 3}}, "replica"),
    ({"operator": {"config": {"bypassPrevention": {"networkPolicy": "always"}}}},
     "/operator/config/bypassPrevention/networkPolicy"),
    ({"image": {"digest": "latest"}}, "/image/digest"),
    ({"logFormat": "xml"}, "/logFormat"),
    ({"webhook": {"antiAffinity": "strict"}}, "/webhook/antiAffinity"),
    ({"sidecar": {"adminPort": 80}}, "/sidecar/adminPort"),
    ({"sidecar": {"internalPort": 80}}, "/sidecar/internalPort"),
    ({"certificates": {"certManager": {"issuerRef": {"kind": "ClusterIssuer"}}}}, "issuerRef"),
    ({"unknownTopLevel": True}, "unknownTopLevel"),
    ({"prometheusRule": {"sidecarsOutOfSyncFor": "5 minutes"}},
     "/prometheusRule/sidecarsOutOfSyncFor"),
    ({"prometheusRule": {"revocationObjectiveSeconds": 0}},
     "/prometheusRule/revocationObjectiveSeconds"),
    ({"prometheusRule": {"runbookUrl": "docs/operations.md#x"}}, "/prometheusRule/runbookUrl"),
    ({"grafanaDashboard": {"namespace": "Monitoring"}}, "/grafanaDashboard/namespace"),
]

# Values the schema allows but the templates refuse, with the fail message they must print.
TEMPLATE_REFUSALS = [
    ({"certificates": {"mode": "existingSecret"}},
     "missing: operatorSecretName, webhookSecretName, caBundle"),
    ({"certificates": {"mode": "existingSecret", "existingSecret": {
        "operatorSecretName": "a", "webhookSecretName": "b"}}}, "missing: caBundle"),
    ({"certificates": {"mode": "existingSecret", "existingSecret": {
        "operatorSecretName": "a", "webhookSecretName": "b",
        "caBundle": base64.b64encode(b"x").decode()}}},
     "must be a PEM certificate"),
    ({"sidecar": {"adminPort": 15080}}, "sidecar.adminPort and sidecar.upstreamPort must differ"),
    ({"sidecar": {"internalPort": 15020}}, "sidecar.internalPort must differ"),
    ({"sidecar": {"internalPort": 15080}}, "sidecar.internalPort must differ"),
]


def part_refusals():
    problems = Problems()
    with helm.Chart.load(str(CHART)) as chart:
        chart.validate_schema({})
        for values, fragment in SCHEMA_REFUSALS:
            for attempt in ("validate_schema", "render"):
                try:
                    if attempt == "render":
                        chart.render(values, name=RELEASE, namespace=NAMESPACE)
                    else:
                        chart.validate_schema(values)
                    problems.append(f"{attempt} accepted {values}")
                except helm.HelmValuesError as e:
                    if fragment not in str(e):
                        problems.append(f"{attempt} refused {values} without naming "
                                        f"{fragment}: {e}")
        for values, message in TEMPLATE_REFUSALS:
            try:
                chart.render(values, name=RELEASE, namespace=NAMESPACE)
                problems.append(f"render accepted {values}")
            except helm.HelmError as e:
                if message not in str(e):
                    problems.append(f"render refused {values} with {e!s}, not {message!r}")
    print(f"  {len(SCHEMA_REFUSALS)} schema refusals, {len(TEMPLATE_REFUSALS)} template refusals")
    return problems


def values_paths(values, prefix=""):
    """Leaf paths of values.yaml; maps that default to {} or lists count as leaves."""
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in ("resources", "requests", "limits"):
            yield from values_paths(value, path + ".")
        else:
            yield path


def part_lint():
    problems = Problems()
    for chart_dir in (CHART, CRD_CHART):
        scenarios = SCENARIOS if chart_dir == CHART else {"default": {}}
        for version in KUBE_VERSIONS:
            for name, values in scenarios.items():
                report = helm.lint(str(chart_dir), values, strict=True, namespace=NAMESPACE,
                                   kube_version=f"v{version}")
                for message in report["messages"]:
                    if message["severity"] >= 2:
                        problems.append(f"lint {chart_dir.name} ({name}, Kubernetes {version}): "
                                        f"{message['path']}: {message['error']}")
                problems.extend(f"lint {chart_dir.name} ({name}): {e}" for e in report["errors"])
        print(f"  {chart_dir.name}: strict lint clean for Kubernetes {', '.join(KUBE_VERSIONS)} "
              f"({len(scenarios)} value sets)")
    chart_meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    if chart_meta["kubeVersion"] != f">={KUBE_VERSIONS[0]}-0":
        problems.append(f"Chart.yaml kubeVersion {chart_meta['kubeVersion']} is not the oldest "
                        f"tested version {KUBE_VERSIONS[0]}")
    readme = (CHART / "README.md").read_text()
    for version in KUBE_VERSIONS:
        if version.rsplit(".", 1)[0] not in readme:
            problems.append(f"charts/lifeguard/README.md does not name Kubernetes {version}")
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    undocumented = [p for p in values_paths(defaults) if f"`{p}`" not in readme]
    if undocumented:
        problems.append(f"charts/lifeguard/README.md does not document {undocumented}")
    known = kv.all_versions()
    print(f"  kubernetes-validate {kubernetes_validate.version.__version__} knows Kubernetes "
          f"{known[0]} to {known[-1]}")
    for version in KUBE_VERSIONS:
        if version not in known:
            problems.append(f"kubernetes-validate has no schemas for Kubernetes {version}")
    return problems


def strict_schema(schema):
    """The CRD's openAPIV3Schema as JSON Schema, refusing unknown fields as the API server does
    under strict field validation (`kubectl apply` and `create` default to it)."""
    if isinstance(schema, list):
        return [strict_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict_schema(v) for k, v in schema.items()}
    if out.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def with_object_meta(schema):
    """The fields the API server adds to every CRD's root schema."""
    properties = {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                  "metadata": {"type": "object"}, **schema.get("properties", {})}
    return {**schema, "properties": properties}


def part_examples():
    problems = Problems()
    schemas = {}
    for path in sorted((REPO / "crds").glob("*.yaml")):
        crd = load_all(path.read_text())[0]
        version = crd["spec"]["versions"][0]
        schemas[crd["spec"]["names"]["kind"]] = (
            f"{crd['spec']['group']}/{version['name']}",
            jsonschema.Draft202012Validator(strict_schema(with_object_meta(
                version["schema"]["openAPIV3Schema"]))))
    valid, left_to_cel, refused, kinds = 0, 0, 0, set()
    files = sorted((REPO / "examples").rglob("*.yaml"))
    for path in files:
        rel = path.relative_to(REPO)
        text = path.read_text()
        declared = re.search(r"^# crd-schema: *(\S+)", text, re.MULTILINE)
        expectation = declared.group(1) if declared else "accepts"
        if expectation.startswith("not-applicable"):
            continue
        try:
            docs = load_all(text)
        except yaml.YAMLError as e:
            problems.append(f"{rel}: not YAML: {e}")
            continue
        for doc in docs:
            if not isinstance(doc, dict) or doc.get("kind") not in LIFEGUARD_KINDS:
                continue
            api_version, validator = schemas[doc["kind"]]
            errors = [f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
                      for e in validator.iter_errors(doc)]
            if doc.get("apiVersion") != api_version:
                errors.append(f"apiVersion {doc.get('apiVersion')} is not {api_version}")
            if expectation == "accepts":
                kinds.add(doc["kind"])
                valid += 1
                problems.extend(f"{rel} {doc['kind']}/{doc['metadata']['name']}: {e}"
                                for e in errors)
            elif expectation == "rejects":
                refused += bool(errors)
                left_to_cel += not errors
            else:
                problems.append(f"{rel}: unknown crd-schema value {expectation}")
    if kinds != LIFEGUARD_KINDS:
        problems.append(f"examples cover only {sorted(kinds)}")
    print(f"  {valid} example resources from {len(files)} files (all but those declared "
          f"`crd-schema: rejects` or `not-applicable`) validate against the CRD schemas; of those declared `crd-schema: rejects`, {refused} fail the structural "
          f"schema and {left_to_cel} only its CEL rules (tests/it/policy_examples.rs evaluates "
          "those)")
    return problems


class KubeEmulator:
    """tests/kube_emulator/emulator.py on a free loopback port, for Helm's `lookup`."""

    def __enter__(self):
        self.process = subprocess.Popen(
            [sys.executable, str(REPO / "tests/kube_emulator/emulator.py"), "--port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in self.process.stdout:
            if "listening on " in line:
                self.url = line.split("listening on ", 1)[1].strip()
                return self
        self.process.wait()
        raise RuntimeError("the Kubernetes API emulator exited before listening")

    def __exit__(self, *exc):
        self.process.kill()
        self.process.wait()

    def request(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request) as response:
            return json.loads(response.read())

    def kubeconfig(self):
        return yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "emulator", "user": {"token": "chart-test"}}],
            "contexts": [{"name": "emulator", "context": {"cluster": "emulator",
                                                          "user": "emulator"}}]})


def tls_material(docs):
    """{Secret name: data} of the TLS Secrets and the caBundles of the webhook configurations."""
    secrets = {d["metadata"]["name"]: d["data"] for d in props.of_kind(docs, "Secret")}
    bundles = {h["clientConfig"]["caBundle"] for kind in ("MutatingWebhookConfiguration",
                                                          "ValidatingWebhookConfiguration")
               for h in props.one(docs, kind)["webhooks"]}
    return secrets, bundles


def part_upgrade():
    """generated mode keeps the certificates of the running release (found with `lookup`), and
    makes new ones for both components when either Secret is gone."""
    problems = Problems()
    installed = load_all("---\n".join(t for _, t in manifests(render(CHART))))
    secrets, _ = tls_material(installed)
    secrets_path = f"/api/v1/namespaces/{NAMESPACE}/secrets"
    with KubeEmulator() as cluster, helm.Chart.load(str(CHART)) as chart, \
            helm.Config(kubeconfig_content=cluster.kubeconfig(), namespace=NAMESPACE) as config:
        def upgrade():
            rendered = config.render(chart, {}, name=RELEASE, namespace=NAMESPACE,
                                     is_upgrade=True)
            return tls_material(load_all("---\n".join(t for _, t in manifests(rendered))))

        for secret in props.of_kind(installed, "Secret"):
            cluster.request("POST", secrets_path, secret)
        kept, bundles = upgrade()
        if kept != secrets:
            problems.append("an upgrade replaced the certificates of the running release")
        ca = secrets["lifeguard-operator-tls"]["ca.crt"]
        if bundles != {ca}:
            problems.append("after an upgrade the caBundle is not the running release's CA")

        cluster.request("DELETE", f"{secrets_path}/lifeguard-webhook-tls")
        renewed, bundles = upgrade()
        for name, data in renewed.items():
            if data["ca.crt"] == ca or data["tls.crt"] == secrets[name]["tls.crt"]:
                problems.append(f"with a Secret gone, {name} was not issued anew")
        new_ca = {data["ca.crt"] for data in renewed.values()}
        if len(new_ca) != 1 or bundles != new_ca:
            problems.append("the renewed certificates and caBundle do not share one new CA")
    print("  lookup keeps both certificates on upgrade; a missing Secret renews both under a "
          "new CA (against the Kubernetes API emulator)")
    return problems


def part_dump_tls():
    """Writes the default rendering's generated TLS Secrets as files, as the pods mount them:
    DIR/<Secret name>/{tls.crt,tls.key,ca.crt}. tests/it/helm_chart.rs serves them with
    Lifeguard's own TLS code."""
    target = Path(os.environ["LIFEGUARD_CHART_TLS_DIR"])
    docs = load_all("---\n".join(t for _, t in manifests(render(CHART))))
    for secret in props.of_kind(docs, "Secret"):
        folder = target / secret["metadata"]["name"]
        folder.mkdir(parents=True, exist_ok=True)
        for key, value in secret["data"].items():
            (folder / key).write_bytes(base64.b64decode(value))
        print(f"  wrote {folder}")
    return Problems()


def part_emit():
    """Renders charts/lifeguard with the JSON values in $LIFEGUARD_CHART_VALUES and prints the
    manifests as one JSON array (for whole-system tests that apply what the chart would)."""
    values = json.loads(os.environ.get("LIFEGUARD_CHART_VALUES") or "{}")
    docs = [d for _, text in manifests(render(CHART, values)) for d in yaml.safe_load_all(text)]
    print("EMIT " + json.dumps([d for d in docs if d]))
    return Problems()


PARTS = {"emit": part_emit, "lint": part_lint, "upgrade": part_upgrade, "dump-tls": part_dump_tls, "render": part_render, "refusals": part_refusals,
         "examples": part_examples}


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in PARTS:
        sys.exit(f"usage: check_chart.py {'|'.join(PARTS)}")
    part = sys.argv[1]
    started = time.monotonic()
    print(f"check_chart {part} (Helm {helm.helm_sdk_version()} via helm-python-sdk "
          f"{helm.__version__})")
    problems = PARTS[part]()
    if problems:
        print(f"check_chart {part}: {len(problems)} problem(s)")
        for problem in problems:
            print(f"  - {problem}")
        sys.exit(1)
    print(f"check_chart {part}: ok ({time.monotonic() - started:.1f} s)")


if __name__ == "__main__":
    main()
