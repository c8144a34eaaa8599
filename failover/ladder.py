"""The fleet's ladder controller (plan C, README "The fleet's ladder"): on a fleet's manager, moves a job to the next
step of the ladder when the member of its step evicted it, reports a stockout for it, or its step is busy; and gives
a job up when no step has admitted it within its maximum wait: `python -m failover.ladder`.

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

Early path: a one-member step's member reports that GKE's autoscaler has no capacity for the job's pods ("GCE out
of resources", the regional failover controller's test: failover/decisions.py stockout_since) while the copy there
is admitted. The manager reads it in the member itself, through the kubeconfig Secret MultiKueue uses: a watch of the
Warning Events about pods in the fleet's namespace there, and the member's RayJob for its RayCluster's name (the
pods are named after it). Once the member's stockout grace period (published with its steps) has passed since the
first such Event of this admission, the job moves on (reason MemberStockout), without waiting for the member's
podsReadyTimeout. The member's own failover controller never touches the fleet's copies.

Giving up (Kueue has none: kubernetes-sigs/kueue#8602): a job not admitted by any member `FLEET_MAX_WAIT_SECONDS`
(or its RayJob's `tpu-fallback/max-wait`: a duration, or `none`) after its submission, or after it last ran, is
deactivated (`spec.active=false` on the manager's Workload: MultiKueue deletes its copies and their
ProvisioningRequests), with the annotation `tpu-fallback/gave-up` on the RayJob (why, when, at which step) and a
Warning Event `GaveUp`. Written with the deactivation on the Workload (`tpu-fallback/ladder-give-up`, taken off once
the RayJob records it) and finished by any pass, as a move is.

The move is written on the manager's Workload in the same write as its deactivation (WORKLOAD_MOVE_ANNOTATION:
no moment when a move is decided and the job is still active at the step it leaves), then on the RayJob (the
regional controller's annotation and history, failover/decisions.py); each write is guarded by the resourceVersion it
was decided on, and each step of the move checks first: a restart, `kill -9` included, finishes the move it finds
and never starts a second one for a hop.

Configuration (environment, set by the fleet stack's Deployment, infra/fleet.py):
    FLEET_LADDER            JSON list of steps {localQueue, clusterQueue, admissionCheck, rung, members}, first first
    FLEET_NAMESPACE         the fleet's jobs' namespace (tpu-fleet)
    FLEET_STEP_WAIT_SECONDS how long a job may wait at a step before the last without being admitted there (its
                            member's capacity is in use: a reservation or on-demand slice admits at once when free)
    FLEET_MAX_WAIT_SECONDS  how long a job may wait without any member admitting it before it is given up (unset: never)
    FLEET_MEMBERS           JSON {member: its kubeconfig Secret}, FLEET_SECRETS_NAMESPACE (kueue-system): the early path
    FLEET_WATCH_SECONDS     how often the members' kubeconfigs are read again (a renewed token: new watches)
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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from kubernetes import client, dynamic
from kubernetes.client import ApiException

from failover import decisions
from failover.controller import RAYJOB, WORKLOAD, GuardedWrites, rayjob_event, utcnow
from failover.decisions import FAILOVER_ANNOTATION, MOVED, MOVING, QUEUE_LABEL, FinishMove, Move, StartMove, parse_time
from failover.slices import LOSS_EVENT_REASON, SLICE_LOST_ANNOTATION, LostSlice, waiting_until
from failover.informer import Informer, RawClient, Watched
from failover.workqueue import WorkQueue

log = logging.getLogger("tpu-fallback.ladder")
COMPONENT = "tpu-fallback-ladder"
EVENT_REASON = "MovedToNextStep"
GAVE_UP_REASON = "GaveUp"  # the Event when a job is given up
MEMBER_EVICTED = "MemberEvicted"  # the reason a move records: the step's member evicted the job
MEMBER_STOCKOUT = "MemberStockout"  # or: the member reported no capacity for its pods for its grace period
STEP_BUSY = "StepBusy"  # or: the step did not admit it within the step wait (its capacity is in use)
# or: the running job lost its slice in the step's member, and the member's controller recorded that it did not come
# back within the member's recovery wait for the rung (failover/slices.py: its annotation on the member's RayJob)
MEMBER_SLICE_LOST = "MemberSliceLost"
# On the manager's RayJob: the job's own maximum wait (a duration such as 90s, 2h, 1h30m, 1d; or "none": never give
# it up), over the fleet's `fleet.maxWait`.
MAX_WAIT_ANNOTATION = "tpu-fallback/max-wait"
# On the manager's RayJob: that the ladder gave the job up, why and when (JSON, see GiveUp); written once the Workload
# is deactivated (with WORKLOAD_GIVE_UP_ANNOTATION, so a restart finishes it), `done` once the Event is out.
GAVE_UP_ANNOTATION = "tpu-fallback/gave-up"
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
GIVING_UP, GAVE_UP = "deactivating", "done"
MOVE_WAIT_SECONDS = 15.0  # how long one pass waits for Kueue within a move; the next pass resumes it
# MultiKueue reconciles a Workload one pass at a time, and a pass that reaches a member which stopped answering (the
# old step's, deleting its copy there in a move) holds that Workload until client-go gives up on the connection:
# 53 s on the tier (HTTP/2 health check, 30 s idle + 15 s ping, then a 10 s TLS handshake). Until MultiKueue has sent
# the job to the step's member its step wait has not begun (`waiting_since`); after this long it begins anyway, so a
# step whose member Kueue never reaches is left as a busy one.
DISPATCH_BOUND = datetime.timedelta(seconds=120)
# The API's timestamps (creationTimestamp, a condition's or check's lastTransitionTime: metav1.Time) have whole
# seconds: the moment lies up to a second after the stamp. A wait counted from the end of that second never ends
# early (counted from the stamp, a step wait of 5 s could end after 4.1 s); it may end up to a second late.
STAMP_RESOLUTION = datetime.timedelta(seconds=1)
POLL_SECONDS = 0.05
# The manager's RayJob status that Kueue reads as "still running" (rayjob_controller.go IsActive: anything but
# Suspended and New); an empty status releases at once (measured, §8.4).
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
class Step:
    local_queue: str
    admission_check: str
    members: tuple[str, ...]
    rung: str  # "" for the last step
    stockout_grace: datetime.timedelta | None = None  # the member's stockout grace period (the early path)

    @property
    def member(self) -> str | None:
        """The member of a one-member step (a rung offered by one member); None for the last step."""
        return self.members[0] if self.rung and len(self.members) == 1 else None


@dataclass(frozen=True)
class Ladder:
    steps: tuple[Step, ...]

    @classmethod
    def from_json(cls, text: str) -> Ladder:
        return cls(tuple(
            Step(s["localQueue"], s["admissionCheck"], tuple(s.get("members") or ()), s.get("rung", ""),
                 datetime.timedelta(seconds=s["stockoutGracePeriodSeconds"])
                 if s.get("stockoutGracePeriodSeconds") is not None else None)
            for s in json.loads(text)))

    def index(self, local_queue: str) -> int | None:
        return next((i for i, step in enumerate(self.steps) if step.local_queue == local_queue), None)

    def step_of(self, local_queue: str) -> Step | None:
        index = self.index(local_queue)
        return None if index is None else self.steps[index]


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
    nominated: tuple[str, ...] = ()  # the members MultiKueue sent it to and that have not admitted it (yet)
    move: str | None = None  # WORKLOAD_MOVE_ANNOTATION: the move this deactivation is part of
    give_up: str | None = None  # WORKLOAD_GIVE_UP_ANNOTATION: the give-up this deactivation is

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
                                    decisions.parse_time(c.get("lastTransitionTime")))
                         for c in status.get("admissionChecks") or []),
            created=decisions.parse_time(meta.get("creationTimestamp")),
            evicted_message=evicted.get("message", "") if evicted.get("status") == "True" else "",
            admitted=(conditions.get("Admitted") or {}).get("status") == "True",
            finished=(conditions.get("Finished") or {}).get("status") == "True",
            pods_ready=pods_ready.get("status") == "True",
            pods_not_ready_since=decisions.parse_time(pods_ready.get("lastTransitionTime"))
            if pods_ready.get("status") == "False" else None,
            nominated=tuple(status.get("nominatedClusterNames") or ()),
            move=(meta.get("annotations") or {}).get(WORKLOAD_MOVE_ANNOTATION),
            give_up=(meta.get("annotations") or {}).get(WORKLOAD_GIVE_UP_ANNOTATION))

    def check(self, name: str) -> CheckState | None:
        return next((c for c in self.checks if c.name == name), None)


@dataclass(frozen=True)
class GiveUp:
    """That the ladder gave a job up; its JSON form is the RayJob annotation `tpu-fallback/gave-up`."""

    at: str  # RFC 3339
    max_wait: str  # the limit, as a duration (2h)
    waited: str  # how long it had waited, as a duration
    step: str  # the step (LocalQueue) it was waiting at
    source: str  # where the limit came from: fleet.maxWait or the RayJob's annotation
    state: str = GIVING_UP

    def to_json(self) -> str:
        return json.dumps({"at": self.at, "maxWait": self.max_wait, "waited": self.waited, "step": self.step,
                           "source": self.source, "state": self.state}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> GiveUp | None:
        if not text:
            return None
        try:
            data = json.loads(text)
            return cls(data["at"], data["maxWait"], data["waited"], data["step"], data["source"], data["state"])
        except (ValueError, KeyError, TypeError):
            return None

    def done(self) -> GiveUp:
        return GiveUp(self.at, self.max_wait, self.waited, self.step, self.source, GAVE_UP)

    def message(self) -> str:
        return (f"given up: no member admitted it within its maximum wait of {self.max_wait} ({self.source}); it "
                f"waited {self.waited}, last at step {self.step}. Its Workload is deactivated and its copies and "
                "DWS requests in the members are deleted; submit it again, or reactivate its Workload, to retry")


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
    submission or its last run is given up, at any step. Three causes move a job on: the step's member evicted it;
    the step's member reports a stockout for its pods (`stockout`: since when, this admission) for its grace period;
    or (with `step_wait`) the step has not admitted it for that long since the job was sent there (`waiting_since`):
    its capacity is in use (a reservation or on-demand slice that is free admits within a second). And a fourth,
    once the job runs: its member recorded that it lost its slice (`lost`, on the member's RayJob) and the slice
    was not back by the end of the member's recovery wait (`lost_slice_over`); until then the member's stockout
    reports do not count. The move in progress is the one the Workload carries (written with its deactivation), or
    else the RayJob's (between the reactivation and the record; or started by an older controller, which wrote it
    there first)."""
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
        return StartGiveUp(GiveUp(decisions.format_time(now), format_duration(limit), format_duration(now - since),
                                  view.queue_name, source))
    if index + 1 >= len(ladder.steps):
        return None
    step, after = ladder.steps[index], ladder.steps[index + 1]
    if evicted_by_member(step, view):
        reason = MEMBER_EVICTED
    elif lost_slice_over(step, view, lost, now):
        reason = MEMBER_SLICE_LOST
    elif lost_slice_waiting(step, view, lost, now):
        return None  # the member's stockout reports are about the lost slice's replacement: its wait rules, as in
        # the regional controller (a slice may come back within it)
    elif (stockout is not None and step.stockout_grace is not None and admitted_at(step, view) is not None
          and now - stockout >= step.stockout_grace):
        reason = MEMBER_STOCKOUT
    else:
        waiting = waiting_since(step, view, dispatched_seen)
        if step_wait is None or waiting is None or now - waiting < step_wait:
            return None
        reason = STEP_BUSY
    return StartMove(Move(step.local_queue, after.local_queue, after.local_queue, reason,
                          decisions.format_time(now)))


