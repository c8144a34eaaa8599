"""The lost-slice rules (failover/slices.py): pure functions of the job's TPU pods, the nodes and the loss recorded."""

from __future__ import annotations

import datetime
import json

import pytest

from failover import api, slices
from failover.regional import decisions
from failover.slices import GiveUpSlice, HostView, NodeView, RecordLoss, RecordRecovery, decide_loss, slice_loss
from failover.api import LostSlice

NOW = datetime.datetime(2026, 12, 2, 12, 0, tzinfo=datetime.timezone.utc)
WAIT = datetime.timedelta(minutes=2)


def ago(seconds: float) -> datetime.datetime:
    return NOW - datetime.timedelta(seconds=seconds)


def stamp(seconds: float) -> str:
    return api.format_time(ago(seconds))


def node(name: str, ready: bool = True, taints: tuple[dict, ...] = (), since: float = 600) -> dict:
    return {"metadata": {"name": name}, "spec": {"taints": list(taints)},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "Unknown",
                                       "lastTransitionTime": stamp(since)}]}}


def pod(name: str, on: str | None, ready: bool = True, since: float = 500, deleted: float | None = None,
        grace: int = 30) -> dict:
    meta: dict = {"name": name}
    if deleted is not None:  # the API server sets deletionTimestamp to the request's time plus the grace period
        meta["deletionTimestamp"] = api.format_time(ago(deleted) + datetime.timedelta(seconds=grace))
        meta["deletionGracePeriodSeconds"] = grace
    return {"metadata": meta, "spec": {"nodeName": on} if on else {},
            "status": {"phase": "Running" if on else "Pending",
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                       "lastTransitionTime": stamp(since)}]}}


def whole(hosts: int = 4) -> tuple[list[HostView], dict[str, NodeView]]:
    return ([HostView.from_object(pod(f"worker-{i}", f"node-{i}")) for i in range(hosts)],
            {f"node-{i}": NodeView.from_object(node(f"node-{i}")) for i in range(hosts)})


def test_a_whole_slice_is_no_loss():
    hosts, nodes = whole()
    assert slice_loss(4, hosts, nodes, {}, NOW) is None


@pytest.mark.parametrize("taint, why", [
    ("cloud.google.com/impending-node-termination", "received a termination notice"),
    ("ToBeDeletedByClusterAutoscaler", "is being removed by the autoscaler"),
    ("node.kubernetes.io/unreachable", "is unreachable"),
])
def test_a_host_tainted_as_going_is_a_loss_from_the_taint(taint, why):
    hosts, nodes = whole()
    nodes["node-2"] = NodeView.from_object(node("node-2", taints=({"key": taint, "effect": "NoSchedule",
                                                                   "timeAdded": stamp(7)},)))
    assert slice_loss(4, hosts, nodes, {}, NOW) == slices.Loss(ago(7), f"its host node-2 {why}")


def test_a_taint_without_its_time_counts_from_now():
    hosts, nodes = whole()
    nodes["node-0"] = NodeView.from_object(node("node-0", taints=({"key": "ToBeDeletedByClusterAutoscaler",
                                                                   "effect": "NoSchedule"},)))
    assert slice_loss(4, hosts, nodes, {}, NOW).at == NOW


def test_a_deleted_host_counts_from_its_deletion_and_the_earliest_signal_wins():
    hosts, nodes = whole()
    del nodes["node-1"]
    nodes["node-3"] = NodeView.from_object(node("node-3", ready=False, since=3))
    loss = slice_loss(4, hosts, nodes, {"node-1": ago(9)}, NOW)
    assert loss == slices.Loss(ago(9), "its host node-1 is gone")


def test_a_host_whose_node_was_never_seen_deleted_is_gone_from_now():
    hosts, nodes = whole()
    del nodes["node-1"]  # deleted while the controller was down
    assert slice_loss(4, hosts, nodes, {}, NOW) == slices.Loss(NOW, "its host node-1 is gone")


def test_a_pod_being_deleted_counts_from_the_request_not_from_its_grace_period():
    hosts, nodes = whole()
    hosts[0] = HostView.from_object(pod("worker-0", "node-0", deleted=4, grace=30))
    assert slice_loss(4, hosts, nodes, {}, NOW) == slices.Loss(ago(4), "its pod worker-0 is being deleted")


