"""What the failover controller watches, as the runtime's shared cache keeps it (failover/runtime/cache.py), and the
Workloads each change queues: Workloads (a WorkloadView each), RayJobs (their annotations and RayCluster), the
autoscaler's stockout Events, each TPU worker pod's HostView, each node's NodeView. The controller decides from
these stores (failover/regional/controller.py).
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from failover import maintenance
from failover.api import (AHEAD_ANNOTATION, FAILOVER_ANNOTATION, SCALE_UP_FAILURE_REASONS, SLICE_LOST_ANNOTATION,
                          STOCKOUT_MESSAGE, TPU_RESOURCE, Chain, Move, WorkloadView, move_history)
from failover.regional import decisions
from failover.runtime.cache import DELETED, Cache, Change, Key
from failover.runtime.controller import Watch
from failover.runtime.informer import Watched
from failover.runtime.metrics import Metrics
from failover.slices import HostView, NodeView

# The kinds the controller watches. Events: only Warnings about pods, where the autoscaler reports a stockout.
WATCHED_WORKLOADS = Watched("workloads", "/apis/kueue.x-k8s.io/v1beta2/workloads")
WATCHED_RAYJOBS = Watched("rayjobs", "/apis/ray.io/v1/rayjobs")  # whole: status.rayClusterName names its pods
WATCHED_EVENTS = Watched("events", "/api/v1/events", field_selector="involvedObject.kind=Pod,type=Warning")
# KubeRay labels every pod with its RayCluster and node type; the TPU hosts are the workers.
# Ref: github.com/ray-project/kuberay ray-operator@v1.6.2 controllers/ray/common/pod.go labelPod
RAY_CLUSTER_LABEL = "ray.io/cluster"
WATCHED_PODS = Watched("pods", "/api/v1/pods", label_selector="ray.io/node-type=worker")
WATCHED_NODES = Watched("nodes", "/api/v1/nodes")
# The rungs' free TPU quota, where a move ahead of a disruption may go (failover/maintenance.py move_target).
WATCHED_CLUSTERQUEUES = Watched("clusterqueues", "/apis/kueue.x-k8s.io/v1beta2/clusterqueues")
GONE_NODES_KEPT = datetime.timedelta(hours=1)  # a deleted node is remembered this long (its pods outlive it a while)
STOCKOUT_FIELDS = ("involvedObject", "reason", "message", "firstTimestamp", "lastTimestamp", "eventTime")


@dataclass(frozen=True)
class CachedWorkload:
    view: WorkloadView
    meta: dict  # name, namespace, resourceVersion: what a guarded patch needs
    last_admitted_at: datetime.datetime | None  # kept after the eviction clears it, for the move's delay metric


@dataclass(frozen=True)
class CachedJob:
    move: str | None  # FAILOVER_ANNOTATION
    loss: str | None  # SLICE_LOST_ANNOTATION
    cluster: str | None  # status.rayClusterName
    ahead: str | None = None  # AHEAD_ANNOTATION
    history: tuple[Move, ...] = ()  # MOVES_ANNOTATION: its completed moves, oldest first (a climb's rules read them)


@dataclass(frozen=True)
class CachedHost:
    cluster: Key  # (namespace, RayCluster)
    view: HostView


def cached_workload(obj: dict, before: CachedWorkload | None) -> CachedWorkload:
    view, meta = WorkloadView.from_object(obj), obj["metadata"]
    return CachedWorkload(view, {"name": meta["name"], "namespace": meta["namespace"],
                                 "resourceVersion": meta["resourceVersion"]},
                          view.admitted_at or (before.last_admitted_at if before else None))


def cached_job(obj: dict, _before: object = None) -> CachedJob:
    annotations = obj["metadata"].get("annotations") or {}
    return CachedJob(annotations.get(FAILOVER_ANNOTATION), annotations.get(SLICE_LOST_ANNOTATION),
                     (obj.get("status") or {}).get("rayClusterName"), annotations.get(AHEAD_ANNOTATION),
                     tuple(move_history(annotations)))


def cached_host(obj: dict, _before: object = None) -> CachedHost | None:
    """A TPU worker pod of a RayCluster; None (not kept) for any other pod."""
    meta = obj["metadata"]
    cluster = (meta.get("labels") or {}).get(RAY_CLUSTER_LABEL)
    requests_tpu = any(TPU_RESOURCE in ((c.get("resources") or {}).get("requests") or {})
                       for c in (obj.get("spec") or {}).get("containers") or [])
    return CachedHost((meta["namespace"], cluster), HostView.from_object(obj)) if cluster and requests_tpu else None


def is_stockout(event: dict) -> bool:
    return (event.get("reason") in SCALE_UP_FAILURE_REASONS
            and bool(STOCKOUT_MESSAGE.search(event.get("message") or "")))


def cached_stockout(obj: dict, _before: object = None) -> dict | None:
    return {k: obj.get(k) for k in STOCKOUT_FIELDS} if is_stockout(obj) else None


def node_view(obj: dict, _before: object = None) -> NodeView:
    return NodeView.from_object(obj)


class Seen:
    """The stores of what the controller watches, their indexes (a Workload by its RayJob, a RayJob by its
    RayCluster, a TPU pod by its RayCluster and its node, a stockout by its namespace), the Workloads each change
    queues (`watches`), and the nodes seen deleted (remembered GONE_NODES_KEPT: their pods outlive them a while)."""

    def __init__(self, cache: Cache, chain: Chain, clock: Callable[[], datetime.datetime], metrics: Metrics):
        self.chain, self.clock, self.metrics = chain, clock, metrics
        self.rayjobs = cache.store(WATCHED_RAYJOBS, cached_job, {
            "raycluster": lambda key, job: [(key[0], job.cluster)] if job.cluster else [],
            "ahead": lambda key, job: [True] if job.ahead else []})
        self.stockouts = cache.store(WATCHED_EVENTS, cached_stockout, {"namespace": lambda key, event: [key[0]]})
        self.workloads = cache.store(WATCHED_WORKLOADS, cached_workload, {
            "rayjob": lambda key, w: [(key[0], w.view.rayjob)] if w.view.rayjob else [],
            "namespace": lambda key, w: [key[0]]})
        self.pods = cache.store(WATCHED_PODS, cached_host, {
            "raycluster": lambda key, host: [host.cluster], "node": lambda key, host: [host.view.node]})
        self.nodes = cache.store(WATCHED_NODES, node_view)
        self.cluster_queues = cache.store(WATCHED_CLUSTERQUEUES, lambda obj, _before=None: maintenance.free_tpus(obj))
        self._lock = threading.Lock()
        self._gone: dict[str, datetime.datetime] = {}  # node -> when its deletion was seen

    def watches(self) -> list[Watch]:
        return [Watch(WATCHED_RAYJOBS, self._rayjob_changed), Watch(WATCHED_EVENTS, self._event_changed),
                Watch(WATCHED_WORKLOADS, self._workload_changed), Watch(WATCHED_PODS, self._pod_changed),
                Watch(WATCHED_NODES, self._node_changed), Watch(WATCHED_CLUSTERQUEUES, self._quota_changed)]

    # ---- the keys each change queues ---------------------------------------------------------------------------
    def _workload_changed(self, change: Change) -> list[Key]:
        self.metrics.workloads_watched.set(len(self.workloads))
        if change.type == DELETED:
            return []
        for seen in decisions.observations(change.old.view if change.old else None, change.new.view):
            if isinstance(seen, decisions.AdmissionWait):
                self.metrics.admission_wait.labels(seen.flavor).observe(seen.seconds)
            else:
                self.metrics.check_outcomes.labels(seen.admission_check, seen.state).inc()
        return [change.key]

    def _rayjob_changed(self, change: Change) -> list[Key]:
        """Its Workload, when anything the controller reads of it changed (CachedJob is exactly that: its move, its
        loss, its RayCluster, a disruption ahead, its moves' history)."""
        if change.type == DELETED:
            return []
        workload = self.workloads.last("rayjob", change.key)
        return [workload] if change.old != change.new and workload is not None else []

    def _pod_changed(self, change: Change) -> list[Key]:
        if change.listed and change.type == DELETED:
            return []
        return self.workloads_of_clusters([(change.new or change.old).cluster])

    def _node_changed(self, change: Change) -> list[Key]:
        """The Workloads whose TPU pods run on the node, when what the loss rules read of it changed (not a
        heartbeat); a deletion is remembered."""
        name, now = change.key[1], self.clock()
        with self._lock:
            if change.type == DELETED:
                if change.listed:  # deleted while the watch was down: gone since now, as far as anyone here can tell
                    self._gone.setdefault(name, now)
                    return []
                self._gone[name] = now
            elif change.old == change.new:
                return []  # a heartbeat: nothing the loss rules read changed
            else:
                self._gone.pop(name, None)
            for old in [n for n, at in self._gone.items() if now - at > GONE_NODES_KEPT]:
                del self._gone[old]
        clusters = dict.fromkeys(self.pods.get(key).cluster for key in self.pods.by("node", name)
                                 if self.pods.get(key) is not None)
        return self.workloads_of_clusters(clusters)

    def _quota_changed(self, change: Change) -> list[Key]:
        """The Workloads of the RayJobs with a disruption ahead on record: a move ahead of it waits for a rung with
        free quota (maintenance.move_target reads every ClusterQueue's). A rung's gain for a climb: free_slices.py."""
        if change.old == change.new:
            return []
        jobs = (self.workloads.last("rayjob", key) for key in self.rayjobs.by("ahead", True))
        return [workload for workload in jobs if workload is not None]

    def _event_changed(self, change: Change) -> list[Key]:
        """A stockout: the Workloads admitted in its namespace on a rung that can stock out after admission."""
        if change.type == DELETED:
            return []
        candidates = ((key, self.workloads.get(key)) for key in self.workloads.by("namespace", change.key[0]))
        return [key for key, cached in candidates if cached is not None and cached.view.admitted
                and self.chain.stocks_out_after_admission(cached.view.flavor)]

    # ---- reads -------------------------------------------------------------------------------------------------
    def workloads_of_clusters(self, clusters: Iterable[Key]) -> list[Key]:
        """The Workloads of the RayJobs that run these RayClusters."""
        jobs = [self.rayjobs.last("raycluster", cluster) for cluster in clusters]
        workloads = [self.workloads.last("rayjob", job) for job in jobs if job is not None]
        return [workload for workload in workloads if workload is not None]

    def job(self, namespace: str, name: str | None) -> CachedJob | None:
        return self.rayjobs.get((namespace, name)) if name else None

    def hosts(self, cluster: Key | None) -> dict[str, HostView]:
        """A RayCluster's TPU pods by name, as the pod informer last saw them."""
        if cluster is None:
            return {}
        hosts = ((key[1], self.pods.get(key)) for key in self.pods.by("raycluster", cluster))
        return {name: host.view for name, host in hosts if host is not None}

    def node_views(self) -> tuple[dict[str, NodeView], dict[str, datetime.datetime]]:
        """Every node as last seen, and the nodes seen deleted (when)."""
        with self._lock:
            gone = dict(self._gone)
        return {key[1]: view for key, view in self.nodes.items()}, gone

    def free_tpus(self) -> dict[str, dict[str, int]]:
        """Each ClusterQueue's free TPU chips by flavor, as last seen."""
        return {key[1]: free for key, free in self.cluster_queues.items()}

    def stockouts_in(self, namespace: str) -> list[dict]:
        """The autoscaler's stockout events in a namespace, as the event informer last saw them."""
        return [event for event in (self.stockouts.get(key) for key in self.stockouts.by("namespace", namespace))
                if event is not None]
