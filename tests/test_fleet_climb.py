"""Climbing back in a fleet (failover/ladder/climb.py), offline: every rule of a fleet job's climb to an earlier step
of the ladder, and a climb's checkpoint, one step at a time. The real Kueue judges it in
tests/test_fleet_climb_controlplane.py."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import json

import pytest

from failover import api
from failover.api import CHECKPOINTING, CLIMB_BACK, ClimbPolicy, Move, checkpoint_moves
from failover.ladder import climb
from failover.ladder import decisions as ladder_rules
from failover.ladder.climb import FleetJob, NotYet
from infra.fleet_member import FLEET_NAMESPACE

MINUTE = datetime.timedelta(minutes=1)
NOW = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.timezone.utc)
RESERVED_W2, ON_DEMAND_W1, SPOT_W2, DWS = ("fleet-reservation-w2", "fleet-on-demand-w1", "fleet-spot-w2",
                                           "fleet-queue")
LADDER = api.Ladder.from_json(json.dumps([
    {"localQueue": RESERVED_W2, "clusterQueue": RESERVED_W2, "admissionCheck": RESERVED_W2, "members": ["w2"],
     "rung": "reservation", "flavor": "reservation"},
    {"localQueue": ON_DEMAND_W1, "clusterQueue": ON_DEMAND_W1, "admissionCheck": ON_DEMAND_W1, "members": ["w1"],
     "rung": "onDemand", "flavor": "on-demand"},
    {"localQueue": SPOT_W2, "clusterQueue": SPOT_W2, "admissionCheck": SPOT_W2, "members": ["w2"],
     "rung": "spot", "flavor": "spot"},
    {"localQueue": DWS, "clusterQueue": "fleet-cluster-queue", "admissionCheck": "fleet-multikueue",
     "members": ["w1", "w2"], "rung": ""}]))
POLICY = ClimbPolicy(("reservation",), ("reservation",), settle=5 * MINUTE, min_interval=60 * MINUTE,
                     min_runtime=10 * MINUTE, run_end_margin=30 * MINUTE, save_timeout=2 * MINUTE)
ADMITTED = NOW - 30 * MINUTE


def stamp(at: datetime.datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def running(queue: str = SPOT_W2, admitted: datetime.datetime = ADMITTED, cluster: str | None = None,
            pods_ready: bool = True, active: bool = True, move: str | None = None,
            max_run: int | None = None) -> ladder_rules.LadderView:
    """A manager Workload a member admitted at `queue` (its check Ready since `admitted`) and runs."""
    check = LADDER.step_of(queue).admission_check
    annotations = {api.MAX_RUN_ANNOTATION: str(max_run)} if max_run is not None else {}
    if move is not None:
        annotations[ladder_rules.WORKLOAD_MOVE_ANNOTATION] = move
    return ladder_rules.LadderView.from_object({
        "metadata": {"name": "wl", "namespace": FLEET_NAMESPACE, "ownerReferences": [{"kind": "RayJob", "name": "j"}],
                     "creationTimestamp": stamp(ADMITTED - MINUTE), "annotations": annotations},
        "spec": {"queueName": queue, "active": active, "podSets": [{"name": "workers", "count": 4, "template": {
            "spec": {"containers": [{"resources": {"requests": {api.TPU_RESOURCE: "4"}}}]}}}]},
        "status": {"conditions": [{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"},
                                  {"type": "PodsReady", "status": "True" if pods_ready else "False"}],
                   "admissionChecks": [{"name": check, "state": "Ready", "lastTransitionTime": stamp(admitted)}],
                   "clusterName": cluster}})


def job(pending: Move | None = None, history: tuple[Move, ...] = (), checkpoints: dict | None = None,
        losing: bool = False) -> FleetJob:
    return FleetJob(pending, history, {"w-0": None, "w-1": None} if checkpoints is None else checkpoints, losing)


def free_for(**since: datetime.datetime):
    """`free(step)` for steps named by their LocalQueue (underscores for dashes): since when each is free."""
    return lambda step: since.get(step.local_queue.replace("-", "_"))


def decide(view=None, fleet_job=None, free=None, failed=None, policy=POLICY, now=NOW):
    return climb.decide_climb(LADDER, policy, view or running(), fleet_job or job(),
                              free or free_for(fleet_reservation_w2=NOW - 6 * MINUTE),
                              failed or (lambda step: None), now)


def test_a_job_on_a_later_step_climbs_to_the_reservation_step_free_for_the_settle_time():
    decided = decide()
    assert decided == climb.Climb(Move(SPOT_W2, RESERVED_W2, RESERVED_W2, CLIMB_BACK, "2026-12-01T12:00:00Z",
                                       CHECKPOINTING, member="w2"))
    assert "member w2" in climb.climb_message(decided.move)


def test_it_waits_for_the_settle_time_then_climbs_exactly_then():
    free = free_for(fleet_reservation_w2=NOW - 2 * MINUTE)
    assert decide(free=free) == NotYet(NOW + 3 * MINUTE)
    assert isinstance(decide(free=free, now=NOW + 3 * MINUTE), climb.Climb)


def test_a_capacity_failure_at_the_step_restarts_its_settle_time_and_a_busy_step_does_not():
    failed_at = NOW - MINUTE
    assert decide(failed=lambda step: failed_at if step.local_queue == RESERVED_W2 else None) == NotYet(
        failed_at + 5 * MINUTE)
    moves = [Move(RESERVED_W2, ON_DEMAND_W1, ON_DEMAND_W1, api.MEMBER_STOCKOUT, stamp(NOW - 40 * MINUTE), "moved"),
             Move(RESERVED_W2, ON_DEMAND_W1, ON_DEMAND_W1, api.MEMBER_NOT_READY, stamp(NOW - 20 * MINUTE), "moved"),
             Move(ON_DEMAND_W1, SPOT_W2, SPOT_W2, api.MEMBER_EVICTED, stamp(NOW - 50 * MINUTE), "moved"),
             Move(SPOT_W2, DWS, DWS, api.MEMBER_SLICE_LOST, stamp(NOW - 45 * MINUTE), "moved"),
             Move(RESERVED_W2, SPOT_W2, SPOT_W2, api.STEP_BUSY, stamp(NOW - MINUTE), "moved"),
             None]
    assert climb.capacity_failures(moves) == {RESERVED_W2: NOW - 20 * MINUTE, ON_DEMAND_W1: NOW - 50 * MINUTE,
                                              SPOT_W2: NOW - 45 * MINUTE}


def test_the_earliest_step_free_for_the_settle_time_wins():
    both = ClimbPolicy(("reservation", "on-demand"), ("reservation",), *dataclasses.astuple(POLICY)[2:])
    free = free_for(fleet_reservation_w2=NOW - 6 * MINUTE, fleet_on_demand_w1=NOW - 9 * MINUTE)
    assert decide(policy=both, free=free).move.to_local_queue == RESERVED_W2
    # the reservation not settled yet: the on-demand step, settled, is taken now
    free = free_for(fleet_reservation_w2=NOW - 1 * MINUTE, fleet_on_demand_w1=NOW - 9 * MINUTE)
    assert decide(policy=both, free=free).move.to_local_queue == ON_DEMAND_W1


def test_only_the_steps_the_policy_names_and_only_before_the_jobs_step():
    assert climb.targets(LADDER, POLICY, 3) == [0]
    assert climb.targets(LADDER, POLICY, 0) == []
    free = free_for(fleet_on_demand_w1=NOW - 9 * MINUTE)  # on-demand is not in `to`
    assert decide(free=free) == NotYet(None)
    assert decide(view=running(RESERVED_W2)) == NotYet(None)  # at the first step: nothing above
    off = dataclasses.replace(POLICY, to=(), reserved=())
    assert decide(policy=off) == NotYet(None)
    assert climb.possible_climbs(LADDER, POLICY) == [(ON_DEMAND_W1, RESERVED_W2), (SPOT_W2, RESERVED_W2),
                                                     (DWS, RESERVED_W2)]


def test_a_job_that_does_not_run_on_a_whole_slice_does_not_climb():
    assert decide(view=running(pods_ready=False)) == NotYet(None)
    assert decide(view=running(active=False)) == NotYet(None)
    assert decide(view=running(move=Move(SPOT_W2, DWS, DWS, api.STEP_BUSY, stamp(NOW)).to_json())) == NotYet(None)
    assert decide(fleet_job=job(losing=True)) == NotYet(None)  # its member says its slice is lost
    assert decide(view=running(DWS)) == NotYet(None)  # at the last step, no member named as running it yet
    no_chips = dataclasses.replace(running(), tpu_chips=0)  # its room unknown: every step would look free
    assert decide(view=no_chips) == NotYet(None)
    assert isinstance(decide(view=running(DWS, cluster="w1")), climb.Climb)


def test_one_climb_or_move_at_a_time():
    under_way = Move(SPOT_W2, RESERVED_W2, RESERVED_W2, CLIMB_BACK, stamp(NOW - MINUTE), CHECKPOINTING, member="w2")
    assert decide(fleet_job=job(pending=under_way)) == NotYet(None)
    moving = Move(ON_DEMAND_W1, SPOT_W2, SPOT_W2, api.STEP_BUSY, stamp(NOW - MINUTE))
    assert decide(fleet_job=job(pending=moving)) == NotYet(None)
    assert isinstance(decide(fleet_job=job(pending=moving.done())), climb.Climb)


def test_never_in_its_first_min_runtime_at_the_step():
    assert decide(view=running(admitted=NOW - 4 * MINUTE)) == NotYet(NOW + 6 * MINUTE)


def test_at_most_one_climb_per_min_interval():
    earlier = Move(SPOT_W2, RESERVED_W2, RESERVED_W2, CLIMB_BACK, stamp(NOW - 50 * MINUTE), "moved", member="w2")
    assert decide(fleet_job=job(history=(earlier,))) == NotYet(NOW + 10 * MINUTE)


def test_never_while_a_save_it_was_asked_for_is_under_way():
    request = api.CheckpointRequest("maintenance-20261201t130000z", stamp(NOW - MINUTE))
    assert decide(fleet_job=job(checkpoints={"w-0": request.value()})) == NotYet(NOW + MINUTE)


def test_never_for_a_dws_run_near_its_end():
    hours = 3600
    near = running(DWS, cluster="w1", max_run=hours // 2 + 20 * 60)  # admitted 30 min ago: ends in 20 min
    assert decide(view=near) == NotYet(None)
    far = running(DWS, cluster="w1", max_run=24 * hours)
    assert isinstance(decide(view=far), climb.Climb)


# ---- a climb's checkpoint ------------------------------------------------------------------------------------

CLIMB = Move(SPOT_W2, RESERVED_W2, RESERVED_W2, CLIMB_BACK, stamp(NOW), CHECKPOINTING, member="w2")


def test_a_climb_asks_the_pods_then_waits_the_save_then_goes_if_the_step_is_still_free():
    request = climb.checkpoint_of(CLIMB)
    assert request.id == "climbback-20261201t120000z"
    assert climb.next_in_climb(LADDER, CLIMB, running(), job(), True, POLICY, NOW) == (checkpoint_moves.ASK, None)
    assert climb.next_in_climb(LADDER, CLIMB, running(), job(checkpoints={}), True, POLICY, NOW) == (
        checkpoint_moves.ASK, None)  # no pod read yet: asked (again), which finds them
    asked = job(checkpoints={"w-0": request.value(), "w-1": request.value()})
    assert climb.next_in_climb(LADDER, CLIMB, running(), asked, True, POLICY, NOW + MINUTE) == (
        checkpoint_moves.SAVING, NOW + 2 * MINUTE)
    assert climb.next_in_climb(LADDER, CLIMB, running(), asked, True, POLICY, NOW + 2 * MINUTE) == (
        checkpoint_moves.GO, None)
    assert climb.next_in_climb(LADDER, CLIMB, running(), asked, False, POLICY, NOW + 2 * MINUTE) == (
        checkpoint_moves.CALL_OFF, None)  # the step above taken meanwhile: the slice it has is kept
    assert climb.moving(CLIMB).state == api.MOVING


@pytest.mark.parametrize("view", [
    running(pods_ready=False), running(ON_DEMAND_W1), running(admitted=NOW + MINUTE),
    running(active=False), running(DWS, cluster="w1")], ids=["not-ready", "another-step", "readmitted",
                                                               "deactivated", "another-member"])
def test_a_climb_is_called_off_when_the_job_no_longer_runs_where_it_climbs_from(view):
    assert climb.next_in_climb(LADDER, CLIMB, view, job(), True, POLICY, NOW) == (checkpoint_moves.CALL_OFF, None)
    assert climb.next_in_climb(LADDER, CLIMB, running(), job(losing=True), True, POLICY, NOW) == (
        checkpoint_moves.CALL_OFF, None)
    before = Move(ON_DEMAND_W1, SPOT_W2, SPOT_W2, api.STEP_BUSY, stamp(NOW - 40 * MINUTE), "moved")
    assert checkpoint_moves.restored((before,)) == before and checkpoint_moves.restored(()) is None


def test_route_d_records_the_climb_once_it_is_moving_not_while_it_saved():
    """The climb's record while the job saved has the move's time and target: route D still writes the move's own
    record (state moving) on the RayJob after the deactivation."""
    go = climb.moving(CLIMB)
    rayjob = {"metadata": {"labels": {api.QUEUE_LABEL: SPOT_W2},
                           "annotations": {api.FAILOVER_ANNOTATION: CLIMB.to_json()}},
              "spec": {"suspend": True}, "status": {"jobDeploymentStatus": "Suspended"}}
    deactivated = dataclasses.replace(running(), active=False, move=go.to_json())
    assert ladder_rules.next_in_move(go, deactivated, rayjob, RESERVED_W2) == ladder_rules.RECORD
    rayjob["metadata"]["annotations"][api.FAILOVER_ANNOTATION] = go.to_json()
    assert ladder_rules.next_in_move(go, deactivated, rayjob, RESERVED_W2) == ladder_rules.WAIT_FOR_QUOTA


def test_a_steps_flavor_is_read_back_and_an_older_ladder_without_it_has_none():
    assert [s.flavor for s in LADDER.steps] == ["reservation", "on-demand", "spot", ""]
    assert api.Ladder.from_json(LADDER.to_json()) == LADDER
    older = json.loads(LADDER.to_json())
    del older[0]["flavor"]
    assert api.Ladder.from_data(older).steps[0].flavor == ""


# ---- fleet.climbBack, from the fleet stack to the ladder controller ----------------------------------------------


def _ladder_env(plan) -> dict[str, str]:
    from infra import fleet as fleet_objects
    from tests.test_fleet_ladder import manifests

    deployment = manifests(plan, "Deployment")[fleet_objects.LADDER_NAME]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"]}


def test_the_ladder_climbs_to_reservations_by_default_with_the_regional_waits():
    from failover.config import LadderConfig
    from tests.test_fleet_ladder import cached_ladder_plan

    env = _ladder_env(cached_ladder_plan())
    policy = LadderConfig.from_env(env).climb_back
    assert policy == ClimbPolicy(("reservation",), ("reservation",), settle=5 * MINUTE, min_interval=60 * MINUTE,
                                 min_runtime=10 * MINUTE, run_end_margin=30 * MINUTE, save_timeout=2 * MINUTE)
    # Each member step names its member's flavor, what the climb reads of the member's quota.
    steps = json.loads(env["FLEET_LADDER"])
    assert [s.get("flavor", "") for s in steps] == ["on-demand", "on-demand", ""]


def test_fleet_climb_back_is_set_field_by_field_and_off_with_an_empty_to():
    from failover.config import LadderConfig
    from tests.conftest import config_with
    from tests.test_fleet_ladder import FLEET, fleet_plan

    raw = json.loads(config_with({}, FLEET)["tpu-fallback:fleet"])
    plan = fleet_plan({"fleet": {**raw, "climbBack": {"settle": "5s", "saveTimeout": "10s"}}})
    policy = LadderConfig.from_env(_ladder_env(plan)).climb_back
    assert (policy.to, policy.settle, policy.save_timeout, policy.min_interval) == (
        ("reservation",), datetime.timedelta(seconds=5), datetime.timedelta(seconds=10), 60 * MINUTE)
    off = fleet_plan({"fleet": {**raw, "climbBack": {"to": []}}})
    assert not LadderConfig.from_env(_ladder_env(off)).climb_back.enabled


@pytest.mark.parametrize("climb_back, message", [
    ({"to": ["onDemand"]}, "tpu-fallback:fleet.climbBack.to: ['onDemand']: use reservation"),
    ({"to": ["reservation", "reservation"]}, "tpu-fallback:fleet.climbBack.to"),
    ({"settle": "0s"}, "tpu-fallback:fleet.climbBack.settle: 0s is out of range; use 1s to 24h"),
    ({"saveTimeout": "1h"}, "tpu-fallback:fleet.climbBack.saveTimeout: 1h is out of range; use 10s to 10m"),
    ({"minInterval": "later"}, "tpu-fallback:fleet.climbBack.minInterval"),
    ({"sometimes": True}, "tpu-fallback:fleet.climbBack.sometimes: unknown field"),
], ids=["on-demand", "twice", "settle", "save-timeout", "not-a-duration", "unknown"])
def test_fleet_climb_back_rules_name_the_key(climb_back, message):
    from infra.settings import SettingsError
    from tests.conftest import config_with
    from tests.test_fleet_ladder import FLEET, fleet_plan

    raw = json.loads(config_with({}, FLEET)["tpu-fallback:fleet"])
    with pytest.raises(SettingsError) as failure:
        fleet_plan({"fleet": {**raw, "climbBack": climb_back}})
    assert message in str(failure.value)


# ---- the signal and one run at a time ---------------------------------------------------------------------------


def test_a_members_free_chips_count_what_a_borrowing_step_holds_against_the_lender():
    from failover import maintenance

    def queue(name: str, nominal: int, reserved: int) -> dict:
        return {"metadata": {"name": name},
                "spec": {"resourceGroups": [{"flavors": [{"name": "reservation", "resources": [
                    {"name": api.TPU_RESOURCE, "nominalQuota": nominal}]}]}]},
                "status": {"flavorsReservation": [{"name": "reservation", "resources": [
                    {"name": api.TPU_RESOURCE, "total": reserved}]}]}}

    region, step = queue("cluster-queue", 16, 0), queue("fleet-reservation", 0, 16)  # a fleet job holds it
    free = [maintenance.free_tpus(q) for q in (region, step)]
    assert climb.free_chips("reservation", free) == 0
    released = [maintenance.free_tpus(q) for q in (region, queue("fleet-reservation", 0, 0))]
    assert climb.free_chips("reservation", released) == 16
    assert climb.free_chips("on-demand", released) == 0


def test_a_climb_reactivates_only_once_the_old_runs_pods_are_gone_and_a_move_down_never_waits():
    go = climb.moving(CLIMB)
    pods = [("j-abcde-head-x1", "j-abcde"), ("j-abcde-worker-0", "j-abcde"), ("j-2-fghij-head", "j-2-fghij"),
            ("other-fghij-head", "other-fghij")]
    assert climb.old_run(go, "j", pods) == ["j-abcde-head-x1", "j-abcde-worker-0"]
    assert climb.old_run(go, "j", pods[2:]) == []  # another job's RayCluster, whose name begins alike
    down = Move(SPOT_W2, DWS, DWS, api.MEMBER_STOCKOUT, stamp(NOW), member="w2")
    assert climb.old_run(down, "j", pods) == []


def test_the_manager_workload_says_how_many_tpu_chips_and_hosts_the_job_needs():
    pod_sets = [{"name": "head", "count": 1, "template": {"spec": {"containers": [
                    {"resources": {"requests": {"cpu": "2"}}}]}}},
                {"name": "workers", "count": 4, "template": {"spec": {"containers": [
                    {"resources": {"requests": {api.TPU_RESOURCE: "4"}}}]}}}]
    view = ladder_rules.LadderView.from_object({"metadata": {"name": "wl", "namespace": FLEET_NAMESPACE},
                                                "spec": {"queueName": DWS, "podSets": pod_sets}})
    assert (view.tpu_chips, view.tpu_hosts) == (16, 4)


def test_a_climb_done_is_a_climbed_back_event_and_the_climbs_counter_not_a_move_down():
    """The controller's record of a climb (route D's DONE): the history entry, one ClimbedBack Event with the climb's
    message, tpu_fallback_ladder_climbs_total counted and the moves' counter (which the stockout alert reads) not."""
    from tests.test_fleet_ladder import _controller, _World

    world = _World()
    controller = _controller(world, None)
    up = Move("fleet-on-demand-w2", "fleet-on-demand-w1", "fleet-on-demand-w1", CLIMB_BACK, stamp(NOW),
              api.MOVING, member="w2")
    controller._record_done(world.rayjob, up, "w2")
    annotations = world.rayjob["metadata"]["annotations"]
    assert api.move_history(annotations) == [up.done()]
    assert Move.from_json(annotations[api.FAILOVER_ANNOTATION]) == up.done()
    assert list(world.events) == [api.CLIMB_EVENT_REASON]
    registry = controller.metrics.registry
    assert registry.get_sample_value("tpu_fallback_ladder_climbs_total", {
        "from_step": "fleet-on-demand-w2", "to_step": "fleet-on-demand-w1"}) == 1
    assert registry.get_sample_value("tpu_fallback_ladder_moves_total", {
        "from_step": "fleet-on-demand-w2", "to_step": "fleet-on-demand-w1", "reason": CLIMB_BACK}) is None
    controller._record_done(world.rayjob, up, "w2")  # read back done: nothing twice
    assert list(world.events) == [api.CLIMB_EVENT_REASON] and len(api.move_history(annotations)) == 1


