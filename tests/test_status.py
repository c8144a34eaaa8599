"""`python -m ops status` as pure functions: object dicts in, a report out, rendered as a table or JSON.

The queue objects are the program's own (the recorded plan of each stack); Workloads, RayJobs, ProvisioningRequests
and Events are written the way Kueue 0.19.2, KubeRay, GKE and the controller write them (conditions and reasons as
measured on the real tier: ../shared/notes/kueue-stockout.md, tests/test_status_controlplane.py).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import io
import json
from collections.abc import Callable

import pytest
import yaml

from failover import api
from failover.api import (ADMITTED_FLAVOR_ANNOTATION, FAILOVER_ANNOTATION, FLEET_ANNOTATION, MOVES_ANNOTATION,
                          MOVE_EVENT_REASON, PODS_READY_TIMEOUT, QUEUE_LABEL, SLICE_LOST, STOCKOUT, TPU_RESOURCE, Move,
                          format_time, with_move_recorded)
from infra import failover as stack_failover
from infra import kueue as stack_kueue
from ops.status import cli, health, jobs, render
from ops.status.ladder import (CHAIN_ENV, FROM_CLUSTER_QUEUES, FROM_CONTROLLER, FROM_LOCAL_QUEUES, build_ladder,
                               chain_of_controller)
from ops.status.ladder import UNKNOWN as FROM_UNKNOWN
from ops.status.render import duration, render_json, render_table, report_dict
from ops.status.report import Snapshot, build_report
from ops.status.snapshot import ClusterError
from infra.rungs import RUNG_KINDS
from tests.conftest import SHIPPED_STACKS, plan_for

NOW = datetime.datetime(2026, 11, 30, 12, 0, 0, tzinfo=datetime.timezone.utc)
NAMESPACE = "default"
LADDER = {"reservation": {"reservations": [{"name": "team-a-v6e", "slices": 1}]}, "spot": {"maxSlices": 1},
          "flexStart": {"maxSlices": 2}, "workloads": {"jobs": 0}}
SIXTEEN_CHIPS = 16  # the dev stack's slice: v6e 4x4


def ago(seconds: float) -> str:
    return format_time(NOW - datetime.timedelta(seconds=seconds))


# ---- objects as the cluster returns them ----------------------------------------------------------------------------
def plan_objects(stack: str = "dev", overrides: dict | None = None) -> dict[str, list[dict]]:
    """The stack's Kubernetes objects by kind, as `pulumi up` creates them; "Deployment" is only the failover
    controller's (monitoring adds the scrape token's renewer, which ops status does not read)."""
    by_kind: dict[str, list[dict]] = {}
    for manifest in plan_for(stack, overrides).kubernetes_manifests():
        if manifest["kind"] != "Deployment" or manifest["metadata"]["name"] == stack_failover.NAME:
            by_kind.setdefault(manifest["kind"], []).append(copy.deepcopy(manifest))
    return by_kind


def condition(kind: str, status: bool, reason: str, seconds_ago: float = 0, message: str = "") -> dict:
    return {"type": kind, "status": "True" if status else "False", "reason": reason, "message": message,
            "lastTransitionTime": ago(seconds_ago)}


def rayjob(name: str, queue: str | None = "user-queue", annotations: dict | None = None,
           namespace: str = NAMESPACE, created: float = 600) -> dict:
    labels = {QUEUE_LABEL: queue} if queue else {}
    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}",
                         "creationTimestamp": ago(created), "labels": labels, "annotations": annotations or {}},
            "spec": {"suspend": True}}


def workload(job: dict, conditions: list[dict], flavor: str | None = None, queue: str | None = None,
             active: bool = True, checks: list[dict] | None = None, annotations: dict | None = None,
             requeue_at: float | None = None, created: float = 590, cluster_queue: str = "cluster-queue") -> dict:
    meta = job["metadata"]
    status: dict = {"conditions": conditions}
    if flavor:
        status["admission"] = {"clusterQueue": cluster_queue, "podSetAssignments": [
            {"name": "head", "flavors": {"cpu": "default-cpu", "memory": "default-cpu"}, "count": 1},
            {"name": "tpu-group", "flavors": {"cpu": flavor, "memory": flavor, TPU_RESOURCE: flavor}, "count": 4}]}
    if checks is not None:
        status["admissionChecks"] = checks
    if requeue_at is not None:
        status["requeueState"] = {"count": 1, "requeueAt": ago(-requeue_at)}
    return {"apiVersion": stack_kueue.KUEUE_API_VERSION, "kind": "Workload",
            "metadata": {"name": f"rayjob-{meta['name']}-a1b2c", "namespace": meta["namespace"],
                         "uid": f"wl-{meta['uid']}", "creationTimestamp": ago(created),
                         "annotations": annotations or {},
                         "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayJob", "name": meta["name"],
                                              "uid": meta["uid"], "controller": True}]},
            "spec": {"queueName": queue or meta["labels"].get(QUEUE_LABEL, ""), "active": active},
            "status": status}


def provisioning_request(owner: dict, conditions: list[dict], attempt: int = 1, created: float = 60,
                         provisioning_class: str = stack_kueue.PROVISIONING_CLASS) -> dict:
    meta = owner["metadata"]
    return {"apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
            "metadata": {"name": f"{meta['name']}-{stack_kueue.ADMISSION_CHECK}-{attempt}",
                         "namespace": meta["namespace"], "creationTimestamp": ago(created),
                         "ownerReferences": [{"kind": "Workload", "name": meta["name"], "uid": meta["uid"]}]},
            "spec": {"provisioningClassName": provisioning_class, "podSets": []},
            "status": {"conditions": conditions}}


# Kueue's conditions per state, as the tier showed them.
def pending(seconds_ago: float = 30, message: str = "couldn't assign flavors to pod set tpu-group: insufficient "
                                                     "unused quota for google.com/tpu in flavor dws, 16 more needed"):
    return [condition("QuotaReserved", False, "Pending", seconds_ago, message)]


def reserved(seconds_ago: float = 50) -> list[dict]:
    return [condition("QuotaReserved", True, "QuotaReserved", seconds_ago),
            condition("Admitted", False, "NoChecks", seconds_ago)]


def admitted(seconds_ago: float = 40, pods_ready: float | None = None) -> list[dict]:
    found = [condition("QuotaReserved", True, "QuotaReserved", seconds_ago),
             condition("Admitted", True, "Admitted", seconds_ago)]
    if pods_ready is None:
        return found + [condition("PodsReady", False, "WaitForStart", seconds_ago)]
    return found + [condition("PodsReady", True, "Started", pods_ready)]


def evicted(reason: str, seconds_ago: float = 20, requeued: float | None = None) -> list[dict]:
    found = [condition("QuotaReserved", False, "Pending", seconds_ago),
             condition("Admitted", False, "NoReservation", seconds_ago),
             condition("Evicted", True, reason, seconds_ago, "Exceeded the PodsReady timeout default/x"
                       if reason == PODS_READY_TIMEOUT else "The workload is deactivated")]
    if requeued is None:
        return found + [condition("Requeued", False, reason, seconds_ago)]
    return found + [condition("Requeued", True, "BackoffFinished", requeued)]


def snapshot(**objects) -> Snapshot:
    return Snapshot(now=NOW, namespace=NAMESPACE, context="tier", **objects)


def dev_snapshot(**objects) -> Snapshot:
    found = plan_objects()
    base = dict(cluster_queues=found["ClusterQueue"], resource_flavors=found["ResourceFlavor"],
                admission_checks=active(found["AdmissionCheck"]), local_queues=found["LocalQueue"],
                controller=found["Deployment"][0])
    return snapshot(**{**base, **objects})


def active(objects: list[dict]) -> list[dict]:
    for obj in objects:
        obj["status"] = {"conditions": [condition("Active", True, "Active")]}
    return objects


def one_job(job: dict, *others: dict, **objects) -> jobs.JobView:
    report = build_report(dev_snapshot(rayjobs=[job], workloads=list(others), **objects))
    (view,) = report.jobs
    return view


# ---- the ladder -----------------------------------------------------------------------------------------------------
def rung_tuples(ladder) -> list[tuple]:
    return [(r.flavor, r.entry_queue, r.local_queue, r.admission_check is not None) for r in ladder.rungs]


@pytest.mark.parametrize("stack, overrides", [*((s, None) for s in SHIPPED_STACKS), ("dev", LADDER)],
                         ids=[*SHIPPED_STACKS, "ladder"])
def test_the_ladder_read_from_the_queues_is_the_controllers_chain(stack, overrides):
    found = plan_objects(stack, overrides)
    deployments = found.get("Deployment", [])
    cohorts = found.get("Cohort", [])
    from_queues = build_ladder(found["ClusterQueue"], found["ResourceFlavor"], found.get("AdmissionCheck", []),
                               found["LocalQueue"], None, cohorts)
    assert from_queues.source == FROM_CLUSTER_QUEUES
    if deployments:
        from_controller = build_ladder(found["ClusterQueue"], found["ResourceFlavor"], found["AdmissionCheck"],
                                       found["LocalQueue"], deployments[0], cohorts)
        assert from_controller.source == FROM_CONTROLLER
        expected = [(r.flavor, r.cluster_queue, r.local_queue, r.admission_check)
                    for r in chain_of_controller(deployments[0]).rungs]
        assert rung_tuples(from_queues) == rung_tuples(from_controller) == expected
    else:  # one rung: no controller, and the seed's names
        assert rung_tuples(from_queues) == [(from_queues.rungs[0].flavor, stack_kueue.CLUSTER_QUEUE,
                                             stack_kueue.LOCAL_QUEUE, from_queues.rungs[0].flavor == "dws")]
    # Every rung shows the whole capacity behind it, wherever its quota lives.
    chips = plan_for(stack, overrides).outputs["tpuChips"]
    by_flavor = {kind.flavor: chips[key] for key, kind in RUNG_KINDS.items() if key in chips}
    assert {r.flavor: r.quota_of().nominal for r in from_queues.rungs} == by_flavor
    if not cohorts:  # one team: each flavor's quota lives in the queue that starts at it (infra.kueue)
        assert all(r.cluster_queue == r.entry_queue for r in from_queues.rungs)
    else:  # several teams: shares on the teams' queues, the rest on the root Cohort (infra/teams.py)
        assert all(r.cluster_queue for r in from_queues.rungs)


def test_the_ladder_has_four_rungs_in_the_configured_order():
    found = plan_objects("dev", {**LADDER, "rungOrder": ["spot", "reservation", "onDemand", "flexStart"]})
    ladder = build_ladder(found["ClusterQueue"], found["ResourceFlavor"], found["AdmissionCheck"],
                          found["LocalQueue"], None)
    assert [r.flavor for r in ladder.rungs] == ["spot", "reservation", "on-demand", "dws"]
    assert [r.local_queue for r in ladder.rungs] == ["user-queue", "user-queue-reservation", "user-queue-on-demand",
                                                     "user-queue-dws"]
    assert [r.admission_check for r in ladder.rungs] == [None, None, None, stack_kueue.ADMISSION_CHECK]
    tpu = [r.quota_of(TPU_RESOURCE).nominal for r in ladder.rungs]
    assert tpu == [SIXTEEN_CHIPS, SIXTEEN_CHIPS, SIXTEEN_CHIPS, 2 * SIXTEEN_CHIPS]


def usage(flavor: str, total: str, borrowed: str = "0") -> dict:
    return {"name": flavor, "resources": [{"name": TPU_RESOURCE, "total": total, "borrowed": borrowed}]}


def test_quota_is_summed_over_the_queues_that_use_a_flavor():
    found = plan_objects()
    queues = {q["metadata"]["name"]: q for q in found["ClusterQueue"]}
    # Job 1 on on-demand in cluster-queue; job 2 borrowed dws from cluster-queue-dws, waiting for its slice (reserved,
    # not admitted); job 3 admitted on dws in cluster-queue-dws (a slice of its own would exceed: dev has one).
    queues["cluster-queue"]["status"] = {
        "flavorsReservation": [usage("on-demand", "16"), usage("dws", "16", borrowed="16")],
        "flavorsUsage": [usage("on-demand", "16"), usage("dws", "0")]}
    queues["cluster-queue-dws"]["status"] = {"flavorsReservation": [usage("dws", "0")],
                                             "flavorsUsage": [usage("dws", "0")]}
    ladder = build_ladder(list(queues.values()), found["ResourceFlavor"], found["AdmissionCheck"],
                          found["LocalQueue"], None)
    on_demand, dws = (r.quota_of(TPU_RESOURCE) for r in ladder.rungs)
    assert (on_demand.nominal, on_demand.reserved, on_demand.used, on_demand.borrowed) == (16, 16, 16, 0)
    assert (dws.nominal, dws.reserved, dws.used, dws.borrowed) == (16, 16, 0, 16)
    assert ladder.rungs[1].cluster_queue == "cluster-queue-dws"  # holds it, although cluster-queue lists it first
    cpu = ladder.rungs[0].quota_of("cpu")
    assert cpu is not None and cpu.nominal > 0 and cpu.reserved == 0


def test_several_unrelated_queues_each_give_their_rungs():
    """Two teams' queues, no chain names and no controller: every flavor with TPU quota is a rung, held where its
    quota is."""
    found = plan_objects()
    queues = {q["metadata"]["name"]: q for q in found["ClusterQueue"]}
    team_a, team_b = copy.deepcopy(queues["cluster-queue"]), copy.deepcopy(queues["cluster-queue-dws"])
    team_a["metadata"]["name"], team_b["metadata"]["name"] = "team-a", "team-b"
    for queue, keep in ((team_a, "on-demand"), (team_b, "dws")):
        group = queue["spec"]["resourceGroups"][0]
        group["flavors"] = [f for f in group["flavors"] if f["name"] in ("default-cpu", keep)]
    local = [{"metadata": {"name": "a", "namespace": "team-a"}, "spec": {"clusterQueue": "team-a"}}]
    ladder = build_ladder([team_b, team_a], found["ResourceFlavor"], [], local, None)
    assert [(r.flavor, r.cluster_queue, r.entry_queue, r.local_queue) for r in ladder.rungs] == [
        ("on-demand", "team-a", "team-a", "a"), ("dws", "team-b", "team-b", None)]
    assert ladder.rungs[1].check_active is False  # named by team-b, but no AdmissionCheck object: inactive


def test_a_missing_flavor_and_an_unreadable_chain_are_shown_not_hidden():
    found = plan_objects()
    deployment = found["Deployment"][0]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    for item in container["env"]:
        if item["name"] == CHAIN_ENV:
            item["value"] = "not json"
    flavors = [f for f in found["ResourceFlavor"] if f["metadata"]["name"] != "dws"]
    ladder = build_ladder(found["ClusterQueue"], flavors, active(found["AdmissionCheck"]), found["LocalQueue"],
                          deployment)
    assert ladder.source == FROM_CLUSTER_QUEUES
    assert [(r.flavor, r.flavor_exists, r.check_active) for r in ladder.rungs] == [
        ("on-demand", True, None), ("dws", False, True)]


# ---- one job, every state -------------------------------------------------------------------------------------------
def test_a_job_without_a_queue_label_is_not_queued():
    view = one_job(rayjob("loose", queue=None))
    assert (view.state, view.workload, view.rung) == (jobs.NOT_QUEUED, None, None)
    assert view.since == NOW - datetime.timedelta(seconds=600)


def test_a_job_kueue_has_not_seen_yet():
    view = one_job(rayjob("fresh", created=2))
    assert (view.state, view.rung, view.cluster_queue) == (jobs.NO_WORKLOAD, "on-demand", "cluster-queue")


def test_waiting_for_quota_says_kueues_reason_and_since_when():
    job = rayjob("waits", queue="user-queue-dws")
    view = one_job(job, workload(job, pending(45)))
    assert (view.state, view.words, view.rung, view.cluster_queue) == (
        jobs.WAITING_FOR_QUOTA, "waiting for quota", "dws", "cluster-queue-dws")
    assert "insufficient unused quota for google.com/tpu in flavor dws" in view.detail
    assert view.since == NOW - datetime.timedelta(seconds=45)


@pytest.mark.parametrize("conditions, state, words", [
    ([], "Pending", "created, not accepted yet"),
    ([condition("Accepted", True, "Accepted", 30)], "Accepted", "accepted, waiting for capacity"),
    ([condition("Accepted", True, "Accepted", 30), condition("Provisioned", False, "CapacityIsNotFound", 25,
                                                             "CA will try to find it later")],
     "Accepted", "accepted, waiting for capacity"),
    ([condition("Provisioned", False, "CapacityIsNotFound", 25)], "NotProvisioned",
     "not provisioned yet (CapacityIsNotFound)"),
    ([condition("Accepted", True, "Accepted", 30), condition("Failed", True, "Failed", 5, "quota exceeded")],
     "Failed", "failed"),
    ([condition("Provisioned", True, "Provisioned", 30), condition("CapacityRevoked", True, "Revoked", 5)],
     "CapacityRevoked", "capacity revoked"),
    ([condition("Provisioned", True, "Provisioned", 30), condition("BookingExpired", True, "Expired", 5)],
     "BookingExpired", "booking expired"),
])
def test_waiting_for_a_dws_slice_names_the_provisioning_requests_state(conditions, state, words):
    job = rayjob("dws", queue="user-queue-dws")
    owner = workload(job, reserved(50), flavor="dws", cluster_queue="cluster-queue-dws",
                     checks=[{"name": stack_kueue.ADMISSION_CHECK, "state": "Pending", "message": "",
                              "lastTransitionTime": ago(50)}])
    view = one_job(job, owner, provisioning_requests=[provisioning_request(owner, conditions)])
    assert (view.state, view.rung, view.words) == (jobs.WAITING_FOR_SLICE, "dws", "waiting for a DWS slice")
    assert view.since == NOW - datetime.timedelta(seconds=50)  # since quota was reserved: the wait for the slice
    assert (view.request.state, view.request.words) == (state, words)
    assert view.request.name in view.detail and f"{stack_kueue.ADMISSION_CHECK} Pending" in view.detail
    assert view.checks == ((stack_kueue.ADMISSION_CHECK, "Pending"),)


def test_the_newest_provisioning_request_of_the_jobs_own_workload_counts():
    job = rayjob("retried", queue="user-queue-dws")
    owner = workload(job, reserved(), flavor="dws", checks=[])
    first = provisioning_request(owner, [condition("Failed", True, "Failed", 100)], attempt=1, created=200)
    second = provisioning_request(owner, [condition("Accepted", True, "Accepted", 10)], attempt=2, created=20)
    stranger = provisioning_request(workload(rayjob("other"), reserved(), flavor="dws"), [], attempt=3, created=1)
    view = one_job(job, owner, provisioning_requests=[second, first, stranger])
    assert (view.request.name, view.request.state) == (second["metadata"]["name"], "Accepted")


def test_a_request_of_another_class_is_capacity_not_dws():
    job = rayjob("other-class", queue="user-queue-dws")
    owner = workload(job, reserved(), flavor="dws", checks=[])
    view = one_job(job, owner, provisioning_requests=[
        provisioning_request(owner, [], provisioning_class="best-effort-atomic-scale-up.autoscaling.x-k8s.io")])
    assert view.words == "waiting for capacity"


def test_quota_reserved_without_a_request_waits_for_its_checks():
    job = rayjob("checks", queue="user-queue-dws")
    view = one_job(job, workload(job, reserved(12), flavor="dws", checks=[
        {"name": stack_kueue.ADMISSION_CHECK, "state": "Retry", "message": "", "lastTransitionTime": ago(3)}]))
    assert (view.state, view.rung) == (jobs.WAITING_FOR_CHECKS, "dws")
    assert view.detail == f"checks: {stack_kueue.ADMISSION_CHECK} Retry"


def test_admitted_waits_for_its_pods_then_runs():
    job = rayjob("admitted")
    view = one_job(job, workload(job, admitted(40), flavor="on-demand"))
    assert (view.state, view.rung, view.words) == (jobs.ADMITTED, "on-demand", "admitted, waiting for pods")
    assert view.since == NOW - datetime.timedelta(seconds=40)
    view = one_job(job, workload(job, admitted(40, pods_ready=15), flavor="on-demand"))
    assert (view.state, view.words) == (jobs.RUNNING, "running")
    assert view.since == NOW - datetime.timedelta(seconds=15)


def test_a_running_job_that_lost_its_slice_says_since_when_and_until_when_it_waits():

    def lost_on(seconds: int, state: str = api.LOST) -> str:
        at = NOW - datetime.timedelta(seconds=seconds)
        return api.LostSlice("on-demand", api.format_time(at), "its host n-1 is gone",
                                api.format_time(at + datetime.timedelta(minutes=10)), state).to_json()

    job = rayjob("lost", annotations={api.SLICE_LOST_ANNOTATION: lost_on(5)})
    view = one_job(job, workload(job, admitted(40, pods_ready=15), flavor="on-demand"))
    assert (view.state, view.rung) == (jobs.SLICE_LOST, "on-demand")
    assert view.words == f"lost its slice, waiting for it until {api.format_time(NOW + datetime.timedelta(seconds=595))}"
    assert view.since == NOW - datetime.timedelta(seconds=5) and "its host n-1 is gone" in view.detail
    # Whole again, or a loss of an earlier run (before this admission's pods were ready): running.
    for annotation in (lost_on(5, api.RECOVERED), lost_on(30)):
        job = rayjob("lost", annotations={api.SLICE_LOST_ANNOTATION: annotation})
        assert one_job(job, workload(job, admitted(40, pods_ready=15), flavor="on-demand")).state == jobs.RUNNING


def test_a_maintenance_seen_coming_is_shown_while_it_is_about_the_admission_the_job_runs_on():
    window = api.format_time(NOW + datetime.timedelta(hours=2))
    ahead = api.Ahead(api.MAINTENANCE, window, "gke-n-1", "on-demand", api.format_time(NOW),
                      checkpoint=f"maintenance-x {api.format_time(NOW)}")
    job = rayjob("maintained", annotations={api.AHEAD_ANNOTATION: ahead.to_json()})
    report = build_report(dev_snapshot(rayjobs=[job], workloads=[
        workload(job, admitted(40, pods_ready=15), flavor="on-demand")]))
    (view,) = report.jobs
    assert view.state == jobs.RUNNING and view.ahead == ahead
    assert f"  ahead: maintenance of host gke-n-1 at {window} (on on-demand); checkpoint asked at " \
           f"{api.format_time(NOW)}" in render.why_lines(report)
    assert render.job_dict(view, NOW)["disruptionAhead"]["host"] == "gke-n-1"
    # Seen on another rung (the job has moved since): not this admission's.
    other = rayjob("maintained", annotations={api.AHEAD_ANNOTATION: ahead.with_(flavor="spot").to_json()})
    assert one_job(other, workload(other, admitted(40, pods_ready=15), flavor="on-demand")).ahead is None


def test_evicted_by_the_pods_ready_timeout_says_from_where_and_when_it_is_back():
    job = rayjob("stocked-out")
    view = one_job(job, workload(job, evicted(PODS_READY_TIMEOUT, 20), requeue_at=40,
                                 annotations={ADMITTED_FLAVOR_ANNOTATION: "on-demand"}))
    assert view.state == jobs.EVICTED
    assert view.words == "evicted from on-demand: pods not ready in time"
    assert view.since == NOW - datetime.timedelta(seconds=20)
    assert f"back in the queue at {ago(-40)}" in view.detail and "Exceeded the PodsReady timeout" in view.detail
    assert view.rung == "on-demand"  # Kueue tries its queue's first rung again (kueue#2560)


def test_evicted_by_deactivation_stays_out_until_reactivated():
    job = rayjob("deactivated")
    view = one_job(job, workload(job, evicted("Deactivated", 8), active=False))
    assert (view.state, view.words) == (jobs.EVICTED, "evicted: deactivated")
    assert view.detail.startswith("spec.active is false: out of the queue until it is true again")


def test_deactivated_before_any_admission():
    job = rayjob("never")
    view = one_job(job, workload(job, pending(100), active=False, created=100))
    assert (view.state, view.since) == (jobs.DEACTIVATED, NOW - datetime.timedelta(seconds=100))


def test_back_in_the_queue_after_an_eviction_waits_for_quota_and_says_why_it_left():
    job = rayjob("requeued")
    view = one_job(job, workload(job, evicted("Preempted", 90, requeued=30)))
    assert (view.state, view.since) == (jobs.WAITING_FOR_QUOTA, NOW - datetime.timedelta(seconds=30))
    assert view.detail.startswith("evicted earlier: preempted")


def test_reactivated_before_it_was_ever_admitted_is_back_in_the_queue():
    """Measured on Kueue 0.19.2: a pending Workload deactivated and reactivated (the controller's move route) keeps
    Evicted=True/Deactivated and gets no Requeued condition; it is in its new queue."""
    move = Move("on-demand", "dws", "user-queue-dws", STOCKOUT, ago(30))
    job = rayjob("moved-early", queue="user-queue-dws", annotations={
        FAILOVER_ANNOTATION: move.done().to_json(), MOVES_ANNOTATION: with_move_recorded(None, move)})
    conditions = [*pending(300, "insufficient unused quota"), condition("Evicted", True, "Deactivated", 31,
                                                                        "The workload is deactivated")]
    view = one_job(job, workload(job, conditions))
    assert (view.state, view.rung, view.since) == (jobs.WAITING_FOR_QUOTA, "dws", NOW - datetime.timedelta(seconds=300))
    assert view.detail == "moved here from on-demand by the failover controller; insufficient unused quota"
    plain = rayjob("reactivated")
    view = one_job(plain, workload(plain, conditions))
    assert (view.state, view.detail) == (jobs.WAITING_FOR_QUOTA, "evicted earlier: deactivated; insufficient unused quota")
    # Moved before Kueue reconciled the deactivation (seen on the tier): no Evicted condition, still moved here.
    quick = rayjob("moved-quickly", queue="user-queue-dws", annotations=job["metadata"]["annotations"])
    view = one_job(quick, workload(quick, pending(300, "insufficient unused quota")))
    assert view.detail == "moved here from on-demand by the failover controller; insufficient unused quota"


def test_a_move_in_progress_and_the_moves_so_far():
    first = Move("on-demand", "spot", "user-queue-spot", STOCKOUT, ago(300))
    second = Move("spot", "dws", "user-queue-dws", PODS_READY_TIMEOUT, ago(120))
    history = with_move_recorded(None, first)
    history = with_move_recorded({MOVES_ANNOTATION: history}, second)
    done = rayjob("walked", queue="user-queue-dws", annotations={
        FAILOVER_ANNOTATION: second.done().to_json(), MOVES_ANNOTATION: history})
    view = one_job(done, workload(done, evicted("Deactivated", 100, requeued=60)))
    assert view.detail == "moved here from spot by the failover controller"
    assert [(m.from_flavor, m.to_flavor, m.reason, m.at) for m in view.moves] == [
        ("on-demand", "spot", STOCKOUT, ago(300)), ("spot", "dws", PODS_READY_TIMEOUT, ago(120))]
    assert view.move_in_progress is None and view.state == jobs.WAITING_FOR_QUOTA

    third = Move("on-demand", "dws", "user-queue-dws", STOCKOUT, ago(4))
    moving = rayjob("moving", annotations={FAILOVER_ANNOTATION: third.to_json(), MOVES_ANNOTATION: "not json"})
    view = one_job(moving, workload(moving, evicted("Deactivated", 3), active=False))
    assert (view.state, view.words, view.since) == (jobs.MOVING, "moving from on-demand to dws",
                                                   NOW - datetime.timedelta(seconds=4))
    assert view.moves == () and view.move_in_progress.to_flavor == "dws" and view.rung == "dws"
    assert "autoscaler reported no TPU capacity" in view.detail
    # A requeue on the last rung (a lost slice): no "from dws to dws".
    requeue = Move("dws", "dws", "user-queue-dws", SLICE_LOST, ago(4))
    requeued = rayjob("requeued", annotations={FAILOVER_ANNOTATION: requeue.to_json()})
    view = one_job(requeued, workload(requeued, evicted("Deactivated", 3), active=False))
    assert (view.state, view.words) == (jobs.MOVING, "being requeued on dws (the last rung or step: no next one)")
    assert "it lost its slice" in view.detail
    after = rayjob("requeued", queue="user-queue-dws", annotations={
        FAILOVER_ANNOTATION: requeue.done().to_json(), MOVES_ANNOTATION: with_move_recorded(None, requeue)})
    view = one_job(after, workload(after, evicted("Deactivated", 2, requeued=1)))
    assert view.state == jobs.WAITING_FOR_QUOTA and view.detail.startswith(
        "requeued here by the failover controller (it lost its slice"), view.detail


def test_finished_keeps_the_rung_it_ran_on():
    job = rayjob("done")
    conditions = admitted(400, pods_ready=390) + [condition("Finished", True, "Succeeded", 10, "Job finished")]
    view = one_job(job, workload(job, conditions, flavor="on-demand"))
    assert (view.state, view.words, view.rung, view.detail) == (jobs.FINISHED, "finished (Succeeded)", "on-demand",
                                                                "Job finished")


def test_the_workload_is_found_by_its_owner_not_by_a_name_in_another_namespace():
    mine, theirs = rayjob("same"), rayjob("same", namespace="research")
    stale = workload(mine, admitted(900) + [condition("Finished", True, "Failed", 800)], flavor="on-demand",
                     created=1000)
    stale["metadata"]["name"] += "-old"
    current = workload(mine, pending(5), created=10)
    elsewhere = workload(theirs, admitted(1), flavor="on-demand")
    report = build_report(dev_snapshot(rayjobs=[mine], workloads=[elsewhere, stale, current]))
    (view,) = report.jobs
    assert (view.workload, view.state) == (current["metadata"]["name"], jobs.WAITING_FOR_QUOTA)


# ---- the whole report -----------------------------------------------------------------------------------------------
def mixed_snapshot(**objects) -> Snapshot:
    running, waiting, slice_wait = rayjob("a-running"), rayjob("b-waiting"), rayjob("c-dws", queue="user-queue-dws")
    evicted_job = rayjob("d-evicted")
    owner = workload(slice_wait, reserved(50), flavor="dws", checks=[])
    return dev_snapshot(
        rayjobs=[waiting, running, slice_wait, evicted_job],
        workloads=[workload(running, admitted(100, pods_ready=90), flavor="on-demand"),
                   workload(waiting, pending(30)), owner,
                   workload(evicted_job, evicted(PODS_READY_TIMEOUT, 20), requeue_at=40)],
        provisioning_requests=[provisioning_request(owner, [condition("Accepted", True, "Accepted", 40)])],
        **objects)


def test_rungs_count_the_jobs_admitted_on_them_and_waiting_for_them():
    report = build_report(mixed_snapshot())
    # on-demand: a-running admitted; b-waiting and d-evicted (back after its backoff) wait. dws: c-dws's slice.
    assert [(s.rung.flavor, s.admitted, s.pending) for s in report.rungs] == [("on-demand", 1, 2), ("dws", 0, 1)]
    base = mixed_snapshot()
    parked, moving = rayjob("e-parked"), rayjob("f-moving", annotations={FAILOVER_ANNOTATION: Move(
        "on-demand", "dws", "user-queue-dws", STOCKOUT, ago(2)).to_json()})
    more = build_report(Snapshot(**{**base.__dict__, "rayjobs": base.rayjobs + [parked, moving], "workloads": [
        *base.workloads, workload(parked, evicted("Deactivated", 5), active=False),
        workload(moving, evicted("Deactivated", 1), active=False)]}))
    # A deactivated job waits for nothing; a job being moved waits at its target.
    assert [(s.rung.flavor, s.admitted, s.pending) for s in more.rungs] == [("on-demand", 1, 2), ("dws", 0, 2)]
    assert [j.name for j in report.jobs] == ["a-running", "b-waiting", "c-dws", "d-evicted"]
    only = build_report(mixed_snapshot(), only=["c-dws"])
    assert [j.name for j in only.jobs] == ["c-dws"] and only.rungs == report.rungs


def deployment_with(ready: int, replicas: int = 1, available: dict | None = None) -> dict:
    found = plan_objects()["Deployment"][0]
    found["spec"]["replicas"] = replicas
    found["status"] = {"readyReplicas": ready, "conditions": [available] if available else []}
    return found


def controller_pod(restarts: int) -> dict:
    return {"metadata": {"name": f"{stack_failover.NAME}-7d9f-x{restarts}", "namespace": stack_failover.NAMESPACE},
            "status": {"containerStatuses": [{"name": "controller", "restartCount": restarts}]}}


def move_event(job: str, seconds_ago: float, message: str) -> dict:
    return {"metadata": {"name": f"{job}.{seconds_ago}", "namespace": NAMESPACE},
            "involvedObject": {"kind": "RayJob", "name": job, "namespace": NAMESPACE},
            "reason": MOVE_EVENT_REASON, "message": message, "lastTimestamp": ago(seconds_ago)}


def test_the_controllers_health():
    events = [move_event("old", 3600, "moved from on-demand to dws (old)"),
              move_event("new", 60, "moved from on-demand to dws (new)")]
    view = health.controller_view(deployment_with(ready=1), [controller_pod(2), controller_pod(1)], events)
    assert (view.state, view.ready, view.desired, view.restarts) == (health.HEALTHY, 1, 1, 3)
    assert (view.latest_move.job, view.latest_move.at) == ("new", NOW - datetime.timedelta(seconds=60))
    crashing = {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable",
                "message": "Deployment does not have minimum availability."}
    view = health.controller_view(deployment_with(ready=0, available=crashing), [controller_pod(7)], [])
    assert (view.state, view.ready, view.restarts) == (health.DEGRADED, 0, 7) and "minimum availability" in view.words
    assert health.controller_view(deployment_with(ready=0, replicas=0), [], []).state == health.SCALED_TO_ZERO
    assert health.controller_view(None, [], []).state == health.NOT_DEPLOYED
    assert health.controller_view(None, [], [], readable=False).state == health.UNKNOWN


# ---- rendering ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reason, words", [
    (PODS_READY_TIMEOUT, "pods not ready in time"), ("Deactivated", "deactivated"),
    ("DeactivatedDueToRequeuingLimitExceeded", "deactivated"), ("Preempted", "preempted"),
    ("SomethingNew", "SomethingNew"), (None, "unknown reason")])
def test_eviction_reasons_in_words(reason, words):
    assert jobs.eviction_words(reason) == words


@pytest.mark.parametrize("seconds, text", [(0, "0s"), (119, "119s"), (120, "2m"), (192, "3m12s"), (3600, "1h"),
                                           (7500, "2h5m"), (86400 * 3 + 3600 * 4, "3d4h"), (-5, "0s")])
def test_durations_read_like_kubectl(seconds, text):
    assert duration(seconds) == text


def columns(section: str) -> list[dict[str, str]]:
    """A kubectl-style table read back by its header's column starts."""
    header, *lines = section.splitlines()
    names = [n for n in header.split("   ") if n.strip()]
    starts = [header.index(n) for n in names]
    bounds = list(zip(starts, [*starts[1:], None]))
    return [{n.strip(): line[a:b].strip() for n, (a, b) in zip(names, bounds)} for line in lines]


def test_the_table_shows_each_rung_each_job_and_the_controller():
    report = build_report(mixed_snapshot(controller=deployment_with(ready=1), controller_pods=[controller_pod(2)],
                                         move_events=[move_event("d-evicted", 90, "moved from a to b")]))
    text = render_table(report)
    lines = text.splitlines()
    rung_rows = {line.split()[1]: line.split() for line in lines if line[:1].isdigit()}
    assert rung_rows["on-demand"][2:4] == ["cluster-queue", "user-queue"]
    assert rung_rows["dws"][2:5] == ["cluster-queue-dws", "user-queue-dws", stack_kueue.ADMISSION_CHECK]
    rows = columns(text.split("JOBS (namespace default)\n")[1].split("\n\n")[0])
    job_rows = {row["NAME"]: row for row in rows}
    assert list(job_rows) == ["a-running", "b-waiting", "c-dws", "d-evicted"]
    assert (job_rows["a-running"]["STATE"], job_rows["a-running"]["SINCE"], job_rows["a-running"]["FOR"]) == (
        "running", ago(90), "90s")
    assert (job_rows["c-dws"]["STATE"], job_rows["c-dws"]["PROVISIONING REQUEST"]) == (
        "waiting for a DWS slice", "accepted, waiting for capacity")
    assert (job_rows["b-waiting"]["STATE"], job_rows["b-waiting"]["FOR"]) == ("waiting for quota", "30s")
    assert job_rows["d-evicted"]["STATE"] == "evicted: pods not ready in time"
    assert {row["RUNG"] for row in rows} == {"on-demand", "dws"} and job_rows["c-dws"]["MOVES"] == "0"
    assert f"  why: back in the queue at {ago(-40)}" in text  # the why section, under the job's name
    assert f"{stack_failover.NAMESPACE}/{stack_failover.NAME}: healthy, 1/1 ready, 2 restarts" in text
    assert "latest move 90s ago: default/d-evicted: moved from a to b" in text
    assert "NAMESPACE" not in text.split("JOBS")[1].splitlines()[1]


def test_all_namespaces_adds_the_namespace_column_and_names():
    base = mixed_snapshot()
    other = rayjob("a-running", namespace="research")
    report = build_report(Snapshot(**{**base.__dict__, "namespace": None, "rayjobs": base.rayjobs + [other],
                                      "workloads": base.workloads + [workload(other, pending(3))]}))
    text = render_table(report)
    header = next(line for line in text.splitlines() if line.startswith("NAMESPACE"))
    assert header.split()[:3] == ["NAMESPACE", "NAME", "QUEUE"]
    assert any(line.split()[:2] == ["research", "a-running"] for line in text.splitlines())
    assert "default/d-evicted\n  why:" in text  # the why section names the namespace too


def test_the_moves_and_a_not_deployed_controller_in_the_table():
    move = Move("on-demand", "dws", "user-queue-dws", PODS_READY_TIMEOUT, ago(120))
    job = rayjob("moved", queue="user-queue-dws", annotations={
        FAILOVER_ANNOTATION: move.done().to_json(), MOVES_ANNOTATION: with_move_recorded(None, move)})
    report = build_report(dev_snapshot(rayjobs=[job], workloads=[workload(job, pending(60))], controller=None))
    text = render_table(report)
    assert "moved\n  why: " in text and f"  moves: on-demand -> dws ({PODS_READY_TIMEOUT}, {ago(120)})" in text
    assert "not deployed" in text
    assert "rungs from the ClusterQueues" in text
    crashing = {"type": "Available", "status": "False", "message": "Deployment does not have minimum availability."}
    report = build_report(dev_snapshot(controller=deployment_with(ready=0, available=crashing),
                                       controller_pods=[controller_pod(4)]))
    assert ("FAILOVER CONTROLLER tpu-fallback-system/failover-controller: not ready: Deployment does not have minimum "
            "availability., 0/1 ready, 4 restarts") in render_table(report)


def test_json_has_every_field_with_times_and_seconds():
    report = build_report(mixed_snapshot(problems=["ProvisioningRequest: 403 Forbidden"]))
    data = json.loads(render_json(report))
    assert data == report_dict(report)
    assert (data["namespace"], data["context"], data["ladderFrom"]) == (NAMESPACE, "tier", FROM_CONTROLLER)
    dws = data["rungs"][1]
    assert dws["quota"][TPU_RESOURCE]["nominal"] == SIXTEEN_CHIPS and dws["admissionCheck"] == "dws-prov"
    jobs_by_name = {j["name"]: j for j in data["jobs"]}
    assert jobs_by_name["a-running"]["forSeconds"] == 90 and jobs_by_name["a-running"]["since"] == ago(90)
    assert jobs_by_name["c-dws"]["provisioningRequest"]["state"] == "Accepted"
    assert jobs_by_name["d-evicted"]["state"] == jobs.EVICTED
    controller = data["failoverController"]  # the plan's Deployment, no status yet: nothing ready
    assert (controller["state"], controller["replicas"], controller["readyReplicas"]) == (health.DEGRADED, 1, 0)
    assert data["problems"] == ["ProvisioningRequest: 403 Forbidden"]
    assert {q["name"] for q in data["clusterQueues"]} == {"cluster-queue", "cluster-queue-dws"}


# ---- the command line -----------------------------------------------------------------------------------------------
class FakeReader:
    """Stands for ClusterReader: records the namespace asked for, returns a fixed snapshot."""

    def __init__(self, snapshot_: Snapshot):
        self.snapshot, self.asked = snapshot_, []

    def read(self, namespace, context=None):
        self.asked.append((namespace, context))
        return Snapshot(**{**self.snapshot.__dict__, "namespace": namespace, "context": context})


@pytest.fixture
def kubeconfig(tmp_path):
    path = tmp_path / "config"
    cluster = {"server": "https://127.0.0.1:1"}
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "team",
        "clusters": [{"name": "c", "cluster": cluster}], "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "team", "context": {"cluster": "c", "user": "u", "namespace": "research"}},
                     {"name": "plain", "context": {"cluster": "c", "user": "u"}}]}))
    return str(path)


