"""failover/maintenance.py: a disruption of a running job's slice seen coming (a host's scheduled maintenance, a DWS
run's end), decided without a server; and its settings (fallback.maintenance)."""

from __future__ import annotations

import datetime

import pytest

from failover import maintenance
from failover.api import (DISRUPTION_AHEAD, MAINTENANCE, RUN_END, Ahead, Chain, CheckpointRequest, Rung,
                          WorkloadView, format_time)
from failover.maintenance import AskCheckpoint, ClearAhead, MoveAhead, Policy, RecordAhead, Seen
from failover.slices import HostView, NodeView
from infra.settings import ConfigReader
from infra.settings.fallback import MaintenanceSettings, read_fallback_settings

UTC = datetime.timezone.utc
T0 = datetime.datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
WINDOW = datetime.datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
MINUTE = datetime.timedelta(minutes=1)
CHAIN = Chain((Rung("reservation", "cq-reservation", "user-queue", False, 600),
               Rung("on-demand", "cq", "user-queue-on-demand", False, 600),
               Rung("spot", "cq-spot", "user-queue-spot", False, 120),
               Rung("dws", "cq-dws", "user-queue-dws", True, 120)))
CHECKPOINT_ONLY = Policy("checkpoint", 15 * MINUTE, 2 * MINUTE)
MOVE_FIRST = Policy("move", 15 * MINUTE, 2 * MINUTE)


def node(name: str, labels: dict | None = None, taints: list | None = None) -> NodeView:
    return NodeView.from_object({"metadata": {"name": name, "labels": labels or {}},
                                 "spec": {"taints": taints or []},
                                 "status": {"conditions": [{"type": "Ready", "status": "True"}]}})


def hosts(*nodes: str) -> list[HostView]:
    return [HostView(f"w-{i}", name, True, T0) for i, name in enumerate(nodes)]


def test_gke_s_maintenance_labels_are_read_from_the_node():
    scheduled = node("n", {"cloud.google.com/scheduled-maintenance-time": str(int(WINDOW.timestamp()))})
    assert (scheduled.maintenance_at, scheduled.maintenance_ongoing, scheduled.going) == (WINDOW, False, None)
    ongoing = node("n", {"cloud.google.com/active-node-maintenance": "ONGOING"})
    assert ongoing.maintenance_ongoing and ongoing.going == ("is under maintenance", None)  # the lost-slice path
    tainted = node("n", {"cloud.google.com/active-node-maintenance": "ONGOING"},
                   [{"key": "cloud.google.com/impending-node-termination", "effect": "NoSchedule",
                     "timeAdded": "2026-12-01T10:00:05Z"}])
    assert tainted.going == ("received a termination notice", WINDOW + datetime.timedelta(seconds=5))
    assert node("n", {"cloud.google.com/scheduled-maintenance-time": "soon"}).maintenance_at is None


def test_the_first_disruption_of_the_job_s_own_hosts_is_the_one_ahead():
    later = str(int((WINDOW + MINUTE).timestamp()))
    nodes = {"a": node("a", {"cloud.google.com/scheduled-maintenance-time": later}),
             "b": node("b", {"cloud.google.com/scheduled-maintenance-time": str(int(WINDOW.timestamp()))}),
             "other": node("other", {"cloud.google.com/scheduled-maintenance-time": str(int(T0.timestamp()))}),
             "begun": node("begun", {"cloud.google.com/scheduled-maintenance-time": str(int(T0.timestamp())),
                                     "cloud.google.com/active-node-maintenance": "ONGOING"})}
    assert maintenance.seen_ahead(hosts("a", "b", "begun"), nodes, None) == Seen(MAINTENANCE, WINDOW, "b")
    assert maintenance.seen_ahead(hosts("a", "b"), nodes, WINDOW - MINUTE) == Seen(RUN_END, WINDOW - MINUTE)
    assert maintenance.seen_ahead(hosts("c"), nodes, None) is None


def test_a_dws_run_ends_at_its_admission_plus_its_maximum_run():
    view = WorkloadView("w", "ns", "user-queue-dws", True, True, True, T0, "dws", "dws", None, "job",
                        admitted_since=T0, max_run_seconds=3600)
    assert maintenance.run_end(view, CHAIN.rungs[3]) == T0 + 60 * MINUTE
    assert maintenance.run_end(view, CHAIN.rungs[1]) is None  # no check: no run limit
    assert maintenance.run_end(WorkloadView("w", "ns", "q", True, True, True, T0, "dws", "dws", None, "job",
                                            admitted_since=T0), CHAIN.rungs[3]) is None


