"""A stocked-out job walks down the whole capacity ladder on the real tier: reservation -> on-demand -> spot -> dws.

Its own file so the test runner can run it beside the other failover scenarios (each has its own tier).
"""

from __future__ import annotations

import pytest

from failover import api
from testbed import jobs
from testbed.failover_tier import NAMESPACE, start_failover_tier
from testbed.kube import wait_for

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
