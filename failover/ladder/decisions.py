"""What the fleet's ladder controller decides (failover/ladder/controller.py carries it out), as pure functions of
what it reads: the ladder and its steps, the manager's Workload as a `LadderView`, a job's own settings (`JobMeta`),
what a step's member says (a stockout since, a lost slice); no I/O here. See failover/ladder/__init__.py for the
program and its rules.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from failover.api import (CHECKPOINTING, FAILOVER_ANNOTATION, GAVE_UP, GAVE_UP_ANNOTATION, GIVING_UP,
                          LOSS_EVENT_REASON, MAX_RUN_ANNOTATION, MAX_WAIT_ANNOTATION, MEMBER_EVICTED, MEMBER_NOT_READY,
                          MEMBER_SLICE_LOST, MEMBER_STOCKOUT, MOVES_ANNOTATION, MOVING, QUEUE_LABEL,
                          SCALE_UP_FAILURE_REASONS, STEP_BUSY, STOCKOUT_MESSAGE, TPU_RESOURCE, FinishMove, GiveUp,
                          Ladder, LostSlice, Move, StartMove, Step, format_time, parse_time, reactivation_step,
                          stockout_since)
from failover.slices import waiting_until

COMPONENT = "tpu-fallback-ladder"
EVENT_REASON = "MovedToNextStep"
GAVE_UP_REASON = "GaveUp"  # the Event when a job is given up
# On the manager's Workload: the move in progress (a Move's JSON), written in the same write as `spec.active=false`
# and removed in the same write as `spec.active=true`. One write, not two: with the move written on the RayJob first
# and the deactivation after it, a controller killed in between left the Workload active at the step it was leaving,
# and MultiKueue dispatched it there again while the controller restarted (issue 27; on GKE a restart is a container
# start, tens of seconds). The RayJob's annotation (FAILOVER_ANNOTATION: the move, its history, ops status) follows.
WORKLOAD_MOVE_ANNOTATION = "tpu-fallback/ladder-move"
# On the manager's Workload: the give-up in progress (a GiveUp's JSON), for the same reason, written with
# `spec.active=false` and removed once the RayJob records it done (GAVE_UP_ANNOTATION).
WORKLOAD_GIVE_UP_ANNOTATION = "tpu-fallback/ladder-give-up"
NEVER = "none"
# MultiKueue reconciles a Workload one pass at a time, and a pass that reaches a member which stopped answering (the
# old step's, deleting its copy there in a move) holds that Workload until client-go gives up on the connection:
# 53 s with client-go's defaults (HTTP/2 health check, 30 s idle + 15 s ping, then a 10 s TLS handshake; the test
# tier shortens the first two: testbed/cluster.py KUEUE_CLIENT_ENV). Until MultiKueue has sent
# the job to the step's member its step wait has not begun (`waiting_since`); after this long it begins anyway, so a
# step whose member Kueue never reaches is left as a busy one.
DISPATCH_BOUND = datetime.timedelta(seconds=120)
# The API's timestamps (creationTimestamp, a condition's or check's lastTransitionTime: metav1.Time) have whole
# seconds: the moment lies up to a second after the stamp. A wait counted from the end of that second never ends
# early (counted from the stamp, a step wait of 5 s could end after 4.1 s); it may end up to a second late.
STAMP_RESOLUTION = datetime.timedelta(seconds=1)
# How long before the end of a member's podsReadyTimeout the ladder moves a job whose pods are not ready there. The
# member's clock starts when it admits the copy, before the manager's check turns Ready (the stamp the ladder counts
# from: 0.05-1 s later, and whole seconds); what is left covers the ladder's own reaction (a work queue pass and one
# write) on a loaded machine. On GKE podsReadyTimeout is minutes (fallback.podsReadyTimeout, 15m by default).
PODS_READY_LEAD = datetime.timedelta(seconds=5)
WAIT_FOR_START = "WaitForStart"  # PodsReady's reason while a job's pods were not ready since its admission (Kueue)
# The manager's RayJob status that Kueue reads as "still running" (rayjob_controller.go IsActive: anything but
# Suspended and New); an empty status releases at once (measured on the tier).
# Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/controller/jobs/rayjob/rayjob_controller.go#L107-L110
INACTIVE_STATES = frozenset({"Suspended", "New", ""})
_MEMBER_IN_MESSAGE = re.compile(r'worker cluster: "([^"]+)"')
_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")

Key = tuple[str, str]


def parse_duration(text: str | None) -> datetime.timedelta | None:
    """A duration as the stack's config writes them (90s, 15m, 2h, 1h30m, 1d); None when it is not one or is 0."""
    found = _DURATION.match((text or "").strip())
    if not found or not any(found.groups()):
        return None
    days, hours, minutes, seconds = (int(g or 0) for g in found.groups())
    total = datetime.timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    return total if total.total_seconds() > 0 else None


