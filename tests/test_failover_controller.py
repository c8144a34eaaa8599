"""failover/controller.py without a server: the end of a move survives a `kill -9` after any of its writes."""

from __future__ import annotations

import copy
import datetime

import pytest
from kubernetes.client import ApiException

from failover import decisions
from failover.controller import EVENT_REASON, Controller
from failover.decisions import FAILOVER_ANNOTATION, Move
from failover.metrics import Metrics

NOW = datetime.datetime(2026, 12, 3, 6, 0, tzinfo=datetime.timezone.utc)
MOVE = Move("on-demand", "dws", "user-queue-dws", decisions.PODS_READY_TIMEOUT, "2026-12-03T05:59:00Z",
            decisions.MOVING)


class _Killed(Exception):
    """The controller's process ends here (`kill -9`): what was written stays, nothing after it happens."""


class _Server:
    """A RayJob and the Events about it; every write lands, then the process may be killed after it."""

    def __init__(self, kill_after: int | None):
        self.job = {"metadata": {"name": "job", "namespace": "default", "uid": "uid-1", "resourceVersion": "1",
                                 "annotations": {FAILOVER_ANNOTATION: MOVE.to_json()}}}
        self.events: dict[str, str] = {}  # name -> reason
        self.writes, self.kill_after = 0, kill_after

    def wrote(self) -> None:
        self.writes += 1
        if self.writes == self.kill_after:
            raise _Killed

    def patch(self, obj: dict, patch: dict) -> dict:
        assert obj["metadata"]["resourceVersion"] == self.job["metadata"]["resourceVersion"]
        self.job["metadata"]["annotations"].update(patch["metadata"]["annotations"])
        self.job["metadata"]["resourceVersion"] = str(int(self.job["metadata"]["resourceVersion"]) + 1)
        self.wrote()
        return copy.deepcopy(self.job)

    def create_event(self, namespace: str, event) -> None:
        if event.metadata.name in self.events:
            raise ApiException(status=409, reason="AlreadyExists")
        self.events[event.metadata.name] = event.reason
        self.wrote()


def _controller(server: _Server) -> Controller:
    """A Controller whose writes go to `server`; only what `_record_done` uses is set."""
    controller = Controller.__new__(Controller)
    controller.rayjobs, controller.metrics, controller.clock = "rayjobs", Metrics(), lambda: NOW
    controller._patch = lambda resource, obj, patch: server.patch(obj, patch)
    controller.core = type("Core", (), {"create_namespaced_event": staticmethod(server.create_event)})()
    return controller


@pytest.mark.parametrize("kill_after", [None, 1, 2])
def test_a_moves_end_says_it_once_whatever_write_the_controller_is_killed_after(kill_after):
    server = _Server(kill_after)
    if kill_after is not None:
        with pytest.raises(_Killed):
            _controller(server)._record_done(copy.deepcopy(server.job), MOVE, "user-queue")
    server.kill_after = None  # the restarted controller reads the RayJob again and finishes
    _controller(server)._record_done(copy.deepcopy(server.job), MOVE, "user-queue")

    annotations = server.job["metadata"]["annotations"]
    assert Move.from_json(annotations[FAILOVER_ANNOTATION]) == MOVE.done()
    assert decisions.MOVES_ANNOTATION in annotations
    # One Event, never none (the record written first and a kill lost it) and never two.
    assert list(server.events.values()) == [EVENT_REASON], server.events
