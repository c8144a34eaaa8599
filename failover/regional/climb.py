"""Climbing back: when a running job below its chain's first rung moves up, as pure functions of what the controller
reads (no I/O here; the signal is kept by free_slices.py, the steps carried out by controller.py).

Kueue tries a queue's rungs in order when it admits, never again after: a job that fell to Spot or DWS (a stockout, a
full rung) stays there when the rung above frees. Kueue's own answer, Concurrent Admission's `TryPreferredFlavors`
migration, cannot see a GCE stockout; GKE's ComputeClass `activeMigration` does not queue multi-host slices through
Kueue. So the controller moves such a job up (the same route as a move down: deactivate, relabel, repoint, reactivate)
once a rung it may climb to (`fallback.climbBack.to`) has had a free slice for `settle`.
Ref: https://kueue.sigs.k8s.io/docs/concepts/admission_fair_sharing/ (flavors are tried at admission only)
Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/about-custom-compute-classes#active-migration

A free slice, on the rung above, is:
- quota: the rung's nominal TPU quota, over every ClusterQueue, less what Kueue has reserved on it (ClusterQueue
  status `flavorsReservation`), holds the job's chips: Kueue would admit it there now;
- capacity: on a reservation rung that is enough, its slices are held by GCE for the project (its quota is the
  reservation's size); on any other rung quota does not prove GCE has the VMs (a stockout), so the rung also needs an
  idle slice of its own: nodes of one of its pools, Ready, not going, no TPU pod on them, as many as the job's hosts
  (GKE keeps a freed slice about 10 minutes before it scales it down);
- and no capacity failure on the rung (a move down from it for a stockout or a PodsReady timeout, a stockout the
  autoscaler reported on a pod admitted there) within `settle`.

Bounded: a job climbs at most once per `minInterval`, never in its first `minRuntime` on a rung, never while its
slice is lost, never for a DWS run that ends within `runEndMargin`, never while a checkpoint it was asked for (by a
maintenance, say) is still being saved. Safe: the climb's Move is written `checkpointing` first and the job asked to
save (failover/checkpoints.py); the move starts once the save is taken as done (`saveTimeout`), and only if the job
still runs where it did and the rung above is still free; else it is called off.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from failover.api import (MOVED, MOVING, PODS_READY_TIMEOUT, SLICE_LOST, STOCKOUT, Chain, Move, WorkloadView,
                          format_time, parse_time)
from failover.api.checkpoint_moves import checkpoint_of, next_step, saves_asked
from failover.api.climbs import (CHECKPOINTING, CLIMB_BACK, CLIMB_BACK_WAITING, Climb, ClimbPolicy, Need, NotYet,
                                 Sample, fits, newest_failures)


# ---- the signal: Sample, Need, fits, free_since, record are failover/api/climbs.py's (the fleet's climb's too) ---
def idle_chips_beside(sample: Sample | None, waiting: Iterable[Need]) -> int:
    """The chips of the rung's idle hosts, when one of the jobs waiting below it could take them (the rung's quota
    and an idle slice both fit it); else 0. A slice billed for nothing while a job waits."""
    for need in waiting:
        if sample is not None and need.hosts > 0 and fits(sample, need, reserved=False):
            return sample.idle_hosts * (need.chips // need.hosts)
    return 0


# A move down for one of these says the rung it left had no capacity for the job (a Spot slice reclaimed and not back
# included); a climb back to it waits `settle` after the newest one.
CAPACITY_FAILURES = frozenset({STOCKOUT, PODS_READY_TIMEOUT, SLICE_LOST})


def capacity_failures(moves: Iterable[Move | None]) -> dict[str, datetime.datetime]:
    """{rung left: when} of the newest move down for a capacity failure, per rung, among a RayJob's moves (its
    history and its latest record)."""
    return newest_failures(moves, CAPACITY_FAILURES)


def event_time(event: Mapping) -> datetime.datetime | None:
    """When an Event was last seen (a stockout the autoscaler keeps reporting counts from its latest report)."""
    try:
        return parse_time(event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp"))
    except ValueError:
        return None


# ---- the decision ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobFacts:
    """What the climb rules read of the job besides its Workload."""

    pending: Move | None  # FAILOVER_ANNOTATION: the latest move (a climb's while it checkpoints)
    history: tuple[Move, ...]  # MOVES_ANNOTATION: its completed moves, oldest first
    losing: bool  # its slice is lost this admission (failover/slices.py): the loss rules decide
    checkpoints: Mapping[str, str | None]  # its TPU pods' CHECKPOINT_REQUEST_ANNOTATION, by pod
    run_ends_at: datetime.datetime | None = None  # a DWS run's end (its start + maxRunDuration), when known


def decide_climb(chain: Chain, policy: ClimbPolicy, view: WorkloadView, job: JobFacts,
                 free: Callable[[str], datetime.datetime | None],
                 last_failure: Callable[[str], datetime.datetime | None], now: datetime.datetime) -> Climb | NotYet:
    """Whether the job climbs now, and to which rung: the highest one it may climb to that has had a free slice for
    the job (`free(flavor)`: since when, or None) for `settle`, with no capacity failure (`last_failure(flavor)`)
    within it. Else when to look again."""
    never = NotYet(None)
    if not policy.enabled or view.multikueue_origin is not None or view.rayjob is None:
        return never  # a fleet's copy: its manager's ladder moves it
    if job.pending is not None and job.pending.state != MOVED:
        return never  # a move (or a climb) under way finishes first
    if chain.start_of_queue(view.queue_name) is None or not (view.admitted and view.pods_ready_since) \
            or view.finished or job.losing:
        return never  # only a job of the chain that runs on a whole slice climbs
    rung = chain.index_of_flavor(view.flavor)
    targets = [i for i in range(rung or 0) if chain.rungs[i].flavor in policy.to and not chain.rungs[i].admission_check]
    if not targets:
        return never  # at its first rung, or nothing above it it may climb to
    if job.run_ends_at is not None and now >= job.run_ends_at - policy.run_end_margin:
        return never  # its DWS run ends soon: the run's end decides (failover/maintenance.py)
    # Not before these: its first minutes on the rung, its last climb's interval, a save it was asked for.
    blocked = [(view.admitted_at or now) + policy.min_runtime]
    climbs = [parse_time(m.at) for m in job.history if m.reason == CLIMB_BACK]
    if climbs:
        blocked.append(max(climbs) + policy.min_interval)
    blocked += saves_asked(job.checkpoints, policy.save_timeout)
    ready = []  # (when it has been free for settle, rung)
    for index in targets:
        flavor = chain.rungs[index].flavor
        since = free(flavor)
        if since is None:
            continue
        failed = last_failure(flavor)
        settled = max(since, failed or since) + policy.settle
        ready.append((settled, index))
    if not ready:
        return never  # a rung's capacity changing queues the job again (free_slices.py)
    at = max(*blocked, min(settled for settled, _ in ready))
    if now < at:
        return NotYet(at)
    target = chain.rungs[min(index for settled, index in ready if settled <= now)]
    return Climb(Move(view.flavor, target.flavor, target.local_queue, CLIMB_BACK, format_time(now), CHECKPOINTING,
                      from_local_queue=view.queue_name))


def waiting_rung(chain: Chain, view: WorkloadView, moved: bool) -> int | None:
    """The rung a job waits at, when it waits below its chain's first rung with nothing to lose by going up: one the
    controller moved down (`moved`: it has a move history), active, not admitted, holding either no quota (it waits
    at its queue's first rung) or quota on a rung with an admission check whose request has not provisioned yet (a
    DWS request, given up for a slice that exists). None otherwise."""
    if not moved or view.admitted or view.finished or not view.active or view.tpu_chips <= 0 \
            or view.multikueue_origin is not None or view.rayjob is None:
        return None
    if view.quota_reserved:
        rung = chain.index_of_flavor(view.flavor)
        return rung if rung is not None and chain.rungs[rung].admission_check else None
    return chain.start_of_queue(view.queue_name)


def waiting_targets(chain: Chain, rung: int) -> list[int]:
    """The rungs a waiting job may go up to: every one above it without an admission check."""
    return [i for i in range(rung) if not chain.rungs[i].admission_check]


def decide_climb_waiting(chain: Chain, policy: ClimbPolicy, view: WorkloadView, job: JobFacts,
                         free: Callable[[str], datetime.datetime | None],
                         last_failure: Callable[[str], datetime.datetime | None],
                         now: datetime.datetime, others_hold_nothing: bool = False) -> Climb | NotYet:
    """Whether a job that waits below its chain's first rung (waiting_rung) goes back up now, to the highest rung
    above it (waiting_targets) that has a free slice for it now. Whatever `fallback.climbBack.to` says: that bounds
    what a running job gives up its slice for. No checkpoint (nothing runs), no minRuntime or minInterval, and no
    settle of the free slice: it loses nothing by going, and a running job waits `settle` before it takes the same
    slice, so the waiting one goes first. The Move is written `moving` at once (the route of every move).

    A capacity failure within `settle` holds it only on a reservation rung, where the free slice is quota alone
    (climb.fits): on any other rung a free slice is one of idle nodes that exist now, whatever failed there before.
    Found on a capacity story (issue 43): a job that moved from stocked-out on-demand to DWS waited 203 s beside
    the on-demand slice its probe had made, held by its own stockout until `settle` (5 m) had passed.
    `others_hold_nothing`: another job waits below the same rungs holding no quota; a job whose DWS request is pending
    then stays, so the request keeps its place and the other job takes the slice (climbing, the holder would give the
    request up and the other would start a new one from the back of DWS's queue).
    Also found on the goodput bench: a job moved down to Spot's queue waited there, Spot full, while the reservation
    above it had been free for minutes; and a job waited for DWS to provision while Spot had a slice again (found by
    a probe: failover/api/probes.py)."""
    never = NotYet(None)
    if job.pending is not None and job.pending.state != MOVED:
        return never  # a move (or a climb) under way finishes first
    rung = waiting_rung(chain, view, bool(job.history))
    if rung is None:
        return never
    if view.quota_reserved and others_hold_nothing:
        # Its DWS request keeps its place in DWS's queue; a job waiting with nothing takes the slice above instead.
        # Found on a random story: four jobs climbed onto one slice at once, the request's holder among them.
        return never
    later = []
    for index in waiting_targets(chain, rung):
        flavor = chain.rungs[index].flavor
        if free(flavor) is None:
            continue
        failed = last_failure(flavor) if flavor in policy.reserved else None
        if failed is not None and now < failed + policy.settle:
            later.append(failed + policy.settle)
            continue
        target = chain.rungs[index]
        return Climb(Move(chain.rungs[rung].flavor, target.flavor, target.local_queue, CLIMB_BACK_WAITING,
                          format_time(now), MOVING, from_local_queue=view.queue_name))
    return NotYet(min(later)) if later else never


# ---- a climb's checkpoint, one step at a time: the protocol is failover/api/checkpoint_moves.py -----------------
def next_in_climb(move: Move, view: WorkloadView, job: JobFacts, still_free: bool, policy: ClimbPolicy,
                  now: datetime.datetime) -> tuple[str, datetime.datetime | None]:
    """The next step of a climb while the job saves (checkpoint_moves.next_step), and until when it waits (SAVING).
    The job still runs where it climbs from while it runs on that admission: not moved, evicted, finished, nor its
    slice lost."""
    on_it = (view.admitted and view.pods_ready_since is not None and not view.finished and not job.losing
             and view.flavor == move.from_flavor
             and (view.admitted_at is None or view.admitted_at <= parse_time(move.at)))
    return next_step(checkpoint_of(move), on_it, job.checkpoints, still_free, policy.save_timeout, now)


def climb_message(move: Move, from_queue: str) -> str:
    """The one line logged, and the Event's message, for a climb done."""
    why = ("had a free slice while the job waited below, holding no quota" if move.reason == CLIMB_BACK_WAITING
           else "had a free slice for the settle time")
    return (f"climbed back from {move.from_flavor} to {move.to_flavor} (LocalQueue {from_queue} -> "
            f"{move.to_local_queue}): {move.to_flavor} {why}")


def possible_climbs(chain: Chain, policy: ClimbPolicy) -> list[tuple[str, str]]:
    """Every (from flavor, to flavor) a climb can have: from any rung below one without an admission check up to it (a
    running job's only to those the policy names, with climbing back on; a waiting job's to any, always)."""
    return [(lower.flavor, upper.flavor) for i, upper in enumerate(chain.rungs)
            if not upper.admission_check for lower in chain.rungs[i + 1:]]
