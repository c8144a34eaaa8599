"""A stocked-out job walks down the whole capacity ladder on the real tier: reservation -> on-demand -> spot -> dws;
and an Ironwood (TPU7x) job is placed, moved by a stockout and finishes on nodes shaped from its own stack's plan.

Its own file so the test runner can run it beside the other failover scenarios (each has its own tier).
"""

from __future__ import annotations

import pytest

from failover import api
from testbed import jobs
from testbed.failover_tier import NAMESPACE, start_failover_tier
from testbed.kube import wait_for
from testbed.status_states import REACTION_TIMEOUT

pytestmark = pytest.mark.controlplane

LADDER = {"reservation": {"reservations": [{"name": "team-a-v6e", "slices": 1}]}, "spot": {"maxSlices": 1}}


def test_a_stocked_out_job_walks_down_the_whole_ladder():
    """reservation -> on-demand -> spot -> dws, one stockout at a time, each moved by the early path."""
    ladder = start_failover_tier(overrides=LADDER)
    try:
        ladder.start_controller()
        # Every rung above DWS is out of capacity, and GKE says so on each run's pods as KubeRay makes them.
        ladder.stockout("reservation", "on-demand", "spot")
        ladder.submit("walker")
        seen = []
        for here, there in (("reservation", "on-demand"), ("on-demand", "spot"), ("spot", "dws")):
            wait_for(lambda h=here: jobs.decision(ladder.kube, NAMESPACE, "walker").flavor == h, 20, f"on {here}")
            seen.append(here)
            wait_for(lambda t=there: (m := ladder.move_of("walker")) and m.to_flavor == t
                     and m.state == api.MOVED, 20, f"moved to {there}")
        jobs.wait_provisioning_request(ladder.kube, NAMESPACE, "walker", timeout=20)
        assert seen == ["reservation", "on-demand", "spot"]
        assert ladder.queues_of("walker") == ("user-queue-dws", "user-queue-dws")
        assert sorted(e["message"].split(" (")[0] for e in ladder.moves_recorded("walker")) == [
            "moved from on-demand to spot", "moved from reservation to on-demand", "moved from spot to dws"]
    finally:
        ladder.plane.stop()


IRONWOOD = "ironwood-us-central1-c"  # a 2x2x2 TPU7x slice per rung: 2 VMs of 4 chips, one workload policy


def test_a_tpu7x_job_is_placed_one_worker_per_host_moved_by_a_stockout_and_finishes():
    """The Ironwood stack's own ladder (reservation, on-demand, Spot, DWS): the reservation is stocked out, the job
    moves to on-demand, whose pool the stand-in grows by one whole slice (2 hosts labelled tpu7x, 2x2x2, 4 chips
    each, the topology read from the pool's workload policy); one worker per host; then the job finishes."""
    tier = start_failover_tier(stack=IRONWOOD)
    try:
        tier.start_controller()
        tier.stockout("reservation")
        tier.submit("ironwood")
        wait_for(lambda: jobs.decision(tier.kube, NAMESPACE, "ironwood").flavor == "reservation", 20, "on reservation")
        wait_for(lambda: (m := tier.move_of("ironwood")) and m.to_flavor == "on-demand" and m.state == api.MOVED, 20,
                 "moved to on-demand")
        wait_for(lambda: tier.running_on("ironwood", "on-demand"), REACTION_TIMEOUT,
                 "running on one on-demand slice, one worker per host")
        assert tier.queues_of("ironwood") == ("user-queue-on-demand", "user-queue-on-demand")
        workers = jobs.pods_of(tier.kube, NAMESPACE, "ironwood")["worker"]
        nodes = {pod["spec"]["nodeName"] for pod in workers}
        assert len(workers) == len(nodes) == 2  # the hosts of a 2x2x2 slice, each worker on its own
        assert nodes == set(tier.gke.nodes_of("on-demand-pool"))
        for name in nodes:
            node = tier.kube.get("v1", "Node", name)
            labels = node["metadata"]["labels"]
            assert (labels["cloud.google.com/gke-tpu-accelerator"], labels["cloud.google.com/gke-tpu-topology"],
                    labels["node.kubernetes.io/instance-type"]) == ("tpu7x", "2x2x2", "tpu7x-standard-4t")
            assert node["status"]["allocatable"]["google.com/tpu"] == "4"
        assert {pod["spec"]["containers"][0]["resources"]["limits"]["google.com/tpu"] for pod in workers} == {"4"}
        tier.plane.after.ray_head.finish(NAMESPACE, "ironwood", "SUCCEEDED")
        wait_for(lambda: any(c["type"] == "Finished" and c["status"] == "True" for c in (
            (jobs.workload_of(tier.kube, NAMESPACE, "ironwood") or {}).get("status", {}).get("conditions") or [])),
            REACTION_TIMEOUT, "the job's Workload finished")
    finally:
        tier.plane.stop()
