"""Climbing back in a fleet (issue 36 item 3) on real control planes: a manager and two members, each etcd +
kube-apiserver + Kueue 0.19.2 from the stacks' own plans, real KubeRay, kube-scheduler and KWOK nodes shaped like the
plans' pools (testbed/ladder_tier.py: member 1 offers its on-demand rung, member 2 a reservation of one slice, its
on-demand rung and Spot). The ladder controller runs as deployed (`python -m failover.ladder`, its ServiceAccount's
Role on the manager, the manager's identity's Roles in the members), with fleet.climbBack on the tier's clock.

Member 2's reservation is held by another fleet job; the climber, submitted to the first step, leaves it after the
step wait and runs at member 1's on-demand step. The holder is deleted: the reservation's quota frees in member 2,
and within settle + 2 s of that the ladder starts the climb (its Move `checkpointing` on the manager's RayJob), asks
the climber's TPU pods in member 1 to save, moves it saveTimeout later (route D), and the climber runs at member 2's
reservation step: once, one RayCluster at a time, the move in its history and one ClimbedBack Event.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from failover import api
from failover import maintenance
from failover.ladder import climb
from infra.fleet_member import FLEET_NAMESPACE
from infra.kueue import KUEUE_API_VERSION
from testbed import jobs
from testbed.fleet_tier import REACTION, W1, W2, applied_fleet
from testbed.kube import condition, wait_for
from testbed.ladder_tier import (ON_DEMAND_W1, RESERVED_W2, STEP_WAIT_SECONDS, LadderFleet, ladder_fleet_plan,
                                 ladder_member_plan)

pytestmark = pytest.mark.controlplane
SETTLE_SECONDS = 5
SAVE_SECONDS = 10  # fleet.climbBack.saveTimeout's shortest
CLIMB_BACK = {"settle": f"{SETTLE_SECONDS}s", "minRuntime": "0s", "minInterval": "1m",
              "saveTimeout": f"{SAVE_SECONDS}s"}
POLL = 0.1  # the test's own clock: what it times, it polls this often


@pytest.fixture(scope="module")
def fleet(request) -> Iterator[LadderFleet]:
    members = {m: ladder_member_plan(m) for m in (W1, W2)}
    with applied_fleet(ladder_fleet_plan(members, CLIMB_BACK), members, LadderFleet,
                       keep_logs=lambda: request.session.testsfailed > 0, nodes=True) as state:
        state.start_ladder()
        yield state


def free_reservation_chips(fleet: LadderFleet) -> int:
    """Member 2's free TPU chips of its reservation flavor, as the ladder counts them (every ClusterQueue there)."""
    queues = fleet.kubes[W2].list(KUEUE_API_VERSION, "ClusterQueue")
    return climb.free_chips("reservation", [maintenance.free_tpus(q) for q in queues])


def pending_move(fleet: LadderFleet, name: str) -> api.Move | None:
    job = fleet.manager.get(*jobs.RAYJOB, name, FLEET_NAMESPACE)
    return api.Move.from_json((job["metadata"].get("annotations") or {}).get(api.FAILOVER_ANNOTATION))


def worker_requests(fleet: LadderFleet, member: str, name: str) -> dict[str, str | None]:
    """The job's TPU worker pods in a member and their checkpoint request."""
    cluster = ((fleet.rayjob_in(member, name) or {}).get("status") or {}).get("rayClusterName")
    pods = fleet.kubes[member].list("v1", "Pod", namespace=FLEET_NAMESPACE) if cluster else []
    return {p["metadata"]["name"]: (p["metadata"].get("annotations") or {}).get(api.CHECKPOINT_REQUEST_ANNOTATION)
            for p in pods if (p["metadata"].get("labels") or {}).get("ray.io/cluster") == cluster
            and (p["metadata"].get("labels") or {}).get("ray.io/node-type") == "worker"}


class Runs:
    """Every RayCluster of the job and every pod of one, in both members, polled: the most seen at once."""

    def __init__(self, fleet: LadderFleet, name: str):
        self.fleet, self.name = fleet, name
        self.most_clusters = self.most_runs = 0
        self.seen: list[tuple[float, list[str], list[str]]] = []  # (time, clusters, RayClusters of the pods)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        began = time.monotonic()
        while not self._stop.is_set():
            clusters, runs = [], set()
            for member in self.fleet.members:
                clusters += [f"{member}/{c}" for c in self.fleet.rayclusters_in(member, self.name)]
                runs |= {f"{member}/{label}" for p in self.fleet.kubes[member].list(
                    "v1", "Pod", namespace=FLEET_NAMESPACE)
                    if (label := (p["metadata"].get("labels") or {}).get("ray.io/cluster", "")).startswith(
                        f"{self.name}-")}
            self.most_clusters, self.most_runs = max(self.most_clusters, len(clusters)), max(self.most_runs, len(runs))
            if not self.seen or self.seen[-1][1:] != (clusters, sorted(runs)):
                self.seen.append((round(time.monotonic() - began, 2), clusters, sorted(runs)))
            time.sleep(POLL)

    def __enter__(self) -> Runs:
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join(REACTION)


