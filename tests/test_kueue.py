"""Kueue: the release, the queue objects (validated against the upstream CRDs), quotas, and ordering."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from infra.kueue import COVERED_RESOURCES, FEATURE_GATES, MANAGER_CONFIG_BASE
from infra.rungs import RUNG_KINDS
from infra.settings import DEFAULTS
from testbed import upstream
from tests.conftest import SHIPPED_STACKS, plan_for
from tests.k8s_schema import validation_errors

RELEASE = "kubernetes:helm.sh/v3:Release"
KUEUE_KINDS = ("ResourceFlavor", "ClusterQueue", "LocalQueue", "AdmissionCheck", "ProvisioningRequestConfig",
               "Cohort")
# The flavor of each plan and the key of the `tpuChips` output that gives its chips.
PLAN_CHIPS_KEY = {kind.flavor: kind.key for kind in RUNG_KINDS.values()}


def kueue_objects(plan) -> dict[tuple[str, str], dict]:
    return {(m["kind"], m["metadata"]["name"]): m for m in plan.kubernetes_manifests()
            if m["apiVersion"].startswith("kueue.x-k8s.io/")}


def queue_spec(plan) -> dict:
    return kueue_objects(plan)[("ClusterQueue", "cluster-queue")]["spec"]


def of_kind(plan, kind: str) -> dict[str, dict]:
    return {name: m for (k, name), m in kueue_objects(plan).items() if k == kind}


def quotas(spec: dict) -> dict[str, dict[str, str]]:
    """A ClusterQueue's nominal quotas by flavor and resource."""
    flavors = spec["resourceGroups"][0]["flavors"]
    return {f["name"]: {r["name"]: r["nominalQuota"] for r in f["resources"]} for f in flavors}


def capacity(plan) -> dict[str, dict[str, str]]:
    """Each flavor's quota summed over every ClusterQueue and Cohort: the capacity the queues together may admit."""
    total: dict[str, dict[str, int]] = {}
    holders = [*of_kind(plan, "ClusterQueue").values(), *of_kind(plan, "Cohort").values()]
    for queue in holders:
        if not queue["spec"].get("resourceGroups"):
            continue  # a Cohort for limits only
        for flavor, resources in quotas(queue["spec"]).items():
            for resource, value in resources.items():
                summed = total.setdefault(flavor, {})
                summed[resource] = summed.get(resource, 0) + int(value.removesuffix("Gi"))
    return {flavor: {resource: f"{amount}Gi" if resource == "memory" else str(amount)
                     for resource, amount in resources.items()} for flavor, resources in total.items()}


def manager_config(plan) -> dict:
    return yaml.safe_load(plan.only(RELEASE).inputs["values"]["managerConfig"]["controllerManagerConfigYaml"])


def chart_default_manager_config() -> dict:
    """The default `controllerManagerConfigYaml` of the pinned chart, read from the Kueue Go module."""
    module = f"sigs.k8s.io/kueue@v{DEFAULTS['kueue']['version']}"
    go = shutil.which("go")
    info: dict = {"Error": "Go is not installed"}
    if go is not None:
        with tempfile.TemporaryDirectory() as scratch:  # outside any module, so no go.mod is consulted
            answer = subprocess.run([go, "mod", "download", "-json", module], cwd=scratch, text=True,
                                    capture_output=True, check=False)
        info = json.loads(answer.stdout) if answer.stdout.strip() else {"Error": answer.stderr.strip()}
    if info.get("Error") or "Dir" not in info:
        message = f"cannot read the chart of {module}: {info.get('Error')}"
        if os.environ.get("CI") == "true":  # CI must prove the base equals the chart, never skip it
            pytest.fail(message)
        pytest.skip(message)
    values = yaml.safe_load((Path(info["Dir"]) / "charts" / "kueue" / "values.yaml").read_text())
    return yaml.safe_load(values["managerConfig"]["controllerManagerConfigYaml"])


