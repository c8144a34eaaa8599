"""Short-lived tokens kept in the Secrets that need one, renewed before they expire: no long-lived credential.

1. A fleet's manager (FLEET_ACCESS set): the manager's tokens for MultiKueue, never a key.
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

2. Any cluster with monitoring (SCRAPE_SERVICE_ACCOUNT set): the token Google Managed Prometheus scrapes Kueue's
/metrics with. GMP reads a scrape token only from a Secret (infra/monitoring.py); instead of a never-expiring
`kubernetes.io/service-account-token` Secret, this asks the API server for a one-hour token of the scrape
ServiceAccount (TokenRequest) and writes it into that Secret, again before half its life.

    python -m failover.credentials   # FLEET_ACCESS ({member: {secret, server, certificateAuthorityData}}),
                                     # FLEET_SECRETS_NAMESPACE, GCE_METADATA_HOST (as google-auth reads it);
                                     # or SCRAPE_SERVICE_ACCOUNT, SCRAPE_SECRET (namespace/name each),
                                     # SCRAPE_TOKEN_SECONDS: failover/config.py FleetRenewerConfig,
                                     # ScrapeRenewerConfig; a variable missing or malformed: exit status 2
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from failover.config import ConfigError, FleetRenewerConfig, MemberAccess, renewer_config

log = logging.getLogger("tpu-fallback.credentials")

# GKE's metadata server, as google-auth finds it (GCE_METADATA_HOST overrides it, as there).
# Ref: https://cloud.google.com/compute/docs/access/authenticate-workloads#applications
METADATA_HOST = "metadata.google.internal"
TOKEN_PATH = "/computeMetadata/v1/instance/service-accounts/default/token"
CHECK_SECONDS = 300.0  # the longest between two checks, whatever the token's lifetime
MIN_CHECK_SECONDS = 1.0
RETRY_SECONDS = (2.0, 5.0, 15.0, 30.0, 60.0)  # after a failed renewal: the old token still has time left
KUBECONFIG_KEY = "kubeconfig"  # the key MultiKueue reads (MultiKueueConfigSecretKey)
TOKEN_KEY = "token"  # the key a scrape Secret holds the bare token in (infra/monitoring.py)
SCRAPE_TOKEN_SECONDS = 3600


@dataclass(frozen=True)
class Token:
    value: str
    expires: datetime.datetime

    def left(self, now: datetime.datetime) -> float:
        return (self.expires - now).total_seconds()


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


class TokenSource(Protocol):
    def token(self) -> Token: ...


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


@dataclass(frozen=True)
class Target:
    """A Secret that holds a token: under `key`, as `render(token)` gives it."""

    secret: str
    key: str
    render: Callable[[str], str]


class ServiceAccountTokenSource:
    """A token of a ServiceAccount in this cluster, from the API server (TokenRequest), valid `seconds`."""

    def __init__(self, core: client.CoreV1Api, namespace: str, name: str, seconds: int = SCRAPE_TOKEN_SECONDS):
        self.core, self.namespace, self.name, self.seconds = core, namespace, name, seconds

    def token(self) -> Token:
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=self.seconds))
        review = self.core.create_namespaced_service_account_token(self.name, self.namespace, request)
        return Token(review.status.token, review.status.expiration_timestamp)


class Renewer:
    """`renew()` once: every target Secret holds the current token; returns the seconds until the next check."""

    def __init__(self, core: client.CoreV1Api, targets: Sequence[Target], namespace: str, source: TokenSource,
                 clock: Callable[[], datetime.datetime] | None = None):
        self.core, self.targets, self.namespace, self.source = core, tuple(targets), namespace, source
        self.clock = clock or _now
        self.written: dict[str, str] = {}  # Secret -> what was last seen in it
        self.current: Token | None = None
        self.lifetime = 0.0  # the current token's, when it was handed out

    def renew(self) -> float:
        """Ask the source again once the token in hand has lived half its life (a TokenRequest makes a new token
        each time; the metadata server gives the same one until it renews it itself, and is asked again sooner)."""
        now = self.clock()
        if self.current is None or self.current.left(now) <= self.lifetime / 2:
            token = self.source.token()
            if token.left(now) <= 0:
                raise ValueError(f"the token source gave a token that expired at {token.expires.isoformat()}")
            if self.current is None or token.value != self.current.value:
                self.current, self.lifetime = token, token.left(now)
        for target in self.targets:
            self._write(target, self.current)
        return max(MIN_CHECK_SECONDS, min(CHECK_SECONDS, self.current.left(now) / 2))

    def _write(self, target: Target, token: Token) -> None:
        wanted = target.render(token.value)
        if self.written.get(target.secret) == wanted:
            return
        secret = self.core.read_namespaced_secret(target.secret, self.namespace)
        current = base64.b64decode((secret.data or {}).get(target.key, "")).decode()
        if current != wanted:
            # Guarded by resourceVersion: a concurrent writer (a second replica in a rollout) makes this a 409, and
            # the next check writes again.
            self.core.patch_namespaced_secret(target.secret, self.namespace, {
                "metadata": {"resourceVersion": secret.metadata.resource_version},
                "data": {target.key: base64.b64encode(wanted.encode()).decode()}})
            log.info("%s/%s: token renewed, valid until %s", self.namespace, target.secret,
                     token.expires.isoformat(timespec="seconds"))
        self.written[target.secret] = wanted


def member_targets(members: Mapping[str, MemberAccess]) -> list[Target]:
    """A fleet manager's: each member's kubeconfig Secret, with its server, its CA and the token."""
    return [Target(access.secret, KUBECONFIG_KEY,
                   lambda token, m=member, a=access: inline_kubeconfig(m, a.server, a.certificate_authority_data,
                                                                       token))
            for member, access in members.items()]


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
    from failover.runtime.cluster_client import api_client

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    try:
        config = renewer_config(os.environ)
    except ConfigError as error:
        print(f"failover.credentials: {error}", file=sys.stderr)
        return 2
    core = client.CoreV1Api(api_client())
    if isinstance(config, FleetRenewerConfig):
        source = MetadataTokenSource()
        renewer = Renewer(core, member_targets(config.members), config.secrets_namespace, source)
        log.info("renewing the manager's tokens for %s from %s", ", ".join(config.members), source.url)
    else:
        (namespace, secret), seconds = config.secret, int(config.token_lifetime.total_seconds())
        renewer = Renewer(core, [Target(secret, TOKEN_KEY, lambda token: token)], namespace,
                          ServiceAccountTokenSource(core, *config.service_account, seconds))
        log.info("renewing %s/%s with %d s tokens of %s/%s", namespace, secret, seconds, *config.service_account)
    run(renewer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
