"""Climbing back (failover/regional/climb.py): the free-slice signal, every rule of a climb, a climb's checkpoint
steps, and the move in place it may take (failover/regional/decisions.py)."""

from __future__ import annotations

import dataclasses
import datetime
import json

import pytest

from failover import api
from failover.api import CheckpointRequest, Move, WorkloadView
from failover.api import checkpoint_moves, climbs
from failover.api.climbs import CAPACITY_LABEL, CHECKPOINTING, CLIMB_BACK, ClimbPolicy
from failover.api.names import NODE_POOL_LABEL
from failover.regional import climb, decisions, free_slices
from failover.regional.climb import Climb, JobFacts, Need, NotYet, Sample
from infra import kueue
from infra.tpu_pool import PLAN_LABEL_KEY

CHAIN = api.Chain.from_json(json.dumps([
    {"flavor": flavor, "clusterQueue": cq, "localQueue": lq, "admissionCheck": check, "recoverySeconds": 600}
    for flavor, cq, lq, check in (("reservation", "cluster-queue", "user-queue", False),
                                  ("on-demand", "cluster-queue-on-demand", "user-queue-on-demand", False),
                                  ("spot", "cluster-queue-spot", "user-queue-spot", False),
                                  ("dws", "cluster-queue-dws", "user-queue-dws", True))]))
NOW = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.timezone.utc)
MINUTE = datetime.timedelta(minutes=1)
POLICY = ClimbPolicy(("reservation", "on-demand"), ("reservation",), settle=5 * MINUTE, min_interval=60 * MINUTE,
                     min_runtime=10 * MINUTE, run_end_margin=30 * MINUTE, save_timeout=2 * MINUTE)
NEED = Need(16, 4)


def running(flavor="spot", queue="user-queue-spot", on_rung=30, **changes) -> WorkloadView:
    """A job running on `flavor` (admitted `on_rung` minutes ago, whole since a minute later)."""
    admitted = NOW - on_rung * MINUTE
    view = WorkloadView(name="rayjob-j-abcde", namespace="default", queue_name=queue, active=True,
                        quota_reserved=True, admitted=True, admitted_at=admitted, flavor=flavor, recorded_flavor=flavor,
                        evicted_reason=None, rayjob="j", pods_ready_since=admitted + MINUTE, tpu_hosts=4, tpu_chips=16)
    return dataclasses.replace(view, **changes)


def facts(**changes) -> JobFacts:
    return dataclasses.replace(JobFacts(None, (), False, {"j-w-0": None, "j-w-1": None}), **changes)


def free_for(**minutes) -> callable:
    """free(flavor): free since so many minutes ago (a flavor not given: not free)."""
    return lambda flavor: NOW - minutes[flavor.replace("-", "_")] * MINUTE if flavor.replace("-", "_") in minutes \
        else None


def no_failure(_flavor):
    return None


def decide(view=None, job=None, free=None, failure=no_failure, policy=POLICY, now=NOW):
    return climb.decide_climb(CHAIN, policy, view or running(), job or facts(), free or free_for(reservation=6),
                              failure, now)


# ---- the signal ---------------------------------------------------------------------------------------------------
def test_a_reservation_is_free_on_its_quota_alone_any_other_rung_also_needs_an_idle_slice():
    quota_only = Sample(NOW, free_chips=16, idle_hosts=0)
    assert climb.fits(quota_only, NEED, reserved=True)
    assert not climb.fits(quota_only, NEED, reserved=False)  # free quota is no proof of GCE capacity (a stockout)
    assert climb.fits(Sample(NOW, 16, 4), NEED, reserved=False)
    assert not climb.fits(Sample(NOW, 8, 4), NEED, reserved=False)  # and the idle slice needs the quota too


def test_free_since_is_the_start_of_the_last_unbroken_free_stretch():
    samples = [Sample(NOW - 20 * MINUTE, 16, 4), Sample(NOW - 15 * MINUTE, 0, 0), Sample(NOW - 9 * MINUTE, 16, 0),
               Sample(NOW - 3 * MINUTE, 32, 0)]
    assert climbs.free_since(samples, NEED, reserved=True) == NOW - 9 * MINUTE
    assert climbs.free_since(samples, NEED, reserved=False) is None  # no idle slice since the break
    assert climbs.free_since([], NEED, reserved=True) is None