def test_missing_and_pending_pods_are_a_loss_and_more_ready_pods_than_needed_are_not():
    hosts, nodes = whole()
    assert slice_loss(4, hosts[:3], nodes, {}, NOW) == slices.Loss(NOW, "3 of its 4 TPU pods exist")
    pending = [*hosts[:3], HostView.from_object(pod("worker-9", None, ready=False, since=2))]
    assert slice_loss(4, pending, nodes, {}, NOW) == slices.Loss(ago(2), "its pod worker-9 is not ready")
    # KubeRay's replacement is up while the lost pod is still being deleted: whole.
    spare = [*hosts, HostView.from_object(pod("worker-old", "node-9", deleted=20))]
    assert slice_loss(4, spare, nodes, {}, NOW) is None


def test_a_node_without_a_ready_condition_yet_is_not_a_loss():
    hosts, nodes = whole()
    nodes["node-0"] = NodeView.from_object({"metadata": {"name": "node-0"}, "spec": {}, "status": {}})
    assert slice_loss(4, hosts, nodes, {}, NOW) is None


def test_a_loss_is_recorded_once_with_its_deadline_then_the_job_moves_at_the_deadline():
    loss = slices.Loss(ago(5), "its host node-1 is gone")
    running = ago(600)
    first = decide_loss("spot", running, None, loss, WAIT, NOW)
    assert first == RecordLoss(LostSlice("spot", stamp(5), "its host node-1 is gone", stamp(5 - 120)))
    recorded = first.lost
    # The replacement pods' own signals later do not move the recorded time.
    assert decide_loss("spot", running, recorded, slices.Loss(NOW, "its pod w is not ready"), WAIT, NOW) is None
    at_deadline = NOW + datetime.timedelta(seconds=115)
    assert decide_loss("spot", running, recorded, loss, WAIT, at_deadline) == GiveUpSlice(recorded)


def test_the_deadline_is_rounded_up_to_a_whole_second_so_the_wait_is_never_short():
    at = ago(5) + datetime.timedelta(milliseconds=300)
    recorded = decide_loss("spot", ago(600), None, slices.Loss(at, "x"), WAIT, NOW).lost
    assert (recorded.at, recorded.until) == (stamp(5), stamp(5 - 121))


def test_a_slice_whole_again_marks_the_loss_recovered_and_a_later_loss_starts_a_new_wait():
    recorded = LostSlice("on-demand", stamp(60), "its host node-1 is gone", stamp(-540))
    recovered = decide_loss("on-demand", ago(3600), recorded, None, WAIT, NOW)
    assert recovered == RecordRecovery(LostSlice("on-demand", stamp(60), "its host node-1 is gone", stamp(-540),
                                                 api.RECOVERED, stamp(0)))
    assert decide_loss("on-demand", ago(3600), recovered.lost, None, WAIT, NOW) is None
    again = decide_loss("on-demand", ago(3600), recovered.lost, slices.Loss(ago(1), "x"), WAIT, NOW)
    assert isinstance(again, RecordLoss) and again.lost.at == stamp(1)


def test_a_loss_of_an_earlier_admission_or_another_rung_does_not_count():
    old = LostSlice("on-demand", stamp(4000), "gone", stamp(3400))
    # Admitted again since (running for 10 minutes): the old record is not this admission's.
    assert decide_loss("on-demand", ago(600), old, None, WAIT, NOW) is None
    assert isinstance(decide_loss("dws", ago(6000), old, slices.Loss(ago(1), "x"), WAIT, NOW), RecordLoss)
    # Not running (never all ready this admission): nothing to lose.
    assert decide_loss("on-demand", None, None, slices.Loss(NOW, "x"), WAIT, NOW) is None
    # A loss signal older than the run (a node that went NotReady before the job ran) counts from the run's start.
    assert decide_loss("spot", ago(30), None, slices.Loss(ago(90), "x"), WAIT, NOW).lost.at == stamp(30)