def _loss_until(step: Step, view: LadderView, lost: LostSlice | None) -> datetime.datetime | None:
    """The end of the recovery wait of a loss the member of a one-member step recorded for this admission and that
    is not recovered; None when there is none."""
    admitted = admitted_at(step, view)
    at, until = (parse_time(lost.at), waiting_until(lost)) if lost is not None else (None, None)
    if step.member is None or admitted is None or at is None or until is None or at < admitted - STAMP_RESOLUTION:
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
    if index + 1 < len(ladder.steps):
        step = ladder.steps[index]
        waiting = waiting_since(step, view, dispatched_seen)
        if step_wait is not None and waiting is not None:
            moments.append(waiting + step_wait)
        if stockout is not None and step.stockout_grace is not None and admitted_at(step, view) is not None:
            moments.append(stockout + step.stockout_grace)
        if (until := _loss_until(step, view, lost)) is not None:
            moments.append(until)
    if not moments:
        return None
    return max((min(moments) - now).total_seconds(), 0.0) + 0.05


def deactivation(move: Move) -> dict:
    """Route D's first write on the manager's Workload: inactive, and why (WORKLOAD_MOVE_ANNOTATION)."""
    return {"metadata": {"annotations": {WORKLOAD_MOVE_ANNOTATION: move.to_json()}}, "spec": {"active": False}}


