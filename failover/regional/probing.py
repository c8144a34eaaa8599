"""The capacity-probe controller (failover/api/probes.py): keeps one probe pod on each rung that a waiting job could
take if GCE had the slice, and deletes it once it is placed or no longer wanted (failover/regional/probes.py decides).
It runs beside the failover controller in the same manager and reads that controller's stores (its Workloads, RayJobs
and each rung's free-slice samples), so it adds one informer: its own probe pods.

The key is a rung's flavor. What makes a probe wanted is read from stores the failover controller keeps: a job starts
or stops waiting below a rung (its Workload, its RayJob's moves), a rung's numbers change (free_slices.py tells its
listeners after each sample: quota, TPU nodes, TPU pods), a probe pod is made, placed or gone. Each of these queues
every rung at once (a handful of keys); the resync is only the safety net. Before issue 43 a pass every second
found them instead.
"""

from __future__ import annotations

import logging

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from failover.api.probes import PROBE_LABEL, Probes
from failover.regional import climb, probes as decide
from failover.regional.free_slices import FreeSlices
from failover.regional.watches import WATCHED_RAYJOBS, WATCHED_WORKLOADS
from failover.runtime.cache import Cache, Change
from failover.runtime.controller import Reconciler, Watch
from failover.runtime.informer import Watched
from failover.runtime.metrics import Metrics

log = logging.getLogger("tpu-fallback.failover")
WATCHED_PROBES = Watched("capacity-probes", "/api/v1/pods", label_selector=PROBE_LABEL)


class ProbeController(Reconciler):
    name = "capacity-probes"
    log = log

    def __init__(self, api_client: client.ApiClient, cache: Cache, free: FreeSlices, probes: Probes,
                 metrics: Metrics | None = None, resync_seconds: float | None = None):
        Reconciler.__init__(self)
        self.core = client.CoreV1Api(api_client)
        self.free, self.probes, self.metrics = free, probes, metrics or Metrics()
        self.resync_seconds = resync_seconds
        self.flavors = [shape.flavor for shape in probes.shapes if shape.flavor in free.flavors]
        self.pods = cache.store(WATCHED_PROBES, decide.probe_pod_view,
                                {"flavor": lambda _key, pod: [pod.flavor]}) if self.flavors else None
        if self.flavors:
            free.listeners.append(lambda: self.enqueue(self.flavors))

    def watches(self) -> list[Watch]:
        if not self.flavors:
            return []  # probing off (no shape), or no rung a waiting job could climb to
        every_rung = lambda _change: self.flavors  # noqa: E731 - a job that starts or stops waiting
        return [Watch(WATCHED_PROBES, self._changed, decide.probe_pod_view),
                Watch(WATCHED_WORKLOADS, every_rung), Watch(WATCHED_RAYJOBS, every_rung)]

    def _changed(self, change: Change) -> list[str]:
        pod = change.new or change.old
        return [pod.flavor] if pod is not None and pod.flavor in self.flavors else []

    def keys(self) -> list[str]:
        return list(self.flavors)

    def reconcile(self, flavor: str) -> int:
        waiting = []
        for key, rung in self.free.rungs_below():
            cached = self.free.seen.workloads.get(key)
            if cached is not None and not (cached.view.admitted and cached.view.pods_ready_since):
                waiting.append((rung, climb.Need(cached.view.tpu_chips, cached.view.tpu_hosts)))
        wanted = flavor in decide.wanted(self.free.chain, self.probes, waiting, self.free.latest)
        pods = [pod for key in self.pods.by("flavor", flavor) if (pod := self.pods.get(key)) is not None]
        step = decide.next_probe_step(wanted, pods)
        if step is None:
            return 0
        action, name = step
        if action == decide.CREATE:
            try:
                self.core.create_namespaced_pod(self.probes.namespace,
                                                decide.probe_pod(self.probes.shape(flavor), self.probes))
            except ApiException as error:
                if error.status != 409:  # one there already (the cache lags, or the last one is still going)
                    raise
                return 0
            self.metrics.probes.labels(flavor, "created").inc()
            log.info("capacity probe on %s: a job waits below it, its quota free there, no slice", flavor)
            return 1
        bound = any(pod.name == name and pod.bound for pod in pods)
        try:
            self.core.delete_namespaced_pod(name, self.probes.namespace, grace_period_seconds=0)
        except ApiException as error:
            if error.status != 404:
                raise
            return 0
        if bound:
            self.metrics.probes.labels(flavor, "found").inc()
        log.info("capacity probe on %s %s", flavor,
                 "placed: the slice exists, the waiting job climbs onto it" if bound else "no longer wanted")
        return 1
