"""Every stack's Kubernetes objects on a real kube-apiserver 1.36 and Kueue 0.19.2 (testbed/).

For each shipped stack and two made-up configs: the objects apply in the program's dependency order with strict
field validation; the queues go Active; each RayJob lands where the plans say (plan A while its slices last,
then plan B through a ProvisioningRequest, then it waits); a provisioned DWS job is admitted onto its nodes; and
destroy, in reverse order with pulumi-kubernetes' propagation, leaves nothing behind.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from failover.api import TPU_RESOURCE
from infra import kueue as stack_kueue
from infra.offline import Plan, namespaced
from infra.rungs import RUNG_KINDS
from infra.settings import DEFAULTS
from infra.tpu import lookup_slice
from testbed import jobs
from testbed.kube import condition, wait_for
from testbed.stack import Deployed, deploy, destroy
from tests.conftest import FLEET_MEMBER_STACKS, SHIPPED_STACKS, config_with, plan_for
from tests.test_workloads import MAX_RAY_WORKER_GROUPS
from workloads.settings import WORKLOAD_DEFAULTS

pytestmark = pytest.mark.controlplane

# name -> (stack file, config overrides). The fleet members are deployed and destroyed by the fleet's tier test
# (tests/test_fleet_controlplane.py), with their fleet objects judged there too: not twice.
SCENARIOS = {
    **{stack: (stack, {}) for stack in SHIPPED_STACKS if stack not in FLEET_MEMBER_STACKS},
    # A third job finds both plans full and waits; the jobs live in a namespace of their own.
    "dev-3-jobs-own-namespace": ("dev", {"workloads": {"jobs": 3, "namespace": "research"}}),
    # Two slices per plan, five jobs: two on plan A, two through DWS, one waits.
    "multi-slice": ("dev", {"onDemand": {"nodePool": "on-demand-pool", "maxSlices": 2},
                            "flexStart": {"nodePool": "dws-pool", "maxSlices": 2}, "workloads": {"jobs": 5}}),
    # The whole ladder: two reserved slices, then on-demand, Spot and DWS; the sixth job waits.
    "ladder": ("dev", {"reservation": {"reservations": [
                           {"name": "team-a-v6e", "slices": 1},
                           {"name": "projects/shared-capacity/reservations/pool-v6e", "slices": 1}]},
                       "spot": {"maxSlices": 1}, "workloads": {"jobs": 6}}),
}
DECISION_TIMEOUT = 30.0
DESTROY_BOUND = 30.0  # seconds per object; pulumi-kubernetes itself would wait 300


@dataclass
class Scenario:
    name: str
    plan: Plan
    config: dict[str, str]
    deployed: Deployed

    def value(self, key: str) -> dict:
        """An object key as the program reads it: the stack's fields over the defaults."""
        defaults = WORKLOAD_DEFAULTS if key == "workloads" else DEFAULTS[key]
        return {**defaults, **json.loads(self.config.get(namespaced(key), "{}"))}

    @property
    def namespace(self) -> str:
        return self.value("workloads")["namespace"]

    @property
    def job_names(self) -> list[str]:
        return list(self.plan.outputs["trainingJobs"])

    @property
    def slice_hosts(self) -> int:
        tpu = self.value("tpu")
        return lookup_slice(tpu["machineType"], tpu["topology"]).hosts

    def slices(self, key: str) -> int:
        raw = self.value(key)
        return sum(r["slices"] for r in raw["reservations"]) if "reservations" in raw else raw["maxSlices"]

    def expected_flavors(self) -> list[str | None]:
        """From the stack config alone: each rung's slices in the ladder's order, then nothing (a slice a job)."""
        order = json.loads(self.config.get(namespaced("rungOrder"), "[]")) or list(RUNG_KINDS)
        flavors = [RUNG_KINDS[key].flavor for key in order for _ in range(self.slices(key))]
        return (flavors + [None] * len(self.job_names))[:len(self.job_names)]


@pytest.fixture(scope="class", params=sorted(SCENARIOS))
def scenario(request, control_plane):
    stack, overrides = SCENARIOS[request.param]
    plan = plan_for(stack, overrides or None)
    kube = control_plane.kube

    deployed = deploy(kube, plan, after_create=jobs.judged_in_order(kube, DECISION_TIMEOUT))
    current = Scenario(request.param, plan, config_with(overrides, stack), deployed)
    yield current
    if not getattr(current, "destroyed", False):
        destroy(kube, deployed.steps)  # a failed test still leaves a clean tier for the next scenario


