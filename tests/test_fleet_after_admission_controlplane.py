"""Plan C after admission, for real: the fleet's manager and its two members each run KubeRay, kube-scheduler and
nodes shaped like their own plans' pools (tests/controlplane/runtime.py).

What only real parts can show: a member's KubeRay runs the copy MultiKueue creates there, on the member's DWS slice,
to its end, and the manager's KubeRay leaves the manager's RayJob alone (`spec.managedBy:
kueue.x-k8s.io/multikueue`): a KubeRay that did not honour it would start a second run on the manager, which has no
TPU pool. GCE capacity (DWS provisioning) and the Ray head's Jobs API are played, as in the other tiers.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from infra.fleet_member import FLEET_NAMESPACE
from tests.controlplane import jobs
from tests.controlplane.fleet_tier import MEMBERS, REACTION, W1, W2, FleetStacks, applied_fleet, fleet_plan, member_plan
from tests.controlplane.kube import condition, wait_for

pytestmark = pytest.mark.controlplane

RAY_CLUSTER = jobs.RAYCLUSTER


@pytest.fixture(scope="module")
def fleet(request) -> Iterator[FleetStacks]:
    members = {m: member_plan(m) for m in MEMBERS}
    with applied_fleet(fleet_plan(members), members, keep_logs=lambda: request.session.testsfailed > 0,
                       nodes=True) as state:
        yield state


def test_a_members_kuberay_runs_the_copy_to_its_end_and_the_managers_leaves_its_rayjob_alone(fleet):
    job = "fleet-real-run"
    workload = fleet.submit(job)
    requests = fleet.wait_requests_everywhere(workload)
    fleet.provision(W2, requests[W2])  # region 2's DWS slice comes; region 1's never does

    # Region 2's KubeRay runs the copy: its workers on region 2's DWS slice, its head and submitter on default-pool.
    placed = wait_for(lambda: jobs.pools_of(fleet.kubes[W2], FLEET_NAMESPACE, job), REACTION,
                      f"{job}'s pods Running in {W2}")
    dws_pools = [t.pool for t in fleet.tier.members[W2].after.gke.templates if t.queued]
    assert placed["head"] == placed["submitter"] == ["default-pool"] and len(placed["worker"]) == 4
    assert set(placed["worker"]) <= set(dws_pools), placed
    jobs.wait_pods_ready(fleet.kubes[W2], FLEET_NAMESPACE, job, REACTION)
    wait_for(lambda: fleet.copy_in(W1, workload) is None, REACTION, f"{W1}'s copy gone")

    # Nothing runs anywhere else: no RayCluster or pod on the manager, none in region 1.
    assert jobs.pools_of(fleet.kubes[W2], FLEET_NAMESPACE, job)  # still running there
    for kube, where in ((fleet.manager, "the manager"), (fleet.kubes[W1], W1)):
        assert not kube.list(*RAY_CLUSTER, namespace=FLEET_NAMESPACE), where
        assert not kube.list("v1", "Pod", namespace=FLEET_NAMESPACE), where
    manager_job = fleet.manager.get(*jobs.RAYJOB, job, FLEET_NAMESPACE)
    assert manager_job["spec"]["managedBy"] == "kueue.x-k8s.io/multikueue"

    # The Ray job ends in region 2: its KubeRay completes the copy, MultiKueue mirrors it on the manager, Kueue
    # finishes the manager's Workload, and region 2's slice goes.
    fleet.tier.members[W2].after.ray_head.finish(FLEET_NAMESPACE, job, "SUCCEEDED")
    done = wait_for(lambda: (r := fleet.manager.get(*jobs.RAYJOB, job, FLEET_NAMESPACE)) and (
        r.get("status") or {}).get("jobDeploymentStatus") == "Complete" and r, REACTION,
                    "the manager's RayJob Complete (mirrored from region 2)")
    assert done["status"]["jobStatus"] == "SUCCEEDED"
    wait_for(lambda: condition(fleet.manager_workload(workload), "Finished") == "True", REACTION,
             "the manager's Workload Finished")
    assert not fleet.manager.list(*RAY_CLUSTER, namespace=FLEET_NAMESPACE)  # never one on the manager
    wait_for(lambda: not any(fleet.tier.members[W2].after.gke.nodes_of(pool) for pool in dws_pools), REACTION,
             f"{W2}'s DWS slice gone")
    fleet.finish(job)