class _Clock:
    def __init__(self):
        self.now = NOW

    def __call__(self) -> datetime.datetime:
        return self.now


def test_the_controller_climbs_asks_the_pods_waits_the_save_and_moves_once_the_old_run_is_gone():
    """The reconciler over a fake manager (its Workload and RayJob as Kueue keeps them) and a fake member: the
    member's quota frees, the settle time passes, the climb is written, the pods in the member are asked, the save's
    time passes, route D moves the job up and waits to reactivate until the old run's pods are gone; then done,
    once."""
    from prometheus_client import CollectorRegistry

    from failover.ladder import controller as ladder_controller
    from failover.ladder.watches import LadderSeen
    from failover.runtime.cache import Cache
    from failover.runtime.controller import Reconciler
    from failover.runtime.metrics import LadderMetrics
    from tests.killed_controller import Events, KilledAfter, merge_patch

    ladder = api.Ladder((LADDER.steps[0], LADDER.steps[1], LADDER.steps[3]))  # reservation w2, on-demand w1, DWS
    clock = _Clock()
    admitted = stamp(NOW - 30 * MINUTE)
    workload = running(ON_DEMAND_W1, NOW - 30 * MINUTE)  # (its view, to build the object from)
    world = {
        "workloads": {"metadata": {"name": "wl", "namespace": FLEET_NAMESPACE, "resourceVersion": "1",
                                   "ownerReferences": [{"kind": "RayJob", "name": "j"}],
                                   "creationTimestamp": stamp(NOW - 31 * MINUTE)},
                      "spec": {"queueName": ON_DEMAND_W1, "active": True, "podSets": [
                          {"name": "workers", "count": 4, "template": {"spec": {"containers": [
                              {"resources": {"requests": {api.TPU_RESOURCE: "4"}}}]}}}]},
                      "status": {"conditions": [{"type": "QuotaReserved", "status": "True"},
                                                {"type": "Admitted", "status": "True"},
                                                {"type": "PodsReady", "status": "True"}],
                                 "admissionChecks": [{"name": ON_DEMAND_W1, "state": "Ready",
                                                      "lastTransitionTime": admitted}]}},
        "rayjobs": {"metadata": {"name": "j", "namespace": FLEET_NAMESPACE, "resourceVersion": "1", "uid": "u",
                                 "labels": {api.QUEUE_LABEL: ON_DEMAND_W1}},
                    "spec": {"suspend": False}, "status": {"jobDeploymentStatus": "Running"}}}
    assert workload.tpu_chips == 16

    def apply(obj: dict, patch: dict) -> dict:
        assert patch["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"], "a stale write"
        merge_patch(obj, patch)
        obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
        if obj is world["workloads"] and obj["spec"]["active"] is False:  # Kueue releases the quota at once
            obj["status"]["conditions"] = [{"type": "QuotaReserved", "status": "False"}]
            if obj["spec"]["queueName"] != obj["status"]["admissionChecks"][0]["name"]:
                obj["status"]["admissionChecks"] = [{"name": obj["spec"]["queueName"], "state": "Pending"}]
        return copy.deepcopy(obj)

    class Member:
        name, api = "w2", None

        def __init__(self, free: int):
            self.free = free

        def store(self, _watched):
            outer = self

            class Store:
                def values(self):
                    return [{"reservation": 16}, {"reservation": outer.free - 16}]
            return Store()

    class Members:
        watches: list = []

        def get(self, name):
            return None

    controller = object.__new__(ladder_controller.LadderController)
    Reconciler.__init__(controller)
    controller.ladder, controller.namespace, controller.step_wait, controller.max_wait = ladder, FLEET_NAMESPACE, \
        None, None
    controller.clock, controller.members, controller.moves_started = clock, Members(), 0
    controller.metrics = LadderMetrics(CollectorRegistry())
    cache = Cache(None)
    controller.seen = LadderSeen(cache, ladder, FLEET_NAMESPACE, clock, None, controller.enqueue)
    controller.workloads, controller.rayjobs = "workloads", "rayjobs"
    events = Events()
    controller.api = controller.core = KilledAfter(lambda resource: world[resource], apply, events, None)
    controller._init_climb(POLICY)
    asked: list[list[str]] = []
    pods = {"j-abcde-worker-0": None, "j-abcde-worker-1": None}
    old_pods = [2]  # polls of the member until the old run's pods are gone
    controller._pods = lambda member, view: ("j-abcde", dict(pods))

    def ask(member, namespace, names, request):
        asked.append(names)
        pods.update({name: request.value() for name in names})
        return len(names)
    controller._ask = ask

    def old_run_left(move, namespace, rayjob):
        if move.reason == CLIMB_BACK and old_pods[0]:
            old_pods[0] -= 1
            return True
        return False
    controller._old_run_left = old_run_left
    controller._wait = lambda deadline, poll: True
    key = (FLEET_NAMESPACE, "wl")

    def reconcile() -> int:
        for resource, watched in (("workloads", controller.seen.watched_workloads),
                                  ("rayjobs", controller.seen.watched_rayjobs)):
            cache.informers[watched].on_event("MODIFIED", copy.deepcopy(world[resource]))
        return controller.reconcile(key)

    controller._member_quota_changed(Member(0), [], True)  # held
    assert reconcile() == 0 and pending_of(world) is None
    clock.now = NOW + MINUTE
    controller._member_quota_changed(Member(16), [], False)  # freed
    assert reconcile() == 0 and pending_of(world) is None  # not for the settle time yet
    clock.now = NOW + 6 * MINUTE
    assert reconcile() == 1
    started = pending_of(world)
    assert (started.state, started.reason, started.member, started.to_local_queue) == (
        CHECKPOINTING, CLIMB_BACK, "w1", RESERVED_W2)
    assert reconcile() == 1 and asked == [["j-abcde-worker-0", "j-abcde-worker-1"]]
    assert reconcile() == 0 and world["workloads"]["spec"]["active"] is True  # saving
    clock.now += POLICY.save_timeout
    assert reconcile() == 1
    assert old_pods == [0]  # it waited for the old run's pods before reactivating
    assert world["workloads"]["spec"] == {**world["workloads"]["spec"], "queueName": RESERVED_W2, "active": True}
    assert world["rayjobs"]["metadata"]["labels"][api.QUEUE_LABEL] == RESERVED_W2
    assert ladder_rules.WORKLOAD_MOVE_ANNOTATION not in world["workloads"]["metadata"].get("annotations", {})
    done = pending_of(world)
    assert (done.state, done.reason) == (api.MOVED, CLIMB_BACK)
    assert list(events) == [api.CLIMB_EVENT_REASON]
    assert api.move_history(world["rayjobs"]["metadata"]["annotations"]) == [done]


def pending_of(world: dict) -> Move | None:
    return Move.from_json((world["rayjobs"]["metadata"].get("annotations") or {}).get(api.FAILOVER_ANNOTATION))
