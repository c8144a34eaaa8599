"""What the failover controller decides, as pure functions of what it reads (no I/O here).

Kueue tries the rungs of a queue in order but only by quota: when a rung's TPUs never come (a GCE stockout), the
job is evicted after `waitForPodsReady.timeout` and re-admitted on the same rung, forever.
The controller moves such a job to the queue that starts at the next rung. Ref: https://github.com/kubernetes-sigs/kueue/issues/2560
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from failover.api import (DISRUPTION_AHEAD, MOVING, PODS_READY_TIMEOUT, QUEUE_LABEL, SLICE_LOST, STOCKOUT, Chain,
                          FinishMove, Move, StartMove, WorkloadView, format_time, parse_time, reactivation_step)
from failover.api.climbs import CLIMBS
from failover.regional.climb import climb_message

# Kueue's eviction for another queue's claim (a team reclaiming its share, InCohortReclamation): capacity exists,
# it is just someone else's. Never a move. Ref: kueue v0.19.2 apis/kueue/v1beta2/workload_types.go WorkloadPreempted
PREEMPTED = "Preempted"


@dataclass(frozen=True)
class RecordFlavor:
    flavor: str


Action = RecordFlavor | StartMove | FinishMove | None


def decide(chain: Chain, workload: WorkloadView, job_failover: str | None,
           stockout: datetime.datetime | None, grace: datetime.timedelta, now: datetime.datetime) -> Action:
    """The one next step for a Workload owned by a RayJob; None when there is nothing to do.

    Moves down the chain only (a climb back up is failover/regional/climb.py's), never past its last rung; a move in
    progress is finished first, so a restart, a repeated event or a second replica moves nothing twice.
    """
    if workload.multikueue_origin is not None:
        return None  # a fleet's job: its manager re-dispatches it (README "Plan C")
    pending = Move.from_json(job_failover)
    if pending is not None and pending.state == MOVING:
        return FinishMove(pending)
    start = chain.start_of_queue(workload.queue_name)
    if start is None or workload.rayjob is None:
        return None  # not a job of the chain
    if workload.quota_reserved and workload.flavor and workload.flavor != workload.recorded_flavor:
        return RecordFlavor(workload.flavor)

    if not workload.quota_reserved and workload.evicted_reason == PODS_READY_TIMEOUT:
        # Timeout path. Without a record (the controller was down for the whole admission), the queue's own
        # first rung is the safe guess: the move can then only go down.
        rung = chain.index_of_flavor(workload.recorded_flavor)
        rung = start if rung is None else rung
        return _move_to_next(chain, workload, start, rung, PODS_READY_TIMEOUT, now)

    if workload.evicted_reason == PREEMPTED:
        return None  # a preemption, not a stockout: Kueue requeues it where it was
    # Early path. Not once the pods are ready: capacity came back within the grace, and the report on the same pods
    # is over (a move then would take a running job off its slice).
    if (workload.admitted and workload.pods_ready_since is None and chain.stocks_out_after_admission(workload.flavor)
            and stockout is not None and now - stockout >= grace):
        return _move_to_next(chain, workload, start, chain.index_of_flavor(workload.flavor), STOCKOUT, now)
    return None


MOVE_REASONS = (PODS_READY_TIMEOUT, STOCKOUT, SLICE_LOST)  # why the controller moves a job


def possible_moves(chain: Chain) -> list[tuple[str, str, str]]:
    """Every (from flavor, to flavor, reason) the controller can start: a move goes from a rung to the next one only;
    a job that lost its slice on the last rung is requeued there, or back where it was submitted."""
    moves = [(upper.flavor, lower.flavor, reason) for upper, lower in zip(chain.rungs, chain.rungs[1:])
             for reason in MOVE_REASONS]
    if not chain.rungs:
        return moves
    last = chain.rungs[-1].flavor
    return moves + [(last, rung.flavor, SLICE_LOST) for rung in chain.rungs[:-1]] + [(last, last, SLICE_LOST)]


def move_after_loss(chain: Chain, workload: WorkloadView, lost_on: str, now: datetime.datetime,
                    history: Sequence[Move] = ()) -> StartMove | None:
    """A job whose slice on `lost_on` was not back in time: to the next rung; on the last one, back to the queue it
    was submitted to when the controller had moved it down (`history`: its moves, oldest first), since it must start
    again anyway and Kueue then tries every rung from the top (the goodput bench: a job that lost its DWS slice was
    requeued on DWS and waited 6 minutes for a new one while on-demand and the reservation above were free); else
    requeued where it is (a job submitted to the last rung's queue stays there)."""
    start, rung = chain.start_of_queue(workload.queue_name), chain.index_of_flavor(lost_on)
    if start is None or rung is None or workload.multikueue_origin is not None:
        return None
    if rung + 1 < len(chain.rungs):
        return _move_to_next(chain, workload, start, rung, SLICE_LOST, now)
    first = history[0] if history else None
    top = chain.start_of_queue(first.from_local_queue) if first is not None and first.from_local_queue else None
    if top is None and first is not None:
        top = chain.index_of_flavor(first.from_flavor)
    if top is not None and top < start:
        back = chain.rungs[top]
        return StartMove(Move(lost_on, back.flavor, first.from_local_queue or back.local_queue, SLICE_LOST,
                              format_time(now), from_local_queue=workload.queue_name))
    return StartMove(Move(lost_on, lost_on, workload.queue_name, SLICE_LOST, format_time(now)))


def _move_to_next(chain: Chain, workload: WorkloadView, start: int, rung: int, reason: str,
                  now: datetime.datetime) -> Action:
    target = rung + 1
    if target >= len(chain.rungs) or target <= start:
        return None  # past the last rung, or already in a queue that starts at or below the target
    to = chain.rungs[target]
    return StartMove(Move(chain.rungs[rung].flavor, to.flavor, to.local_queue, reason, format_time(now),
                          from_local_queue=workload.queue_name))


# ---- a move, one step at a time ------------------------------------------------------------------------------
# What a pass of a move does next, from the Workload and RayJob as read now: each pass does the first thing left to
# do and reads both again, so a restart resumes wherever the last one stopped. Measured on Kueue 0.19.2: a relabel
# alone does not move an evicted Workload, and the deactivation skips the requeue backoff
# (tests/test_failover_controlplane.py). The controller carries each step out as one guarded write, or a wait.
DONE = "done"  # at the new queue, active, the RayJob relabelled: record it done (Event first)
DEACTIVATE = "deactivate"  # active at the queue it leaves (or on the admission that lost its slice): deactivate
WAIT_FOR_RELEASE = "wait-for-release"  # Kueue has not released the quota and suspended the job yet
RELABEL = "relabel"  # the RayJob's queue label to the new LocalQueue
REPOINT = "repoint"  # the Workload's `spec.queueName` to it
# then, inactive where it should be: failover.api.reactivation_step (WAIT_FOR_BACKOFF_RESET, then REACTIVATE)


def in_place(move: Move) -> bool:
    """A move that keeps the job's queue: a requeue on the last rung, or a climb to the rung its queue starts at (a
    job Kueue admitted below its queue's first rung because that rung was full)."""
    return move.requeue or bool(move.from_local_queue and move.from_local_queue == move.to_local_queue)


def next_in_move(move: Move, workload: WorkloadView, job: Mapping) -> str:
    """The next step of `move` for this Workload and its RayJob. A move in place (a requeue, or a climb within the
    queue) is evicted from the admission it leaves by a deactivation, then queued again where it was: Kueue tries the
    queue's rungs in order again."""
    released = not workload.quota_reserved and bool((job.get("spec") or {}).get("suspend", False))
    if in_place(move):
        on_old = workload.quota_reserved and (workload.admitted_at is None
                                              or workload.admitted_at < parse_time(move.at))
        if workload.active:
            return DEACTIVATE if on_old else DONE
        if not released:
            return WAIT_FOR_RELEASE
        return reactivation_step(workload.requeue_state)
    label = (job["metadata"].get("labels") or {}).get(QUEUE_LABEL)
    arrived = workload.queue_name == move.to_local_queue
    if arrived and label == move.to_local_queue and workload.active:
        return DONE
    if not arrived and workload.active:
        return DEACTIVATE
    if not released:
        return WAIT_FOR_RELEASE  # Kueue has not evicted yet; the next pass continues from here
    if label != move.to_local_queue:
        return RELABEL
    if not arrived:
        return REPOINT
    return reactivation_step(workload.requeue_state)


@dataclass(frozen=True)
class AdmissionWait:
    flavor: str
    seconds: float


@dataclass(frozen=True)
class CheckOutcome:
    admission_check: str
    state: str  # Ready (a ProvisioningRequest provisioned), Retry (an attempt failed), Rejected


CHECK_OUTCOMES = frozenset({"Ready", "Retry", "Rejected"})


def observations(before: WorkloadView | None, after: WorkloadView) -> list[AdmissionWait | CheckOutcome]:
    """What one observed change of a Workload says for the metrics: the wait that ended when it got quota, and
    the admission checks that reached a result. Only changes seen happen count: a Workload first seen admitted
    (a restart) adds nothing, so nothing is counted twice."""
    if before is None:
        return []
    seen: list[AdmissionWait | CheckOutcome] = []
    if (not before.quota_reserved and after.quota_reserved and after.flavor and before.pending_since
            and after.admitted_at):
        seen.append(AdmissionWait(after.flavor, max((after.admitted_at - before.pending_since).total_seconds(), 0.0)))
    earlier = dict(before.check_states)
    seen += [CheckOutcome(name, state) for name, state in after.check_states
             if state in CHECK_OUTCOMES and earlier.get(name) != state]
    return seen


def move_message(move: Move, from_queue: str) -> str:
    """The one line logged, and the Event's message, for a move (a climb back's: failover/regional/climb.py)."""
    if move.reason in CLIMBS:
        return climb_message(move, from_queue)
    cause = {PODS_READY_TIMEOUT: "its pods were not ready within Kueue's waitForPodsReady timeout",
             STOCKOUT: "GKE's autoscaler reported no TPU capacity for its pods",
             SLICE_LOST: "it lost its slice and the slice was not back within the rung's recovery wait",
             DISRUPTION_AHEAD: "a disruption of its slice was coming (a host's maintenance or its DWS run's end) and "
                               "the rung had room"}[move.reason]
    if move.requeue:
        return f"requeued on {move.to_flavor} (LocalQueue {move.to_local_queue}): {cause}"
    return (f"moved from {move.from_flavor} to {move.to_flavor} (LocalQueue {from_queue} -> {move.to_local_queue}): "
            f"{cause}")
