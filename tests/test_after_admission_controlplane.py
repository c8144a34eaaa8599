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


def test_every_pool_s_nodes_carry_its_template(tier):
    """The nodes the stand-in made are the plan's templates, as the API server and KWOK keep them (labels, taints,
    allocatable; Ready)."""
    plane, plan = tier
    templates = {t.pool: t for t in gke.node_templates(plan)}
    nodes = plane.kube.list("v1", "Node")
    assert nodes
    for node in nodes:
        template = templates[node["metadata"]["labels"][gke.NODEPOOL_LABEL]]
        assert all(node["metadata"]["labels"].get(k) == v for k, v in template.labels.items())
        assert [dict(t) for t in template.taints] == [
            {k: t.get(k, "") for k in ("key", "value", "effect")} for t in node["spec"].get("taints") or []
            if t["key"] != "node.kubernetes.io/not-ready"]
        assert {k: node["status"]["allocatable"][k] for k in template.allocatable} == dict(template.allocatable)
        assert condition(node, "Ready") == "True"


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
