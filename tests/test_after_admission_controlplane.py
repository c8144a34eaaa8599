"""After admission, for real: the dev stack's jobs run to their end on real KubeRay, kube-scheduler and KWOK nodes
shaped like the plan's GKE pools (testbed/runtime.py, gke.py).

What is played: GCE capacity (the autoscaler stand-in grows a pool for a pod the scheduler could not place; a DWS
slice appears when the test marks its ProvisioningRequest Provisioned) and the Ray head's Jobs API (the test ends a
job). Everything else is the real thing: Kueue admits, KubeRay makes the RayCluster, its pods and the submitter Job,
the scheduler places each pod on a node, Kueue reads PodsReady from KubeRay's status, KubeRay and the job controller
finish the run, Kueue frees the quota.

This is the tutorial's own check (`kubectl logs job/rayjob-tpu-v6e-dws-1`: `Job ... succeeded`) for a job on plan A
and one on plan B, on the tier.
"""

from __future__ import annotations

import math
import time

import pytest

from ops.status.report import build_report
from ops.status.snapshot import ClusterReader
from testbed import gke, jobs
from testbed.cluster import ControlPlane
from testbed.kube import condition, wait_for
from testbed.stack import creation_order, deploy, destroy, release_values
from tests.conftest import plan_for

pytestmark = pytest.mark.controlplane

NAMESPACE = "default"
# Generous: four test files run at once on two cores; nothing here measures time.
REACTION = 90
RAY_CLUSTER = jobs.RAYCLUSTER
BATCH_JOB = ("batch/v1", "Job")


@pytest.fixture(scope="module")
def tier(request):
    plan = plan_for("dev")
    plane = ControlPlane(release_values(plan), nodes_of=plan).start()
    try:
        yield plane, plan
    finally:
        failed = request.session.testsfailed > 0
        plane.stop(keep_workdir=failed)
        if failed:
            print(f"\nafter-admission tier logs kept in {plane.supervisor.logs}")


def rayjob_names(plan) -> list[str]:
    return [m["metadata"]["name"] for m in plan.kubernetes_manifests() if m["kind"] == "RayJob"]


def status_of(kube, rayjob: str):
    """The job as `ops status` reports it, read from the tier (admin: Nodes readable)."""
    report = build_report(ClusterReader(kube.api_client).read(NAMESPACE, "tier"))
    (view,) = [job for job in report.jobs if job.name == rayjob]
    return view


def wait_finished(kube, rayjob: str) -> dict:
    def finished():
        job = kube.get(*jobs.RAYJOB, rayjob, NAMESPACE)
        workload = jobs.workload_of(kube, NAMESPACE, rayjob)
        done = job and (job.get("status") or {}).get("jobDeploymentStatus") in ("Complete", "Failed")
        return job if done and condition(workload, "Finished") == "True" else None
    return wait_for(finished, REACTION, f"{rayjob}: done and its Workload Finished")


def placed(kube, rayjob: str) -> dict[str, list[str]]:
    """role -> the pools its pods run on, once all of them are Running and Ready."""
    return wait_for(lambda: jobs.pools_of(kube, NAMESPACE, rayjob), REACTION, f"{rayjob}: every pod Running")


def pods_of(kube, rayjob: str) -> dict[str, list[dict]]:
    return jobs.pods_of(kube, NAMESPACE, rayjob)


def wait_pods_ready(kube, rayjob: str) -> dict:
    return jobs.wait_pods_ready(kube, NAMESPACE, rayjob, REACTION)


