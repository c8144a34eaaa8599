"""Climbing back in a fleet: when a fleet job running at a step below its ladder's first step moves back up to an
earlier step, as pure functions of what the ladder controller reads (no I/O here; failover/ladder/climbing.py keeps
the signal and acts). The regional climb (failover/regional/climb.py) for the fleet's ladder: the same policy
(failover.api.ClimbPolicy), the same bounds, the same route as a move down (route D on the manager's Workload).

A fleet job's copy in a member is never moved by the member's own controller (its manager would delete and recreate
it): a job that fell to a later step (the reservation was busy, a stockout) stays there when an earlier step frees,
unless the fleet's ladder moves it up.

A free slice, at an earlier step (one member's rung): the member's free TPU quota of the step's flavor, over every
ClusterQueue there (nominal quota less what its Kueue reserved: the step's own ClusterQueue borrows it all from the
region's cohort), holds the job's chips. A reservation's quota is the reservation's size, its slices held by GCE for
the project: that is enough. Any other rung would also need an idle slice of its own nodes, which the ladder cannot
see in a member (it reads no nodes or pods there): `fleet.climbBack.to` takes reservations only. And no capacity
failure at the step (a move down from it for a stockout, pods not ready, an eviction, a slice not back, of any fleet
job) within `settle`.

Bounded as the regional climb: at most one climb per job per `minInterval`, never in its first `minRuntime` at a step,
never while the member running it says its slice is lost, never for a DWS run (the last step) that ends within
`runEndMargin`, never while a save it was asked for is still under way; one climb at a time (a move or a climb under
way finishes first). Safe: the climb's Move is written on the manager's RayJob `checkpointing` first, the job's TPU
pods in the member running it are asked to save (the checkpoint channel, failover/checkpoints.py), and only once the
save is taken as done (`saveTimeout`) does route D start, if the job still runs where it did and the earlier step is
still free; else the climb is called off and the record before it put back.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from failover.api import (MEMBER_EVICTED, MEMBER_NOT_READY, MEMBER_SLICE_LOST, MEMBER_STOCKOUT, MOVED, MOVING,
                          Ladder, Move, Step, format_time, parse_time)
from failover.api.checkpoint_moves import checkpoint_of, next_step, saves_asked
from failover.api.climbs import CHECKPOINTING, CLIMB_BACK, Climb, ClimbPolicy, NotYet, newest_failures
from failover.ladder.decisions import LadderView, admitted_at, running_member

# Climbing back off: a controller built without a policy (a test's).
OFF = ClimbPolicy(to=(), reserved=(), settle=datetime.timedelta(0), min_interval=datetime.timedelta(0),
                  min_runtime=datetime.timedelta(0), run_end_margin=datetime.timedelta(0),
                  save_timeout=datetime.timedelta(0))
# A move down from a step for one of these says the step had no capacity for the job; a climb back to it waits
# `settle` after the newest one (a StepBusy says only that the step was in use then: what a climb waits to end).
CAPACITY_FAILURES = frozenset({MEMBER_STOCKOUT, MEMBER_NOT_READY, MEMBER_EVICTED, MEMBER_SLICE_LOST})


@dataclass(frozen=True)
class FleetJob:
    """What the climb rules read of a fleet job besides its manager Workload."""

    pending: Move | None  # the manager RayJob's FAILOVER_ANNOTATION: its latest move (a climb's while it saves)
    history: tuple[Move, ...]  # its MOVES_ANNOTATION: the moves done, oldest first
    # Its TPU pods' CHECKPOINT_REQUEST_ANNOTATION, by pod, in the member running it (empty: none read)
    checkpoints: Mapping[str, str | None]
    losing: bool = False  # the member running it recorded that it lost its slice, this admission


def targets(ladder: Ladder, policy: ClimbPolicy, index: int) -> list[int]:
    """The steps before `index` a job may climb to: one member's rung whose flavor the policy names."""
    return [i for i in range(index) if ladder.steps[i].member is not None and ladder.steps[i].flavor in policy.to]


def capacity_failures(moves: Iterable[Move | None]) -> dict[str, datetime.datetime]:
    """{step left (its LocalQueue): when} of the newest move down for a capacity failure, per step, among moves."""
    return newest_failures(moves, CAPACITY_FAILURES)


def run_end(step: Step, view: LadderView) -> datetime.datetime | None:
    """When a DWS run (the last step: every member's DWS rung) ends: its admission plus its maxRunDurationSeconds."""
    admitted = admitted_at(step, view)
    if step.rung or admitted is None or view.max_run_seconds is None:
        return None
    return admitted + datetime.timedelta(seconds=view.max_run_seconds)


def running(view: LadderView) -> bool:
    """Admitted by a member and its pods all ready there, active, not finished, no move under way on the Workload."""
    return (view.active and view.admitted and view.pods_ready and not view.finished and view.move is None
            and view.give_up is None)