def status(argv: list[str], reader=None, sleep=None) -> tuple[int, str, str, FakeReader]:
    parser = cli.add_arguments(argparse.ArgumentParser())
    args = parser.parse_args(argv)
    reader = reader or FakeReader(mixed_snapshot())
    out, err = io.StringIO(), io.StringIO()
    code = cli.run(args, out, err, sleep=sleep or (lambda s: None), reader=reader)
    return code, out.getvalue(), err.getvalue(), reader


@pytest.mark.parametrize("flags, asked", [
    ([], ("research", "team")),  # the context's namespace, as kubectl
    (["--context", "plain"], ("default", "plain")),
    (["-n", "ops"], ("ops", "team")),
    (["-A"], (None, "team")),
])
def test_namespace_and_context_resolve_as_kubectl(kubeconfig, flags, asked):
    code, out, _, reader = status(["--kubeconfig", kubeconfig, *flags])
    assert code == 0 and reader.asked == [asked]
    assert out.startswith(f"context {asked[1]} · ")


def test_an_unknown_context_and_a_bad_interval_are_errors(kubeconfig):
    code, _, err, reader = status(["--kubeconfig", kubeconfig, "--context", "nope"])
    assert code == 1 and "nope" in err and reader.asked == []
    code, _, err, _ = status(["--kubeconfig", kubeconfig, "--watch", "--interval", "0"])
    assert code == 2 and "--interval" in err


