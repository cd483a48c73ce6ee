"""What a reviewer checks in a rendered Lifeguard chart, as functions from the rendered objects
to a list of problems (empty: all good). Driven by check_chart.py."""

from __future__ import annotations

import base64
import datetime

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

PART_OF = "app.kubernetes.io/part-of"
READ_VERBS = {"get", "list", "watch"}

# docs/operator.md ("What the operator needs from the API server") plus the CA distribution.
OPERATOR_CLUSTER_RULES = {
    *(("lifeguard.dev", r, v) for r in ("mcpserverpolicies", "capabilityexceptions",
                                         "principalrevocations") for v in READ_VERBS),
    *(("lifeguard.dev", f"{r}/status", "patch") for r in ("mcpserverpolicies",
                                                           "capabilityexceptions",
                                                           "principalrevocations")),
    ("lifeguard.dev", "principalrevocations", "create"),
    ("lifeguard.dev", "principalrevocations", "delete"),
    # The trace annotation (lifeguard.dev/traceparent) on revocations a person applied.
    ("lifeguard.dev", "principalrevocations", "patch"),
    *(("", "pods", v) for v in READ_VERBS),
    ("authentication.k8s.io", "tokenreviews", "create"),
    ("events.k8s.io", "events", "create"),
    ("events.k8s.io", "events", "patch"),
    *(("", "namespaces", v) for v in READ_VERBS),
    ("", "configmaps", "create"),
    ("", "configmaps", "patch"),
}
BYPASS_PREVENTION_RULES = {("networking.k8s.io", "networkpolicies", v)
                           for v in ("get", "patch", "delete")}
OPERATOR_NAMESPACE_RULES = {
    ("coordination.k8s.io", "leases", "create", None),
    ("coordination.k8s.io", "leases", "get", "lifeguard-operator"),
    ("coordination.k8s.io", "leases", "patch", "lifeguard-operator"),
    *(("", "secrets", v, None) for v in READ_VERBS),
    *(("", "configmaps", v, None) for v in (*READ_VERBS, "patch", "delete")),
}
WEBHOOK_CLUSTER_RULES = {("lifeguard.dev", "mcpserverpolicies", v) for v in READ_VERBS} | {
    ("", "namespaces", v) for v in READ_VERBS}
WEBHOOK_NAMESPACE_RULES = {("", "secrets", v, "lifeguard-approvers") for v in READ_VERBS}

WEBHOOK_CONFIG_KEYS = {
    "sidecar": {"image", "imagePullPolicy", "resources", "native", "adminPort", "upstreamPort",
                "internalPort", "tokenExpirationSeconds", "dataSizeLimit"},
    "controlPlane": {"url", "caConfigMap"},
    "approverKeys": {"secretName", "key"},
    "defaults": {"injectionRequired"},
}
OPERATOR_CONFIG_KEYS = {"approverKeys", "securityEvents", "bypassPrevention", "caDistribution"}


def of_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def component(doc):
    return doc["metadata"].get("labels", {}).get("app.kubernetes.io/component")


def one(docs, kind, comp=None):
    """The one object of a kind (and component); for Services, not the metrics Services."""
    found = [d for d in of_kind(docs, kind) if (comp is None or component(d) == comp)
             and "lifeguard.dev/metrics" not in d["metadata"].get("labels", {})]
    if len(found) != 1:
        raise AssertionError(f"expected one {kind} {comp or ''}, found {len(found)}")
    return found[0]