def give_up_deactivation(give_up: GiveUp) -> dict:
    """A give-up's first write on the manager's Workload: inactive, and why (WORKLOAD_GIVE_UP_ANNOTATION)."""
    return {"metadata": {"annotations": {WORKLOAD_GIVE_UP_ANNOTATION: give_up.to_json()}}, "spec": {"active": False}}


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
             MEMBER_SLICE_LOST: f"member {member} recorded that the job lost its slice there and the slice was not "
                                "back within the member's recovery wait",
             }.get(move.reason, f"the step did not admit it in time (member {member}'s capacity there is in use)")
    return (f"moved from step {move.from_flavor} to step {move.to_flavor} (LocalQueue {move.from_flavor} -> "
            f"{move.to_local_queue}): {cause}")


def stockout_in_member(events: Iterable[Mapping], cluster: str | None, admitted: datetime.datetime | None
                       ) -> datetime.datetime | None:
    """When the member's autoscaler first reported, for a pod of the job's RayCluster (KubeRay names them
    `<cluster>-...`) and since this admission, that it has no capacity (failover/decisions.py's test)."""
    if not cluster:
        return None
    pods = {(e.get("involvedObject") or {}).get("name") for e in events}
    return decisions.stockout_since(events, {p for p in pods if p and p.startswith(f"{cluster}-")}, admitted)


