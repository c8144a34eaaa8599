"""A job's scheduling goodput (failover/api/goodput.py): scripted timelines of a job's objects, each state's seconds
exact, and what is estimated said so. The regional program's goodput controller (failover/regional/goodput.py): its
metrics from the shared cache, its memory of what it watched, and a restart that loses nothing the objects hold."""

from __future__ import annotations

import datetime
import json

import pytest
from prometheus_client import CollectorRegistry

from failover import api
from failover.api import goodput
from failover.api.goodput import (BROKEN_SLICE, CAPACITY_WAIT, MOVE, QUOTA_WAIT, RUNNING, STARTING, UNRECORDED,
                                  JobTimes, account)

T0 = datetime.datetime(2026, 12, 2, 12, 0, tzinfo=datetime.timezone.utc)
ON_DEMAND, DWS = "on-demand", "dws"


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def stamp(seconds: float) -> str:
    return api.format_time(at(seconds))


def condition(kind: str, since: float, status: bool = True, reason: str = "") -> dict:
    return {"type": kind, "status": "True" if status else "False", "lastTransitionTime": stamp(since),
            "reason": reason or kind}


def workload(*conditions: dict, flavor: str | None = None, queue: str = "user-queue", created: float = 1,
             recorded: str | None = None) -> dict:
    """A RayJob's Workload (4 TPU hosts) with these conditions; `flavor` its admission's while quota is reserved."""
    status: dict = {"conditions": list(conditions)}
    if flavor:
        status["admission"] = {"clusterQueue": "cluster-queue", "podSetAssignments": [
            {"name": "workers", "flavors": {api.TPU_RESOURCE: flavor}}]}
    annotations = {api.ADMITTED_FLAVOR_ANNOTATION: recorded} if recorded else {}
    return {"metadata": {"name": "job-a1b2c", "namespace": "team", "creationTimestamp": stamp(created),
                         "resourceVersion": "1", "annotations": annotations,
                         "ownerReferences": [{"kind": "RayJob", "name": "job", "uid": "u1", "controller": True}]},
            "spec": {"queueName": queue, "podSets": [{"name": "workers", "count": 4, "template": {"spec": {
                "containers": [{"name": "w", "resources": {"requests": {api.TPU_RESOURCE: "4"}}}]}}}]},
            "status": status}


def move(source: str, target: str, reason: str, start: float, state: str = api.MOVED) -> api.Move:
    return api.Move(source, target, f"user-queue-{target}", reason, stamp(start), state)


def rayjob(history: tuple[api.Move, ...] = (), moving: api.Move | None = None, lost: api.LostSlice | None = None,
           created: float = 0) -> dict:
    annotations = {}
    if history:
        annotations[api.MOVES_ANNOTATION] = json.dumps([json.loads(m.to_json()) for m in history])
    if moving is not None or history:
        annotations[api.FAILOVER_ANNOTATION] = (moving or history[-1]).to_json()
    if lost is not None:
        annotations[api.SLICE_LOST_ANNOTATION] = lost.to_json()
    return {"name": "job", "namespace": "team", "creationTimestamp": stamp(created), "annotations": annotations}


def lost_slice(flavor: str, start: float, until: float, recovered: float | None = None) -> api.LostSlice:
    return api.LostSlice(flavor, stamp(start), "a host's node is gone", stamp(until),
                         api.RECOVERED if recovered is not None else api.LOST,
                         stamp(recovered) if recovered is not None else "")


def times(job: dict | None, wl: dict | None, waiting_on: str = ON_DEMAND) -> JobTimes:
    return JobTimes.of(job, api.WorkloadView.from_object(wl) if wl else None, waiting_on)


def spent(result: goodput.Account) -> dict[str, float]:
    """The states with time in them."""
    return {state: seconds for state, seconds in result.seconds.items() if seconds}


# ---- the account --------------------------------------------------------------------------------------------------