def interrupted_after(redraws: int) -> tuple[list[float], Callable[[float], None]]:
    """A sleep that records its waits and presses Ctrl-C at the given one."""
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == redraws:
            raise KeyboardInterrupt
    return sleeps, sleep


def test_watch_redraws_until_interrupted(kubeconfig):
    sleeps, sleep = interrupted_after(3)
    code, out, _, reader = status(["--kubeconfig", kubeconfig, "-w", "--interval", "0.5"], sleep=sleep)
    assert code == 0 and sleeps == [0.5, 0.5, 0.5] and len(reader.asked) == 3
    assert out.count(cli.CLEAR_SCREEN) == 3 and out.count("JOBS (namespace research)") == 3


def test_watch_as_json_prints_one_document_per_line(kubeconfig):
    _, sleep = interrupted_after(2)
    code, out, _, _ = status(["--kubeconfig", kubeconfig, "-o", "json", "--watch"], sleep=sleep)
    documents = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and len(documents) == 2 and documents[0]["namespace"] == "research"


def test_an_unreachable_cluster_fails_once_and_is_reported_while_watching(kubeconfig):
    class Down:
        calls = 0

        def read(self, namespace, context=None):
            Down.calls += 1
            raise ClusterError("cannot reach the API server at https://127.0.0.1:1: connection refused")

    code, _, err, _ = status(["--kubeconfig", kubeconfig], reader=Down())
    assert code == 1 and err == "error: cannot reach the API server at https://127.0.0.1:1: connection refused\n"

    def stop(seconds):
        raise KeyboardInterrupt

    code, out, _, _ = status(["--kubeconfig", kubeconfig, "--watch"], reader=Down(), sleep=stop)
    assert code == 0 and "error: cannot reach the API server" in out and Down.calls == 2


