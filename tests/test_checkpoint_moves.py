"""A move that checkpoints first (failover/api/checkpoint_moves.py), offline: each step of the protocol the regional
climb, the fleet's climb and a move ahead of a disruption share, once."""

import datetime

import pytest

from failover.api import CLIMB_BACK, MOVED, STOCKOUT, Move
from failover.api.checkpoint_moves import (ASK, CALL_OFF, GO, SAVING, checkpoint_of, next_step, restored, save_step,
                                           saves_asked)
from failover.api.checkpoints import CheckpointRequest
from failover.api.climbs import CHECKPOINTING

NOW = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.timezone.utc)
MINUTE = datetime.timedelta(minutes=1)
SAVE = 2 * MINUTE
CLIMB = Move("spot", "reservation", "user-queue", CLIMB_BACK, "2026-12-01T12:00:00Z", CHECKPOINTING)
REQUEST = checkpoint_of(CLIMB)
ASKED = {"w-0": REQUEST.value(), "w-1": REQUEST.value()}


def test_a_move_asks_one_request_named_after_itself():
    assert REQUEST == CheckpointRequest("climbback-20261201t120000z", "2026-12-01T12:00:00Z")  # a restart asks it again


@pytest.mark.parametrize("still_there, answers, still_free, now, expected", [
    (False, ASKED, True, NOW + SAVE, (CALL_OFF, None)),  # the job left where the move leaves from
    (True, {"w-0": REQUEST.value(), "w-1": None}, True, NOW, (ASK, None)),  # a pod without the request
    (True, None, True, NOW, (ASK, None)),  # no pod read: asked (again), which finds them
    (True, ASKED, True, NOW + MINUTE, (SAVING, NOW + SAVE)),  # every pod asked: the save's time
    (True, ASKED, True, NOW + SAVE, (GO, None)),  # saved, and where it goes still free
    (True, ASKED, False, NOW + SAVE, (CALL_OFF, None)),  # saved, but where it goes was taken meanwhile
], ids=["left", "ask", "none-read", "saving", "go", "taken"])
def test_each_step_of_a_move_that_checkpoints_first(still_there, answers, still_free, now, expected):
    assert next_step(REQUEST, still_there, answers, still_free, SAVE, now) == expected


def test_the_save_alone_never_calls_off_and_an_empty_read_asks_nobody():
    assert save_step(REQUEST, {}, SAVE, NOW) == (SAVING, NOW + SAVE)  # no pods at all: the wait, as before a move
    assert save_step(REQUEST, ASKED, SAVE, NOW + SAVE) == (GO, None)


def test_a_new_move_waits_for_every_save_asked_and_a_call_off_puts_back_the_record_before_it():
    other = CheckpointRequest.about("maintenance", NOW + 30 * MINUTE, NOW + MINUTE)
    answers = {"w-0": REQUEST.value(), "w-1": REQUEST.value(), "w-2": other.value(), "w-3": "garbage", "w-4": None}
    assert sorted(saves_asked(answers, SAVE)) == [NOW + SAVE, NOW + MINUTE + SAVE]
    down = Move("on-demand", "spot", "user-queue-spot", STOCKOUT, "2026-12-01T11:00:00Z", MOVED)
    assert restored((down,)) == down and restored(()) is None
