"""Climbing back (issue 36), on the failover tier: real Kueue, KubeRay, kube-scheduler and KWOK nodes shaped like the
plan's pools, the failover controller with its ServiceAccount's rights. A job that fell to Spot moves back up to the
reservation once the reservation has had a free slice for `fallback.climbBack.settle`, after its checkpoint request's
save time, one run at a time, once.

Its own tier (the failover tier's fixture, with this stack's ladder): reservation (1 slice), on-demand, Spot (1
slice), DWS; `fallback.climbBack` and `fallback.maintenance.saveTimeout` set through stack config as a user would,
on the tier's clock.
"""

from __future__ import annotations

import datetime
import time

import pytest

from failover import api
from failover.api.climbs import CHECKPOINTING, CLIMB_BACK, CLIMB_BACK_WAITING, CLIMB_EVENT_REASON
from failover.api.probes import PROBE_LABEL
from failover.regional import decisions
from infra import kueue as stack_kueue
from ops.status.render import move_words
from ops.status.report import build_report
from ops.status.snapshot import ClusterReader
from testbed import jobs
from testbed.failover_tier import NAMESPACE, Runs, controller_running, start_failover_tier
from testbed.kube import condition, wait_for

pytestmark = pytest.mark.controlplane

SETTLE_SECONDS = 5
SAVE_SECONDS = 10  # fallback.maintenance.saveTimeout's lowest
MIN_RUNTIME_SECONDS = 5
# The bound: the climb starts within settle + 2 s of the rung's slice freeing.
CLIMB_SLACK_SECONDS = 2
REACTION = 90  # generous: nothing timed here but what the issue bounds
LADDER = {"reservation": {"reservations": [{"name": "team-v6e", "slices": 1}]}, "spot": {"maxSlices": 1},
          "fallback": {"stockoutGracePeriod": "4s", "maintenance": {"saveTimeout": f"{SAVE_SECONDS}s"},
                       "climbBack": {"to": ["reservation", "onDemand"], "settle": f"{SETTLE_SECONDS}s",
                                     "minRuntime": f"{MIN_RUNTIME_SECONDS}s", "minInterval": "10m"}}}


@pytest.fixture(scope="module")
def tier(request):
    with controller_running(start_failover_tier(overrides=LADDER), request.session) as tier:
        yield tier


@pytest.fixture
def clean(tier):
    yield tier
    tier.delete_all_jobs()


def reserved_chips(tier, flavor: str) -> int:
    """The TPU chips Kueue has reserved of `flavor` in the ClusterQueue that holds its quota."""
    queue = tier.kube.get(stack_kueue.KUEUE_API_VERSION, "ClusterQueue", stack_kueue.CLUSTER_QUEUE)
    return sum(int(resource.get("total", 0)) for usage in (queue.get("status") or {}).get("flavorsReservation") or []
               if usage["name"] == flavor for resource in usage.get("resources") or []
               if resource["name"] == api.TPU_RESOURCE)


def not_before_settle(climb: api.Move, asked_to_free: datetime.datetime) -> bool:
    """The climb began no earlier than the settle time after the rung could first have freed (when the test asked
    for it): its record's time is whole seconds, truncated, so it may read up to 1 s early."""
    began_by = api.parse_time(climb.at) + datetime.timedelta(seconds=1)
    return began_by >= asked_to_free + datetime.timedelta(seconds=SETTLE_SECONDS)


def climb_events(tier, job: str) -> list[dict]:
    return [e for e in tier.kube.list("v1", "Event", namespace=NAMESPACE)
            if e["involvedObject"].get("kind") == "RayJob" and e["involvedObject"]["name"] == job
            and e["reason"] == CLIMB_EVENT_REASON]