def test_samples_keep_what_the_rung_had_at_the_horizon_and_only_changes():
    samples: list[Sample] = []
    assert climbs.record(samples, Sample(NOW - 30 * MINUTE, 16, 0), NOW - 20 * MINUTE)
    assert not climbs.record(samples, Sample(NOW - 25 * MINUTE, 16, 0), NOW - 20 * MINUTE)  # nothing changed
    assert climbs.record(samples, Sample(NOW - 18 * MINUTE, 0, 0), NOW - 20 * MINUTE)
    assert climbs.record(samples, Sample(NOW - 10 * MINUTE, 16, 0), NOW - 15 * MINUTE)
    # The sample at -30 is forgotten, the one at -18 stays: it is what the rung had at the horizon (-15).
    assert [s.at for s in samples] == [NOW - 18 * MINUTE, NOW - 10 * MINUTE]
    assert climbs.free_since(samples, NEED, reserved=True) == NOW - 10 * MINUTE


def test_a_rung_s_numbers_count_its_quota_over_every_queue_and_its_idlest_pool():
    # The lender's quota less the borrower's reservation (a borrowing queue lists the flavor with no quota).
    free_tpus = [{"spot": 32, "reservation": 16}, {"spot": -16}]
    nodes = [("a-0", free_slices.CapacityNode("spot", "spot-1", True)),
             ("a-1", free_slices.CapacityNode("spot", "spot-1", True)),
             ("b-0", free_slices.CapacityNode("spot", "spot-2", True)),
             ("b-1", free_slices.CapacityNode("spot", "spot-2", False)),  # not Ready, or going
             ("c-0", free_slices.CapacityNode("spot", "spot-3", True)),  # a TPU pod on it
             ("d-0", free_slices.CapacityNode("on-demand", "od-1", True))]
    busy = {"c-0"}.__contains__
    assert free_slices.rung_numbers("spot", free_tpus, nodes, busy) == (16, 2)
    assert free_slices.rung_numbers("reservation", free_tpus, nodes, busy) == (16, 0)
    assert free_slices.rung_numbers("dws", free_tpus, nodes, busy) == (0, 0)


