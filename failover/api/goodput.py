"""A job's scheduling goodput, from the cluster's side: of the time since the job was submitted, the share it spent
running on a whole slice, and where the rest went. A pure function of the job's objects as they are now (its
Workload, the records the failover controller keeps on its RayJob) and `now`: the regional program's goodput
controller (failover/regional/goodput.py) exports it, `ops status` shows it (docs/goodput.md).

The states a job's time is counted in, each on a rung (the ResourceFlavor it waited for or held):
  quota_wait     no quota reserved: pending in its queue (or Kueue has not made its Workload yet)
  capacity_wait  quota held and no slice: an admission check pending (DWS's ProvisioningRequest), or admitted on a
                 rung that had no capacity (its pods never ready: the stretch ended in a Stockout or PodsReadyTimeout
                 move, or in Kueue's PodsReadyTimeout eviction)
  starting       admitted, its pods not all ready yet (or ready again after a loss, not yet)
  running        every pod ready on a whole slice
  broken_slice   the slice lost, from the loss's first signal to its recovery or the move (the controller's record)
  moving         a move of the failover controller, from its start to the Workload's reactivation
  unrecorded     a stretch that no object describes any more and that the controller did not see
Scheduling goodput = running / (end - submitted): end is now, or the finish of a finished job.

Exact and estimated. Kueue keeps only each condition's last transition, and the controller's records keep each
move's start (tpu-fallback/moves) and the latest loss (tpu-fallback/slice-lost). So:
- exact: the submission (the RayJob's creation), each move's start, the latest move's end (Kueue's Requeued
  condition, reason Reactivated), each stretch of the current admission (QuotaReserved, Admitted, PodsReady since),
  the latest loss (its first signal, its recovery);
- estimated (a segment's `exact` False): what a stretch that ended in a move did inside it, counted by the move's
  reason (a capacity move's as capacity_wait on the rung it left, its quota wait and start included; a slice loss's
  as running up to the loss's first signal, where its record is still the latest, else all of it; a move of a running
  job, ahead of a disruption or climbing back, as running); an earlier move's
  own time (0 s: its end is not recorded); the run before a recovery (PodsReady reason Recovered or WaitForRecovery:
  the first ready time is overwritten), counted as running from the admission.
`merge` keeps what a watcher saw: the regional controller remembers each job's timeline as it watched it, so a
stretch it saw stays exact after a move; a restart loses that memory and falls back on the estimates.
Ref: https://cloud.google.com/blog/products/ai-machine-learning/goodput-metric-as-measure-of-ml-productivity
Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/controller/jobframework/reconciler.go (generatePodsReadyCondition)
Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/controller/core/workload_controller.go (Reactivated)
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from failover.api.annotations import FAILOVER_ANNOTATION, SLICE_LOST_ANNOTATION
from failover.api.climbs import CLIMB_BACK, CLIMB_BACK_WAITING
from failover.api.moves import (DISRUPTION_AHEAD, MEMBER_EVICTED, MEMBER_NOT_READY, MEMBER_SLICE_LOST,
                                MEMBER_STOCKOUT, MOVING, PODS_READY_TIMEOUT, SLICE_LOST, STEP_BUSY, STOCKOUT, Move,
                                move_history)
from failover.api.records import RECOVERED, LostSlice
from failover.api.times import parse_time
from failover.api.views import WorkloadView

QUOTA_WAIT, CAPACITY_WAIT, STARTING, RUNNING = "quota_wait", "capacity_wait", "starting", "running"
BROKEN_SLICE, MOVE, UNRECORDED = "broken_slice", "moving", "unrecorded"
STATES = (QUOTA_WAIT, CAPACITY_WAIT, STARTING, RUNNING, BROKEN_SLICE, MOVE, UNRECORDED)

# What the objects say the job was doing (a segment's phase); `state_of` names its state once the stretch's end is
# known: a start that ended in a capacity move was a wait for capacity.
PENDING, CHECKING, ADMITTED, READY, LOST, IN_MOVE, UNKNOWN = (
    "pending", "checking", "admitted", "ready", "lost", "moving", "unknown")

# Why a stretch ended: a move's reason (failover/api/moves.py) or Kueue's eviction reason, as they count.
# AdmissionCheck: Kueue's eviction when a ProvisioningRequest failed (DWS had no capacity).
CAPACITY_ENDINGS = frozenset({STOCKOUT, PODS_READY_TIMEOUT, MEMBER_EVICTED, MEMBER_STOCKOUT, MEMBER_NOT_READY,
                              "AdmissionCheck"})
LOSS_ENDINGS = frozenset({SLICE_LOST, MEMBER_SLICE_LOST})
# Moves of a running job: ahead of a disruption it saw coming, or up to a rung it prefers (failover/api/climbs.py).
RUNNING_ENDINGS = frozenset({DISRUPTION_AHEAD, CLIMB_BACK})
# The fleet ladder's step that did not admit the job (its capacity in use); a waiting job's climb (it held no quota).
QUOTA_ENDINGS = frozenset({STEP_BUSY, CLIMB_BACK_WAITING})
DEACTIVATED = "Deactivated"  # Kueue's eviction reason (prefix) once spec.active is false: a move's first step
REACTIVATED = "Reactivated"  # Kueue's Requeued reason once it is true again: a move's last step
RECOVERED_READY, WAIT_FOR_RECOVERY = "Recovered", "WaitForRecovery"  # PodsReady's reasons after a pod failed


def state_of(phase: str, ended_by: str | None) -> str:
    if phase == PENDING:
        return QUOTA_WAIT
    if phase == CHECKING:
        return CAPACITY_WAIT
    if phase == ADMITTED:
        return CAPACITY_WAIT if ended_by in CAPACITY_ENDINGS else STARTING
    if phase == READY:
        return RUNNING
    if phase == LOST:
        return BROKEN_SLICE
    if phase == IN_MOVE:
        return MOVE
    if ended_by in CAPACITY_ENDINGS:
        return CAPACITY_WAIT
    if ended_by in LOSS_ENDINGS or ended_by in RUNNING_ENDINGS:
        return RUNNING
    return QUOTA_WAIT if ended_by in QUOTA_ENDINGS else UNRECORDED


@dataclass(frozen=True)
class Segment:
    """One stretch of a job's time: what it was doing (`phase`), on which rung, whether the objects record both ends
    (`exact`), and what ended the stretch it belongs to (a move's or an eviction's reason; None: it goes on)."""

    start: datetime.datetime
    end: datetime.datetime
    phase: str
    rung: str | None
    exact: bool
    ended_by: str | None = None

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()

    @property
    def state(self) -> str:
        return state_of(self.phase, self.ended_by)


@dataclass(frozen=True)
class JobTimes:
    """What the account reads of a job: its submission, its Workload (None: not made yet), the controller's records
    on its RayJob, and the rung its queue starts at (where a job without quota waits)."""

    submitted: datetime.datetime
    workload: WorkloadView | None
    moves: tuple[Move, ...] = ()  # completed, oldest first
    moving: Move | None = None  # the move in progress
    lost: LostSlice | None = None
    waiting_on: str | None = None

    @classmethod
    def of(cls, job_meta: Mapping | None, workload: WorkloadView | None, waiting_on: str | None) -> JobTimes | None:
        """From the RayJob's metadata (None for a job of another kind: its Workload's creation is its submission);
        None when neither says when it was submitted."""
        annotations = (job_meta or {}).get("annotations") or {}
        submitted = parse_time((job_meta or {}).get("creationTimestamp")) or (workload.created_at if workload else None)
        if submitted is None:
            return None
        current = Move.from_json(annotations.get(FAILOVER_ANNOTATION))
        return cls(submitted, workload, tuple(move_history(annotations)),
                   current if current is not None and current.state == MOVING else None,
                   LostSlice.from_json(annotations.get(SLICE_LOST_ANNOTATION)), waiting_on)

    def end(self, now: datetime.datetime) -> datetime.datetime:
        """Now, or when the job finished; never before its submission."""
        view = self.workload
        end = min(now, view.finished_at) if view is not None and view.finished and view.finished_at else now
        return max(end, self.submitted)


def timeline(times: JobTimes, now: datetime.datetime) -> tuple[Segment, ...]:
    """The job's time from submission to `times.end(now)`, oldest first, in segments (see the module's rules)."""
    end, view = times.end(now), times.workload
    segments: list[Segment] = []
    cursor = times.submitted
    moves = [*times.moves, *([times.moving] if times.moving else [])]
    unfinished_move = None  # the latest move, when its end is not recorded
    for index, move in enumerate(moves):
        at = _within(parse_time(move.at) or cursor, cursor, end)
        segments += _before_move(cursor, at, move, times.lost)
        if move is times.moving:
            segments.append(Segment(at, end, IN_MOVE, move.to_flavor, True))
            return _joined(segments)
        reactivated = view.requeued_at if view is not None and view.requeued_reason == REACTIVATED else None
        latest = index == len(moves) - 1
        if latest and reactivated is not None and reactivated >= at:
            done = _within(reactivated, at, end)
            segments.append(Segment(at, done, IN_MOVE, move.to_flavor, True))
        else:
            done, unfinished_move = at, move if latest else None
        cursor = done
    segments += _current(cursor, end, times, unfinished_move)
    return _joined(segments)


def _before_move(cursor: datetime.datetime, at: datetime.datetime, move: Move,
                 lost: LostSlice | None) -> list[Segment]:
    """A stretch that ended in `move`: its inside is no longer recorded, but a slice loss's record, while it is the
    latest, says when the slice broke."""
    lost_at = parse_time(lost.at) if lost is not None and lost.flavor == move.from_flavor else None
    if move.reason in LOSS_ENDINGS and lost_at is not None and cursor <= lost_at <= at:
        return [Segment(cursor, lost_at, UNKNOWN, move.from_flavor, False, move.reason),
                Segment(lost_at, at, LOST, move.from_flavor, True, move.reason)]
    return [Segment(cursor, at, UNKNOWN, move.from_flavor, False, move.reason)]


def _current(cursor: datetime.datetime, end: datetime.datetime, times: JobTimes,
             unfinished_move: Move | None) -> list[Segment]:
    """Since the latest move ended (or the submission): what the Workload's conditions say now."""
    view = times.workload
    if view is None:  # Kueue has not made its Workload yet: waiting all the same
        return [Segment(cursor, end, PENDING, times.waiting_on, True)]
    if not view.quota_reserved:
        if view.evicted_reason is None:  # never evicted since it was made or last admitted: pending all along
            return [Segment(cursor, end, PENDING, times.waiting_on, True)]
        since = _within(view.pending_since or cursor, cursor, end)
        if unfinished_move is not None and view.evicted_reason.startswith(DEACTIVATED):
            before = Segment(cursor, since, IN_MOVE, unfinished_move.to_flavor, False)  # the move's deactivation
        else:  # an admission that ended in an eviction (its reason), not in a move
            before = Segment(cursor, since, UNKNOWN, view.recorded_flavor or times.waiting_on, False,
                             view.evicted_reason)
        return [before, Segment(since, end, PENDING, times.waiting_on, True)]
    reserved = _within(view.admitted_at or cursor, cursor, end)
    segments = [Segment(cursor, reserved, PENDING, times.waiting_on, True)]
    if not view.admitted:
        return segments + [Segment(reserved, end, CHECKING, view.flavor, True)]
    admitted = _within(view.admitted_since or reserved, reserved, end)
    return segments + [Segment(reserved, admitted, CHECKING, view.flavor, True)] + _admitted(admitted, end, times)