def test_a_job_on_spot_climbs_back_to_the_freed_reservation_after_its_save_once(clean):
    tier = clean
    tier.stockout("on-demand")  # GCE has no on-demand TPUs: the second job goes down to Spot
    tier.submit("holder")
    wait_for(lambda: tier.running_on("holder", "reservation"), REACTION, "the holder running on the reservation")
    tier.submit("climber")
    runs = Runs(tier, "climber", REACTION)
    runs.wait(lambda: tier.running_on("climber", "spot"), "the climber running on Spot")
    jobs.wait_pods_ready(tier.kube, NAMESPACE, "climber", REACTION)
    down = tier.move_of("climber")
    assert (down.from_flavor, down.to_flavor, down.reason, down.state) == ("on-demand", "spot", api.STOCKOUT, api.MOVED)
    time.sleep(MIN_RUNTIME_SECONDS)  # past its first minutes on Spot: only the reservation's settle time is awaited

    # The reservation's slice frees: Kueue releases the holder's quota.
    asked_to_free = datetime.datetime.now(datetime.timezone.utc)
    tier.kube.delete(*jobs.RAYJOB, "holder", NAMESPACE, propagation="Background")
    wait_for(lambda: reserved_chips(tier, "reservation") == 0, REACTION, "the reservation's quota released",
             interval=0.1)
    freed = datetime.datetime.now(datetime.timezone.utc)

    climb = runs.wait(lambda: (m := tier.move_of("climber")) and m.reason == CLIMB_BACK and m, "the climb started",
                      SETTLE_SECONDS + REACTION)
    started = (datetime.datetime.now(datetime.timezone.utc) - freed).total_seconds()
    assert (climb.from_flavor, climb.to_flavor, climb.to_local_queue) == ("spot", "reservation", "user-queue")
    # Seen within settle + 2 s of the release seen (both polled every 0.1 s), and never before the settle time.
    assert started <= SETTLE_SECONDS + CLIMB_SLACK_SECONDS, (started, climb)
    assert not_before_settle(climb, asked_to_free), (climb, asked_to_free)

    # The job is asked to save first (every TPU pod of its Spot run), and still runs there while it saves.
    request = api.CheckpointRequest.about(CLIMB_BACK, api.parse_time(climb.at), api.parse_time(climb.at))
    asked = runs.wait(lambda: (pods := jobs.pods_of(tier.kube, NAMESPACE, "climber")["worker"]) and all(
        api.CheckpointRequest.parse((p["metadata"].get("annotations") or {}).get(api.CHECKPOINT_REQUEST_ANNOTATION))
        == request for p in pods) and pods, "the checkpoint asked of its TPU pods")
    assert len(asked) == 4  # one per host of the v6e 4x4 slice

    # The move begins only once the save is taken as done (saveTimeout after the request): just before then the job
    # still runs on Spot, admitted, its Workload active; then it is deactivated.
    saved = request.asked_at + datetime.timedelta(seconds=SAVE_SECONDS)
    time.sleep(max((saved - datetime.timedelta(seconds=1.5) - datetime.datetime.now(datetime.timezone.utc))
                   .total_seconds(), 0))
    assert datetime.datetime.now(datetime.timezone.utc) < saved, "the test was late for its own check"
    workload = jobs.workload_of(tier.kube, NAMESPACE, "climber")
    assert workload["spec"].get("active", True) and jobs.tpu_flavor(workload) == "spot", workload["spec"]
    assert tier.move_of("climber").state == CHECKPOINTING
    runs.wait(lambda: not jobs.workload_of(tier.kube, NAMESPACE, "climber")["spec"].get("active", True)
              or tier.running_on("climber", "reservation"), "the climber deactivated", SAVE_SECONDS + REACTION)
    left = datetime.datetime.now(datetime.timezone.utc)

    runs.wait(lambda: tier.running_on("climber", "reservation"), "the climber running on the reservation")
    done = wait_for(lambda: (m := tier.move_of("climber")) and m.state == api.MOVED and m, REACTION, "the climb done")
    assert done == climb.done() and tier.queues_of("climber") == ("user-queue", "user-queue")
    history = api.move_history(tier.kube.get(*jobs.RAYJOB, "climber", NAMESPACE)["metadata"]["annotations"])
    assert history == [down, done]
    (event,) = wait_for(lambda: climb_events(tier, "climber"), REACTION, "the ClimbedBack Event")
    assert event["message"] == decisions.move_message(climb, "user-queue-spot")
    assert runs.most == 1  # the Spot run's pods were gone before the reservation's run began

    # ops status says it climbed back, when and why.
    report = build_report(ClusterReader(tier.kube.api_client).read(NAMESPACE, "tier"))
    (view,) = [j for j in report.jobs if j.name == "climber"]
    assert move_words(view.moves[-1]).startswith(f"climbed back from spot to reservation at {climb.at} (")

    # Once: on its first rung now, and counted once; the controller's next pass over it changes nothing.
    tier.looked_at("climber", REACTION)
    assert tier.move_of("climber") == done and len(climb_events(tier, "climber")) == 1
    assert tier.metric("tpu_fallback_climbs_total", from_flavor="spot", to_flavor="reservation") == 1
    print(f"\nclimb back: started {started:.1f} s after the reservation's release (settle {SETTLE_SECONDS} s); "
          f"deactivation seen {(left - request.asked_at).total_seconds():.1f} s after the checkpoint request "
          f"(saveTimeout {SAVE_SECONDS} s)")