def test_a_tpu_node_is_usable_when_ready_not_going_without_maintenance_ahead_and_schedulable():
    def node(labels=None, **spec):
        return {"metadata": {"name": "n", "labels": {CAPACITY_LABEL: "spot", NODE_POOL_LABEL: "spot-1",
                                                      **(labels or {})}},
                "spec": spec, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert free_slices.capacity_node(node()) == free_slices.CapacityNode("spot", "spot-1", True)
    assert not free_slices.capacity_node(node(unschedulable=True)).usable
    going = node(taints=[{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}])
    assert not free_slices.capacity_node(going).usable
    maintained = node(labels={api.SCHEDULED_MAINTENANCE_LABEL: "1796000000"})  # GKE's window, in Unix seconds
    assert not free_slices.capacity_node(maintained).usable


def test_the_labels_read_are_the_ones_the_stack_writes():
    assert (CAPACITY_LABEL, NODE_POOL_LABEL) == (PLAN_LABEL_KEY, kueue.NODE_POOL_LABEL)


def test_a_capacity_failure_is_a_move_down_for_a_stockout_a_timeout_or_a_slice_not_back():
    moves = [Move("reservation", "on-demand", "user-queue-on-demand", api.STOCKOUT, "2026-12-01T11:00:00Z", "moved"),
             Move("on-demand", "spot", "user-queue-spot", api.PODS_READY_TIMEOUT, "2026-12-01T11:10:00Z", "moved"),
             Move("spot", "reservation", "user-queue", CLIMB_BACK, "2026-12-01T11:20:00Z", "moved"),
             Move("reservation", "spot", "user-queue-spot", api.STOCKOUT, "2026-12-01T11:30:00Z", "moving"), None]
    assert climb.capacity_failures(moves) == {"reservation": NOW - 30 * MINUTE, "on-demand": NOW - 50 * MINUTE}


# ---- the rules ----------------------------------------------------------------------------------------------------
def test_a_job_on_spot_climbs_to_the_highest_rung_free_for_the_settle_time():
    decided = decide(free=free_for(reservation=6, on_demand=20))
    assert decided == Climb(Move("spot", "reservation", "user-queue", CLIMB_BACK, "2026-12-01T12:00:00Z",
                                 CHECKPOINTING, from_local_queue="user-queue-spot"))
    # The reservation not settled yet: on-demand, free for longer, is taken now.
    assert decide(free=free_for(reservation=2, on_demand=20)).move.to_flavor == "on-demand"


def test_no_climb_before_the_rung_has_been_free_for_the_settle_time():
    assert decide(free=free_for(reservation=2)) == NotYet(NOW + 3 * MINUTE)
    assert decide(free=free_for()) == NotYet(None)  # nothing free: a rung's change queues the job again


def test_only_to_the_rungs_the_policy_names():
    reservation_only = dataclasses.replace(POLICY, to=("reservation",))
    assert decide(free=free_for(on_demand=60), policy=reservation_only) == NotYet(None)
    assert decide(policy=dataclasses.replace(POLICY, to=())) == NotYet(None)  # off


def test_a_rung_with_a_check_is_never_climbed_to():
    assert decide(view=running("dws", "user-queue-dws"), free=free_for(spot=60),
                  policy=dataclasses.replace(POLICY, to=("spot", "dws"))).move.to_flavor == "spot"
    # Every climb the metrics declare: a waiting job may go up to any rung without a check, whatever `to` says.
    every = [("on-demand", "reservation"), ("spot", "reservation"), ("dws", "reservation"), ("spot", "on-demand"),
             ("dws", "on-demand"), ("dws", "spot")]
    assert climb.possible_climbs(CHAIN, dataclasses.replace(POLICY, to=("spot", "dws"))) == every
    assert climb.possible_climbs(CHAIN, POLICY) == every
    assert climb.possible_climbs(CHAIN, dataclasses.replace(POLICY, to=())) == every


def test_never_in_a_job_s_first_minutes_on_a_rung():
    assert decide(view=running(on_rung=4)) == NotYet(NOW + 6 * MINUTE)


def test_at_most_once_per_min_interval():
    last = Move("on-demand", "reservation", "user-queue", CLIMB_BACK, api.format_time(NOW - 40 * MINUTE), "moved")
    assert decide(job=facts(history=(last,))) == NotYet(NOW + 20 * MINUTE)
    older = dataclasses.replace(last, at=api.format_time(NOW - 61 * MINUTE))
    assert isinstance(decide(job=facts(history=(older,))), Climb)


def test_never_for_a_dws_run_close_to_its_end():
    dws = running("dws", "user-queue-dws")
    assert decide(view=dws, job=facts(run_ends_at=NOW + 29 * MINUTE)) == NotYet(None)
    assert isinstance(decide(view=dws, job=facts(run_ends_at=NOW + 31 * MINUTE)), Climb)


def test_never_while_a_checkpoint_it_was_asked_for_is_being_saved():
    asked = CheckpointRequest.about("maintenance", NOW + 20 * MINUTE, NOW - MINUTE).value()
    assert decide(job=facts(checkpoints={"j-w-0": asked, "j-w-1": asked})) == NotYet(NOW + MINUTE)
    done = CheckpointRequest.about("maintenance", NOW + 20 * MINUTE, NOW - 3 * MINUTE).value()
    assert isinstance(decide(job=facts(checkpoints={"j-w-0": done, "j-w-1": done})), Climb)


def test_the_settle_time_counts_from_the_rung_s_last_capacity_failure():
    failed = {"reservation": NOW - 2 * MINUTE}.get
    assert decide(free=free_for(reservation=60), failure=failed) == NotYet(NOW + 3 * MINUTE)


def test_the_latest_of_the_bounds_is_when_to_look_again():
    assert decide(view=running(on_rung=8), free=free_for(reservation=1)) == NotYet(NOW + 4 * MINUTE)


@pytest.mark.parametrize("view, job", [
    (running(pods_ready_since=None), facts()),  # admitted, not whole yet: it could be stocked out
    (running(finished=True), facts()),
    (running(admitted=False, quota_reserved=False, flavor=None), facts()),
    (running(multikueue_origin="fleet"), facts()),  # the fleet's ladder moves a fleet's copy
    (running(queue="outside-queue"), facts()),  # not a job of the chain
    (running("reservation", "user-queue"), facts()),  # at its first rung already
    (running(), facts(losing=True)),  # the loss rules decide
    (running(), facts(pending=Move("spot", "dws", "user-queue-dws", api.STOCKOUT, "2026-12-01T11:59:00Z"))),
])
def test_no_climb_for_a_job_that_is_not_running_below_its_first_rung_on_its_own(view, job):
    assert decide(view=view, job=job, free=free_for(reservation=60, on_demand=60)) == NotYet(None)


# ---- a climb's checkpoint, then its move ----------------------------------------------------------------------------
CLIMB = Move("spot", "reservation", "user-queue", CLIMB_BACK, "2026-12-01T12:00:00Z", CHECKPOINTING,
             from_local_queue="user-queue-spot")
ASKED = CheckpointRequest("climbback-20261201t120000z", "2026-12-01T12:00:00Z")


def test_a_climb_asks_one_checkpoint_named_after_itself():
    assert climb.checkpoint_of(CLIMB) == ASKED  # a restart asks the same


def test_a_climb_asks_first_then_waits_for_the_save_then_moves():
    on_spot = running()
    step = lambda job, now, free=True: climb.next_in_climb(CLIMB, on_spot, job, free, POLICY, now)  # noqa: E731
    assert step(facts(), NOW) == (checkpoint_moves.ASK, None)
    half = facts(checkpoints={"j-w-0": ASKED.value(), "j-w-1": None})
    assert step(half, NOW) == (checkpoint_moves.ASK, None)
    asked = facts(checkpoints={"j-w-0": ASKED.value(), "j-w-1": ASKED.value()})
    assert step(asked, NOW + MINUTE) == (checkpoint_moves.SAVING, NOW + 2 * MINUTE)  # never moved during the save
    assert step(asked, NOW + 2 * MINUTE) == (checkpoint_moves.GO, None)
    # the rung was taken meanwhile
    assert step(asked, NOW + 2 * MINUTE, free=False) == (checkpoint_moves.CALL_OFF, None)


@pytest.mark.parametrize("view, job", [
    (running(quota_reserved=False, admitted=False, flavor=None), facts()),  # evicted meanwhile
    (running("dws", "user-queue-dws"), facts()),  # moved down meanwhile
    (running(admitted_at=NOW + MINUTE), facts()),  # a new admission
    (running(), facts(losing=True)),
    (running(finished=True), facts()),
])
def test_a_climb_is_called_off_when_the_job_no_longer_runs_where_it_climbs_from(view, job):
    assert climb.next_in_climb(CLIMB, view, job, True, POLICY, NOW + 5 * MINUTE) == (checkpoint_moves.CALL_OFF, None)


def test_a_climb_called_off_puts_back_the_record_before_it():
    down = Move("on-demand", "spot", "user-queue-spot", api.STOCKOUT, "2026-12-01T11:00:00Z", "moved")
    assert checkpoint_moves.restored((down,)) == down and checkpoint_moves.restored(()) is None


def _job(label: str, suspended: bool = False) -> dict:
    return {"metadata": {"labels": {api.QUEUE_LABEL: label}}, "spec": {"suspend": suspended}}


def test_a_climb_to_the_rung_its_queue_starts_at_is_a_move_in_place():
    """Kueue admitted the job on Spot from user-queue (reservation and on-demand were full): the climb to the
    reservation keeps the queue, so the move deactivates it, waits for the release and reactivates it; Kueue then
    tries user-queue's rungs from the top."""
    move = dataclasses.replace(CLIMB, from_local_queue="user-queue", state=api.MOVING)
    assert decisions.in_place(move)
    on_spot = running(queue="user-queue")
    assert decisions.next_in_move(move, on_spot, _job("user-queue")) == decisions.DEACTIVATE
    released = running(queue="user-queue", active=False, quota_reserved=False, admitted=False, flavor=None)
    assert decisions.next_in_move(move, released, _job("user-queue")) == decisions.WAIT_FOR_RELEASE
    assert decisions.next_in_move(move, released, _job("user-queue", True)) == api.REACTIVATE
    requeued = dataclasses.replace(released, active=True)
    assert decisions.next_in_move(move, requeued, _job("user-queue", True)) == decisions.DONE


def test_a_climb_to_another_queue_relabels_and_repoints_as_a_move_down_does():
    move = dataclasses.replace(CLIMB, state=api.MOVING)
    assert not decisions.in_place(move)
    released = running(active=False, quota_reserved=False, admitted=False, flavor=None)
    assert decisions.next_in_move(move, released, _job("user-queue-spot", True)) == decisions.RELABEL
    assert decisions.next_in_move(move, released, _job("user-queue", True)) == decisions.REPOINT


def test_a_climb_s_message_says_it_climbed_back():
    assert decisions.move_message(CLIMB, "user-queue-spot") == (
        "climbed back from spot to reservation (LocalQueue user-queue-spot -> user-queue): reservation had a free "
        "slice for the settle time")


def test_the_policy_reads_back_what_the_stack_wrote():
    assert ClimbPolicy.from_data(json.loads(json.dumps(POLICY.as_data()))) == POLICY
    with pytest.raises(TypeError):
        ClimbPolicy.from_data({**POLICY.as_data(), "to": "reservation"})


# ---- fallback.climbBack, as the stack reads it -----------------------------------------------------------------------
@pytest.mark.parametrize("given, key", [
    ({"to": ["flexStart"]}, "fallback.climbBack.to"),  # DWS provisions on request: no free slice to climb to
    ({"to": ["reservation", "reservation"]}, "fallback.climbBack.to"),
    ({"to": "reservation"}, "fallback.climbBack.to"),
    ({"settle": "0s"}, "fallback.climbBack.settle"),
    ({"minInterval": "30s"}, "fallback.climbBack.minInterval"),
    ({"minRuntime": "soon"}, "fallback.climbBack.minRuntime"),
    ({"runEndMargin": "25h"}, "fallback.climbBack.runEndMargin"),
    ({"enabled": True}, "fallback.climbBack.enabled"),
])
def test_a_bad_climb_back_setting_is_refused_by_its_key(given, key):
    from infra.offline import OfflineEngine
    from infra.settings import SettingsError
    from tests.conftest import config_with

    with pytest.raises(SettingsError) as refused:
        OfflineEngine().run(config_with({"fallback": {"climbBack": given}}))
    assert any(problem.startswith(f"tpu-fallback:{key}:") for problem in refused.value.problems), refused.value


def test_climb_back_fields_merge_over_the_defaults_into_the_controllers_policy():
    """The reader's result is the controller's own ClimbPolicy, built by keyword: the table's defaults under what is
    given, the rungs by their flavors among those on in this stack, and the save's wait of fallback.maintenance."""
    from infra.rungs import ON_DEMAND, RESERVATION, SPOT
    from infra.settings import DEFAULTS, ConfigReader
    from infra.settings.climb_back import read_climb_back

    reader, table, minute = ConfigReader(None), DEFAULTS["fallback"]["climbBack"], datetime.timedelta(minutes=1)
    raw = reader.fields("fallback.climbBack", {"settle": "90s"}, table)
    assert read_climb_back(reader, raw, table, (RESERVATION, ON_DEMAND, SPOT), 120) == ClimbPolicy(
        to=("reservation",), reserved=("reservation",), settle=datetime.timedelta(seconds=90),
        min_interval=60 * minute, min_runtime=10 * minute, run_end_margin=30 * minute, save_timeout=2 * minute)
    raw = reader.fields("fallback.climbBack", {"to": ["reservation", "onDemand"]}, table)
    off = read_climb_back(reader, raw, table, (ON_DEMAND, SPOT), 120)  # no reservation in this stack: skipped
    assert (off.to, off.reserved) == (("on-demand",), ())
    assert not reader.problems


# ---- ops status -----------------------------------------------------------------------------------------------------
def test_ops_status_says_a_job_climbed_back_when_and_why():
    from ops.status import jobs as status_jobs
    from ops.status.render import move_words

    done = status_jobs.MoveView.of(CLIMB.done())
    assert move_words(done) == ("climbed back from spot to reservation at 2026-12-01T12:00:00Z (the rung had a free "
                                "slice for fallback.climbBack.settle (fleet.climbBack.settle in a fleet))")
    rayjob = {"metadata": {"name": "j", "namespace": "default", "annotations": {
        api.FAILOVER_ANNOTATION: CLIMB.to_json()}}}
    assert status_jobs.moves_of(rayjob) == ((), status_jobs.MoveView.of(CLIMB))  # under way while the job saves


# ---- the signal, kept from the controller's watches (free_slices.FreeSlices) ----------------------------------------
def test_the_signal_follows_the_queues_nodes_and_pods_and_a_rung_that_frees_queues_the_jobs_below_it():
    from prometheus_client import CollectorRegistry

    from failover.regional.watches import WATCHED_CLUSTERQUEUES, WATCHED_PODS, WATCHED_WORKLOADS, Seen
    from failover.runtime.cache import Cache
    from failover.runtime.metrics import Metrics

    clock = [NOW]
    cache = Cache(None)
    seen = Seen(cache, CHAIN, lambda: clock[0], Metrics(CollectorRegistry()))
    free = free_slices.FreeSlices(cache, seen, CHAIN, POLICY, lambda: clock[0])
    queued: list = []
    for watch in free.watches():
        cache.subscribe(watch.watched, lambda changes, listed, watch=watch: queued.extend(
            key for change in changes for key in watch.map(change)))
    informers = cache.informers

    def queue(reserved_chips: int, on_demand_chips: int = 16) -> dict:
        return {"metadata": {"name": "cluster-queue", "resourceVersion": "1"},
                "spec": {"resourceGroups": [{"flavors": [
                    {"name": flavor, "resources": [{"name": api.TPU_RESOURCE, "nominalQuota": 16}]}
                    for flavor in ("reservation", "on-demand")]}]},
                "status": {"flavorsReservation": [{"name": "reservation", "resources": [
                    {"name": api.TPU_RESOURCE, "total": reserved_chips}]}, {"name": "on-demand", "resources": [
                        {"name": api.TPU_RESOURCE, "total": on_demand_chips}]}]}}

    def node(name: str) -> dict:
        return {"metadata": {"name": name, "resourceVersion": "1",
                             "labels": {CAPACITY_LABEL: "on-demand", NODE_POOL_LABEL: "on-demand-pool"}},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]}}

    def pod(name: str, node_name: str) -> dict:
        return {"metadata": {"namespace": "default", "name": name, "resourceVersion": "1",
                             "labels": {"ray.io/cluster": "other-raycluster"}},
                "spec": {"nodeName": node_name, "containers": [{"resources": {"requests": {api.TPU_RESOURCE: 4}}}]},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}

    on_spot = {"metadata": {"namespace": "default", "name": "wl-j", "resourceVersion": "1",
                            "ownerReferences": [{"kind": "RayJob", "name": "j"}]},
               "spec": {"queueName": "user-queue-spot"},
               "status": {"conditions": [{"type": kind, "status": "True", "lastTransitionTime": "2026-12-01T11:00:00Z"}
                                         for kind in ("QuotaReserved", "Admitted", "PodsReady")],
                          "admission": {"podSetAssignments": [{"flavors": {api.TPU_RESOURCE: "spot"}}]}}}
    informers[WATCHED_WORKLOADS].on_list([on_spot])
    informers[free_slices.WATCHED_TPU_NODES].on_list([node(f"od-{i}") for i in range(4)])
    informers[WATCHED_PODS].on_list([pod(f"other-w-{i}", f"od-{i}") for i in range(4)])
    informers[WATCHED_CLUSTERQUEUES].on_list([queue(reserved_chips=16)])
    assert free.free_since("reservation", NEED) is None and free.free_since("on-demand", NEED) is None
    queued.clear()

    clock[0] = NOW + MINUTE  # the reservation's job ends: Kueue releases its quota
    informers[WATCHED_CLUSTERQUEUES].on_event("MODIFIED", queue(reserved_chips=0))
    assert free.free_since("reservation", NEED) == NOW + MINUTE
    assert ("default", "wl-j") in queued  # the job below it, to decide when the settle time ends
    # On-demand: its quota is taken, and its nodes are busy; another job's pods going frees none of its quota.
    for i in range(4):
        informers[WATCHED_PODS].on_event("DELETED", pod(f"other-w-{i}", f"od-{i}"))
    assert free.free_since("on-demand", NEED) is None
    clock[0] = NOW + 2 * MINUTE  # its quota released too: an idle slice of on-demand, with the quota for it
    informers[WATCHED_CLUSTERQUEUES].on_event("MODIFIED", queue(reserved_chips=0, on_demand_chips=0))
    assert free.free_since("on-demand", NEED) == NOW + 2 * MINUTE
    assert free.free_since("reservation", NEED) == NOW + MINUTE  # unbroken
    assert free.idle_chips("on-demand") == 0  # an idle slice, but the job below it runs: nobody waits for it


