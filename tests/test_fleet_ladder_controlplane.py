"""The fleet's ladder (issue 18) on three real control planes: a manager and two members, each etcd + kube-apiserver
1.36 + kube-controller-manager + Kueue 0.19.2, from the stacks' own plans, with both members offering their
on-demand rung to the fleet (`fleetMember.rungs: [onDemand]`): the ladder is on-demand in member 1, on-demand in
member 2, then DWS in both. The ladder controller runs as deployed (`python -m failover.ladder`, its own
ServiceAccount's Role). There is no kubelet: a run's pods are never ready unless the test plays KubeRay's
`Running`, so each member's podsReadyTimeout (30 s, the shortest allowed) evicts an on-demand run: a stockout.

A fleet of its own (the shared one of tests/test_fleet_controlplane.py is not touched), shared by the scenarios.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from failover import decisions
from failover import ladder as ladder_controller
from infra import failover as stack_failover
from infra import fleet as stack_fleet
from infra.fleet_member import FLEET_LOCAL_QUEUE, FLEET_NAMESPACE
from infra.kueue import KUEUE_API_VERSION
from infra.offline import OfflineEngine, StackOutputs
from tests.conftest import REPO, config_with, plan_for
from tests.controlplane import jobs
from tests.controlplane.fleet_tier import (MEMBER_STACKS, MEMBERS, PODS_READY_TIMEOUT_SECONDS, REACTION, W1, W2,
                                           WORKER_LOST_SECONDS, FleetStacks, FleetTier)
from tests.controlplane.kube import condition, wait_for
from tests.controlplane.processes import Process
from tests.controlplane.stack import release_values

pytestmark = pytest.mark.controlplane
STEP1, STEP2 = f"fleet-on-demand-{W1}", f"fleet-on-demand-{W2}"
# What a failed on-demand step may cost: the member's podsReadyTimeout, plus 2 s for MultiKueue and the move.
STEP_BUDGET = PODS_READY_TIMEOUT_SECONDS + 2
STEP_WAIT_SECONDS = 5  # the fleet's stepWait (the shortest allowed)


def ladder_member_plan(member: str):
    return plan_for(member, {"fallback": {"podsReadyTimeout": f"{PODS_READY_TIMEOUT_SECONDS}s",
                                          "stockoutGracePeriod": "4s"},
                             "fleetMember": {"enabled": True, "rungs": ["onDemand"]}})


def ladder_fleet_plan(members: dict):
    """The shipped fleet over these members, as tests/controlplane/fleet_tier.py's, with the shortest step wait."""
    references = {MEMBER_STACKS[m]: StackOutputs(plan.outputs, tuple(sorted(plan.secret_outputs)))
                  for m, plan in members.items()}
    config = config_with({"fleet": {"members": list(MEMBER_STACKS.values()), "dispatcher": "AllAtOnce",
                                    "workerLostTimeout": f"{WORKER_LOST_SECONDS}s", "checkpointLocation": "US",
                                    "stepWait": f"{STEP_WAIT_SECONDS}s"}}, "fleet")
    return OfflineEngine("fleet", False, references).run(config)


class LadderFleet(FleetStacks):
    ladder: Process | None = None

    def start_ladder(self) -> float:
        """Start the controller; the seconds until it has listed what it watches and runs its workers."""
        deployment = next(m for m in self.manager_plan.kubernetes_manifests()
                          if m["kind"] == "Deployment" and m["metadata"]["name"] == stack_fleet.LADDER_NAME)
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container["env"] if e["name"].startswith("FLEET_")}
        kubeconfig = self.tier.manager.kubeconfig_for_service_account(stack_failover.NAMESPACE,
                                                                      stack_fleet.LADDER_NAME)
        began = time.monotonic()
        starts = self._starts_logged()
        self.ladder = self.tier.manager.supervisor.start("fleet-ladder", [sys.executable, "-m", "failover.ladder"],
                                                         env={**os.environ, **env, "KUBECONFIG": str(kubeconfig)},
                                                         cwd=REPO)
        wait_for(lambda: self._starts_logged() > starts or not self.ladder.alive(), REACTION, "the ladder's start",
                 interval=0.05)
        assert self.ladder.alive(), self.ladder.tail()
        return time.monotonic() - began

    def _starts_logged(self) -> int:
        log = self.tier.manager.supervisor.logs / "fleet-ladder.log"
        return log.read_text(errors="replace").count(" INFO ladder: ") if log.exists() else 0

    def kill_ladder(self) -> None:
        """kill -9: no cleanup, whatever it was doing."""
        os.kill(self.ladder.popen.pid, signal.SIGKILL)
        self.ladder.popen.wait()

    def admitted_copy(self, member: str, workload: str, queue: str) -> dict | None:
        found = self.copy_in(member, workload)
        if found and found["spec"].get("queueName") == queue and condition(found, "Admitted") == "True":
            return found
        return None

    def no_requests_anywhere(self) -> bool:
        return not any(self.all_requests(m) for m in MEMBERS)

    def moves(self, name: str) -> list[decisions.Move]:
        job = self.manager.get(*jobs.RAYJOB, name, FLEET_NAMESPACE)
        return decisions.move_history(job["metadata"].get("annotations"))

    def move_events(self, name: str) -> list[dict]:
        return [e for e in self.manager.list("v1", "Event", namespace=FLEET_NAMESPACE)
                if e.get("reason") == ladder_controller.EVENT_REASON
                and (e.get("involvedObject") or {}).get("name") == name]