def test_the_tutorial_s_two_jobs_run_on_plan_a_and_plan_b_to_their_end(tier):
    plane, plan = tier
    kube, after = plane.kube, plane.after
    first, second = rayjob_names(plan)
    deploy(kube, plan, after_create=jobs.judged_in_order(kube))

    # Plan A: admitted on on-demand at once; the autoscaler grows the pool by one whole 4x4 slice.
    assert jobs.decision(kube, NAMESPACE, first).flavor == "on-demand"
    wait_pods_ready(kube, first)
    assert placed(kube, first) == {"head": ["default-pool"], "worker": ["on-demand-pool"] * 4,
                                   "submitter": ["default-pool"]}
    workers = pods_of(kube, first)["worker"]
    assert len({p["spec"]["nodeName"] for p in workers}) == 4  # one worker per host of the slice
    assert len(after.gke.nodes_of("on-demand-pool")) == 4
    # `ops status` from these real pods: all of the Workload's pods ready (head, 4 workers, submitter), on which pools.
    running = status_of(kube, first)
    assert running.size.pods == 6 and running.pods_ready == 6, (running.pods_ready, running.size)
    assert running.pools == ("default-pool", "on-demand-pool") and running.run_seconds is None

    # Plan B: on-demand is full, so Kueue reserves dws and asks DWS; nothing runs until the slice is provisioned.
    request = jobs.wait_provisioning_request(kube, NAMESPACE, second)
    assert not pods_of(kube, second)["worker"]
    jobs.mark_provisioned(kube, request, "tier-resize-1")
    wait_pods_ready(kube, second)
    assert placed(kube, second) == {"head": ["default-pool"], "worker": ["dws-pool"] * 4,
                                    "submitter": ["default-pool"]}
    dws_nodes = {n["metadata"]["name"]: n for n in kube.list("v1", "Node")
                 if n["metadata"]["labels"][gke.NODEPOOL_LABEL] == "dws-pool"}
    assert {n["metadata"]["labels"].get(gke.PROVISIONING_REQUEST_LABEL) for n in dws_nodes.values()} == {
        "tier-resize-1"}
    assert all(p["spec"]["nodeName"] in dws_nodes for p in pods_of(kube, second)["worker"])
    assert_as_declared(plan, list(dws_nodes.values()))  # flex-start and queued: checked while the slice is here

    # Both end: KubeRay completes each RayJob once the Ray job succeeded and its submitter exited 0; Kueue marks the
    # Workload Finished and frees the quota; KubeRay deletes the RayCluster (shutdownAfterJobFinishes); the slices go.
    for rayjob in (first, second):
        after.ray_head.finish(NAMESPACE, rayjob, "SUCCEEDED")
    for rayjob in (first, second):
        job = wait_finished(kube, rayjob)
        assert (job["status"]["jobDeploymentStatus"], job["status"]["jobStatus"]) == ("Complete", "SUCCEEDED")
        submitter = kube.get(*BATCH_JOB, rayjob, NAMESPACE)
        assert condition(submitter, "Complete") == "True"  # `kubectl logs job/<name>` is this Job's pod
        done = status_of(kube, rayjob)
        assert done.words == "finished (Succeeded)" and done.run_seconds is not None and done.run_seconds >= 0
    wait_for(lambda: not kube.list(*RAY_CLUSTER, namespace=NAMESPACE), REACTION, "the RayClusters deleted")
    wait_for(lambda: not [p for p in kube.list("v1", "Pod", namespace=NAMESPACE)
                          if (p["metadata"].get("labels") or {}).get("ray.io/cluster")], REACTION, "Ray pods gone")
    wait_for(lambda: not after.gke.nodes_of("on-demand-pool") and not after.gke.nodes_of("dws-pool"), REACTION,
             "both TPU pools shrunk to zero")
    assert len(after.gke.nodes_of("default-pool")) == 3  # the CPU pool does not autoscale

    # The quota is free: the next job is admitted on plan A and runs there.
    started = time.monotonic()
    kube.create(jobs.dev_rayjob("after-both"))
    assert jobs.wait_decided(kube, NAMESPACE, "after-both") and jobs.decision(
        kube, NAMESPACE, "after-both").flavor == "on-demand"
    wait_pods_ready(kube, "after-both")
    print(f"submission -> PodsReady on plan A (slice scale-up {after.gke.scale_up_seconds} s): "
          f"{time.monotonic() - started:.1f} s")
    assert placed(kube, "after-both")["worker"] == ["on-demand-pool"] * 4
    assert not after.gke.problems, after.gke.problems[-5:]