def test_a_change_of_a_rungs_numbers_is_told_to_the_listeners_and_nothing_else_is():
    from prometheus_client import CollectorRegistry

    from failover.regional.watches import WATCHED_CLUSTERQUEUES, Seen
    from failover.runtime.cache import Cache
    from failover.runtime.metrics import Metrics

    cache = Cache(None)
    seen = Seen(cache, CHAIN, lambda: NOW, Metrics(CollectorRegistry()))
    free = free_slices.FreeSlices(cache, seen, CHAIN, POLICY, lambda: NOW)
    told = []
    free.listeners.append(lambda: told.append(1))
    for watch in free.watches():
        cache.subscribe(watch.watched, lambda changes, listed, watch=watch: [watch.map(c) for c in changes])
    queue = {"metadata": {"name": "cluster-queue", "resourceVersion": "1"},
             "spec": {"resourceGroups": [{"flavors": [
                 {"name": "on-demand", "resources": [{"name": api.TPU_RESOURCE, "nominalQuota": 16}]}]}]}}
    cache.informers[WATCHED_CLUSTERQUEUES].on_list([queue])
    assert told == [1]  # the first numbers
    cache.informers[WATCHED_CLUSTERQUEUES].on_event("MODIFIED", {**queue, "metadata": {**queue["metadata"],
                                                                                       "resourceVersion": "2"}})
    assert told == [1]  # the same numbers: nobody told