def test_the_annotation_round_trips_and_a_bad_one_is_none():
    lost = LostSlice("spot", stamp(5), "its host node-1 received a termination notice", stamp(-115))
    assert LostSlice.from_json(lost.to_json()) == lost
    assert json.loads(lost.to_json())["state"] == api.LOST
    assert LostSlice.from_json("{not json") is None and LostSlice.from_json(None) is None
    assert slices.loss_message(lost) == (f"lost its slice on spot at {stamp(5)} (its host node-1 received a "
                                         f"termination notice); waiting for recovery until {stamp(-115)}")


CHAIN = api.Chain.from_json(json.dumps([
    {"flavor": "spot", "clusterQueue": "cluster-queue", "localQueue": "user-queue", "admissionCheck": False,
     "recoverySeconds": 120},
    {"flavor": "dws", "clusterQueue": "cluster-queue-dws", "localQueue": "user-queue-dws", "admissionCheck": True,
     "recoverySeconds": 600},
]))


def view(queue: str, flavor: str, origin: str | None = None) -> api.WorkloadView:
    return api.WorkloadView("w", "default", queue, True, True, True, ago(600), flavor, flavor, None, "job",
                            multikueue_origin=origin)


def test_after_a_loss_a_job_moves_to_the_next_rung_or_is_requeued_on_the_last():
    assert CHAIN.rungs[0].recovery_seconds == 120
    assert CHAIN.rungs[1].recovery_seconds == 600
    moved = decisions.move_after_loss(CHAIN, view("user-queue", "spot"), "spot", NOW).move
    assert (moved.from_flavor, moved.to_flavor, moved.to_local_queue, moved.reason, moved.requeue) == (
        "spot", "dws", "user-queue-dws", api.SLICE_LOST, False)
    requeued = decisions.move_after_loss(CHAIN, view("user-queue", "dws"), "dws", NOW).move
    assert (requeued.to_flavor, requeued.to_local_queue, requeued.requeue) == ("dws", "user-queue", True)
    assert decisions.move_message(requeued, "user-queue").startswith("requeued on dws (LocalQueue user-queue): it lost")
    assert decisions.move_after_loss(CHAIN, view("user-queue", "spot", origin="fleet"), "spot", NOW) is None
    # Moved down to the last rung's queue by the controller, it goes back to the queue it was submitted to: it starts
    # again anyway, and Kueue tries every rung from the top. Submitted there, it is requeued there.
    down = api.Move("spot", "dws", "user-queue-dws", api.STOCKOUT, api.format_time(ago(900)), api.MOVED,
                    from_local_queue="user-queue")
    back = decisions.move_after_loss(CHAIN, view("user-queue-dws", "dws"), "dws", NOW, (down,)).move
    assert (back.from_flavor, back.to_flavor, back.to_local_queue, back.from_local_queue, back.requeue) == (
        "dws", "spot", "user-queue", "user-queue-dws", False)
    assert decisions.move_after_loss(CHAIN, view("user-queue-dws", "dws"), "dws", NOW).move.requeue
    assert ("dws", "dws", api.SLICE_LOST) in decisions.possible_moves(CHAIN)
    assert ("spot", "dws", api.SLICE_LOST) in decisions.possible_moves(CHAIN)


def test_a_workload_says_how_many_tpu_hosts_it_needs_and_since_when_its_pods_are_ready():
    tpu = {"containers": [{"name": "ray-worker", "resources": {"requests": {"google.com/tpu": "4"}}}]}
    cpu = {"containers": [{"name": "ray-head", "resources": {"requests": {"cpu": "1"}}}]}
    obj = {"metadata": {"name": "w", "namespace": "default", "ownerReferences": [{"kind": "RayJob", "name": "j"}]},
           "spec": {"queueName": "user-queue", "podSets": [{"name": "head", "count": 1, "template": {"spec": cpu}},
                                                           {"name": "workers", "count": 4, "template": {"spec": tpu}}]},
           "status": {"conditions": [
               {"type": "QuotaReserved", "status": "True", "lastTransitionTime": stamp(100)},
               {"type": "Admitted", "status": "True", "lastTransitionTime": stamp(100)},
               {"type": "PodsReady", "status": "True", "lastTransitionTime": stamp(40)}]}}
    seen = api.WorkloadView.from_object(obj)
    assert (seen.tpu_hosts, seen.pods_ready_since) == (4, ago(40))
    obj["status"]["conditions"][2]["status"] = "False"
    assert api.WorkloadView.from_object(obj).pods_ready_since is None