def idle_slice(tier, flavor: str) -> bool:
    """A whole slice of the rung's nodes with no pod on them (GKE keeps a freed slice ~10 min before scale-down)."""
    busy = {p["spec"].get("nodeName") for p in tier.kube.list("v1", "Pod", namespace=NAMESPACE)}
    return any(nodes and not busy & set(nodes) for nodes in (tier.gke.nodes_of(pool) for pool in tier.pools_of(flavor)))


def test_a_job_climbs_to_an_idle_on_demand_slice_and_not_again_within_min_interval(clean):
    """On-demand's free quota alone is no proof of GCE capacity: the job climbs there onto the idle slice another job
    left. Once there, the reservation freeing does not move it again within minInterval."""
    tier = clean
    kept = tier.gke.scale_down_seconds
    tier.gke.scale_down_seconds = 600  # a freed slice stays, as GKE's ~10 min scale-down delay keeps it
    try:
        tier.submit("holder-r")
        wait_for(lambda: tier.running_on("holder-r", "reservation"), REACTION, "holder-r on the reservation")
        tier.submit("holder-o")
        wait_for(lambda: tier.running_on("holder-o", "on-demand"), REACTION, "holder-o on on-demand")
        tier.submit("climber-2")  # the reservation and on-demand full: Kueue admits it on Spot from user-queue
        runs = Runs(tier, "climber-2", REACTION)
        runs.wait(lambda: tier.running_on("climber-2", "spot"), "the climber running on Spot")
        jobs.wait_pods_ready(tier.kube, NAMESPACE, "climber-2", REACTION)
        assert tier.move_of("climber-2") is None and tier.queues_of("climber-2") == ("user-queue", "user-queue")
        time.sleep(MIN_RUNTIME_SECONDS)

        asked_to_free = datetime.datetime.now(datetime.timezone.utc)
        tier.kube.delete(*jobs.RAYJOB, "holder-o", NAMESPACE, propagation="Background")
        runs.wait(lambda: reserved_chips(tier, "on-demand") == 0 and idle_slice(tier, "on-demand"),
                  "on-demand's quota released and its slice idle")
        freed = datetime.datetime.now(datetime.timezone.utc)
        climb = runs.wait(lambda: (m := tier.move_of("climber-2")) and m.reason == CLIMB_BACK and m,
                          "the climb to on-demand", SETTLE_SECONDS + REACTION)
        started = (datetime.datetime.now(datetime.timezone.utc) - freed).total_seconds()
        assert (climb.from_flavor, climb.to_flavor, climb.to_local_queue) == ("spot", "on-demand",
                                                                             "user-queue-on-demand")
        assert started <= SETTLE_SECONDS + CLIMB_SLACK_SECONDS, (started, climb)
        assert not_before_settle(climb, asked_to_free), (climb, asked_to_free)
        runs.wait(lambda: tier.running_on("climber-2", "on-demand"), "the climber on the idle on-demand slice",
                  SAVE_SECONDS + REACTION)
        done = wait_for(lambda: (m := tier.move_of("climber-2")) and m.state == api.MOVED and m, REACTION,
                        "the climb done")
        assert runs.most == 1

        # The reservation frees too; within minInterval the job stays where it climbed to.
        tier.kube.delete(*jobs.RAYJOB, "holder-r", NAMESPACE, propagation="Background")
        wait_for(lambda: reserved_chips(tier, "reservation") == 0, REACTION, "the reservation's quota released")
        # Looked at once the settle time and the bound after it have passed: only minInterval holds it.
        tier.looked_at("climber-2", REACTION, since=time.time() + SETTLE_SECONDS + CLIMB_SLACK_SECONDS + 1)
        assert tier.move_of("climber-2") == done and len(climb_events(tier, "climber-2")) == 1
        assert tier.metric("tpu_fallback_climbs_total", from_flavor="on-demand", to_flavor="reservation") == 0
        assert tier.running_on("climber-2", "on-demand")
        print(f"\nclimb to an idle on-demand slice: started {started:.1f} s after it freed (settle {SETTLE_SECONDS} "
              "s); no second climb within minInterval")
    finally:
        tier.gke.scale_down_seconds = kept



