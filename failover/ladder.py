"""The fleet's ladder controller (plan C, README "The fleet's ladder"): on a fleet's manager, moves a job to the next
step of the ladder when the member of its step evicted it: `python -m failover.ladder`.

A step is a manager LocalQueue whose ClusterQueue has its own MultiKueue check and config (one member's reservation,
on-demand or Spot rung; the last step: DWS in every member). MultiKueue re-dispatches a job a member evicted to the
same step, forever (a stockout after admission: the member's podsReadyTimeout, every ~33 s). This controller reads
that from level signals that survive a restart: the step's check is `Retry`, or its `retryCount` is at least 1
(Kueue counts a check's retries per check, so a new step starts a new entry: pkg/workload/evict/evict.go L220-239,
and keeps the count when the check turns Ready again: pkg/workload/patching/patching.go L78-103). It then moves
the job with route D on the manager's Workload, in the order measured clean on Kueue 0.19.2
(../shared/notes/multikueue-ladder.md §8.8): deactivate; mark the manager's RayJob `Suspended` if it looks active
(else Kueue's eviction waits for a member to report it, §8.4); wait until quota is released (`spec.queueName` is
immutable before, CEL); relabel the RayJob and repoint the Workload; wait until `status.admissionChecks` is exactly
the new step's check (else MultiKueue may dispatch with the old step's config, §8.3); reactivate.

The move is written on the RayJob before the first change (the regional controller's annotation and history,
failover/decisions.py), each write guarded by the resourceVersion it was decided on, and each step of the move
checks first: a restart, `kill -9` included, finishes the move it finds and never starts a second one for a hop.

Configuration (environment, set by the fleet stack's Deployment, infra/fleet.py):
    FLEET_LADDER            JSON list of steps {localQueue, clusterQueue, admissionCheck, rung, members}, first first
    FLEET_NAMESPACE         the fleet's jobs' namespace (tpu-fleet)
    FLEET_STEP_WAIT_SECONDS how long a job may wait at a step before the last without being admitted there (its
                            member's capacity is in use: a reservation or on-demand slice admits at once when free)
    LADDER_RESYNC_SECONDS   seconds between resyncs, the safety net (default 60)
    LADDER_WORKERS          jobs handled at once (default 2)
    KUBECONFIG              outside a cluster; in a Pod the ServiceAccount's credentials are used
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kubernetes import client, dynamic
from kubernetes.client import ApiException

from failover import decisions
from failover.controller import MERGE_PATCH, RAYJOB, WORKLOAD, rayjob_event, utcnow
from failover.decisions import FAILOVER_ANNOTATION, MOVED, MOVING, QUEUE_LABEL, FinishMove, Move, StartMove
from failover.informer import Informer, Watched
from failover.workqueue import WorkQueue

log = logging.getLogger("tpu-fallback.ladder")
COMPONENT = "tpu-fallback-ladder"
EVENT_REASON = "MovedToNextStep"
MEMBER_EVICTED = "MemberEvicted"  # the reason a move records: the step's member evicted the job
STEP_BUSY = "StepBusy"  # or: the step did not admit it within the step wait (its capacity is in use)
MOVE_WAIT_SECONDS = 15.0  # how long one pass waits for Kueue within a move; the next pass resumes it
POLL_SECONDS = 0.05
# The manager's RayJob status that Kueue reads as "still running" (rayjob_controller.go IsActive: anything but
# Suspended and New); an empty status releases at once (measured, §8.4).
INACTIVE_STATES = frozenset({"Suspended", "New", ""})
_MEMBER_IN_MESSAGE = re.compile(r'worker cluster: "([^"]+)"')

Key = tuple[str, str]


# ---- the decisions (pure) ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    local_queue: str
    admission_check: str
    members: tuple[str, ...]
    rung: str  # "" for the last step


@dataclass(frozen=True)
class Ladder:
    steps: tuple[Step, ...]

    @classmethod
    def from_json(cls, text: str) -> Ladder:
        return cls(tuple(Step(s["localQueue"], s["admissionCheck"], tuple(s.get("members") or ()), s.get("rung", ""))
                         for s in json.loads(text)))

    def index(self, local_queue: str) -> int | None:
        return next((i for i, step in enumerate(self.steps) if step.local_queue == local_queue), None)


@dataclass(frozen=True)
class CheckState:
    name: str
    state: str
    retry_count: int
    message: str
    since: datetime.datetime | None = None  # lastTransitionTime: in this state since


@dataclass(frozen=True)
class LadderView:
    """The parts of a manager Workload the ladder reads."""

    name: str
    namespace: str
    queue_name: str
    active: bool
    quota_reserved: bool
    rayjob: str | None
    checks: tuple[CheckState, ...]
    evicted_message: str  # the Evicted condition's message while it is True
    created: datetime.datetime | None = None

    @classmethod
    def from_object(cls, obj: Mapping) -> LadderView:
        meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
        conditions = {c["type"]: c for c in status.get("conditions") or []}
        evicted = conditions.get("Evicted") or {}
        return cls(
            name=meta["name"], namespace=meta.get("namespace", ""), queue_name=spec.get("queueName", ""),
            active=spec.get("active", True) is not False,
            quota_reserved=(conditions.get("QuotaReserved") or {}).get("status") == "True",
            rayjob=next((o["name"] for o in meta.get("ownerReferences") or [] if o.get("kind") == "RayJob"), None),
            checks=tuple(CheckState(c["name"], c.get("state", ""), int(c.get("retryCount") or 0), c.get("message", ""),
                                    decisions.parse_time(c.get("lastTransitionTime")))
                         for c in status.get("admissionChecks") or []),
            created=decisions.parse_time(meta.get("creationTimestamp")),
            evicted_message=evicted.get("message", "") if evicted.get("status") == "True" else "")

    def check(self, name: str) -> CheckState | None:
        return next((c for c in self.checks if c.name == name), None)


def evicted_by_member(step: Step, view: LadderView) -> bool:
    """The step's member evicted the job it had admitted (a stockout past its podsReadyTimeout, a preemption) or was
    lost while running it: MultiKueue set the step's check to Retry, and the eviction that follows counts it."""
    check = view.check(step.admission_check)
    return check is not None and (check.state == "Retry" or check.retry_count >= 1)