class TestStackOnRealKueue:
    def test_queues_and_checks_go_active(self, scenario, control_plane):
        kube = control_plane.kube
        kinds = {"ClusterQueue", "LocalQueue", "AdmissionCheck"}
        queue_objects = [s for s in scenario.deployed.steps if s.manifest and s.manifest["kind"] in kinds]
        assert {s.manifest["kind"] for s in queue_objects} >= {"ClusterQueue", "LocalQueue"}
        for step in queue_objects:
            wait_for(lambda s=step: condition(kube.get(*s.ref()), "Active") == "True", 30,
                     f"{step.label} Active")

    def test_jobs_land_on_plan_a_then_plan_b_then_wait(self, scenario, control_plane):
        kube = control_plane.kube
        expected = scenario.expected_flavors()
        # status.admissionChecks is written a reconcile after QuotaReserved: poll until the picture settles.
        def settled():
            found = [jobs.decision(kube, scenario.namespace, job) for job in scenario.job_names]
            complete = all((d.flavor != "dws") or d.checks for d in found)
            return (found,) if complete else None  # a tuple: a stack without jobs settles at once
        (decisions,) = wait_for(settled, DECISION_TIMEOUT, "admission checks on the DWS jobs")
        assert [d.flavor for d in decisions] == expected, decisions
        for want, got in zip(expected, decisions):
            rayjob = kube.get(*jobs.RAYJOB, got.job, scenario.namespace)
            if want in ("reservation", "on-demand", "spot"):  # rungs without a check: admitted at once
                assert got.admitted and got.checks == {}, got
                rayjob = wait_for(lambda j=got.job: (r := kube.get(*jobs.RAYJOB, j, scenario.namespace))
                                  and not jobs.suspended(r) and r, 10, f"{got.job} unsuspended")
                spec = jobs.worker_template(rayjob)["spec"]
                assert spec["nodeSelector"]["tpu-fallback/capacity"] == want
                if want == "spot":  # what the Spot flavor adds: GKE's Spot label and our pools' taint
                    assert spec["nodeSelector"]["cloud.google.com/gke-spot"] == "true"
                    assert {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true",
                            "effect": "NoSchedule"} in spec["tolerations"]
            elif want == "dws":
                assert not got.admitted and got.checks == {stack_kueue.ADMISSION_CHECK: "Pending"}, got
                assert jobs.suspended(rayjob)
            else:
                assert got.flavor is None and got.reason == "Pending" and jobs.suspended(rayjob), got

    def test_dws_jobs_get_a_queued_provisioning_request_for_the_tpu_pod_set_only(self, scenario, control_plane):
        kube = control_plane.kube
        dws_jobs = [job for job, flavor in zip(scenario.job_names, scenario.expected_flavors()) if flavor == "dws"]
        for job in dws_jobs:
            request = jobs.wait_provisioning_request(kube, scenario.namespace, job)
            spec = request["spec"]
            assert spec["provisioningClassName"] == stack_kueue.PROVISIONING_CLASS
            (pod_set,) = spec["podSets"]  # not the Ray head nor the submitter: they run on default-pool
            assert pod_set["count"] == scenario.slice_hosts
            template = kube.get("v1", "PodTemplate", pod_set["podTemplateRef"]["name"], scenario.namespace)
            (container,) = template["template"]["spec"]["containers"]
            assert TPU_RESOURCE in container["resources"]["requests"]
            assert int(spec["parameters"]["maxRunDurationSeconds"]) == scenario.value("workloads")["maxRunDuration"]
        if not dws_jobs:
            assert kube.list(*jobs.PROVISIONING_REQUEST, namespace=scenario.namespace) == []

    def test_provisioned_dws_job_is_admitted_onto_its_nodes(self, scenario, control_plane):
        kube = control_plane.kube
        dws_jobs = [job for job, flavor in zip(scenario.job_names, scenario.expected_flavors()) if flavor == "dws"]
        for index, job in enumerate(dws_jobs):
            request = jobs.wait_provisioning_request(kube, scenario.namespace, job)
            resize = f"tier-resize-{index}"
            jobs.mark_provisioned(kube, request, resize)
            wait_for(lambda j=job: jobs.decision(kube, scenario.namespace, j).admitted, 20, f"{job} Admitted")
            rayjob = wait_for(lambda j=job: (r := kube.get(*jobs.RAYJOB, j, scenario.namespace))
                              and not jobs.suspended(r) and r, 10, f"{job} unsuspended")
            spec = jobs.worker_template(rayjob)["spec"]
            assert spec["nodeSelector"][jobs.PROVISIONING_REQUEST_LABEL] == resize
            assert spec["nodeSelector"]["tpu-fallback/capacity"] == "dws"
            assert stack_kueue.tolerate_no_schedule(stack_kueue.QUEUED_TAINT_KEY) in spec["tolerations"]
        waiting = [job for job, flavor in zip(scenario.job_names, scenario.expected_flavors()) if flavor is None]
        for job in waiting:  # provisioning someone else's slice frees no quota
            assert jobs.decision(kube, scenario.namespace, job).flavor is None

    def test_destroy_in_reverse_order_leaves_nothing(self, scenario, control_plane):
        kube = control_plane.kube
        result = destroy(kube, scenario.deployed.steps, timeout=DESTROY_BOUND)
        scenario.destroyed = True
        assert result.stuck == {}, result
        for kind in (jobs.WORKLOAD, jobs.PROVISIONING_REQUEST, jobs.RAYJOB):
            assert kube.list(*kind, namespace=scenario.namespace) == []
        for step in scenario.deployed.steps:
            if step.manifest:
                assert kube.get(*step.ref()) is None, step.label


