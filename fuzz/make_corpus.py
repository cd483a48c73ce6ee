#!/usr/bin/env python3
"""Regenerates the seed corpora under fuzz/corpus/ from the project's test fixtures.

Each seed is named after the SHA-1 of its bytes (as libFuzzer names the inputs it keeps). The
seeds are committed; run this again after the fixtures change, then commit what it wrote.
Targets that take a mode byte (see each target's documentation) get seeds for every mode.
Inputs that found defects are kept apart, under corpus/TARGET/ as crash-*, and never removed.
"""

import base64
import glob
import hashlib
import json
import os
import re

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "fuzz", "corpus")
ISS = "https://idp.test"
AUD = "https://mcp.test/mcp"
NOW = 1_800_000_000
VERSION = "2026-07-28"


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def compact(value):
    return json.dumps(value, separators=(",", ":")).encode()


class Corpus:
    def __init__(self, target):
        self.dir = os.path.join(CORPUS, target)
        os.makedirs(self.dir, exist_ok=True)
        for name in os.listdir(self.dir):
            if not name.startswith("crash-"):
                os.remove(os.path.join(self.dir, name))

    def add(self, data):
        if isinstance(data, str):
            data = data.encode()
        name = hashlib.sha1(data).hexdigest()
        with open(os.path.join(self.dir, name), "wb") as f:
            f.write(data)


def jsonrpc_bodies():
    """JSON-RPC bodies written in the unit and integration tests."""
    found = set()
    for path in glob.glob(os.path.join(ROOT, "src/**/*.rs"), recursive=True) + glob.glob(
        os.path.join(ROOT, "tests/**/*.rs"), recursive=True
    ):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for match in re.finditer(r'r#"(\{"jsonrpc".*?)"#', text, re.S):
            found.add(match.group(1))
    return sorted(found)


