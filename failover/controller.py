"""The failover controller's I/O: read Workloads, RayJobs, pods and events; carry out what `decisions` says.

Every write is a JSON merge patch guarded by the resourceVersion it was decided on, so two replicas (or a
restart) never carry out the same move twice: the second write gets 409 Conflict and the next pass sees the
first one's result.
"""

from __future__ import annotations

import datetime
import logging
import time
import uuid
from collections.abc import Callable

from kubernetes import client, dynamic
from kubernetes.client import ApiException

from failover import decisions
from failover.decisions import (ADMITTED_FLAVOR_ANNOTATION, FAILOVER_ANNOTATION, QUEUE_LABEL, Chain, FinishMove, Move,
                                RecordFlavor, StartMove, WorkloadView)

log = logging.getLogger("tpu-fallback.failover")
WORKLOAD = ("kueue.x-k8s.io/v1beta2", "Workload")
RAYJOB = ("ray.io/v1", "RayJob")
MERGE_PATCH = "application/merge-patch+json"
COMPONENT = "tpu-fallback-failover"
EVENT_REASON = "MovedToNextRung"
SUSPEND_WAIT_SECONDS = 10.0


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


class Controller:
    def __init__(self, api_client: client.ApiClient, chain: Chain, grace: datetime.timedelta,
                 clock: Callable[[], datetime.datetime] = utcnow):
        self.api = dynamic.DynamicClient(api_client)
        self.core = client.CoreV1Api(api_client)
        self.workloads = self.api.resources.get(api_version=WORKLOAD[0], kind=WORKLOAD[1])
        self.rayjobs = self.api.resources.get(api_version=RAYJOB[0], kind=RAYJOB[1])
        self.chain, self.grace, self.clock = chain, grace, clock
        self._events_by_namespace: dict[str, list[dict]] = {}  # read once per pass, only where needed

    # ---- one pass ----------------------------------------------------------------------------------------------
    def reconcile_all(self) -> int:
        """One pass over every Workload owned by a RayJob; the number of actions taken."""
        actions = 0
        self._events_by_namespace.clear()
        for workload in self._list(self.workloads):
            try:
                actions += self.reconcile(workload)
            except ApiException as error:
                if error.status not in (404, 409):  # gone, or someone else wrote first: the next pass sees it
                    raise
        return actions

    def reconcile(self, workload_obj: dict) -> int:
        view = WorkloadView.from_object(workload_obj)
        if view.rayjob is None:
            return 0
        job = self._get(self.rayjobs, view.rayjob, view.namespace)
        if job is None:
            return 0
        meta = job["metadata"]
        stockout = None
        if view.admitted and self.chain.stocks_out_after_admission(view.flavor):
            stockout = decisions.stockout_since(self._events(view.namespace), self._tpu_pods(job), view.admitted_at)
        action = decisions.decide(self.chain, view, (meta.get("annotations") or {}).get(FAILOVER_ANNOTATION),
                                  stockout, self.grace, self.clock())
        if action is None:
            return 0
        if isinstance(action, RecordFlavor):
            self._patch(self.workloads, workload_obj, {"metadata": {"annotations": {
                ADMITTED_FLAVOR_ANNOTATION: action.flavor}}})
        elif isinstance(action, StartMove):
            log.info("%s/%s: starting a move to %s (%s, from %s)", view.namespace, view.rayjob,
                     action.move.to_flavor, action.move.reason, action.move.from_flavor)
            self._patch(self.rayjobs, job, {"metadata": {"annotations": {FAILOVER_ANNOTATION: action.move.to_json()}}})
            self._finish(action.move, workload_obj["metadata"]["name"], view.namespace, view.queue_name)
        elif isinstance(action, FinishMove):
            self._finish(action.move, workload_obj["metadata"]["name"], view.namespace, view.queue_name)
        return 1

    # ---- the move ----------------------------------------------------------------------------------------------
    def _finish(self, move: Move, workload_name: str, namespace: str, from_queue: str) -> bool:
        """Deactivate, wait for Kueue to release quota and suspend the job, relabel the RayJob, repoint the
        Workload, reactivate. Each step checks first, so it can be resumed from any point. Measured on Kueue
        0.19.2: a relabel alone does not move an evicted Workload, and the deactivation skips the requeue
        backoff (tests/test_failover_controlplane.py). True once the move is complete."""
        deadline = time.monotonic() + SUSPEND_WAIT_SECONDS
        while True:
            workload = self._get(self.workloads, workload_name, namespace)
            if workload is None:
                return False
            view = WorkloadView.from_object(workload)
            job = self._get(self.rayjobs, view.rayjob, namespace) if view.rayjob else None
            if job is None:
                return False
            label = (job["metadata"].get("labels") or {}).get(QUEUE_LABEL)
            if view.queue_name == move.to_local_queue and label == move.to_local_queue and view.active:
                self._record_done(job, move, from_queue if from_queue != move.to_local_queue else "")
                return True
            if view.queue_name != move.to_local_queue and view.active:
                self._patch(self.workloads, workload, {"spec": {"active": False}})
                continue
            if view.quota_reserved or not job["spec"].get("suspend", False):
                if time.monotonic() > deadline:
                    return False  # Kueue has not evicted yet; the next pass continues from here
                time.sleep(0.2)
                continue
            if label != move.to_local_queue:
                self._patch(self.rayjobs, job, {"metadata": {"labels": {QUEUE_LABEL: move.to_local_queue}}})
                continue
            if view.queue_name != move.to_local_queue:
                self._patch(self.workloads, workload, {"spec": {"queueName": move.to_local_queue}})
                continue
            self._patch(self.workloads, workload, {"spec": {"active": True}})  # always end active

    def _record_done(self, job: dict, move: Move, from_queue: str) -> None:
        meta = job["metadata"]
        current = Move.from_json((meta.get("annotations") or {}).get(FAILOVER_ANNOTATION))
        if current is not None and current.state == decisions.MOVED:
            return
        self._patch(self.rayjobs, job, {"metadata": {"annotations": {
            FAILOVER_ANNOTATION: move.done().to_json(),
            decisions.MOVES_ANNOTATION: decisions.with_move_recorded(meta.get("annotations"), move)}}})
        message = decisions.move_message(move, from_queue or "?")
        log.info("%s/%s: %s", meta["namespace"], meta["name"], message)
        self.core.create_namespaced_event(meta["namespace"], client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=f"{meta['name']}.{uuid.uuid4().hex[:12]}", namespace=meta["namespace"]),
            involved_object=client.V1ObjectReference(api_version=RAYJOB[0], kind=RAYJOB[1], name=meta["name"],
                                                     namespace=meta["namespace"], uid=meta["uid"]),
            reason=EVENT_REASON, message=message, type="Normal", count=1,
            first_timestamp=self.clock(), last_timestamp=self.clock(),
            source=client.V1EventSource(component=COMPONENT), reporting_component=COMPONENT,
            reporting_instance=COMPONENT))

    # ---- reads and writes --------------------------------------------------------------------------------------
    def _list(self, resource, namespace: str | None = None) -> list[dict]:
        return self.api.get(resource, namespace=namespace).to_dict().get("items", [])

    def _get(self, resource, name: str, namespace: str) -> dict | None:
        try:
            return self.api.get(resource, name=name, namespace=namespace).to_dict()
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def _patch(self, resource, obj: dict, patch: dict) -> dict:
        """A merge patch that fails with 409 if `obj` changed since it was read."""
        meta = obj["metadata"]
        guarded = {**patch, "metadata": {**patch.get("metadata", {}), "resourceVersion": meta["resourceVersion"]}}
        return self.api.patch(resource, body=guarded, name=meta["name"], namespace=meta.get("namespace"),
                              content_type=MERGE_PATCH).to_dict()

    def _events(self, namespace: str) -> list[dict]:
        if namespace not in self._events_by_namespace:
            events = self.core.list_namespaced_event(namespace)
            self._events_by_namespace[namespace] = [self.api.client.sanitize_for_serialization(event)
                                                    for event in events.items]
        return self._events_by_namespace[namespace]

    def _tpu_pods(self, job: dict) -> set[str]:
        """The names of the RayJob's pods that request TPUs (KubeRay labels them with their RayCluster)."""
        cluster = (job.get("status") or {}).get("rayClusterName")
        if not cluster:
            return set()
        pods = self.core.list_namespaced_pod(job["metadata"]["namespace"], label_selector=f"ray.io/cluster={cluster}")
        return {pod.metadata.name for pod in pods.items
                if any(decisions.TPU_RESOURCE in ((c.resources and c.resources.requests) or {})
                       for c in pod.spec.containers)}
