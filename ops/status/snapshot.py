"""The status command's only I/O: list the objects a report reads, with the pinned `kubernetes` client's
DynamicClient (as failover/regional/controller.py does). Reads only.

Two kinds of failure, told apart because a script must tell "no jobs" from "not allowed":
- the whole cluster cannot be read (the server does not answer, or rejects the credentials: 401): `ClusterError`,
  one line naming the server, exit 1;
- one list is refused (403, usually a namespace-only identity): the snapshot records that read as unreadable, with
  the server's words and the identity it named, and the report shows what depends on it as unknown, never as none.
A kind the server does not serve (no such CRD) is not a denial: that cluster simply has none of them. Nor is a
refused read of a fleet's objects where the AdmissionChecks show no fleet (ops/status/fleet.py
may_be_a_fleets_manager): recorded as unreadable, with no problem line, as nothing can be missing.
"""

from __future__ import annotations

import datetime
import json
import re

import urllib3
from kubernetes import client, dynamic
from kubernetes.client import ApiException
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from failover.api import (CONTROLLER_NAME, CONTROLLER_NAMESPACE, FLEET_LADDER_NAME, FLEET_WATCH_NAME, KUEUE_API_VERSION,
                          KUEUE_NAMESPACE, MANAGER_CONFIG_MAP, MOVE_EVENT_REASON, NODE_POOL_LABEL)
from ops.status.fleet import may_be_a_fleets_manager
from ops.status.objects import conditions, is_true, namespace_of
from ops.status.report import Snapshot

CLUSTER_QUEUE = (KUEUE_API_VERSION, "ClusterQueue")
COHORT = (KUEUE_API_VERSION, "Cohort")
RESOURCE_FLAVOR = (KUEUE_API_VERSION, "ResourceFlavor")
ADMISSION_CHECK = (KUEUE_API_VERSION, "AdmissionCheck")
LOCAL_QUEUE = (KUEUE_API_VERSION, "LocalQueue")
WORKLOAD = (KUEUE_API_VERSION, "Workload")
MULTIKUEUE_CLUSTER = (KUEUE_API_VERSION, "MultiKueueCluster")
RAYJOB = ("ray.io/v1", "RayJob")
PROVISIONING_REQUEST = ("autoscaling.x-k8s.io/v1", "ProvisioningRequest")
DEPLOYMENT = ("apps/v1", "Deployment")
POD = ("v1", "Pod")
NODE = ("v1", "Node")
EVENT = ("v1", "Event")
CONFIG_MAP = ("v1", "ConfigMap")
# Kueue's on-demand visibility API: each pending Workload's position in its ClusterQueue (needs the feature gate
# VisibilityOnDemand and Kueue's aggregated API server). Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/apis/visibility/v1beta2/types.go
VISIBILITY_PATH = "/apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/{namespace}/localqueues/{name}/pendingworkloads"
# A denial names who was denied: `User "system:serviceaccount:ns:name" cannot list resource ...`.
DENIED_USER = re.compile(r'User "([^"]+)"')
CONNECTION_PREFIX = re.compile(r"^\w*HTTPS?Connection(Pool)?\([^)]*\): ")


class Unreadable(Exception):
    """One list or get the cluster refused (403 and the like)."""


class ClusterError(Exception):
    """The cluster cannot be read at all: it does not answer, or it rejects the credentials."""


def as_json(_client, data: dict) -> dict:
    """The dynamic client's serializer that keeps the API's JSON as it is: its default wraps every nested field in
    an object and `to_dict()` unwraps them again, which took most of a call's 4-5 s with 1,000 jobs (measured)."""
    return data


def plural(kind: str) -> str:
    return kind + ("es" if kind.endswith("s") else "s")


def denial(error: ApiException, what: str) -> str:
    """`cannot list ClusterQueues (cluster-wide): 403 Forbidden for system:serviceaccount:default:reader`."""
    try:
        message = json.loads(error.body or "{}").get("message") or ""
    except ValueError:
        message = ""
    user = DENIED_USER.search(message)
    who = f" for {user.group(1)}" if user else (f": {message}" if message else "")
    return f"cannot {what}: {error.status} {error.reason}{who}"


DEFAULT_REQUEST_TIMEOUT = 30.0  # seconds a call may take before the server counts as not answering