def test_jobs_that_climb_at_once_claim_no_more_than_the_rung_has():
    """Four jobs waiting for DWS once climbed onto one on-demand slice at once, each seeing it free before Kueue
    admitted any: a climb holds what it takes until its job holds quota on the rung, or CLAIM_KEPT."""
    from prometheus_client import CollectorRegistry

    from failover.regional.watches import WATCHED_WORKLOADS, Seen
    from failover.runtime.cache import Cache
    from failover.runtime.metrics import Metrics

    clock = [NOW]
    cache = Cache(None)
    seen = Seen(cache, CHAIN, lambda: clock[0], Metrics(CollectorRegistry()))
    free = free_slices.FreeSlices(cache, seen, CHAIN, POLICY, lambda: clock[0])
    free._samples["on-demand"].append(Sample(NOW, 32, 4))  # one idle slice; quota for two

    def workload(name: str, flavor: str | None = None) -> dict:
        reserved = [{"type": "QuotaReserved", "status": "True", "lastTransitionTime": "2026-12-01T12:00:00Z"}]
        return {"metadata": {"namespace": "default", "name": name, "resourceVersion": "1",
                             "ownerReferences": [{"kind": "RayJob", "name": name}]},
                "spec": {"queueName": "user-queue"},
                "status": {"conditions": reserved if flavor else [],
                           **({"admission": {"podSetAssignments": [{"flavors": {api.TPU_RESOURCE: flavor}}]}}
                              if flavor else {})}}
    cache.informers[WATCHED_WORKLOADS].on_list([workload("a"), workload("b")])
    assert free.claim("on-demand", ("default", "a"), NEED)
    assert not free.claim("on-demand", ("default", "b"), NEED)  # the slice is a's
    assert free.claim("on-demand", ("default", "a"), NEED)  # a again (a reconcile repeated): still its own
    assert free.claims_end("on-demand") == NOW + free_slices.CLAIM_KEPT
    # Kueue reserved a's quota on on-demand: once the rung's numbers show it too, its claim goes.
    cache.informers[WATCHED_WORKLOADS].on_event("MODIFIED", workload("a", "on-demand"))
    assert not free.claim("on-demand", ("default", "b"), NEED)  # the ClusterQueue's status not seen yet
    free._samples["on-demand"].append(Sample(NOW, 16, 4))  # now it is (a's 16 chips), and another idle slice
    assert free.claim("on-demand", ("default", "b"), NEED)
    clock[0] = NOW + free_slices.CLAIM_KEPT  # and a claim never outlives CLAIM_KEPT
    assert free.claim("on-demand", ("default", "c"), NEED)


