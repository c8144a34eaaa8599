"""The fleet's ladder on a FleetTier (tests/test_fleet_ladder_controlplane.py, bench/bench_fleet.py). What each member
offers the fleet (`fleetMember.rungs`, OFFERED): member 1 its on-demand rung; member 2 a reservation of one slice,
its on-demand rung and Spot; a third (LADDER_MEMBERS) DWS only, as today's members do. So the ladder, in the default
order, is member 2's reservation, on-demand in member 1, on-demand in member 2, Spot in member 2, then DWS in every
member. The bench runs the first two members, each offering on-demand only (ON_DEMAND_ONLY). The ladder controller
and a member's own failover controller run as deployed, with their ServiceAccounts' rights; with nodes (the tests),
every plane runs real KubeRay, the scheduler and its plan's pools, and the tests script only GCE capacity
(FleetStacks.stockout: "GCE out of resources" on the real pods, or silence) and the Ray head.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

from failover import api
from failover.ladder import decisions as ladder_rules
from infra import failover as stack_failover
from infra import fleet as stack_fleet
from infra.fleet_member import FLEET_NAMESPACE
from infra.offline import OfflineEngine, StackOutputs
from infra.offline import Plan
from testbed import jobs
from testbed.fleet_tier import (MEMBER_STACKS, PODS_READY_TIMEOUT_SECONDS, REACTION, W1, W2,
                                WORKER_LOST_SECONDS, FleetStacks)
from testbed.kube import condition, wait_for
from testbed.plans import REPO, config_with, plan_for
from testbed.processes import Process, free_port, start_serving

W3 = "member-us-east5-b"  # a third member: W1's stack in another zone, offering DWS only (the default)
# The ladder tier's members: three (the fleet), or the first two with TPU_FALLBACK_LADDER_MEMBERS=2 (measured
# on 2 cores: the fleet starts in 54 s with two, 80 s with three; the walk's DWS step, asked in every member, took
# 31.4-31.9 s with two and 31.8-32.1 s with three, against its 32 s budget).
# The ladder's resync (60 s deployed) an hour away: a decision that waited for it would fail its scenario's bound.
WATCH_ONLY_RESYNC_SECONDS = 3600
LADDER_MEMBERS = (W1, W2) if os.environ.get("TPU_FALLBACK_LADDER_MEMBERS") == "2" else (W1, W2, W3)
OFFERED = {W1: ("onDemand",), W2: ("reservation", "onDemand", "spot"), W3: ()}
ON_DEMAND_ONLY = ("onDemand",)
RESERVATION = "fleet-tier-reserved"  # member 2's, one slice (the program cannot read a reservation: config says it)
# The ladder's steps (infra/fleet.py fleet_steps): a member's step is named by the member's flavor and the member.
RESERVED_W2, ON_DEMAND_W1 = f"fleet-reservation-{W2}", f"fleet-on-demand-{W1}"
ON_DEMAND_W2, SPOT_W2 = f"fleet-on-demand-{W2}", f"fleet-spot-{W2}"
STEP_WAIT_SECONDS = 5  # the fleet's stepWait (the shortest allowed)
GRACE_SECONDS = 4  # the members' stockoutGracePeriod: the early path
MAX_WAIT = "10m"  # the fleet's maxWait: longer than any scenario; the give-up scenario sets its job's own
RECOVERY_SECONDS = 30  # the members' sliceRecoveryWait for on-demand (the shortest allowed)
DWS_RECOVERY_SECONDS = 30  # and for DWS (flexStart), the fleet's last step


def on_the_tiers_clock(ladder: str) -> str:
    """The ladder (FLEET_LADDER) with each member's podsReadyTimeout as the member's Kueue runs it on the tier
    (fleet_tier.member_values compresses it: the stack accepts nothing under 5 minutes); nothing else changed."""
    steps = json.loads(ladder)
    for step in steps:
        if step.get("podsReadyTimeoutSeconds") is not None:
            step["podsReadyTimeoutSeconds"] = PODS_READY_TIMEOUT_SECONDS
    return json.dumps(steps, sort_keys=True)


def ladder_member_plan(member: str, offered: tuple[str, ...] | None = None) -> Plan:
    """The member's stack with what it offers the fleet (OFFERED unless said) and the capacity that takes: a
    reservation of one slice, a Spot pool of one."""
    offered = OFFERED[member] if offered is None else offered
    fallback = {"stockoutGracePeriod": f"{GRACE_SECONDS}s",  # podsReadyTimeout: the tier's (fleet_tier.member_values)
                "sliceRecoveryWait": {"onDemand": f"{RECOVERY_SECONDS}s", "flexStart": f"{DWS_RECOVERY_SECONDS}s"}}
    config = {"fallback": fallback, "fleetMember": {"enabled": True, **({"rungs": list(offered)} if offered else {})}}
    if "reservation" in offered:
        config["reservation"] = {"reservations": [{"name": RESERVATION, "slices": 1}]}
    if "spot" in offered:
        config["spot"] = {"maxSlices": 1}
    if member == W3:  # no stack file of its own: member 1's config in us-east5-b
        zone = member.removeprefix("member-")
        return OfflineEngine(member).run(config_with({"zone": zone, "clusterName": f"tpu-{zone}", **config}, W1))
    return plan_for(member, config)


def ladder_fleet_plan(members: dict, climb_back: dict | None = None):
    """The shipped fleet over these members, as testbed/fleet_tier.py's, with the shortest step wait (and
    `fleet.climbBack` where given: the climb's tier, tests/test_fleet_climb_controlplane.py)."""
    stacks = {m: MEMBER_STACKS.get(m, f"my-org/tpu-fallback/{m}") for m in members}
    references = {stacks[m]: StackOutputs(plan.outputs, tuple(sorted(plan.secret_outputs)))
                  for m, plan in members.items()}
    config = config_with({"fleet": {"members": list(stacks.values()), "dispatcher": "AllAtOnce",
                                    "workerLostTimeout": f"{WORKER_LOST_SECONDS}s", "checkpointLocation": "US",
                                    "stepWait": f"{STEP_WAIT_SECONDS}s", "maxWait": MAX_WAIT,
                                    **({"climbBack": climb_back} if climb_back else {})}}, "fleet")
    return OfflineEngine("fleet", False, references).run(config)


