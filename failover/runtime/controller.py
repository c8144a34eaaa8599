"""What a controller is to the manager (manager.py): the kinds it watches and how each change maps to the keys it
queues, and `reconcile(key)` for one key. The split is controller-runtime's: a controller's watches with handlers
that map an object to requests (handler.EnqueueRequestsFromMapFunc), a work queue, and a Reconciler that decides
for one key from the shared cache and acts; the decisions themselves stay in each package's decisions.py.
Ref: https://pkg.go.dev/sigs.k8s.io/controller-runtime/pkg/handler#EnqueueRequestsFromMapFunc
Ref: https://pkg.go.dev/sigs.k8s.io/controller-runtime/pkg/reconcile
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field

from failover.runtime.cache import Change, Indexer, Transform
from failover.runtime.informer import Watched
from failover.runtime.workqueue import WorkQueue

MapFunc = Callable[[Change], Iterable[Hashable]]  # a change -> the keys it queues


@dataclass(frozen=True)
class Watch:
    """One kind a controller watches in the program's own cluster: how the shared cache keeps it (`transform`,
    `indexers`: one way per program), and the keys each change queues (`map`); `listed`, when given, maps a whole
    (re)list at once instead (a list that queues every job once, not once per object)."""

    watched: Watched
    map: MapFunc
    transform: Transform | None = None
    indexers: Mapping[str, Indexer] = field(default_factory=dict)
    listed: Callable[[list[Change]], Iterable[Hashable]] | None = None


class Reconciler:
    """A controller: `watches()` and `reconcile(key)`, run by a Manager with its own queue and `workers` workers.
    `keys()` is what a resync queues again (every `resync_seconds`, from the start when `resync_at_start`); `tick()`
    is its periodic work besides (every `period_seconds`: a fleet's members read again). A reconcile may queue its
    key again for a known time (`self.queue.add(key, delay)`), as controller-runtime's RequeueAfter."""

    name = "controller"
    log = logging.getLogger("tpu-fallback.failover")
    workers = 1
    resync_seconds: float | None = None
    resync_at_start = False
    period_seconds: float | None = None
    api_error_delay = 1.0  # an API error other than 404/409: queued again after this long
    metrics = None  # what it exports (failover/runtime/metrics.py), if anything

    def __init__(self):
        self.queue = WorkQueue()

    def watches(self) -> list[Watch]:
        return []

    def reconcile(self, key: Hashable) -> object:
        raise NotImplementedError

    def keys(self) -> Iterable[Hashable]:
        return ()

    def resync(self) -> int:
        """Queue every key again (the safety net for anything a watch missed), counted in `metrics.resyncs` where
        the controller exports one; the number queued."""
        keys = list(self.keys())
        for key in keys:
            self.queue.add(key)
        if getattr(self.metrics, "resyncs", None) is not None:
            self.metrics.resyncs.inc()
        return len(keys)

    def tick(self) -> None:
        """The periodic work besides reconciling; an exception is logged and counted (`failed`), and retried."""

    def failed(self) -> None:
        """A reconcile or a tick failed: counted in `metrics.errors` where the controller exports one."""
        if getattr(self.metrics, "errors", None) is not None:
            self.metrics.errors.inc()

    def reconciled(self, seconds: float) -> None:
        """After each key (its seconds): a controller that exports what its last keys found."""

    def started(self) -> None:
        """Once its caches are filled and its workers run (a log line saying what it watches)."""

    def enqueue(self, keys: Iterable[Hashable]) -> None:
        for key in keys:
            self.queue.add(key)
