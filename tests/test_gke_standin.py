"""The tier's GKE stand-in (tests/controlplane/gke.py): node templates derived from each plan, and, over them, the
scheduler's own tests for every pod a stack's jobs make, on every rung its queues offer.

The tier runs these pods for real on the dev stack (tests/test_after_admission_controlplane.py); here every shipped
platform, team and fleet-member stack is judged without a server: no pod may wait for a node for a reason the plan
could have avoided (a selector, a taint, a resource request, a topology).
"""

from __future__ import annotations

import copy

import pytest

from infra import tpu as catalogue
from infra.kueue import DEFAULT_FLAVOR, KUEUE_API_VERSION
from infra.offline import OfflineEngine, Plan, platform_outputs_for, referenced_stacks
from tests.conftest import SHIPPED_STACKS, TEAM_STACKS, base_config, plan_for
from tests.controlplane import gke
from workloads.rayjob import QUEUE_LABEL

TPU = catalogue.TPU_RESOURCE
# KubeRay's submitter container (ray-operator `controllers/ray/common/job.go`, GetDefaultSubmitterTemplate): Kueue
# puts it on the default-cpu flavor's nodes (../shared/notes/kuberay-kwok.md §6).
SUBMITTER = {"containers": [{"name": "ray-job-submitter",
                             "resources": {"requests": {"cpu": "500m", "memory": "200Mi"},
                                           "limits": {"cpu": "1", "memory": "1Gi"}}}]}


# ---- allocatable: GKE's reservations ------------------------------------------------------------------------------
@pytest.mark.parametrize(("vcpus", "reserved"), [(1, 60), (2, 70), (4, 80), (8, 90), (16, 110), (180, 520)])
def test_cpu_reservation_follows_gke_s_tiers(vcpus, reserved):
    # 6 % of the first core, 1 % of the next, 0.5 % of the next 2, 0.25 % of every core above 4.
    assert gke.reserved_millicores(vcpus) == reserved


@pytest.mark.parametrize(("gib", "reserved_gib"), [(4, 1.0), (8, 1.8), (16, 2.6), (64, 5.48), (128, 9.32),
                                                    (720, 21.16)])
def test_memory_reservation_follows_gke_s_tiers(gib, reserved_gib):
    # 25 % of the first 4 GiB, 20 % of the next 4, 10 % of the next 8, 6 % of the next 112, 2 % above 128, plus the
    # 100 MiB eviction threshold.
    assert gke.reserved_mebibytes(gib) == round(reserved_gib * 1024) + 100


# ---- templates ------------------------------------------------------------------------------------------------------
def test_the_dev_plan_s_pools_become_templates_with_what_gke_puts_on_their_nodes():
    templates = {t.pool: t for t in gke.node_templates(plan_for("dev"))}
    assert set(templates) == {"default-pool", "on-demand-pool", "dws-pool"}

    cpu = templates["default-pool"]
    assert (cpu.hosts, cpu.max_nodes, cpu.autoscaled, cpu.tpu, cpu.taints) == (1, 3, False, False, ())
    assert dict(cpu.allocatable) == {"cpu": "15890m", "memory": "59824Mi", "pods": "110"}  # n2-standard-16

    on_demand, dws = templates["on-demand-pool"], templates["dws-pool"]
    for pool in (on_demand, dws):
        assert (pool.hosts, pool.max_nodes, pool.autoscaled) == (4, 4, True)  # a 4x4 slice: 4 hosts, made whole
        assert pool.labels[catalogue.ACCELERATOR_LABEL_KEY] == "tpu-v6e-slice"
        assert pool.labels[catalogue.TOPOLOGY_LABEL_KEY] == "4x4"
        assert dict(pool.allocatable) == {"cpu": "179480m", "memory": "715512Mi", "pods": "110", TPU: "4"}
        assert dict(gke.TPU_TAINT) in [dict(t) for t in pool.taints]
    assert (on_demand.queued, dws.queued) == (False, True)
    assert {"key": gke.QUEUED_TAINT, "value": "true", "effect": "NoSchedule"} in [dict(t) for t in dws.taints]
    assert dws.labels[gke.FLEX_START_LABEL] == "true" and gke.FLEX_START_LABEL not in on_demand.labels
    assert on_demand.labels["tpu-fallback/capacity"] == "on-demand"  # the pool's own nodeConfig.labels


def test_a_spot_pool_carries_gke_s_spot_label_and_only_the_taint_it_declares():
    templates = {t.pool: t for t in gke.node_templates(plan_for("platform-us-east5-b"))}
    spot = templates["spot-pool"]
    assert spot.spot and spot.labels[gke.SPOT_LABEL] == "true"
    assert {"key": gke.SPOT_LABEL, "value": "true", "effect": "NoSchedule"} in [dict(t) for t in spot.taints]
    assert not templates["on-demand-pool"].spot and gke.SPOT_LABEL not in templates["on-demand-pool"].labels
    # ct6e-standard-8t: single host (2x4), 8 chips.
    assert (spot.hosts, spot.allocatable[TPU], spot.labels[catalogue.TOPOLOGY_LABEL_KEY]) == (1, "8", "2x4")


def test_why_not_names_what_keeps_a_pod_off_a_pool():
    templates = {t.pool: t for t in gke.node_templates(plan_for("dev"))}
    worker = {"nodeSelector": {catalogue.ACCELERATOR_LABEL_KEY: "tpu-v6e-slice"},
              "containers": [{"resources": {"requests": {TPU: "4", "cpu": "8", "memory": "16Gi"}}}]}
    assert "untolerated taint google.com/tpu" in gke.why_not(templates["on-demand-pool"], worker)
    worker["tolerations"] = [{"key": TPU, "operator": "Exists", "effect": "NoSchedule"}]
    assert gke.why_not(templates["on-demand-pool"], worker) is None
    assert "gke-queued" in gke.why_not(templates["dws-pool"], worker)
    assert "nodeSelector" in gke.why_not(templates["default-pool"], worker)
    greedy = copy.deepcopy(worker)
    greedy["containers"][0]["resources"]["requests"][TPU] = "8"
    assert "google.com/tpu: requests 8, a node has 4" == gke.why_not(templates["on-demand-pool"], greedy)


# ---- every stack's pods on every rung -----------------------------------------------------------------------------
# Shapes no shipped stack uses, on the dev stack: v5p (3D topology, multi-host) and single-host v5e.
SHAPES = {
    "dev-v5p-2x2x2": {"zone": "us-east5-a", "tpu": {"machineType": "ct5p-hightpu-4t", "topology": "2x2x2"}},
    "dev-v5e-2x4": {"zone": "us-west4-a", "tpu": {"machineType": "ct5lp-hightpu-8t", "topology": "2x4"}},
}


def _jobs_plan(stack: str) -> tuple[Plan, Plan]:
    """(the plan declaring the stack's RayJobs, the plan of the cluster they run on)."""
    if stack in SHAPES:
        plan = plan_for("dev", SHAPES[stack])
        return plan, plan
    if stack in TEAM_STACKS:
        config = base_config(stack)
        (platform_ref,) = referenced_stacks(config)
        platform = platform_ref.rsplit("/", 1)[-1]
        engine = OfflineEngine(stack, False, {platform_ref: platform_outputs_for(platform)})
        return engine.run(config), plan_for(platform)
    plan = plan_for(stack)
    if not [m for m in plan.kubernetes_manifests() if m["kind"] == "RayJob"]:
        plan = plan_for(stack, {"workloads": {"jobs": 1}})  # a platform that runs no job of its own: one, as dev
    return plan, plan


def _of_kind(plan: Plan, kind: str) -> dict[tuple[str | None, str], dict]:
    return {(m["metadata"].get("namespace"), m["metadata"]["name"]): m for m in plan.kubernetes_manifests()
            if m["kind"] == kind and m.get("apiVersion", "").startswith(KUEUE_API_VERSION.split("/")[0])}