def _admitted(admitted: datetime.datetime, end: datetime.datetime, times: JobTimes) -> list[Segment]:
    """Admitted since `admitted`: starting, running, and a loss of this admission (its record) with its recovery."""
    view, rung = times.workload, times.workload.flavor
    lost = times.lost if times.lost is not None and times.lost.flavor == rung else None
    lost_at = parse_time(lost.at) if lost is not None else None
    if lost_at is None or lost_at < admitted:
        lost = lost_at = None  # an earlier admission's
    lost_at = _within(lost_at, admitted, end) if lost_at is not None else None
    recovered = (_within(parse_time(lost.recovered_at) or end, lost_at, end)
                 if lost is not None and lost.state == RECOVERED else end)
    changed = _within(view.pods_ready_changed_at or admitted, admitted, end)
    if view.pods_ready_since is not None:
        ready = _within(view.pods_ready_since, admitted, end)
        if view.pods_ready_reason == RECOVERED_READY:  # ready again after a failure: the first ready time is gone
            if lost_at is not None and lost_at <= ready:
                return [Segment(admitted, lost_at, READY, rung, False), Segment(lost_at, recovered, LOST, rung, True),
                        Segment(recovered, end, READY, rung, True)]
            return [Segment(admitted, ready, READY, rung, False), Segment(ready, end, READY, rung, True)]
        started = [Segment(admitted, ready, ADMITTED, rung, True)]
        if lost_at is not None and lost_at >= ready:
            return started + [Segment(ready, lost_at, READY, rung, True), Segment(lost_at, recovered, LOST, rung, True),
                              Segment(recovered, end, READY, rung, True)]
        return started + [Segment(ready, end, READY, rung, True)]
    if view.pods_ready_reason == WAIT_FOR_RECOVERY:  # it ran, and its pods are not all ready since `changed`
        if lost_at is not None:
            return [Segment(admitted, lost_at, READY, rung, False), Segment(lost_at, recovered, LOST, rung, True),
                    Segment(recovered, end, ADMITTED, rung, True)]
        return [Segment(admitted, changed, READY, rung, False), Segment(changed, end, ADMITTED, rung, True)]
    return [Segment(admitted, end, ADMITTED, rung, True)]


