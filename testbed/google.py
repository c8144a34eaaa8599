"""Google's half of a fleet's short-lived credentials, played on the tier.

On GKE, the manager's renewer asks the metadata server (Workload Identity) for its Google service account's access
token, and each member's API server accepts that token as the user named by the account's email. Here:
- `metadata` answers the metadata server's token request (GCE_METADATA_HOST points the renewer at it) with a JWT
  that expires after `lifetime` seconds, minted again once the last has lived half its life, as GKE's metadata
  server hands out a fresh token before the old one expires;
- `issuer` is an OpenID issuer over HTTPS (discovery and keys) that every member's kube-apiserver trusts through a
  structured AuthenticationConfiguration, mapping the token's `email` claim to the user name: the identity a GKE
  API server gives a Google service account, judged by the member's real RBAC, with real expiry.
Ref: https://kubernetes.io/docs/reference/access-authn-authz/authentication/#using-authentication-configuration
"""

from __future__ import annotations

import base64
import http.server
import json
import ssl
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from testbed import pki

AUDIENCE = "tpu-fallback-tier-members"
KEY_ID = "tier-google"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass
class Minted:
    token: str
    issued: float  # time.time()
    expires: float


@dataclass
class FakeGoogle:
    """`start()`, then `authentication_config()` for each member's kube-apiserver; `email` is the identity the
    metadata server speaks for (the fleet plan's manager service account)."""

    workdir: Path
    lifetime: float = 60.0
    email: str = ""
    minted: list[Minted] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.authority = pki.Authority(self.workdir / "pki")
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self._lock = threading.Lock()
        self._servers: list[http.server.ThreadingHTTPServer] = []

    # ---- serving ---------------------------------------------------------------------------------------------
    def start(self) -> FakeGoogle:
        self._issuer = self._serve(self._issuer_handler(), tls=True)
        self._metadata = self._serve(self._metadata_handler(), tls=False)
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()

    @property
    def issuer_url(self) -> str:
        return f"https://127.0.0.1:{self._issuer.server_port}"

    @property
    def metadata_host(self) -> str:
        """What GCE_METADATA_HOST is set to for the renewer."""
        return f"127.0.0.1:{self._metadata.server_port}"

    def _serve(self, handler: type, tls: bool) -> http.server.ThreadingHTTPServer:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        if tls:
            pair = self.authority.serving("issuer")
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(pair.cert, pair.key)
            server.socket = context.wrap_socket(server.socket, server_side=True)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True, name="fake-google").start()
        self._servers.append(server)
        return server

    def _issuer_handler(self) -> type:
        google = self

        class Issuer(JsonHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                if self.path == "/.well-known/openid-configuration":
                    self._json({"issuer": google.issuer_url, "jwks_uri": f"{google.issuer_url}/keys",
                                "id_token_signing_alg_values_supported": ["RS256"]})
                elif self.path == "/keys":
                    numbers = google._key.public_key().public_numbers()
                    self._json({"keys": [{"kty": "RSA", "alg": "RS256", "use": "sig", "kid": KEY_ID,
                                          "n": _b64(numbers.n.to_bytes((numbers.n.bit_length() + 7) // 8, "big")),
                                          "e": _b64(numbers.e.to_bytes(3, "big"))}]})
                else:
                    self.send_error(404)
        return Issuer

    def _metadata_handler(self) -> type:
        google = self

        class Metadata(JsonHandler):
            def do_GET(self):  # noqa: N802
                if self.headers.get("Metadata-Flavor") != "Google":
                    self.send_error(403, "Missing Metadata-Flavor:Google header")
                elif self.path.split("?")[0] == "/computeMetadata/v1/instance/service-accounts/default/token":
                    minted = google.current()
                    self._json({"access_token": minted.token, "token_type": "Bearer",
                                "expires_in": max(0, int(minted.expires - time.time()))})
                else:
                    self.send_error(404)
        return Metadata

    # ---- tokens ------------------------------------------------------------------------------------------------
    def current(self) -> Minted:
        """The token the metadata server hands out now: a new one once the last has lived half its life."""
        with self._lock:
            now = time.time()
            if not self.minted or now - self.minted[-1].issued >= self.lifetime / 2:
                self.minted.append(Minted(self.mint(now), now, now + self.lifetime))
            return self.minted[-1]

    def mint(self, now: float) -> str:
        if not self.email:
            raise ValueError("FakeGoogle.email is not set: the identity the metadata server speaks for")
        header = {"alg": "RS256", "typ": "JWT", "kid": KEY_ID}
        claims = {"iss": self.issuer_url, "aud": AUDIENCE, "sub": str(uuid.uuid4().int)[:21], "email": self.email,
                  "email_verified": True, "iat": int(now), "nbf": int(now) - 5, "exp": int(now + self.lifetime)}
        signing = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
        signature = self._key.sign(signing.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing}.{_b64(signature)}"

    # ---- the members' side -------------------------------------------------------------------------------------
    def authentication_config(self, folder: Path) -> Path:
        """An AuthenticationConfiguration file for a member's kube-apiserver: this issuer, user = the email."""
        path = folder / "authentication-config.yaml"
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump({
            "apiVersion": "apiserver.config.k8s.io/v1", "kind": "AuthenticationConfiguration",
            "jwt": [{"issuer": {"url": self.issuer_url, "audiences": [AUDIENCE],
                                "certificateAuthority": self.authority.cert_pem.decode()},
                     "claimMappings": {"username": {"claim": "email", "prefix": ""}}}]}))
        return path

    def expired(self, at: float | None = None) -> list[Minted]:
        at = time.time() if at is None else at
        return [m for m in self.minted if m.expires <= at]


class JsonHandler(http.server.BaseHTTPRequestHandler):
    """A handler that answers JSON and logs nothing (the tier's fake servers; tests/test_failover_informer.py)."""

    def _json(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass
