"""The members of a fleet, as a manager's programs reach them (the fleet watch, the ladder's early path): a client
per member from the kubeconfig Secrets MultiKueue reads."""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Mapping

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

log = logging.getLogger("tpu-fallback.fleet")


def member_clients(core: client.CoreV1Api, secrets: Mapping[str, str],
                   namespace: str) -> Callable[[], dict[str, client.ApiClient | None]]:
    """A client per member from the kubeconfig Secrets MultiKueue reads (key `kubeconfig`), re-read each pass
    so a rotated token is picked up; None for a member whose Secret cannot be read."""
    built: dict[str, tuple[str, client.ApiClient]] = {}  # member -> (kubeconfig text, its client)

    def load() -> dict[str, client.ApiClient | None]:
        clients: dict[str, client.ApiClient | None] = {}
        for member, secret in secrets.items():
            try:
                data = core.read_namespaced_secret(secret, namespace).data or {}
                text = base64.b64decode(data["kubeconfig"]).decode()
                if member not in built or built[member][0] != text:  # a client per kubeconfig, not per pass
                    configuration = client.Configuration()
                    config.load_kube_config_from_dict(yaml.safe_load(text), client_configuration=configuration)
                    configuration.retries = 0  # a member that does not answer is unreachable for this pass
                    built[member] = (text, client.ApiClient(configuration))
                clients[member] = built[member][1]
            except (ApiException, KeyError, ValueError, config.ConfigException) as error:
                log.warning("member %s: no usable kubeconfig in %s/%s: %s", member, namespace, secret, error)
                clients[member] = None
        return clients
    return load