def test_release_is_named_kueue_with_the_pinned_chart():
    release = plan_for().only(RELEASE).inputs
    assert release["name"] == "kueue"  # another name crash-loops the controller (kueue#6797)
    assert release["chart"] == "oci://registry.k8s.io/kueue/charts/kueue"
    assert release["version"] == "0.19.2"
    assert release["namespace"] == "kueue-system"
    assert release.get("skipAwait") is not True
    gates = release["values"]["controllerManager"]["featureGates"]
    assert {"name": "ElasticJobsViaWorkloadSlices", "enabled": True} in gates
    assert all(g["name"] != "ProvisioningACC" for g in gates)  # removed in 0.15; unknown gates kill the manager


def test_release_follows_the_configured_version():
    release = plan_for(overrides={"kueue": {"version": "0.18.6"}}).only(RELEASE).inputs
    assert release["version"] == "0.18.6"


def test_seed_objects_and_names():
    objects = kueue_objects(plan_for())
    assert set(objects) == {
        ("ResourceFlavor", "default-cpu"), ("ResourceFlavor", "on-demand"), ("ResourceFlavor", "dws"),
        ("ClusterQueue", "cluster-queue"), ("LocalQueue", "user-queue"),
        ("ClusterQueue", "cluster-queue-dws"), ("LocalQueue", "user-queue-dws"),
        ("AdmissionCheck", "dws-prov"), ("ProvisioningRequestConfig", "dws-config"),
    }
    assert all(m["apiVersion"] == "kueue.x-k8s.io/v1beta2" for m in objects.values())
    assert objects[("LocalQueue", "user-queue")]["metadata"]["namespace"] == "default"
    assert objects[("LocalQueue", "user-queue")]["spec"] == {"clusterQueue": "cluster-queue"}


def test_cluster_queue_tries_plan_a_then_plan_b_in_one_group():
    spec = queue_spec(plan_for())
    assert len(spec["resourceGroups"]) == 1
    group = spec["resourceGroups"][0]
    assert group["coveredResources"] == ["cpu", "memory", "google.com/tpu"]
    assert [f["name"] for f in group["flavors"]] == ["default-cpu", "on-demand", "dws"]
    # The CRD's CEL rule and Kueue's webhook: each flavor lists the covered resources, in order.
    for flavor in group["flavors"]:
        assert [r["name"] for r in flavor["resources"]] == group["coveredResources"]
    assert spec["admissionChecksStrategy"] == {"admissionChecks": [{"name": "dws-prov", "onFlavors": ["dws"]}]}
    assert "admissionChecks" not in spec  # v1beta1 only


def test_quotas_are_derived_from_the_machine_types():
    # dev: 3 x n2-standard-16 (16 vCPU, 64 GiB); one 4x4 slice per plan = 4 x ct6e-standard-4t (180 vCPU, 720 GiB).
    assert capacity(plan_for()) == {
        "default-cpu": {"cpu": "48", "memory": "192Gi", "google.com/tpu": "0"},
        "on-demand": {"cpu": "720", "memory": "2880Gi", "google.com/tpu": "16"},
        "dws": {"cpu": "720", "memory": "2880Gi", "google.com/tpu": "16"},
    }


def test_quotas_follow_the_slice_count_not_infinity():
    got = capacity(plan_for(overrides={"onDemand": {"maxSlices": 3}, "flexStart": {"maxSlices": 2}}))
    assert got["on-demand"]["google.com/tpu"] == "48"
    assert got["dws"]["google.com/tpu"] == "32"
    single_host = capacity(plan_for("team-b-us-east5-a"))  # 2 x ct6e-standard-8t on demand, 1 via DWS
    assert single_host["on-demand"] == {"cpu": "360", "memory": "2880Gi", "google.com/tpu": "16"}
    assert single_host["dws"] == {"cpu": "180", "memory": "1440Gi", "google.com/tpu": "8"}
    assert single_host["default-cpu"] == {"cpu": "16", "memory": "64Gi", "google.com/tpu": "0"}


def test_flavors_select_the_plan_label_and_dws_tolerates_the_queued_taint():
    objects = kueue_objects(plan_for())
    assert objects[("ResourceFlavor", "default-cpu")]["spec"] == {
        "nodeLabels": {"cloud.google.com/gke-nodepool": "default-pool"}}
    assert objects[("ResourceFlavor", "on-demand")]["spec"] == {"nodeLabels": {"tpu-fallback/capacity": "on-demand"}}
    dws = objects[("ResourceFlavor", "dws")]["spec"]
    assert dws["nodeLabels"] == {"tpu-fallback/capacity": "dws"}
    assert dws["tolerations"] == [{"key": "cloud.google.com/gke-queued", "operator": "Exists", "effect": "NoSchedule"}]


