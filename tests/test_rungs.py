"""The capacity ladder: reservation, on-demand, Spot and flex-start rungs, in a validated order."""

from __future__ import annotations

import pytest

from infra.offline import OfflineEngine
from infra.rungs import RUNG_KINDS
from infra.settings import SettingsError
from tests.conftest import config_with, plan_for

NODE_POOL = "gcp:container/nodePool:NodePool"
LADDER = {
    "reservation": {"reservations": [{"name": "team-a-v6e", "slices": 1},
                                     {"name": "projects/shared-capacity/reservations/pool-v6e", "slices": 1}]},
    "onDemand": {"maxSlices": 1},
    "spot": {"maxSlices": 1},
    "flexStart": {"maxSlices": 1},
}


def _pools(plan) -> dict[str, dict]:
    return {r.inputs["name"]: r.inputs for r in plan.of_type(NODE_POOL)}


def _manifests(plan, kind: str) -> dict[str, dict]:
    return {m["metadata"]["name"]: m for m in plan.kubernetes_manifests() if m["kind"] == kind}


def test_the_seed_keeps_its_two_rungs_in_order():
    assert [rung["flavor"] for rung in plan_for().outputs["queueChain"]] == ["on-demand", "dws"]
    assert plan_for().outputs["tpuQuota"] == {"onDemand": 16, "preemptible": 16}


def test_a_four_rung_ladder_derives_pools_flavors_queues_chain_and_quota_from_the_order():
    plan = plan_for("dev", LADDER)
    chain = plan.outputs["queueChain"]
    assert [rung["flavor"] for rung in chain] == ["reservation", "on-demand", "spot", "dws"]
    queue = _manifests(plan, "ClusterQueue")["cluster-queue"]["spec"]
    assert [f["name"] for f in queue["resourceGroups"][0]["flavors"]] == [
        "default-cpu", "reservation", "on-demand", "spot", "dws"]
    assert sorted(_manifests(plan, "ClusterQueue")) == [
        "cluster-queue", "cluster-queue-dws", "cluster-queue-on-demand", "cluster-queue-spot"]
    # 4x4 v6e: 16 chips a slice. Reservations draw on what was reserved, Spot and flex-start on preemptible quota.
    assert plan.outputs["tpuQuota"] == {"reserved": 32, "onDemand": 16, "preemptible": 32}
    assert plan.outputs["tpuChips"] == {"reservation": 32, "onDemand": 16, "spot": 16, "flexStart": 16}


def test_an_explicit_order_is_followed():
    plan = plan_for("dev", {**LADDER, "rungOrder": ["reservation", "spot", "onDemand", "flexStart"]})
    assert [rung["flavor"] for rung in plan.outputs["queueChain"]] == ["reservation", "spot", "on-demand", "dws"]