def test_the_entry_point_runs_the_status_tool(tmp_path, capsys):
    from ops.__main__ import main

    assert main(["status", "--kubeconfig", str(tmp_path / "missing")]) == 1
    assert "error:" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["nothing"])


def test_only_named_jobs_are_listed(kubeconfig):
    code, out, _, _ = status(["--kubeconfig", kubeconfig, "-o", "json", "c-dws"])
    assert code == 0 and [j["name"] for j in json.loads(out)["jobs"]] == ["c-dws"]


def test_a_fleet_job_shows_where_it_runs_and_kueues_record():
    """On a fleet's manager (plan C): Kueue's status.clusterName, and the fleet watch's annotation when it differs."""
    from ops.status.jobs import fleet_of

    rayjob = {"metadata": {"name": "fleet-v6e-1", "namespace": "tpu-fleet", "annotations": {}}}
    workload = {"metadata": {"name": "w"}, "status": {"clusterName": "w1"}}
    assert fleet_of(rayjob, {"metadata": {"name": "w"}, "status": {}}) is None  # not admitted anywhere yet
    assert fleet_of(rayjob, workload).words() == "admitted in w1 (Kueue's record; the fleet watch has not seen it yet)"
    rayjob["metadata"]["annotations"][FLEET_ANNOTATION] = json.dumps({
        "state": "RecordStale", "runsIn": ["w2"], "kueueRecord": "w1", "since": "2026-11-30T18:00:00Z"})
    placement = fleet_of(rayjob, workload)
    assert (placement.record, placement.runs_in, placement.watch_state) == ("w1", ("w2",), "RecordStale")
    assert placement.words() == "runs in w2; Kueue's record says w1 (it cannot record it: Kueue 0.19.2)"


