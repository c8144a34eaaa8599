"""Capacity probes (failover/regional/probes.py): where one stands and when it goes, the probe pod, and the shapes
the stack writes (infra/failover.py `probes`), checked against the plan's own node pools (testbed/gke.py)."""

from __future__ import annotations

import datetime
import json

from failover import api
from failover.api.probes import PROBE_LABEL, Probes, ProbeShape
from failover.config import RegionalConfig
from failover.regional import probes
from failover.api.climbs import Need, Sample
from infra import failover as stack_failover
from testbed.gke import node_templates, why_not
from tests.conftest import plan_for
from tests.test_failover_config import deployment_env

CHAIN = api.Chain.from_json(json.dumps([
    {"flavor": flavor, "clusterQueue": f"cq-{flavor}", "localQueue": f"lq-{flavor}", "admissionCheck": check,
     "recoverySeconds": 600}
    for flavor, check in (("reservation", False), ("on-demand", False), ("spot", False), ("dws", True))]))
NOW = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.timezone.utc)
TOLERATE_TPU = {"key": api.TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
PROBES = Probes("tpu-fallback-system", "registry.k8s.io/pause:3.10", (
    ProbeShape("on-demand", {"tpu-fallback/capacity": "on-demand"}, (TOLERATE_TPU,), 4),
    ProbeShape("spot", {"tpu-fallback/capacity": "spot"}, (TOLERATE_TPU,), 4)))
NEED = Need(16, 4)
LADDER = {"reservation": {"reservations": [{"name": "team-v6e", "slices": 1}]}, "spot": {"maxSlices": 1},
          "fallback": {"climbBack": {"to": ["reservation", "onDemand"]}}}


def numbers(**by_flavor):
    """now_on(flavor): (free chips, idle hosts) as a sample; a flavor not given is unknown."""
    return lambda flavor: Sample(NOW, *by_flavor[flavor.replace("-", "_")]) if flavor.replace("-", "_") in by_flavor \
        else None


# ---- where a probe stands -----------------------------------------------------------------------------------------
def test_a_probe_stands_on_each_rung_above_a_waiting_job_with_its_quota_free_and_no_slice():
    on_dws = [(3, NEED)]
    assert probes.wanted(CHAIN, PROBES, on_dws, numbers(on_demand=(16, 0), spot=(16, 0))) == {"on-demand", "spot"}


def test_no_probe_where_the_quota_is_taken_a_slice_is_idle_or_nothing_is_known():
    on_dws = [(3, NEED)]
    assert probes.wanted(CHAIN, PROBES, on_dws, numbers(on_demand=(8, 0), spot=(16, 4))) == set()
    assert probes.wanted(CHAIN, PROBES, on_dws, numbers()) == set()


def test_no_probe_below_or_at_the_job_s_rung_nor_on_a_rung_without_a_shape():
    # Waiting at on-demand's queue: only the reservation is above it, and a reservation has no probe (its quota
    # is its capacity).
    assert probes.wanted(CHAIN, PROBES, [(1, NEED)], numbers(reservation=(16, 0), on_demand=(16, 0),
                                                           spot=(16, 0))) == set()
    assert probes.wanted(CHAIN, PROBES, [(2, NEED)], numbers(on_demand=(16, 0), spot=(16, 0))) == {"on-demand"}
    assert probes.wanted(CHAIN, PROBES, [], numbers(on_demand=(16, 0))) == set()


# ---- when it goes -------------------------------------------------------------------------------------------------
def pod(bound=False, deleting=False, name="capacity-probe-on-demand"):
    return probes.ProbePod(name, "on-demand", bound, deleting)


def test_a_wanted_probe_is_created_once_and_kept_placed_until_the_rung_shows_the_slice():
    assert probes.next_probe_step(True, []) == (probes.CREATE, None)
    assert probes.next_probe_step(True, [pod()]) is None  # pending: the autoscaler keeps trying
    # Placed while the rung's numbers do not show the slice yet (its nodes' informer behind): kept, not made again.
    assert probes.next_probe_step(True, [pod(bound=True)]) is None
    # The slice shown idle: no longer wanted, it goes.
    assert probes.next_probe_step(False, [pod(bound=True)]) == (probes.DELETE, "capacity-probe-on-demand")
    # The last one still going: no second probe beside it until it is gone.
    assert probes.next_probe_step(True, [pod(bound=True, deleting=True)]) is None


def test_a_probe_no_longer_wanted_goes_and_none_is_made():
    assert probes.next_probe_step(False, [pod()]) == (probes.DELETE, "capacity-probe-on-demand")
    assert probes.next_probe_step(False, []) is None


def test_the_probe_pod_is_one_host_of_the_rung_in_no_queue_and_reads_back_as_such():
    obj = probes.probe_pod(PROBES.shapes[1], PROBES)
    assert obj["metadata"] == {"name": "capacity-probe-spot", "namespace": "tpu-fallback-system",
                               "labels": {PROBE_LABEL: "spot"}}
    assert "kueue.x-k8s.io/queue-name" not in obj["metadata"]["labels"]  # Kueue manages only pods that name a queue
    (container,) = obj["spec"]["containers"]
    assert container["resources"]["requests"] == {api.TPU_RESOURCE: "4"}
    assert (container["image"], obj["spec"]["nodeSelector"]) == ("registry.k8s.io/pause:3.10",
                                                                 {"tpu-fallback/capacity": "spot"})
    assert probes.probe_pod_view({**obj, "spec": {**obj["spec"], "nodeName": "n"}}) == probes.ProbePod(
        "capacity-probe-spot", "spot", True, False)


# ---- the shapes the stack writes ----------------------------------------------------------------------------------
def regional(overrides=None) -> RegionalConfig:
    return RegionalConfig.from_env(deployment_env(plan_for(overrides=overrides), stack_failover.NAME))


def test_the_stack_probes_every_rung_whose_capacity_only_a_try_shows():
    """dev: on-demand (DWS is last and provisions on request); the ladder: on-demand and Spot, not the reservation
    (its quota is its capacity) nor DWS. fallback.climbBack.probe false: none."""
    assert [shape.flavor for shape in regional().probes.shapes] == ["on-demand"]
    ladder = regional(LADDER).probes
    assert (ladder.namespace, ladder.image) == (stack_failover.NAMESPACE, stack_failover.PROBE_IMAGE)
    assert [shape.flavor for shape in ladder.shapes] == ["on-demand", "spot"]
    off = {**LADDER, "fallback": {"climbBack": {"to": ["reservation"], "probe": False}}}
    assert regional(off).probes.shapes == ()


def test_each_probe_fits_its_rung_s_pools_and_no_other_tpu_pool():
    """The probe pod of each rung, judged by the scheduler's own tests over the plan's node pools as GKE makes them:
    it fits one pool of its rung (so the autoscaler grows that one) and no pool of another rung."""
    plan = plan_for(overrides=LADDER)
    config = RegionalConfig.from_env(deployment_env(plan, stack_failover.NAME))
    templates = [t for t in node_templates(plan) if t.tpu]
    for shape in config.probes.shapes:
        spec = probes.probe_pod(shape, config.probes)["spec"]
        fitting = {t.labels.get(api.CAPACITY_LABEL) for t in templates if why_not(t, spec) is None}
        assert fitting == {shape.flavor}, (shape.flavor, fitting)
