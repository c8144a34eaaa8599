"""failover/regional/controller.py without a server: the end of a move survives a `kill -9` after any of its writes."""

from __future__ import annotations

import copy
import datetime

import pytest

from failover import api
from failover.regional.controller import Controller
from failover.api import FAILOVER_ANNOTATION, MOVE_EVENT_REASON, Move
from failover.runtime.metrics import Metrics
from tests.killed_controller import Events, Killed, KilledAfter, merge_patch

NOW = datetime.datetime(2026, 12, 3, 6, 0, tzinfo=datetime.timezone.utc)
MOVE = Move("on-demand", "dws", "user-queue-dws", api.PODS_READY_TIMEOUT, "2026-12-03T05:59:00Z",
            api.MOVING)


class _Server:
    """The RayJob as the API server keeps it, and the Events about it."""

    def __init__(self):
        self.job = {"metadata": {"name": "job", "namespace": "default", "uid": "uid-1", "resourceVersion": "1",
                                 "annotations": {FAILOVER_ANNOTATION: MOVE.to_json()}}}
        self.events = Events()

    def patch(self, obj: dict, body: dict) -> dict:
        assert body["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]  # else the server's 409
        merge_patch(obj, body)
        obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(obj)


def _controller(server: _Server, kill_after: int | None) -> Controller:
    """The real Controller's `_record_done` and guarded writes over `server`, killed after its `kill_after`-th write."""
    controller = Controller.__new__(Controller)
    controller.rayjobs, controller.metrics, controller.clock = "rayjobs", Metrics(), lambda: NOW
    controller.api = controller.core = KilledAfter(lambda resource: server.job, server.patch, server.events,
                                                   kill_after)
    return controller


@pytest.mark.parametrize("kill_after", [None, 1, 2])
def test_a_moves_end_says_it_once_whatever_write_the_controller_is_killed_after(kill_after):
    server = _Server()
    if kill_after is not None:
        with pytest.raises(Killed):
            _controller(server, kill_after)._record_done(copy.deepcopy(server.job), MOVE, "user-queue")
    # The restarted controller reads the RayJob again and finishes.
    _controller(server, None)._record_done(copy.deepcopy(server.job), MOVE, "user-queue")

    annotations = server.job["metadata"]["annotations"]
    assert Move.from_json(annotations[FAILOVER_ANNOTATION]) == MOVE.done()
    assert api.MOVES_ANNOTATION in annotations
    # One Event, never none (the record written first and a kill lost it) and never two.
    assert server.events == [MOVE_EVENT_REASON], server.events


def test_a_climbs_end_is_a_climbed_back_event_and_counted_as_a_climb_not_a_move_down():
    from failover.api.climbs import CLIMB_BACK, CLIMB_EVENT_REASON

    server = _Server()
    climb = Move("spot", "reservation", "user-queue", CLIMB_BACK, "2026-12-03T05:59:00Z", api.MOVING,
                 from_local_queue="user-queue-spot")
    server.job["metadata"]["annotations"][FAILOVER_ANNOTATION] = climb.to_json()
    controller = _controller(server, None)
    controller._record_done(copy.deepcopy(server.job), climb, "user-queue-spot")
    assert server.events == [CLIMB_EVENT_REASON], server.events
    assert api.move_history(server.job["metadata"]["annotations"]) == [climb.done()]
    registry = controller.metrics.registry
    assert registry.get_sample_value("tpu_fallback_climbs_total",
                                     {"from_flavor": "spot", "to_flavor": "reservation"}) == 1
    assert registry.get_sample_value("tpu_fallback_moves_total", {"from_flavor": "spot", "to_flavor": "reservation",
                                                                  "reason": CLIMB_BACK}) is None
