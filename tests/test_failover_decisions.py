"""The failover controller's decisions: pure functions of a Workload, its RayJob and the autoscaler's events."""

from __future__ import annotations

import datetime
import json

import pytest

from failover import api
from failover.api import FinishMove, Move, StartMove, WorkloadView, stockout_since
from failover.regional import decisions
from failover.regional.decisions import RecordFlavor, decide

CHAIN = api.Chain.from_json(json.dumps([
    {"flavor": "on-demand", "clusterQueue": "cluster-queue", "localQueue": "user-queue", "admissionCheck": False,
     "recoverySeconds": 600},
    {"flavor": "dws", "clusterQueue": "cluster-queue-dws", "localQueue": "user-queue-dws", "admissionCheck": True,
     "recoverySeconds": 120},
]))
NOW = datetime.datetime(2026, 11, 30, 12, 0, tzinfo=datetime.timezone.utc)
GRACE = datetime.timedelta(minutes=3)


def _time(minutes_ago: float) -> str:
    return api.format_time(NOW - datetime.timedelta(minutes=minutes_ago))


def workload(queue="user-queue", reserved_on=None, admitted=None, evicted=None, recorded=None, active=True,
             owner="job-1") -> dict:
    """A Workload as the API returns it: reserved_on is the TPU pod set's flavor while quota is reserved."""
    conditions = []
    if reserved_on:
        conditions.append({"type": "QuotaReserved", "status": "True", "lastTransitionTime": _time(10)})
        conditions.append({"type": "Admitted", "status": "True" if admitted is not False else "False",
                           "lastTransitionTime": _time(10)})
    else:
        conditions.append({"type": "QuotaReserved", "status": "False", "reason": "Pending",
                           "lastTransitionTime": _time(1)})
    if evicted:
        conditions.append({"type": "Evicted", "status": "True", "reason": evicted, "lastTransitionTime": _time(1)})
    status: dict = {"conditions": conditions}
    if reserved_on:
        status["admission"] = {"clusterQueue": "cluster-queue", "podSetAssignments": [
            {"name": "head", "flavors": {"cpu": "default-cpu", "memory": "default-cpu"}},
            {"name": "tpu-group", "flavors": {"cpu": reserved_on, "google.com/tpu": reserved_on}}]}
    meta: dict = {"name": "rayjob-job-1-abcde", "namespace": "default"}
    if owner:
        meta["ownerReferences"] = [{"kind": "RayJob", "name": owner, "apiVersion": "ray.io/v1", "uid": "u"}]
    if recorded:
        meta["annotations"] = {api.ADMITTED_FLAVOR_ANNOTATION: recorded}
    return {"metadata": meta, "spec": {"queueName": queue, "active": active}, "status": status}


def _decide(obj: dict, failover: str | None = None, stockout: datetime.datetime | None = None):
    view = WorkloadView.from_object(obj)
    return decide(CHAIN, view, failover, stockout, GRACE, NOW)


def test_a_fleet_managers_copy_is_left_alone():
    """A MultiKueue copy: a spec change makes the manager delete and recreate it, and its eviction re-dispatches
    the job to every member; so no move, not even a recorded flavor, though the same Workload without the label
    would be moved."""
    timed_out = workload(evicted="PodsReadyTimeout", recorded="on-demand")
    assert isinstance(_decide(timed_out), StartMove)
    for obj in (timed_out, workload(reserved_on="on-demand")):
        obj["metadata"]["labels"] = {api.MULTIKUEUE_ORIGIN_LABEL: "tpu-fallback-fleet"}
        assert WorkloadView.from_object(obj).multikueue_origin == "tpu-fallback-fleet"
        assert _decide(obj) is None
        assert _decide(obj, stockout=NOW - datetime.timedelta(hours=1)) is None


def test_an_admission_is_written_down_once():
    assert _decide(workload(reserved_on="on-demand")) == RecordFlavor("on-demand")
    assert _decide(workload(reserved_on="on-demand", recorded="on-demand")) is None


