"""TPU node pools: derived from the catalogue, autoscaled from zero, plan B with DWS flags."""

from __future__ import annotations

import pytest

from infra.tpu_pool import PLAN_LABEL_KEY
from tests.conftest import plan_for

NODE_POOL = "gcp:container/nodePool:NodePool"


def pools_by_name(plan):
    return {p.inputs["name"]: p.inputs for p in plan.of_type(NODE_POOL)}


def test_seed_pools_match_the_tutorial():
    pools = pools_by_name(plan_for())
    assert set(pools) == {"on-demand-pool", "dws-pool"}
    for pool in pools.values():
        assert pool["cluster"] == "tpu-cluster"
        assert pool["location"] == "us-east5-b"
        assert pool["initialNodeCount"] == 0
        assert pool["autoscaling"]["minNodeCount"] == 0
        assert pool["autoscaling"]["maxNodeCount"] == 4  # per zone: the 4 hosts of a 4x4 slice
        assert not {"totalMinNodeCount", "totalMaxNodeCount"} & set(pool["autoscaling"])
        assert pool["placementPolicy"] == {"type": "COMPACT", "tpuTopology": "4x4"}
        assert pool["nodeConfig"]["machineType"] == "ct6e-standard-4t"
        assert pool["nodeConfig"]["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}


def test_plan_b_pool_is_flex_start_with_queued_provisioning():
    pools = pools_by_name(plan_for())
    dws, on_demand = pools["dws-pool"], pools["on-demand-pool"]
    assert dws["queuedProvisioning"] == {"enabled": True}
    assert dws["nodeConfig"]["flexStart"] is True
    assert dws["management"]["autoRepair"] is False
    assert "queuedProvisioning" not in on_demand and "flexStart" not in on_demand["nodeConfig"]
    assert on_demand.get("management", {}).get("autoRepair", True) is True


def test_each_plan_labels_its_nodes_for_its_flavor():
    pools = pools_by_name(plan_for())
    assert pools["on-demand-pool"]["nodeConfig"]["labels"] == {PLAN_LABEL_KEY: "on-demand"}
    assert pools["dws-pool"]["nodeConfig"]["labels"] == {PLAN_LABEL_KEY: "dws"}


@pytest.mark.parametrize("slices", [2, 3])
def test_multi_host_slices_are_one_pool_each(slices):
    pools = pools_by_name(plan_for(overrides={"onDemand": {"maxSlices": slices}}))
    on_demand = sorted(name for name in pools if name.startswith("on-demand-pool"))
    assert on_demand == [f"on-demand-pool-{i}" for i in range(1, slices + 1)]
    assert all(pools[name]["autoscaling"]["maxNodeCount"] == 4 for name in on_demand)


def test_single_host_slices_share_one_pool_without_placement():
    pools = pools_by_name(plan_for("team-b-us-east5-a"))
    on_demand = pools["team-b-on-demand"]
    assert on_demand["autoscaling"]["maxNodeCount"] == 2  # two single-host slices, one VM each
    assert "placementPolicy" not in on_demand
    assert on_demand["nodeConfig"]["machineType"] == "ct6e-standard-8t"
    assert pools["team-b-dws"]["queuedProvisioning"] == {"enabled": True}


def test_plan_off_has_no_pools():
    pools = pools_by_name(plan_for("team-c-us-west4-a"))
    assert sorted(pools) == ["team-c-dws-1", "team-c-dws-2"]
    assert all(p["placementPolicy"] == {"type": "COMPACT", "tpuTopology": "4x4"} for p in pools.values())


def test_pools_are_children_of_their_plan_component():
    plan = plan_for()
    index = plan.by_urn()
    for pool in plan.of_type(NODE_POOL):
        parent = index[pool.parent]
        assert parent.type == "tpu-fallback:infra:TpuNodePool"
        label = pool.inputs["nodeConfig"]["labels"][PLAN_LABEL_KEY]
        assert parent.name == f"{label}-tpu"


def test_flex_start_output_is_the_gcloud_check():
    outputs = plan_for().outputs
    assert outputs["flexStart"] == {"dws-pool": True}
    assert outputs["nodePools"] == {"onDemand": ["on-demand-pool"], "flexStart": ["dws-pool"]}


def test_spot_pool_keeps_gkes_graceful_shutdown_unless_extended():
    """30s is GKE's default: nothing sent, so no pool asks for a version. 120s: the Spot pools, only they, carry the
    total and the system pods' 15 s in their node system config (pulumi-gcp node_config.kubelet_config ->
    NodeConfig.kubeletConfig). Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms"""
    pools = pools_by_name(plan_for(overrides={"spot": {"maxSlices": 1}}))
    assert all("kubeletConfig" not in pool["nodeConfig"] for pool in pools.values())
    pools = pools_by_name(plan_for(overrides={"gkeVersion": "1.35.0-gke.1171000",
                                              "spot": {"maxSlices": 2, "gracefulTermination": "120s"}}))
    spot = sorted(name for name in pools if name.startswith("spot-pool"))
    assert spot == ["spot-pool-1", "spot-pool-2"]
    for name, pool in pools.items():
        expected = ({"shutdownGracePeriodSeconds": 120, "shutdownGracePeriodCriticalPodsSeconds": 15}
                    if name in spot else None)
        assert pool["nodeConfig"].get("kubeletConfig") == expected, name


# --- TPU7x (Ironwood): multi-host pools placed by one workload policy -----------------------------------------------
IRONWOOD = "ironwood-us-central1-c"
RESOURCE_POLICY = "gcp:compute/resourcePolicy:ResourcePolicy"


def test_a_tpu7x_slice_has_one_high_throughput_workload_policy_with_its_topology():
    policy = plan_for(IRONWOOD).only(RESOURCE_POLICY)
    assert policy.inputs["workloadPolicy"] == {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x2"}
    assert (policy.inputs["region"], policy.inputs["name"]) == ("us-central1", "ironwood-tpu7x-2x2x2-c")
    assert policy.parent.endswith("tpu-fallback:infra:TpuWorkloadPolicy::tpu-workload-policy")


@pytest.mark.parametrize("slices", [1, 2])
def test_every_rung_s_tpu7x_pools_name_the_one_policy_and_no_topology(slices):
    plan = plan_for(IRONWOOD, {"onDemand": {"maxSlices": slices}})
    policy = plan.only(RESOURCE_POLICY)
    pools = pools_by_name(plan)
    on_demand = [f"on-demand-pool-{i}" for i in range(1, slices + 1)] if slices > 1 else ["on-demand-pool"]
    assert set(pools) == {"reserved-pool", *on_demand, "spot-pool", "dws-pool"}
    for pool in pools.values():
        assert pool["placementPolicy"] == {"type": "COMPACT", "policyName": "ironwood-tpu7x-2x2x2-c"}
        assert pool["nodeConfig"]["machineType"] == "tpu7x-standard-4t"
        assert pool["autoscaling"]["maxNodeCount"] == 2  # the 2 VMs of a 2x2x2 slice (8 chips, 4 per VM)
    # Each pool takes the policy's name as an input: Pulumi creates the policy first and deletes it last.
    for pool in plan.of_type(NODE_POOL):
        assert policy.urn in pool.dependencies


def test_a_single_host_tpu7x_slice_needs_no_workload_policy():
    plan = plan_for(IRONWOOD, {"tpu": {"machineType": "tpu7x-standard-4t", "topology": "2x2x1"}})
    assert plan.of_type(RESOURCE_POLICY) == []
    assert all("placementPolicy" not in pool for pool in pools_by_name(plan).values())


def test_other_generations_keep_their_topology_and_no_policy():
    assert plan_for().of_type(RESOURCE_POLICY) == []
    assert pools_by_name(plan_for())["on-demand-pool"]["placementPolicy"] == {"type": "COMPACT", "tpuTopology": "4x4"}