def _within(moment: datetime.datetime, low: datetime.datetime, high: datetime.datetime) -> datetime.datetime:
    return min(max(moment, low), high)


def _joined(segments: Sequence[Segment]) -> tuple[Segment, ...]:
    """Without empty segments, and with neighbours that say the same thing made one."""
    joined: list[Segment] = []
    for segment in segments:
        if segment.end <= segment.start:
            continue
        last = joined[-1] if joined else None
        if last is not None and last.end == segment.start and (last.phase, last.rung, last.exact, last.ended_by) == (
                segment.phase, segment.rung, segment.exact, segment.ended_by):
            joined[-1] = replace(last, end=segment.end)
        else:
            joined.append(segment)
    return tuple(joined)


def merge(observed: Sequence[Segment], derived: Sequence[Segment]) -> tuple[Segment, ...]:
    """`derived` (the objects' timeline now) with what `observed` (an earlier timeline of the same job, as a watcher
    kept it) knew exactly and `derived` only estimates: there, `observed`'s phase and rung, with `derived`'s
    ending (the move that ended the stretch is known only now)."""
    if not observed:
        return tuple(derived)
    cuts = sorted({moment for segment in (*observed, *derived) for moment in (segment.start, segment.end)})
    merged = []
    for start, end in zip(cuts, cuts[1:]):
        found = _covering(derived, start, end)
        if found is None:
            continue
        seen = _covering(observed, start, end) if not found.exact else None
        if seen is not None and seen.exact:
            merged.append(Segment(start, end, seen.phase, seen.rung, True, found.ended_by))
        else:
            merged.append(replace(found, start=start, end=end))
    return _joined(merged)