def test_timeout_on_plan_a_moves_to_the_queue_that_starts_at_plan_b():
    action = _decide(workload(evicted="PodsReadyTimeout", recorded="on-demand"))
    assert isinstance(action, StartMove)
    assert (action.move.from_flavor, action.move.to_flavor, action.move.to_local_queue, action.move.reason) == (
        "on-demand", "dws", "user-queue-dws", "PodsReadyTimeout")
    assert action.move.at == api.format_time(NOW)


def test_timeout_without_a_record_assumes_the_queues_first_rung():
    assert isinstance(_decide(workload(evicted="PodsReadyTimeout")), StartMove)


@pytest.mark.parametrize("case", [
    # Already on the last rung: there is nowhere further down.
    dict(queue="user-queue", evicted="PodsReadyTimeout", recorded="dws"),
    # Already moved: the Workload sits in the dws queue, Evicted stays True until it is admitted again.
    dict(queue="user-queue-dws", evicted="PodsReadyTimeout", recorded="on-demand"),
    # Another eviction reason (preemption, deactivation) is not a stockout.
    dict(evicted="Preempted", recorded="on-demand"),
    dict(evicted="InactiveWorkload", recorded="on-demand"),
    # A queue outside the chain, and a Workload not owned by a RayJob.
    dict(queue="someone-elses-queue", evicted="PodsReadyTimeout", recorded="on-demand"),
    dict(owner=None, evicted="PodsReadyTimeout", recorded="on-demand"),
])
def test_no_move(case):
    assert _decide(workload(**case)) is None


def test_never_moves_up_the_chain():
    # Admitted (somehow) on on-demand from the dws queue, then timed out: the target would be dws again.
    assert _decide(workload(queue="user-queue-dws", evicted="PodsReadyTimeout", recorded="on-demand")) is None


def test_stockout_reported_longer_than_the_grace_period_moves_early():
    since = NOW - GRACE - datetime.timedelta(seconds=1)
    action = _decide(workload(reserved_on="on-demand", recorded="on-demand"), stockout=since)
    assert isinstance(action, StartMove) and action.move.reason == "Stockout" and action.move.to_flavor == "dws"


def test_stockout_within_the_grace_period_waits():
    since = NOW - GRACE + datetime.timedelta(seconds=1)
    assert _decide(workload(reserved_on="on-demand", recorded="on-demand"), stockout=since) is None


def test_a_job_whose_pods_became_ready_after_the_stockout_report_is_not_moved():
    # GCE's capacity came back within the grace: the pods the autoscaler reported got their slice, and the job runs
    # (Kueue's PodsReady). The report on those same pods is history now, not a stockout (seen on the goodput bench: a
    # job moved away from on-demand 2 min after it started running there).
    since = NOW - GRACE - datetime.timedelta(minutes=1)
    running = workload(reserved_on="on-demand", recorded="on-demand")
    running["status"]["conditions"].append({"type": "PodsReady", "status": "True", "reason": "PodsReady",
                                            "lastTransitionTime": _time(2)})
    assert _decide(running, stockout=since) is None


def test_no_early_move_on_a_rung_with_an_admission_check():
    # DWS admits only once capacity is provisioned; its pods waiting is not a stockout signal.
    since = NOW - datetime.timedelta(hours=1)
    assert _decide(workload(reserved_on="dws", recorded="dws"), stockout=since) is None


def test_a_move_in_progress_is_finished_before_anything_else():
    pending = Move("on-demand", "dws", "user-queue-dws", "PodsReadyTimeout", _time(1))
    action = _decide(workload(reserved_on="on-demand"), failover=pending.to_json())
    assert action == FinishMove(pending)
    assert _decide(workload(queue="user-queue-dws"), failover=pending.done().to_json()) is None


def test_move_round_trips_through_its_annotation():
    move = Move("on-demand", "dws", "user-queue-dws", "Stockout", _time(0))
    assert Move.from_json(move.to_json()) == move
    assert Move.from_json("not json") is None and Move.from_json(None) is None


def _event(reason: str, message: str, pod: str, first: float, last: float, kind: str = "Pod") -> dict:
    return {"reason": reason, "message": message, "involvedObject": {"kind": kind, "name": pod},
            "firstTimestamp": _time(first), "lastTimestamp": _time(last)}