# What GKE puts on the nodes of a pool, written here from GKE's documentation and read against the plan's own cluster
# and NodePool resources, not from the stand-in that made the tier's nodes (testbed/gke.py):
# Ref: https://cloud.google.com/kubernetes-engine/docs/how-to/creating-managing-labels#automatically-applied-labels
# Ref: https://cloud.google.com/kubernetes-engine/docs/how-to/tpus (the TPU labels and the google.com/tpu taint)
# Ref: https://cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest (the gke-queued taint)
TPU_ACCELERATORS = {"ct6e": "tpu-v6e-slice", "ct5lp": "tpu-v5-lite-podslice", "ct5p": "tpu-v5p-slice"}
# Allocatable for the dev plan's machines, worked out by hand from GKE's reservations: CPU 6 % of the first core, 1 %
# of the second, 0.5 % of the next two, 0.25 % above four; memory 25 % of the first 4 GiB, 20 % of the next 4, 10 % of
# the next 8, 6 % of the next 112, 2 % above 128, plus a 100 MiB eviction threshold; 110 pods.
#   n2-standard-16 (16 vCPU, 64 GiB): 60 + 10 + 10 + 12 * 2.5 = 110m; 1 + 0.8 + 0.8 + 2.88 = 5.48 GiB + 100 MiB = 5712Mi
#   ct6e-standard-4t (180 vCPU, 720 GiB, 4 chips): 80 + 176 * 2.5 = 520m; 9.32 + 11.84 = 21.16 GiB + 100 MiB = 21768Mi.
# Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/plan-node-sizes#cpu_reservations
ALLOCATABLE = {"n2-standard-16": {"cpu": "15890m", "memory": "59824Mi", "pods": "110"},
               "ct6e-standard-4t": {"cpu": "179480m", "memory": "715512Mi", "pods": "110", "google.com/tpu": "4"}}
TAINT_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "PREFER_NO_SCHEDULE": "PreferNoSchedule", "NO_EXECUTE": "NoExecute"}
# GKE's labels of a provisioning model: present (`true`) on a pool that declares it, absent on any other.
MODEL_LABELS = {"spot": "cloud.google.com/gke-spot", "flexStart": "cloud.google.com/gke-flex-start"}


def declared_pools(plan) -> dict[str, tuple[dict, dict]]:
    """pool -> (its GKE resource's inputs, its nodeConfig): the pool GKE makes from the cluster's own nodeConfig
    (`default-pool`) and each NodePool."""
    cluster = plan.only("gcp:container/cluster:Cluster").inputs
    pools = {"default-pool": (cluster, cluster["nodeConfig"])}
    for pool in plan.of_type("gcp:container/nodePool:NodePool"):
        pools[pool.inputs["name"]] = (pool.inputs, pool.inputs["nodeConfig"])
    return pools


