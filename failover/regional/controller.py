"""The failover controller's I/O: watch Workloads, RayJobs, the autoscaler's events, the Ray workers' pods and the
nodes; carry out what `decisions` (a job that never got its slice) and `slices` (a running job that lost it) say.

Event-driven: informers keep a slim cache (a WorkloadView per Workload, each RayJob's annotations and RayCluster, the
stockout events, each TPU worker pod's HostView, each node's NodeView) and put the key of every changed Workload on a
work queue; workers reconcile one key at a time.
A periodic resync re-queues every key, the safety net for anything a watch missed. The early path's grace
period ends at a known time, so the key is queued for that moment rather than found by a later pass.

Every write is a JSON merge patch guarded by the resourceVersion it was decided on, so two replicas (or a
restart) never carry out the same move twice: the second write gets 409 Conflict and the next change or resync
sees the first one's result.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kubernetes import client, dynamic

from failover import slices
from failover.api import (ADMITTED_FLAVOR_ANNOTATION, FAILOVER_ANNOTATION, LOSS_EVENT_REASON, LOST, MOVE_EVENT_REASON,
                          MOVED, MOVES_ANNOTATION, MOVING, PODS_READY_TIMEOUT, QUEUE_LABEL, RECOVERY_EVENT_REASON,
                          SCALE_UP_FAILURE_REASONS, SLICE_LOST, SLICE_LOST_ANNOTATION, STOCKOUT_MESSAGE, TPU_RESOURCE,
                          WAIT_FOR_BACKOFF_RESET, Chain, FinishMove, LostSlice, Move, StartMove, WorkloadView,
                          parse_time, stockout_since, with_move_recorded)
from failover.regional import decisions
from failover.regional.decisions import RecordFlavor
from failover.runtime.informer import Informer, Watched
from failover.runtime.metrics import Metrics
from failover.runtime.workqueue import WorkQueue, work
from failover.runtime.writes import RAYJOB, WORKLOAD, GuardedWrites, rayjob_event, utcnow
from failover.slices import GiveUpSlice, HostView, NodeView, RecordLoss

log = logging.getLogger("tpu-fallback.failover")
COMPONENT = "tpu-fallback-failover"
SUSPEND_WAIT_SECONDS = 10.0
# The kinds the controller watches. Events: only Warnings about pods, where the autoscaler reports a stockout.
WATCHED_WORKLOADS = Watched("workloads", "/apis/kueue.x-k8s.io/v1beta2/workloads")
WATCHED_RAYJOBS = Watched("rayjobs", "/apis/ray.io/v1/rayjobs")  # whole: status.rayClusterName names its pods
WATCHED_EVENTS = Watched("events", "/api/v1/events", field_selector="involvedObject.kind=Pod,type=Warning")
# KubeRay labels every pod with its RayCluster and node type; the TPU hosts are the workers.
# Ref: github.com/ray-project/kuberay ray-operator@v1.6.2 controllers/ray/common/pod.go labelPod
RAY_CLUSTER_LABEL = "ray.io/cluster"
WATCHED_PODS = Watched("pods", "/api/v1/pods", label_selector="ray.io/node-type=worker")
WATCHED_NODES = Watched("nodes", "/api/v1/nodes")
GONE_NODES_KEPT = datetime.timedelta(hours=1)  # a deleted node is remembered this long (its pods outlive it a while)
Key = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class CachedWorkload:
    view: WorkloadView
    meta: dict  # name, namespace, resourceVersion: what a guarded patch needs
    last_admitted_at: datetime.datetime | None  # kept after the eviction clears it, for the move's delay metric


def _key(obj: dict) -> Key:
    return obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def _is_stockout(event: dict) -> bool:
    return (event.get("reason") in SCALE_UP_FAILURE_REASONS
            and bool(STOCKOUT_MESSAGE.search(event.get("message") or "")))


class Controller(GuardedWrites):
    def __init__(self, api_client: client.ApiClient, chain: Chain, grace: datetime.timedelta,
                 clock: Callable[[], datetime.datetime] = utcnow, metrics: Metrics | None = None):
        self.api = dynamic.DynamicClient(api_client)
        self.core = client.CoreV1Api(api_client)
        self.workloads = self.api.resources.get(api_version=WORKLOAD[0], kind=WORKLOAD[1])
        self.rayjobs = self.api.resources.get(api_version=RAYJOB[0], kind=RAYJOB[1])
        self.chain, self.grace, self.clock = chain, grace, clock
        self.metrics = metrics or Metrics()
        self.queue = WorkQueue()
        self._lock = threading.Lock()
        self._workloads: dict[Key, CachedWorkload] = {}
        self._workload_of_job: dict[Key, Key] = {}  # (namespace, RayJob) -> its Workload
        self._job_moves: dict[Key, str | None] = {}  # (namespace, RayJob) -> its FAILOVER_ANNOTATION
        self._stockouts: dict[str, dict[str, dict]] = {}  # namespace -> event uid -> stockout event
        self._job_losses: dict[Key, str | None] = {}  # (namespace, RayJob) -> its SLICE_LOST_ANNOTATION
        self._job_of_cluster: dict[Key, Key] = {}  # (namespace, RayCluster) -> (namespace, RayJob)
        self._cluster_of_job: dict[Key, Key] = {}  # the other way
        self._hosts: dict[Key, dict[str, HostView]] = {}  # (namespace, RayCluster) -> TPU pod name -> HostView
        self._nodes: dict[str, NodeView] = {}
        self._gone: dict[str, datetime.datetime] = {}  # node -> when its deletion was seen

    # ---- what the informers see --------------------------------------------------------------------------------
    def informers(self) -> list[Informer]:
        def counted(resource, handler):
            def on_event(event_type, obj):
                self.metrics.watch_events.labels(resource).inc()
                handler(event_type, obj)
            return on_event

        errors = lambda _error: self.metrics.errors.inc()  # noqa: E731 - a one-line callback
        return [Informer(self.api, WATCHED_RAYJOBS, self.rayjobs_listed, counted("rayjobs", self.rayjob_changed),
                         errors),
                Informer(self.api, WATCHED_EVENTS, self.events_listed, counted("events", self.event_changed), errors),
                Informer(self.api, WATCHED_WORKLOADS, self.workloads_listed,
                         counted("workloads", self.workload_changed), errors),
                Informer(self.api, WATCHED_PODS, self.pods_listed, counted("pods", self.pod_changed), errors),
                Informer(self.api, WATCHED_NODES, self.nodes_listed, counted("nodes", self.node_changed), errors)]

    def workloads_listed(self, items: list[dict]) -> None:
        with self._lock:
            self._workloads.clear()
            self._workload_of_job.clear()
        for item in items:
            self.workload_changed("ADDED", item)

    def workload_changed(self, event_type: str, obj: dict) -> None:
        key = _key(obj)
        with self._lock:
            before = self._workloads.get(key)
            if event_type == "DELETED":
                self._workloads.pop(key, None)
                if before is not None and before.view.rayjob:
                    self._workload_of_job.pop((key[0], before.view.rayjob), None)
                self.metrics.workloads_watched.set(len(self._workloads))
                return
            view = WorkloadView.from_object(obj)
            meta = obj["metadata"]
            self._workloads[key] = CachedWorkload(
                view, {"name": meta["name"], "namespace": meta["namespace"],
                       "resourceVersion": meta["resourceVersion"]},
                view.admitted_at or (before.last_admitted_at if before else None))
            if view.rayjob:
                self._workload_of_job[(key[0], view.rayjob)] = key
            self.metrics.workloads_watched.set(len(self._workloads))
        self._observe(before.view if before else None, view)
        self.queue.add(key)

    def rayjobs_listed(self, items: list[dict]) -> None:
        with self._lock:
            self._job_moves.clear()
            self._job_losses.clear()
            self._job_of_cluster.clear()
            self._cluster_of_job.clear()
        for item in items:
            self.rayjob_changed("ADDED", item)

    def rayjob_changed(self, event_type: str, obj: dict) -> None:
        key = _key(obj)
        annotations = obj["metadata"].get("annotations") or {}
        annotation, loss = annotations.get(FAILOVER_ANNOTATION), annotations.get(SLICE_LOST_ANNOTATION)
        cluster = (obj.get("status") or {}).get("rayClusterName")
        with self._lock:
            known = self._cluster_of_job.get(key)
            if known is not None and (event_type == "DELETED" or known[1] != cluster):
                del self._cluster_of_job[key]
                self._job_of_cluster.pop(known, None)
            if event_type == "DELETED":
                self._job_moves.pop(key, None)
                self._job_losses.pop(key, None)
                return
            changed = self._job_moves.get(key) != annotation or self._job_losses.get(key) != loss
            self._job_moves[key], self._job_losses[key] = annotation, loss
            if cluster and self._cluster_of_job.get(key) != (key[0], cluster):
                self._cluster_of_job[key] = (key[0], cluster)
                self._job_of_cluster[(key[0], cluster)] = key
                changed = True
            workload = self._workload_of_job.get(key)
        if changed and workload is not None:
            self.queue.add(workload)

    def pods_listed(self, items: list[dict]) -> None:
        with self._lock:
            self._hosts.clear()
        for item in items:
            self.pod_changed("ADDED", item)

    def pod_changed(self, event_type: str, obj: dict) -> None:
        meta = obj["metadata"]
        cluster = (meta.get("labels") or {}).get(RAY_CLUSTER_LABEL)
        requests_tpu = any(TPU_RESOURCE in ((c.get("resources") or {}).get("requests") or {})
                           for c in (obj.get("spec") or {}).get("containers") or [])
        if not cluster or not requests_tpu:
            return
        key = (meta["namespace"], cluster)
        with self._lock:
            hosts = self._hosts.setdefault(key, {})
            if event_type == "DELETED":
                hosts.pop(meta["name"], None)
                if not hosts:
                    del self._hosts[key]
            else:
                hosts[meta["name"]] = HostView.from_object(obj)
            workloads = self._workloads_of_clusters([key])
        for workload in workloads:
            self.queue.add(workload)

    def nodes_listed(self, items: list[dict]) -> None:
        with self._lock:
            listed = {item["metadata"]["name"] for item in items}
            now = self.clock()
            # Nodes deleted while the watch was down: gone since now, as far as anyone here can tell.
            for name in set(self._nodes) - listed:
                self._gone.setdefault(name, now)
            self._nodes.clear()
        for item in items:
            self.node_changed("ADDED", item)

    def node_changed(self, event_type: str, obj: dict) -> None:
        name, now = obj["metadata"]["name"], self.clock()
        with self._lock:
            if event_type == "DELETED":
                self._nodes.pop(name, None)
                self._gone[name] = now
            else:
                view = NodeView.from_object(obj)
                if self._nodes.get(name) == view:
                    return  # a heartbeat: nothing the loss rules read changed
                self._nodes[name] = view
                self._gone.pop(name, None)
            for old in [n for n, at in self._gone.items() if now - at > GONE_NODES_KEPT]:
                del self._gone[old]
            clusters = [key for key, hosts in self._hosts.items() if any(h.node == name for h in hosts.values())]
            workloads = self._workloads_of_clusters(clusters)
        for workload in workloads:
            self.queue.add(workload)

    def _workloads_of_clusters(self, clusters: list[Key]) -> list[Key]:
        """The Workloads of the RayJobs that run these RayClusters (under the lock)."""
        jobs = [self._job_of_cluster.get(cluster) for cluster in clusters]
        return [w for w in (self._workload_of_job.get(job) for job in jobs if job) if w is not None]

    def events_listed(self, items: list[dict]) -> None:
        with self._lock:
            self._stockouts.clear()
        for item in items:
            self.event_changed("ADDED", item)

    def event_changed(self, event_type: str, obj: dict) -> None:
        if not _is_stockout(obj):
            return
        namespace, uid = obj["metadata"]["namespace"], obj["metadata"]["uid"]
        with self._lock:
            events = self._stockouts.setdefault(namespace, {})
            if event_type == "DELETED":
                events.pop(uid, None)
                return
            events[uid] = {k: obj.get(k) for k in ("involvedObject", "reason", "message", "firstTimestamp",
                                                    "lastTimestamp", "eventTime")}
            # The pods' Workloads: those admitted in this namespace on a rung that can stock out after admission.
            candidates = [key for key, cached in self._workloads.items()
                          if key[0] == namespace and cached.view.admitted
                          and self.chain.stocks_out_after_admission(cached.view.flavor)]
        for key in candidates:
            self.queue.add(key)

    def _observe(self, before: WorkloadView | None, after: WorkloadView) -> None:
        for seen in decisions.observations(before, after):
            if isinstance(seen, decisions.AdmissionWait):
                self.metrics.admission_wait.labels(seen.flavor).observe(seen.seconds)
            else:
                self.metrics.check_outcomes.labels(seen.admission_check, seen.state).inc()

    # ---- the work loop -----------------------------------------------------------------------------------------
    def resync(self) -> int:
        """Queue every known Workload again; the number queued."""
        with self._lock:
            keys = list(self._workloads)
        for key in keys:
            self.queue.add(key)
        self.metrics.resyncs.inc()
        return len(keys)

    def work(self, stopping: threading.Event) -> None:
        """A worker: reconcile queued keys until `stopping` is set."""
        work(self.queue, self.reconcile_key, stopping, log, on_error=self.metrics.errors.inc)

    def reconcile_key(self, key: Key) -> int:
        """Decide on the cached view; read the objects fresh only to act. The number of actions taken."""
        with self._lock:
            cached = self._workloads.get(key)
            annotation = self._job_moves.get((key[0], cached.view.rayjob)) if cached and cached.view.rayjob else None
        if cached is None or cached.view.rayjob is None:
            return 0
        self.metrics.reconciles.inc()
        view, now = cached.view, self.clock()
        if (pending := Move.from_json(annotation)) is None or pending.state != MOVING:
            acted = self._reconcile_loss(cached, now)
            if acted is not None:
                return acted
        job = None
        stockout = None
        events = self._events(view.namespace) if view.admitted and self.chain.stocks_out_after_admission(
            view.flavor) and not self._losing(view) else []
        if events:
            job = self._get(self.rayjobs, view.rayjob, view.namespace)
            if job is None:
                return 0
            stockout = stockout_since(events, self._tpu_pods(job), view.admitted_at)
        action = decisions.decide(self.chain, view, annotation, stockout, self.grace, now)
        if action is None:
            if stockout is not None:  # the grace period ends at a known time: look again then
                self.queue.add(key, delay=(stockout + self.grace - now).total_seconds() + 0.05)
            return 0
        if not isinstance(action, RecordFlavor):
            # The cache may lag the server by a watch event: decide again on the RayJob as it is now.
            job = self._get(self.rayjobs, view.rayjob, view.namespace)
            if job is None:
                return 0
            annotation = (job["metadata"].get("annotations") or {}).get(FAILOVER_ANNOTATION)
            action = decisions.decide(self.chain, view, annotation, stockout, self.grace, now)
        workload_obj = {"metadata": cached.meta}
        if isinstance(action, RecordFlavor):
            self._patch(self.workloads, workload_obj, {"metadata": {"annotations": {
                ADMITTED_FLAVOR_ANNOTATION: action.flavor}}})
        elif isinstance(action, StartMove):
            log.info("%s/%s: starting a move to %s (%s, from %s)", view.namespace, view.rayjob,
                     action.move.to_flavor, action.move.reason, action.move.from_flavor)
            self._patch(self.rayjobs, job, {"metadata": {"annotations": {FAILOVER_ANNOTATION: action.move.to_json()}}})
            since = cached.last_admitted_at if action.move.reason == PODS_READY_TIMEOUT else stockout
            if since is not None:
                self.metrics.move_delay.labels(action.move.reason).observe(max((now - since).total_seconds(), 0.0))
            self._finish(action.move, cached.meta["name"], view.namespace, view.queue_name)
        elif isinstance(action, FinishMove):
            self._finish(action.move, cached.meta["name"], view.namespace, view.queue_name)
        else:
            return 0
        return 1

    # ---- a running job that lost its slice -----------------------------------------------------------------------
    def _losing(self, view: WorkloadView) -> bool:
        """Whether the job waits for its lost slice this admission: then the recovery wait decides, not a stockout
        report about its replacement pods (one move, with the loss as its reason)."""
        with self._lock:
            recorded = LostSlice.from_json(self._job_losses.get((view.namespace, view.rayjob)))
        return (recorded is not None and recorded.state == LOST and view.pods_ready_since is not None
                and recorded.flavor == view.flavor
                and (parse_time(recorded.at) or view.pods_ready_since) >= view.pods_ready_since)

    def _reconcile_loss(self, cached: CachedWorkload, now: datetime.datetime) -> int | None:
        """The lost-slice rules (failover/slices.py) for a running job; None when they have nothing to do. A fleet's
        copy (MultiKueue's) gets its loss recorded here too, on the member's RayJob, and is never moved: the fleet's
        ladder on the manager reads the record and moves the job to its next step (failover/ladder/)."""
        view = cached.view
        if not (view.admitted and view.pods_ready_since and view.tpu_hosts and not view.finished):
            return None
        rung = self.chain.index_of_flavor(view.flavor)
        if rung is None:
            return None
        job_key = (view.namespace, view.rayjob)
        with self._lock:
            recorded = LostSlice.from_json(self._job_losses.get(job_key))
            cluster = self._cluster_of_job.get(job_key)
            hosts = list(self._hosts.get(cluster, {}).values()) if cluster else []
            loss = slices.slice_loss(view.tpu_hosts, hosts, dict(self._nodes), dict(self._gone), now)
        recovery = datetime.timedelta(seconds=self.chain.rungs[rung].recovery_seconds)
        action = slices.decide_loss(view.flavor, view.pods_ready_since, recorded, loss, recovery, now)
        if action is None:
            if recorded is not None and (until := slices.waiting_until(recorded)) is not None and until > now:
                self.queue.add((view.namespace, cached.meta["name"]), delay=(until - now).total_seconds() + 0.05)
            return None
        job = self._get(self.rayjobs, view.rayjob, view.namespace)
        if job is None:
            return 0
        if LostSlice.from_json((job["metadata"].get("annotations") or {}).get(SLICE_LOST_ANNOTATION)) != recorded:
            self.queue.add((view.namespace, cached.meta["name"]), delay=0.2)  # the cache lags: decide on its next view
            return 0
        if isinstance(action, GiveUpSlice):
            if view.multikueue_origin is not None:
                return None  # the fleet's to move (a change to the copy would have the manager delete and recreate it)
            start = decisions.move_after_loss(self.chain, view, action.lost.flavor, now)
            if start is None:
                return None
            log.info("%s/%s: starting a move to %s (%s on %s since %s)", view.namespace, view.rayjob,
                     start.move.to_flavor, SLICE_LOST, action.lost.flavor, action.lost.at)
            self._patch(self.rayjobs, job, {"metadata": {"annotations": {FAILOVER_ANNOTATION: start.move.to_json()}}})
            since = parse_time(action.lost.at)
            if since is not None:
                self.metrics.move_delay.labels(SLICE_LOST).observe(max((now - since).total_seconds(), 0.0))
            self._finish(start.move, cached.meta["name"], view.namespace, view.queue_name)
            return 1
        lost = action.lost
        self._patch(self.rayjobs, job, {"metadata": {"annotations": {SLICE_LOST_ANNOTATION: lost.to_json()}}})
        message = slices.loss_message(lost)
        log.info("%s/%s: %s", view.namespace, view.rayjob, message)
        if isinstance(action, RecordLoss):
            self.metrics.slices_lost.labels(lost.flavor).inc()
            rayjob_event(self.core, job["metadata"], COMPONENT, LOSS_EVENT_REASON, message, "Warning", now)
            self.queue.add((view.namespace, cached.meta["name"]),
                           delay=max((parse_time(lost.until) - now).total_seconds(), 0.0) + 0.05)
        else:
            rayjob_event(self.core, job["metadata"], COMPONENT, RECOVERY_EVENT_REASON, message, "Normal", now)
        return 1

    # ---- the move ----------------------------------------------------------------------------------------------
    def _finish(self, move: Move, workload_name: str, namespace: str, from_queue: str) -> bool:
        """Deactivate, wait for Kueue to release quota and suspend the job, relabel the RayJob, repoint the
        Workload, wait for Kueue to clear the requeue backoff (WAIT_FOR_BACKOFF_RESET), reactivate. Each step checks
        first, so it can be resumed from any point. Measured on Kueue 0.19.2: a relabel alone does not move an
        evicted Workload, and the deactivation skips the requeue backoff (tests/test_failover_controlplane.py).
        True once the move is complete."""
        deadline = time.monotonic() + SUSPEND_WAIT_SECONDS
        while True:
            workload = self._get(self.workloads, workload_name, namespace)
            if workload is None:
                return False
            view = WorkloadView.from_object(workload)
            job = self._get(self.rayjobs, view.rayjob, namespace) if view.rayjob else None
            if job is None:
                return False
            step = decisions.next_in_move(move, view, job)
            if step == decisions.DONE:
                # A requeue names the queue it stays in; a move the queue it left (recorded in the move; else this
                # pass's, unknown once the Workload is repointed).
                left = move.from_local_queue or ("" if from_queue == move.to_local_queue else from_queue)
                self._record_done(job, move, move.to_local_queue if move.requeue else left)
                return True
            if step == decisions.DEACTIVATE:
                self._patch(self.workloads, workload, {"spec": {"active": False}})
            elif step in (decisions.WAIT_FOR_RELEASE, WAIT_FOR_BACKOFF_RESET):
                if time.monotonic() > deadline:
                    return False  # Kueue has not evicted yet (or cleared the backoff); the next pass continues
                time.sleep(0.2)
            elif step == decisions.RELABEL:
                self._patch(self.rayjobs, job, {"metadata": {"labels": {QUEUE_LABEL: move.to_local_queue}}})
            elif step == decisions.REPOINT:
                self._patch(self.workloads, workload, {"spec": {"queueName": move.to_local_queue}})
            else:  # REACTIVATE: always end active
                self._patch(self.workloads, workload, {"spec": {"active": True}})

    def _record_done(self, job: dict, move: Move, from_queue: str) -> None:
        """The done record and its Event. The Event first, named after the move: a restart between the two writes it
        again under the same name (nothing new) and then records; the other order lost the Event for good (the
        record, seen on restart, says there is nothing left to do). As the fleet's ladder does."""
        meta = job["metadata"]
        current = Move.from_json((meta.get("annotations") or {}).get(FAILOVER_ANNOTATION))
        if current is not None and current.state == MOVED:
            return
        message = decisions.move_message(move, from_queue or "?")
        rayjob_event(self.core, meta, COMPONENT, MOVE_EVENT_REASON, message, "Normal", self.clock(),
                     once=move.to_json())
        self._patch(self.rayjobs, job, {"metadata": {"annotations": {
            FAILOVER_ANNOTATION: move.done().to_json(),
            MOVES_ANNOTATION: with_move_recorded(meta.get("annotations"), move)}}})
        self.metrics.moves.labels(move.from_flavor, move.to_flavor, move.reason).inc()
        log.info("%s/%s: %s", meta["namespace"], meta["name"], message)

    def _events(self, namespace: str) -> list[dict]:
        """The autoscaler's stockout events in a namespace, as the event informer last saw them."""
        with self._lock:
            return list(self._stockouts.get(namespace, {}).values())

    def _tpu_pods(self, job: dict) -> set[str]:
        """The names of the RayJob's pods that request TPUs, as the pod informer last saw them."""
        cluster = (job.get("status") or {}).get("rayClusterName")
        with self._lock:
            return set(self._hosts.get((job["metadata"]["namespace"], cluster), {})) if cluster else set()