STOCKOUT_MESSAGE = ("Node scale up in zones us-east5-b associated with this pod failed: GCE out of resources. "
                    "Pod is at risk of not being scheduled.")


def test_stockout_since_reads_the_autoscalers_capacity_failures_on_the_jobs_tpu_pods():
    admitted = NOW - datetime.timedelta(minutes=10)
    events = [
        _event("FailedScaleUp", STOCKOUT_MESSAGE, "worker-0", first=8, last=1),
        _event("FailedScaleUp", STOCKOUT_MESSAGE, "worker-1", first=6, last=1),
        _event("FailedScaleUp", STOCKOUT_MESSAGE, "someone-else", first=9, last=1),  # not our pod
        _event("FailedScaleUp", "Node scale up ... failed: GCE quota exceeded.", "worker-0", first=9, last=1),
        _event("TriggeredScaleUp", "pod triggered scale-up", "worker-0", first=9, last=9),
        _event("FailedScaleUp", STOCKOUT_MESSAGE, "worker-0", first=30, last=20),  # before this admission
    ]
    assert stockout_since(events, {"worker-0", "worker-1"}, admitted) == NOW - datetime.timedelta(minutes=8)
    assert stockout_since(events, {"worker-9"}, admitted) is None


def test_a_stockout_seen_before_admission_counts_from_admission():
    admitted = NOW - datetime.timedelta(minutes=2)
    events = [_event("NotTriggerScaleUp", "ZONE_RESOURCE_POOL_EXHAUSTED in us-east5-b", "worker-0", first=30, last=0)]
    assert stockout_since(events, {"worker-0"}, admitted) == admitted


def test_move_message_says_why():
    move = Move("on-demand", "dws", "user-queue-dws", "PodsReadyTimeout", _time(0))
    assert decisions.move_message(move, "user-queue") == (
        "moved from on-demand to dws (LocalQueue user-queue -> user-queue-dws): its pods were not ready within "
        "Kueue's waitForPodsReady timeout")


# ---- what a change says for the metrics ----------------------------------------------------------------------------
def _with_checks(obj: dict, **states: str) -> dict:
    obj["status"]["admissionChecks"] = [{"name": name, "state": state, "lastTransitionTime": _time(0)}
                                        for name, state in states.items()]
    return obj


def test_the_wait_for_quota_is_observed_when_quota_is_reserved():
    pending = WorkloadView.from_object(workload())  # pending since one minute ago
    admitted = WorkloadView.from_object(workload(reserved_on="on-demand"))
    admitted = WorkloadView(**{**admitted.__dict__, "admitted_at": NOW})
    assert decisions.observations(pending, admitted) == [decisions.AdmissionWait("on-demand", 60.0)]


def test_a_workload_first_seen_admitted_or_unchanged_adds_nothing():
    admitted = WorkloadView.from_object(workload(reserved_on="on-demand"))
    assert decisions.observations(None, admitted) == []  # a restart: seen, not happened
    assert decisions.observations(admitted, admitted) == []
    pending = WorkloadView.from_object(workload())
    assert decisions.observations(pending, pending) == []


def test_admission_check_results_are_counted_once_per_change():
    waiting = WorkloadView.from_object(_with_checks(workload(queue="user-queue-dws"), dws="Pending"))
    ready = WorkloadView.from_object(_with_checks(workload(queue="user-queue-dws"), dws="Ready"))
    retry = WorkloadView.from_object(_with_checks(workload(queue="user-queue-dws"), dws="Retry"))
    assert decisions.observations(waiting, ready) == [decisions.CheckOutcome("dws", "Ready")]
    assert decisions.observations(ready, ready) == []
    assert decisions.observations(waiting, retry) == [decisions.CheckOutcome("dws", "Retry")]
    assert decisions.observations(retry, waiting) == []  # back to Pending is no result


