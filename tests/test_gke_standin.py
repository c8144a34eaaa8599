"""The tier's GKE stand-in (testbed/gke.py): node templates derived from each plan, and, over them, the
scheduler's own tests for every pod a stack's jobs make, on every rung its queues offer.

The tier runs these pods for real on the dev stack (tests/test_after_admission_controlplane.py); here every shipped
platform, team and fleet-member stack is judged without a server: no pod may wait for a node for a reason the plan
could have avoided (a selector, a taint, a resource request, a topology).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import time

import pytest

from failover.api import TPU_RESOURCE
from infra import tpu as catalogue
from infra.kueue import DEFAULT_FLAVOR, KUEUE_API_VERSION
from infra.offline import OfflineEngine, Plan, platform_outputs_for, referenced_stacks
from testbed import gke
from tests.conftest import SHIPPED_STACKS, TEAM_STACKS, base_config, plan_for
from workloads.rayjob import QUEUE_LABEL

TPU = TPU_RESOURCE
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


def test_tpu7x_pools_take_their_slice_from_the_workload_policy_they_name():
    """No topology on a TPU7x pool: GKE reads the slice from its workload policy (2x2x2: 2 VMs of 4 chips)."""
    templates = {t.pool: t for t in gke.node_templates(plan_for("ironwood-us-central1-c"))}
    assert set(templates) == {"default-pool", "reserved-pool", "on-demand-pool", "spot-pool", "dws-pool"}
    for name in ("reserved-pool", "on-demand-pool", "spot-pool", "dws-pool"):
        pool = templates[name]
        assert (pool.hosts, pool.max_nodes) == (2, 2)
        assert pool.labels[catalogue.ACCELERATOR_LABEL_KEY] == "tpu7x"
        assert pool.labels[catalogue.TOPOLOGY_LABEL_KEY] == "2x2x2"
        assert pool.allocatable[TPU] == "4"


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


# ---- the autoscaler stand-in's own decisions, on a fake API (the tiers run it on the real one) ------------------
class FakeKube:
    """What the Autoscaler asks of a cluster: list, get, create and delete, over plain dicts."""

    def __init__(self):
        self.objects: dict[str, list[dict]] = {"Pod": [], "Node": [], "Event": [], "ProvisioningRequest": [],
                                               "PodTemplate": []}
        self.calls: list[tuple] = []  # (verb, kind, name, what): the writes, in order

    def list(self, api_version, kind, namespace=None):
        return [o for o in self.objects[kind] if namespace is None or o["metadata"].get("namespace") == namespace]

    def get(self, api_version, kind, name, namespace=None):
        return next((o for o in self.list(api_version, kind, namespace) if o["metadata"]["name"] == name), None)

    def create(self, manifest):
        self.objects[manifest["kind"]].append(manifest)
        return manifest

    def patch(self, api_version, kind, name, patch, namespace=None, subresource=None):
        found = self.get(api_version, kind, name, namespace)
        found.setdefault("spec", {}).update(patch.get("spec") or {})
        labels = found["metadata"].setdefault("labels", {})
        for key, value in ((patch.get("metadata") or {}).get("labels") or {}).items():
            labels.pop(key, None) if value is None else labels.update({key: value})
        self.calls.append(("patch", kind, name, patch))
        return found

    def delete(self, api_version, kind, name, namespace=None, propagation=None, grace_seconds=None):
        self.objects[kind] = [o for o in self.objects[kind] if o["metadata"]["name"] != name]
        self.calls.append(("delete", kind, name, grace_seconds))


def _worker(name: str, flavor_labels: dict, tolerations: tuple[str, ...] = (TPU,), chips: str = "4") -> dict:
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
            "spec": {"nodeSelector": {catalogue.ACCELERATOR_LABEL_KEY: "tpu-v6e-slice",
                                      catalogue.TOPOLOGY_LABEL_KEY: "4x4", **flavor_labels},
                     "tolerations": [{"key": k, "operator": "Exists", "effect": "NoSchedule"} for k in tolerations],
                     "containers": [{"resources": {"requests": {TPU: chips, "cpu": "8", "memory": "16Gi"}}}]},
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}


def _autoscaler(stack: str = "dev", overrides: dict | None = None) -> gke.Autoscaler:
    autoscaler = gke.Autoscaler(None, gke.node_templates(plan_for(stack, overrides)), "c", "us-east5-b",
                                scale_up_seconds=0, scale_down_seconds=0, unused_seconds=30)
    autoscaler.kube = FakeKube()
    return autoscaler


def test_pending_workers_of_one_run_grow_their_pool_by_one_whole_slice():
    autoscaler = _autoscaler()
    on_demand = {"tpu-fallback/capacity": "on-demand"}
    autoscaler.kube.objects["Pod"] = [_worker(f"w{i}", on_demand) for i in range(4)]
    autoscaler.step()  # the slice is planned
    autoscaler.step()  # and arrives (scale_up_seconds=0)
    assert len(autoscaler.nodes_of("on-demand-pool")) == 4 and not autoscaler.nodes_of("dws-pool")
    autoscaler.step()
    assert len(autoscaler.nodes_of("on-demand-pool")) == 4  # the 4 free hosts are counted: no second slice
    # A pod no pool's template fits (no TPU toleration) grows nothing.
    autoscaler.kube.objects["Pod"].append(_worker("intolerant", on_demand, tolerations=()))
    autoscaler.step()
    autoscaler.step()
    assert len(autoscaler.nodes_of("on-demand-pool")) == 4


def test_a_rung_of_one_pool_per_slice_grows_the_pool_with_room():
    # team-c's DWS rung is two pools (one 4x4 v5e slice each): not queued here, its first pool full.
    templates = tuple(dataclasses.replace(t, queued=False) if t.pool.startswith("team-c-dws") else t
                      for t in gke.node_templates(plan_for("team-c-us-west4-a")))
    autoscaler = gke.Autoscaler(None, templates, "c", "us-west4-a", scale_up_seconds=0, scale_down_seconds=0)
    autoscaler.kube = FakeKube()
    first, second = [t for t in templates if t.pool.startswith("team-c-dws")]
    autoscaler._create_slice(first)
    autoscaler.kube.objects["Pod"] = [{"metadata": {"name": f"on-{node}"}, "spec": {"nodeName": node},
                                       "status": {"phase": "Running"}} for node in autoscaler.nodes_of(first.pool)]
    for i in range(4):  # a second run of the rung: its workers select the rung, not a pool
        pending = _worker(f"p{i}", {}, tolerations=(TPU, gke.QUEUED_TAINT))
        pending["spec"]["nodeSelector"] = {k: first.labels[k] for k in (
            "tpu-fallback/capacity", catalogue.ACCELERATOR_LABEL_KEY, catalogue.TOPOLOGY_LABEL_KEY)}
        autoscaler.kube.objects["Pod"].append(pending)
    autoscaler.step()
    autoscaler.step()
    assert len(autoscaler.nodes_of(second.pool)) == second.hosts and len(autoscaler.nodes_of(first.pool)) == 4


def test_a_stocked_out_pool_says_so_once_per_pod_unless_silent_and_grows_nothing():
    autoscaler = _autoscaler()
    on_demand = {"tpu-fallback/capacity": "on-demand"}
    autoscaler.kube.objects["Pod"] = [_worker("w0", on_demand), _worker("w1", on_demand)]
    autoscaler.stockout("on-demand-pool", reported=False)
    autoscaler.step()
    assert not autoscaler.kube.objects["Event"] and not autoscaler.nodes_of("on-demand-pool")
    autoscaler.stockout("on-demand-pool")
    autoscaler.step()
    autoscaler.step()
    events = autoscaler.kube.objects["Event"]
    assert sorted(e["involvedObject"]["name"] for e in events) == ["w0", "w1"]  # once each, not each pass
    assert all("GCE out of resources" in e["message"] and e["reason"] == "FailedScaleUp" for e in events)
    assert not autoscaler.nodes_of("on-demand-pool")
    autoscaler.restore()
    autoscaler.step()
    autoscaler.step()
    assert len(autoscaler.nodes_of("on-demand-pool")) == 4


def test_a_provisioned_request_brings_its_slice_labelled_and_a_stocked_out_one_none():
    autoscaler = _autoscaler()
    dws = {"tpu-fallback/capacity": "dws"}
    template = _worker("t", dws, tolerations=(TPU, gke.QUEUED_TAINT))["spec"]
    for name, resize in (("r1", "resize-1"), ("r2", "resize-2")):
        autoscaler.kube.objects["PodTemplate"].append({"metadata": {"name": f"pt-{name}", "namespace": "default"},
                                                       "template": {"spec": template}})
        autoscaler.kube.objects["ProvisioningRequest"].append({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"podSets": [{"podTemplateRef": {"name": f"pt-{name}"}, "count": 4}]},
            "status": {"conditions": [{"type": "Provisioned", "status": "True"}],
                       "provisioningClassDetails": {"ResizeRequestName": resize}}})
    autoscaler.kube.objects["ProvisioningRequest"][1]["status"]["conditions"][0]["status"] = "False"
    autoscaler.step()
    nodes = autoscaler.kube.objects["Node"]
    dws_nodes = [n for n in nodes if n["metadata"]["labels"][gke.NODEPOOL_LABEL] == "dws-pool"]
    assert len(dws_nodes) == 4
    assert {n["metadata"]["labels"][gke.PROVISIONING_REQUEST_LABEL] for n in dws_nodes} == {"resize-1"}
    assert all(gke.QUEUED_TAINT in [t["key"] for t in n["spec"]["taints"]] for n in dws_nodes)
    # The pool is full now; in a stocked-out pool a provisioned request's VMs never come.
    autoscaler.stockout("dws-pool")
    autoscaler.kube.objects["ProvisioningRequest"][1]["status"]["conditions"][0]["status"] = "True"
    autoscaler.step()
    assert len(autoscaler.nodes_of("dws-pool")) == 4 and autoscaler.history[-1][1:] == ("lost", "dws-pool", "resize-2")


def test_a_slice_goes_once_its_pods_are_gone_and_a_new_one_waits_for_its_first_pod():
    autoscaler = _autoscaler()
    used = autoscaler._create_slice(autoscaler.by_pool["on-demand-pool"])
    fresh = autoscaler._create_slice(autoscaler.by_pool["dws-pool"])
    autoscaler.kube.objects["Pod"] = [{"metadata": {"name": "p"}, "spec": {"nodeName": used.nodes[0]},
                                       "status": {"phase": "Running"}}]
    autoscaler.step()
    assert used.used and len(autoscaler.nodes_of("on-demand-pool")) == 4
    autoscaler.kube.objects["Pod"][0]["status"]["phase"] = "Succeeded"  # a finished pod holds no node
    autoscaler.step()  # idle from now (scale_down_seconds=0)
    autoscaler.step()
    assert not autoscaler.nodes_of("on-demand-pool")
    assert len(autoscaler.nodes_of("dws-pool")) == 4 and fresh.id in autoscaler.slices  # unused: waits 30 s
    autoscaler.remove_idle()  # between scenarios: at once
    assert not autoscaler.nodes_of("dws-pool")


def test_a_dws_slice_whose_request_is_gone_goes_without_waiting_for_a_first_pod():
    """MultiKueue deletes a losing member's copy, and with it the ProvisioningRequest: its slice's booking ends."""
    autoscaler = _autoscaler()
    kept = autoscaler._create_slice(autoscaler.by_pool["dws-pool"], provisioning_request="resize-kept")
    autoscaler._scale_down([], time.monotonic(), requests={"resize-kept"})
    assert kept.id in autoscaler.slices  # unused, its request there: it waits for its pods
    autoscaler._scale_down([], time.monotonic(), requests=set())
    assert kept.id not in autoscaler.slices and not autoscaler.nodes_of("dws-pool")


def test_a_provisioned_request_waits_for_room_in_its_pool_then_gets_its_slice():
    autoscaler = _autoscaler()
    old = autoscaler._create_slice(autoscaler.by_pool["dws-pool"], provisioning_request="resize-old")
    template = _worker("t", {"tpu-fallback/capacity": "dws"}, tolerations=(TPU, gke.QUEUED_TAINT))["spec"]
    autoscaler.kube.objects["PodTemplate"].append({"metadata": {"name": "pt", "namespace": "default"},
                                                   "template": {"spec": template}})
    autoscaler.kube.objects["ProvisioningRequest"].append({
        "metadata": {"name": "new", "namespace": "default", "uid": "uid-new"},
        "spec": {"podSets": [{"podTemplateRef": {"name": "pt"}, "count": 4}]},
        "status": {"conditions": [{"type": "Provisioned", "status": "True"}],
                   "provisioningClassDetails": {"ResizeRequestName": "resize-new"}}})
    autoscaler.step()  # the old request is gone: its slice goes; the new one waits for the room it leaves
    assert old.id not in autoscaler.slices and not autoscaler.problems
    autoscaler.step()
    nodes = [n for n in autoscaler.kube.objects["Node"] if n["metadata"]["labels"][gke.NODEPOOL_LABEL] == "dws-pool"]
    assert {n["metadata"]["labels"][gke.PROVISIONING_REQUEST_LABEL] for n in nodes} == {"resize-new"}
    assert len(nodes) == 4 and not autoscaler.problems


def test_a_slice_a_pod_was_bound_to_meanwhile_is_kept_and_untainted():
    autoscaler = _autoscaler()
    idle = autoscaler._create_slice(autoscaler.by_pool["on-demand-pool"])
    late = {"metadata": {"name": "late"}, "spec": {"nodeName": idle.nodes[0]}, "status": {"phase": "Running"}}
    original_list = autoscaler.kube.list

    def bound_meanwhile(api_version, kind, namespace=None):  # the scheduler binds right after the pass's list
        if kind == "Pod" and late not in autoscaler.kube.objects["Pod"]:
            autoscaler.kube.objects["Pod"].append(late)
            return []
        return original_list(api_version, kind, namespace)
    autoscaler.kube.list = bound_meanwhile
    autoscaler._scale_down(autoscaler.kube.list("v1", "Pod"), time.monotonic(), at_once=True)
    assert idle.id in autoscaler.slices and len(autoscaler.nodes_of("on-demand-pool")) == 4
    node = autoscaler.kube.get("v1", "Node", idle.nodes[0])
    assert gke.TO_BE_DELETED_TAINT["key"] not in [t["key"] for t in node["spec"]["taints"]]


def _running_slice(autoscaler: gke.Autoscaler) -> gke.Slice:
    running = autoscaler._create_slice(autoscaler.by_pool["on-demand-pool"])
    autoscaler.kube.objects["Pod"] = [{"metadata": {"name": f"w{i}", "namespace": "default"},
                                       "spec": {"nodeName": node}, "status": {"phase": "Running"}}
                                      for i, node in enumerate(running.nodes)]
    autoscaler.kube.calls.clear()
    return running


def _order(calls: list[tuple]) -> list[tuple]:
    """Each write as (verb, kind, what it did): a taint's key, a label change, a deletion's grace period."""
    said = []
    for verb, kind, _name, what in calls:
        if verb == "delete":
            said.append((verb, kind, what))
        elif (what.get("metadata") or {}).get("labels"):
            said.append((verb, kind, tuple(sorted(what["metadata"]["labels"].items()))))
        elif (what.get("spec") or {}).get("taints"):
            said.append((verb, kind, what["spec"]["taints"][-1]["key"]))
        else:
            said.append((verb, kind, "status"))
    return list(dict.fromkeys(said))  # one line per kind of step, in the order of its first write


def test_a_spot_preemption_taints_first_then_shuts_the_pods_down_gracefully_then_the_nodes_go():
    autoscaler = _autoscaler()
    running = _running_slice(autoscaler)
    autoscaler.preempt_spot(running.id, grace_seconds=15)
    assert _order(autoscaler.kube.calls) == [("patch", "Node", "cloud.google.com/impending-node-termination"),
                                             ("delete", "Pod", 15), ("delete", "Node", None)]
    assert [c[2] for c in autoscaler.kube.calls if c[0] == "patch"] == list(running.nodes)  # every host's notice


def test_a_maintenance_is_labelled_ahead_then_ongoing_and_tainted_then_the_slice_goes():
    autoscaler = _autoscaler()
    running = _running_slice(autoscaler)
    window = datetime.datetime(2026, 12, 1, 10, 0, tzinfo=datetime.timezone.utc)
    autoscaler.schedule_maintenance(running.id, window)
    host = autoscaler.kube.get("v1", "Node", running.nodes[0])
    assert host["metadata"]["labels"][gke.SCHEDULED_MAINTENANCE_LABEL] == str(int(window.timestamp()))
    assert running.id in autoscaler.slices and not autoscaler.kube.calls[-1][3].get("spec")  # nothing else yet
    autoscaler.kube.calls.clear()
    autoscaler.begin_maintenance(running.id, grace_seconds=30)
    assert _order(autoscaler.kube.calls) == [
        ("patch", "Node", ((gke.ACTIVE_MAINTENANCE_LABEL, "ONGOING"), (gke.SCHEDULED_MAINTENANCE_LABEL, None))),
        ("patch", "Node", "cloud.google.com/impending-node-termination"), ("delete", "Pod", 30),
        ("delete", "Node", None)]
    assert gke.SCHEDULED_MAINTENANCE_LABEL not in host["metadata"]["labels"]


def test_a_failed_host_goes_not_ready_then_unreachable_with_no_graceful_shutdown():
    autoscaler = _autoscaler()
    running = _running_slice(autoscaler)
    autoscaler.fail_host(running.id)
    # KWOK lets go of the node and its Ready turns Unknown ("status"), then the taint; the pods go without grace.
    assert _order(autoscaler.kube.calls) == [("patch", "Node", "status"),
                                             ("patch", "Node", "node.kubernetes.io/unreachable"),
                                             ("delete", "Pod", 0), ("delete", "Node", None)]