def format_duration(delta: datetime.timedelta) -> str:
    seconds = int(round(delta.total_seconds()))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return "".join(f"{value}{unit}" for value, unit in ((hours, "h"), (minutes, "m"), (seconds, "s")) if value) or "0s"


# ---- the decisions (pure) ---------------------------------------------------------------------------------------


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
    admitted: bool = False  # Admitted=True: a member admitted it (on the manager, the MultiKueue check is Ready)
    finished: bool = False
    # PodsReady: True while a member runs it; its lastTransitionTime while False (since when it has not run; Kueue
    # changes it only when the status changes: a job that never ran keeps the time it was first set).
    pods_ready: bool = False
    pods_not_ready_since: datetime.datetime | None = None
    pods_not_ready_reason: str = ""  # PodsReady's reason while False: WAIT_FOR_START, or WaitForRecovery (it had run)
    nominated: tuple[str, ...] = ()  # the members MultiKueue sent it to and that have not admitted it (yet)
    move: str | None = None  # WORKLOAD_MOVE_ANNOTATION: the move this deactivation is part of
    give_up: str | None = None  # WORKLOAD_GIVE_UP_ANNOTATION: the give-up this deactivation is
    requeue_state: bool = False  # status.requeueState is set (a requeue backoff Kueue clears while it is inactive)
    cluster_name: str | None = None  # status.clusterName: the member MultiKueue runs it in (set once one admitted it)
    # A DWS run's limit, counted from its admission (MAX_RUN_ANNOTATION, which Kueue copies from the RayJob)
    max_run_seconds: int | None = None
    tpu_chips: int = 0  # the TPU chips the job needs (its pod sets' counts times their requests): a climb's room
    tpu_hosts: int = 0  # its TPU pods, one per host

    @classmethod
    def from_object(cls, obj: Mapping) -> LadderView:
        meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
        conditions = {c["type"]: c for c in status.get("conditions") or []}
        evicted = conditions.get("Evicted") or {}
        pods_ready = conditions.get("PodsReady") or {}
        return cls(
            name=meta["name"], namespace=meta.get("namespace", ""), queue_name=spec.get("queueName", ""),
            active=spec.get("active", True) is not False,
            quota_reserved=(conditions.get("QuotaReserved") or {}).get("status") == "True",
            rayjob=next((o["name"] for o in meta.get("ownerReferences") or [] if o.get("kind") == "RayJob"), None),
            checks=tuple(CheckState(c["name"], c.get("state", ""), int(c.get("retryCount") or 0), c.get("message", ""),
                                    parse_time(c.get("lastTransitionTime")))
                         for c in status.get("admissionChecks") or []),
            created=parse_time(meta.get("creationTimestamp")),
            evicted_message=evicted.get("message", "") if evicted.get("status") == "True" else "",
            admitted=(conditions.get("Admitted") or {}).get("status") == "True",
            finished=(conditions.get("Finished") or {}).get("status") == "True",
            pods_ready=pods_ready.get("status") == "True",
            pods_not_ready_since=parse_time(pods_ready.get("lastTransitionTime"))
            if pods_ready.get("status") == "False" else None,
            pods_not_ready_reason=pods_ready.get("reason", "") if pods_ready.get("status") == "False" else "",
            nominated=tuple(status.get("nominatedClusterNames") or ()),
            move=(meta.get("annotations") or {}).get(WORKLOAD_MOVE_ANNOTATION),
            give_up=(meta.get("annotations") or {}).get(WORKLOAD_GIVE_UP_ANNOTATION),
            requeue_state=status.get("requeueState") is not None,
            cluster_name=status.get("clusterName") or None,
            max_run_seconds=_whole_seconds((meta.get("annotations") or {}).get(MAX_RUN_ANNOTATION)),
            **_tpus(spec))

    def check(self, name: str) -> CheckState | None:
        return next((c for c in self.checks if c.name == name), None)