def selector_matches(selector, labels):
    """Kubernetes LabelSelector semantics (matchLabels and matchExpressions)."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def pod_labels(deployment):
    return deployment["spec"]["template"]["metadata"]["labels"]


def check_labels(docs):
    problems = []
    for d in docs:
        name = f'{d["kind"]}/{d["metadata"]["name"]}'
        if d["metadata"].get("labels", {}).get(PART_OF) != "lifeguard":
            problems.append(f"{name} is not labelled {PART_OF}=lifeguard")
        if d["kind"] == "Deployment" and pod_labels(d).get(PART_OF) != "lifeguard":
            problems.append(f"{name}: its pods are not labelled {PART_OF}=lifeguard")
    return problems


def check_security_contexts(docs):
    problems = []
    for d in of_kind(docs, "Deployment"):
        name = d["metadata"]["name"]
        spec = d["spec"]["template"]["spec"]
        psc = spec.get("securityContext") or {}
        if psc.get("runAsNonRoot") is not True:
            problems.append(f"{name}: pod securityContext.runAsNonRoot is not true")
        if (psc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
            problems.append(f"{name}: pod seccompProfile is not RuntimeDefault")
        for flag in ("hostNetwork", "hostPID", "hostIPC"):
            if spec.get(flag):
                problems.append(f"{name}: {flag} is set")
        containers = spec.get("containers", []) + spec.get("initContainers", [])
        for c in containers:
            sc = c.get("securityContext") or {}
            where = f"{name}/{c['name']}"
            expected = {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True}
            for key, value in expected.items():
                if sc.get(key) is not value:
                    problems.append(f"{where}: securityContext.{key} is not {value}")
            if sc.get("privileged"):
                problems.append(f"{where}: privileged")
            if sc.get("runAsUser", psc.get("runAsUser")) in (None, 0):
                problems.append(f"{where}: no non-zero runAsUser")
            caps = sc.get("capabilities") or {}
            if caps.get("drop") != ["ALL"] or caps.get("add"):
                problems.append(f"{where}: capabilities are not exactly drop [ALL]")
            if (sc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
                problems.append(f"{where}: seccompProfile is not RuntimeDefault")
            if not (c.get("resources") or {}).get("requests"):
                problems.append(f"{where}: no resource requests")
    return problems


def _rule_set(role, with_names=False):
    out = set()
    for rule in role.get("rules", []):
        names = rule.get("resourceNames") or [None]
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                for verb in rule.get("verbs", []):
                    for name in names:
                        out.add((group, resource, verb, name) if with_names
                                else (group, resource, verb))
    return out


def check_rbac(docs, bypass_prevention):
    problems = []
    for role in of_kind(docs, "ClusterRole") + of_kind(docs, "Role"):
        for rule in role.get("rules", []):
            for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                if any("*" in item for item in rule.get(field) or []):
                    problems.append(f"{role['kind']}/{role['metadata']['name']}: wildcard in "
                                    f"{field}: {rule}")
    expected_operator = OPERATOR_CLUSTER_RULES | (BYPASS_PREVENTION_RULES if bypass_prevention
                                                  else set())
    expectations = [
        ("ClusterRole", "operator", expected_operator, False),
        ("Role", "operator", OPERATOR_NAMESPACE_RULES, True),
        ("ClusterRole", "webhook", WEBHOOK_CLUSTER_RULES, False),
        ("Role", "webhook", WEBHOOK_NAMESPACE_RULES, True),
    ]
    for kind, comp, expected, with_names in expectations:
        actual = _rule_set(one(docs, kind, comp), with_names)
        if actual != expected:
            problems.append(f"{kind} of the {comp}: grants {sorted(actual - expected, key=str)} "
                            f"beyond and lacks {sorted(expected - actual, key=str)}")
    # Each role is bound to the ServiceAccount its component's pods run as.
    for comp in ("operator", "webhook"):
        account = one(docs, "Deployment", comp)["spec"]["template"]["spec"]["serviceAccountName"]
        one(docs, "ServiceAccount", comp)
        for kind in ("ClusterRoleBinding", "RoleBinding"):
            binding = one(docs, kind, comp)
            role_kind = kind.replace("Binding", "")
            if binding["roleRef"]["name"] != one(docs, role_kind, comp)["metadata"]["name"]:
                problems.append(f"{kind} of the {comp} does not bind its {role_kind}")
            if [s["name"] for s in binding["subjects"]] != [account]:
                problems.append(f"{kind} of the {comp} binds {binding['subjects']}, not {account}")
    return problems


def _container(deployment):
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, f"{deployment['metadata']['name']}: one container expected"
    return containers[0]


def _flags(container):
    flags = {}
    for arg in container["args"][1:]:
        key, _, value = arg.partition("=")
        flags[key] = value
    return flags


def _mount_source(deployment, path):
    """The volume (Secret or ConfigMap name) and key a file path inside the container comes from."""
    spec = deployment["spec"]["template"]["spec"]
    for mount in _container(deployment).get("volumeMounts", []):
        prefix = mount["mountPath"].rstrip("/") + "/"
        if path.startswith(prefix):
            volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
            return volume, path[len(prefix):]
    return None, None


def check_workloads(docs, namespace, services_by_name):
    problems = []
    for comp, subcommand in (("operator", "operator"), ("webhook", "webhook")):
        deployment = one(docs, "Deployment", comp)
        name = deployment["metadata"]["name"]
        container = _container(deployment)
        flags = _flags(container)
        if container["args"][0] != subcommand:
            problems.append(f"{name}: runs `{container['args'][0]}`, not `{subcommand}`")
        expected = {"--namespace": "$(POD_NAMESPACE)", "--listen": "0.0.0.0:8443",
                    "--admin": "0.0.0.0:9090"}
        for flag, value in expected.items():
            if flags.get(flag) != value:
                problems.append(f"{name}: {flag} is {flags.get(flag)!r}, not {value!r}")
        env = {e["name"]: e for e in container.get("env", [])}
        if env.get("POD_NAMESPACE", {}).get("valueFrom", {}).get("fieldRef", {}).get(
                "fieldPath") != "metadata.namespace":
            problems.append(f"{name}: POD_NAMESPACE does not come from the downward API")
        for flag in ("--tls-cert", "--tls-key", "--config"):
            volume, key = _mount_source(deployment, flags.get(flag, ""))
            if volume is None:
                problems.append(f"{name}: {flag} {flags.get(flag)} is not in a mounted volume")
            elif flag == "--config":
                cm = next((c for c in of_kind(docs, "ConfigMap")
                           if c["metadata"]["name"] == volume["configMap"]["name"]), None)
                if cm is None or key not in cm["data"]:
                    problems.append(f"{name}: --config {key} is not in a rendered ConfigMap")
            elif "secret" not in volume:
                problems.append(f"{name}: {flag} is not mounted from a Secret")
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        if ports.get("admin") != 9090 or 8443 not in ports.values():
            problems.append(f"{name}: container ports {ports}")
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            get = container.get(probe, {}).get("httpGet", {})
            if get.get("path") != path or get.get("port") not in ("admin", 9090):
                problems.append(f"{name}: {probe} is not GET {path} on the admin port")
        if deployment["spec"]["replicas"] < 2:
            problems.append(f"{name}: fewer than two replicas")
        if deployment["spec"]["selector"]["matchLabels"].items() - pod_labels(deployment).items():
            problems.append(f"{name}: selector does not match its own pods")
    # Services route to exactly one component, through ports its container declares.
    deployments = of_kind(docs, "Deployment")
    for service in services_by_name.values():
        targets = [d for d in deployments
                   if selector_matches({"matchLabels": service["spec"]["selector"]},
                                       pod_labels(d))]
        if len(targets) != 1:
            problems.append(f"Service {service['metadata']['name']} selects {len(targets)} "
                            "Deployments")
            continue
        names = {p["name"] for p in _container(targets[0])["ports"]}
        for port in service["spec"]["ports"]:
            if port["targetPort"] not in names:
                problems.append(f"Service {service['metadata']['name']}: targetPort "
                                f"{port['targetPort']} is not a container port")
    # The webhook survives a node drain and a node loss.
    webhook = one(docs, "Deployment", "webhook")
    pdb = one(docs, "PodDisruptionBudget", "webhook")
    if not selector_matches(pdb["spec"]["selector"], pod_labels(webhook)):
        problems.append("the webhook's PodDisruptionBudget does not select its pods")
    anti = webhook["spec"]["template"]["spec"].get("affinity", {}).get("podAntiAffinity", {})
    terms = [t.get("podAffinityTerm", t) for key in anti for t in anti[key]]
    if not any(t["topologyKey"] == "kubernetes.io/hostname"
               and selector_matches(t["labelSelector"], pod_labels(webhook)) for t in terms):
        problems.append("the webhook pods have no anti-affinity over nodes")
    return problems


def check_webhook_configurations(docs, namespace, services_by_name, excluded=(), scope="optedIn"):
    problems = []
    mutating = one(docs, "MutatingWebhookConfiguration")
    validating = one(docs, "ValidatingWebhookConfiguration")
    lifeguard_pods = [pod_labels(d) for d in of_kind(docs, "Deployment")]
    for config, path in ((mutating, "/inject"), (validating, "/validate")):
        for hook in config["webhooks"]:
            where = f"{config['kind']} {hook['name']}"
            checks = {"failurePolicy": "Fail", "sideEffects": "None",
                      "admissionReviewVersions": ["v1"]}
            for key, value in checks.items():
                if hook.get(key) != value:
                    problems.append(f"{where}: {key} is {hook.get(key)!r}, not {value!r}")
            if not 1 <= hook.get("timeoutSeconds", 0) <= 30:
                problems.append(f"{where}: timeoutSeconds {hook.get('timeoutSeconds')}")
            ns_selector = hook.get("namespaceSelector") or {}
            for ns in ("kube-system", namespace, *excluded):
                if selector_matches(ns_selector, {"kubernetes.io/metadata.name": ns}):
                    problems.append(f"{where}: namespace {ns} is not excluded")
            service = hook["clientConfig"]["service"]
            target = services_by_name.get(service["name"])
            if (service["namespace"] != namespace or service.get("path") != path or target is None
                    or service.get("port") not in [p["port"] for p in target["spec"]["ports"]]
                    or component(target) != "webhook"):
                problems.append(f"{where}: clientConfig {service} is not the webhook Service")
    # Which entries a pod reaches: an opted-in pod reaches exactly one, Lifeguard's own pods none,
    # a pod that did not opt in none (optedIn scope) or one (all).
    opted_in_ns = {"kubernetes.io/metadata.name": "team-a", "lifeguard.dev/inject": "enabled"}
    plain_ns = {"kubernetes.io/metadata.name": "team-b"}
    cases = [
        ("pod of an opted-in namespace", opted_in_ns, {"app": "reports"}, 1),
        ("opted-in pod of another namespace", plain_ns,
         {"app": "reports", "lifeguard.dev/inject": "enabled"}, 1),
        ("opted-out pod of an opted-in namespace", opted_in_ns,
         {"app": "reports", "lifeguard.dev/inject": "disabled"}, 1),
        ("pod that did not opt in", plain_ns, {"app": "reports"}, 1 if scope == "all" else 0),
    ] + [("Lifeguard's own pod", {"kubernetes.io/metadata.name": namespace}, labels, 0)
         for labels in lifeguard_pods] + [
        # The part-of label is the pod's claim, not a pass: a workload wearing it is still sent.
        ("workload labelled part-of=lifeguard", opted_in_ns,
         {"app": "reports", PART_OF: "lifeguard"}, 1),
    ]
    for what, ns_labels, labels, expected in cases:
        reached = [h["name"] for h in mutating["webhooks"]
                   if selector_matches(h.get("namespaceSelector") or {}, ns_labels)
                   and selector_matches(h.get("objectSelector") or {}, labels)]
        if len(reached) != expected:
            problems.append(f"inject webhooks reached by a {what}: {reached} (expected {expected})")
    for hook in validating["webhooks"]:
        if not selector_matches(hook.get("namespaceSelector") or {}, plain_ns):
            problems.append(f"validate webhook excludes an ordinary namespace")
    for hook in mutating["webhooks"]:
        rules = [(tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r["operations"]))
                 for r in hook["rules"]]
        if rules != [(("",), ("pods",), ("CREATE",))]:
            problems.append(f"inject webhook rules {rules}: expected pods CREATE only")
        if hook.get("reinvocationPolicy") != "Never":
            problems.append("inject webhook: reinvocationPolicy is not Never")
    covered = set()
    for hook in validating["webhooks"]:
        for r in hook["rules"]:
            if r["apiGroups"] == ["lifeguard.dev"] and set(r["operations"]) == {"CREATE", "UPDATE"}:
                covered |= set(r["resources"])
    if covered != {"mcpserverpolicies", "capabilityexceptions", "principalrevocations"}:
        problems.append(f"validate webhook covers {sorted(covered)}")
    return problems


def _config(docs, comp, key):
    return yaml.safe_load(one(docs, "ConfigMap", comp)["data"][key])


def check_configs(docs, namespace, services_by_name):
    problems = []
    operator = _config(docs, "operator", "operator.yaml")
    webhook = _config(docs, "webhook", "webhook.yaml")
    if set(operator) - OPERATOR_CONFIG_KEYS:
        problems.append(f"operator config has unknown keys {set(operator) - OPERATOR_CONFIG_KEYS}")
    if set(webhook) != set(WEBHOOK_CONFIG_KEYS):
        problems.append(f"webhook config keys {sorted(webhook)}")
    for section, keys in WEBHOOK_CONFIG_KEYS.items():
        if set(webhook.get(section, {})) != keys:
            problems.append(f"webhook config {section}: keys {sorted(webhook.get(section, {}))}")
    if not 600 <= webhook["sidecar"]["tokenExpirationSeconds"] <= 3600:
        problems.append("sidecar.tokenExpirationSeconds outside 600..3600")
    operator_service = one(docs, "Service", "operator")
    url = f"https://{operator_service['metadata']['name']}.{namespace}.svc:8443"
    if webhook["controlPlane"]["url"] != url:
        problems.append(f"controlPlane.url {webhook['controlPlane']['url']}, expected {url}")
    if 8443 not in [p["port"] for p in operator_service["spec"]["ports"]]:
        problems.append("the operator Service does not serve 8443")
    distribution = operator["caDistribution"]
    if distribution["configMap"] != webhook["controlPlane"]["caConfigMap"]:
        problems.append("the operator distributes a different CA ConfigMap than sidecars mount")
    if operator["approverKeys"] != webhook["approverKeys"]:
        problems.append("operator and webhook read different approver keys")
    volume, _ = _mount_source(one(docs, "Deployment", "operator"), "/etc/lifeguard/tls/tls.crt")
    if volume["secret"]["secretName"] != distribution["secretName"] or \
            distribution["secretKey"] != "ca.crt":
        problems.append("caDistribution does not read ca.crt of the operator's serving Secret")
    return problems


def _load_cert(b64):
    return x509.load_pem_x509_certificate(base64.b64decode(b64))


def check_certificates(docs, namespace, mode, values):
    problems = []
    mutating = one(docs, "MutatingWebhookConfiguration")
    validating = one(docs, "ValidatingWebhookConfiguration")
    bundles = [h["clientConfig"].get("caBundle") for c in (mutating, validating)
               for h in c["webhooks"]]
    secrets = {s["metadata"]["name"]: s for s in of_kind(docs, "Secret")}
    mounted = {comp: _mount_source(one(docs, "Deployment", comp),
                                   "/etc/lifeguard/tls/tls.crt")[0]["secret"]["secretName"]
               for comp in ("operator", "webhook")}
    if mode == "generated":
        ca = None
        for comp, name in mounted.items():
            secret = secrets.get(name)
            if secret is None or secret["type"] != "kubernetes.io/tls":
                problems.append(f"no TLS Secret {name} for the {comp}")
                continue
            data = secret["data"]
            ca = _load_cert(data["ca.crt"])
            cert = _load_cert(data["tls.crt"])
            key = serialization.load_pem_private_key(base64.b64decode(data["tls.key"]), None)
            cert.verify_directly_issued_by(ca)
            if key.public_key().public_numbers() != cert.public_key().public_numbers():
                problems.append(f"{name}: tls.key does not match tls.crt")
            service = one(docs, "Service", comp)["metadata"]["name"]
            dns = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            if f"{service}.{namespace}.svc" not in dns.get_values_for_type(x509.DNSName):
                problems.append(f"{name}: not valid for {service}.{namespace}.svc")
            usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
            if ExtendedKeyUsageOID.SERVER_AUTH not in usage:
                problems.append(f"{name}: not a server certificate")
            if cert.not_valid_after_utc < datetime.datetime.now(datetime.UTC) + \
                    datetime.timedelta(days=365):
                problems.append(f"{name}: expires within a year")
        if len({secrets[n]["data"]["ca.crt"] for n in mounted.values() if n in secrets}) != 1:
            problems.append("the operator and webhook certificates have different CAs")
        webhook_ca = secrets.get(mounted["webhook"], {}).get("data", {}).get("ca.crt")
        if any(b != webhook_ca for b in bundles):
            problems.append("a webhook configuration's caBundle is not the webhook Secret's ca.crt")
    elif mode == "certManager":
        certificates = {c["spec"]["secretName"]: c for c in of_kind(docs, "Certificate")}
        for comp, name in mounted.items():
            cert = certificates.get(name)
            service = one(docs, "Service", comp)["metadata"]["name"]
            if cert is None:
                problems.append(f"no cert-manager Certificate writes {name}")
            elif f"{service}.{namespace}.svc" not in cert["spec"]["dnsNames"]:
                problems.append(f"Certificate for {name} lacks {service}.{namespace}.svc")
        if any(bundles):
            problems.append("certManager mode renders a caBundle that cert-manager would fight")
        webhook_certificate = certificates.get(mounted["webhook"], {}).get("metadata", {})
        for config in (mutating, validating):
            source = config["metadata"].get("annotations", {}).get("cert-manager.io/inject-ca-from")
            if source != f"{namespace}/{webhook_certificate.get('name')}":
                problems.append(f"{config['kind']}: inject-ca-from is {source!r}")
        issuers = {i["metadata"]["name"] for i in of_kind(docs, "Issuer")}
        for cert in certificates.values():
            ref = cert["spec"]["issuerRef"]
            if ref.get("kind", "Issuer") == "Issuer" and ref["name"] not in issuers and \
                    not values.get("certificates", {}).get("certManager", {}).get("issuerRef"):
                problems.append(f"Certificate {cert['metadata']['name']}: no Issuer {ref['name']}")
    elif mode == "existingSecret":
        given = values["certificates"]["existingSecret"]
        if secrets.keys() & {given["operatorSecretName"], given["webhookSecretName"]}:
            problems.append("existingSecret mode renders the Secrets it should only mount")
        if mounted != {"operator": given["operatorSecretName"],
                       "webhook": given["webhookSecretName"]}:
            problems.append(f"existingSecret mode mounts {mounted}")
        expected = base64.b64encode(given["caBundle"].encode()).decode()
        if any(b != expected for b in bundles):
            problems.append("caBundle is not the given PEM, base64-encoded")
    return problems
