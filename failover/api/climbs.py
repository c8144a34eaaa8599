"""Climbing back: a running job below its chain's first rung moved up to a rung that has had a free slice for a settle
time (failover/regional/climb.py decides it; failover/ladder/climb.py in a fleet). Its vocabulary: the reason of its
Move, the state a climb's Move is in while the job saves, its Event, the policy the stack writes (FAILOVER_CLIMB_BACK,
failover/config.py), and the signal both climbs read: a rung's (a step's) free capacity over time."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from failover.api.moves import Move
from failover.api.times import parse_time

# A Move's reason when the controller moves a job up the chain, not down (from_flavor below to_flavor): a running
# job (it checkpoints first), or a job that waits below its first rung holding no quota (nothing to save or lose).
CLIMB_BACK = "ClimbBack"
CLIMB_BACK_WAITING = "ClimbBackWaiting"
CLIMBS = frozenset({CLIMB_BACK, CLIMB_BACK_WAITING})
# A climb's Move on the RayJob (FAILOVER_ANNOTATION) before it becomes MOVING: the job was asked to checkpoint
# (failover/checkpoints.py) and still runs where it is; the move starts once the save is taken as done, or is called
# off (the record before it is put back) when the job or the rung above changed meanwhile.
CHECKPOINTING = "checkpointing"
CLIMB_EVENT_REASON = "ClimbedBack"  # the Event on the RayJob once a climb is done (a move down: MovedToNextRung)
# On a TPU node: the rung (Kueue flavor) its pool serves, as the stack labels every TPU pool (infra/tpu_pool.py
# PLAN_LABEL_KEY, which each rung's ResourceFlavor selects); GKE's label of its node pool is NODE_POOL_LABEL.
CAPACITY_LABEL = "tpu-fallback/capacity"


@dataclass(frozen=True)
class ClimbPolicy:
    """`fallback.climbBack` as the controller reads it: the rungs (flavors) a job may climb to, and the bounds."""

    to: tuple[str, ...]  # the flavors a running job may climb to; empty: a running job never climbs (a waiting one
    # still goes back up: climb.decide_climb_waiting)
    # The chain's flavors whose free quota is itself the proof of capacity: a reservation's slices are held for the
    # project (its quota is the reservation's size). Any other rung also needs an idle slice of its own nodes.
    reserved: tuple[str, ...]
    settle: datetime.timedelta  # how long the rung above must have had a free slice, without a capacity failure
    min_interval: datetime.timedelta  # at most one climb per job in this long
    min_runtime: datetime.timedelta  # never in a job's first this long on a rung
    run_end_margin: datetime.timedelta  # never for a DWS run that ends within this long
    save_timeout: datetime.timedelta  # the checkpoint asked first is taken as saved this long after the request

    @property
    def enabled(self) -> bool:
        return bool(self.to)

    def as_data(self) -> dict[str, Any]:
        return {"to": list(self.to), "reserved": list(self.reserved),
                **{name: _number(getattr(self, field).total_seconds()) for name, field in _DURATIONS}}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> ClimbPolicy:
        to, reserved = _flavors(data, "to"), _flavors(data, "reserved")
        durations = {}
        for name, field in _DURATIONS:
            seconds = data[name]
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
                raise TypeError(f"{name} must be a number of seconds, at least 0: {dict(data)!r}")
            durations[field] = datetime.timedelta(seconds=seconds)
        return cls(to, reserved, **durations)


_DURATIONS = (("settleSeconds", "settle"), ("minIntervalSeconds", "min_interval"),
              ("minRuntimeSeconds", "min_runtime"), ("runEndMarginSeconds", "run_end_margin"),
              ("saveTimeoutSeconds", "save_timeout"))


def _flavors(data: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = data[key]
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise TypeError(f"{key} must be a list of flavor names: {dict(data)!r}")
    return tuple(value)


def _number(seconds: float) -> int | float:
    return int(seconds) if seconds == int(seconds) else seconds


@dataclass(frozen=True)
class Climb:
    """A climb's decision (failover/regional/climb.py, failover/ladder/climb.py): write `move` on the RayJob, in state
    `checkpointing` (the job is asked to save first) or, for a job with nothing running, `moving`."""

    move: Move


@dataclass(frozen=True)
class NotYet:
    """A climb's decision: nothing now; look again at `at` (None: only a change of the job or of the capacity above
    it can make it climb)."""

    at: datetime.datetime | None


def newest_failures(moves: Iterable[Move | None], reasons: frozenset[str]) -> dict[str, datetime.datetime]:
    """{where a move left (its from_flavor: a rung, or a fleet step's queue): when} of the newest move for one of
    `reasons` (the capacity failures a climb waits `settle` after), per place, among a RayJob's moves."""
    newest: dict[str, datetime.datetime] = {}
    for move in moves:
        at = parse_time(move.at) if move is not None and move.reason in reasons else None
        if at is not None and (move.from_flavor not in newest or at > newest[move.from_flavor]):
            newest[move.from_flavor] = at
    return newest


# ---- the signal: what a rung had free, over time ---------------------------------------------------------------
@dataclass(frozen=True)
class Sample:
    """What one rung had from `at` on, until the next sample."""

    at: datetime.datetime
    free_chips: int  # nominal TPU quota less what Kueue reserved, over every ClusterQueue
    idle_hosts: int  # the most idle TPU hosts in one of the rung's node pools


@dataclass(frozen=True)
class Need:
    """What the job takes of a rung: its TPU chips and hosts."""

    chips: int
    hosts: int


def fits(sample: Sample, need: Need, reserved: bool) -> bool:
    """Whether the rung could admit the job and give it a slice, as this sample says."""
    return sample.free_chips >= need.chips and (reserved or sample.idle_hosts >= need.hosts)


def free_since(samples: Sequence[Sample], need: Need, reserved: bool) -> datetime.datetime | None:
    """Since when the rung has had a free slice for the job without a break (samples oldest first); None when it has
    none now. The oldest sample kept bounds it: what came before is unknown (a restart starts the settle afresh)."""
    since = None
    for sample in reversed(samples):
        if not fits(sample, need, reserved):
            break
        since = sample.at
    return since


def record(samples: list[Sample], sample: Sample, horizon: datetime.datetime) -> bool:
    """Append `sample` if it differs from the last one, and forget what is older than `horizon` except the newest such
    sample (it says what the rung had at the horizon). Whether anything changed."""
    changed = not samples or (samples[-1].free_chips, samples[-1].idle_hosts) != (sample.free_chips, sample.idle_hosts)
    if changed:
        samples.append(sample)
    while len(samples) > 1 and samples[1].at <= horizon:
        del samples[0]
    return changed