# ---- truth under denial ---------------------------------------------------------------------------------------------
DENIED = "cannot list ClusterQueues (cluster-wide): 403 Forbidden for system:serviceaccount:default:reader"


def with_usage(local_queues: list[dict]) -> list[dict]:
    """LocalQueues as Kueue reports them: status.flavorsReservation lists every flavor of their ClusterQueue."""
    cluster_queues = {q["metadata"]["name"]: q for q in plan_objects()["ClusterQueue"]}
    for queue in local_queues:
        groups = cluster_queues[queue["spec"]["clusterQueue"]]["spec"]["resourceGroups"]
        queue["status"] = {"flavorsReservation": [
            {"name": f["name"], "resources": [{"name": r, "total": "0"} for r in group["coveredResources"]]}
            for group in groups for f in group["flavors"]]}
    return local_queues


def namespace_only_snapshot() -> Snapshot:
    """What a team member with `view` in the namespace reads: jobs, Workloads and LocalQueues; nothing else."""
    base = mixed_snapshot(local_queues=with_usage(plan_objects()["LocalQueue"]))
    slice_wait = next(w for w in base.workloads if w["spec"]["queueName"] == "user-queue-dws")
    slice_wait["status"]["admissionChecks"] = [{"name": stack_kueue.ADMISSION_CHECK, "state": "Pending"}]
    for field in ("cluster_queues", "cohorts", "resource_flavors", "admission_checks", "provisioning_requests",
                  "controller", "kueue_config", "multikueue_clusters", "fleet_watch", "fleet_ladder"):
        setattr(base, field, [] if isinstance(getattr(base, field), list) else None)
        base.deny(field, DENIED if field == "cluster_queues" else f"cannot read {field}: 403 Forbidden")
    return base