def assert_as_declared(plan, nodes: list[dict]) -> None:
    """Each node carries what its pool declares in the plan and what GKE adds for it (labels, taints, allocatable),
    and is Ready."""
    pools, cluster_zone = declared_pools(plan), plan.only("gcp:container/cluster:Cluster").inputs["location"]
    for node in nodes:
        name, labels = node["metadata"]["name"], node["metadata"]["labels"]
        inputs, config = pools[labels["cloud.google.com/gke-nodepool"]]
        zone = inputs.get("location") or cluster_zone  # a zonal cluster's location is its default pool's zone
        wanted = {**(config.get("labels") or {}), "node.kubernetes.io/instance-type": config["machineType"],
                  "topology.kubernetes.io/zone": zone, "topology.kubernetes.io/region": zone.rsplit("-", 1)[0]}
        taints = {(t["key"], TAINT_EFFECTS[t["effect"]]) for t in config.get("taints") or []}
        family = config["machineType"].split("-")[0]
        if family in TPU_ACCELERATORS:
            wanted |= {"cloud.google.com/gke-tpu-accelerator": TPU_ACCELERATORS[family],
                       "cloud.google.com/gke-tpu-topology": inputs["placementPolicy"]["tpuTopology"]}
            taints.add(("google.com/tpu", "NoSchedule"))
        if (inputs.get("queuedProvisioning") or {}).get("enabled"):
            taints.add(("cloud.google.com/gke-queued", "NoSchedule"))
        for field, label in MODEL_LABELS.items():
            assert labels.get(label) == ("true" if config.get(field) else None), (name, label)
        assert {k: labels.get(k) for k in wanted} == wanted, name
        node_taints = [t for t in node["spec"].get("taints") or [] if t["key"] != "node.kubernetes.io/not-ready"]
        assert {(t["key"], t["effect"]) for t in node_taints} == taints, (name, node_taints)
        assert all(t.get("value") == "present" for t in node_taints if t["key"] == "google.com/tpu"), node_taints
        assert {k: node["status"]["allocatable"].get(k) for k in ALLOCATABLE[config["machineType"]]} == ALLOCATABLE[
            config["machineType"]], name
        assert condition(node, "Ready") == "True", name


def test_every_pool_s_nodes_carry_its_template(tier):
    """The nodes on the tier are what the plan's pools declare, as GKE makes them (labels, taints, allocatable;
    Ready), and as many as GKE would have: the default pool's fixed size and one whole slice of the on-demand pool,
    the one job running (after-both); the DWS pool shrank to zero with its job (its nodes were checked the same way
    while they ran)."""
    plane, plan = tier
    nodes = plane.kube.list("v1", "Node")
    count = {}
    for node in nodes:
        pool = node["metadata"]["labels"]["cloud.google.com/gke-nodepool"]
        count[pool] = count.get(pool, 0) + 1
    cluster = plan.only("gcp:container/cluster:Cluster").inputs
    on_demand, config = declared_pools(plan)["on-demand-pool"]
    chips = math.prod(int(side) for side in on_demand["placementPolicy"]["tpuTopology"].split("x"))
    hosts = chips // int(ALLOCATABLE[config["machineType"]]["google.com/tpu"])  # a 4x4 slice: 4 hosts of 4 chips
    assert count == {"default-pool": int(cluster["initialNodeCount"]), "on-demand-pool": hosts}
    assert hosts <= int(on_demand["autoscaling"]["maxNodeCount"])
    assert_as_declared(plan, nodes)


def test_destroy_leaves_no_pod_ray_cluster_job_or_tpu_node(tier):
    """`pulumi destroy` after the tutorial's life: the plan's objects in reverse order, as pulumi-kubernetes
    deletes them. The job a user submitted by hand is the user's to delete first (the plan does not know it)."""
    plane, plan = tier
    kube, after = plane.kube, plane.after
    for job in kube.list(*jobs.RAYJOB, namespace=NAMESPACE):
        if job["metadata"]["name"] not in rayjob_names(plan):
            kube.delete(*jobs.RAYJOB, job["metadata"]["name"], NAMESPACE, propagation="Background")
    result = destroy(kube, creation_order(plan), timeout=60)
    assert result.stuck == {}, result.stuck
    for kind in (jobs.RAYJOB, RAY_CLUSTER, BATCH_JOB, jobs.WORKLOAD, ("v1", "Pod")):
        wait_for(lambda k=kind: not kube.list(*k, namespace=NAMESPACE), REACTION, f"no {kind[1]} left")
    wait_for(lambda: not any(after.gke.nodes_of(t.pool) for t in after.gke.templates if t.tpu), REACTION,
             "no TPU node left")