def test_a_job_waiting_below_with_no_quota_climbs_to_the_freed_reservation_at_once(clean):
    """A job moved down that waits in Spot's queue holding nothing (Spot and DWS full) goes back up to the reservation
    as soon as it frees: no settle, no checkpoint. The job running on Spot, which would wait the settle time, stays."""
    tier = clean
    tier.stockout("on-demand")
    tier.submit("holder-w")
    wait_for(lambda: tier.running_on("holder-w", "reservation"), REACTION, "the holder on the reservation")
    tier.submit("on-spot")
    wait_for(lambda: tier.running_on("on-spot", "spot"), REACTION, "a job running on Spot")
    # Submitted to DWS's queue: it holds DWS quota, its request waiting; never moved, so it stays there.
    tier.submit("on-dws", queue="user-queue-dws")
    jobs.wait_provisioning_request(tier.kube, NAMESPACE, "on-dws", timeout=REACTION)
    tier.submit("waiter")
    # Moved off on-demand by the stockout into Spot's queue, where Spot and DWS are full: pending, no quota.
    wait_for(lambda: (m := tier.move_of("waiter")) and m.state == api.MOVED and m.to_flavor == "spot"
             and condition(jobs.workload_of(tier.kube, NAMESPACE, "waiter"), "QuotaReserved") == "False",
             REACTION, "the waiter pending in Spot's queue", interval=0.1)
    tier.looked_at("waiter", REACTION)  # a pass over it: nothing moves it while the reservation is held
    assert tier.move_of("waiter").reason == api.STOCKOUT

    tier.kube.delete(*jobs.RAYJOB, "holder-w", NAMESPACE, propagation="Background")
    wait_for(lambda: reserved_chips(tier, "reservation") == 0, REACTION, "the reservation's quota released",
             interval=0.1)
    freed = time.monotonic()
    climb = wait_for(lambda: (m := tier.move_of("waiter")) and m.reason == CLIMB_BACK_WAITING and m, REACTION,
                     "the waiter's climb", interval=0.1)
    started = time.monotonic() - freed
    assert (climb.from_flavor, climb.to_flavor, climb.to_local_queue) == ("spot", "reservation", "user-queue")
    assert started < SETTLE_SECONDS, started  # at once, not after the settle time a running job waits
    wait_for(lambda: tier.running_on("waiter", "reservation"), REACTION, "the waiter running on the reservation")
    assert wait_for(lambda: (m := tier.move_of("waiter")) and m.state == api.MOVED and m, REACTION, "its climb done"
                    ) == climb.done()
    # The job running on Spot does not climb: the reservation is taken. Looked at past its settle time and bound.
    tier.looked_at("on-spot", REACTION, since=time.time() + SETTLE_SECONDS + CLIMB_SLACK_SECONDS)
    assert tier.running_on("on-spot", "spot") and tier.move_of("on-spot").reason == api.STOCKOUT
    (event,) = wait_for(lambda: climb_events(tier, "waiter"), REACTION, "the ClimbedBack Event")
    assert event["message"] == decisions.move_message(climb, "user-queue-spot")
    print(f"\na waiting job's climb: started {started:.1f} s after the reservation's release")