def test_a_job_holding_a_dws_request_lets_a_job_that_holds_nothing_climb_first():
    on_dws = waiting(queue="user-queue-dws", quota_reserved=True, flavor="dws", recorded_flavor="dws")
    down = Move("spot", "dws", "user-queue-dws", api.STOCKOUT, api.format_time(NOW - 20 * MINUTE), api.MOVED)
    decide = lambda others: climb.decide_climb_waiting(  # noqa: E731
        CHAIN, POLICY, on_dws, facts(history=(down,)), free_for(spot=0), no_failure, NOW, others_hold_nothing=others)
    assert decide(True) == NotYet(None)  # its request keeps its place in DWS's queue
    assert decide(False).move.to_flavor == "spot"
    holds_nothing = climb.decide_climb_waiting(CHAIN, POLICY, waiting(), facts(history=(DOWN,)), free_for(on_demand=0),
                                               no_failure, NOW, others_hold_nothing=True)
    assert holds_nothing.move.to_flavor == "on-demand"  # a job holding nothing is never held back


def test_idle_chips_beside_count_a_slice_only_while_a_job_that_fits_it_waits():
    idle = Sample(NOW, 16, 4)
    assert climb.idle_chips_beside(idle, [NEED]) == 16
    assert climb.idle_chips_beside(idle, []) == 0  # nobody waits
    assert climb.idle_chips_beside(idle, [Need(32, 8)]) == 0  # the job waiting needs more than is idle
    assert climb.idle_chips_beside(Sample(NOW, 0, 4), [NEED]) == 0  # no quota: Kueue would not admit it there
    assert climb.idle_chips_beside(None, [NEED]) == 0


