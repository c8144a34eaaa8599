"""`pulumi destroy` on the real tier: a RayJob waiting on its DWS request, and what a wrong order does.

pulumi-kubernetes deletes with foreground propagation unless `pulumi.com/deletionPropagationPolicy` says
otherwise, and waits up to 300 s per object. Measured on Kueue 0.19.2: a RayJob whose Workload waits on a
ProvisioningRequest can hang in foreground deletion (Kueue re-creates the request while the garbage collector
deletes it), so our RayJobs are deleted in the background (../shared/notes/real-control-plane.md).
"""

from __future__ import annotations

import time

import pytest

from infra import kueue as stack_kueue
from testbed import jobs
from testbed.cluster import ControlPlane
from testbed.kube import wait_for
from testbed.stack import HELM_RELEASE, deletion_policy, deploy, destroy, release_values
from tests.conftest import plan_for

pytestmark = pytest.mark.controlplane

DESTROY_RUNS = 4
RESOURCE_IN_USE = "kueue.x-k8s.io/resource-in-use"


def _deploy_until_job_waits_on_its_request(kube):
    """The dev stack with job 2 holding `dws` quota while its ProvisioningRequest is pending."""
    plan = plan_for()

    deployed = deploy(kube, plan, after_create=jobs.judged_in_order(kube))
    waiting = plan.outputs["trainingJobs"][1]
    request = jobs.wait_provisioning_request(kube, "default", waiting)
    return deployed, waiting, request


def test_rayjobs_are_deleted_in_the_background():
    for job in (m for m in plan_for().kubernetes_manifests() if m["kind"] == "RayJob"):
        assert deletion_policy(job) == "Background"


def test_destroy_with_a_job_waiting_on_dws_never_hangs(control_plane):
    kube = control_plane.kube
    rayjob_seconds = []
    for _ in range(DESTROY_RUNS):
        deployed, waiting, request = _deploy_until_job_waits_on_its_request(kube)
        assert request["spec"]["provisioningClassName"] == stack_kueue.PROVISIONING_CLASS
        result = destroy(kube, deployed.steps, timeout=30)
        assert result.stuck == {}, result
        rayjob_seconds.append(result.seconds[f"RayJob default/{waiting}"])
        wait_for(lambda: kube.list(*jobs.PROVISIONING_REQUEST, namespace="default") == [], 30,
                 "no ProvisioningRequest left")
        wait_for(lambda: kube.list(*jobs.WORKLOAD, namespace="default") == [], 30, "no Workload left")
    print(f"RayJob waiting on DWS deleted in {rayjob_seconds} s")
    assert max(rayjob_seconds) < 10


def test_kueue_gone_before_its_objects_leaves_finalizers_then_the_right_order_cleans_up():
    """Why every queue object depends on the release: without Kueue their finalizers stay."""
    plan = plan_for()
    release = plan.only(HELM_RELEASE)
    queue_kinds = {"ClusterQueue", "LocalQueue", "ResourceFlavor", "AdmissionCheck", "ProvisioningRequestConfig",
                   "RayJob"}
    for resource in plan.resources:
        if resource.type.split(":")[-1] in queue_kinds:
            assert release.urn in plan.ancestors_and_dependencies(resource), resource.name

    plane = ControlPlane(release_values(plan)).start()
    try:
        kube = plane.kube
        deployed, _, _ = _deploy_until_job_waits_on_its_request(kube)
        plane.stop_kueue()  # as if the release were uninstalled first
        wrong = destroy(kube, deployed.steps, timeout=3)
        stuck_finalizers = {label: left["finalizers"] for label, left in wrong.stuck.items()}
        for label in ("ClusterQueue cluster-queue", "ResourceFlavor on-demand", "AdmissionCheck dws-prov"):
            assert RESOURCE_IN_USE in (stuck_finalizers.get(label) or []), stuck_finalizers

        # Kueue back: the objects go, then the release itself (webhooks, CRDs) and its namespace.
        plane.restart_kueue()
        started = time.monotonic()
        for step in deployed.steps:
            if step.manifest:
                wait_for(lambda s=step: kube.get(*s.ref()) is None, 60, f"{step.label} gone")
        plane.uninstall_kueue()
        assert kube.get("v1", "Namespace", stack_kueue.NAMESPACE) is None
        print(f"recovered in {time.monotonic() - started:.1f} s")
    finally:
        plane.stop()