class LadderFleet(FleetStacks):
    ladder: Process | None = None
    member_failover: Process | None = None

    def start_ladder(self) -> float:
        """Start the controller; the seconds until it has listed what it watches and runs its workers."""
        deployment = next(m for m in self.manager_plan.kubernetes_manifests()
                          if m["kind"] == "Deployment" and m["metadata"]["name"] == stack_fleet.LADDER_NAME)
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container["env"] if e["name"].startswith(("FLEET_", "LADDER_"))}
        env["FLEET_LADDER"] = on_the_tiers_clock(env["FLEET_LADDER"])
        env["LADDER_RESYNC_SECONDS"] = str(WATCH_ONLY_RESYNC_SECONDS)  # every scenario on watches and due times
        kubeconfig = self.tier.manager.kubeconfig_for_service_account(stack_failover.NAMESPACE,
                                                                      stack_fleet.LADDER_NAME)
        began = time.monotonic()
        starts = self._starts_logged()
        self.ladder = self.tier.manager.supervisor.start("fleet-ladder", [sys.executable, "-m", "failover.ladder"],
                                                         env={**os.environ, **env, "KUBECONFIG": str(kubeconfig),
                                                              # another tier's ladder may hold the deployed ports
                                                              "LADDER_HEALTH_PORT": str(free_port()),
                                                              "LADDER_METRICS_PORT": str(free_port())},
                                                         cwd=REPO)
        wait_for(lambda: self._starts_logged() > starts or not self.ladder.alive(), REACTION, "the ladder's start",
                 interval=0.05)
        assert self.ladder.alive(), self.ladder.tail()
        return time.monotonic() - began

    def _starts_logged(self) -> int:
        log = self.tier.manager.supervisor.logs / "fleet-ladder.log"
        return log.read_text(errors="replace").count(" INFO ladder: ") if log.exists() else 0

    def start_member_failover(self, member: str) -> Process:
        """The member's own failover controller, as its stack deploys it (its ServiceAccount's rights)."""
        deployment = next(m for m in self.member_plans[member].kubernetes_manifests()
                          if m["kind"] == "Deployment" and m["metadata"]["name"] == stack_failover.NAME)
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container["env"] if e["name"].startswith("FAILOVER_")}
        plane = self.tier.members[member]
        kubeconfig = plane.kubeconfig_for_service_account(stack_failover.NAMESPACE, stack_failover.NAME)
        self.member_failover, _ = start_serving(
            plane.supervisor, "failover", [sys.executable, "-m", "failover.regional"],
            {**os.environ, **env, "KUBECONFIG": str(kubeconfig)}, REPO, REACTION, "FAILOVER_HEALTH_PORT",
            ("FAILOVER_METRICS_PORT",))
        return self.member_failover

    def submit_to(self, name: str, queue: str, annotations: dict | None = None) -> str:
        """A fleet job submitted to another step's LocalQueue, with annotations; its manager Workload's name."""
        meta = self.template["metadata"]
        job = {**self.template, "metadata": {
            **meta, "name": name, "labels": {**meta["labels"], jobs.QUEUE_LABEL: queue},
            "annotations": {**(meta.get("annotations") or {}), **(annotations or {})}}}
        self.manager.create(job)
        workload = wait_for(lambda: jobs.workload_of(self.manager, FLEET_NAMESPACE, name), REACTION,
                            f"manager Workload of {name}")
        return workload["metadata"]["name"]

    def events_of(self, name: str, reason: str) -> list[dict]:
        return [e for e in self.manager.list("v1", "Event", namespace=FLEET_NAMESPACE)
                if e.get("reason") == reason and (e.get("involvedObject") or {}).get("name") == name]

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
        return not any(self.all_requests(m) for m in self.members)

    def moves(self, name: str) -> list[api.Move]:
        job = self.manager.get(*jobs.RAYJOB, name, FLEET_NAMESPACE)
        return api.move_history(job["metadata"].get("annotations"))

    def move_events(self, name: str) -> list[dict]:
        return self.events_of(name, ladder_rules.EVENT_REASON)