# ---- a job that waits below its first rung (decide_climb_waiting) ---------------------------------------------------
DOWN = Move("on-demand", "spot", "user-queue-spot", api.STOCKOUT, api.format_time(NOW - 20 * MINUTE), api.MOVED)


def waiting(queue="user-queue-spot", **changes) -> WorkloadView:
    """A job the controller moved down to Spot's queue, pending there: no quota, nothing running."""
    pending = {"quota_reserved": False, "admitted": False, "admitted_at": None, "flavor": None,
               "pods_ready_since": None}
    return running(queue=queue, **{**pending, **changes})


def decide_waiting(view=None, job=None, free=None, failure=no_failure, policy=POLICY):
    return climb.decide_climb_waiting(CHAIN, policy, view or waiting(), job or facts(history=(DOWN,)),
                                      free or free_for(reservation=0), failure, NOW)


def test_a_waiting_job_goes_back_up_to_the_highest_free_rung_at_once_with_nothing_to_save():
    decided = decide_waiting(free=free_for(reservation=0, on_demand=0))
    assert decided == Climb(Move("spot", "reservation", "user-queue", climb.CLIMB_BACK_WAITING, api.format_time(NOW),
                                 api.MOVING, from_local_queue="user-queue-spot"))
    # On-demand alone free: there; no settle of the free slice, no minRuntime, no minInterval.
    assert decide_waiting(free=free_for(on_demand=0)).move.to_flavor == "on-demand"
    # `to` bounds what a running job gives up its slice for; a waiting job gives up nothing.
    only_reservation = dataclasses.replace(POLICY, to=("reservation",))
    assert decide_waiting(free=free_for(on_demand=0), policy=only_reservation).move.to_flavor == "on-demand"