def test_a_job_that_waited_for_quota_started_and_runs():
    """Submitted at 0, its Workload made at 1, quota and admission at 30, every pod ready at 90; at 300 it has run
    210 s of 300: 70%, every second recorded."""
    wl = workload(condition("QuotaReserved", 30), condition("Admitted", 30), condition("PodsReady", 90,
                                                                                      reason="Started"),
                  flavor=ON_DEMAND)
    result = account(times(rayjob(), wl), at(300))
    assert spent(result) == {QUOTA_WAIT: 30, STARTING: 60, RUNNING: 210}
    assert result.by_rung == {(QUOTA_WAIT, ON_DEMAND): 30, (STARTING, ON_DEMAND): 60, (RUNNING, ON_DEMAND): 210}
    assert result.goodput == pytest.approx(0.7)
    assert result.estimated_seconds == 0


def test_a_job_kueue_has_not_made_a_workload_for_waits_for_quota():
    result = account(times(rayjob(), None), at(5))
    assert spent(result) == {QUOTA_WAIT: 5} and result.goodput == 0


def test_a_stocked_out_job_moved_to_dws_waited_for_its_slice_and_runs():
    """Stockout on on-demand, moved at 200 (reactivated at 202), DWS quota at 203, provisioned and admitted at 500,
    ready at 560; at 1000: the stretch before the move is on-demand's capacity wait (estimated: what it did inside
    is no longer recorded), the rest is exact."""
    wl = workload(condition("QuotaReserved", 203), condition("Admitted", 500), condition("PodsReady", 560,
                                                                                        reason="Started"),
                  condition("Requeued", 202, reason="Reactivated"), flavor=DWS, queue="user-queue-dws")
    result = account(times(rayjob((move(ON_DEMAND, DWS, api.STOCKOUT, 200),)), wl, waiting_on=DWS), at(1000))
    assert result.by_rung == {(CAPACITY_WAIT, ON_DEMAND): 200, (MOVE, DWS): 2, (QUOTA_WAIT, DWS): 1,
                              (CAPACITY_WAIT, DWS): 297, (STARTING, DWS): 60, (RUNNING, DWS): 440}
    assert result.goodput == pytest.approx(0.44)
    assert result.estimated_seconds == 200


def test_an_earlier_moves_own_time_is_not_recorded_and_counts_nothing():
    """Two moves: the first's end is overwritten by the second's (Kueue's Requeued keeps the last), so the stretch
    after it starts at its start."""
    history = (move("reservation", ON_DEMAND, api.PODS_READY_TIMEOUT, 100), move(ON_DEMAND, DWS, api.STOCKOUT, 250))
    wl = workload(condition("QuotaReserved", 260), condition("Requeued", 252, reason="Reactivated"), flavor=DWS,
                  queue="user-queue-dws")
    result = account(times(rayjob(history), wl, waiting_on=DWS), at(400))
    assert result.by_rung == {(CAPACITY_WAIT, "reservation"): 100, (CAPACITY_WAIT, ON_DEMAND): 150, (MOVE, DWS): 2,
                              (QUOTA_WAIT, DWS): 8, (CAPACITY_WAIT, DWS): 140}
    assert result.estimated_seconds == 250


def test_a_move_in_progress_counts_as_moving_since_it_started():
    wl = workload(condition("QuotaReserved", 40, status=False), condition("Evicted", 40, reason="Deactivated"),
                  recorded=ON_DEMAND)
    result = account(times(rayjob(moving=move(ON_DEMAND, DWS, api.STOCKOUT, 38, api.MOVING)), wl), at(41))
    assert result.by_rung == {(CAPACITY_WAIT, ON_DEMAND): 38, (MOVE, DWS): 3}


def test_a_slice_lost_run_moved_on_counts_the_wait_for_it_as_broken():
    """Ran on spot, lost its slice at 400, moved at 520 when the recovery wait ended; now pending on DWS. The run
    before the loss is counted as running from the submission (its start and quota wait are no longer recorded)."""
    history = (move("spot", DWS, api.SLICE_LOST, 520),)
    wl = workload(condition("QuotaReserved", 519, status=False), condition("Evicted", 519, reason="Deactivated"),
                  condition("Requeued", 521, reason="Reactivated"), queue="user-queue-dws", recorded="spot")
    result = account(times(rayjob(history, lost=lost_slice("spot", 400, 520)), wl, waiting_on=DWS), at(600))
    assert result.by_rung == {(RUNNING, "spot"): 400, (BROKEN_SLICE, "spot"): 120, (MOVE, DWS): 1,
                              (QUOTA_WAIT, DWS): 79}
    assert result.estimated_seconds == 400


