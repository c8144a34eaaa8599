"""The fleet watch's findings (failover/fleet.py): where a fleet job runs against Kueue's record. Pure functions; the
real partition and return are in tests/test_fleet_controlplane.py."""

from __future__ import annotations

import json

from failover.fleet import (MEMBER_LOST, RECORD_STALE, RUNNING, RUNNING_TWICE, WARNINGS, Finding, assess, changed)


def test_a_job_running_where_kueue_says_is_running():
    finding = assess("w2", {"w1": False, "w2": True}, frozenset())
    assert finding == Finding(RUNNING, ("w2",), "w2")
    assert finding.message() == "runs in w2" and RUNNING not in WARNINGS


def test_a_job_that_runs_nowhere_waits():
    finding = assess(None, {"w1": False, "w2": False}, frozenset())
    assert (finding.state, finding.runs_in) == ("Waiting", ()) and "Waiting" not in WARNINGS


def test_after_the_return_the_run_is_where_kueue_kept_it_not_where_its_record_says():
    """Measured on Kueue 0.19.2: back from a partition, w2 keeps the job (older admission), the record says w1."""
    finding = assess("w1", {"w1": False, "w2": True}, frozenset())
    assert (finding.state, finding.runs_in, finding.record) == (RECORD_STALE, ("w2",), "w1")
    assert finding.message().startswith("runs in w2; Kueue's record still names w1")
    assert RECORD_STALE in WARNINGS
    # Measured too: back from a partition before the other member provisioned, no record at all.
    nowhere = assess(None, {"w1": False, "w2": True}, frozenset())
    assert nowhere.state == RECORD_STALE and nowhere.message().startswith("runs in w2; Kueue's record names no member")


def test_two_runs_at_once_are_said_whatever_the_record():
    for record in ("w1", "w2", None):
        finding = assess(record, {"w1": True, "w2": True}, frozenset())
        assert (finding.state, finding.runs_in) == (RUNNING_TWICE, ("w1", "w2"))


def test_a_lost_member_that_holds_the_record():
    finding = assess("w2", {"w1": False}, frozenset({"w2"}))
    assert (finding.state, finding.unreachable) == (MEMBER_LOST, ("w2",))
    assert finding.message().startswith("w2, where Kueue admitted it, does not answer; a run there may go on")
    # Nothing runs where members answer, and one does not (Kueue cleared its record on the eviction): not "waiting".
    cleared = assess(None, {"w1": False}, frozenset({"w2"}))
    assert cleared.state == MEMBER_LOST and cleared.message().startswith("w2 does not answer; a run there may go on")
    # Re-dispatched meanwhile and running in w1: the record (w1 once Kueue re-admits) decides; before that, stale.
    assert assess("w2", {"w1": True}, frozenset({"w2"})).state == RECORD_STALE
    assert assess("w1", {"w1": True}, frozenset({"w2"})).state == RUNNING


def test_the_annotation_changes_only_when_the_finding_does():
    finding = assess("w1", {"w1": False, "w2": True}, frozenset())
    written = finding.annotation("2026-11-30T18:00:00Z")
    assert json.loads(written) == {"state": RECORD_STALE, "runsIn": ["w2"], "kueueRecord": "w1", "unreachable": [], "blocked": {},
                                   "since": "2026-11-30T18:00:00Z"}
    assert not changed(written, finding)
    assert changed(written, assess("w2", {"w2": True}, frozenset()))
    assert changed(None, finding) and changed("not json", finding)


def _workload(*true: str) -> dict:
    return {"status": {"conditions": [{"type": kind, "status": "True"} for kind in true]}}


def test_an_eviction_kueue_cannot_finish_on_the_manager_is_recognised():
    """Kueue waits for the evicted job to stop; the manager's RayJob shows the member's last status (Running)
    forever. Only then: not before the eviction, not once the status says Suspended or New."""
    from failover.fleet import eviction_stuck

    running = {"spec": {"suspend": True}, "status": {"jobDeploymentStatus": "Running"}}
    assert eviction_stuck(_workload("Evicted", "QuotaReserved"), running)
    assert not eviction_stuck(_workload("QuotaReserved"), running)  # not evicted
    assert not eviction_stuck(_workload("Evicted"), running)  # the eviction finished: quota released
    assert not eviction_stuck(_workload("Evicted", "QuotaReserved"), {**running, "spec": {"suspend": False}})
    for inactive in ({"jobDeploymentStatus": "Suspended"}, {"jobDeploymentStatus": "New"}, {}):
        assert not eviction_stuck(_workload("Evicted", "QuotaReserved"), {**running, "status": inactive})


def test_a_member_that_cannot_admit_the_job_is_named_with_kueues_reason():
    from failover.fleet import MEMBER_CANNOT_ADMIT

    finding = assess(None, {"w1": False, "w2": False}, frozenset(), {"w1": "LocalQueue fleet-queue doesn't exist"})
    assert (finding.state, finding.blocked) == (MEMBER_CANNOT_ADMIT, (("w1", "LocalQueue fleet-queue doesn't exist"),))
    assert finding.message() == ("w1 cannot admit it: LocalQueue fleet-queue doesn't exist (run `pulumi up` on its "
                                 "stack); the other members still may")
    assert MEMBER_CANNOT_ADMIT in WARNINGS
    # Once it runs somewhere, that is what counts.
    assert assess("w2", {"w1": False, "w2": True}, frozenset(), {"w1": "..."}).state == RUNNING


def test_a_finished_job_is_finished_not_waiting():
    """Seen on the tier: after a normal finish the watch said "waits for a slice in every member"."""
    from failover.fleet import FINISHED

    finding = assess("w2", {"w1": False, "w2": False}, frozenset(), finished=True)
    assert finding.state == FINISHED and finding.message() == "finished (Kueue's record: w2)"


def test_a_run_where_members_answer_names_the_member_that_does_not():
    finding = assess("w1", {"w1": True}, frozenset({"w2"}))
    assert (finding.state, finding.message()) == (RUNNING, "runs in w1; w2 does not answer (a run there may go on)")