# ---- the move history on the RayJob --------------------------------------------------------------------------------
def test_the_history_keeps_every_completed_move_once_oldest_first():
    first = Move("reservation", "on-demand", "user-queue-on-demand", "PodsReadyTimeout", _time(5))
    second = Move("on-demand", "dws", "user-queue-dws", "Stockout", _time(1))
    annotations = {api.MOVES_ANNOTATION: api.with_move_recorded({}, first)}
    annotations[api.MOVES_ANNOTATION] = api.with_move_recorded(annotations, second)
    again = api.with_move_recorded(annotations, second)  # a restart marking the same move done
    assert again == annotations[api.MOVES_ANNOTATION]
    assert api.move_history(annotations) == [first.done(), second.done()]


def test_an_unreadable_history_reads_as_empty():
    assert api.move_history({api.MOVES_ANNOTATION: "not json"}) == []
    assert api.move_history({api.MOVES_ANNOTATION: '[{"from": "x"}, 3]'}) == []
    assert api.move_history(None) == []



def test_a_preempted_job_is_never_moved():
    # Another team reclaimed its share: the Workload is Evicted with reason Preempted (InCohortReclamation). Its
    # capacity exists; it goes back to its own queue, never down the chain.
    for preempted in (workload(evicted="Preempted", recorded="on-demand"),
                      workload(evicted="Preempted"),
                      workload(reserved_on="on-demand", recorded="on-demand", evicted="Preempted")):
        assert _decide(preempted) is None
    # The same Workload evicted for its pods' timeout is moved: the reason alone decides.
    assert isinstance(_decide(workload(evicted="PodsReadyTimeout", recorded="on-demand")), StartMove)


def test_a_job_being_preempted_is_not_moved_early_even_with_stockout_events():
    # Kueue marks Evicted=Preempted while the admission is still there (cleared a moment later); the autoscaler's
    # stockout events for its pods must not turn the preemption into a move.
    since = NOW - GRACE - datetime.timedelta(minutes=1)
    being_preempted = workload(reserved_on="on-demand", recorded="on-demand", evicted="Preempted")
    assert _decide(being_preempted, stockout=since) is None
    admitted = workload(reserved_on="on-demand", recorded="on-demand")
    assert isinstance(_decide(admitted, stockout=since), StartMove)  # the same job, not being preempted: moved


def test_every_move_decide_can_start_is_declared_at_zero_when_the_controller_starts():
    """Issue 27: a labelled counter born at 1 by its first move hides that move from increase() and from Managed
    Prometheus (which drops a counter's first sample); the controller declares every series it can count at 0."""
    from prometheus_client import CollectorRegistry

    from failover.runtime.metrics import Metrics

    flavors = [rung.flavor for rung in CHAIN.rungs]
    assert decisions.possible_moves(CHAIN) == [
        *((upper, lower, reason) for upper, lower in zip(flavors, flavors[1:])
          for reason in (api.PODS_READY_TIMEOUT, api.STOCKOUT, api.SLICE_LOST)),
        *((flavors[-1], upper, api.SLICE_LOST) for upper in flavors[:-1]),  # a loss on the last rung: back up
        (flavors[-1], flavors[-1], api.SLICE_LOST)]  # or the last rung's requeue
    metrics = Metrics(CollectorRegistry())
    metrics.declare_moves(decisions.possible_moves(CHAIN))
    for upper, lower, reason in decisions.possible_moves(CHAIN):
        assert metrics.registry.get_sample_value("tpu_fallback_moves_total", {
            "from_flavor": upper, "to_flavor": lower, "reason": reason}) == 0


# ---- a move, one step at a time -------------------------------------------------------------------------------


def _job(label: str, suspended: bool) -> dict:
    return {"metadata": {"name": "job-1", "labels": {api.QUEUE_LABEL: label}}, "spec": {"suspend": suspended}}