def decide_climb(ladder: Ladder, policy: ClimbPolicy, view: LadderView, job: FleetJob,
                 free: Callable[[Step], datetime.datetime | None],
                 last_failure: Callable[[Step], datetime.datetime | None], now: datetime.datetime) -> Climb | NotYet:
    """Whether the fleet job climbs now, and to which step: the earliest it may climb to that has had a free slice for
    the job (`free(step)`: since when, or None) for `settle`, with no capacity failure (`last_failure(step)`) within
    it. Else when to look again."""
    never = NotYet(None)
    if not policy.enabled or view.rayjob is None or not running(view) or job.losing or view.tpu_chips <= 0:
        return never  # only a job running on a whole slice climbs (and one whose chips are known: its room)
    if job.pending is not None and job.pending.state != MOVED:
        return never  # a move (or a climb) under way finishes first
    index = ladder.index(view.queue_name)
    step = ladder.steps[index] if index is not None else None
    since = admitted_at(step, view) if step is not None else None
    member = running_member(step, view) if step is not None else None
    if since is None or member is None:
        return never
    candidates = targets(ladder, policy, index)
    if not candidates:
        return never  # at its first step, or nothing before it it may climb to
    end = run_end(step, view)
    if end is not None and now >= end - policy.run_end_margin:
        return never  # its DWS run ends soon: the run's end decides
    blocked = [since + policy.min_runtime]  # its first minutes at the step
    climbs = [parse_time(m.at) for m in job.history if m.reason == CLIMB_BACK]
    if climbs:
        blocked.append(max(climbs) + policy.min_interval)
    blocked += saves_asked(job.checkpoints, policy.save_timeout)
    ready = []  # (when it has been free for settle, step index)
    for i in candidates:
        free_since = free(ladder.steps[i])
        if free_since is None:
            continue
        failed = last_failure(ladder.steps[i])
        ready.append((max(free_since, failed or free_since) + policy.settle, i))
    if not ready:
        return never  # a member's quota changing queues the job again
    at = max(*blocked, min(settled for settled, _ in ready))
    if now < at:
        return NotYet(at)
    target = ladder.steps[min(i for settled, i in ready if settled <= now)]
    return Climb(Move(step.local_queue, target.local_queue, target.local_queue, CLIMB_BACK, format_time(now),
                      CHECKPOINTING, member=member))


# ---- a climb's checkpoint, one step at a time: the protocol is failover/api/checkpoint_moves.py -----------------
# Its GO here is route D: the deactivation with the Move (now `moving`) on the Workload, then the move's steps.
def next_in_climb(ladder: Ladder, move: Move, view: LadderView, job: FleetJob, still_free: bool,
                  policy: ClimbPolicy, now: datetime.datetime) -> tuple[str, datetime.datetime | None]:
    """The next step of a climb while the job saves (checkpoint_moves.next_step), and until when it waits (SAVING).
    The job still runs where it climbs from while it runs on that admission: not moved, evicted, finished, its slice
    lost, nor in another member. No pod read in the member: asked (again), which finds them."""
    step = ladder.step_of(view.queue_name)
    since = admitted_at(step, view) if step is not None else None
    on_it = (step is not None and running(view) and not job.losing and view.queue_name == move.from_flavor
             and since is not None and since <= parse_time(move.at) and running_member(step, view) == move.member)
    return next_step(checkpoint_of(move), on_it, job.checkpoints or None, still_free, policy.save_timeout, now)


def moving(move: Move) -> Move:
    """The climb's Move once the save is done: route D carries it out as any move (failover/ladder/decisions.py)."""
    return replace(move, state=MOVING)


def climb_message(move: Move) -> str:
    """The one line logged, and the Event's message, for a climb done."""
    return (f"climbed back from step {move.from_flavor} (member {move.member}) to step {move.to_flavor}: it had a "
            "free slice for the job for fleet.climbBack.settle")


def free_chips(flavor: str, free_tpus: Iterable[Mapping[str, int]]) -> int:
    """A member's free TPU chips of `flavor`: over every ClusterQueue there (`free_tpus`: each one's nominal quota
    less what its Kueue reserved, failover/maintenance.py), so a fleet step's ClusterQueue, which borrows the flavor
    with no quota of its own, counts what it holds against the region's queue that lends it."""
    return max(sum(queue.get(flavor, 0) for queue in free_tpus), 0)


def old_run(move: Move, rayjob: str, pods: Iterable[tuple[str, str]]) -> list[str]:
    """A climb's old run still in the member it leaves (`move.member`): its pods there, of `pods` ((name, the
    `ray.io/cluster` label)), whose RayCluster KubeRay named after the RayJob (`<rayjob>-[raycluster-]<5 random
    characters>`, utils.GenerateRayClusterName; a name KubeRay shortened is not seen: no wait). Route D
    reactivates a climb's Workload only once there are none: MultiKueue may dispatch it to another member at once,
    and the old run's pods must be gone first (one run at a time). A move down does not wait: its job did not run."""
    if move.reason != CLIMB_BACK or not move.member:
        return []
    named = re.compile(rf"{re.escape(rayjob)}-(raycluster-)?[a-z0-9]{{5}}")
    return sorted(name for name, cluster in pods if named.fullmatch(cluster or ""))


def possible_climbs(ladder: Ladder, policy: ClimbPolicy) -> list[tuple[str, str]]:
    """Every (from step, to step) a climb can have: from any step after one the policy names, up to it."""
    return [(lower.local_queue, ladder.steps[i].local_queue) for i in targets(ladder, policy, len(ladder.steps))
            for lower in ladder.steps[i + 1:]]
