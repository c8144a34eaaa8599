"""The API client every process of this package runs with: the Pod's ServiceAccount in a cluster, KUBECONFIG outside."""

from __future__ import annotations

import os

from kubernetes import client, config


def api_client() -> client.ApiClient:
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        config.load_incluster_config()
        return client.ApiClient()
    return config.new_client_from_config(config_file=os.environ.get("KUBECONFIG"))