def test_provisioning_objects_follow_gke_dws():
    objects = kueue_objects(plan_for())
    config = objects[("ProvisioningRequestConfig", "dws-config")]["spec"]
    assert config["provisioningClassName"] == "queued-provisioning.gke.io"
    assert config["managedResources"] == ["google.com/tpu"]
    assert config["podSetUpdates"]["nodeSelector"] == [
        {"key": "autoscaling.gke.io/provisioning-request", "valueFromProvisioningClassDetail": "ResizeRequestName"}]
    check = objects[("AdmissionCheck", "dws-prov")]["spec"]
    assert check["controllerName"] == "kueue.x-k8s.io/provisioning-request"
    assert check["parameters"] == {"apiGroup": "kueue.x-k8s.io", "kind": "ProvisioningRequestConfig",
                                   "name": "dws-config"}


def test_plan_b_off_means_no_dws_flavor_config_or_check():
    objects = kueue_objects(plan_for(overrides={"flexStart": {"maxSlices": 0}}))
    kinds = {key for key in objects}
    assert ("ResourceFlavor", "dws") not in kinds
    assert not {k for k in kinds if k[0] in ("AdmissionCheck", "ProvisioningRequestConfig")}
    assert {name for kind, name in kinds if kind in ("ClusterQueue", "LocalQueue")} == {"cluster-queue", "user-queue"}
    spec = objects[("ClusterQueue", "cluster-queue")]["spec"]
    assert "admissionChecksStrategy" not in spec and "cohortName" not in spec
    assert [f["name"] for f in spec["resourceGroups"][0]["flavors"]] == ["default-cpu", "on-demand"]


def test_plan_a_off_means_no_on_demand_flavor():
    objects = kueue_objects(plan_for("team-c-us-west4-a"))
    assert ("ResourceFlavor", "on-demand") not in objects
    spec = objects[("ClusterQueue", "cluster-queue")]["spec"]
    assert [f["name"] for f in spec["resourceGroups"][0]["flavors"]] == ["default-cpu", "dws"]


def test_every_cluster_queue_is_awaited_until_active():
    queues = of_kind(plan_for(), "ClusterQueue")
    assert len(queues) == 2
    for queue in queues.values():
        assert queue["metadata"]["annotations"] == {"pulumi.com/waitFor": "condition=Active"}


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_kueue_object_validates_strictly_against_the_crds(stack, crd_schemas):
    objects = kueue_objects(plan_for(stack))
    assert {kind for kind, _ in objects} <= set(KUEUE_KINDS)
    for key, manifest in objects.items():
        crd = upstream.path(upstream.KUEUE_COHORT_CRD) if manifest["kind"] == "Cohort" else None
        assert validation_errors(manifest, crd) == [], key


def test_strict_validation_catches_unknown_and_v1beta1_fields(crd_schemas):
    queue = kueue_objects(plan_for())[("ClusterQueue", "cluster-queue")]
    legacy = {**queue, "spec": {**queue["spec"], "admissionChecks": ["dws-prov"], "cohort": "x"}}
    errors = validation_errors(legacy)
    assert any("admissionChecks" in e for e in errors) and any("cohort" in e for e in errors)
    typo = {**queue, "spec": {**queue["spec"], "namespaceSelectr": {}}}
    assert validation_errors(typo)


# --- Order and readiness (item 6), from the recorded dependency graph ---

def test_every_kueue_object_waits_for_the_release():
    plan = plan_for()
    release = plan.only(RELEASE)
    custom_resources = [r for r in plan.resources if r.type.startswith("kubernetes:kueue.x-k8s.io/")]
    assert len(custom_resources) == 9
    assert all(release.urn in r.dependencies for r in custom_resources)


