"""The writes every program of this package makes, and how: a read that is None when the object is gone, a merge patch
guarded by the resourceVersion it was decided on (two replicas, or a restart, never carry out one step twice: the
second write gets 409 Conflict), and an Event on a RayJob, written once when it is named after what it announces."""

from __future__ import annotations

import datetime
import hashlib
import time
import uuid
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from kubernetes import client, dynamic
from kubernetes.client import ApiException

from failover.api.annotations import CHECKPOINT_REQUEST_ANNOTATION
from failover.runtime.workqueue import WorkQueue

if TYPE_CHECKING:
    from failover.api.checkpoints import CheckpointRequest

WORKLOAD = ("kueue.x-k8s.io/v1beta2", "Workload")
RAYJOB = ("ray.io/v1", "RayJob")
MERGE_PATCH = "application/merge-patch+json"


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


class GuardedWrites:
    """The reads and writes of a controller that moves jobs (this one, and the fleet's ladder in failover/ladder/):
    a read that is None when the object is gone, and a merge patch guarded by the resourceVersion it was read at."""

    api: dynamic.DynamicClient
    workloads: Any  # the dynamic client's Workload and RayJob resources
    rayjobs: Any
    queue: WorkQueue  # the Reconciler's (failover/runtime/controller.py)

    def _get(self, resource, name: str, namespace: str) -> dict | None:
        try:
            return self.api.get(resource, name=name, namespace=namespace).to_dict()
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def _fresh_rayjob(self, namespace: str, name: str, record: str, read: Callable[[str | None], Any],
                      decided_on: Any, again: Hashable) -> dict | None:
        """The RayJob as it is now, before a write decided on its cached view: None when it is gone, or when its
        `record` annotation (as `read` parses it) is no longer the one decided on. The cache lags a write, so `again`
        is then looked at in 0.2 s, and decided on its next view."""
        job = self._get(self.rayjobs, name, namespace)
        if job is None:
            return None
        if read((job["metadata"].get("annotations") or {}).get(record)) != decided_on:
            self.queue.add(again, delay=0.2)
            return None
        return job

    def _read(self, workload_name: str, namespace: str,
              view_of: Callable[[dict], Any]) -> tuple[dict, Any, dict] | None:
        """A Workload as read now, its view (`view_of`, which names its RayJob: `.rayjob`), and its RayJob; None
        once either is gone."""
        workload = self._get(self.workloads, workload_name, namespace)
        if workload is None:
            return None
        view = view_of(workload)
        job = self._get(self.rayjobs, view.rayjob, namespace) if view.rayjob else None
        return None if job is None else (workload, view, job)

    def _walk(self, workload_name: str, namespace: str, view_of: Callable[[dict], Any], seconds: float,
              carry: Callable[[dict, Any, dict, float], bool | None]) -> bool:
        """A move's (or a give-up's) steps, each decided on both objects as read now, so that it resumes from any
        point: `carry(workload, view, job, deadline)` takes the next step and says True (complete), False (Kueue
        has not caught up by the deadline, `seconds` from now: the next pass goes on) or None (read again). False
        once either object is gone."""
        deadline = time.monotonic() + seconds
        while True:
            read = self._read(workload_name, namespace, view_of)
            if read is None:
                return False
            outcome = carry(*read, deadline)
            if outcome is not None:
                return outcome

    @staticmethod
    def _wait(deadline: float, poll: float) -> bool:
        """A wait for Kueue within a step: False past the deadline, else after `poll` seconds."""
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
        return True

    def _ask_checkpoint(self, namespace: str, pods: Iterable[str], request: CheckpointRequest) -> int:
        """The checkpoint channel's write (failover/checkpoints.py): `request` on each of a job's TPU worker pods. Not guarded: the value is the same whoever writes it, and the kubelet's status
        writes change a running pod's resourceVersion all the time. A pod gone is skipped. The pods written."""
        resource = self.api.resources.get(api_version="v1", kind="Pod")
        patch = {"metadata": {"annotations": {CHECKPOINT_REQUEST_ANNOTATION: request.value()}}}
        written = 0
        for pod in pods:
            try:
                self.api.patch(resource, body=patch, name=pod, namespace=namespace, content_type=MERGE_PATCH)
                written += 1
            except ApiException as error:
                if error.status != 404:
                    raise
        return written

    def _patch(self, resource, obj: dict, patch: dict) -> dict:
        """A merge patch that fails with 409 if `obj` changed since it was read."""
        meta = obj["metadata"]
        guarded = {**patch, "metadata": {**patch.get("metadata", {}), "resourceVersion": meta["resourceVersion"]}}
        return self.api.patch(resource, body=guarded, name=meta["name"], namespace=meta.get("namespace"),
                              content_type=MERGE_PATCH).to_dict()


def rayjob_event(core: client.CoreV1Api, meta: Mapping, component: str, reason: str, message: str, kind: str,
                 now: datetime.datetime, once: str | None = None) -> None:
    """An Event on a RayJob, as the failover controller and the fleet watch (failover/watch/) write them. With
    `once` (what the Event is about, e.g. a move's JSON) its name is derived from it and a second try writes nothing:
    written before the record it announces, a restart between the two does not say it twice, nor never."""
    if once:
        suffix = hashlib.sha256(f"{meta['uid']}/{reason}/{once}".encode()).hexdigest()[:12]
    else:
        suffix = uuid.uuid4().hex[:12]
    try:
        _create_event(core, meta, component, reason, message, kind, now, f"{meta['name']}.{suffix}")
    except ApiException as error:
        if not (once and error.status == 409):  # AlreadyExists: an earlier try wrote it
            raise


def _create_event(core: client.CoreV1Api, meta: Mapping, component: str, reason: str, message: str, kind: str,
                  now: datetime.datetime, name: str) -> None:
    core.create_namespaced_event(meta["namespace"], client.CoreV1Event(
        metadata=client.V1ObjectMeta(name=name, namespace=meta["namespace"]),
        involved_object=client.V1ObjectReference(api_version=RAYJOB[0], kind=RAYJOB[1], name=meta["name"],
                                                 namespace=meta["namespace"], uid=meta["uid"]),
        reason=reason, message=message, type=kind, count=1, first_timestamp=now, last_timestamp=now,
        source=client.V1EventSource(component=component), reporting_component=component,
        reporting_instance=component))