def _admitted(spec: dict, flavor: dict) -> dict:
    """A pod spec as Kueue admits it on `flavor`: the flavor's node labels and tolerations added."""
    admitted = copy.deepcopy(spec)
    admitted["nodeSelector"] = {**(admitted.get("nodeSelector") or {}), **(flavor["spec"].get("nodeLabels") or {})}
    admitted["tolerations"] = [*(admitted.get("tolerations") or []), *(flavor["spec"].get("tolerations") or [])]
    return admitted


def _on_its_pool(templates: tuple[gke.NodeTemplate, ...], spec: dict) -> list[str]:
    """The pools whose nodes would take this pod (a queued pool's node carries its request's label)."""
    pools = []
    for template in templates:
        labels = dict(template.labels)
        if template.queued:
            labels[gke.PROVISIONING_REQUEST_LABEL] = spec.get("nodeSelector", {}).get(gke.PROVISIONING_REQUEST_LABEL)
        if gke.why_not(template, spec, labels) is None:
            pools.append(template.pool)
    return pools


def _tpu_flavors_of(queue: dict) -> list[str]:
    return [flavor["name"] for group in queue["spec"]["resourceGroups"] if TPU in group["coveredResources"]
            for flavor in group["flavors"]]


PLACED_STACKS = sorted(set(SHIPPED_STACKS) | set(TEAM_STACKS)) + list(SHAPES)


@pytest.mark.parametrize("stack", PLACED_STACKS)
def test_every_pod_of_every_job_lands_on_its_rung_s_pool(stack):
    """For each RayJob and each flavor its ClusterQueue may admit it on: the TPU workers fit exactly the pool whose
    nodes carry that flavor's labels, one host each; the Ray head and the submitter fit exactly `default-pool`."""
    jobs_plan, cluster_plan = _jobs_plan(stack)
    templates = gke.node_templates(cluster_plan)
    flavors = {name: m for (_, name), m in _of_kind(cluster_plan, "ResourceFlavor").items()}
    local_queues = _of_kind(cluster_plan, "LocalQueue")
    cluster_queues = {name: m for (_, name), m in _of_kind(cluster_plan, "ClusterQueue").items()}
    rayjobs = [m for m in jobs_plan.kubernetes_manifests() if m["kind"] == "RayJob"]
    assert rayjobs, f"{stack}: no RayJob to place"
    checked = set()
    for job in rayjobs:
        namespace = job["metadata"]["namespace"]
        local = local_queues[(namespace, job["metadata"]["labels"][QUEUE_LABEL])]
        queue = cluster_queues[local["spec"]["clusterQueue"]]
        cluster = job["spec"]["rayClusterSpec"]
        (group,) = cluster["workerGroupSpecs"]
        head = cluster["headGroupSpec"]["template"]["spec"]
        for name in _tpu_flavors_of(queue):
            flavor = flavors[name]
            if name == DEFAULT_FLAVOR:
                assert _on_its_pool(templates, _admitted(head, flavor)) == [gke.DEFAULT_POOL], (stack, name)
                assert _on_its_pool(templates, _admitted(SUBMITTER, flavor)) == [gke.DEFAULT_POOL], (stack, name)
                continue
            worker = _admitted(group["template"]["spec"], flavor)
            pools = _on_its_pool(templates, worker)
            expected = [t.pool for t in templates
                        if all(t.labels.get(k) == v for k, v in flavor["spec"]["nodeLabels"].items())]
            assert pools == expected and len(pools) >= 1, (stack, name, pools, expected, {
                t.pool: gke.why_not(t, worker) for t in templates})
            (template,) = [t for t in templates if t.pool == pools[0]][:1]
            assert group["numOfHosts"] == template.hosts, (stack, name)  # one worker per host of the slice
            # A multi-host run on one slice: GKE's one pool per slice is the topology its workers keep together.
            affinity = group["template"]["spec"].get("affinity") or {}
            if template.hosts > 1:
                (together,) = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                (apart,) = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                assert together["topologyKey"] == apart["topologyKey"] == gke.NODEPOOL_LABEL, (stack, name)
            else:
                assert not affinity, (stack, name)
            checked.add(name)
    assert checked, f"{stack}: no TPU rung checked"
