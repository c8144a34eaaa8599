"""The fleet's ladder controller: `reconcile(key)` for one manager Workload over what the runtime keeps of the manager
and of each member (failover/ladder/watches.py), with the guarded writes that carry out what
failover/ladder/decisions.py decides (a move by route D, a give-up), each resumable from any point. The manager
(failover/runtime/manager.py) runs it, with its period (the members' kubeconfigs read again) and its resync.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable

from kubernetes import client, dynamic
from kubernetes.client import ApiException

from failover.api import (CLIMB_BACK, CLIMB_EVENT_REASON, FAILOVER_ANNOTATION, GAVE_UP_ANNOTATION, MOVED,
                          MOVES_ANNOTATION, QUEUE_LABEL, SLICE_LOST_ANNOTATION, WAIT_FOR_BACKOFF_RESET, ClimbPolicy,
                          FinishMove, GiveUp, Ladder, LostSlice, Move, StartMove, with_move_recorded)
from failover.ladder import climb
from failover.ladder.climbing import ClimbingBack
from failover.ladder.decisions import (COMPONENT, DEACTIVATE, DONE, EVENT_REASON, GAVE_UP_REASON, MARK_SUSPENDED,
                                       RECORD, RELABEL, REPOINT, UNMARK, WAIT_FOR_CHECKS, WAIT_FOR_QUOTA,
                                       WORKLOAD_GIVE_UP_ANNOTATION, WORKLOAD_MOVE_ANNOTATION, FinishGiveUp, JobMeta,
                                       Key, LadderView, StartGiveUp, admitted_at, deactivation, decide,
                                       give_up_deactivation, lost_slice_over, lost_slice_waiting, move_message,
                                       next_in_give_up, next_in_move, next_look, running_member, stockout_in_member)
from failover.ladder.watches import LadderSeen
from failover.runtime.cache import Cache
from failover.runtime.controller import Reconciler, Watch
from failover.runtime.members import MemberCaches
from failover.runtime.metrics import LadderMetrics
from failover.runtime.writes import RAYJOB, WORKLOAD, GuardedWrites, rayjob_event, utcnow

log = logging.getLogger("tpu-fallback.ladder")
MOVE_WAIT_SECONDS = 15.0  # how long one pass waits for Kueue within a move; the next pass resumes it
POLL_SECONDS = 0.05
WATCH_SECONDS = 10.0  # the period: the members' kubeconfigs read again (a renewed token: new watches)
RESYNC_SECONDS = 60.0


class LadderController(ClimbingBack, GuardedWrites, Reconciler):
    name = "fleet-ladder"
    log = log
    workers = 2
    resync_seconds = RESYNC_SECONDS
    resync_at_start = True
    period_seconds = WATCH_SECONDS

    def __init__(self, api_client: client.ApiClient, ladder: Ladder, namespace: str,
                 step_wait: datetime.timedelta | None = None, clock: Callable[[], datetime.datetime] = utcnow,
                 max_wait: datetime.timedelta | None = None, members: MemberCaches | None = None,
                 cache: Cache | None = None, metrics: LadderMetrics | None = None, workers: int = 2,
                 resync_seconds: float = RESYNC_SECONDS, period_seconds: float = WATCH_SECONDS,
                 climb_policy: ClimbPolicy | None = None):
        Reconciler.__init__(self)
        self.workers, self.resync_seconds, self.period_seconds = workers, resync_seconds, period_seconds
        self.api = dynamic.DynamicClient(api_client)
        self.core = client.CoreV1Api(api_client)
        self.workloads = self.api.resources.get(api_version=WORKLOAD[0], kind=WORKLOAD[1])
        self.rayjobs = self.api.resources.get(api_version=RAYJOB[0], kind=RAYJOB[1])
        self.ladder, self.namespace, self.step_wait, self.clock = ladder, namespace, step_wait, clock
        self.max_wait = max_wait
        self.members = members  # None: no early path
        self.metrics = metrics or LadderMetrics()
        self.seen = LadderSeen(cache or Cache(api_client), ladder, namespace, clock, members, self.enqueue)
        self.moves_started = 0  # for tests and logs
        self._init_climb(climb_policy or climb.OFF)  # climbing back (failover/ladder/climbing.py)

    # ---- what the manager runs ---------------------------------------------------------------------------------
    def watches(self) -> list[Watch]:
        return self.seen.watches()

    def keys(self) -> list[Key]:
        return self.seen.views.keys()

    def tick(self) -> None:
        """Read the members' kubeconfigs again; a member whose client changed (a renewed token) watches anew."""
        if self.members is not None:
            self.members.refresh()

    def started(self) -> None:
        log.info("ladder: %s", " -> ".join(f"{s.local_queue} [{', '.join(s.members)}]" for s in self.ladder.steps))

    def _member_signals(self, view: LadderView) -> tuple[datetime.datetime | None, LostSlice | None]:
        """What the member running the job (`running_member`: a one-member step's, or the last step's that admitted
        it) says about this admission, read in the member: since when it reports no capacity for the job's pods (the
        autoscaler's Events about its RayCluster's pods), and the lost slice its failover controller recorded on the
        member's RayJob (SLICE_LOST_ANNOTATION)."""
        step = self.ladder.step_of(view.queue_name)
        running = running_member(step, view) if step is not None else None
        if step is None or running is None or view.rayjob is None:
            return None, None
        since_admission = admitted_at(step, view)
        member, events, said_lost = self.seen.member_says(running, view.rayjob)
        api = member.api if member is not None else None
        if since_admission is None or api is None or not ((events and step.stockout_grace is not None) or said_lost):
            return None, None  # nothing said: no need to ask
        try:  # the member's RayJob names the RayCluster whose pods the Events are about, and carries the loss
            job = client.CustomObjectsApi(api).get_namespaced_custom_object(
                "ray.io", "v1", view.namespace, "rayjobs", view.rayjob, _request_timeout=5)
        except ApiException as error:
            if error.status == 404:
                return None, None
            raise
        except Exception as error:  # noqa: BLE001 - cut off (a partition): it reports nothing, and the job is decided
            # on as it is (Kueue evicts it once it loses the member, and the ladder moves it on), not retried
            log.info("%s/%s: member %s does not answer (%s): nothing read there", view.namespace, view.rayjob,
                     running, type(error).__name__)
            return None, None
        stockout = (stockout_in_member(events, (job.get("status") or {}).get("rayClusterName"), since_admission)
                    if events and step.stockout_grace is not None else None)
        lost = LostSlice.from_json((job["metadata"].get("annotations") or {}).get(SLICE_LOST_ANNOTATION))
        return stockout, lost

    def _decide(self, view: LadderView, meta: JobMeta, stockout: datetime.datetime | None, now: datetime.datetime,
                dispatched_seen: datetime.datetime | None, lost: LostSlice | None = None):
        return decide(self.ladder, view, meta.move, now, self.step_wait, max_wait=self.max_wait,
                      job_max_wait=meta.max_wait, gave_up=meta.gave_up, stockout=stockout,
                      dispatched_seen=dispatched_seen, lost=lost)

    def reconcile(self, key: Key) -> int:
        """Decide on the cached view; before acting, decide again on the objects as they are now (a cache may lag
        by an event: a move just finished must not be started again). The number of moves carried on."""
        view = self.seen.views.get(key)
        meta = self.seen.jobs.get((key[0], view.rayjob), JobMeta()) if view and view.rayjob else JobMeta()
        dispatched_seen = self.seen.dispatched_at(key, view) if view else None
        if view is None or view.rayjob is None:
            return 0
        self.metrics.reconciles.inc()
        now = self.clock()
        stockout, lost = self._member_signals(view)
        if self._decide(view, meta, stockout, now, dispatched_seen, lost) is None:
            wait = next_look(self.ladder, view, self.step_wait, now, max_wait=self.max_wait,
                             job_max_wait=meta.max_wait, stockout=stockout, dispatched_seen=dispatched_seen,
                             lost=lost)
            if wait is not None:  # a wait ends at a known time: look again then
                self.queue.add(key, delay=wait)
            step = self.ladder.step_of(view.queue_name)  # nothing moves it down: does it climb back?
            losing = step is not None and (lost_slice_waiting(step, view, lost, now)
                                           or lost_slice_over(step, view, lost, now))
            return self._reconcile_climb(key, view, meta, losing, now)
        workload, job = self._get(self.workloads, key[1], key[0]), self._get(self.rayjobs, view.rayjob, key[0])
        if workload is None or job is None:
            return 0
        view, meta = LadderView.from_object(workload), JobMeta.of(job)
        action = self._decide(view, meta, stockout, self.clock(), dispatched_seen, lost)
        if isinstance(action, StartMove):
            member = action.move.member or "?"
            log.info("%s/%s: starting a move from step %s to %s (%s, member %s)", key[0], view.rayjob,
                     action.move.from_flavor, action.move.to_flavor, action.move.reason, member)
            self._patch(self.workloads, workload, deactivation(action.move))  # the move and the deactivation: one write
            self.moves_started += 1
            self._finish(action.move, key[1], key[0], member)
            return 1
        if isinstance(action, FinishMove):
            index = self.ladder.index(action.move.from_flavor)
            # The member the move names; a move an older controller wrote names none: a one-member step's member.
            self._finish(action.move, key[1], key[0], action.move.member or (
                self.ladder.steps[index].members[0]
                if index is not None and len(self.ladder.steps[index].members) == 1 else "?"))
            return 1
        if isinstance(action, StartGiveUp):
            log.info("%s/%s: giving up at step %s after %s (maximum %s, %s)", key[0], view.rayjob,
                     action.give_up.step, action.give_up.waited, action.give_up.max_wait, action.give_up.source)
            self._patch(self.workloads, workload, give_up_deactivation(action.give_up))  # one write, as a move's
            self._give_up(action.give_up, key[1], key[0])
            return 1
        if isinstance(action, FinishGiveUp):
            self._give_up(action.give_up, key[1], key[0])
            return 1
        return 0

    # ---- giving up ---------------------------------------------------------------------------------------------
    def _give_up(self, give_up: GiveUp, workload_name: str, namespace: str) -> bool:
        """Deactivate the Workload (MultiKueue then deletes its copies, and their ProvisioningRequests go with them),
        mark the manager's RayJob Suspended if its copied status still looks active (else Kueue's eviction would wait
        for a member to report it), then record it done with an Event: each pass one step of `next_in_give_up`, so
        it resumes from any point. True once recorded; False when Kueue has not released the quota in time."""
        def carry(workload: dict, view: LadderView, job: dict, deadline: float) -> bool | None:
            step = next_in_give_up(give_up, view, job)
            if step == DONE:
                return True
            if step == UNMARK:  # recorded: taken off the Workload, which stays inactive
                self._patch(self.workloads, workload, {"metadata": {"annotations": {
                    WORKLOAD_GIVE_UP_ANNOTATION: None}}})
                return True
            if step == DEACTIVATE:  # (a give-up an older controller wrote on the RayJob only)
                self._patch(self.workloads, workload, give_up_deactivation(give_up))
            elif step in (MARK_SUSPENDED, WAIT_FOR_QUOTA):
                if not self._release_quota(step, job, deadline):
                    return False
            elif step == RECORD:  # on the RayJob too (ops status reads it there)
                self._patch(self.rayjobs, job, {"metadata": {"annotations": {GAVE_UP_ANNOTATION: give_up.to_json()}}})
            else:  # ANNOUNCE: the Event before the record, as a move's
                rayjob_event(self.core, job["metadata"], COMPONENT, GAVE_UP_REASON, give_up.message(), "Warning",
                             self.clock(), once=give_up.to_json())
                self._patch(self.rayjobs, job, {"metadata": {"annotations": {
                    GAVE_UP_ANNOTATION: give_up.done().to_json()}}})
                self.metrics.give_ups.labels(give_up.step).inc()
                log.info("%s/%s: %s", namespace, job["metadata"]["name"], give_up.message())
            return None

        return self._walk(workload_name, namespace, LadderView.from_object, MOVE_WAIT_SECONDS, carry)

    # ---- the move (route D on the manager) ---------------------------------------------------------------------
    def _finish(self, move: Move, workload_name: str, namespace: str, member: str) -> bool:
        """Each pass reads both objects and takes the step `next_in_move` says, so it resumes from any point. True
        once the move is complete; False when Kueue has not caught up within MOVE_WAIT_SECONDS (queued again).
        Route D (§8.8), with the move written on the Workload with the deactivation and taken off with the
        reactivation, and on the RayJob once the Workload is inactive."""
        to = self.ladder.index(move.to_local_queue)
        to_check = self.ladder.steps[to].admission_check if to is not None else None

        def carry(workload: dict, view: LadderView, job: dict, deadline: float) -> bool | None:
            step = next_in_move(move, view, job, to_check)
            if step == DONE:
                self._record_done(job, move, member)
                return True
            if step == DEACTIVATE:  # (a move an older controller wrote on the RayJob only)
                self._patch(self.workloads, workload, deactivation(move))
            elif step == RECORD:  # the move on the RayJob too: ops status and the history read it there
                self._patch(self.rayjobs, job, {"metadata": {"annotations": {FAILOVER_ANNOTATION: move.to_json()}}})
            elif step in (MARK_SUSPENDED, WAIT_FOR_QUOTA):
                if not self._release_quota(step, job, deadline):
                    return False
            elif step == RELABEL:
                self._patch(self.rayjobs, job, {"metadata": {"labels": {QUEUE_LABEL: move.to_local_queue}}})
            elif step == REPOINT:
                self._patch(self.workloads, workload, {"spec": {"queueName": move.to_local_queue}})
            elif step in (WAIT_FOR_CHECKS, WAIT_FOR_BACKOFF_RESET):  # the new step's check, and only it; no backoff
                if not self._wait(deadline, POLL_SECONDS):
                    return False
            elif self._old_run_left(move, namespace, job["metadata"]["name"]):  # a climb's: one run at a time
                if not self._wait(deadline, POLL_SECONDS * 4):
                    return False
            else:  # REACTIVATE, the move taken off the Workload
                self._patch(self.workloads, workload, {
                    "spec": {"active": True}, "metadata": {"annotations": {WORKLOAD_MOVE_ANNOTATION: None}}})
            return None

        done = self._walk(workload_name, namespace, LadderView.from_object, MOVE_WAIT_SECONDS, carry)
        if not done and move.reason == CLIMB_BACK:  # its old run's pods are in a member: no manager event says gone
            self.queue.add((namespace, workload_name), delay=1.0)
        return done

    def _release_quota(self, step: str, job: dict, deadline: float) -> bool:
        """`quota_step`'s step, carried out: the RayJob marked Suspended, or a wait; False past the deadline."""
        if step == MARK_SUSPENDED:
            self._patch(self.rayjobs.status, job, {"status": {"jobDeploymentStatus": "Suspended"}})
            return True
        return self._wait(deadline, POLL_SECONDS)

    def _record_done(self, job: dict, move: Move, member: str) -> None:
        meta = job["metadata"]
        current = Move.from_json((meta.get("annotations") or {}).get(FAILOVER_ANNOTATION))
        if current is not None and current.state == MOVED:
            return
        climbed = move.reason == CLIMB_BACK
        message = climb.climb_message(move) if climbed else move_message(move, member)
        # The Event first, named after the move: killed before the record, the next pass writes the same Event
        # (refused as there already) and then the record; the other order loses the Event.
        rayjob_event(self.core, meta, COMPONENT, CLIMB_EVENT_REASON if climbed else EVENT_REASON, message, "Normal",
                     self.clock(), once=move.to_json())
        self._patch(self.rayjobs, job, {"metadata": {"annotations": {
            FAILOVER_ANNOTATION: move.done().to_json(),
            MOVES_ANNOTATION: with_move_recorded(meta.get("annotations"), move)}}})
        if climbed:  # not a move down: the moves' counter (and what reads it) counts those only
            self.metrics.climbs.labels(move.from_flavor, move.to_flavor).inc()
        else:
            self.metrics.moves.labels(move.from_flavor, move.to_flavor, move.reason).inc()
        log.info("%s/%s: %s", meta["namespace"], meta["name"], message)
