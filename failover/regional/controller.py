"""The failover controller: `reconcile(key)` for one Workload over the runtime's shared cache (what it watches and
the keys each change queues: watches.py), carrying out what `decisions` (a job that never got its slice) and
`slices` (a running job that lost it) say. The manager (failover/runtime/manager.py) runs it: it fills the cache,
then runs the workers, one key at a time each. A periodic resync re-queues every key, the safety net for anything a
watch missed. The early path's grace period ends at a known time, so the key is queued for that moment rather than
found by a later pass.

Every write is a JSON merge patch guarded by the resourceVersion it was decided on, so two replicas (or a
restart) never carry out the same move twice: the second write gets 409 Conflict and the next change or resync
sees the first one's result.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable

from kubernetes import client, dynamic

from failover import slices
from failover.api import (ADMITTED_FLAVOR_ANNOTATION, FAILOVER_ANNOTATION, LOSS_EVENT_REASON, LOST, MOVE_EVENT_REASON,
                          MOVED, MOVES_ANNOTATION, MOVING, PODS_READY_TIMEOUT, QUEUE_LABEL, RECOVERY_EVENT_REASON,
                          SLICE_LOST, SLICE_LOST_ANNOTATION, WAIT_FOR_BACKOFF_RESET, Chain, FinishMove, LostSlice,
                          Move, StartMove, WorkloadView, parse_time, stockout_since, with_move_recorded)
from failover import maintenance
from failover.api.climbs import CLIMB_EVENT_REASON, CLIMBS, ClimbPolicy
from failover.regional import decisions
from failover.regional.ahead import AheadOfDisruptions
from failover.regional.climbing import ClimbingBack
from failover.regional.free_slices import FreeSlices
from failover.regional.decisions import RecordFlavor
from failover.regional.watches import CachedWorkload, Seen
from failover.runtime.cache import Cache, Key
from failover.runtime.controller import Reconciler, Watch
from failover.runtime.metrics import Metrics
from failover.runtime.writes import RAYJOB, WORKLOAD, GuardedWrites, rayjob_event, utcnow
from failover.slices import GiveUpSlice, RecordLoss

log = logging.getLogger("tpu-fallback.failover")
COMPONENT = "tpu-fallback-failover"
SUSPEND_WAIT_SECONDS = 10.0
POLL_SECONDS = 0.2  # a wait for Kueue within a move looks again this often


class Controller(ClimbingBack, AheadOfDisruptions, GuardedWrites, Reconciler):
    name = "failover"
    component = COMPONENT
    log = log
    workers = 4  # a move waits up to SUSPEND_WAIT_SECONDS for Kueue
    resync_seconds = 300.0

    def __init__(self, api_client: client.ApiClient, chain: Chain, grace: datetime.timedelta,
                 clock: Callable[[], datetime.datetime] = utcnow, metrics: Metrics | None = None,
                 cache: Cache | None = None, workers: int = 4, resync_seconds: float = 300.0,
                 policy: maintenance.Policy | None = None, climb_policy: ClimbPolicy | None = None):
        Reconciler.__init__(self)
        self.policy = policy or maintenance.Policy(maintenance.NOTHING, datetime.timedelta(0), datetime.timedelta(0))
        self.workers, self.resync_seconds = workers, resync_seconds
        self.api = dynamic.DynamicClient(api_client)
        self.core = client.CoreV1Api(api_client)
        self.workloads = self.api.resources.get(api_version=WORKLOAD[0], kind=WORKLOAD[1])
        self.rayjobs = self.api.resources.get(api_version=RAYJOB[0], kind=RAYJOB[1])
        self.chain, self.grace, self.clock = chain, grace, clock
        self.metrics = metrics or Metrics()
        cache = cache or Cache(api_client)
        self.seen = Seen(cache, chain, clock, self.metrics)
        # fallback.climbBack (failover/regional/climb.py); off unless given
        zero = datetime.timedelta(0)
        self.climb_policy = climb_policy or ClimbPolicy(to=(), reserved=(), settle=zero, min_interval=zero,
                                                        min_runtime=zero, run_end_margin=zero, save_timeout=zero)
        self.free = FreeSlices(cache, self.seen, chain, self.climb_policy, clock)

    # ---- what the manager runs ---------------------------------------------------------------------------------
    def watches(self) -> list[Watch]:
        return self.seen.watches() + self.free.watches()

    def keys(self) -> list[Key]:
        return self.seen.workloads.keys()

    def started(self) -> None:
        log.info("watching %s, grace %s, resync every %.0f s",
                 " -> ".join(f"{r.flavor} ({r.local_queue})" for r in self.chain.rungs), self.grace,
                 self.resync_seconds)

    def reconcile(self, key: Key) -> int:
        """Decide on the cached view; read the objects fresh only to act. The number of actions taken."""
        cached: CachedWorkload | None = self.seen.workloads.get(key)
        recorded = self.seen.job(key[0], cached.view.rayjob) if cached else None
        annotation = recorded.move if recorded else None
        if cached is None or cached.view.rayjob is None:
            return 0
        self.metrics.reconciles.inc()
        view, now = cached.view, self.clock()
        if (pending := Move.from_json(annotation)) is None or pending.state != MOVING:
            acted = self._reconcile_loss(cached, now)
            if acted is None:
                acted = self._reconcile_ahead(cached, now)
            if acted is not None:
                return acted
        job = None
        stockout = None
        events = self.seen.stockouts_in(view.namespace) if view.admitted and self.chain.stocks_out_after_admission(
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
            return self._reconcile_climb(cached, now)  # a running job below its first rung: up again?
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
        job = self.seen.job(view.namespace, view.rayjob)
        recorded = LostSlice.from_json(job.loss if job else None)
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
        seen = self.seen.job(view.namespace, view.rayjob)
        recorded = LostSlice.from_json(seen.loss if seen else None)
        hosts = self.seen.hosts((view.namespace, seen.cluster) if seen and seen.cluster else None)
        nodes, gone = self.seen.node_views()
        loss = slices.slice_loss(view.tpu_hosts, list(hosts.values()), nodes, gone, now)
        recovery = datetime.timedelta(seconds=self.chain.rungs[rung].recovery_seconds)
        action = slices.decide_loss(view.flavor, view.pods_ready_since, recorded, loss, recovery, now)
        again = (view.namespace, cached.meta["name"])
        if action is None:
            if recorded is not None and (until := slices.waiting_until(recorded)) is not None and until > now:
                self.queue.add(again, delay=(until - now).total_seconds() + 0.05)
            return None
        job = self._fresh_rayjob(view.namespace, view.rayjob, SLICE_LOST_ANNOTATION, LostSlice.from_json, recorded,
                                 again)
        if job is None:
            return 0
        if isinstance(action, GiveUpSlice):
            if view.multikueue_origin is not None:
                return None  # the fleet's to move (a change to the copy would have the manager delete and recreate it)
            start = decisions.move_after_loss(self.chain, view, action.lost.flavor, now, seen.history if seen else ())
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
            self.queue.add(again, delay=max((parse_time(lost.until) - now).total_seconds(), 0.0) + 0.05)
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
        def carry(workload: dict, view: WorkloadView, job: dict, deadline: float) -> bool | None:
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
                if not self._wait(deadline, POLL_SECONDS):
                    return False  # Kueue has not evicted yet (or cleared the backoff); the next pass continues
            elif step == decisions.RELABEL:
                self._patch(self.rayjobs, job, {"metadata": {"labels": {QUEUE_LABEL: move.to_local_queue}}})
            elif step == decisions.REPOINT:
                self._patch(self.workloads, workload, {"spec": {"queueName": move.to_local_queue}})
            else:  # REACTIVATE: always end active
                self._patch(self.workloads, workload, {"spec": {"active": True}})
            return None

        return self._walk(workload_name, namespace, WorkloadView.from_object, SUSPEND_WAIT_SECONDS, carry)

    def _record_done(self, job: dict, move: Move, from_queue: str) -> None:
        """The done record and its Event. The Event first, named after the move: a restart between the two writes it
        again under the same name (nothing new) and then records; the other order lost the Event for good (the
        record, seen on restart, says there is nothing left to do). As the fleet's ladder does."""
        meta = job["metadata"]
        current = Move.from_json((meta.get("annotations") or {}).get(FAILOVER_ANNOTATION))
        if current is not None and current.state == MOVED:
            return
        message = decisions.move_message(move, from_queue or "?")
        climbed = move.reason in CLIMBS  # a climb back up: its own Event and counter, not a move down's
        rayjob_event(self.core, meta, COMPONENT, CLIMB_EVENT_REASON if climbed else MOVE_EVENT_REASON, message,
                     "Normal", self.clock(), once=move.to_json())
        self._patch(self.rayjobs, job, {"metadata": {"annotations": {
            FAILOVER_ANNOTATION: move.done().to_json(),
            MOVES_ANNOTATION: with_move_recorded(meta.get("annotations"), move)}}})
        if climbed:
            self.metrics.climbs.labels(move.from_flavor, move.to_flavor).inc()
        else:
            self.metrics.moves.labels(move.from_flavor, move.to_flavor, move.reason).inc()
        log.info("%s/%s: %s", meta["namespace"], meta["name"], message)

    def _tpu_pods(self, job: dict) -> set[str]:
        """The names of the RayJob's pods that request TPUs, as the pod informer last saw them."""
        cluster = (job.get("status") or {}).get("rayClusterName")
        return set(self.seen.hosts((job["metadata"]["namespace"], cluster))) if cluster else set()