def test_a_job_waiting_for_dws_to_provision_goes_up_to_a_free_slice_giving_up_its_request():
    on_dws = waiting(queue="user-queue-dws", quota_reserved=True, flavor="dws", recorded_flavor="dws")
    down = Move("spot", "dws", "user-queue-dws", api.SLICE_LOST, api.format_time(NOW - 20 * MINUTE), api.MOVED)
    decided = decide_waiting(view=on_dws, job=facts(history=(down,)), free=free_for(spot=0))
    assert decided == Climb(Move("dws", "spot", "user-queue-spot", climb.CLIMB_BACK_WAITING, api.format_time(NOW),
                                 api.MOVING, from_local_queue="user-queue-dws"))


def test_a_waiting_job_stays_while_a_capacity_failure_on_a_free_reservation_is_recent():
    failed_at = NOW - 2 * MINUTE
    assert decide_waiting(failure=lambda flavor: failed_at) == NotYet(failed_at + POLICY.settle)
    assert isinstance(decide_waiting(failure=lambda flavor: NOW - 6 * MINUTE), Climb)


def test_a_waiting_job_climbs_onto_an_idle_slice_at_once_whatever_failed_there_before():
    """On-demand's free slice is idle nodes that exist now (a probe's, say): the job's own stockout there a minute
    ago does not hold it. The reservation's free quota alone is no such proof: its failure still holds."""
    failed_a_minute_ago = lambda flavor: NOW - MINUTE
    decided = decide_waiting(free=free_for(reservation=0, on_demand=0), failure=failed_a_minute_ago)
    assert decided == Climb(Move("spot", "on-demand", "user-queue-on-demand", climb.CLIMB_BACK_WAITING,
                                 api.format_time(NOW), api.MOVING, from_local_queue="user-queue-spot"))


@pytest.mark.parametrize("why, view, job", [
    ("it holds quota on a rung without a check: Kueue is admitting it", waiting(quota_reserved=True, flavor="spot"),
     None),
    ("it runs: the running job's rules decide", running(), None),
    ("never moved down: a user put it in that queue", waiting(), facts()),
    ("a move under way", waiting(), facts(history=(DOWN,), pending=dataclasses.replace(DOWN, state=api.MOVING))),
    ("deactivated (being moved)", waiting(active=False), None),
    ("at its queue's first rung", waiting(queue="user-queue"), None),
    ("a fleet's copy", waiting(multikueue_origin="manager"), None),
])
def test_a_job_that_is_not_waiting_below_its_first_rung_holding_nothing_stays(why, view, job):
    assert decide_waiting(view=view, job=job, free=free_for(reservation=0, on_demand=0)) == NotYet(None), why


def test_a_waiting_job_climbs_with_climbing_back_off_and_stays_with_nothing_free():
    off = dataclasses.replace(POLICY, to=())
    assert decide_waiting(policy=off).move.to_flavor == "reservation"
    assert decide_waiting(free=free_for()) == NotYet(None)


def test_a_waiting_jobs_climb_counts_as_a_quota_wait_and_says_so():
    move = Move("spot", "reservation", "user-queue", climb.CLIMB_BACK_WAITING, api.format_time(NOW), api.MOVED)
    assert api.goodput.state_of("pending", climb.CLIMB_BACK_WAITING) == api.goodput.QUOTA_WAIT
    assert decisions.move_message(move, "user-queue-spot") == (
        "climbed back from spot to reservation (LocalQueue user-queue-spot -> user-queue): reservation had a free "
        "slice while the job waited below, holding no quota")