def _without_elastic_annotation(job: dict) -> None:
    del job["metadata"]["annotations"]["kueue.x-k8s.io/elastic-job"]


def _keeps_cluster(job: dict) -> None:
    job["spec"]["shutdownAfterJobFinishes"] = False


def _worker_group_named_head(job: dict) -> None:
    job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["groupName"] = "head"


def _too_many_worker_groups(job: dict) -> None:
    (group,) = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    groups = [{**group, "groupName": f"tpu-{i}"} for i in range(MAX_RAY_WORKER_GROUPS + 1)]
    job["spec"]["rayClusterSpec"]["workerGroupSpecs"] = groups


def _uses_existing_cluster(job: dict) -> None:
    job["spec"]["clusterSelector"] = {"ray.io/cluster": "shared"}


# The rules tests/test_workloads.py checks on the mock plan, each broken once: the real webhooks say no.
BROKEN_RAYJOBS = {
    "in-tree autoscaling without the elastic annotation": (
        _without_elastic_annotation,
        "spec.rayClusterSpec.enableInTreeAutoscaling: Invalid value: true: a kueue managed job should only use "
        "autoscaling when workload slicing is enabled"),
    "cluster kept after the job": (
        _keeps_cluster,
        "spec.shutdownAfterJobFinishes: Invalid value: false: a kueue managed job should delete the cluster "
        "after finishing"),
    "worker group named head": (
        _worker_group_named_head,
        'spec.rayClusterSpec.workerGroupSpecs[0].groupName: Forbidden: "head" is reserved for the head group'),
    "more pod sets than a Workload holds": (
        _too_many_worker_groups,
        f"spec.rayClusterSpec.workerGroupSpecs: Too many: {MAX_RAY_WORKER_GROUPS + 2}: must have at most "
        f"{MAX_RAY_WORKER_GROUPS + 1} items"),
    "an existing cluster": (_uses_existing_cluster, "a kueue managed job should not use an existing cluster"),
}


def test_our_rayjob_passes_the_real_webhooks(control_plane):
    created = control_plane.kube.create(jobs.dev_rayjob(), dry_run=True)
    assert created["spec"]["suspend"] is True  # Kueue's mutating webhook suspends it until admitted


@pytest.mark.parametrize("case", sorted(BROKEN_RAYJOBS))
def test_broken_rayjob_is_rejected_with_the_webhooks_message(control_plane, case):
    from testbed.kube import Rejected

    breaks, message = BROKEN_RAYJOBS[case]
    job = jobs.dev_rayjob()
    breaks(job)
    with pytest.raises(Rejected) as rejected:
        control_plane.kube.create(job, dry_run=True)
    assert message in rejected.value.message


def test_cluster_queue_missing_a_covered_resource_is_rejected_by_the_server(control_plane):
    from testbed.kube import Rejected

    (queue,) = [m for m in plan_for().kubernetes_manifests()
                if m["kind"] == "ClusterQueue" and m["metadata"]["name"] == stack_kueue.CLUSTER_QUEUE]
    flavor = queue["spec"]["resourceGroups"][0]["flavors"][1]
    flavor["resources"] = flavor["resources"][:-1]  # drops google.com/tpu from one flavor
    with pytest.raises(Rejected) as rejected:
        control_plane.kube.create(queue, dry_run=True)
    assert "flavors must have the same number of resources as the coveredResources" in rejected.value.message


def test_kueue_runs_the_charts_configuration_with_one_feature_gates_argument(control_plane):
    gates = control_plane.chart.feature_gate_args()
    assert gates == ["--feature-gates=" + ",".join(
        f"{g['name']}={str(g['enabled']).lower()}" for g in stack_kueue.FEATURE_GATES)]
    config = control_plane.chart.manager_config()
    assert config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert "ray.io/rayjob" in config["integrations"]["frameworks"]
    assert control_plane.kueue.alive()  # it started with that configuration and is still serving