def test_free_quota_is_the_nominal_less_the_reserved_and_a_move_goes_to_the_first_rung_with_room():
    queue = {"spec": {"resourceGroups": [{"flavors": [
        {"name": "spot", "resources": [{"name": "google.com/tpu", "nominalQuota": 32}, {"name": "cpu"}]}]}]},
        "status": {"flavorsReservation": [{"name": "spot", "resources": [{"name": "google.com/tpu", "total": 16}]}]}}
    assert maintenance.free_tpus(queue) == {"spot": 16}
    free = {"cq-spot": {"spot": 16}, "cq-reservation": {"reservation": 0}, "cq-dws": {"dws": 64}}
    assert maintenance.move_target(CHAIN, "on-demand", 16, free) == CHAIN.rungs[2]
    assert maintenance.move_target(CHAIN, "on-demand", 32, free) is None  # DWS is never a target
    assert maintenance.move_target(CHAIN, "spot", 16, free) is None


def _view(flavor: str = "on-demand") -> WorkloadView:
    return WorkloadView("w", "ns", "user-queue", True, True, True, T0, flavor, flavor, None, "job",
                        pods_ready_since=T0, tpu_hosts=2, tpu_chips=8)


def _decide(recorded, now, policy=CHECKPOINT_ONLY, asked=None, target=None, seen=Seen(MAINTENANCE, WINDOW, "b")):
    return maintenance.decide_ahead(_view(), recorded, seen, policy, asked or {"w-0": None, "w-1": None}, target, now)


def test_a_maintenance_is_recorded_when_seen_then_the_job_is_asked_to_checkpoint_lead_time_ahead():
    seen_at = T0 + MINUTE
    action, again = _decide(None, seen_at)
    record = Ahead(MAINTENANCE, "2026-12-01T10:00:00Z", "b", "on-demand", format_time(seen_at))
    assert action == RecordAhead(record) and again == seen_at
    assert record.message() == "maintenance of host b at 2026-12-01T10:00:00Z (on on-demand)"
    assert _decide(record, seen_at) == (None, WINDOW - 15 * MINUTE)  # look again at the lead time

    ask = WINDOW - 15 * MINUTE
    action, _ = _decide(record, ask)
    request = CheckpointRequest("maintenance-20261201t100000z", format_time(ask))
    assert action == AskCheckpoint(record.with_(checkpoint=request.value()), request, ("w-0", "w-1"))
    asked = action.ahead
    assert asked.message().endswith("; checkpoint asked at 2026-12-01T09:45:00Z")
    # A pod without it (recreated, or a write cut short) is asked the same request; then nothing more to do.
    again = _decide(asked, ask + MINUTE, asked={"w-0": request.value(), "w-1": None})[0]
    assert again == AskCheckpoint(asked, request, ("w-1",))
    assert _decide(asked, ask + MINUTE, asked={"w-0": request.value(), "w-1": request.value()}) == (None, None)


def test_with_move_the_job_moves_once_the_save_is_taken_as_done_and_before_the_window():
    request = CheckpointRequest("maintenance-20261201t100000z", "2026-12-01T09:45:00Z")
    asked = Ahead(MAINTENANCE, "2026-12-01T10:00:00Z", "b", "on-demand", "2026-12-01T09:01:00Z",
                  checkpoint=request.value())
    pods = {"w-0": request.value(), "w-1": request.value()}
    spot = CHAIN.rungs[2]
    answered = request.asked_at + 2 * MINUTE
    assert _decide(asked, answered - MINUTE, MOVE_FIRST, pods, spot) == (None, answered)
    action, again = _decide(asked, answered, MOVE_FIRST, pods, spot)
    assert action.ahead == asked.with_(moved_to="spot") and again is None
    move = action.move
    assert (move.from_flavor, move.to_flavor, move.to_local_queue, move.reason, move.from_local_queue) == (
        "on-demand", "spot", "user-queue-spot", DISRUPTION_AHEAD, "user-queue")
    assert isinstance(action, MoveAhead)
    # No rung with room: a quota's change queues it again (no timed retry), else the window; at the window, no move
    # (the lost-slice path's).
    assert _decide(asked, answered, MOVE_FIRST, pods, None) == (None, WINDOW)
    assert _decide(asked, WINDOW, MOVE_FIRST, pods, spot) == (None, None)
    assert _decide(asked.with_(moved_to="spot"), answered, MOVE_FIRST, pods, spot) == (None, None)


def test_none_only_records_and_a_cancelled_maintenance_is_cleared_but_a_past_one_stays():
    record = Ahead(MAINTENANCE, "2026-12-01T10:00:00Z", "b", "on-demand", "2026-12-01T09:01:00Z")
    assert _decide(record, WINDOW - MINUTE, Policy("none", 15 * MINUTE, 2 * MINUTE)) == (None, None)
    assert _decide(record, T0 + 2 * MINUTE, seen=None) == (ClearAhead(), None)
    assert _decide(record, WINDOW + MINUTE, seen=None) == (None, None)  # its time came: kept, as history