@pytest.fixture(scope="module")
def fleet(request) -> Iterator[LadderFleet]:
    members = {m: ladder_member_plan(m) for m in MEMBERS}
    manager_plan = ladder_fleet_plan(members)
    tier = FleetTier(release_values(manager_plan), {m: release_values(p) for m, p in members.items()})
    failed = True
    try:
        tier.start()
        state = LadderFleet(tier, manager_plan, members)
        state.apply()
        state.start_ladder()
        yield state
        failed = request.session.testsfailed > 0
    finally:
        tier.stop(keep_workdir=failed)
        if failed:
            print(f"\nfleet ladder tier logs kept in {tier.workdir}")


def test_the_ladders_steps_are_active_on_both_sides(fleet):
    assert [s["localQueue"] for s in fleet.manager_plan.outputs["ladder"]] == [STEP1, STEP2, FLEET_LOCAL_QUEUE]
    for step in (STEP1, STEP2, FLEET_LOCAL_QUEUE):
        queue = fleet.manager.get(KUEUE_API_VERSION, "LocalQueue", step, FLEET_NAMESPACE)
        assert condition(queue, "Active") == "True", queue.get("status")
    for member in MEMBERS:
        step_queue = fleet.kubes[member].get(KUEUE_API_VERSION, "ClusterQueue", "fleet-on-demand")
        assert condition(step_queue, "Active") == "True", step_queue.get("status")
    assert fleet.template["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == STEP1


def test_an_idle_on_demand_slice_runs_the_job_there_and_a_busy_step_is_left_after_the_step_wait(fleet):
    started = time.monotonic()
    workload = fleet.submit("ladder-idle")
    copy = wait_for(lambda: fleet.admitted_copy(W1, workload, STEP1), REACTION, "the copy admitted in member 1")
    admitted_after = time.monotonic() - started
    # On the member's fleet step: its on-demand flavor, borrowed from the region's cohort.
    assert copy["status"]["admission"]["clusterQueue"] == "fleet-on-demand"
    assert jobs.tpu_flavor(copy) == "on-demand"
    wait_for(lambda: fleet.rayjob_in(W1, "ladder-idle"), REACTION, "the RayJob in member 1")
    fleet.play_running(W1, "ladder-idle")
    assert fleet.copy_in(W2, workload) is None  # that step's member only
    assert fleet.no_requests_anywhere()
    print(f"\nidle on-demand slice: admitted in member 1 {admitted_after:.2f} s after submission")
    assert admitted_after <= 10  # issue 18 aims at 2 s; the suite's load is not the fleet's

    # A second job while the first holds member 1's on-demand slice: the step is busy; after the step wait it goes
    # to the next step, member 2's idle on-demand slice.
    started = time.monotonic()
    busy = fleet.submit("ladder-busy")
    wait_for(lambda: fleet.admitted_copy(W2, busy, STEP2), STEP_WAIT_SECONDS + REACTION, "the busy job in member 2",
             interval=0.05)
    moved_after = time.monotonic() - started
    (move,) = fleet.moves("ladder-busy")
    assert (move.from_flavor, move.to_flavor, move.reason) == (STEP1, STEP2, ladder_controller.STEP_BUSY)
    assert fleet.no_requests_anywhere()
    print(f"busy step: admitted at the next step {moved_after:.2f} s after submission (step wait {STEP_WAIT_SECONDS} s)")
    assert moved_after <= STEP_WAIT_SECONDS + 4
    # The running job stays where it is: nothing moves it.
    assert fleet.moves("ladder-idle") == [] and fleet.running_in("ladder-idle") == [W1]
    fleet.finish("ladder-busy")
    fleet.finish("ladder-idle")


def test_a_stockout_walks_the_ladder_one_move_per_hop_even_under_kill_9_and_ends_at_dws_everywhere(fleet):
    name = "ladder-walk"
    restart: list[float] = []  # seconds from kill -9 to the new controller running
    stop = threading.Event()

    def kill_during_the_first_move() -> None:
        """kill -9 the controller as soon as its first move is written, and start it again."""
        while not stop.is_set():
            job = fleet.manager.get(*jobs.RAYJOB, name, FLEET_NAMESPACE) or {}
            move = decisions.Move.from_json((job.get("metadata", {}).get("annotations") or {}).get(
                decisions.FAILOVER_ANNOTATION))
            if move is not None and move.state == decisions.MOVING:
                began = time.monotonic()
                fleet.kill_ladder()
                fleet.start_ladder()
                restart.append(time.monotonic() - began)
                return
            time.sleep(0.02)

    workload = fleet.submit(name)
    admitted = {}
    killer = threading.Thread(target=kill_during_the_first_move, daemon=True)
    killer.start()
    try:
        wait_for(lambda: fleet.admitted_copy(W1, workload, STEP1), REACTION, "step 1 admitted in member 1")
        admitted[STEP1] = time.monotonic()
        assert fleet.no_requests_anywhere()
        # No pod becomes ready: member 1 evicts at its podsReadyTimeout; the job must go to member 2's on-demand.
        wait_for(lambda: fleet.admitted_copy(W2, workload, STEP2), PODS_READY_TIMEOUT_SECONDS + REACTION,
                 "step 2 admitted in member 2", interval=0.05)
        admitted[STEP2] = time.monotonic()
        assert fleet.copy_in(W1, workload) is None or fleet.copy_in(W1, workload)["spec"]["queueName"] == STEP2
        assert fleet.no_requests_anywhere()
        # Member 2 stocks out too: the last step, DWS in both members at once.
        requests = wait_for(lambda: all(fleet.requests_in(m, workload) for m in MEMBERS) and {
            m: fleet.requests_in(m, workload)[0] for m in MEMBERS}, PODS_READY_TIMEOUT_SECONDS + REACTION,
            "DWS requests in both members", interval=0.05)
        admitted[FLEET_LOCAL_QUEUE] = time.monotonic()
    finally:
        stop.set()
        killer.join(5)
    assert set(requests) == set(MEMBERS)
    assert restart, "the controller was never caught in a move"
    # First provisioned wins, as without a ladder.
    fleet.provision_until_created(W2, workload, name)
    wait_for(lambda: fleet.copy_in(W1, workload) is None, REACTION, "member 1's copy deleted")
    assert fleet.running_in(name) == [W2]

    moves = fleet.moves(name)
    assert [(m.from_flavor, m.to_flavor) for m in moves] == [(STEP1, STEP2), (STEP2, FLEET_LOCAL_QUEUE)]
    assert all(m.reason == ladder_controller.MEMBER_EVICTED for m in moves)
    events = wait_for(lambda: len(fleet.move_events(name)) >= 2 and fleet.move_events(name), REACTION, "two Events")
    time.sleep(1)
    events = fleet.move_events(name)
    assert len(events) == 2, [e["message"] for e in events]  # one per hop, the kill -9 included
    assert f"member {W1} evicted it" in events[0]["message"] + events[1]["message"]
    job = fleet.manager.get(*jobs.RAYJOB, name, FLEET_NAMESPACE)
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == FLEET_LOCAL_QUEUE
    per_step = {STEP1: admitted[STEP2] - admitted[STEP1], STEP2: admitted[FLEET_LOCAL_QUEUE] - admitted[STEP2]}
    print(f"\nladder walk: seconds per failed step (admitted there -> next step admitted / asked): "
          f"{json.dumps({k: round(v, 2) for k, v in per_step.items()})}; killed -9 during the first move, "
          f"restarted and running again in {restart[0]:.2f} s")
    # The first hop also paid for the controller's restart (a new process lists what it watches).
    assert per_step[STEP1] <= STEP_BUDGET + restart[0], f"{STEP1} cost {per_step[STEP1]:.2f} s"
    assert per_step[STEP2] <= STEP_BUDGET, f"{STEP2} cost {per_step[STEP2]:.2f} s > {STEP_BUDGET} s"
    fleet.finish(name)