def test_a_namespace_only_identity_sees_the_rungs_and_unknown_quota_never_none():
    report = build_report(namespace_only_snapshot())
    assert report.ladder.source == FROM_LOCAL_QUEUES and not report.ladder.quota_known
    assert [(r.flavor, r.local_queue) for r in report.ladder.rungs] == [("on-demand", "user-queue"),
                                                                       ("dws", "user-queue-dws")]
    views = {j.name: j for j in report.jobs}
    assert views["b-waiting"].rung == "on-demand" and views["c-dws"].rung == "dws"  # waiting jobs keep their rung
    # Its DWS check pending and the requests unreadable: waiting for a slice, the request unknown (not "checks").
    assert views["c-dws"].state == jobs.WAITING_FOR_SLICE and "ProvisioningRequest unknown" in views["c-dws"].detail
    assert report.controller.state == health.UNKNOWN and not report.complete
    text = render_table(report)
    assert f"  quota unknown: {DENIED}" in text and "no ClusterQueue with TPU quota" not in text
    assert f"CLUSTERQUEUES unknown\n  {DENIED}" in text and "rungs from the LocalQueues shown" in text
    data = report_dict(report)
    assert data["clusterQueues"] is None and data["rungs"][0]["quota"] is None and data["complete"] is False
    assert data["readable"]["cluster_queues"] is False and data["readable"]["workloads"] is True


def test_nothing_readable_is_unknown_and_a_script_can_tell(kubeconfig):
    base = snapshot()
    for field in ("cluster_queues", "local_queues", "workloads", "rayjobs"):
        base.deny(field, f"cannot list {field}: 403 Forbidden for u")
    report = build_report(base)
    assert report.ladder.source == FROM_UNKNOWN and not report.jobs_known
    text = render_table(report)
    assert "LADDER unknown" in text and "JOBS (namespace default) unknown" in text and "no jobs" not in text
    data = report_dict(report)
    assert data["jobs"] is None and data["rungs"] is None  # null, not []
    code, out, _, _ = status(["--kubeconfig", kubeconfig, "-o", "json"], reader=FakeReader(base))
    assert code == cli.EXIT_PARTIAL == 3 and json.loads(out)["jobs"] is None
    code, _, _, _ = status(["--kubeconfig", kubeconfig], reader=FakeReader(mixed_snapshot()))
    assert code == cli.EXIT_OK


def test_a_named_job_that_does_not_exist_is_not_found(kubeconfig):
    code, out, err, _ = status(["--kubeconfig", kubeconfig, "c-dws", "nope"])
    assert code == cli.EXIT_ERROR and err == 'Error from server (NotFound): no job "nope" in namespace research\n'
    assert "c-dws" in out


@pytest.mark.parametrize("text, words", [
    ("{{{ not yaml", "is not YAML: expected ',' or '}', but got '<stream end>' at line 1, column 13"),
    ("hello", "is not a kubeconfig: a YAML mapping with clusters, users and contexts was expected, not a str"),
    ("- a\n- b", "not a list"),
])
def test_a_kubeconfig_that_is_not_one_is_one_line(tmp_path, text, words):
    path = tmp_path / "config"
    path.write_text(text)
    code, out, err, reader = status(["--kubeconfig", str(path)])
    assert code == cli.EXIT_ERROR and out == "" and reader.asked == []
    assert err.startswith(f"error: kubeconfig {path} ") and err.endswith(f"{words}\n") and err.count("\n") == 1


# ---- every workload, and what it has been through -------------------------------------------------------------------
def with_pod_sets(obj: dict, *pod_sets: tuple[str, int, int]) -> dict:
    """(name, count, TPU chips per pod) pod sets on a Workload."""
    obj["spec"]["podSets"] = [{"name": name, "count": count, "template": {"spec": {"containers": [
        {"name": "c", "resources": {"requests": {TPU_RESOURCE: str(chips)} if chips else {"cpu": "1"}}}]}}}
        for name, count, chips in pod_sets]
    return obj


def owned_by_kind(obj: dict, kind: str, name: str, api_version: str = "batch/v1") -> dict:
    obj["metadata"]["ownerReferences"] = [{"apiVersion": api_version, "kind": kind, "name": name,
                                           "uid": f"uid-{kind}-{name}", "controller": True}]
    return obj


def pod(name: str, ready: bool, **labels: str) -> dict:
    return {"metadata": {"name": name, "namespace": NAMESPACE, "labels": dict(labels)},
            "status": {"conditions": [condition("Ready", ready, "")]}}


def test_a_batch_job_is_shown_with_its_kind_chips_and_pods():
    stand_in = rayjob("train-batch")  # a Workload's shape; its owner is a batch Job
    job_workload = with_pod_sets(owned_by_kind(workload(stand_in, admitted(20), flavor="on-demand"), "Job",
                                               "train-batch"), ("main", 4, 4))
    ray = rayjob("ray", annotations={})
    ray["status"] = {"rayClusterName": "ray-abc12"}
    ray_workload = with_pod_sets(workload(ray, admitted(30, pods_ready=10), flavor="on-demand"),
                                 ("head", 1, 0), ("tpu-group", 4, 4), ("submitter", 1, 0))
    pods = [pod("j-0", True, **{jobs.JOB_NAME_LABEL: "train-batch"}), pod("j-1", False, **{jobs.JOB_NAME_LABEL:
                                                                                          "train-batch"}),
            *(pod(f"r-{i}", True, **{jobs.RAY_CLUSTER_LABEL: "ray-abc12"}) for i in range(5)),
            pod("ray-submit", True, **{jobs.JOB_NAME_LABEL: "ray"}), pod("stranger", True)]
    report = build_report(dev_snapshot(rayjobs=[ray], workloads=[job_workload, ray_workload], pods=pods))
    views = {j.name: j for j in report.jobs}
    batch = views["train-batch"]
    assert (batch.kind, batch.state, batch.rung, batch.workload) == ("Job", jobs.ADMITTED, "on-demand",
                                                                     "rayjob-train-batch-a1b2c")
    assert (batch.size, batch.pods_ready) == (jobs.Size(chips=16, hosts=4, pods=4), 1)
    assert (views["ray"].kind, views["ray"].size, views["ray"].pods_ready) == ("RayJob", jobs.Size(16, 4, 6), 6)
    assert [(s.rung.flavor, s.admitted) for s in report.rungs][0] == ("on-demand", 2)  # the Job counts on its rung
    row = {r["NAME"]: r for r in columns(render_table(report).split("JOBS (namespace default)\n")[1]
                                           .split("\n\n")[0])}["train-batch"]
    assert (row["KIND"], row["CHIPS"], row["PODS"]) == ("Job", "16", "1/4")
    assert report_dict(report)["jobs"][1]["podsReady"] == 1
    unreadable = dev_snapshot(rayjobs=[ray], workloads=[ray_workload])
    unreadable.deny("pods", "cannot list Pods in namespace default: 403 Forbidden for u")
    assert build_report(unreadable).jobs[0].pods_ready is None  # unknown, not 0