def test_reservation_pools_consume_exactly_their_reservation():
    pools = _pools(plan_for("dev", LADDER))
    assert pools["reserved-pool-1"]["nodeConfig"]["reservationAffinity"] == {
        "consumeReservationType": "SPECIFIC_RESERVATION", "key": "compute.googleapis.com/reservation-name",
        "values": ["team-a-v6e"]}
    assert pools["reserved-pool-2"]["nodeConfig"]["reservationAffinity"]["values"] == [
        "projects/shared-capacity/reservations/pool-v6e"]
    for name, pool in pools.items():  # nobody else eats into a reservation
        if not name.startswith("reserved-pool"):
            assert pool["nodeConfig"]["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}


def test_single_host_reservations_get_a_pool_each_sized_to_the_reservation():
    plan = plan_for("team-b-us-east5-a", {"reservation": {"reservations": [
        {"name": "res-a", "slices": 3}, {"name": "res-b", "slices": 1}]}})
    pools = _pools(plan)
    assert pools["reserved-pool-1"]["autoscaling"]["maxNodeCount"] == 3
    assert pools["reserved-pool-2"]["autoscaling"]["maxNodeCount"] == 1


def test_spot_pools_are_spot_vms_tainted_and_their_flavor_tolerates_and_selects_them():
    plan = plan_for("dev", LADDER)
    pool = _pools(plan)["spot-pool"]
    assert pool["nodeConfig"]["spot"] is True
    assert pool["nodeConfig"]["taints"] == [{"key": "cloud.google.com/gke-spot", "value": "true",
                                             "effect": "NO_SCHEDULE"}]
    assert "flexStart" not in pool["nodeConfig"] and "queuedProvisioning" not in pool
    flavor = _manifests(plan, "ResourceFlavor")["spot"]["spec"]
    assert flavor["nodeLabels"] == {"tpu-fallback/capacity": "spot", "cloud.google.com/gke-spot": "true"}
    assert flavor["tolerations"] == [{"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true",
                                      "effect": "NoSchedule"}]


def test_only_flex_start_has_the_admission_check_and_the_failover_knows_it():
    import json
    plan = plan_for("dev", LADDER)
    for queue in _manifests(plan, "ClusterQueue").values():
        checks = queue["spec"].get("admissionChecksStrategy", {}).get("admissionChecks", [])
        assert all(check["onFlavors"] == ["dws"] for check in checks)
    (deployment,) = [m for m in plan.kubernetes_manifests()
                     if m["kind"] == "Deployment" and m["metadata"]["name"] == "failover-controller"]
    env = {e["name"]: e["value"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert [(r["flavor"], r["admissionCheck"]) for r in json.loads(env["FAILOVER_CHAIN"])] == [
        ("reservation", False), ("on-demand", False), ("spot", False), ("dws", True)]


def test_every_rung_is_one_catalogue_entry():
    assert list(RUNG_KINDS) == ["reservation", "onDemand", "spot", "flexStart"]
    assert len({kind.flavor for kind in RUNG_KINDS.values()}) == len(RUNG_KINDS)


def _problems(overrides: dict) -> list[str]:
    engine = OfflineEngine("dev")
    with pytest.raises(SettingsError) as error:
        engine.run(config_with(overrides))
    assert engine.recorded == []  # nothing half-created
    return error.value.problems


@pytest.mark.parametrize("overrides, key", [
    ({"reservation": {"reservations": [{"name": "Bad_Name", "slices": 1}]}}, "reservation.reservations[0].name"),
    ({"reservation": {"reservations": [{"name": "projects/x/reservations/r", "slices": 1}]}},
     "reservation.reservations[0].name"),  # not a project ID
    ({"reservation": {"reservations": [{"name": "r", "slices": 0}]}}, "reservation.reservations[0].slices"),
    ({"reservation": {"reservations": [{"name": "r"}]}}, "reservation.reservations[0]"),
    ({"reservation": {"reservations": [{"name": "r", "slices": 1}, {"name": "r", "slices": 2}]}},
     "reservation.reservations"),
    ({"spot": {"maxSlices": 65}}, "spot.maxSlices"),
    ({"spot": {"nodePool": "on-demand-pool", "maxSlices": 1}}, "spot.nodePool"),  # pool name taken
    ({"reservation": {"nodePool": "default-pool", "reservations": [{"name": "r", "slices": 1}]}},
     "reservation.nodePool"),
    ({"rungOrder": ["onDemand", "flexStart", "spot"]}, "rungOrder"),  # spot is off
    ({"rungOrder": ["onDemand"]}, "rungOrder"),  # flexStart is on but missing
    ({"rungOrder": ["onDemand", "onDemand", "flexStart"]}, "rungOrder"),
    ({"rungOrder": ["cheap", "onDemand", "flexStart"]}, "rungOrder"),
    ({"rungOrder": "onDemand"}, "rungOrder"),
])
def test_bad_ladder_config_is_rejected_by_key(overrides, key):
    problems = _problems(overrides)
    assert any(problem.startswith(f"tpu-fallback:{key}:") for problem in problems), problems