def test_provider_and_release_do_not_wait_for_tpu_pools():
    plan = plan_for()
    pool_urns = {p.urn for p in plan.of_type("gcp:container/nodePool:NodePool")}
    pool_urns |= {r.urn for r in plan.of_type("tpu-fallback:infra:TpuNodePool")}
    assert pool_urns
    for waiter in [*plan.of_type("pulumi:providers:kubernetes"), *plan.of_type(RELEASE)]:
        assert not plan.ancestors_and_dependencies(waiter) & pool_urns, waiter.name


def test_destroy_order_queue_before_flavors_and_checks_local_queue_before_queue():
    plan = plan_for()
    by_kind = {}
    for r in plan.resources:
        if r.type.startswith("kubernetes:kueue.x-k8s.io/"):
            by_kind.setdefault(r.type.rsplit(":", 1)[1], []).append(r)
    queues = {r.inputs["metadata"]["name"]: r for r in by_kind["ClusterQueue"]}
    assert len(queues) == 2
    # Created after (so deleted before) every flavor and check it references.
    for queue in queues.values():
        for kind in ("ResourceFlavor", "AdmissionCheck"):
            assert all(r.urn in queue.dependencies for r in by_kind[kind])
    assert len(by_kind["LocalQueue"]) == 2
    for local_queue in by_kind["LocalQueue"]:
        assert queues[local_queue.inputs["spec"]["clusterQueue"]].urn in local_queue.dependencies
    assert by_kind["ProvisioningRequestConfig"][0].urn in by_kind["AdmissionCheck"][0].dependencies


def test_release_waits_for_its_namespace():
    plan = plan_for()
    release = plan.only(RELEASE)
    namespace = plan.named("kueue-namespace")
    assert namespace.inputs["metadata"]["name"] == "kueue-system"
    assert namespace.urn in release.dependencies or namespace.urn in release.property_dependencies.get("namespace", [])


def test_feature_gates_constant_is_what_the_release_gets():
    values = plan_for().only(RELEASE).inputs["values"]
    assert values["controllerManager"]["featureGates"] == [dict(g) for g in FEATURE_GATES]
    assert COVERED_RESOURCES == ("cpu", "memory", "google.com/tpu")


def test_required_tpu_quota_is_exported_per_plan():
    assert plan_for().outputs["tpuChips"] == {"onDemand": 16, "flexStart": 16}
    assert plan_for("team-c-us-west4-a").outputs["tpuChips"] == {"flexStart": 32}


# --- Kueue's manager configuration: the chart's default, plus waitForPodsReady from stack config ---

WAIT_FOR_PODS_READY_DEV = {
    "timeout": "900s", "recoveryTimeout": "900s", "blockAdmission": False,
    "requeuingStrategy": {"timestamp": "Eviction", "backoffBaseSeconds": 60, "backoffMaxSeconds": 1800},
}


def test_release_values_carry_the_manager_config_as_yaml():
    values = plan_for().only(RELEASE).inputs["values"]
    assert set(values) == {"controllerManager", "managerConfig"}
    assert isinstance(values["managerConfig"]["controllerManagerConfigYaml"], str)
    config = manager_config(plan_for())
    assert config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2" and config["kind"] == "Configuration"
    assert config["waitForPodsReady"] == WAIT_FOR_PODS_READY_DEV
    assert "ray.io/rayjob" in config["integrations"]["frameworks"]  # else RayJobs are never queued


def test_manager_config_is_the_chart_default_plus_only_wait_for_pods_ready():
    chart_default = chart_default_manager_config()
    assert "waitForPodsReady" not in chart_default  # commented out in the chart: ours is the only change
    assert MANAGER_CONFIG_BASE == chart_default
    assert manager_config(plan_for()) == {**chart_default, "waitForPodsReady": WAIT_FOR_PODS_READY_DEV}


@pytest.mark.parametrize("timeout, seconds", [("300s", "300s"), ("20m", "1200s"), ("2h", "7200s")])
def test_pods_ready_timeout_follows_stack_config(timeout, seconds):
    config = manager_config(plan_for(overrides={"fallback": {"podsReadyTimeout": timeout,
                                                             "stockoutGracePeriod": "30s"}}))
    assert config["waitForPodsReady"]["timeout"] == seconds
    assert config["waitForPodsReady"]["recoveryTimeout"] == seconds