def _whole_seconds(text: str | None) -> int | None:
    return int(text) if text is not None and str(text).isdigit() else None


def _tpus(spec: Mapping) -> dict[str, int]:
    """{tpu_chips, tpu_hosts} of a Workload's pod sets: the TPU pods (count) and their chips (count x request)."""
    chips = hosts = 0
    for pod_set in spec.get("podSets") or []:
        containers = ((pod_set.get("template") or {}).get("spec") or {}).get("containers") or []
        per_pod = sum(int(((c.get("resources") or {}).get("requests") or {}).get(TPU_RESOURCE, 0)) for c in containers)
        if per_pod:
            chips += int(pod_set.get("count", 1)) * per_pod
            hosts += int(pod_set.get("count", 1))
    return {"tpu_chips": chips, "tpu_hosts": hosts}


@dataclass(frozen=True)
class StartGiveUp:
    give_up: GiveUp


@dataclass(frozen=True)
class FinishGiveUp:
    give_up: GiveUp


def evicted_by_member(step: Step, view: LadderView) -> bool:
    """The step's member evicted the job it had admitted (a stockout past its podsReadyTimeout, a preemption) or was
    lost while running it: MultiKueue set the step's check to Retry, and the eviction that follows counts it."""
    check = view.check(step.admission_check)
    return check is not None and (check.state == "Retry" or check.retry_count >= 1)


def running_member(step: Step, view: LadderView) -> str | None:
    """The member that admitted the job at `step`: a one-member step's member, or at the last step (every member) the
    one MultiKueue names in `status.clusterName`; None while no member has admitted it there."""
    if admitted_at(step, view) is None:
        return None
    if step.member is not None:
        return step.member
    return view.cluster_name if view.cluster_name in step.members else None


def admitted_at(step: Step, view: LadderView) -> datetime.datetime | None:
    """When the step's member admitted the job (its check turned Ready); None while it is not admitted there."""
    check = view.check(step.admission_check)
    return check.since if check is not None and check.state == "Ready" and view.admitted else None


def dispatched(step: Step, view: LadderView) -> bool:
    """Whether MultiKueue has sent the job to the step's members: it names them in `nominatedClusterNames` before it
    creates the copies there (multikueue/workload.go nominateAndSynchronizeWorkers)."""
    return any(member in view.nominated for member in step.members)


def waiting_since(step: Step, view: LadderView, dispatched_seen: datetime.datetime | None = None
                  ) -> datetime.datetime | None:
    """Since when the job waits at `step` without being admitted there (None: admitted). The step's check entry is
    written when the job comes to the step (route D's repoint, or the Workload's creation) and its state's time
    changes when a member admits it; without an entry yet (the manager's own quota for the step is in use), the
    Workload's creation. With the manager's quota reserved, the wait is the member's: it begins once MultiKueue has
    sent the job there (`dispatched_seen`: when the controller saw it, if it did), or DISPATCH_BOUND after the job
    came to the step."""
    check = view.check(step.admission_check)
    if check is None:
        return _stamp_end(view.created)
    if check.state == "Ready":
        return None
    since = _stamp_end(check.since or view.created)
    if since is None or not view.quota_reserved:
        return since
    if not dispatched(step, view):
        return since + DISPATCH_BOUND
    return max(since, dispatched_seen) if dispatched_seen is not None else since


def _stamp_end(stamp: datetime.datetime | None) -> datetime.datetime | None:
    """The latest moment an API timestamp may stand for (STAMP_RESOLUTION)."""
    return stamp + STAMP_RESOLUTION if stamp is not None else None


def unadmitted_since(view: LadderView) -> datetime.datetime | None:
    """Since when no member has run the job: its submission, or the end of its last run (PodsReady turned False);
    None while a member admits it (it may be starting: its member's podsReadyTimeout and the ladder judge that)."""
    if view.admitted or view.pods_ready or view.finished:
        return None
    moments = [m for m in (view.created, view.pods_not_ready_since) if m is not None]
    return _stamp_end(max(moments)) if moments else None