def test_a_slice_lost_and_recovered_in_place():
    """Ready at 60, its slice lost at 300 and whole again at 330: running, broken for 30 s, running again."""
    wl = workload(condition("QuotaReserved", 10), condition("Admitted", 10), condition("PodsReady", 60,
                                                                                      reason="Started"),
                  flavor=ON_DEMAND)
    result = account(times(rayjob(lost=lost_slice(ON_DEMAND, 300, 420, recovered=330)), wl), at(400))
    assert spent(result) == {QUOTA_WAIT: 10, STARTING: 50, RUNNING: 240 + 70, BROKEN_SLICE: 30}
    assert result.estimated_seconds == 0


def test_pods_not_ready_again_after_a_run_wait_for_the_lost_slice():
    """Kueue's PodsReady turns False (WaitForRecovery) when a pod fails after the start; the loss's record says when
    the slice broke. When the job first ran is overwritten: running from the admission, estimated."""
    wl = workload(condition("QuotaReserved", 10), condition("Admitted", 10),
                  condition("PodsReady", 495, status=False, reason="WaitForRecovery"), flavor=ON_DEMAND)
    result = account(times(rayjob(lost=lost_slice(ON_DEMAND, 490, 610)), wl), at(550))
    assert spent(result) == {QUOTA_WAIT: 10, RUNNING: 480, BROKEN_SLICE: 60}
    assert result.estimated_seconds == 480


def test_pods_ready_again_after_a_recovery():
    wl = workload(condition("QuotaReserved", 10), condition("Admitted", 10),
                  condition("PodsReady", 340, reason="Recovered"), flavor=ON_DEMAND)
    result = account(times(rayjob(lost=lost_slice(ON_DEMAND, 300, 420, recovered=340)), wl), at(400))
    assert spent(result) == {QUOTA_WAIT: 10, RUNNING: 290 + 60, BROKEN_SLICE: 40}
    assert result.estimated_seconds == 290


def test_kueues_pods_ready_eviction_on_the_last_rung_is_a_wait_for_capacity():
    """No move on the last rung: Kueue evicted it (PodsReadyTimeout) at 300 and it waits again."""
    wl = workload(condition("QuotaReserved", 300, status=False), condition("Evicted", 300, reason="PodsReadyTimeout"),
                  queue="user-queue-dws", recorded=DWS)
    result = account(times(rayjob(), wl, waiting_on=DWS), at(360))
    assert result.by_rung == {(CAPACITY_WAIT, DWS): 300, (QUOTA_WAIT, DWS): 60}


def test_a_preempted_job_s_earlier_admission_is_unrecorded():
    wl = workload(condition("QuotaReserved", 300, status=False), condition("Evicted", 300, reason="Preempted"),
                  recorded=ON_DEMAND)
    result = account(times(rayjob(), wl), at(360))
    assert spent(result) == {UNRECORDED: 300, QUOTA_WAIT: 60}
    assert result.goodput == 0


def test_a_finished_job_s_account_ends_at_its_finish():
    wl = workload(condition("QuotaReserved", 10), condition("Admitted", 10), condition("PodsReady", 20,
                                                                                      reason="Started"),
                  condition("Finished", 120, reason="Succeeded"), flavor=ON_DEMAND)
    result = account(times(rayjob(), wl), at(5000))
    assert result.end == at(120) and spent(result) == {QUOTA_WAIT: 10, STARTING: 10, RUNNING: 100}


def test_what_a_watcher_saw_stays_exact_after_the_move_and_takes_the_moves_reason():
    """Seen at 150: pending 10 s, admitted and not ready since. After the Stockout move at 200 the objects estimate
    the whole stretch; the watcher's memory keeps its first 150 s exact, its start now counted as capacity."""
    before = workload(condition("QuotaReserved", 10), condition("Admitted", 10),
                      condition("PodsReady", 10, status=False, reason="WaitForStart"), flavor=ON_DEMAND)
    seen = account(times(rayjob(), before), at(150))
    assert spent(seen) == {QUOTA_WAIT: 10, STARTING: 140}
    after = workload(condition("QuotaReserved", 203), condition("Requeued", 202, reason="Reactivated"), flavor=DWS,
                     queue="user-queue-dws")
    moved = times(rayjob((move(ON_DEMAND, DWS, api.STOCKOUT, 200),)), after, waiting_on=DWS)
    result = account(moved, at(210), seen.segments)
    assert result.by_rung == {(QUOTA_WAIT, ON_DEMAND): 10, (CAPACITY_WAIT, ON_DEMAND): 190, (MOVE, DWS): 2,
                              (QUOTA_WAIT, DWS): 1, (CAPACITY_WAIT, DWS): 7}
    assert result.estimated_seconds == 50  # 150 to 200: after the watcher's last look
    assert account(moved, at(210)).estimated_seconds == 200  # a restarted watcher: the objects' estimate