def test_a_fleet_job_climbs_back_to_the_reservation_step_once_it_frees(fleet):
    holder, name = "climb-holder", "climb-job"
    held = fleet.submit(holder)
    wait_for(lambda: fleet.admitted_copy(W2, held, RESERVED_W2), REACTION, "the holder at member 2's reservation")
    jobs.wait_pods_ready(fleet.kubes[W2], FLEET_NAMESPACE, holder, REACTION)
    assert free_reservation_chips(fleet) == 0
    # The climber: the reservation step is busy, so after the step wait it runs at member 1's on-demand step.
    workload = fleet.submit(name)
    wait_for(lambda: fleet.admitted_copy(W1, workload, ON_DEMAND_W1), STEP_WAIT_SECONDS + REACTION,
             "the climber at member 1's on-demand step", interval=POLL)
    jobs.wait_pods_ready(fleet.kubes[W1], FLEET_NAMESPACE, name, REACTION)
    (busy,) = wait_for(lambda: fleet.moves(name), REACTION, "the busy step's move recorded")
    assert (busy.from_flavor, busy.to_flavor, busy.reason) == (RESERVED_W2, ON_DEMAND_W1, api.STEP_BUSY)
    time.sleep(SETTLE_SECONDS + 1)  # nothing free above it: it stays
    assert pending_move(fleet, name).state == api.MOVED and fleet.running_in(name) == [W1]

    with Runs(fleet, name) as runs:
        fleet.manager.delete(*jobs.RAYJOB, holder, FLEET_NAMESPACE, propagation="Background")
        released = wait_for(lambda: free_reservation_chips(fleet) > 0 and time.monotonic(), REACTION,
                            "member 2's reservation quota free", interval=POLL)
        climbing = wait_for(lambda: (m := pending_move(fleet, name)) is not None and m.state == api.CHECKPOINTING
                            and (m, time.monotonic()), SETTLE_SECONDS + REACTION, "the climb started",
                            interval=POLL)
        move, started = climbing
        cluster = fleet.rayjob_in(W1, name)["status"]["rayClusterName"]
        assert climb.old_run(climb.moving(move), name, [("pod", cluster)]) == ["pod"], cluster  # what route D awaits
        request = climb.checkpoint_of(move)
        asked = wait_for(lambda: (pods := worker_requests(fleet, W1, name)) and all(
            v == request.value() for v in pods.values()) and time.monotonic(), REACTION,
            "the checkpoint request on the climber's TPU pods in member 1", interval=POLL)
        # It runs on in member 1 while it saves: still admitted there, its pods ready.
        wait_for(lambda: time.monotonic() >= asked + SAVE_SECONDS - 2, REACTION, "most of the save's time",
                 interval=POLL)
        assert fleet.manager_workload(workload)["spec"].get("active") is not False
        assert condition(fleet.copy_in(W1, workload), "PodsReady") == "True"
        deactivated = wait_for(lambda: fleet.manager_workload(workload)["spec"].get("active") is False
                               and time.monotonic(), REACTION, "the climb's deactivation", interval=POLL)
        deactivated_at = time.time() - (time.monotonic() - deactivated)  # on the wall clock, as the request's stamp
        wait_for(lambda: fleet.admitted_copy(W2, workload, RESERVED_W2), REACTION,
                 "the climber at member 2's reservation step", interval=POLL)
        jobs.wait_pods_ready(fleet.kubes[W2], FLEET_NAMESPACE, name, REACTION)
        wait_for(lambda: not fleet.rayjob_in(W1, name), REACTION, "member 1's old run gone")
        time.sleep(2)  # and it stays: no second climb, nothing back in member 1
    print(f"\nfleet climb: started {started - released:.2f} s after the reservation's quota was seen free (settle "
          f"{SETTLE_SECONDS} s); the request seen on the pods {asked - started:.2f} s after; deactivated "
          f"{deactivated - asked:.2f} s after the request (saveTimeout {SAVE_SECONDS} s); runs: {runs.seen}")
    assert SETTLE_SECONDS - 0.5 <= started - released <= SETTLE_SECONDS + 2, started - released
    # Not before the save's time has passed since the request's own stamp (whole seconds: the climb's start).
    assert deactivated_at >= request.asked_at.timestamp() + SAVE_SECONDS, (deactivated_at, request.at)
    assert (move.from_flavor, move.to_flavor, move.member) == (ON_DEMAND_W1, RESERVED_W2, W1)
    assert runs.most_clusters == 1 and runs.most_runs == 1, runs.seen  # one run at a time
    assert fleet.running_in(name) == [W2]
    moves = fleet.moves(name)
    assert [(m.from_flavor, m.to_flavor, m.reason) for m in moves] == [
        (RESERVED_W2, ON_DEMAND_W1, api.STEP_BUSY), (ON_DEMAND_W1, RESERVED_W2, api.CLIMB_BACK)]
    assert pending_move(fleet, name) == moves[-1]
    (event,) = wait_for(lambda: fleet.events_of(name, api.CLIMB_EVENT_REASON), REACTION, "the ClimbedBack Event")
    assert f"climbed back from step {ON_DEMAND_W1} (member {W1}) to step {RESERVED_W2}" in event["message"]
    assert len(fleet.move_events(name)) == 1  # the busy step's only: a climb is not a move down
    assert fleet.no_requests_anywhere()
    fleet.finish(name)