def is_stockout_event(event: Mapping) -> bool:
    return ((event.get("involvedObject") or {}).get("kind") == "Pod"
            and event.get("reason") in decisions.SCALE_UP_FAILURE_REASONS
            and bool(decisions.STOCKOUT_MESSAGE.search(event.get("message") or "")))


def is_slice_lost_event(event: Mapping) -> bool:
    """The Warning the member's failover controller makes on a RayJob when it records a lost slice."""
    return (event.get("involvedObject") or {}).get("kind") == "RayJob" and event.get("reason") == LOSS_EVENT_REASON


# ---- the I/O ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobMeta:
    """What the ladder reads of a manager RayJob's metadata: its move, its own maximum wait, its give-up record."""

    move: str | None = None
    max_wait: str | None = None
    gave_up: str | None = None

    @classmethod
    def of(cls, obj: Mapping) -> JobMeta:
        annotations = obj["metadata"].get("annotations") or {}
        return cls(annotations.get(FAILOVER_ANNOTATION), annotations.get(MAX_WAIT_ANNOTATION),
                   annotations.get(GAVE_UP_ANNOTATION))


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
        """Queue the jobs a one-member step of `member` admits: a stockout there may be theirs."""
        with self._lock:
            keys = [key for key, view in self._views.items()
                    if (step := self.ladder.step_of(view.queue_name)) is not None and step.member == member
                    and admitted_at(step, view) is not None]
        for key in keys:
            self.queue.add(key)

    def _member_signals(self, view: LadderView) -> tuple[datetime.datetime | None, LostSlice | None]:
        """What the member of the job's one-member step says about this admission, read in the member: since when
        it reports no capacity for the job's pods (the autoscaler's Events about its RayCluster's pods), and the lost
        slice its failover controller recorded on the member's RayJob (SLICE_LOST_ANNOTATION)."""
        step = self.ladder.step_of(view.queue_name)
        if step is None or step.member is None or view.rayjob is None:
            return None, None
        since_admission = admitted_at(step, view)
        with self._lock:
            member = self._members.get(step.member)
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
                     step.member, type(error).__name__)
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
            index = self.ladder.index(view.queue_name)
            member = evicting_member(self.ladder.steps[index] if index is not None else None, view)
            log.info("%s/%s: starting a move from step %s to %s (%s, member %s)", key[0], view.rayjob,
                     action.move.from_flavor, action.move.to_flavor, action.move.reason, member)
            self._patch(self.workloads, workload, deactivation(action.move))  # the move and the deactivation: one write
            self.moves_started += 1
            self._finish(action.move, key[1], key[0], member)
            return 1
        if isinstance(action, FinishMove):
            index = self.ladder.index(action.move.from_flavor)
            self._finish(action.move, key[1], key[0], self.ladder.steps[index].members[0]
                         if index is not None and len(self.ladder.steps[index].members) == 1 else "?")
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
        for a member to report it), then record it done with an Event. Resumable from any point."""
        deadline = time.monotonic() + MOVE_WAIT_SECONDS
        while True:
            read = self._read(workload_name, namespace)
            if read is None:
                return False
            workload, view, job = read
            if view.active:  # (a give-up an older controller wrote on the RayJob only)
                self._patch(self.workloads, workload, give_up_deactivation(give_up))
                continue
            released = self._release_quota(view, job, deadline)
            if released is None:
                return False
            if not released:
                continue
            current = GiveUp.from_json((job["metadata"].get("annotations") or {}).get(GAVE_UP_ANNOTATION))
            if current is not None and current.state == GAVE_UP:
                if view.give_up is not None:  # recorded: taken off the Workload, which stays inactive
                    self._patch(self.workloads, workload, {"metadata": {"annotations": {
                        WORKLOAD_GIVE_UP_ANNOTATION: None}}})
                return True
            if current is None or current.at != give_up.at:  # on the RayJob too (ops status reads it there)
                self._patch(self.rayjobs, job, {"metadata": {"annotations": {GAVE_UP_ANNOTATION: give_up.to_json()}}})
                continue
            rayjob_event(self.core, job["metadata"], COMPONENT, GAVE_UP_REASON, give_up.message(), "Warning",
                         self.clock(), once=give_up.to_json())  # before the record, as a move's
            self._patch(self.rayjobs, job, {"metadata": {"annotations": {
                GAVE_UP_ANNOTATION: give_up.done().to_json()}}})
            log.info("%s/%s: %s", namespace, job["metadata"]["name"], give_up.message())

    # ---- the move (route D on the manager) ---------------------------------------------------------------------
    def _finish(self, move: Move, workload_name: str, namespace: str, member: str) -> bool:
        """Each pass reads both objects and does the first thing left to do, so it resumes from any point. True
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
            label = (job["metadata"].get("labels") or {}).get(QUEUE_LABEL)
            if view.queue_name == move.to_local_queue and label == move.to_local_queue and view.active:
                self._record_done(job, move, member)
                return True
            if view.queue_name != move.to_local_queue and view.active:  # 1. deactivate (a move an older
                self._patch(self.workloads, workload, deactivation(move))  # controller wrote on the RayJob only)
                continue
            recorded = Move.from_json((job["metadata"].get("annotations") or {}).get(FAILOVER_ANNOTATION))
            if recorded is None or (recorded.at, recorded.to_local_queue) != (move.at, move.to_local_queue):
                # The move on the RayJob too: ops status and the history read it there.
                self._patch(self.rayjobs, job, {"metadata": {"annotations": {FAILOVER_ANNOTATION: move.to_json()}}})
                continue
            released = self._release_quota(view, job, deadline)  # 2. and 3.
            if released is None:
                return False
            if not released:
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
            self._patch(self.workloads, workload, {  # 6. reactivate, the move taken off the Workload
                "spec": {"active": True}, "metadata": {"annotations": {WORKLOAD_MOVE_ANNOTATION: None}}})

    def _read(self, workload_name: str, namespace: str) -> tuple[dict, LadderView, dict] | None:
        """The manager's Workload, as read now, its view, and its RayJob; None once either is gone."""
        workload = self._get(self.workloads, workload_name, namespace)
        if workload is None:
            return None
        view = LadderView.from_object(workload)
        job = self._get(self.rayjobs, view.rayjob, namespace) if view.rayjob else None
        return None if job is None else (workload, view, job)

    def _release_quota(self, view: LadderView, job: dict, deadline: float) -> bool | None:
        """Route D's steps 2 and 3, which giving up takes too, after the deactivation: True once Kueue has
        released its quota; False after a write or a wait (read both again); None when Kueue has not released it
        by the deadline."""
        state = (job.get("status") or {}).get("jobDeploymentStatus") or ""
        if view.quota_reserved and job["spec"].get("suspend") and state not in INACTIVE_STATES:
            # 2. Kueue suspended the manager's RayJob; its copied status still says it runs: Kueue would wait for a
            # member to report otherwise (none will, if the member is lost).
            self._patch(self.rayjobs.status, job, {"status": {"jobDeploymentStatus": "Suspended"}})
            return False
        if view.quota_reserved:  # 3. wait for the quota to be released
            return False if self._wait(deadline) else None
        return True

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
            decisions.MOVES_ANNOTATION: decisions.with_move_recorded(meta.get("annotations"), move)}}})
        log.info("%s/%s: %s", meta["namespace"], meta["name"], message)