class Ledger:
    """Every copy and run of one fleet job in every member, per step, from watches (nothing between two polls is
    missed): which copies a member admitted, and how often a member's RayJob was started (unsuspended). The rule of
    issue 27 ("a fleet step asked once"): per (step, member), at most one admitted copy and one start. And issue 36's:
    per (step, member) one copy created per visit (a visit: the manager's Workload active at the step, from its
    (re)activation there until it leaves), admitted or not; `timeline` says which manager Workload each copy was
    made from (its spec and annotations are the manager's, copied: MultiKueue's cloneForCreate)."""

    def __init__(self, fleet: FleetStacks, job: str, workload: str):
        from failover.runtime.informer import Informer, RawClient, Watched

        self.job, self.workload = job, workload
        self._lock = threading.Lock()
        self.admitted: dict[tuple[str, str], set[str]] = {}  # (step, member) -> uids of copies admitted there
        self.starts: dict[tuple[str, str], int] = {}  # (step, member) -> how often its RayJob was unsuspended
        self._suspended: dict[str, bool] = {}  # a RayJob's uid -> suspended when last seen
        self.created: dict[tuple[str, str, int], list[str]] = {}  # (step, member, visit) -> uids of copies made
        self.visits: dict[str, int] = {}  # step -> how often the manager's Workload was (re)activated there
        self._at: tuple[str, bool] | None = None  # the manager's (queueName, active) when last seen
        self._manager_seen: list[tuple[str, str, bool, str | None]] = []  # (rv, queueName, active, move) in order
        # What each copy and run went through, in order (seconds since the ledger began): a failure reads as a story.
        self._began = time.monotonic()
        self._states: dict[str, str] = {}  # a copy's or run's uid -> its state when last seen
        self.history: list[str] = []
        base = f"namespaces/{FLEET_NAMESPACE}"
        self._informers = []
        for member, kube in fleet.kubes.items():
            api = RawClient(kube.api_client)
            for watched, seen in ((Watched("workloads", f"/apis/kueue.x-k8s.io/v1beta2/{base}/workloads"), self._copy),
                                  (Watched("rayjobs", f"/apis/ray.io/v1/{base}/rayjobs"), self._run)):
                informer = Informer(api, watched, lambda items, s=seen, m=member: [s(m, "ADDED", i) for i in items],
                                    lambda kind, obj, s=seen, m=member: s(m, kind, obj))
                informer.name = f"ledger-{watched.resource}-{member}"
                self._informers.append(informer)
        manager = Informer(RawClient(fleet.manager.api_client),
                           Watched("workloads", f"/apis/kueue.x-k8s.io/v1beta2/{base}/workloads"),
                           lambda items: [self._manager("ADDED", i) for i in items], self._manager)
        manager.name = "ledger-workloads-manager"
        self._informers.append(manager)

    def __enter__(self) -> Ledger:
        for informer in self._informers:
            informer.start()
        wait_for(lambda: all(i.synced.is_set() for i in self._informers), REACTION, "the ledger's watches")
        return self

    def __exit__(self, *_) -> None:
        for informer in self._informers:
            informer.stop()

    def _note(self, member: str, what: str, uid: str, state: str) -> None:
        """One line of `history` when a copy's or run's state changed (with the lock held)."""
        if self._states.get(uid) != state:
            self._states[uid] = state
            self.history.append(f"{time.monotonic() - self._began:.3f} {member} {what} {uid[:8]}: {state}")

    def _copy(self, member: str, kind: str, obj: dict) -> None:
        if obj["metadata"]["name"] != self.workload:
            return
        uid, queue = obj["metadata"]["uid"], (obj.get("spec") or {}).get("queueName")
        admitted = condition(obj, "Admitted") == "True" and (obj.get("spec") or {}).get("active") is not False
        evicted = next((c.get("message", "") for c in (obj.get("status") or {}).get("conditions") or []
                        if c["type"] == "Evicted" and c["status"] == "True"), None)
        with self._lock:
            if uid not in self._states and kind != "DELETED":
                self._made(member, queue, obj)
            state = f"{queue} " + ("admitted" if admitted else "waiting") + (f", evicted: {evicted}" if evicted else "")
            self._note(member, "copy", uid, "deleted" if kind == "DELETED" else state)
            if admitted and kind != "DELETED":
                self.admitted.setdefault((queue, member), set()).add(uid)

    def _made(self, member: str, queue: str, obj: dict) -> None:
        """A copy seen for the first time (with the lock held): counted in its step's visit, and told with what it
        was made from. MultiKueue copies the manager Workload's spec and annotations into it: the manager's last
        version seen with the same queue, `active` and move (WORKLOAD_MOVE_ANNOTATION) is the one it was made from,
        or a later one with the same three."""
        meta, spec = obj["metadata"], obj.get("spec") or {}
        active, move = spec.get("active", True) is not False, self._move_of(obj)
        visit = self.visits.get(queue, 0)
        self.created.setdefault((queue, member, visit), []).append(meta["uid"])
        source = next((rv for rv, q, a, m in reversed(self._manager_seen) if (q, a, m) == (queue, active, move)), None)
        owners = [f"{o.get('kind')}/{o.get('name')}" for o in meta.get("ownerReferences") or []]
        self.history.append(
            f"{time.monotonic() - self._began:.3f} {member} copy {meta['uid'][:8]} made: {queue} visit {visit} "
            f"active={active} move={move} origin={(meta.get('labels') or {}).get(api.MULTIKUEUE_ORIGIN_LABEL)} "
            f"owners={owners} created={meta.get('creationTimestamp')} rv={meta.get('resourceVersion')} "
            f"from manager rv={source}")

    @staticmethod
    def _move_of(obj: dict) -> str | None:
        """The move a Workload carries (the manager's, or a copy's, copied from it): its target and time."""
        move = api.Move.from_json((obj["metadata"].get("annotations") or {}).get(
            ladder_rules.WORKLOAD_MOVE_ANNOTATION))
        return f"{move.to_local_queue}@{move.at}" if move is not None else None

    def _manager(self, kind: str, obj: dict) -> None:
        """The manager's Workload: where it is, its visits to each step, and what its conditions and checks say, each
        version (resourceVersion) in order."""
        if obj["metadata"]["name"] != self.workload:
            return
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        checks = ", ".join(f"{c['name']} {c.get('state')} {c.get('retryCount') or 0}"
                           for c in status.get("admissionChecks") or [])
        conditions = " ".join(f"{c['type']}={c['status']}/{c.get('reason')}" for c in status.get("conditions") or []
                              if c["type"] in ("QuotaReserved", "Admitted", "Evicted", "PodsReady", "Requeued"))
        queue, active, rv = spec.get("queueName"), spec.get("active", True) is not False, \
            obj["metadata"].get("resourceVersion")
        with self._lock:
            if kind != "DELETED":
                if active and self._at != (queue, True):  # (re)activated at the step: a new visit
                    self.visits[queue] = self.visits.get(queue, 0) + 1
                self._at = (queue, active)
                self._manager_seen.append((rv, queue, active, self._move_of(obj)))
            self._note("manager", "workload", obj["metadata"]["uid"], "deleted" if kind == "DELETED" else (
                f"rv={rv} {queue} active={active} move={self._move_of(obj)} {conditions} checks [{checks}] "
                f"requeueState={status.get('requeueState') is not None} "
                f"nominated={status.get('nominatedClusterNames')} cluster={status.get('clusterName')}"))

    def _run(self, member: str, kind: str, obj: dict) -> None:
        if obj["metadata"]["name"] != self.job:
            return
        uid, suspended = obj["metadata"]["uid"], bool((obj.get("spec") or {}).get("suspend"))
        step = (obj["metadata"].get("labels") or {}).get(jobs.QUEUE_LABEL, "")
        with self._lock:
            self._note(member, "run", uid, "deleted" if kind == "DELETED" else f"{step} " + (
                "suspended" if suspended else "started") + f" ({(obj.get('status') or {}).get('jobDeploymentStatus')})")
            if kind == "DELETED":
                return
            if not suspended and self._suspended.get(uid, True):
                self.starts[(step, member)] = self.starts.get((step, member), 0) + 1
            self._suspended[uid] = suspended

    def asked_more_than_once(self) -> dict:
        """(step, member) -> what was there more than once: admitted copies, starts; and (step, member, visit) -> the
        copies made in one visit, where more than one."""
        with self._lock:
            twice = {key: {"admitted": len(self.admitted.get(key, ())), "starts": self.starts.get(key, 0)}
                     for key in set(self.admitted) | set(self.starts)
                     if len(self.admitted.get(key, ())) > 1 or self.starts.get(key, 0) > 1}
            return {**twice, **{key: {"copies": len(uids)} for key, uids in self.created.items() if len(uids) > 1}}

    def copies_per_visit(self) -> dict[tuple[str, str, int], int]:
        """(step, member, visit) -> how many copies were made there in that visit."""
        with self._lock:
            return {key: len(uids) for key, uids in self.created.items()}

    def text(self) -> str:
        with self._lock:
            made: dict[tuple[str, str], list[int]] = {}
            for (step, member, _visit), uids in sorted(self.created.items()):
                made.setdefault((step, member), []).append(len(uids))
            return "; ".join(f"{step}@{member}: copies made {made.get((step, member), [])} (per visit), admitted "
                             f"{len(self.admitted.get((step, member), ()))}, started "
                             f"{self.starts.get((step, member), 0)}"
                             for step, member in sorted(set(self.admitted) | set(self.starts) | set(made)))

    def story(self) -> str:
        """`text()`, then every change the ledger saw, in order."""
        with self._lock:
            history = "\n  ".join(self.history)
        return f"{self.text()}\n  {history}"