def test_position_priority_evictions_requeues_and_the_eviction_deadline():
    first, second, urgent, held = rayjob("first"), rayjob("second"), rayjob("urgent"), rayjob("held")
    later = workload(second, pending(5), created=100)
    earlier = workload(first, pending(5), created=300)
    high = workload(urgent, pending(5), created=10)
    high["spec"]["priority"], high["spec"]["priorityClassRef"] = 100, {
        "group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "urgent"}
    admitted_one = workload(held, admitted(40), flavor="on-demand")
    admitted_one["status"]["schedulingStats"] = {"evictions": [{"reason": PODS_READY_TIMEOUT, "count": 2},
                                                              {"reason": "Preempted", "underlyingCause": "",
                                                               "count": 1}]}
    admitted_one["status"]["requeueState"] = {"count": 2}
    kueue_config = {"data": {stack_kueue.MANAGER_CONFIG_KEY: yaml.safe_dump({"waitForPodsReady": {"timeout": "10m0s"}})}}
    report = build_report(dev_snapshot(rayjobs=[first, second, urgent, held],
                                       workloads=[later, earlier, high, admitted_one], kueue_config=kueue_config))
    views = {j.name: j for j in report.jobs}
    # Kueue's order: priority first, then the queue time (creation here).
    assert [(views[n].position, views[n].position_source) for n in ("urgent", "first", "second")] == [
        (0, jobs.POSITION_COMPUTED), (1, jobs.POSITION_COMPUTED), (2, jobs.POSITION_COMPUTED)]
    assert (views["urgent"].priority, views["urgent"].priority_class) == (100, "urgent")
    assert views["held"].position is None and views["held"].created == NOW - datetime.timedelta(seconds=590)
    assert (views["held"].evictions, views["held"].eviction_count, views["held"].requeues) == (
        ((PODS_READY_TIMEOUT, 2), ("Preempted", 1)), 3, 2)
    assert views["held"].evict_at == NOW + datetime.timedelta(seconds=600 - 40)
    assert views["held"].looping_on is None  # on-demand has dws below it
    text = render_table(report)
    assert f"Kueue evicts it at {ago(40 - 600)} (in 9m20s) unless all its pods are ready" in text
    assert f"evicted 3 times (2 {PODS_READY_TIMEOUT}, 1 Preempted), requeued 2 times" in text
    assert "POSITION ~n: computed from the Workloads shown" in text
    from_kueue = dev_snapshot(rayjobs=[first], workloads=[earlier], queue_positions={
        (NAMESPACE, earlier["metadata"]["name"]): 7}, positions_from_kueue=True)
    assert (build_report(from_kueue).jobs[0].position, build_report(from_kueue).jobs[0].position_source) == (
        7, jobs.POSITION_FROM_KUEUE)


def test_a_job_looping_on_the_last_rung_is_visible():
    job = rayjob("loop", queue="user-queue-dws")
    looping = workload(job, evicted(PODS_READY_TIMEOUT, 20, requeued=5), queue="user-queue-dws")
    looping["status"]["schedulingStats"] = {"evictions": [{"reason": PODS_READY_TIMEOUT, "count": 3}]}
    view = one_job(job, looping)
    assert (view.state, view.rung, view.looping_on, view.moves) == (jobs.WAITING_FOR_QUOTA, "dws", "dws", ())
    once = copy.deepcopy(looping)
    once["status"]["schedulingStats"] = {"evictions": [{"reason": PODS_READY_TIMEOUT, "count": 1}]}
    assert one_job(job, once).looping_on is None  # one stockout is no loop
    assert "looping on the last rung (dws)" in render_table(build_report(dev_snapshot(rayjobs=[job],
                                                                                      workloads=[looping])))


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("5m", 300), ("1h30m0s", 5400), ("1.5h", 5400),
                                           ("", None), ("5 minutes", None)])
def test_kueues_durations(text, seconds):
    assert jobs.go_duration_seconds(text) == seconds


def test_kueues_pods_ready_timeout_from_its_configmap():
    def config_map(configuration) -> dict:
        return {"data": {stack_kueue.MANAGER_CONFIG_KEY: yaml.safe_dump(configuration)}}
    assert jobs.kueue_pods_ready_timeout(config_map({"waitForPodsReady": {"timeout": "120s"}})) == 120
    assert jobs.kueue_pods_ready_timeout(config_map({})) == jobs.KUEUE_DEFAULT_PODS_READY_SECONDS  # Kueue's default
    assert jobs.kueue_pods_ready_timeout({"data": {stack_kueue.MANAGER_CONFIG_KEY: "{{"}}) is None


# ---- a fleet's manager ----------------------------------------------------------------------------------------------
def multikueue_cluster(name: str, active: bool, reason: str, message: str = "") -> dict:
    return {"metadata": {"name": name}, "status": {"conditions": [condition("Active", active, reason, 30, message)]}}


def test_a_fleet_manager_shows_its_members_and_its_watch():
    from infra.fleet import WATCH_NAME

    watch = deployment_with(ready=1)
    watch["metadata"]["name"] = WATCH_NAME
    base = snapshot(multikueue_clusters=[multikueue_cluster("w2", False, "ClientConnectionFailed", "TLS timeout"),
                                         multikueue_cluster("w1", True, "Active")],
                    fleet_watch=watch, fleet_watch_pods=[controller_pod(1)])
    report = build_report(base)
    assert [(m.name, m.active) for m in report.fleet.members] == [("w1", True), ("w2", False)]
    assert (report.fleet.watch.state, report.fleet.watch.name) == (health.HEALTHY, WATCH_NAME)
    text = render_table(report)
    assert f"FLEET WATCH {stack_failover.NAMESPACE}/{WATCH_NAME}: healthy, 1/1 ready, 1 restarts" in text
    rows = {r["NAME"]: r for r in columns(text.split("connected)\n")[1].split("\n\n")[0])}
    assert (rows["w1"]["CONNECTED"], rows["w2"]["CONNECTED"], rows["w2"]["MESSAGE"]) == ("yes", "NO", "TLS timeout")
    assert report_dict(report)["fleet"]["members"][1]["reason"] == "ClientConnectionFailed"
    # No ladder controller on the manager (a fleet stack from before every fleet had one): a state, not a problem.
    assert report.fleet.ladder.state == health.NOT_DEPLOYED and "FLEET LADDER" in text
    assert report.controller.words == "not deployed (a fleet's manager has none: see FLEET WATCH)"
    assert build_report(snapshot()).fleet is None  # not a manager: no section
    denied = snapshot(fleet_watch=watch)
    denied.deny("multikueue_clusters", "cannot list MultiKueueClusters (cluster-wide): 403 Forbidden for u")
    assert report_dict(build_report(denied))["fleet"]["members"] is None


def test_a_fleet_manager_shows_its_ladder_controllers_health_and_never_calls_a_denied_read_absent():
    from infra.fleet import LADDER_NAME

    ladder = deployment_with(ready=0, available={"type": "Available", "status": "False", "message": "minimum replicas"})
    ladder["metadata"]["name"] = LADDER_NAME
    report = build_report(snapshot(multikueue_clusters=[multikueue_cluster("w1", True, "Active")],
                                   fleet_ladder=ladder, fleet_ladder_pods=[controller_pod(3)]))
    assert (report.fleet.ladder.state, report.fleet.ladder.restarts) == (health.DEGRADED, 3)
    text = render_table(report)
    assert (f"FLEET LADDER {stack_failover.NAMESPACE}/{LADDER_NAME}: not ready: minimum replicas, 0/1 ready, "
            "3 restarts") in text
    assert report_dict(report)["fleet"]["ladder"]["state"] == health.DEGRADED
    assert build_report(snapshot(fleet_ladder=ladder)).fleet is not None  # the ladder alone marks a manager
    denied = snapshot(multikueue_clusters=[multikueue_cluster("w1", True, "Active")])
    denied.deny("fleet_ladder", "cannot read deployments in tpu-fallback-system: 403 Forbidden for u")
    assert build_report(denied).fleet.ladder.state == health.UNKNOWN


def canned_reader(objects: dict, named: dict | None = None, refused: frozenset = frozenset()):
    """ClusterReader.read over canned objects, with no server: `objects` by kind (lists), `named` by (kind, name)
    (gets); a kind or (kind, name) in `refused` answers 403 as the server's RBAC does."""
    from kubernetes import client

    from ops.status import snapshot as snap

    class Canned(snap.ClusterReader):
        def list(self, kind, namespace=None, **selectors):
            if kind in refused:
                raise snap.Unreadable(f"cannot list {snap.plural(kind[1])}: 403 Forbidden for u")
            return copy.deepcopy(objects.get(kind, []))

        def get(self, kind, name, namespace):
            if kind in refused or (kind, name) in refused:
                raise snap.Unreadable(f"cannot get {kind[1]} {namespace}/{name}: 403 Forbidden for u")
            return copy.deepcopy((named or {}).get((kind, name)))

        def pending_positions(self, namespace, local_queue):
            return None

    return Canned(client.ApiClient())


def fleet_reads_refused() -> frozenset:
    from infra.fleet import LADDER_NAME, WATCH_NAME
    from ops.status import snapshot as snap

    return frozenset({snap.MULTIKUEUE_CLUSTER, (snap.DEPLOYMENT, WATCH_NAME), (snap.DEPLOYMENT, LADDER_NAME)})