def test_manager_config_has_no_feature_gates_and_no_enable_field():
    config = manager_config(plan_for())
    # Gates go only in controllerManager.featureGates: both set and Kueue refuses to start.
    assert "featureGates" not in config
    assert plan_for().only(RELEASE).inputs["values"]["controllerManager"]["featureGates"]
    # Config v1beta2 decodes strictly and has no waitForPodsReady.enable: Kueue would not start.
    assert "enable" not in config["waitForPodsReady"]


# --- The chain of queues: one ClusterQueue and LocalQueue per rung, each rung's capacity counted once ---

def test_dev_chain_has_a_queue_per_rung_starting_at_that_rung():
    plan = plan_for()
    queues = of_kind(plan, "ClusterQueue")
    assert set(queues) == {"cluster-queue", "cluster-queue-dws"}
    assert list(quotas(queues["cluster-queue"]["spec"])) == ["default-cpu", "on-demand", "dws"]
    assert list(quotas(queues["cluster-queue-dws"]["spec"])) == ["default-cpu", "dws"]
    local_queues = of_kind(plan, "LocalQueue")
    assert {name: (q["metadata"]["namespace"], q["spec"]["clusterQueue"]) for name, q in local_queues.items()} == {
        "user-queue": ("default", "cluster-queue"), "user-queue-dws": ("default", "cluster-queue-dws")}
    assert plan.outputs["localQueue"] == "user-queue"
    assert plan.outputs["queueChain"] == [
        {"flavor": "on-demand", "clusterQueue": "cluster-queue", "localQueue": "user-queue"},
        {"flavor": "dws", "clusterQueue": "cluster-queue-dws", "localQueue": "user-queue-dws"},
    ]


def test_each_quota_lives_in_the_queue_whose_chain_starts_at_it():
    queues = of_kind(plan_for(), "ClusterQueue")
    none = {"cpu": "0", "memory": "0", "google.com/tpu": "0"}
    assert quotas(queues["cluster-queue"]["spec"]) == {
        "default-cpu": {"cpu": "48", "memory": "192Gi", "google.com/tpu": "0"},
        "on-demand": {"cpu": "720", "memory": "2880Gi", "google.com/tpu": "16"},
        "dws": none,
    }
    assert quotas(queues["cluster-queue-dws"]["spec"]) == {
        "default-cpu": none,
        "dws": {"cpu": "720", "memory": "2880Gi", "google.com/tpu": "16"},
    }
    for queue in queues.values():  # a queue borrows the rest from the cohort: no limit may stop it
        for flavor in queue["spec"]["resourceGroups"][0]["flavors"]:
            assert all("borrowingLimit" not in r and "lendingLimit" not in r for r in flavor["resources"])


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_the_queues_together_never_admit_more_than_the_pools_hold(stack):
    plan = plan_for(stack)
    total = capacity(plan)
    chips = plan.outputs["tpuChips"]
    assert {flavor: int(total[flavor]["google.com/tpu"]) for flavor in total if flavor != "default-cpu"} == {
        flavor: chips[key] for flavor, key in PLAN_CHIPS_KEY.items() if key in chips}
    if "teams" in plan.outputs:
        # Several teams: the shares and the root Cohort's rest hold exactly what the same stack holds for one team.
        single = plan_for(stack, {"teams": [], "googleGroupsDomain": ""})
        assert not of_kind(single, "Cohort")
        assert total == capacity(single)
        # Only the root Cohort and each team's first rung hold quota; the platform's own chain borrows.
        firsts = {team["queueChain"][0]["clusterQueue"] for team in plan.outputs["teams"].values()}
        for kind in ("ClusterQueue", "Cohort"):
            for name, q in of_kind(plan, kind).items():
                held = {v for f in quotas(q["spec"]).values() for v in f.values()} if q["spec"].get(
                    "resourceGroups") else {"0"}
                assert held <= {"0"} or name in firsts | {"tpu-fallback"}, (kind, name)
        return
    # default-cpu is counted once too: the system pool's capacity, in the first queue only.
    first = quotas(of_kind(plan, "ClusterQueue")["cluster-queue"]["spec"])["default-cpu"]
    assert {r: total["default-cpu"][r] for r in ("cpu", "memory")} == {r: first[r] for r in ("cpu", "memory")}
    # No flavor holds quota in two queues.
    for flavor in total:
        holders = [name for name, q in of_kind(plan, "ClusterQueue").items()
                   if flavor in quotas(q["spec"]) and set(quotas(q["spec"])[flavor].values()) != {"0"}]
        assert len(holders) == 1, (flavor, holders)