def max_wait_of(fleet_max_wait: datetime.timedelta | None, job_max_wait: str | None
                ) -> tuple[datetime.timedelta | None, str]:
    """The job's limit and where it comes from: its RayJob's annotation (a duration, or `none`) over the fleet's."""
    if job_max_wait is not None:
        if job_max_wait.strip().lower() == NEVER:
            return None, MAX_WAIT_ANNOTATION
        parsed = parse_duration(job_max_wait)
        if parsed is not None:
            return parsed, MAX_WAIT_ANNOTATION
    return fleet_max_wait, "fleet.maxWait"


def decide(ladder: Ladder, view: LadderView, job_move: str | None, now: datetime.datetime,
           step_wait: datetime.timedelta | None = None, *, max_wait: datetime.timedelta | None = None,
           job_max_wait: str | None = None, gave_up: str | None = None,
           stockout: datetime.datetime | None = None, dispatched_seen: datetime.datetime | None = None,
           lost: LostSlice | None = None) -> StartMove | FinishMove | StartGiveUp | FinishGiveUp | None:
    """The one next step for a manager Workload owned by a RayJob; None when there is nothing to do.

    A move in progress is finished first, then a give-up in progress; never past the last step (DWS everywhere: the
    first member provisioned wins, as without a ladder); an inactive Workload that is not being moved is left alone
    (deactivated by someone else, or given up). A job no member admits `max_wait` (or its own annotation's) after its
    submission or its last run is given up, at any step. Four causes move a job on: the step's member evicted it;
    the step's member reports a stockout for its pods (`stockout`: since when, this admission) for its grace period;
    its pods have not been ready there and the member's podsReadyTimeout is about to end (`not_ready_deadline`: a
    stockout nobody reports, moved before the member evicts it); or (with `step_wait`) the step has not admitted it
    for that long since the job was sent there (`waiting_since`): its capacity is in use (a reservation or on-demand
    slice that is free admits within a second). And a fifth, once the job runs: the member running it recorded that
    it lost its slice (`lost`, on the member's RayJob) and the slice was not back by the end of the member's recovery
    wait (`lost_slice_over`); until then the member's stockout reports do not count. At the last step that fifth
    cause requeues the job there (a move to the same step, `Move.requeue`). The move in progress is the one the
    Workload carries (written with its deactivation), or else the RayJob's (between the reactivation and the record;
    or started by an older controller, which wrote it there first)."""
    for pending in (Move.from_json(view.move), Move.from_json(job_move)):
        if pending is not None and pending.state == MOVING:
            return FinishMove(pending)
    for pending_give_up in (GiveUp.from_json(view.give_up), GiveUp.from_json(gave_up)):
        if pending_give_up is not None and pending_give_up.state == GIVING_UP:
            return FinishGiveUp(pending_give_up)
    giving = GiveUp.from_json(gave_up)
    if view.rayjob is None or not view.active or view.finished:
        return None
    index = ladder.index(view.queue_name)
    if index is None:
        return None
    limit, source = max_wait_of(max_wait, job_max_wait)
    since = unadmitted_since(view)
    if giving is None and limit is not None and since is not None and now - since >= limit:
        return StartGiveUp(GiveUp(format_time(now), format_duration(limit), format_duration(now - since),
                                  view.queue_name, source))
    step = ladder.steps[index]
    if index + 1 >= len(ladder.steps):
        # No step after the last: a job whose slice the member recorded lost, and that did not come back within the
        # member's recovery wait, is requeued here (a move to the same step): its copy in that member goes with the
        # deactivation, and MultiKueue sends it to every member again, where DWS asks for a new slice.
        if lost_slice_over(step, view, lost, now):
            return StartMove(Move(step.local_queue, step.local_queue, step.local_queue, MEMBER_SLICE_LOST,
                                  format_time(now), member=running_member(step, view) or ""))
        return None
    after = ladder.steps[index + 1]
    if evicted_by_member(step, view):
        reason = MEMBER_EVICTED
    elif lost_slice_over(step, view, lost, now):
        reason = MEMBER_SLICE_LOST
    elif lost_slice_waiting(step, view, lost, now):
        return None  # the member's stockout reports are about the lost slice's replacement: its wait rules, as in
        # the regional controller (a slice may come back within it)
    elif (stockout is not None and step.stockout_grace is not None and admitted_at(step, view) is not None
          and not view.pods_ready and now - stockout >= step.stockout_grace):  # ready: the stockout is over
        reason = MEMBER_STOCKOUT
    elif (deadline := not_ready_deadline(step, view)) is not None and now >= deadline:
        reason = MEMBER_NOT_READY
    else:
        waiting = waiting_since(step, view, dispatched_seen)
        if step_wait is None or waiting is None or now - waiting < step_wait:
            return None
        reason = STEP_BUSY
    return StartMove(Move(step.local_queue, after.local_queue, after.local_queue, reason, format_time(now),
                          member=running_member(step, view) or evicting_member(step, view)))


