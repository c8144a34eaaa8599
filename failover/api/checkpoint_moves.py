"""A move that checkpoints first: the job is asked to save (the checkpoint channel, failover/checkpoints.py), and the
move starts only once the save is taken as done (`saveTimeout` after the request: the channel has no answer), if the
job still runs where the move leaves from and where it goes is still free; else the move is called off and the
record before it put back. The regional climb (failover/regional/climb.py), the fleet's climb
(failover/ladder/climb.py) and a move ahead of a disruption (failover/maintenance.py) take these steps. Pure: each
controller reads the pods' answers and judges "still runs where it left from" its own way, and passes them in.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence

from failover.api.checkpoints import CheckpointRequest, answered_at, pods_to_ask
from failover.api.climbs import CLIMB_BACK
from failover.api.moves import Move
from failover.api.times import parse_time

# The steps, one at a time (each pass of a controller takes the next one):
ASK = "ask"  # write the request on the pods that do not carry it yet
SAVING = "saving"  # wait until the save is taken as done
GO = "go"  # the save is done: the move's own steps follow
CALL_OFF = "call-off"  # put back the record before the move; the job stays where it runs

# Answers, by pod: {pod name: its CHECKPOINT_REQUEST_ANNOTATION now}. None: the pods were not read (asked again,
# which finds them).
Answers = Mapping[str, str | None] | None


def checkpoint_of(move: Move) -> CheckpointRequest:
    """The save a climb asks for, from its Move alone: a restart asks the same."""
    at = parse_time(move.at)
    return CheckpointRequest.about(CLIMB_BACK, at, at)


def saves_asked(answers: Mapping[str, str | None], save_timeout: datetime.timedelta) -> list[datetime.datetime]:
    """When each save the job's pods were asked for (by anything: a climb, a maintenance) is taken as done: a new
    move does not start before them."""
    found = {CheckpointRequest.parse(value) for value in answers.values()}
    return [answered_at(request, save_timeout) for request in found if request is not None]


def save_step(request: CheckpointRequest, answers: Answers, save_timeout: datetime.timedelta,
              now: datetime.datetime) -> tuple[str, datetime.datetime | None]:
    """Where the save for `request` stands: ASK while a pod does not carry it (or none was read), SAVING until it is
    taken as done (and that time), then GO."""
    if answers is None or pods_to_ask(request, answers):
        return ASK, None
    done = answered_at(request, save_timeout)
    if now < done:
        return SAVING, done
    return GO, None


def next_step(request: CheckpointRequest, still_there: bool, answers: Answers, still_free: bool,
              save_timeout: datetime.timedelta, now: datetime.datetime) -> tuple[str, datetime.datetime | None]:
    """The next step of a move that checkpoints first, and until when it waits (SAVING). Called off when the job no
    longer runs where the move leaves from (`still_there`), or where it goes is no longer free (`still_free`) once the
    save is done: giving up the slice it has would then gain nothing."""
    if not still_there:
        return CALL_OFF, None
    step, until = save_step(request, answers, save_timeout, now)
    if step == GO and not still_free:
        return CALL_OFF, None
    return step, until


def restored(history: Sequence[Move]) -> Move | None:
    """What FAILOVER_ANNOTATION held before a move that is called off: the last completed move, if any."""
    return history[-1] if history else None
