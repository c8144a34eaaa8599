"""The manager every program of this package runs (`python -m failover.regional`, `.watch`, `.ladder`): one shared
cache of the program's own cluster (cache.py) and, on a fleet's manager, the members' caches (members.py); the
controllers registered on it (controller.py), each with its queue and workers; the periodic resyncs and ticks;
/healthz (health.py) and /metrics (metrics.py). As controller-runtime's Manager: it starts the cache, waits until
every informer has listed, then starts the workers.
Ref: https://pkg.go.dev/sigs.k8s.io/controller-runtime/pkg/manager
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

from failover.runtime.cache import Cache, Change
from failover.runtime.controller import Reconciler, Watch
from failover.runtime.health import Health
from failover.runtime.members import MemberCaches
from failover.runtime.workqueue import work

log = logging.getLogger("tpu-fallback.runtime")
C = TypeVar("C")
LOOP_SECONDS = 1.0  # the main loop's beat at most: the liveness tick, due resyncs and ticks
# The level of the programs' own loggers (`tpu-fallback.*`), INFO unless set: DEBUG adds a line per reconciled key
# (workqueue.work), which the tier tests set to see that a controller looked at a job. Ref: docs/testbed.md
LOG_LEVEL_VARIABLE, PROGRAMS_LOGGER = "FAILOVER_LOG_LEVEL", "tpu-fallback"


class Manager:
    """`add` controllers, then `run` (or `start`, and `step` from a loop of one's own). `metrics` is served at
    /metrics on `metrics_port` and /healthz on `health_port` (0: not served); `on_event` (a resource name) and
    `on_error` are told of each watched event and each failed watch of the program's own cluster (by default
    counted in the metrics' `watch_events` and `errors`, where it exports them)."""

    def __init__(self, api_client, *, metrics=None, health_port: int = 0, metrics_port: int = 0,
                 members: MemberCaches | None = None, on_event: Callable[[str], object] | None = None,
                 on_error: Callable[[Exception], object] | None = None, clock: Callable[[], float] = time.monotonic):
        self.api_client = api_client
        self.cache = Cache(api_client, on_event=on_event or _counter(metrics, "watch_events", labelled=True),
                           on_error=on_error or _counter(metrics, "errors"))
        self.members = members
        self.metrics, self.health_port, self.metrics_port = metrics, health_port, metrics_port
        self.controllers: list[Reconciler] = []
        self.health = Health([])
        self.stopping = threading.Event()
        self._clock = clock
        self._due: dict[tuple[int, str], float] = {}  # (controller, "resync" | "tick") -> when next

    def add(self, controller: Reconciler) -> Reconciler:
        """Register a controller: its watches on the shared cache, each change mapped to keys on its queue."""
        for watch in controller.watches():
            self.cache.store(watch.watched, watch.transform, watch.indexers)
            self.cache.subscribe(watch.watched, _enqueuer(controller, watch))
        self.controllers.append(controller)
        return controller

    # ---- running -----------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Bind /healthz (a port that is taken fails the start at once) and serve /metrics; start the cache and the
        first ticks (a fleet's members); once every informer has listed, the workers (a half-done move is only seen
        with its RayJob's annotation), then /healthz: a probe that answers finds the program at work."""
        server = self.health.bind(self.health_port) if self.health_port else None
        if self.metrics is not None and self.metrics_port:
            self.metrics.serve(self.metrics_port)
        self.health.informers = list(self.cache.informers.values())
        self.cache.start()
        now = self._clock()
        for number, controller in enumerate(self.controllers):
            if controller.period_seconds is not None:
                self._tick(controller)
                self._due[(number, "tick")] = now + controller.period_seconds
        self.cache.wait_synced()
        for number, controller in enumerate(self.controllers):
            for worker in range(controller.workers):
                threading.Thread(target=self._work, args=(controller,), name=f"{controller.name}-worker-{worker}",
                                 daemon=True).start()
        if server is not None:
            self.health.serve(server)
        now = self._clock()
        for number, controller in enumerate(self.controllers):
            controller.started()
            if controller.resync_seconds is not None:
                if controller.resync_at_start:
                    controller.resync()
                self._due[(number, "resync")] = now + controller.resync_seconds
        self.health.last_tick = time.monotonic()

    def step(self) -> None:
        """One beat of the main loop: the liveness tick, and each controller's due tick and resync."""
        now = self._clock()
        self.health.last_tick = time.monotonic()  # Health's own clock
        for number, controller in enumerate(self.controllers):
            if now >= self._due.get((number, "tick"), float("inf")):
                self._tick(controller)
                self._due[(number, "tick")] = now + controller.period_seconds
            if now >= self._due.get((number, "resync"), float("inf")):
                self._due[(number, "resync")] = now + controller.resync_seconds
                controller.resync()

    def run(self) -> None:
        self.start()
        beat = min([LOOP_SECONDS, *(c.resync_seconds for c in self.controllers if c.resync_seconds),
                    *(c.period_seconds for c in self.controllers if c.period_seconds)])
        while not self.stopping.is_set():
            self.stopping.wait(beat)
            self.step()

    def stop(self) -> None:
        self.stopping.set()
        for controller in self.controllers:
            controller.queue.close()
        self.cache.stop()
        if self.members is not None:
            self.members.stop()

    def _tick(self, controller: Reconciler) -> None:
        try:
            controller.tick()
        except Exception:  # noqa: BLE001 - the manager unreachable for a period: try again next one
            controller.failed()
            controller.log.exception("%s: its periodic work failed", controller.name)

    def _work(self, controller: Reconciler) -> None:
        work(controller.queue, controller.reconcile, self.stopping, controller.log, on_error=controller.failed,
             api_error_delay=controller.api_error_delay, after=controller.reconciled)


def configured(program: str, read: Callable[[Mapping[str, str]], C]) -> C:
    """Logging as every program logs, and the program's configuration read from its environment (failover/config.py
    `from_env`): one that cannot be read ends the program, exit status 2, with a line that names the variable."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    level = os.environ.get(LOG_LEVEL_VARIABLE, "INFO")
    if level not in logging.getLevelNamesMapping():
        print(f"{program}: {LOG_LEVEL_VARIABLE}={level!r} is not a log level (DEBUG, INFO, WARNING, ERROR)",
              file=sys.stderr)
        raise SystemExit(2)
    logging.getLogger(PROGRAMS_LOGGER).setLevel(level)
    try:
        return read(os.environ)
    except ValueError as error:  # failover/config.py's ConfigError
        print(f"{program}: {error}", file=sys.stderr)
        raise SystemExit(2) from None


def _counter(metrics, name: str, labelled: bool = False) -> Callable[..., None]:
    """A callback that counts in `metrics.<name>` (by its first argument when `labelled`), or does nothing."""
    counter = getattr(metrics, name, None)
    if counter is None:
        return lambda *_args: None
    return (lambda label: counter.labels(label).inc()) if labelled else (lambda *_args: counter.inc())


def _enqueuer(controller: Reconciler, watch: Watch) -> Callable[[list[Change], bool], None]:
    """The handler that puts what `watch` maps each change to on the controller's queue."""
    def handle(changes: list[Change], listed: bool) -> None:
        if listed and watch.listed is not None:
            controller.enqueue(watch.listed(changes))
            return
        for change in changes:
            controller.enqueue(watch.map(change))
    return handle
