"""The fleet's ladder controller's I/O: informers on the manager's Workloads and RayJobs and on each step member's
Warning Events, a work queue, and the guarded writes that carry out what failover/ladder/decisions.py decides (a
move by route D, a give-up), each resumable from any point.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable, Mapping

from kubernetes import client, dynamic
from kubernetes.client import ApiException

from failover.api import (FAILOVER_ANNOTATION, GAVE_UP_ANNOTATION, MOVED, MOVES_ANNOTATION, QUEUE_LABEL,
                          SLICE_LOST_ANNOTATION, WAIT_FOR_BACKOFF_RESET, FinishMove, GiveUp, Ladder, LostSlice, Move,
                          StartMove, with_move_recorded)
from failover.ladder.decisions import (COMPONENT, DEACTIVATE, DONE, EVENT_REASON, GAVE_UP_REASON,
                                       Key, MARK_SUSPENDED, RECORD, RELABEL, REPOINT, UNMARK,
                                       WAIT_FOR_CHECKS, WAIT_FOR_QUOTA,
                                       WORKLOAD_GIVE_UP_ANNOTATION, WORKLOAD_MOVE_ANNOTATION,
                                       FinishGiveUp, JobMeta, LadderView, StartGiveUp, admitted_at,
                                       deactivation, decide, dispatched, give_up_deactivation,
                                       is_slice_lost_event, is_stockout_event, move_message, next_in_give_up,
                                       next_in_move, next_look, running_member, stockout_in_member)
from failover.runtime.informer import Informer, RawClient, Watched
from failover.runtime.workqueue import WorkQueue, work
from failover.runtime.writes import RAYJOB, WORKLOAD, GuardedWrites, rayjob_event, utcnow

log = logging.getLogger("tpu-fallback.ladder")
MOVE_WAIT_SECONDS = 15.0  # how long one pass waits for Kueue within a move; the next pass resumes it
POLL_SECONDS = 0.05


class _Member:
    """A member as the early path sees it: its client (the kubeconfig MultiKueue uses) and the autoscaler's
    stockout Events about pods in the fleet's namespace there (an informer, rebuilt with a new kubeconfig)."""

    def __init__(self, name: str):
        self.name = name
        self.api: client.ApiClient | None = None
        self.informer: Informer | None = None
        self.generation = 0
        self.events: dict[str, dict] = {}  # uid -> a stockout Event
        self.lost_jobs: set[str] = set()  # the RayJobs its failover controller made a SliceLost Event about


