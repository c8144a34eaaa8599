"""Kueue: the release, the queue objects (validated against the upstream CRDs), quotas, and ordering."""

from __future__ import annotations

import pytest

from infra.kueue import COVERED_RESOURCES, FEATURE_GATES
from tests.conftest import SHIPPED_STACKS, plan_for
from tests.k8s_schema import validation_errors

RELEASE = "kubernetes:helm.sh/v3:Release"
KUEUE_KINDS = ("ResourceFlavor", "ClusterQueue", "LocalQueue", "AdmissionCheck", "ProvisioningRequestConfig")


def kueue_objects(plan) -> dict[tuple[str, str], dict]:
    return {(m["kind"], m["metadata"]["name"]): m for m in plan.kubernetes_manifests()
            if m["apiVersion"].startswith("kueue.x-k8s.io/")}


def queue_spec(plan) -> dict:
    return kueue_objects(plan)[("ClusterQueue", "cluster-queue")]["spec"]


def quotas(plan) -> dict[str, dict[str, str]]:
    flavors = queue_spec(plan)["resourceGroups"][0]["flavors"]
    return {f["name"]: {r["name"]: r["nominalQuota"] for r in f["resources"]} for f in flavors}


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
    assert quotas(plan_for()) == {
        "default-cpu": {"cpu": "48", "memory": "192Gi", "google.com/tpu": "0"},
        "on-demand": {"cpu": "720", "memory": "2880Gi", "google.com/tpu": "16"},
        "dws": {"cpu": "720", "memory": "2880Gi", "google.com/tpu": "16"},
    }


def test_quotas_follow_the_slice_count_not_infinity():
    got = quotas(plan_for(overrides={"onDemand": {"maxSlices": 3}, "flexStart": {"maxSlices": 2}}))
    assert got["on-demand"]["google.com/tpu"] == "48"
    assert got["dws"]["google.com/tpu"] == "32"
    single_host = quotas(plan_for("team-b-us-east5-a"))  # 2 x ct6e-standard-8t on demand, 1 via DWS
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
    spec = objects[("ClusterQueue", "cluster-queue")]["spec"]
    assert "admissionChecksStrategy" not in spec
    assert [f["name"] for f in spec["resourceGroups"][0]["flavors"]] == ["default-cpu", "on-demand"]


def test_plan_a_off_means_no_on_demand_flavor():
    objects = kueue_objects(plan_for("team-c-us-west4-a"))
    assert ("ResourceFlavor", "on-demand") not in objects
    spec = objects[("ClusterQueue", "cluster-queue")]["spec"]
    assert [f["name"] for f in spec["resourceGroups"][0]["flavors"]] == ["default-cpu", "dws"]


def test_the_cluster_queue_is_awaited_until_active():
    metadata = kueue_objects(plan_for())[("ClusterQueue", "cluster-queue")]["metadata"]
    assert metadata["annotations"] == {"pulumi.com/waitFor": "condition=Active"}


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_kueue_object_validates_strictly_against_the_crds(stack, crd_schemas):
    objects = kueue_objects(plan_for(stack))
    assert {kind for kind, _ in objects} <= set(KUEUE_KINDS)
    for key, manifest in objects.items():
        assert validation_errors(manifest) == [], key


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
    assert len(custom_resources) == 7
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
    queue = by_kind["ClusterQueue"][0]
    # Created after (so deleted before) every flavor and check it references.
    for kind in ("ResourceFlavor", "AdmissionCheck"):
        assert all(r.urn in queue.dependencies for r in by_kind[kind])
    assert queue.urn in by_kind["LocalQueue"][0].dependencies
    assert by_kind["ProvisioningRequestConfig"][0].urn in by_kind["AdmissionCheck"][0].dependencies


def test_release_waits_for_its_namespace():
    plan = plan_for()
    release = plan.only(RELEASE)
    namespace = plan.only("kubernetes:core/v1:Namespace")
    assert namespace.inputs["metadata"]["name"] == "kueue-system"
    assert namespace.urn in release.dependencies or namespace.urn in release.property_dependencies.get("namespace", [])


def test_feature_gates_constant_is_what_the_release_gets():
    values = plan_for().only(RELEASE).inputs["values"]
    assert values["controllerManager"]["featureGates"] == [dict(g) for g in FEATURE_GATES]
    assert COVERED_RESOURCES == ("cpu", "memory", "google.com/tpu")


def test_required_tpu_quota_is_exported_per_plan():
    assert plan_for().outputs["tpuChips"] == {"onDemand": 16, "flexStart": 16}
    assert plan_for("team-c-us-west4-a").outputs["tpuChips"] == {"flexStart": 32}