def test_clipped_counts_a_window_of_a_timeline():
    wl = workload(condition("QuotaReserved", 30), condition("Admitted", 30), condition("PodsReady", 90,
                                                                                      reason="Started"),
                  flavor=ON_DEMAND)
    segments = account(times(rayjob(), wl), at(300)).segments
    assert goodput.clipped(segments, at(20), at(100)) == {(QUOTA_WAIT, ON_DEMAND): 10, (STARTING, ON_DEMAND): 60,
                                                          (RUNNING, ON_DEMAND): 10}


# ---- the goodput controller ---------------------------------------------------------------------------------------

CHAIN = api.Chain((api.Rung(ON_DEMAND, "cluster-queue", "user-queue", False, 600),
                   api.Rung(DWS, "cluster-queue-dws", "user-queue-dws", True, 120)))
GOODPUT, SECONDS = "tpu_fallback_job_scheduling_goodput", "tpu_fallback_scheduling_seconds_total"


class Clock:
    def __init__(self, seconds: float):
        self.now = at(seconds)

    def __call__(self) -> datetime.datetime:
        return self.now

    def set(self, seconds: float) -> None:
        self.now = at(seconds)


def controller(clock: Clock, *objects: tuple[dict, dict]):
    """A goodput controller over a cache holding these (Workload, RayJob metadata) pairs; no server."""
    from failover.regional.goodput import GoodputController
    from failover.runtime.cache import Cache
    from failover.runtime.metrics import Metrics

    made = GoodputController(Cache(None), CHAIN, Metrics(CollectorRegistry()), clock)
    show(made, *objects)
    return made


def show(made, *objects: tuple[dict, dict]) -> None:
    made.workloads.replace([wl for wl, _ in objects])
    made.jobs.replace([{"metadata": job} for _, job in objects])


def sample(made, name: str, **labels: str) -> float | None:
    return made.metrics.registry.get_sample_value(name, labels)


def running_job(ready: float = 90) -> tuple[dict, dict]:
    return (workload(condition("QuotaReserved", 30), condition("Admitted", 30),
                     condition("PodsReady", ready, reason="Started"), flavor=ON_DEMAND), rayjob())


def test_each_jobs_goodput_and_each_states_seconds_per_rung():
    """The first pass declares the namespace's series at 0; a pass a scrape later counts everything since the
    controller started."""
    clock = Clock(100)
    made = controller(clock, running_job())
    made.tick()
    assert sample(made, GOODPUT, job_namespace="team", job_name="job") == pytest.approx(10 / 100)
    assert sample(made, SECONDS, job_namespace="team", state=RUNNING, rung=ON_DEMAND) == 0
    assert sample(made, SECONDS, job_namespace="team", state=MOVE, rung=DWS) == 0
    clock.set(140)
    made.tick()
    assert sample(made, GOODPUT, job_namespace="team", job_name="job") == pytest.approx(50 / 140)
    assert sample(made, SECONDS, job_namespace="team", state=RUNNING, rung=ON_DEMAND) == 40  # 100 to 140
    assert sample(made, SECONDS, job_namespace="team", state=STARTING, rung=ON_DEMAND) == 0  # before it started
    clock.set(150)
    made.tick()
    assert sample(made, SECONDS, job_namespace="team", state=RUNNING, rung=ON_DEMAND) == 50


