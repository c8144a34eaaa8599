"""The fleet's credentials renewer, on a fleet's manager cluster: short-lived tokens for MultiKueue, never a key.

Kueue 0.19.2's MultiKueue reaches a member only through a kubeconfig Secret with an inline token or client
certificate (no exec plugin, no token file: multikueuecluster.go L958-1040), and rebuilds its client when that
Secret changes (its Secret watch, multikueuecluster.go L1261; updateConfigAndRefreshWatchers L301). So this loop
keeps each member's Secret holding a token that expires within the hour, and writes the next one while the last
one is still valid, so the manager never sees a gap:

- the token is the manager's Google service account's OAuth access token (one hour), which GKE's metadata server
  hands to this Pod through Workload Identity; every member's API server accepts it (Google authentication) and
  its RBAC grants that identity exactly what MultiKueue does in a worker (infra/fleet_member.py manager_rules);
- a Secret is rewritten only when its kubeconfig would change: a new token, or a member's server or CA;
- the next check comes before the token has lived half its life (GKE's metadata server hands out a fresh token
  well before the old one expires), and at least every CHECK_SECONDS.

    python -m failover.credentials   # FLEET_ACCESS ({member: {secret, server, certificateAuthorityData}}),
                                     # FLEET_SECRETS_NAMESPACE, GCE_METADATA_HOST (as google-auth reads it)
"""

from __future__ import annotations

import base64
import datetime
import json
import logging
import os
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

log = logging.getLogger("tpu-fallback.credentials")

# GKE's metadata server, as google-auth finds it (GCE_METADATA_HOST overrides it, as there).
# Ref: https://cloud.google.com/compute/docs/access/authenticate-workloads#applications
METADATA_HOST = "metadata.google.internal"
TOKEN_PATH = "/computeMetadata/v1/instance/service-accounts/default/token"
CHECK_SECONDS = 300.0  # the longest between two checks, whatever the token's lifetime
MIN_CHECK_SECONDS = 1.0
RETRY_SECONDS = (2.0, 5.0, 15.0, 30.0, 60.0)  # after a failed renewal: the old token still has time left
KUBECONFIG_KEY = "kubeconfig"  # the key MultiKueue reads (MultiKueueConfigSecretKey)


@dataclass(frozen=True)
class Token:
    value: str
    expires: datetime.datetime

    def left(self, now: datetime.datetime) -> float:
        return (self.expires - now).total_seconds()


@dataclass(frozen=True)
class MemberAccess:
    """Where a member's API server is, and the Secret on the manager that MultiKueue reads for it."""

    secret: str
    server: str
    certificate_authority_data: str  # base64 PEM, as in a kubeconfig


def inline_kubeconfig(name: str, server: str, ca_data: str, token: str | None) -> str:
    """A kubeconfig that MultiKueue accepts: inline CA data and token (no user before the first token). Kueue 0.19.2
    refuses exec plugins (GKE's gke-gcloud-auth-plugin), token files, CA file paths and insecure-skip-tls-verify.
    Ref: kueue v0.19.2 pkg/controller/admissionchecks/multikueue/multikueuecluster.go L958-1040"""
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority-data": ca_data}}],
        "users": [{"name": name, "user": {"token": token} if token else {}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
    }, sort_keys=False)


class MetadataTokenSource:
    """The access token of the Pod's Google service account, from GKE's metadata server (Workload Identity)."""

    def __init__(self, host: str | None = None, clock: Callable[[], datetime.datetime] | None = None):
        self.url = f"http://{host or os.environ.get('GCE_METADATA_HOST') or METADATA_HOST}{TOKEN_PATH}"
        self.clock = clock or _now

    def token(self) -> Token:
        request = urllib.request.Request(self.url, headers={"Metadata-Flavor": "Google"})
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - a fixed http URL
            body = json.loads(response.read())
        return Token(body["access_token"], self.clock() + datetime.timedelta(seconds=int(body["expires_in"])))


class Renewer:
    """`renew()` once: every member's Secret holds the current token; returns the seconds until the next check."""

    def __init__(self, core: client.CoreV1Api, members: Mapping[str, MemberAccess], namespace: str,
                 source: MetadataTokenSource, clock: Callable[[], datetime.datetime] | None = None):
        self.core, self.members, self.namespace, self.source = core, dict(members), namespace, source
        self.clock = clock or _now
        self.written: dict[str, str] = {}  # member -> the kubeconfig last seen in its Secret

    def renew(self) -> float:
        token = self.source.token()
        now = self.clock()
        if token.left(now) <= 0:
            raise ValueError(f"the token source gave a token that expired at {token.expires.isoformat()}")
        for member, access in self.members.items():
            self._write(member, access, token)
        return max(MIN_CHECK_SECONDS, min(CHECK_SECONDS, token.left(now) / 2))

    def _write(self, member: str, access: MemberAccess, token: Token) -> None:
        wanted = inline_kubeconfig(member, access.server, access.certificate_authority_data, token.value)
        if self.written.get(member) == wanted:
            return
        secret = self.core.read_namespaced_secret(access.secret, self.namespace)
        current = base64.b64decode((secret.data or {}).get(KUBECONFIG_KEY, "")).decode()
        if current != wanted:
            # Guarded by resourceVersion: a concurrent writer (a second replica in a rollout) makes this a 409, and
            # the next check writes again.
            self.core.patch_namespaced_secret(access.secret, self.namespace, {
                "metadata": {"resourceVersion": secret.metadata.resource_version},
                "data": {KUBECONFIG_KEY: base64.b64encode(wanted.encode()).decode()}})
            log.info("member %s: token renewed in %s/%s, valid until %s", member, self.namespace, access.secret,
                     token.expires.isoformat(timespec="seconds"))
        self.written[member] = wanted


def members_from_env(text: str) -> dict[str, MemberAccess]:
    return {member: MemberAccess(access["secret"], access["server"], access["certificateAuthorityData"])
            for member, access in json.loads(text).items()}


def run(renewer: Renewer, sleep: Callable[[float], None] = time.sleep) -> None:
    failures = 0
    while True:
        try:
            wait = renewer.renew()
            failures = 0
        except (ApiException, OSError, ValueError, KeyError) as error:
            wait = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
            failures += 1
            log.warning("renewal failed (%d in a row), again in %.0f s: %s", failures, wait,
                        str(error).splitlines()[0][:300])
        sleep(wait)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def main() -> int:
    from failover.__main__ import api_client  # the same credentials rule as the failover controller

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    members = members_from_env(os.environ["FLEET_ACCESS"])
    namespace = os.environ.get("FLEET_SECRETS_NAMESPACE", "kueue-system")
    renewer = Renewer(client.CoreV1Api(api_client()), members, namespace, MetadataTokenSource())
    log.info("renewing the manager's tokens for %s from %s", ", ".join(members), renewer.source.url)
    run(renewer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