def not_ready_deadline(step: Step, view: LadderView) -> datetime.datetime | None:
    """When the ladder moves a job whose pods have not been ready since the step's member admitted it: PODS_READY_LEAD
    before the member's podsReadyTimeout ends (counted, as the member counts it, from its admission; the manager's
    check turned Ready a moment after it). None: not admitted there, ready, running before (its recovery is the
    member's and the lost-slice rules'), or a member that did not publish its timeout."""
    admitted = admitted_at(step, view)
    if (admitted is None or step.pods_ready_timeout is None or view.pods_ready
            or view.pods_not_ready_reason != WAIT_FOR_START):
        return None
    return admitted + step.pods_ready_timeout - PODS_READY_LEAD


def _loss_until(step: Step, view: LadderView, lost: LostSlice | None) -> datetime.datetime | None:
    """The end of the recovery wait of a loss that the member running the job (`running_member`) recorded for this
    admission and that is not recovered; None when there is none."""
    admitted = admitted_at(step, view)
    at, until = (parse_time(lost.at), waiting_until(lost)) if lost is not None else (None, None)
    if (running_member(step, view) is None or admitted is None or at is None or until is None
            or at < admitted - STAMP_RESOLUTION):
        return None
    return until


def lost_slice_over(step: Step, view: LadderView, lost: LostSlice | None, now: datetime.datetime) -> bool:
    """The member recorded a loss of this admission's slice, not recovered, and its recovery wait is over."""
    until = _loss_until(step, view, lost)
    return until is not None and now >= until


def lost_slice_waiting(step: Step, view: LadderView, lost: LostSlice | None, now: datetime.datetime) -> bool:
    """The member recorded a loss of this admission's slice and waits for it to come back."""
    until = _loss_until(step, view, lost)
    return until is not None and now < until


def next_look(ladder: Ladder, view: LadderView, step_wait: datetime.timedelta | None,
              now: datetime.datetime, *, max_wait: datetime.timedelta | None = None, job_max_wait: str | None = None,
              stockout: datetime.datetime | None = None, dispatched_seen: datetime.datetime | None = None,
              lost: LostSlice | None = None) -> float | None:
    """Seconds until the next moment a decision may change without Kueue writing anything: the end of the step wait
    of a job waiting at a step before the last, of its maximum wait, or of its member's stockout grace period
    (None: nothing to wait for)."""
    index = ladder.index(view.queue_name)
    if index is None or not view.active or view.finished:
        return None
    moments = []
    limit, _ = max_wait_of(max_wait, job_max_wait)
    since = unadmitted_since(view)
    if limit is not None and since is not None:
        moments.append(since + limit)
    step = ladder.steps[index]
    if (until := _loss_until(step, view, lost)) is not None:
        moments.append(until)
    if index + 1 < len(ladder.steps):
        waiting = waiting_since(step, view, dispatched_seen)
        if step_wait is not None and waiting is not None:
            moments.append(waiting + step_wait)
        if stockout is not None and step.stockout_grace is not None and admitted_at(step, view) is not None:
            moments.append(stockout + step.stockout_grace)
        if (deadline := not_ready_deadline(step, view)) is not None:
            moments.append(deadline)
    if not moments:
        return None
    return max((min(moments) - now).total_seconds(), 0.0) + 0.05


def deactivation(move: Move) -> dict:
    """Route D's first write on the manager's Workload: inactive, and why (WORKLOAD_MOVE_ANNOTATION)."""
    return {"metadata": {"annotations": {WORKLOAD_MOVE_ANNOTATION: move.to_json()}}, "spec": {"active": False}}


