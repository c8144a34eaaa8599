"""The status command's only I/O: list the objects a report reads, with the pinned `kubernetes` client's
DynamicClient (as failover/controller.py does). Reads only; what cannot be read becomes a problem in the report."""

from __future__ import annotations

import datetime

from kubernetes import client, dynamic
from kubernetes.client import ApiException
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from failover.controller import EVENT_REASON
from infra.failover import NAME as CONTROLLER_NAME
from infra.failover import NAMESPACE as CONTROLLER_NAMESPACE
from infra.kueue import KUEUE_API_VERSION
from ops.status.report import Snapshot

CLUSTER_QUEUE = (KUEUE_API_VERSION, "ClusterQueue")
COHORT = (KUEUE_API_VERSION, "Cohort")
RESOURCE_FLAVOR = (KUEUE_API_VERSION, "ResourceFlavor")
ADMISSION_CHECK = (KUEUE_API_VERSION, "AdmissionCheck")
LOCAL_QUEUE = (KUEUE_API_VERSION, "LocalQueue")
WORKLOAD = (KUEUE_API_VERSION, "Workload")
RAYJOB = ("ray.io/v1", "RayJob")
PROVISIONING_REQUEST = ("autoscaling.x-k8s.io/v1", "ProvisioningRequest")
DEPLOYMENT = ("apps/v1", "Deployment")
POD = ("v1", "Pod")
EVENT = ("v1", "Event")


class Unreadable(Exception):
    """A list or get the cluster refused (forbidden, or a kind it does not serve)."""


class ClusterReader:
    def __init__(self, api_client: client.ApiClient):
        self.api = dynamic.DynamicClient(api_client)

    def _resource(self, kind: tuple[str, str]):
        try:
            return self.api.resources.get(api_version=kind[0], kind=kind[1])
        except ResourceNotFoundError:
            self.api.resources.invalidate_cache()  # a CRD installed since discovery was cached
            try:
                return self.api.resources.get(api_version=kind[0], kind=kind[1])
            except ResourceNotFoundError:
                raise Unreadable(f"{kind[1]}: not served by this cluster ({kind[0]})") from None

    def list(self, kind: tuple[str, str], namespace: str | None = None, **selectors) -> list[dict]:
        resource = self._resource(kind)
        try:
            found = self.api.get(resource, namespace=namespace if resource.namespaced else None, **selectors)
        except ApiException as error:
            where = f" in {namespace}" if namespace else ""
            raise Unreadable(f"{kind[1]}{where}: {error.status} {error.reason}") from None
        return found.to_dict().get("items") or []

    def get(self, kind: tuple[str, str], name: str, namespace: str) -> dict | None:
        try:
            return self.api.get(self._resource(kind), name=name, namespace=namespace).to_dict()
        except ApiException as error:
            if error.status == 404:
                return None
            raise Unreadable(f"{kind[1]} {namespace}/{name}: {error.status} {error.reason}") from None

    def read(self, namespace: str | None, context: str | None = None,
             now: datetime.datetime | None = None) -> Snapshot:
        """Every object a report reads: the queues cluster-wide, jobs in `namespace` (None: all)."""
        snapshot = Snapshot(now or datetime.datetime.now(datetime.timezone.utc), namespace, context)

        def listed(kind: tuple[str, str], where: str | None = None, **selectors) -> list[dict]:
            try:
                return self.list(kind, where, **selectors)
            except Unreadable as problem:
                snapshot.problems.append(str(problem))
                return []

        snapshot.cluster_queues = listed(CLUSTER_QUEUE)
        snapshot.cohorts = listed(COHORT)
        snapshot.resource_flavors = listed(RESOURCE_FLAVOR)
        snapshot.admission_checks = listed(ADMISSION_CHECK)
        snapshot.local_queues = listed(LOCAL_QUEUE, namespace)
        snapshot.workloads = listed(WORKLOAD, namespace)
        snapshot.rayjobs = listed(RAYJOB, namespace)
        snapshot.provisioning_requests = listed(PROVISIONING_REQUEST, namespace)
        snapshot.move_events = listed(EVENT, namespace, field_selector=f"reason={EVENT_REASON}")
        try:
            snapshot.controller = self.get(DEPLOYMENT, CONTROLLER_NAME, CONTROLLER_NAMESPACE)
        except Unreadable as problem:
            snapshot.problems.append(str(problem))
            snapshot.controller_readable = False
        if snapshot.controller is not None:
            selector = ((snapshot.controller.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
            snapshot.controller_pods = listed(POD, CONTROLLER_NAMESPACE,
                                              label_selector=",".join(f"{k}={v}" for k, v in sorted(selector.items())))
        return snapshot