def requests():
    """Requests of every kind the sidecar decides on."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientCapabilities": {
            "extensions": {"io.modelcontextprotocol/tasks": {}}
        },
    }
    out = [
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
         "params": {"name": "generate_report", "arguments": {"quarter": "Q3", "pages": 3, "draft": True},
                    "_meta": meta}},
        {"jsonrpc": "2.0", "id": "a", "method": "tasks/get", "params": {"taskId": "t-1", "_meta": meta}},
        {"jsonrpc": "2.0", "id": 2, "method": "tasks/cancel", "params": {"taskId": "rapport_été", "_meta": meta}},
        {"jsonrpc": "2.0", "id": 3, "method": "resources/read", "params": {"uri": "reports://team-a/q3", "_meta": meta}},
        {"jsonrpc": "2.0", "id": 4, "method": "subscriptions/listen",
         "params": {"notifications": {"toolsListChanged": True, "resourceSubscriptions": ["reports://a/x"],
                                      "taskIds": ["t-1"]}, "_meta": meta}},
        {"jsonrpc": "2.0", "id": 5.5, "method": "tools/list", "params": {"_meta": meta}},
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}},
    ]
    return out


def mirrored(value):
    if value and all(0x20 <= ord(c) < 0x7F for c in value) and value.strip(" ") == value \
            and not value.startswith("=?base64?"):
        return value
    return "=?base64?" + base64.b64encode(value.encode()).decode() + "?="


def headers_for(request):
    lines = [f"mcp-protocol-version: {VERSION}", f"mcp-method: {mirrored(request['method'])}"]
    params = request.get("params", {})
    name = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri", "tasks/get": "taskId",
            "tasks/update": "taskId", "tasks/cancel": "taskId"}.get(request["method"])
    if name and name in params:
        lines.append(f"mcp-name: {mirrored(params[name])}")
    for arg, value in params.get("arguments", {}).items():
        rendered = value if isinstance(value, str) else json.dumps(value)
        lines.append(f"mcp-param-{arg}: {mirrored(rendered)}")
    return "\n".join(lines)


def strict_json():
    c = Corpus("strict_json")
    for body in jsonrpc_bodies():
        c.add(body)
    for request in requests():
        c.add(compact(request))
    c.add('{"jsonrpc":"2.0","id":1,"method":"a","method":"b"}')
    c.add('{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"x"}')
    c.add('[{"jsonrpc":"2.0","id":1,"method":"x"}]')
    c.add('{"a":[1,-0,1e400,0.1,"\\ud83d\\ude00",{"b":{"b":null}}]}')
    c.add("[" * 130 + "]" * 130)


def mcp_headers():
    c = Corpus("mcp_headers")
    for i, request in enumerate(requests()):
        body = compact(request)
        c.add(bytes([i % 2]) + (headers_for(request) + "\n\n").encode() + body)
    c.add(b"\x00mcp-protocol-version: 2026-07-28\nmcp-method: =?base64?//4=?=\n\n"
          b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}')


def jwt():
    c = Corpus("jwt")
    claims = {"iss": ISS, "aud": AUD, "sub": "alice", "tid": "tenant-a", "client_id": "console",
              "scope": "reports:run reports:read", "iat": NOW - 10, "exp": NOW + 600}
    header = {"alg": "EdDSA", "typ": "JWT", "kid": "test-ed-1"}
    token = f"{b64url(compact(header))}.{b64url(compact(claims))}.{b64url(bytes(64))}"
    c.add(b"\x00Bearer " + token.encode())
    c.add(b"\x00bearer  " + token.encode() + b"  ")
    c.add(b"\x00Basic dXNlcjpwYXNz")
    c.add(b"\x01" + compact(header) + b"\x00" + compact(claims))
    c.add(b"\x01" + compact({"alg": "none"}) + b"\x00" + compact(claims))
    c.add(b"\x01" + compact({"alg": "HS256", "kid": "test-ed-1"}) + b"\x00" + compact(claims))
    c.add(b"\x02" + compact(claims))
    c.add(b"\x02" + compact(dict(claims, scope=["a", "b"], azp="console", client_id=None)))
    c.add(b"\x02" + compact(dict(claims, exp=NOW - 100)))
    c.add(b"\x02" + compact(dict(claims, nbf=NOW + 100, aud=[AUD, "x"])))


def proof_of_possession():
    from joserfc import jwt as jose_jwt
    from joserfc.jwk import ECKey
    c = Corpus("proof_of_possession")
    key = ECKey.import_key(read("tests/fixtures/keys/dpop-client-p256.pem"))
    token = "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJl"
    ath = b64url(hashlib.sha256(token.encode()).digest())
    header = {"typ": "dpop+jwt", "alg": "ES256", "jwk": key.as_dict(private=False)}
    claims = {"jti": "j-1", "htm": "POST", "htu": AUD, "iat": NOW, "ath": ath}
    c.add(b"\x00" + jose_jwt.encode(header, claims, key, algorithms=["ES256"]).encode())
    c.add(b"\x00" + jose_jwt.encode(dict(header, typ="JWT"), claims, key,
                                      algorithms=["ES256"]).encode())
    c.add(b"\x01" + compact(header) + b"\x00" + compact(claims))
    c.add(b"\x01" + compact(header) + b"\x00" + compact(dict(claims, htu=AUD + "?q#f")))
    c.add(b"\x01" + compact(dict(header, jwk=dict(header["jwk"], d="AAAA"))) + b"\x00"
          + compact(claims))
    c.add(b"\x01" + compact(header) + b"\x00" + compact(dict(claims, iat=NOW - 301)))
    c.add(b"\x02By=spiffe://cluster.local/ns/a/sa/b;Hash=" + b"ab" * 32
          + b";Subject=\"CN=x,O=a;b\";URI=spiffe://cluster.local/ns/c/sa/d")
    c.add(b"\x02Hash=" + b"ab" * 32 + b",Hash=" + b"cd" * 32)
    c.add(b"\x02-----BEGIN%20CERTIFICATE-----%0AMIIB%0A-----END%20CERTIFICATE-----%0A")


SUBJECTS = [
    {"format": "iss_sub", "iss": ISS, "sub": "alice"},
    {"format": "email", "email": "alice@example.com"},
    {"format": "opaque", "id": "u-1"},
    {"format": "account", "uri": "acct:alice@example.com"},
    {"format": "phone_number", "phone_number": "+15555550100"},
    {"format": "did", "url": "did:example:123"},
    {"format": "uri", "uri": "https://example.com/alice"},
    {"format": "aliases", "identifiers": [{"format": "email", "email": "a@example.com"},
                                          {"format": "iss_sub", "iss": ISS, "sub": "alice"}]},
    {"format": "complex", "user": {"format": "iss_sub", "iss": ISS, "sub": "alice"},
     "tenant": {"format": "opaque", "id": "tenant-a"}},
    {"subject_type": "email", "email": "legacy@example.com"},
]
CAEP = "https://schemas.openid.net/secevent/caep/event-type/"
RISC = "https://schemas.openid.net/secevent/risc/event-type/"
SSF = "https://schemas.openid.net/secevent/ssf/event-type/"
EVENTS = [
    {CAEP + "session-revoked": {"event_timestamp": NOW - 60, "initiating_entity": "policy"}},
    {CAEP + "credential-change": {"change_type": "update", "credential_type": "password"}},
    {RISC + "account-disabled": {"reason": "hijacking"}, RISC + "account-purged": {}},
    {RISC + "account-enabled": {}},
    {SSF + "verification": {"state": "abc"}},
]


def ssf_set():
    c = Corpus("ssf_set")
    ssf_aud = AUD
    for i, subject in enumerate(SUBJECTS):
        events = EVENTS[i % len(EVENTS)]
        claims = {"iss": ISS, "aud": ssf_aud, "iat": NOW - 10, "jti": f"jti-{i}", "txn": "txn-1",
                  "sub_id": subject, "events": events}
        c.add(b"\x01" + compact(claims))
        c.add(b"\x02" + compact(subject))
        header = {"alg": "EdDSA", "typ": "secevent+jwt", "kid": "test-ed-1"}
        c.add(b"\x00" + f"{b64url(compact(header))}.{b64url(compact(claims))}.{b64url(bytes(64))}".encode())
    c.add(b"\x00" + f"{b64url(compact({'alg': 'none', 'typ': 'secevent+jwt'}))}.e30.".encode())


def exception_jws():
    c = Corpus("exception_jws")
    for path in sorted(glob.glob(os.path.join(ROOT, "examples/policies/*/*.yaml"))):
        try:
            docs = list(yaml.safe_load_all(open(path, encoding="utf-8")))
        except yaml.YAMLError:
            continue
        for doc in docs:
            if isinstance(doc, dict) and doc.get("kind") == "CapabilityException":
                spec = doc.get("spec", {})
                c.add(b"\x01" + json.dumps(spec, default=str).encode())
                if isinstance(spec.get("signature"), str):
                    c.add(b"\x00" + spec["signature"].encode())
    header = {"alg": "EdDSA", "kid": "test-ed-1", "lifeguard.dev/binding": "team-a/reports",
              "typ": "lifeguard-exception+jws"}
    c.add(b"\x00" + f"{b64url(compact(header))}..{b64url(bytes(64))}".encode())
    c.add(b"\x00" + f"{b64url(compact(dict(header, crit=['b64'])))}.e30.{b64url(bytes(64))}".encode())
    c.add(b"\x02" + read("tests/fixtures/keys/issuer-jwks.json").encode())
    c.add(b"\x02" + compact({"keys": [], "revokedKeys": ["k"], "revokedApprovals": ["CHG-1"]}))


def policy_compile():
    c = Corpus("policy_compile")
    for path in sorted(glob.glob(os.path.join(ROOT, "examples/policies/*/*.yaml"))):
        c.add(read(os.path.relpath(path, ROOT)))
    c.add(read("examples/install/policy.yaml"))
    c.add(read("tests/fixtures/injection/policies.yaml"))


def listen_uri():
    c = Corpus("listen_uri")
    cases = [
        ("reports://{tenant}/*", "reports://acme/q3", "alice", "acme", "console"),
        ("files://{tenant}/{subject}/*", "files://acme/alice@example.com/a.txt", "alice@example.com", "acme", ""),
        ("apps://{client}", "apps://console", "alice", "acme", "console"),
        ("reports://team-a/*", "reports://team-a-other/q3", "", "", ""),
        ("a*b*c**d", "aXbYcZZd", "", "", ""),
        ("reports://{tenant}/*", "reports://a*/q3", "alice", "a*", "c"),
        ("x://*/*/*/*/*/*/*/*/y", "x://" + "a/" * 40 + "z", "", "", ""),
    ]
    for case in cases:
        c.add(b"\x00" + "\x00".join(case).encode())
    c.add(b"\x01" + compact({"toolsListChanged": True, "resourceSubscriptions": ["reports://a/x"],
                               "taskIds": ["t-1", "t-2"]}))
    c.add(b"\x01" + compact({"resourceSubscriptions": ["reports://a/../b/x"]}))
    c.add(b"\x01" + compact({"promptsListChanged": False, "resourcesListChanged": True}))


def upstream_sse():
    c = Corpus("upstream_sse")
    response = compact({"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": "ok"}]}})
    progress = compact({"jsonrpc": "2.0", "method": "notifications/progress",
                        "params": {"progressToken": 1, "progress": 0.5}})
    c.add(b"\x05event: message\ndata: " + progress + b"\n\nevent: message\ndata: " + response + b"\n\n")
    c.add(b"\x11id: 7\r\nretry: 100\r\ndata: " + response + b"\r\n\r\n")
    c.add(b"\x2a: comment\rdata: {\rdata: \"a\":1}\r\r")
    c.add(b"\x07data: \xff\n\n")
    c.add(b"\x00data: " + response)


def admission_review():
    c = Corpus("admission_review")

    def review(kind, group, resource, namespace, obj, operation="CREATE", old=None):
        return compact({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": group, "version": "v1" if not group else "v1alpha1", "kind": kind},
                "resource": {"group": group, "version": "v1", "resource": resource},
                "namespace": namespace, "operation": operation,
                "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
                "object": obj, "oldObject": old, "dryRun": False,
            }})

    for path in sorted(glob.glob(os.path.join(ROOT, "tests/fixtures/injection/cases/*.yaml"))):
        case = yaml.safe_load(open(path, encoding="utf-8"))
        c.add(review("Pod", "", "pods", case["namespace"], case["pod"]))
    for path in ["examples/policies/valid/mcpserverpolicy.yaml", "examples/policies/valid/capabilityexception.yaml",
                 "examples/policies/valid/principalrevocation.yaml"]:
        for doc in yaml.safe_load_all(read(path)):
            if isinstance(doc, dict):
                doc = json.loads(json.dumps(doc, default=str))
                namespace = doc.get("metadata", {}).get("namespace", "team-a")
                plural = doc["kind"].lower() + "s"
                c.add(review(doc["kind"], "lifeguard.dev", plural, namespace, doc))
                c.add(review(doc["kind"], "lifeguard.dev", plural, namespace, doc, "UPDATE", doc))
    c.add(compact({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}))


if __name__ == "__main__":
    for make in [strict_json, mcp_headers, jwt, ssf_set, exception_jws, policy_compile, listen_uri,
                 upstream_sse, admission_review, proof_of_possession]:
        make()
