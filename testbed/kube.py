"""A small client for the tier, on the official `kubernetes` client: create with the server's strict field
validation, get, patch, delete with a propagation policy, and polling helpers."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from failover.api import parse_time
from kubernetes import config as kube_config
from kubernetes import dynamic
from kubernetes.client import ApiException, AuthenticationV1TokenRequest, CoreV1Api, V1TokenRequestSpec
from kubernetes.dynamic.exceptions import ResourceNotFoundError

T = TypeVar("T")


class Rejected(Exception):
    """The API server (or a webhook it called) refused a request; `message` is the server's own words."""

    def __init__(self, status: int, message: str, body: dict):
        super().__init__(f"{status}: {message}")
        self.status, self.message, self.body = status, message, body


def _rejected(error: ApiException) -> Rejected:
    try:
        body = json.loads(error.body)
    except (TypeError, ValueError):
        body = {"message": str(error.body)}
    return Rejected(error.status, body.get("message", ""), body)


class Kube:
    def __init__(self, kubeconfig: Path):
        self.api_client = kube_config.new_client_from_config(config_file=str(kubeconfig))
        self.dynamic = dynamic.DynamicClient(self.api_client)

    # ---- resolution ------------------------------------------------------------------------------------------
    def _resource(self, api_version: str, kind: str):
        try:
            return self.dynamic.resources.get(api_version=api_version, kind=kind)
        except ResourceNotFoundError:
            self.dynamic.resources.invalidate_cache()  # a CRD installed since the last discovery
            return self.dynamic.resources.get(api_version=api_version, kind=kind)

    def _path(self, api_version: str, kind: str, name: str | None = None, namespace: str | None = None) -> str:
        resource = self._resource(api_version, kind)
        return resource.path(name=name, namespace=namespace if resource.namespaced else None)

    def _call(self, method: str, path: str, body: Any = None, query: dict | None = None,
              content_type: str = "application/json") -> dict:
        try:
            response = self.dynamic.request(method, path, body=body, query_params=list((query or {}).items()),
                                            content_type=content_type, serialize=False)
        except ApiException as error:
            raise _rejected(error) from None
        return json.loads(response.data or b"{}")

    # ---- verbs -------------------------------------------------------------------------------------------------
    def create(self, manifest: dict, dry_run: bool = False) -> dict:
        """Create with strict field validation: an unknown or duplicated field is an error, as for `pulumi up`."""
        metadata = manifest["metadata"]
        query = {"fieldValidation": "Strict"}
        if dry_run:
            query["dryRun"] = "All"
        path = self._path(manifest["apiVersion"], manifest["kind"], namespace=metadata.get("namespace"))
        return self._call("POST", path, manifest, query)

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict | None:
        try:
            return self._call("GET", self._path(api_version, kind, name, namespace))
        except Rejected as rejected:
            if rejected.status == 404:
                return None
            raise

    def list(self, api_version: str, kind: str, namespace: str | None = None) -> list[dict]:
        return self._call("GET", self._path(api_version, kind, namespace=namespace)).get("items", [])

    def patch(self, api_version: str, kind: str, name: str, patch: dict, namespace: str | None = None,
              subresource: str | None = None) -> dict:
        path = self._path(api_version, kind, name, namespace) + (f"/{subresource}" if subresource else "")
        return self._call("PATCH", path, patch, {"fieldValidation": "Strict"},
                          content_type="application/merge-patch+json")

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None,
               propagation: str = "Foreground", grace_seconds: int | None = None) -> bool:
        """Delete as pulumi-kubernetes does (foreground by default); False when it was already gone."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        try:
            self._call("DELETE", self._path(api_version, kind, name, namespace), body)
        except Rejected as rejected:
            if rejected.status == 404:
                return False
            raise
        return True

    def service_account_token(self, namespace: str, name: str, seconds: int = 3600) -> str:
        request = AuthenticationV1TokenRequest(spec=V1TokenRequestSpec(audiences=[], expiration_seconds=seconds))
        try:
            return CoreV1Api(self.api_client).create_namespaced_service_account_token(
                name, namespace, request).status.token
        except ApiException as error:
            raise _rejected(error) from None

    # ---- waiting -----------------------------------------------------------------------------------------------
    def wait_crd_established(self, name: str, timeout: float) -> None:
        wait_for(lambda: condition(self.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name),
                                   "Established") == "True", timeout, f"CRD {name} Established")


def condition(obj: dict | None, kind: str) -> str | None:
    """The status ("True", "False", "Unknown") of a condition, None when absent."""
    for item in ((obj or {}).get("status") or {}).get("conditions") or []:
        if item.get("type") == kind:
            return item.get("status")
    return None


def condition_reason(obj: dict | None, kind: str) -> str | None:
    for item in ((obj or {}).get("status") or {}).get("conditions") or []:
        if item.get("type") == kind:
            return item.get("reason")
    return None


def server_seconds(stamp: str) -> float:
    """An API server's timestamp ("2026-12-03T10:32:34Z": whole seconds, UTC) in seconds since the epoch, read as the
    controllers read it (failover/api/times.py parse_time)."""
    return parse_time(stamp).timestamp()


# Polls begin at 0.1 s and grow to 0.5 s: most waits end within a second, and a long one (a timeout of 30 s) should
# not cost 300 LISTs. The tests' polls were 60% of an API server's requests on the failover tier (its audit log:
# LIST Workloads, GET RayJob, LIST ProvisioningRequests and Pods, every 0.1 s), beside Kueue, KubeRay and the rest.
POLL_FIRST, POLL_GROWTH, POLL_MOST = 0.1, 1.5, 0.5


def poll_every(seconds: float) -> None:
    """Poll at one pace from now on: the benchmarks time on their own clock (their README numbers used 0.1 s)."""
    global POLL_FIRST, POLL_MOST
    POLL_FIRST = POLL_MOST = seconds


def wait_for(probe: Callable[[], T], timeout: float, what: str, interval: float | None = None) -> T:
    """Poll until `probe()` is truthy; its value, or a TimeoutError naming what was awaited. Every `interval` seconds
    when given (a test that times something on its own clock), else from POLL_FIRST growing to POLL_MOST."""
    deadline = time.monotonic() + timeout
    pause = interval or POLL_FIRST
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(pause)
        if interval is None:
            pause = min(pause * POLL_GROWTH, POLL_MOST)
    raise TimeoutError(f"no {what} within {timeout:.0f} s (last: {last!r})")