def test_every_queue_of_a_chain_is_in_the_cohort():
    queues = of_kind(plan_for(), "ClusterQueue")
    assert {name: q["spec"].get("cohortName") for name, q in queues.items()} == {
        "cluster-queue": "tpu-fallback", "cluster-queue-dws": "tpu-fallback"}


def test_the_dws_check_is_on_the_dws_flavor_only_in_every_queue():
    for name, queue in of_kind(plan_for(), "ClusterQueue").items():
        assert queue["spec"]["admissionChecksStrategy"] == {
            "admissionChecks": [{"name": "dws-prov", "onFlavors": ["dws"]}]}, name


def test_dws_only_stack_has_a_single_queue_and_no_cohort(crd_schemas):
    plan = plan_for("team-c-us-west4-a")
    queues = of_kind(plan, "ClusterQueue")
    assert list(queues) == ["cluster-queue"]
    assert "cohortName" not in queues["cluster-queue"]["spec"]
    assert quotas(queues["cluster-queue"]["spec"])["dws"]["google.com/tpu"] == "32"
    assert list(of_kind(plan, "LocalQueue")) == ["user-queue"]
    assert plan.outputs["queueChain"] == [
        {"flavor": "dws", "clusterQueue": "cluster-queue", "localQueue": "user-queue"}]
    assert validation_errors(queues["cluster-queue"]) == []


def test_an_own_namespace_gets_the_whole_chain_of_local_queues(crd_schemas):
    plan = plan_for(overrides={"workloads": {"namespace": "team-a"}})
    queues = [m for m in plan.kubernetes_manifests() if m["kind"] == "LocalQueue"]
    assert {(q["metadata"]["namespace"], q["metadata"]["name"], q["spec"]["clusterQueue"]) for q in queues} == {
        ("default", "user-queue", "cluster-queue"), ("default", "user-queue-dws", "cluster-queue-dws"),
        ("team-a", "user-queue", "cluster-queue"), ("team-a", "user-queue-dws", "cluster-queue-dws"),
    }
    assert all(validation_errors(q) == [] for q in queues)
    cluster_queues = {r.inputs["metadata"]["name"]: r.urn
                      for r in plan.of_type("kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue")}
    for local_queue in plan.of_type("kubernetes:kueue.x-k8s.io/v1beta2:LocalQueue"):
        assert cluster_queues[local_queue.inputs["spec"]["clusterQueue"]] in local_queue.dependencies


def test_tpu7x_quotas_flavors_and_chips_come_from_its_catalogue_row():
    """Ironwood, one 2x2x2 slice per rung: 2 tpu7x-standard-4t VMs (224 vCPUs, 960 GB, 4 chips each)."""
    plan = plan_for("ironwood-us-central1-c")
    slice_quota = {"cpu": "448", "memory": "1920Gi", "google.com/tpu": "8"}
    got = capacity(plan)
    assert {flavor: got[flavor] for flavor in ("reservation", "on-demand", "spot", "dws")} == {
        flavor: slice_quota for flavor in ("reservation", "on-demand", "spot", "dws")}
    assert plan.outputs["tpuChips"] == {"reservation": 8, "onDemand": 8, "spot": 8, "flexStart": 8}
    assert plan.outputs["tpuQuota"] == {"reserved": 8, "onDemand": 8, "preemptible": 16}
    flavors = of_kind(plan, "ResourceFlavor")
    assert {name: flavors[name]["spec"]["nodeLabels"] for name in ("on-demand", "dws")} == {
        "on-demand": {"tpu-fallback/capacity": "on-demand"}, "dws": {"tpu-fallback/capacity": "dws"}}