def test_a_move_takes_its_steps_in_order_and_resumes_from_what_it_reads():
    """Deactivate, wait until Kueue has released the quota and suspended the job, relabel, repoint, reactivate;
    from any point, the step left to do (the controller re-reads both objects after each)."""
    move = Move("on-demand", "dws", "user-queue-dws", api.PODS_READY_TIMEOUT, _time(0))
    step = lambda obj, job: decisions.next_in_move(move, WorkloadView.from_object(obj), job)  # noqa: E731
    admitted = workload(reserved_on="on-demand")
    assert step(admitted, _job("user-queue", False)) == decisions.DEACTIVATE
    held = workload(reserved_on="on-demand", active=False)
    assert step(held, _job("user-queue", False)) == decisions.WAIT_FOR_RELEASE
    released = workload(active=False)
    assert step(released, _job("user-queue", False)) == decisions.WAIT_FOR_RELEASE  # not suspended yet
    assert step(released, _job("user-queue", True)) == decisions.RELABEL
    assert step(released, _job("user-queue-dws", True)) == decisions.REPOINT
    repointed = workload(queue="user-queue-dws", active=False)
    assert step(repointed, _job("user-queue-dws", True)) == api.REACTIVATE
    # Kueue clears an inactive Workload's requeue backoff; reactivated before it did, the job waited the backoff out
    # at the new rung (a loaded run: its clearing write lost to the move's writes). So the move waits for it.
    backing_off = {**repointed, "status": {**repointed["status"], "requeueState": {
        "count": 1, "requeueAt": "2026-12-01T12:01:00Z"}}}
    assert step(backing_off, _job("user-queue-dws", True)) == api.WAIT_FOR_BACKOFF_RESET
    arrived = workload(queue="user-queue-dws")
    assert step(arrived, _job("user-queue-dws", True)) == decisions.DONE
    # Repointed by hand (or a lost label write) while active at the new queue: relabelled once released.
    assert step(workload(queue="user-queue-dws", active=False), _job("user-queue", True)) == decisions.RELABEL


def test_a_requeue_on_the_last_rung_leaves_the_admission_that_lost_its_slice_and_comes_back_active():
    """No next rung: the Workload is deactivated off the admission that lost its slice (admitted before the move),
    waits for the release, and is reactivated where it was; a new admission after the move is the end."""
    move = Move("dws", "dws", "user-queue-dws", api.SLICE_LOST, _time(5))  # decided 5 min ago
    assert move.requeue
    step = lambda obj, job: decisions.next_in_move(move, WorkloadView.from_object(obj), job)  # noqa: E731
    lost = workload(queue="user-queue-dws", reserved_on="dws")  # admitted 10 min ago: the old admission
    assert step(lost, _job("user-queue-dws", False)) == decisions.DEACTIVATE
    assert step(workload(queue="user-queue-dws", reserved_on="dws", active=False),
                _job("user-queue-dws", False)) == decisions.WAIT_FOR_RELEASE
    assert step(workload(queue="user-queue-dws", active=False), _job("user-queue-dws", True)) == api.REACTIVATE
    backing_off = workload(queue="user-queue-dws", active=False)
    backing_off["status"]["requeueState"] = {"count": 1}
    assert step(backing_off, _job("user-queue-dws", True)) == api.WAIT_FOR_BACKOFF_RESET
    assert step(workload(queue="user-queue-dws"), _job("user-queue-dws", True)) == decisions.DONE  # queued again
    readmitted = workload(queue="user-queue-dws", reserved_on="dws")
    readmitted["status"]["conditions"][0]["lastTransitionTime"] = _time(1)  # after the move
    assert step(readmitted, _job("user-queue-dws", False)) == decisions.DONE


def test_a_move_names_the_queue_it_left_in_its_record_even_when_finished_by_a_later_pass():
    """A pass that finishes a move an earlier one started (Kueue released the quota after the first pass's wait) sees
    the Workload repointed already: the queue it left comes from the move itself (seen on a loaded run: "LocalQueue ?
    -> user-queue-dws"). An older record without it still reads."""
    action = _decide(workload(evicted="PodsReadyTimeout", recorded="on-demand"))
    assert isinstance(action, StartMove) and action.move.from_local_queue == "user-queue"
    done = Move.from_json(action.move.done().to_json())
    assert done.from_local_queue == "user-queue" and done.state == api.MOVED
    older = json.loads(action.move.to_json())
    del older["fromLocalQueue"]
    assert Move.from_json(json.dumps(older)).from_local_queue == ""