def test_a_record_of_another_admission_does_not_count():
    on_spot = Ahead(MAINTENANCE, "2026-12-01T10:00:00Z", "b", "spot", "2026-12-01T09:01:00Z")
    before = Ahead(MAINTENANCE, "2026-12-01T10:00:00Z", "b", "on-demand", "2026-12-01T08:59:00Z")
    for stale in (on_spot, before):
        assert maintenance.current(stale, "on-demand", T0) is None
        assert isinstance(_decide(stale, T0 + MINUTE)[0], RecordAhead)


def test_the_settings_are_read_over_their_defaults_and_the_save_fits_in_the_lead():
    reader = ConfigReader({})
    assert read_fallback_settings(reader, ()).maintenance == MaintenanceSettings("checkpoint", 900, 120)
    reader = ConfigReader({"fallback": '{"maintenance": {"action": "move", "leadTime": "1h"}}'})
    assert read_fallback_settings(reader, ()).maintenance == MaintenanceSettings("move", 3600, 120)
    reader = ConfigReader({"fallback": '{"maintenance": {"leadTime": "2m", "saveTimeout": "2m"}}'})
    read_fallback_settings(reader, ())
    assert [p for p in reader.problems if "fallback.maintenance.saveTimeout" in p and "not shorter" in p], \
        reader.problems


@pytest.mark.parametrize("kind", [MAINTENANCE, RUN_END])
def test_the_record_reads_back(kind):
    ahead = Ahead(kind, "2026-12-01T10:00:00Z", "b" if kind == MAINTENANCE else "", "dws", "2026-12-01T09:01:00Z",
                  "run-end-20261201t100000z 2026-12-01T09:45:00Z", "spot")
    assert Ahead.from_json(ahead.to_json()) == ahead
    assert Ahead.from_json("{") is None
    if kind == RUN_END:
        assert ahead.message() == ("its DWS run ends at 2026-12-01T10:00:00Z (on dws); checkpoint asked at "
                                   "2026-12-01T09:45:00Z, moved to spot")


def test_a_dws_run_end_is_recorded_at_once_but_announced_only_a_save_before_its_checkpoint_request():
    """A DWS run's end is known from its start, days ahead: every DWS job would get a DisruptionAhead Event and a
    count the moment it runs. It is recorded then, quiet (`ops status` reads the record), and announced (the Event,
    the metric: a loud record) `saveTimeout` before its checkpoint request, which goes `leadTime` before the end."""
    end = T0 + datetime.timedelta(days=7)
    seen = Seen(RUN_END, end)
    announce = end - 15 * MINUTE - 2 * MINUTE
    assert maintenance.announce_at(seen, CHECKPOINT_ONLY) == announce
    assert maintenance.announce_at(Seen(MAINTENANCE, end, "b"), CHECKPOINT_ONLY) is None  # a maintenance at once

    started = T0 + MINUTE
    quiet = Ahead(RUN_END, format_time(end), "", "on-demand", format_time(started), quiet=True)
    assert _decide(None, started, seen=seen) == (RecordAhead(quiet), started)
    assert quiet.message() == "its DWS run ends at 2026-12-08T09:00:00Z (on on-demand)"  # what `ops status` says
    assert _decide(quiet, started, seen=seen) == (None, announce)  # nothing more until the announcement
    assert _decide(quiet, announce - MINUTE, seen=seen) == (None, announce)
    loud = quiet.with_(quiet=False)
    assert _decide(quiet, announce, seen=seen) == (RecordAhead(loud), announce)
    assert loud.seen_at == format_time(started)  # still when it was first seen
    assert _decide(loud, announce, seen=seen) == (None, end - 15 * MINUTE)  # then the checkpoint request's time
    ask = end - 15 * MINUTE
    action, _ = _decide(loud, ask, seen=seen)
    assert isinstance(action, AskCheckpoint) and not action.ahead.quiet
    # Seen first within the horizon (a short maxRunDuration, or a controller that started late): loud at once.
    late = announce + MINUTE
    assert _decide(None, late, seen=seen) == (
        RecordAhead(Ahead(RUN_END, format_time(end), "", "on-demand", format_time(late))), late)
    # A run end that moved (a new admission's): recorded anew, quiet again while far off.
    moved = Seen(RUN_END, end + datetime.timedelta(days=1))
    action, again = _decide(loud, started, seen=moved)
    assert isinstance(action, RecordAhead) and action.ahead.quiet and again == started


def test_a_quiet_record_reads_back_and_an_older_record_counts_as_announced():
    quiet = Ahead(RUN_END, "2026-12-08T09:00:00Z", "", "dws", "2026-12-01T09:01:00Z", quiet=True)
    assert Ahead.from_json(quiet.to_json()) == quiet
    loud = quiet.with_(quiet=False)
    assert "quiet" not in loud.to_json() and Ahead.from_json(loud.to_json()) == loud
    # Written before the field existed: those were all announced when recorded.
    assert Ahead.from_json('{"kind": "run-end", "at": "2026-12-08T09:00:00Z", "host": "", "flavor": "dws", '
                           '"seenAt": "2026-12-01T09:01:00Z"}') == loud
