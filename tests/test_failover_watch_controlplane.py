"""The failover controller reacts to what its watches deliver, not to a resync: with the resync ten minutes away,
both paths still move a stocked-out job, and the controller's metrics say what happened.

A behaviour test, not a timing test: the bounds are the suite's generous ones. The one-second goals live in
bench/bench_controller_scale.py.
"""

from __future__ import annotations

import pytest

from failover import decisions
from tests.controlplane import jobs
from tests.controlplane.failover_tier import (GRACE_SECONDS, NAMESPACE, PODS_READY_TIMEOUT_SECONDS,
                                              controller_running, start_failover_tier)
from tests.controlplane.kube import wait_for

pytestmark = pytest.mark.controlplane

RESYNC_SECONDS = 600  # never reached while these tests run
REACTION_TIMEOUT = 60  # as in test_failover_controlplane.py: four test files share two cores


@pytest.fixture(scope="module")
def tier(request):
    with controller_running(start_failover_tier(), request.session, resync=RESYNC_SECONDS) as tier:
        yield tier


@pytest.fixture
def clean(tier):
    yield tier
    tier.delete_all_jobs()


def _moved(tier, job: str) -> decisions.Move:
    return wait_for(lambda: (m := tier.move_of(job)) and m.state == decisions.MOVED and m, REACTION_TIMEOUT,
                    f"{job}'s move recorded")


def test_the_early_path_acts_when_the_grace_period_ends_without_a_resync(clean):
    tier = clean
    tier.stockout("on-demand")
    tier.submit("watch-early")
    # The event arrives by watch; the grace period ends with no other change: the controller must have queued
    # the Workload for that moment.
    jobs.wait_provisioning_request(tier.kube, NAMESPACE, "watch-early", timeout=GRACE_SECONDS + REACTION_TIMEOUT)
    move = _moved(tier, "watch-early")
    assert (move.from_flavor, move.to_flavor, move.reason) == ("on-demand", "dws", decisions.STOCKOUT)
    assert tier.metric("tpu_fallback_resyncs_total") == 0
    assert tier.metric("tpu_fallback_moves_total", from_flavor="on-demand", to_flavor="dws",
                       reason=decisions.STOCKOUT) == 1
    # Seconds from the stockout signal to the move's first write: at least the grace period.
    assert tier.metric("tpu_fallback_move_delay_seconds_count", reason=decisions.STOCKOUT) == 1
    assert tier.metric("tpu_fallback_move_delay_seconds_sum", reason=decisions.STOCKOUT) >= GRACE_SECONDS - 1
    assert tier.metric("tpu_fallback_watch_events_total", resource="events") >= 1


def test_a_podsready_eviction_is_moved_without_a_resync(clean):
    tier = clean
    waits_before = {flavor: tier.metric("tpu_fallback_admission_wait_seconds_count", flavor=flavor)
                    for flavor in ("on-demand", "dws")}
    tier.stockout("on-demand", reported=False)
    tier.submit("watch-timeout")
    assert jobs.decision(tier.kube, NAMESPACE, "watch-timeout").flavor == "on-demand"
    request = jobs.wait_provisioning_request(tier.kube, NAMESPACE, "watch-timeout",
                                             timeout=PODS_READY_TIMEOUT_SECONDS + REACTION_TIMEOUT)
    move = _moved(tier, "watch-timeout")
    assert (move.from_flavor, move.to_flavor, move.reason) == ("on-demand", "dws", decisions.PODS_READY_TIMEOUT)
    assert tier.queues_of("watch-timeout") == ("user-queue-dws", "user-queue-dws")
    assert tier.metric("tpu_fallback_resyncs_total") == 0
    assert tier.metric("tpu_fallback_moves_total", reason=decisions.PODS_READY_TIMEOUT) == 1
    # From admission to the move: Kueue's timeout, at least.
    assert tier.metric("tpu_fallback_move_delay_seconds_sum",
                       reason=decisions.PODS_READY_TIMEOUT) >= PODS_READY_TIMEOUT_SECONDS - 1
    # Quota reserved on on-demand, then (after the move) on dws: one wait each.
    assert tier.metric("tpu_fallback_admission_wait_seconds_count", flavor="on-demand") == waits_before["on-demand"] + 1
    history = decisions.move_history(tier.kube.get(*jobs.RAYJOB, "watch-timeout", NAMESPACE)["metadata"]
                                     .get("annotations"))
    assert history == [move]

    # GKE provisions the DWS slice: the check's result is counted once.
    (check,) = jobs.check_states(jobs.workload_of(tier.kube, NAMESPACE, "watch-timeout"))
    jobs.mark_provisioned(tier.kube, request, "watch-resize")
    wait_for(lambda: jobs.decision(tier.kube, NAMESPACE, "watch-timeout").admitted, REACTION_TIMEOUT,
             "Admitted on dws")
    wait_for(lambda: tier.metric("tpu_fallback_admission_check_outcomes_total", admission_check=check,
                                 state="Ready") == 1, 10, "the check's Ready counted")
    assert tier.metric("tpu_fallback_admission_wait_seconds_count", flavor="dws") == waits_before["dws"] + 1