def _covering(segments: Sequence[Segment], start: datetime.datetime, end: datetime.datetime) -> Segment | None:
    return next((s for s in segments if s.start <= start and end <= s.end), None)


def clipped(segments: Sequence[Segment], since: datetime.datetime,
            until: datetime.datetime) -> dict[tuple[str, str | None], float]:
    """Seconds per (state, rung) of the part of `segments` within [since, until]."""
    found: dict[tuple[str, str | None], float] = {}
    for segment in segments:
        seconds = (min(segment.end, until) - max(segment.start, since)).total_seconds()
        if seconds > 0:
            key = (segment.state, segment.rung)
            found[key] = found.get(key, 0.0) + seconds
    return found


@dataclass(frozen=True)
class Account:
    """A job's time from its submission to `end`, in segments; its scheduling goodput and where the rest went."""

    submitted: datetime.datetime
    end: datetime.datetime
    segments: tuple[Segment, ...]

    @property
    def elapsed_seconds(self) -> float:
        return (self.end - self.submitted).total_seconds()

    @property
    def seconds(self) -> dict[str, float]:
        """Seconds per state, every state (0 included)."""
        totals = dict.fromkeys(STATES, 0.0)
        for segment in self.segments:
            totals[segment.state] += segment.seconds
        return totals

    @property
    def by_rung(self) -> dict[tuple[str, str | None], float]:
        """Seconds per (state, rung), as the segments have them."""
        return clipped(self.segments, self.submitted, self.end)

    @property
    def estimated_seconds(self) -> float:
        return sum(segment.seconds for segment in self.segments if not segment.exact)

    @property
    def goodput(self) -> float | None:
        """Running over elapsed; None in a job's first second (nothing elapsed yet)."""
        elapsed = self.elapsed_seconds
        return self.seconds[RUNNING] / elapsed if elapsed > 0 else None


def account(times: JobTimes, now: datetime.datetime, observed: Sequence[Segment] = ()) -> Account:
    """The job's account at `now`: its objects' timeline, over `observed` (what a watcher kept of it) where given."""
    return Account(times.submitted, times.end(now), merge(observed, timeline(times, now)))