def waiting_since(step: Step, view: LadderView) -> datetime.datetime | None:
    """Since when the job waits at `step` without being admitted there (None: admitted). The step's check entry is
    written when the job comes to the step (route D's repoint, or the Workload's creation) and its state's time
    changes when a member admits it; without an entry yet, the Workload's creation."""
    check = view.check(step.admission_check)
    if check is None:
        return view.created
    if check.state == "Ready":
        return None
    return check.since or view.created


def decide(ladder: Ladder, view: LadderView, job_move: str | None, now: datetime.datetime,
           step_wait: datetime.timedelta | None = None) -> StartMove | FinishMove | None:
    """The one next step for a manager Workload owned by a RayJob; None when there is nothing to do.

    A move in progress is finished first; never past the last step (DWS everywhere: the first member provisioned
    wins, as without a ladder); an inactive Workload that is not being moved is left alone (deactivated by someone
    else). Two causes: the step's member evicted it, or (with `step_wait`) the step has not admitted it for that
    long: its capacity is in use (a reservation or on-demand slice that is free admits within a second)."""
    pending = Move.from_json(job_move)
    if pending is not None and pending.state == MOVING:
        return FinishMove(pending)
    if view.rayjob is None or not view.active:
        return None
    index = ladder.index(view.queue_name)
    if index is None or index + 1 >= len(ladder.steps):
        return None
    step, after = ladder.steps[index], ladder.steps[index + 1]
    if evicted_by_member(step, view):
        reason = MEMBER_EVICTED
    else:
        since = waiting_since(step, view)
        if step_wait is None or since is None or now - since < step_wait:
            return None
        reason = STEP_BUSY
    return StartMove(Move(step.local_queue, after.local_queue, after.local_queue, reason,
                          decisions.format_time(now)))


def next_look(ladder: Ladder, view: LadderView, step_wait: datetime.timedelta | None,
              now: datetime.datetime) -> float | None:
    """Seconds until the step wait of a job waiting at a step before the last ends (None: nothing to wait for)."""
    index = ladder.index(view.queue_name)
    if step_wait is None or index is None or index + 1 >= len(ladder.steps) or not view.active:
        return None
    since = waiting_since(ladder.steps[index], view)
    return None if since is None else max((since + step_wait - now).total_seconds(), 0.0) + 0.05


def evicting_member(step: Step | None, view: LadderView) -> str:
    """Who evicted it: MultiKueue names the member in its messages; a one-member step names it anyway."""
    check = view.check(step.admission_check) if step else None
    for text in (check.message if check else "", view.evicted_message):
        found = _MEMBER_IN_MESSAGE.search(text or "")
        if found:
            return found.group(1)
    return step.members[0] if step and len(step.members) == 1 else "?"


def move_message(move: Move, member: str) -> str:
    cause = (f"member {member} evicted it (its pods were not ready within the member's podsReadyTimeout, it was "
             "preempted there, or the member was lost)" if move.reason == MEMBER_EVICTED
             else f"the step did not admit it in time (member {member}'s capacity there is in use)")
    return (f"moved from step {move.from_flavor} to step {move.to_flavor} (LocalQueue {move.from_flavor} -> "
            f"{move.to_local_queue}): {cause}")