def with_request_timeout(api_client: client.ApiClient, seconds: float) -> client.ApiClient:
    """Every call of this client times out after `seconds`: the client's default is to wait forever, and its discovery
    takes no timeout argument, so a server that accepts but does not answer (stopped, partitioned) would hang us."""
    rest = api_client.rest_client
    # One retry, not urllib3's three: a server that does not answer is reported within twice the timeout.
    rest.pool_manager.connection_pool_kw["retries"] = urllib3.Retry(total=1, redirect=False)
    already = getattr(rest, "status_request_timeout", None) is not None
    rest.status_request_timeout = seconds  # a client read again (a --watch, a test's poll) is wrapped once
    if not already:
        request = rest.request

        def bounded(*args, **kwargs):
            kwargs["_request_timeout"] = kwargs.get("_request_timeout") or rest.status_request_timeout
            return request(*args, **kwargs)
        rest.request = bounded
    return api_client


class ClusterReader:
    def __init__(self, api_client: client.ApiClient, request_timeout: float = DEFAULT_REQUEST_TIMEOUT):
        self.api_client = with_request_timeout(api_client, request_timeout)
        self.server = api_client.configuration.host
        self._api: dynamic.DynamicClient | None = None

    # ---- every call goes through here -------------------------------------------------------------------------
    def _call(self, call):
        """Runs one API call; a server that does not answer or rejects the credentials ends the whole read."""
        try:
            return call()
        except ApiException as error:
            if error.status == 401:
                raise ClusterError(f"the API server at {self.server} rejected the credentials: "
                                   f"401 {error.reason}") from None
            if error.status == 0 or error.status is None:  # the client's own transport failure
                raise ClusterError(f"cannot reach the API server at {self.server}: {error.reason}") from None
            raise
        except (urllib3.exceptions.HTTPError, OSError) as error:
            reason = str(getattr(error, "reason", None) or error)
            reason = CONNECTION_PREFIX.sub("", reason)  # urllib3 names the host and port again
            raise ClusterError(f"cannot reach the API server at {self.server}: {reason}") from None

    @property
    def api(self) -> dynamic.DynamicClient:
        if self._api is None:  # discovery: the first call that reaches the server
            self._api = self._call(lambda: dynamic.DynamicClient(self.api_client))
        return self._api

    def _resource(self, kind: tuple[str, str]):
        """The served resource, or None when this cluster does not serve the kind (no such CRD)."""
        try:
            return self._call(lambda: self.api.resources.get(api_version=kind[0], kind=kind[1]))
        except ResourceNotFoundError:
            self.api.resources.invalidate_cache()  # a CRD installed since discovery was cached
            try:
                return self._call(lambda: self.api.resources.get(api_version=kind[0], kind=kind[1]))
            except ResourceNotFoundError:
                return None

    def list(self, kind: tuple[str, str], namespace: str | None = None, **selectors) -> list[dict] | None:
        """The items; None when the kind is not served; Unreadable when the list is refused."""
        resource = self._resource(kind)
        if resource is None:
            return None
        where = f"in namespace {namespace}" if namespace and resource.namespaced else (
            "in all namespaces" if resource.namespaced else "(cluster-wide)")
        try:
            found = self._call(lambda: self.api.get(resource, namespace=namespace if resource.namespaced else None,
                                                    serializer=as_json, **selectors))
        except ApiException as error:
            raise Unreadable(denial(error, f"list {plural(kind[1])} {where}")) from None
        return found.get("items") or []

    def get(self, kind: tuple[str, str], name: str, namespace: str) -> dict | None:
        resource = self._resource(kind)
        if resource is None:
            return None
        try:
            return self._call(lambda: self.api.get(resource, name=name, namespace=namespace, serializer=as_json))
        except ApiException as error:
            if error.status == 404:
                return None
            raise Unreadable(denial(error, f"get {kind[1]} {namespace}/{name}")) from None

    def pending_positions(self, namespace: str, local_queue: str) -> dict[str, int] | None:
        """Workload name -> its position in its ClusterQueue, from Kueue's visibility API; None when that API is
        not served or not readable here (the report then computes positions and says so)."""
        path = VISIBILITY_PATH.format(namespace=namespace, name=local_queue)
        try:
            response = self._call(lambda: self.api.request("GET", path, serializer=as_json))
        except ApiException:  # 404: not served (the feature gate off, or no aggregated API); 403: not allowed
            return None
        return {(item.get("metadata") or {}).get("name", ""): int(item.get("positionInClusterQueue", 0))
                for item in response.get("items") or []}

    # ---- the snapshot -----------------------------------------------------------------------------------------
    def read(self, namespace: str | None, context: str | None = None,
             now: datetime.datetime | None = None) -> Snapshot:
        """Every object a report reads: the queues cluster-wide, jobs in `namespace` (None: all)."""
        snapshot = Snapshot(now or datetime.datetime.now(datetime.timezone.utc), namespace, context)
        snapshot.server = self.server

        def listed(field: str, kind: tuple[str, str], where: str | None = None, required: bool = False,
                   matters: bool = True, **selectors) -> list[dict]:
            try:
                items = self.list(kind, where, **selectors)
            except Unreadable as problem:
                snapshot.deny(field, str(problem), matters)
                return []
            if items is None and required:
                snapshot.deny(field, f"{plural(kind[1])}: not served by this cluster ({kind[0]})")
            return items or []

        snapshot.cluster_queues = listed("cluster_queues", CLUSTER_QUEUE, required=True)
        snapshot.cohorts = listed("cohorts", COHORT)
        snapshot.resource_flavors = listed("resource_flavors", RESOURCE_FLAVOR, required=True)
        snapshot.admission_checks = listed("admission_checks", ADMISSION_CHECK, required=True)
        snapshot.local_queues = listed("local_queues", LOCAL_QUEUE, namespace, required=True)
        snapshot.workloads = listed("workloads", WORKLOAD, namespace, required=True)
        snapshot.rayjobs = listed("rayjobs", RAYJOB, namespace)
        snapshot.provisioning_requests = listed("provisioning_requests", PROVISIONING_REQUEST, namespace)
        snapshot.pods = listed("pods", POD, namespace)
        snapshot.node_pools = self._node_pools()
        snapshot.move_events = listed("move_events", EVENT, namespace, field_selector=f"reason={MOVE_EVENT_REASON}")
        # The fleet's objects are read by whoever may (an admin sees them whatever the AdmissionChecks say); a refusal
        # is a problem only where this may be a fleet's manager: a team member on a platform (never a manager) may
        # not read them, and their absence there is known, not unknown.
        fleet = may_be_a_fleets_manager(snapshot)
        snapshot.multikueue_clusters = listed("multikueue_clusters", MULTIKUEUE_CLUSTER, matters=fleet)
        snapshot.controller = self._get_into(snapshot, "controller", DEPLOYMENT, CONTROLLER_NAME, CONTROLLER_NAMESPACE)
        if snapshot.controller is not None:
            snapshot.controller_pods = listed("controller_pods", POD, CONTROLLER_NAMESPACE,
                                              label_selector=selector_of(snapshot.controller))
        for field, name in (("fleet_watch", FLEET_WATCH_NAME), ("fleet_ladder", FLEET_LADDER_NAME)):
            deployment = self._get_into(snapshot, field, DEPLOYMENT, name, CONTROLLER_NAMESPACE, matters=fleet)
            setattr(snapshot, field, deployment)
            if deployment is not None:
                setattr(snapshot, f"{field}_pods", listed(f"{field}_pods", POD, CONTROLLER_NAMESPACE,
                                                          label_selector=selector_of(deployment)))
        snapshot.kueue_config = self._get_into(snapshot, "kueue_config", CONFIG_MAP, MANAGER_CONFIG_MAP, KUEUE_NAMESPACE)
        self._positions(snapshot)
        return snapshot

    def _node_pools(self) -> dict[str, str] | None:
        """Node name -> its GKE node pool, or None where Nodes may not be read: a nicety of the jobs' rows (which
        pool their pods run on), so a refusal is no problem line, as a team member's `view` has no Nodes."""
        try:
            nodes = self.list(NODE, None)
        except Unreadable:
            return None
        return {(n.get("metadata") or {}).get("name", ""): ((n.get("metadata") or {}).get("labels") or {}).get(
            NODE_POOL_LABEL, "?") for n in nodes or []}

    def _get_into(self, snapshot: Snapshot, field: str, kind: tuple[str, str], name: str,
                  namespace: str, matters: bool = True) -> dict | None:
        try:
            return self.get(kind, name, namespace)
        except Unreadable as problem:
            snapshot.deny(field, str(problem), matters)
            return None

    def _positions(self, snapshot: Snapshot) -> None:
        """Kueue's own queue positions for the LocalQueues that have pending Workloads, where it serves them."""
        queues = sorted({(namespace_of(w), (w.get("spec") or {}).get("queueName", ""))
                         for w in snapshot.workloads if not is_true(conditions(w).get("QuotaReserved"))})
        for namespace, queue in queues:
            if not queue:
                continue
            positions = self.pending_positions(namespace, queue)
            if positions is None:
                return  # not served: the report computes them all
            snapshot.queue_positions.update({(namespace, name): p for name, p in positions.items()})
        snapshot.positions_from_kueue = bool(queues)


def selector_of(deployment: dict) -> str:
    labels = ((deployment.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