class LadderController(GuardedWrites):
    def __init__(self, api_client: client.ApiClient, ladder: Ladder, namespace: str,
                 step_wait: datetime.timedelta | None = None, clock: Callable[[], datetime.datetime] = utcnow,
                 max_wait: datetime.timedelta | None = None,
                 members: Callable[[], Mapping[str, client.ApiClient | None]] | None = None):
        self.api = dynamic.DynamicClient(api_client)
        self.core = client.CoreV1Api(api_client)
        self.workloads = self.api.resources.get(api_version=WORKLOAD[0], kind=WORKLOAD[1])
        self.rayjobs = self.api.resources.get(api_version=RAYJOB[0], kind=RAYJOB[1])
        self.ladder, self.namespace, self.step_wait, self.clock = ladder, namespace, step_wait, clock
        self.max_wait = max_wait
        self.members = members  # None: no early path
        self.queue = WorkQueue()
        self._lock = threading.Lock()
        self._views: dict[Key, LadderView] = {}
        # When this process first saw MultiKueue send a job to its step's members: (the step's queue, that moment), or
        # None for the moment when it was so at this process's first list (then the step's own time is used).
        self._dispatched_seen: dict[Key, tuple[str, datetime.datetime | None]] = {}
        self._workload_of_job: dict[Key, Key] = {}
        self._jobs: dict[Key, JobMeta] = {}
        self._members: dict[str, _Member] = {}
        self.moves_started = 0  # for tests and logs

    # ---- what the informers see --------------------------------------------------------------------------------
    def informers(self) -> list[Informer]:
        base = f"namespaces/{self.namespace}"
        return [Informer(self.api, Watched("rayjobs", f"/apis/ray.io/v1/{base}/rayjobs", metadata_only=True),
                         self._rayjobs_listed, self._rayjob_changed),
                Informer(self.api, Watched("workloads", f"/apis/kueue.x-k8s.io/v1beta2/{base}/workloads"),
                         self._workloads_listed, self._workload_changed)]

    def _workloads_listed(self, items: list[dict]) -> None:
        with self._lock:
            self._views.clear()
            self._workload_of_job.clear()
            listed = {(i["metadata"].get("namespace", ""), i["metadata"]["name"]) for i in items}
            self._dispatched_seen = {k: v for k, v in self._dispatched_seen.items() if k in listed}
        for item in items:
            self._workload_changed("ADDED", item, listed=True)

    def _workload_changed(self, event_type: str, obj: dict, listed: bool = False) -> None:
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        with self._lock:
            if event_type == "DELETED":
                view = self._views.pop(key, None)
                self._dispatched_seen.pop(key, None)
                if view is not None and view.rayjob:
                    self._workload_of_job.pop((key[0], view.rayjob), None)
                return
            view = LadderView.from_object(obj)
            self._views[key] = view
            if view.rayjob:
                self._workload_of_job[(key[0], view.rayjob)] = key
            index = self.ladder.index(view.queue_name)
            seen = self._dispatched_seen.get(key)
            if (index is not None and dispatched(self.ladder.steps[index], view)
                    and (seen is None or seen[0] != view.queue_name)):
                self._dispatched_seen[key] = (view.queue_name, None if listed else self.clock())
        self.queue.add(key)

    def _dispatched_at(self, key: Key, view: LadderView) -> datetime.datetime | None:
        seen = self._dispatched_seen.get(key)
        return seen[1] if seen is not None and seen[0] == view.queue_name else None

    def _rayjobs_listed(self, items: list[dict]) -> None:
        with self._lock:
            self._jobs.clear()
        for item in items:
            self._rayjob_changed("ADDED", item)

    def _rayjob_changed(self, event_type: str, obj: dict) -> None:
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        meta = JobMeta.of(obj)
        with self._lock:
            if event_type == "DELETED":
                self._jobs.pop(key, None)
                return
            changed = self._jobs.get(key) != meta
            self._jobs[key] = meta
            workload = self._workload_of_job.get(key)
        if changed and workload is not None:
            self.queue.add(workload)

    # ---- the members (the early path) --------------------------------------------------------------------------
    def refresh_members(self) -> None:
        """Read the members' kubeconfigs again; a member whose client changed (a renewed token) watches anew."""
        if self.members is None:
            return
        for name, api in self.members().items():
            with self._lock:
                member = self._members.setdefault(name, _Member(name))
            if api is member.api:
                continue
            if member.informer is not None:
                member.informer.stop()
            with self._lock:
                member.api, member.generation, member.informer = api, member.generation + 1, None
            if api is None:
                continue
            listed, changed = self._member_handlers(member, member.generation)
            member.informer = Informer(RawClient(api), Watched(
                f"member-events-{name}", f"/api/v1/namespaces/{self.namespace}/events",
                field_selector="type=Warning"), listed, changed)
            member.informer.start()

    def members_synced(self) -> bool:
        with self._lock:
            return all(m.informer is None or m.informer.synced.is_set() for m in self._members.values())

    def _member_handlers(self, member: _Member, generation: int):
        def listed(items: list[dict]) -> None:
            with self._lock:
                if member.generation != generation:
                    return
                member.events = {e["metadata"]["uid"]: e for e in items if is_stockout_event(e)}
                member.lost_jobs = {e["involvedObject"].get("name") for e in items if is_slice_lost_event(e)}
            self._queue_admitted_in(member.name)

        def changed(event_type: str, obj: dict) -> None:
            if is_slice_lost_event(obj):  # the member's controller recorded a loss: read it (on the member's RayJob)
                with self._lock:  # and look again when its wait ends
                    if member.generation == generation and event_type != "DELETED":
                        member.lost_jobs.add(obj["involvedObject"].get("name"))
                self._queue_admitted_in(member.name)
                return
            if not is_stockout_event(obj):
                return
            with self._lock:
                if member.generation != generation:
                    return
                if event_type == "DELETED":
                    member.events.pop(obj["metadata"]["uid"], None)
                    return
                member.events[obj["metadata"]["uid"]] = {
                    k: obj.get(k) for k in ("metadata", "involvedObject", "reason", "message", "firstTimestamp",
                                            "lastTimestamp", "eventTime")}
            log.info("member %s reports a stockout for pod %s", member.name,
                     (obj.get("involvedObject") or {}).get("name"))
            self._queue_admitted_in(member.name)

        return listed, changed

    def _queue_admitted_in(self, member: str) -> None:
        """Queue the jobs `member` runs (`running_member`): a stockout or a lost slice there may be theirs."""
        with self._lock:
            keys = [key for key, view in self._views.items()
                    if (step := self.ladder.step_of(view.queue_name)) is not None
                    and running_member(step, view) == member]
        for key in keys:
            self.queue.add(key)

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
        with self._lock:
            member = self._members.get(running)
            events = list(member.events.values()) if member is not None else []
            api = member.api if member is not None else None
            said_lost = member is not None and view.rayjob in member.lost_jobs
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

    # ---- the work loop -----------------------------------------------------------------------------------------
    def resync(self) -> None:
        with self._lock:
            keys = list(self._views)
        for key in keys:
            self.queue.add(key)

    def work(self, stopping: threading.Event) -> None:
        work(self.queue, self.reconcile_key, stopping, log)

    def _decide(self, view: LadderView, meta: JobMeta, stockout: datetime.datetime | None, now: datetime.datetime,
                dispatched_seen: datetime.datetime | None, lost: LostSlice | None = None):
        return decide(self.ladder, view, meta.move, now, self.step_wait, max_wait=self.max_wait,
                      job_max_wait=meta.max_wait, gave_up=meta.gave_up, stockout=stockout,
                      dispatched_seen=dispatched_seen, lost=lost)

    def reconcile_key(self, key: Key) -> int:
        """Decide on the cached view; before acting, decide again on the objects as they are now (a cache may lag
        by an event: a move just finished must not be started again). The number of moves carried on."""
        with self._lock:
            view = self._views.get(key)
            meta = self._jobs.get((key[0], view.rayjob), JobMeta()) if view and view.rayjob else JobMeta()
            dispatched_seen = self._dispatched_at(key, view) if view else None
        if view is None or view.rayjob is None:
            return 0
        now = self.clock()
        stockout, lost = self._member_signals(view)
        if self._decide(view, meta, stockout, now, dispatched_seen, lost) is None:
            wait = next_look(self.ladder, view, self.step_wait, now, max_wait=self.max_wait,
                             job_max_wait=meta.max_wait, stockout=stockout, dispatched_seen=dispatched_seen,
                             lost=lost)
            if wait is not None:  # a wait ends at a known time: look again then
                self.queue.add(key, delay=wait)
            return 0
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
        deadline = time.monotonic() + MOVE_WAIT_SECONDS
        while True:
            read = self._read(workload_name, namespace)
            if read is None:
                return False
            workload, view, job = read
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
                log.info("%s/%s: %s", namespace, job["metadata"]["name"], give_up.message())

    # ---- the move (route D on the manager) ---------------------------------------------------------------------
    def _finish(self, move: Move, workload_name: str, namespace: str, member: str) -> bool:
        """Each pass reads both objects and takes the step `next_in_move` says, so it resumes from any point. True
        once the move is complete; False when Kueue has not caught up within MOVE_WAIT_SECONDS (queued again).
        Route D (§8.8), with the move written on the Workload with the deactivation and taken off with the
        reactivation, and on the RayJob once the Workload is inactive."""
        to = self.ladder.index(move.to_local_queue)
        to_check = self.ladder.steps[to].admission_check if to is not None else None
        deadline = time.monotonic() + MOVE_WAIT_SECONDS
        while True:
            read = self._read(workload_name, namespace)
            if read is None:
                return False
            workload, view, job = read
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
                if not self._wait(deadline):
                    return False
            else:  # REACTIVATE, the move taken off the Workload
                self._patch(self.workloads, workload, {
                    "spec": {"active": True}, "metadata": {"annotations": {WORKLOAD_MOVE_ANNOTATION: None}}})

    def _read(self, workload_name: str, namespace: str) -> tuple[dict, LadderView, dict] | None:
        """The manager's Workload, as read now, its view, and its RayJob; None once either is gone."""
        workload = self._get(self.workloads, workload_name, namespace)
        if workload is None:
            return None
        view = LadderView.from_object(workload)
        job = self._get(self.rayjobs, view.rayjob, namespace) if view.rayjob else None
        return None if job is None else (workload, view, job)

    def _release_quota(self, step: str, job: dict, deadline: float) -> bool:
        """`quota_step`'s step, carried out: the RayJob marked Suspended, or a wait; False past the deadline."""
        if step == MARK_SUSPENDED:
            self._patch(self.rayjobs.status, job, {"status": {"jobDeploymentStatus": "Suspended"}})
            return True
        return self._wait(deadline)

    @staticmethod
    def _wait(deadline: float) -> bool:
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_SECONDS)
        return True

    def _record_done(self, job: dict, move: Move, member: str) -> None:
        meta = job["metadata"]
        current = Move.from_json((meta.get("annotations") or {}).get(FAILOVER_ANNOTATION))
        if current is not None and current.state == MOVED:
            return
        message = move_message(move, member)
        # The Event first, named after the move: killed before the record, the next pass writes the same Event
        # (refused as there already) and then the record; the other order loses the Event.
        rayjob_event(self.core, meta, COMPONENT, EVENT_REASON, message, "Normal", self.clock(), once=move.to_json())
        self._patch(self.rayjobs, job, {"metadata": {"annotations": {
            FAILOVER_ANNOTATION: move.done().to_json(),
            MOVES_ANNOTATION: with_move_recorded(meta.get("annotations"), move)}}})
        log.info("%s/%s: %s", meta["namespace"], meta["name"], message)