# ---- the I/O ----------------------------------------------------------------------------------------------------


class LadderController:
    def __init__(self, api_client: client.ApiClient, ladder: Ladder, namespace: str,
                 step_wait: datetime.timedelta | None = None, clock: Callable[[], datetime.datetime] = utcnow):
        self.api = dynamic.DynamicClient(api_client)
        self.core = client.CoreV1Api(api_client)
        self.workloads = self.api.resources.get(api_version=WORKLOAD[0], kind=WORKLOAD[1])
        self.rayjobs = self.api.resources.get(api_version=RAYJOB[0], kind=RAYJOB[1])
        self.ladder, self.namespace, self.step_wait, self.clock = ladder, namespace, step_wait, clock
        self.queue = WorkQueue()
        self._lock = threading.Lock()
        self._views: dict[Key, LadderView] = {}
        self._workload_of_job: dict[Key, Key] = {}
        self._job_moves: dict[Key, str | None] = {}
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
        for item in items:
            self._workload_changed("ADDED", item)

    def _workload_changed(self, event_type: str, obj: dict) -> None:
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        with self._lock:
            if event_type == "DELETED":
                view = self._views.pop(key, None)
                if view is not None and view.rayjob:
                    self._workload_of_job.pop((key[0], view.rayjob), None)
                return
            view = LadderView.from_object(obj)
            self._views[key] = view
            if view.rayjob:
                self._workload_of_job[(key[0], view.rayjob)] = key
        self.queue.add(key)

    def _rayjobs_listed(self, items: list[dict]) -> None:
        with self._lock:
            self._job_moves.clear()
        for item in items:
            self._rayjob_changed("ADDED", item)

    def _rayjob_changed(self, event_type: str, obj: dict) -> None:
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        annotation = (obj["metadata"].get("annotations") or {}).get(FAILOVER_ANNOTATION)
        with self._lock:
            if event_type == "DELETED":
                self._job_moves.pop(key, None)
                return
            changed = self._job_moves.get(key) != annotation
            self._job_moves[key] = annotation
            workload = self._workload_of_job.get(key)
        if changed and workload is not None:
            self.queue.add(workload)

    # ---- the work loop -----------------------------------------------------------------------------------------
    def resync(self) -> None:
        with self._lock:
            keys = list(self._views)
        for key in keys:
            self.queue.add(key)

    def work(self, stopping: threading.Event) -> None:
        while not stopping.is_set():
            key = self.queue.get(timeout=1.0)
            if key is None:
                continue
            try:
                self.reconcile_key(key)
            except ApiException as error:
                if error.status not in (404, 409):
                    log.warning("%s/%s: %s; queued again", *key, error)
                self.queue.add(key, delay=0.2 if error.status in (404, 409) else 1.0)
            except Exception:  # noqa: BLE001 - one bad object must not end the worker
                log.exception("%s/%s: reconcile failed; queued again", *key)
                self.queue.add(key, delay=5.0)
            finally:
                self.queue.done(key)

    def reconcile_key(self, key: Key) -> int:
        """Decide on the cached view; before acting, decide again on the objects as they are now (a cache may lag
        by an event: a move just finished must not be started again). The number of moves carried on."""
        with self._lock:
            view = self._views.get(key)
            annotation = self._job_moves.get((key[0], view.rayjob)) if view and view.rayjob else None
        if view is None or view.rayjob is None:
            return 0
        now = self.clock()
        if decide(self.ladder, view, annotation, now, self.step_wait) is None:
            wait = next_look(self.ladder, view, self.step_wait, now)
            if wait is not None:  # the step wait ends at a known time: look again then
                self.queue.add(key, delay=wait)
            return 0
        workload, job = self._get(self.workloads, key[1], key[0]), self._get(self.rayjobs, view.rayjob, key[0])
        if workload is None or job is None:
            return 0
        view = LadderView.from_object(workload)
        annotation = (job["metadata"].get("annotations") or {}).get(FAILOVER_ANNOTATION)
        action = decide(self.ladder, view, annotation, self.clock(), self.step_wait)
        if isinstance(action, StartMove):
            index = self.ladder.index(view.queue_name)
            member = evicting_member(self.ladder.steps[index] if index is not None else None, view)
            log.info("%s/%s: starting a move from step %s to %s (%s, member %s)", key[0], view.rayjob,
                     action.move.from_flavor, action.move.to_flavor, action.move.reason, member)
            self._patch(self.rayjobs, job, {"metadata": {"annotations": {FAILOVER_ANNOTATION: action.move.to_json()}}})
            self.moves_started += 1
            self._finish(action.move, key[1], key[0], member)
            return 1
        if isinstance(action, FinishMove):
            index = self.ladder.index(action.move.from_flavor)
            self._finish(action.move, key[1], key[0], self.ladder.steps[index].members[0]
                         if index is not None and len(self.ladder.steps[index].members) == 1 else "?")
            return 1
        return 0

    # ---- the move (route D on the manager) ---------------------------------------------------------------------
    def _finish(self, move: Move, workload_name: str, namespace: str, member: str) -> bool:
        """Each pass reads both objects and does the first thing left to do, so it resumes from any point. True
        once the move is complete; False when Kueue has not caught up within MOVE_WAIT_SECONDS (queued again)."""
        to = self.ladder.index(move.to_local_queue)
        to_check = self.ladder.steps[to].admission_check if to is not None else None
        deadline = time.monotonic() + MOVE_WAIT_SECONDS
        while True:
            workload = self._get(self.workloads, workload_name, namespace)
            if workload is None:
                return False
            view = LadderView.from_object(workload)
            job = self._get(self.rayjobs, view.rayjob, namespace) if view.rayjob else None
            if job is None:
                return False
            label = (job["metadata"].get("labels") or {}).get(QUEUE_LABEL)
            if view.queue_name == move.to_local_queue and label == move.to_local_queue and view.active:
                self._record_done(job, move, member)
                return True
            if view.queue_name != move.to_local_queue and view.active:  # 1. deactivate
                self._patch(self.workloads, workload, {"spec": {"active": False}})
                continue
            state = (job.get("status") or {}).get("jobDeploymentStatus") or ""
            if (view.quota_reserved and job["spec"].get("suspend") and state not in INACTIVE_STATES):
                # 2. Kueue suspended the manager's RayJob; its copied status still says it runs: Kueue would wait
                # for a member to report otherwise (none will, if the member is lost).
                self._patch(self.rayjobs.status, job, {"status": {"jobDeploymentStatus": "Suspended"}})
                continue
            if view.quota_reserved:  # 3. wait for the quota to be released
                if not self._wait(deadline):
                    return False
                continue
            if label != move.to_local_queue:  # 4. relabel, then repoint
                self._patch(self.rayjobs, job, {"metadata": {"labels": {QUEUE_LABEL: move.to_local_queue}}})
                continue
            if view.queue_name != move.to_local_queue:
                self._patch(self.workloads, workload, {"spec": {"queueName": move.to_local_queue}})
                continue
            if [c.name for c in view.checks] != [to_check]:  # 5. the new step's check, and only it
                if not self._wait(deadline):
                    return False
                continue
            self._patch(self.workloads, workload, {"spec": {"active": True}})  # 6. reactivate

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
        self._patch(self.rayjobs, job, {"metadata": {"annotations": {
            FAILOVER_ANNOTATION: move.done().to_json(),
            decisions.MOVES_ANNOTATION: decisions.with_move_recorded(meta.get("annotations"), move)}}})
        message = move_message(move, member)
        log.info("%s/%s: %s", meta["namespace"], meta["name"], message)
        rayjob_event(self.core, meta, COMPONENT, EVENT_REASON, message, "Normal", self.clock())

    # ---- reads and writes --------------------------------------------------------------------------------------
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


def main() -> int:
    from failover.cluster_client import api_client

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    ladder = Ladder.from_json(os.environ["FLEET_LADDER"])
    wait = os.environ.get("FLEET_STEP_WAIT_SECONDS")
    controller = LadderController(api_client(), ladder, os.environ.get("FLEET_NAMESPACE", "tpu-fleet"),
                                  datetime.timedelta(seconds=float(wait)) if wait else None)
    resync = float(os.environ.get("LADDER_RESYNC_SECONDS", "60"))
    informers = controller.informers()
    for informer in informers:
        informer.start()
    for informer in informers:  # a half-done move is only seen with its RayJob's annotation
        while not informer.synced.wait(timeout=10):
            log.info("waiting for the first list of %s", informer.watched.resource)
    stopping = threading.Event()
    for number in range(int(os.environ.get("LADDER_WORKERS", "2"))):
        threading.Thread(target=controller.work, args=(stopping,), name=f"worker-{number}", daemon=True).start()
    log.info("ladder: %s", " -> ".join(f"{s.local_queue} [{', '.join(s.members)}]" for s in ladder.steps))
    controller.resync()
    while True:
        time.sleep(resync)
        controller.resync()


if __name__ == "__main__":
    sys.exit(main())
