"""A DPoP client (RFC 9449) for the black-box tests of Lifeguard's proof-of-possession checks.

It holds a P-256 key made with joserfc, makes every proof with joserfc as RFC 9449 section 4.2
describes, and sends MCP requests over HTTP itself (urllib), retrying once with the server's
nonce when a response asks for one (`use_dpop_nonce`, section 8). Attacks are requests it is
told to make wrongly: a proof for another method or URI, the hash of another token, a proof
sent twice, the token shown as a bearer token.

The test drives it with one JSON command per line on stdin and reads one JSON answer per line
on stdout:

  {"op": "key"}
      -> {"jkt": <RFC 7638 thumbprint>, "jwk": <public JWK>}
  {"op": "call", "url": URL, "token": T, "method": M, "params": {...},
   "scheme": "DPoP"|"Bearer", "proof": {"htm":..., "htu":..., "ath_of":..., "iat_offset": s,
   "jti":..., "nonce":...} | null (no DPoP header) | omitted (a proper proof),
   "replay": PROOF (send this proof instead of a new one), "retry_nonce": true|false}
      -> {"status": int, "headers": {lower-case name: value}, "body": JSON or text,
          "proof": the last proof sent, "attempts": 1 or 2}
"""

import json
import secrets
import sys
import time
import urllib.error
import urllib.request
from base64 import urlsafe_b64encode
from hashlib import sha256

from joserfc import jwt
from joserfc.jwk import ECKey

PROTOCOL_VERSION = "2026-07-28"


def b64url(data: bytes) -> str:
    return urlsafe_b64encode(data).rstrip(b"=").decode()


class Client:
    def __init__(self):
        self.key = ECKey.generate_key("P-256", private=True)
        self.nonce = None

    def public_jwk(self):
        return self.key.as_dict(private=False)

    def proof(self, htm, htu, token, overrides):
        claims = {
            "jti": overrides.get("jti") or b64url(secrets.token_bytes(16)),
            "htm": overrides.get("htm", htm),
            "htu": overrides.get("htu", htu),
            "iat": int(time.time()) + int(overrides.get("iat_offset", 0)),
        }
        ath_of = overrides.get("ath_of", token)
        if ath_of is not None:
            claims["ath"] = b64url(sha256(ath_of.encode("ascii")).digest())
        nonce = overrides.get("nonce", self.nonce)
        if nonce is not None:
            claims["nonce"] = nonce
        header = {"typ": "dpop+jwt", "alg": "ES256", "jwk": self.public_jwk()}
        return jwt.encode(header, claims, self.key, algorithms=["ES256"])

    def call(self, command):
        url = command["url"]
        method = command["method"]
        params = dict(command.get("params") or {})
        params.setdefault("_meta", {
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {
                "io.modelcontextprotocol/tasks": {}}},
            "io.modelcontextprotocol/protocolVersion": PROTOCOL_VERSION,
        })
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method,
                           "params": params}).encode()
        headers = {
            "content-type": "application/json",
            "accept": "application/json",
            "mcp-protocol-version": PROTOCOL_VERSION,
            "mcp-method": method,
        }
        name = params.get("name") or params.get("taskId")
        if name:
            headers["mcp-name"] = name
        token = command["token"]
        headers["authorization"] = f"{command.get('scheme', 'DPoP')} {token}"
        attempts = 0
        while True:
            attempts += 1
            proof = None
            if "replay" in command:
                proof = command["replay"]
            elif command.get("proof", {}) is not None:
                proof = self.proof("POST", url, token, command.get("proof") or {})
            if proof is not None:
                headers["dpop"] = proof
            else:
                headers.pop("dpop", None)
            status, response_headers, text = send(url, body, headers)
            if "dpop-nonce" in response_headers:
                self.nonce = response_headers["dpop-nonce"]
            challenge = response_headers.get("www-authenticate", "")
            if (status == 401 and 'error="use_dpop_nonce"' in challenge
                    and command.get("retry_nonce", True) and attempts == 1
                    and "replay" not in command):
                continue
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = text
            return {"status": status, "headers": response_headers, "body": parsed,
                    "proof": proof, "attempts": attempts}


def send(url, body, headers):
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, lower(response.headers), response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, lower(error.headers), error.read().decode()


def lower(headers):
    merged = {}
    for name, value in headers.items():
        name = name.lower()
        merged[name] = f"{merged[name]}, {value}" if name in merged else value
    return merged


def main():
    client = Client()
    for line in sys.stdin:
        command = json.loads(line)
        if command["op"] == "key":
            answer = {"jkt": client.key.thumbprint(), "jwk": client.public_jwk()}
        elif command["op"] == "call":
            answer = client.call(command)
        else:
            answer = {"error": f"unknown op {command['op']}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