def main() -> int:
    from failover.cluster_client import api_client
    from failover.fleet import member_clients  # the kubeconfig Secrets MultiKueue reads, as the fleet watch reads them

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    ladder = Ladder.from_json(os.environ["FLEET_LADDER"])
    wait, max_wait = os.environ.get("FLEET_STEP_WAIT_SECONDS"), os.environ.get("FLEET_MAX_WAIT_SECONDS")
    manager = api_client()
    secrets = json.loads(os.environ.get("FLEET_MEMBERS") or "{}")  # {member: kubeconfig Secret name}
    members = (member_clients(client.CoreV1Api(manager), secrets,
                              os.environ.get("FLEET_SECRETS_NAMESPACE", "kueue-system")) if secrets else None)
    controller = LadderController(manager, ladder, os.environ.get("FLEET_NAMESPACE", "tpu-fleet"),
                                  datetime.timedelta(seconds=float(wait)) if wait else None,
                                  max_wait=datetime.timedelta(seconds=float(max_wait)) if max_wait else None,
                                  members=members)
    resync = float(os.environ.get("LADDER_RESYNC_SECONDS", "60"))
    period = float(os.environ.get("FLEET_WATCH_SECONDS", "10"))
    informers = controller.informers()
    for informer in informers:
        informer.start()
    controller.refresh_members()
    for informer in informers:  # a half-done move is only seen with its RayJob's annotation
        while not informer.synced.wait(timeout=10):
            log.info("waiting for the first list of %s", informer.watched.resource)
    stopping = threading.Event()
    for number in range(int(os.environ.get("LADDER_WORKERS", "2"))):
        threading.Thread(target=controller.work, args=(stopping,), name=f"worker-{number}", daemon=True).start()
    log.info("ladder: %s", " -> ".join(f"{s.local_queue} [{', '.join(s.members)}]" for s in ladder.steps))
    controller.resync()
    next_resync = time.monotonic() + resync
    while True:
        time.sleep(period)
        try:
            controller.refresh_members()
        except Exception:  # noqa: BLE001 - the manager unreachable for a period: try again next one
            log.exception("reading the members' kubeconfigs failed")
        if time.monotonic() >= next_resync:
            next_resync = time.monotonic() + resync
            controller.resync()


if __name__ == "__main__":
    sys.exit(main())