def give_up_deactivation(give_up: GiveUp) -> dict:
    """A give-up's first write on the manager's Workload: inactive, and why (WORKLOAD_GIVE_UP_ANNOTATION)."""
    return {"metadata": {"annotations": {WORKLOAD_GIVE_UP_ANNOTATION: give_up.to_json()}}, "spec": {"active": False}}


# ---- route D, one step at a time ------------------------------------------------------------------------------
# What a pass of a move (or a give-up) does next, from the manager's Workload and RayJob as read now: each pass does
# the first thing left to do and reads both again, so a restart (kill -9 included) resumes wherever the last one
# stopped. The controller (failover/ladder/controller.py) carries each step out as one guarded write, or a wait.
DONE = "done"  # move: active at the new step, the RayJob relabelled: record it done (Event first). Give-up: nothing
DEACTIVATE = "deactivate"  # the deactivation with the move (or give-up) on the Workload (one written by an older
#                            controller on the RayJob only)
RECORD = "record"  # the move (or give-up) on the RayJob too: ops status and the history read it there
MARK_SUSPENDED = "mark-suspended"  # the manager's RayJob Suspended: its copied status says it runs (INACTIVE_STATES)
WAIT_FOR_QUOTA = "wait-for-quota"  # Kueue has not released the quota yet (`spec.queueName` is immutable before)
RELABEL = "relabel"  # the RayJob's queue label to the new step's LocalQueue
REPOINT = "repoint"  # the Workload's `spec.queueName` to it
# The Workload's checks are not exactly the new step's yet: reactivated sooner, Kueue may reserve quota before it swaps
# them and MultiKueue dispatches with the old step's config (failover/ladder/__main__.py)
WAIT_FOR_CHECKS = "wait-for-checks"
# then WAIT_FOR_BACKOFF_RESET (Kueue has not cleared the requeue backoff yet) and REACTIVATE (active again, the move
# taken off the Workload), as in the regional controller: failover.api.reactivation_step
ANNOUNCE = "announce"  # give-up: its Event, then the done record on the RayJob
UNMARK = "unmark"  # give-up recorded: its annotation taken off the Workload, which stays inactive


def quota_step(view: LadderView, job: Mapping) -> str | None:
    """Route D's steps 2 and 3, after the deactivation (a give-up takes them too): None once the quota is free."""
    state = (job.get("status") or {}).get("jobDeploymentStatus") or ""
    if view.quota_reserved and (job.get("spec") or {}).get("suspend") and state not in INACTIVE_STATES:
        # Kueue suspended the manager's RayJob; its copied status still says it runs: Kueue would wait for a member
        # to report otherwise (none will, if the member is lost).
        return MARK_SUSPENDED
    return WAIT_FOR_QUOTA if view.quota_reserved else None


def next_in_move(move: Move, view: LadderView, job: Mapping, to_check: str | None) -> str:
    """Route D (failover/ladder/__main__.py) for `move`, its new step's admission check `to_check`: the next step. A
    requeue (`move.requeue`: the last step, to itself) takes the same steps but relabels and repoints nothing."""
    label = (job["metadata"].get("labels") or {}).get(QUEUE_LABEL)
    arrived = view.queue_name == move.to_local_queue
    recorded = Move.from_json((job["metadata"].get("annotations") or {}).get(FAILOVER_ANNOTATION))
    # A climb's record while the job saved (CHECKPOINTING) has the move's time and target too: not the move's yet.
    on_record = (recorded is not None and recorded.state != CHECKPOINTING
                 and (recorded.at, recorded.to_local_queue) == (move.at, move.to_local_queue))
    if move.requeue and view.active:
        # A requeue stays at its step: active again is done only after the deactivation, which the record on the
        # RayJob follows (written while inactive, below), so an active Workload without it is still to deactivate.
        return DONE if on_record else DEACTIVATE
    if arrived and label == move.to_local_queue and view.active:
        return DONE
    if not arrived and view.active:
        return DEACTIVATE
    if not on_record:
        return RECORD
    quota = quota_step(view, job)
    if quota is not None:
        return quota
    if label != move.to_local_queue:  # relabel, then repoint
        return RELABEL
    if not arrived:
        return REPOINT
    if [c.name for c in view.checks] != [to_check]:
        return WAIT_FOR_CHECKS
    return reactivation_step(view.requeue_state)