def platform_objects(checks: list[dict]) -> tuple[dict, dict]:
    from ops.status import snapshot as snap

    found = plan_objects()
    objects = {snap.CLUSTER_QUEUE: found["ClusterQueue"], snap.RESOURCE_FLAVOR: found["ResourceFlavor"],
               snap.ADMISSION_CHECK: checks, snap.LOCAL_QUEUE: found["LocalQueue"]}
    return objects, {(snap.DEPLOYMENT, stack_failover.NAME): found["Deployment"][0]}


def test_a_refused_fleet_read_is_no_problem_where_the_admission_checks_show_no_fleet():
    """A team member on a platform (never a fleet's manager: settings refuse a fleet member with teams, a manager
    has no teams) may not read the fleet's objects; the AdmissionChecks it reads show no MultiKueue check, so no
    fleet can be there: a complete answer, the refusals still in `readable`."""
    objects, named = platform_objects(active(plan_objects()["AdmissionCheck"]))
    report = build_report(canned_reader(objects, named, fleet_reads_refused()).read(NAMESPACE, "tier"))
    assert report.problems == () and report.complete and report.fleet is None
    assert {what for what, ok in report.readable.items() if not ok} == {
        "multikueue_clusters", "fleet_watch", "fleet_ladder"}
    assert "PROBLEMS" not in render_table(report) and "FLEET" not in render_table(report)
    assert report_dict(report)["complete"] is True


def test_a_refused_fleet_read_is_a_problem_where_a_fleet_may_be():
    """On a fleet's manager (a MultiKueue AdmissionCheck), or where the AdmissionChecks cannot be read, a refused
    fleet read leaves the fleet unknown: each refusal is a problem, as before."""
    from infra import fleet as stack_fleet
    from ops.status import snapshot as snap

    multikueue = active([{"apiVersion": stack_kueue.KUEUE_API_VERSION, "kind": "AdmissionCheck",
                          "metadata": {"name": stack_fleet.ADMISSION_CHECK},
                          "spec": {"controllerName": stack_fleet.MULTIKUEUE_CONTROLLER}}])
    objects, named = platform_objects(multikueue)
    report = build_report(canned_reader(objects, named, fleet_reads_refused()).read(NAMESPACE, "tier"))
    assert len(report.problems) == 3 and not report.complete
    assert "cannot list MultiKueueClusters: 403 Forbidden for u" in report.problems
    objects, named = platform_objects([])
    report = build_report(canned_reader(objects, named, fleet_reads_refused() | {snap.ADMISSION_CHECK}).read(
        NAMESPACE, "tier"))
    assert len(report.problems) == 4 and not report.complete


def test_whoever_may_read_the_fleets_objects_sees_them_whatever_the_admission_checks_say():
    """An admin's reading is unchanged: a fleet watch there is shown even with no MultiKueue check (a manager
    half-created or half-destroyed)."""
    from infra.fleet import WATCH_NAME
    from ops.status import snapshot as snap

    watch = deployment_with(ready=1)
    watch["metadata"]["name"] = WATCH_NAME
    objects, named = platform_objects(active(plan_objects()["AdmissionCheck"]))
    report = build_report(canned_reader(objects, {**named, (snap.DEPLOYMENT, WATCH_NAME): watch}).read(NAMESPACE, "t"))
    assert report.complete and report.fleet is not None and report.fleet.watch.state == health.HEALTHY
    assert all(report.readable.values())


def test_a_client_read_again_gets_one_timeout_wrapper_not_one_more_each_time():
    """A --watch, or a test polling the tier, builds a reader per read over one client: one wrapper, the newest
    timeout (a wrapper per read would nest without end)."""
    from kubernetes import client

    from ops.status.snapshot import ClusterReader

    api_client = client.ApiClient()
    ClusterReader(api_client, 5)
    wrapped = api_client.rest_client.request
    for _ in range(3):
        ClusterReader(api_client, 7)
    assert api_client.rest_client.request is wrapped and api_client.rest_client.status_request_timeout == 7


def test_node_pools_are_those_of_the_pods_on_nodes_and_unknown_without_nodes():
    pods = [{"metadata": {"name": "head"}, "spec": {"nodeName": "gke-a-default-pool-1"}},
            {"metadata": {"name": "w0"}, "spec": {"nodeName": "gke-a-on-demand-pool-1"}},
            {"metadata": {"name": "w1"}, "spec": {"nodeName": "gke-a-on-demand-pool-2"}},
            {"metadata": {"name": "pending"}, "spec": {}},
            {"metadata": {"name": "going", "deletionTimestamp": ago(1)}, "spec": {"nodeName": "gke-a-spot-pool-1"}}]
    pools = {"gke-a-default-pool-1": "default-pool", "gke-a-on-demand-pool-1": "on-demand-pool",
             "gke-a-on-demand-pool-2": "on-demand-pool", "gke-a-spot-pool-1": "spot-pool"}
    assert jobs.node_pools_of(pods, pools) == ("default-pool", "on-demand-pool")
    assert jobs.node_pools_of(pods[3:4], pools) == ()
    assert jobs.node_pools_of(pods[:1], {}) == ("?",)  # a node gone since the pod was read


def test_a_finished_rayjob_says_how_long_it_ran():
    rayjob = {"status": {"startTime": "2026-12-01T10:00:00Z", "endTime": "2026-12-01T11:02:03Z"}}
    started, ended = jobs.run_span(rayjob)
    assert (ended - started).total_seconds() == 3723
    assert jobs.run_span({"status": {"startTime": "2026-12-01T10:00:00Z"}})[1] is None  # still running
    assert jobs.run_span({}) is None


# ---- scheduling goodput (failover/api/goodput.py) ------------------------------------------------------------------
def test_each_jobs_goodput_in_the_table_and_its_breakdown_in_json():
    """A job submitted 600 s ago, admitted at 540 s ago and ready since 480 s ago has run 480 of 600 s: 80%, all of it
    recorded. A job moved off a stocked-out on-demand rung 300 s ago (reactivated 298 s ago) and holding DWS quota
    since 290 s ago has run none of it; the 300 s before its move are estimated (~)."""
    running = rayjob("a-running")
    move = Move("on-demand", "dws", "user-queue-dws", STOCKOUT, ago(300))
    moved = rayjob("b-moved", queue="user-queue-dws", annotations={
        FAILOVER_ANNOTATION: move.done().to_json(), MOVES_ANNOTATION: with_move_recorded(None, move)})
    moved_workload = workload(moved, reserved(290) + [condition("Requeued", True, "Reactivated", 298)], flavor="dws",
                              checks=[{"name": "dws-prov", "state": "Pending", "lastTransitionTime": ago(290)}],
                              cluster_queue="cluster-queue-dws")
    report = build_report(dev_snapshot(rayjobs=[running, moved], workloads=[
        workload(running, admitted(540, pods_ready=480), flavor="on-demand"), moved_workload]))
    text = render_table(report)
    rows = {row["NAME"]: row for row in columns(text.split("JOBS (namespace default)\n")[1].split("\n\n")[0])}
    assert (rows["a-running"]["GOODPUT"], rows["b-moved"]["GOODPUT"]) == ("80%", "~0%")
    assert "~n%: part of that time is estimated (docs/goodput.md" in text

    found = {j["name"]: j["goodput"] for j in json.loads(render_json(report))["jobs"]}
    assert found["a-running"] == {
        "scheduling": 0.8, "submittedAt": ago(600), "until": ago(0), "elapsedSeconds": 600,
        "seconds": {"quota_wait": 60, "capacity_wait": 0, "starting": 60, "running": 480, "broken_slice": 0,
                    "moving": 0, "unrecorded": 0},
        "byRung": [{"state": "quota_wait", "rung": "on-demand", "seconds": 60},
                   {"state": "starting", "rung": "on-demand", "seconds": 60},
                   {"state": "running", "rung": "on-demand", "seconds": 480}],
        "estimatedSeconds": 0,
        "timeline": [{"state": "quota_wait", "rung": "on-demand", "from": ago(600), "to": ago(540), "seconds": 60,
                      "exact": True},
                     {"state": "starting", "rung": "on-demand", "from": ago(540), "to": ago(480), "seconds": 60,
                      "exact": True},
                     {"state": "running", "rung": "on-demand", "from": ago(480), "to": ago(0), "seconds": 480,
                      "exact": True}]}
    assert found["b-moved"]["scheduling"] == 0 and found["b-moved"]["estimatedSeconds"] == 300
    assert [(s["state"], s["rung"], s["seconds"], s["exact"]) for s in found["b-moved"]["timeline"]] == [
        ("capacity_wait", "on-demand", 300, False), ("moving", "dws", 2, True), ("quota_wait", "dws", 8, True),
        ("capacity_wait", "dws", 290, True)]


def test_a_job_whose_workload_cannot_be_read_has_no_goodput_rather_than_a_wrong_one():
    report = build_report(dev_snapshot(rayjobs=[rayjob("a-running")], unreadable={"workloads": "403"}))
    assert report.jobs[0].state == jobs.UNKNOWN and report.jobs[0].goodput is None
    assert json.loads(render_json(report))["jobs"][0]["goodput"] is None