def test_a_restarted_controller_shows_the_same_goodput_and_counts_only_from_its_start():
    clock = Clock(10)
    first = controller(clock, running_job())
    for seconds in (10, 50, 300):
        clock.set(seconds)
        first.tick()
    again = controller(clock, running_job())  # started at 300
    clock.set(400)
    again.tick()
    assert sample(again, GOODPUT, job_namespace="team", job_name="job") == pytest.approx(310 / 400)
    clock.set(450)
    again.tick()
    assert sample(again, SECONDS, job_namespace="team", state=RUNNING, rung=ON_DEMAND) == 150  # 300 to 450


def test_what_the_controller_watched_before_a_move_stays_exact_until_it_restarts():
    """It saw the job wait 100 s for quota and start for 50 s on spot, then run; after the slice was lost and the
    job moved, the objects estimate the run from the submission (400 s) where the controller remembers 250 s."""
    chain = api.Chain((api.Rung("spot", "cluster-queue", "user-queue", False, 120),) + CHAIN.rungs[1:])
    clock = Clock(300)
    on_spot = workload(condition("QuotaReserved", 100), condition("Admitted", 100),
                       condition("PodsReady", 150, reason="Started"), flavor="spot")
    made = controller(clock, (on_spot, rayjob()))
    made.chain = chain
    made.tick()
    moved = workload(condition("QuotaReserved", 519, status=False), condition("Evicted", 519, reason="Deactivated"),
                     condition("Requeued", 521, reason="Reactivated"), queue="user-queue-dws", recorded="spot")
    job = rayjob((move("spot", DWS, api.SLICE_LOST, 520),), lost=lost_slice("spot", 400, 520))
    show(made, (moved, job))
    clock.set(600)
    made.tick()
    assert sample(made, GOODPUT, job_namespace="team", job_name="job") == pytest.approx(250 / 600)
    restarted = controller(clock, (moved, job))
    restarted.chain = chain
    restarted.tick()
    assert sample(restarted, GOODPUT, job_namespace="team", job_name="job") == pytest.approx(400 / 600)


def test_a_finished_or_deleted_job_leaves_no_series_and_a_job_outside_the_chain_none():
    clock = Clock(200)
    outside = workload(condition("QuotaReserved", 30), queue="another-queue")
    outside["metadata"]["name"] = "other-x1"
    outside["metadata"]["ownerReferences"][0]["name"] = "other"
    made = controller(clock, running_job(), (outside, {**rayjob(), "name": "other"}))
    made.tick()
    assert sample(made, GOODPUT, job_namespace="team", job_name="job") is not None
    assert sample(made, GOODPUT, job_namespace="team", job_name="other") is None
    done = running_job()
    done[0]["status"]["conditions"].append(condition("Finished", 250, reason="Succeeded"))
    show(made, done)
    clock.set(300)
    made.tick()
    assert sample(made, GOODPUT, job_namespace="team", job_name="job") is None
    show(made, running_job())
    made.tick()
    assert sample(made, GOODPUT, job_namespace="team", job_name="job") is not None
    show(made)
    made.tick()
    assert sample(made, GOODPUT, job_namespace="team", job_name="job") is None


def test_a_job_whose_rayjob_is_not_listed_yet_is_left_for_the_next_pass():
    """Before the RayJobs' informer has listed, a moved job would look unmoved: nothing is shown or remembered."""
    clock = Clock(300)
    made = controller(clock, running_job())
    made.jobs.replace([])
    made.tick()
    assert sample(made, GOODPUT, job_namespace="team", job_name="job") is None and not made._kept


@pytest.mark.parametrize("reason", [api.CLIMB_BACK, api.DISRUPTION_AHEAD])
def test_a_running_job_moved_up_or_ahead_of_a_disruption_ran_until_its_move(reason):
    """A climb back to the reservation, or a move ahead of a maintenance, is a move of a running job: the stretch
    before it counts as running (estimated: its start is no longer recorded)."""
    wl = workload(condition("QuotaReserved", 603), condition("Admitted", 603),
                  condition("Requeued", 601, reason="Reactivated"), flavor="reservation")
    result = account(times(rayjob((move("spot", "reservation", reason, 600),)), wl, waiting_on="reservation"),
                     at(610))
    assert result.by_rung == {(RUNNING, "spot"): 600, (MOVE, "reservation"): 1, (QUOTA_WAIT, "reservation"): 2,
                              (STARTING, "reservation"): 7}
    assert result.estimated_seconds == 600