def next_in_give_up(give_up: GiveUp, view: LadderView, job: Mapping) -> str:
    """A give-up, as a move but with no new step: deactivate, release the quota, record on the RayJob, announce it
    (Event, then the done record), and take it off the Workload, which stays inactive."""
    if view.active:
        return DEACTIVATE
    quota = quota_step(view, job)
    if quota is not None:
        return quota
    current = GiveUp.from_json((job["metadata"].get("annotations") or {}).get(GAVE_UP_ANNOTATION))
    if current is not None and current.state == GAVE_UP:
        return UNMARK if view.give_up is not None else DONE
    if current is None or current.at != give_up.at:
        return RECORD
    return ANNOUNCE


def evicting_member(step: Step | None, view: LadderView) -> str:
    """Who evicted it: MultiKueue names the member in its messages; a one-member step names it anyway."""
    check = view.check(step.admission_check) if step else None
    for text in (check.message if check else "", view.evicted_message):
        found = _MEMBER_IN_MESSAGE.search(text or "")
        if found:
            return found.group(1)
    return step.members[0] if step and len(step.members) == 1 else "?"


def move_message(move: Move, member: str) -> str:
    cause = {MEMBER_EVICTED: f"member {member} evicted it (its pods were not ready within the member's "
                             "podsReadyTimeout, it was preempted there, or the member was lost)",
             MEMBER_STOCKOUT: f"member {member} reported no capacity for its pods (GKE's autoscaler: out of "
                              "resources) for the member's stockout grace period",
             MEMBER_NOT_READY: f"its pods were not ready in member {member} and the member's podsReadyTimeout was "
                               "about to end (moved before the member evicts it: MultiKueue would send it back there)",
             MEMBER_SLICE_LOST: f"member {member} recorded that the job lost its slice there and the slice was not "
                                "back within the member's recovery wait",
             }.get(move.reason, f"the step did not admit it in time (member {member}'s capacity there is in use)")
    if move.requeue:
        return (f"requeued at step {move.to_flavor} (LocalQueue {move.to_local_queue}), the last: {cause}; every "
                "member of the step is asked again")
    return (f"moved from step {move.from_flavor} to step {move.to_flavor} (LocalQueue {move.from_flavor} -> "
            f"{move.to_local_queue}): {cause}")


def stockout_in_member(events: Iterable[Mapping], cluster: str | None, admitted: datetime.datetime | None
                       ) -> datetime.datetime | None:
    """When the member's autoscaler first reported, for a pod of the job's RayCluster (KubeRay names them
    `<cluster>-...`) and since this admission, that it has no capacity (failover/api/events.py's test)."""
    if not cluster:
        return None
    pods = {(e.get("involvedObject") or {}).get("name") for e in events}
    return stockout_since(events, {p for p in pods if p and p.startswith(f"{cluster}-")}, admitted)


def is_stockout_event(event: Mapping) -> bool:
    return ((event.get("involvedObject") or {}).get("kind") == "Pod"
            and event.get("reason") in SCALE_UP_FAILURE_REASONS
            and bool(STOCKOUT_MESSAGE.search(event.get("message") or "")))


def is_slice_lost_event(event: Mapping) -> bool:
    """The Warning the member's failover controller makes on a RayJob when it records a lost slice."""
    return (event.get("involvedObject") or {}).get("kind") == "RayJob" and event.get("reason") == LOSS_EVENT_REASON


@dataclass(frozen=True)
class JobMeta:
    """What the ladder reads of a manager RayJob's metadata: its move, its own maximum wait, its give-up record."""

    move: str | None = None
    max_wait: str | None = None
    gave_up: str | None = None
    moves: str | None = None  # MOVES_ANNOTATION: its moves done (a climb reads their times and causes)

    @classmethod
    def of(cls, obj: Mapping) -> JobMeta:
        annotations = obj["metadata"].get("annotations") or {}
        return cls(annotations.get(FAILOVER_ANNOTATION), annotations.get(MAX_WAIT_ANNOTATION),
                   annotations.get(GAVE_UP_ANNOTATION), annotations.get(MOVES_ANNOTATION))