PROBE_SLACK_SECONDS = 3  # the probe made and placed, the scheduler's bind, the climb's reconcile: a busy machine's share


def test_a_job_waiting_for_dws_climbs_once_a_probe_finds_on_demand_again(clean):
    """A job moved down past stocked-out on-demand and Spot waits for DWS to provision (its quota there, its request
    waiting). Nothing in the cluster would show on-demand's capacity coming back: no pod asks for it. The controller
    keeps one probe pod on on-demand and one on Spot (their quota free, no slice); the stand-in reports the stockout
    on them. Once
    capacity is back, the autoscaler grows a slice for the probe, the probe goes, and the job climbs onto the slice,
    giving up its DWS request: within the stand-in's scale-up and PROBE_SLACK_SECONDS of the capacity's return."""
    tier = clean
    kept = tier.gke.scale_down_seconds
    tier.gke.scale_down_seconds = 600  # the probed slice stays, as GKE's scale-down delay keeps it
    try:
        tier.stockout("on-demand", "spot")
        tier.submit("holder-p")
        wait_for(lambda: tier.running_on("holder-p", "reservation"), REACTION, "the holder on the reservation")
        tier.submit("waiter-p")
        wait_for(lambda: (m := tier.move_of("waiter-p")) and m.state == api.MOVED and m.to_flavor == "dws",
                 REACTION, "the job moved down to DWS")
        jobs.wait_provisioning_request(tier.kube, NAMESPACE, "waiter-p", timeout=REACTION)
        # One probe on each rung above it with its quota free (the job left both), none on the reservation.
        standing = wait_for(lambda: (found := {p["metadata"]["labels"][PROBE_LABEL]: p
                                               for p in tier.capacity_probes()})
                            and set(found) == {"on-demand", "spot"} and found, REACTION, "a probe on on-demand and Spot")
        probe = standing["on-demand"]
        assert not probe["spec"].get("nodeName")
        wait_for(lambda: tier.gke.reported.get(probe["metadata"]["uid"]), REACTION, "the stockout reported on it")
        # Looked at past the settle after the job's own stockouts: only capacity holds it now.
        tier.looked_at("waiter-p", REACTION, since=time.time() + SETTLE_SECONDS)
        assert tier.move_of("waiter-p").to_flavor == "dws"

        for pool in tier.pools_of("on-demand"):
            tier.gke.restore(pool)
        back = time.monotonic()
        climb = wait_for(lambda: (m := tier.move_of("waiter-p")) and m.reason == CLIMB_BACK_WAITING and m, REACTION,
                         "the climb to on-demand", interval=0.1)
        started = time.monotonic() - back
        assert (climb.from_flavor, climb.to_flavor, climb.to_local_queue) == ("dws", "on-demand",
                                                                             "user-queue-on-demand")
        assert started <= tier.gke.scale_up_seconds + PROBE_SLACK_SECONDS, started
        wait_for(lambda: tier.running_on("waiter-p", "on-demand"), REACTION, "the job on the probed slice")
        wait_for(lambda: not tier.capacity_probes(), REACTION, "both probes gone: no job waits below them")
        wait_for(lambda: not tier.kube.list(*jobs.PROVISIONING_REQUEST, namespace=NAMESPACE), REACTION,
                 "its DWS request given up")
        assert tier.metric("tpu_fallback_capacity_probes_total", flavor="on-demand", outcome="found") == 1
        print(f"\na job waiting for DWS climbed {started:.1f} s after on-demand's capacity came back (scale-up "
              f"{tier.gke.scale_up_seconds} s)")
    finally:
        tier.gke.scale_down_seconds = kept
