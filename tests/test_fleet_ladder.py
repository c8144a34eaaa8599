"""The fleet's ladder (issue 18), offline: the steps members offer (`fleetMember.rungs`), the chain of steps the fleet
derives (infra/fleet.py ladder_steps), their objects on both sides, the rules, and the ladder controller's decisions
(failover/ladder/). The real Kueue judges them in tests/test_fleet_ladder_controlplane.py.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import functools
import json

import pytest

from failover import api
from failover.api import MOVED, MOVING, RECOVERED, LostSlice, Move
from failover.ladder import controller as ladder_controller
from failover.ladder import decisions as ladder_rules
from infra import failover as failover_objects
from infra import fleet as fleet_objects
from infra import fleet_member
from infra.fleet_member import FLEET_LOCAL_QUEUE, FLEET_MEMBER_OUTPUT, FLEET_NAMESPACE
from infra.offline import OfflineEngine, Plan, StackOutputs
from infra.settings import SettingsError
from tests.conftest import config_with, plan_for
from tests.killed_controller import Events, Killed, KilledAfter, merge_patch

FLEET = "fleet"
W1, W2 = MEMBERS = ("member-us-east5-a", "member-asia-northeast1-b")
STACKS = {m: f"my-org/tpu-fallback/{m}" for m in MEMBERS}
ON_DEMAND_RUNGS = {"fleetMember": {"enabled": True, "rungs": ["onDemand"]}}


@functools.cache
def member_outputs(member: str, rungs: tuple[str, ...] = ("onDemand",)) -> StackOutputs:
    plan = plan_for(member, {"fleetMember": {"enabled": True, "rungs": list(rungs)}})
    return StackOutputs(plan.outputs, tuple(sorted(plan.secret_outputs)))


def fleet_plan(overrides: dict | None = None, answers: dict | None = None) -> Plan:
    answers = answers or {STACKS[m]: member_outputs(m) for m in MEMBERS}
    return OfflineEngine(FLEET, False, answers).run(config_with(overrides or {}, FLEET))


@functools.cache
def cached_ladder_plan() -> Plan:
    return fleet_plan()


def manifests(plan: Plan, kind: str) -> dict[str, dict]:
    return {m["metadata"]["name"]: m for m in plan.kubernetes_manifests() if m["kind"] == kind}


# ---- a member's steps ----------------------------------------------------------------------------------------


def test_a_member_offers_its_on_demand_rung_as_a_step_that_borrows_only_that_rung():
    plan = plan_for(W1, ON_DEMAND_RUNGS)
    queue = manifests(plan, "ClusterQueue")["fleet-on-demand"]
    assert queue["spec"]["cohortName"] == "tpu-fallback"  # the region's cohort, where its own queues own it
    flavors = queue["spec"]["resourceGroups"][0]["flavors"]
    assert [f["name"] for f in flavors] == ["default-cpu", "on-demand"]  # never another rung
    assert {r["nominalQuota"] for f in flavors for r in f["resources"]} == {"0"}  # all of it borrowed
    local = manifests(plan, "LocalQueue")[f"fleet-on-demand-{W1}"]
    assert local["metadata"]["namespace"] == FLEET_NAMESPACE and local["spec"]["clusterQueue"] == "fleet-on-demand"
    assert manifests(plan, "LocalQueue")[FLEET_LOCAL_QUEUE]["spec"]["clusterQueue"] == "cluster-queue-dws"
    (step,) = plan.outputs[FLEET_MEMBER_OUTPUT]["steps"]
    assert step["rung"] == "onDemand" and step["localQueue"] == f"fleet-on-demand-{W1}"
    assert step["capacity"]["tpuChips"] == 16 and step["capacity"]["slices"] == 1


def test_a_member_that_offers_no_rung_publishes_no_step():
    assert "steps" not in plan_for(W1).outputs[FLEET_MEMBER_OUTPUT]


@pytest.mark.parametrize("overrides", [{}, ON_DEMAND_RUNGS], ids=["dws-only", "offers-a-rung"])
def test_every_member_refuses_an_inactive_copy_of_a_job_the_ladder_moves_and_nothing_else(overrides):
    """Issue 36: a move's deactivation lets MultiKueue 0.19.2 dispatch the Workload again while its quota is held, an
    inactive copy in the step being left; every member (the last step is all of them) refuses exactly that: a create,
    in the fleet's namespace, of MultiKueue's copy (its origin label) carrying a move or a give-up of the ladder, with
    `spec.active` false. The real API server judges the rule in tests/test_fleet_ladder_controlplane.py (no such copy
    on a five-hop walk); a rule it cannot evaluate lets the copy through (as before), never a real dispatch."""
    plan = plan_for(W1, overrides)
    policy = manifests(plan, "ValidatingAdmissionPolicy")[fleet_member.COPY_GUARD]
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Ignore"
    assert spec["matchConstraints"] == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": FLEET_NAMESPACE}},
        "resourceRules": [{"apiGroups": ["kueue.x-k8s.io"], "apiVersions": ["*"], "operations": ["CREATE"],
                           "resources": ["workloads"]}]}
    (match,) = spec["matchConditions"]
    for needed in (api.MULTIKUEUE_ORIGIN_LABEL, ladder_rules.WORKLOAD_MOVE_ANNOTATION,
                   ladder_rules.WORKLOAD_GIVE_UP_ANNOTATION):
        assert f"'{needed}' in object.metadata" in match["expression"]
    assert [v["expression"] for v in spec["validations"]] == ["!has(object.spec.active) || object.spec.active"]
    binding = manifests(plan, "ValidatingAdmissionPolicyBinding")[fleet_member.COPY_GUARD]
    assert binding["spec"] == {"policyName": fleet_member.COPY_GUARD, "validationActions": ["Deny"]}


@pytest.mark.parametrize("overrides, key, message", [
    ({"fleetMember": {"enabled": True, "rungs": ["spot"]}}, "fleetMember.rungs[0]", "'spot' is not an enabled rung"),
    ({"fleetMember": {"enabled": True, "startRung": "onDemand", "rungs": ["flexStart"]}}, "fleetMember.rungs[0]",
     "provisions before admission"),
    ({"fleetMember": {"enabled": True, "rungs": ["onDemand", "onDemand"]}}, "fleetMember.rungs[1]", "listed twice"),
    ({"fleetMember": {"enabled": True, "rungs": "onDemand"}}, "fleetMember.rungs", "must be a list"),
    # Issue 27: accepted silently before; the start rung is never a step one member at a time.
    ({"fleetMember": {"enabled": True, "rungs": ["onDemand", "flexStart"]}}, "fleetMember.rungs[1]",
     "'flexStart' is this member's startRung"),
], ids=["rung-not-here", "dws-is-the-last-step", "twice", "not-a-list", "start-rung-listed"])
def test_member_ladder_rules(overrides, key, message):
    with pytest.raises(SettingsError) as failure:
        plan_for(W1, overrides)
    assert f"tpu-fallback:{key}" in str(failure.value) and message in str(failure.value)


def test_a_step_name_longer_than_a_label_value_fails_naming_the_key():
    long_stack = "member-" + "x" * 50
    with pytest.raises(SettingsError) as failure:
        OfflineEngine(long_stack).run(config_with(ON_DEMAND_RUNGS, W1))
    assert "tpu-fallback:fleetMember.rungs[0]" in str(failure.value) and "at most 63" in str(failure.value)


# ---- the fleet's chain of steps ------------------------------------------------------------------------------


def test_the_fleet_chains_each_members_on_demand_then_dws_everywhere():
    plan = cached_ladder_plan()
    steps = plan.outputs["ladder"]
    assert [s["localQueue"] for s in steps] == [f"fleet-on-demand-{W1}", f"fleet-on-demand-{W2}", FLEET_LOCAL_QUEUE]
    assert [s["members"] for s in steps] == [[W1], [W2], [W1, W2]]
    assert plan.outputs["localQueue"] == {"namespace": FLEET_NAMESPACE, "name": f"fleet-on-demand-{W1}"}
    for step in steps[:-1]:  # a ClusterQueue, check and config per step, that step's member only
        name = step["localQueue"]
        queue = manifests(plan, "ClusterQueue")[name]
        assert queue["spec"]["admissionChecksStrategy"] == {"admissionChecks": [{"name": name}]}
        quota = {r["name"]: r["nominalQuota"] for r in queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"]}
        assert quota["google.com/tpu"] == "16"  # one slice: that member's on-demand rung
        assert manifests(plan, "AdmissionCheck")[name]["spec"]["parameters"]["name"] == name
        assert manifests(plan, "MultiKueueConfig")[name]["spec"]["clusters"] == step["members"]
        assert manifests(plan, "LocalQueue")[name]["spec"]["clusterQueue"] == name
    # The last step is today's fleet queue, by its names.
    assert manifests(plan, "MultiKueueConfig")["fleet"]["spec"]["clusters"] == [W1, W2]
    assert manifests(plan, "LocalQueue")[FLEET_LOCAL_QUEUE]["spec"]["clusterQueue"] == "fleet-cluster-queue"
    (job,) = manifests(plan, "RayJob").values()
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == f"fleet-on-demand-{W1}"


def test_member_order_and_rung_order_change_the_chain():
    answers = {STACKS[W1]: member_outputs(W1, ("onDemand",)), STACKS[W2]: member_outputs(W2, ("onDemand",))}
    raw = json.loads(config_with({}, FLEET)["tpu-fallback:fleet"])
    plan = fleet_plan({"fleet": {**raw, "memberOrder": [STACKS[W2], STACKS[W1]],
                                 "rungOrder": ["spot", "onDemand", "reservation"]}}, answers)
    assert [s["localQueue"] for s in plan.outputs["ladder"]] == [
        f"fleet-on-demand-{W2}", f"fleet-on-demand-{W1}", FLEET_LOCAL_QUEUE]


def test_one_member_may_offer_steps_and_another_none():
    plan = fleet_plan(answers={STACKS[W1]: member_outputs(W1), STACKS[W2]: StackOutputs.of_plan(plan_for(W2))})
    assert [s["localQueue"] for s in plan.outputs["ladder"]] == [f"fleet-on-demand-{W1}", FLEET_LOCAL_QUEUE]


def test_the_ladder_controller_runs_with_least_privilege_in_the_fleets_namespace():
    plan = cached_ladder_plan()
    deployment = manifests(plan, "Deployment")[fleet_objects.LADDER_NAME]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert "failover.ladder" in " ".join(container["command"])
    assert [s["localQueue"] for s in json.loads(env["FLEET_LADDER"])] == [
        s["localQueue"] for s in plan.outputs["ladder"]]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == fleet_objects.LADDER_NAME
    role = manifests(plan, "Role")[f"tpu-fallback-{fleet_objects.LADDER_NAME}"]
    assert role["metadata"]["namespace"] == FLEET_NAMESPACE  # not a ClusterRole: only the fleet's jobs
    assert role["rules"] == [dict(rule) for rule in fleet_objects.LADDER_RULES]
    assert not any(r["apiGroups"] == [""] and "secrets" in r["resources"] for r in role["rules"])
    assert {"ladder/__main__.py", "ladder/decisions.py"} <= set(failover_objects.package_files())


def test_a_fleet_of_dws_only_members_has_no_steps_but_a_ladder_controller_for_a_lost_slices_requeue():
    plan = OfflineEngine(FLEET, False, {STACKS[m]: StackOutputs.of_plan(plan_for(m)) for m in MEMBERS}).run(
        config_with({}, FLEET))
    assert "ladder" not in plan.outputs  # no step before the last: the queues are as without a ladder
    assert plan.outputs["localQueue"]["name"] == FLEET_LOCAL_QUEUE
    (container,) = manifests(plan, "Deployment")[fleet_objects.LADDER_NAME]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert [s["localQueue"] for s in json.loads(env["FLEET_LADDER"])] == [FLEET_LOCAL_QUEUE]
    # It reads every member (a loss is recorded where the job runs) through MultiKueue's kubeconfig Secrets.
    assert json.loads(env["FLEET_MEMBERS"]) == {m: fleet_objects.kubeconfig_secret_name(m) for m in MEMBERS}
    bindings = [m for m in plan.kubernetes_manifests() if m["kind"] == "RoleBinding"
                and m["roleRef"]["name"] == "tpu-fallback-fleet-stockout-reader"]
    assert len(bindings) == len(MEMBERS)


def _changed_steps(member: str, change) -> StackOutputs:
    outputs = copy.deepcopy(member_outputs(member).outputs)
    change(outputs[FLEET_MEMBER_OUTPUT]["steps"])
    return StackOutputs(outputs, member_outputs(member).secret_output_names)


@pytest.mark.parametrize("overrides, answers, message", [
    ({"memberOrder": [STACKS[W1]]}, None, "tpu-fallback:fleet.memberOrder: must list every stack"),
    ({"memberOrder": [STACKS[W1], "my-org/tpu-fallback/other"]}, None, "tpu-fallback:fleet.memberOrder"),
    ({"rungOrder": ["onDemand", "spot"]}, None, "tpu-fallback:fleet.rungOrder"),
    ({"rungOrder": ["onDemand", "spot", "flexStart"]}, None, "tpu-fallback:fleet.rungOrder"),
    ({"stepWait": "1s"}, None, "tpu-fallback:fleet.stepWait: '1s'"),
    ({}, {W2: lambda steps: steps[0].update(rung="flexStart")}, "fleet.members[1]: my-org/tpu-fallback/member-asia"
                                                               "-northeast1-b offers the fleet its 'flexStart' rung"),
    ({}, {W2: lambda steps: steps[0].update(localQueue="fleet-on-demand-" + "y" * 60)}, "longer than 63"),
    ({}, {W2: lambda steps: steps[0].update(localQueue=f"fleet-on-demand-{W1}")}, "is not named for it"),
], ids=["member-order-short", "member-order-other", "rung-order-short", "rung-order-dws", "step-wait",
        "unknown-rung",
        "name-too-long", "name-of-another"])
def test_fleet_ladder_rules(overrides, answers, message):
    raw = json.loads(config_with({}, FLEET)["tpu-fallback:fleet"])
    references = {STACKS[m]: member_outputs(m) for m in MEMBERS}
    for member, change in (answers or {}).items():
        references[STACKS[member]] = _changed_steps(member, change)
    with pytest.raises(SettingsError) as failure:
        fleet_plan({"fleet": {**raw, **overrides}}, references)
    assert message in str(failure.value)


# ---- the ladder controller's decisions -----------------------------------------------------------------------

LADDER = api.Ladder.from_json(json.dumps([
    {"localQueue": "fleet-on-demand-w1", "clusterQueue": "fleet-on-demand-w1", "admissionCheck": "fleet-on-demand-w1",
     "members": ["w1"], "rung": "onDemand"},
    {"localQueue": "fleet-on-demand-w2", "clusterQueue": "fleet-on-demand-w2", "admissionCheck": "fleet-on-demand-w2",
     "members": ["w2"], "rung": "onDemand"},
    {"localQueue": "fleet-queue", "clusterQueue": "fleet-cluster-queue", "admissionCheck": "fleet-multikueue",
     "members": ["w1", "w2"], "rung": ""}]))
NOW = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.timezone.utc)


def workload(queue: str, checks: list[dict], active: bool = True, evicted: str = "",
             reserved: bool = True, nominated: tuple[str, ...] = ()) -> ladder_rules.LadderView:
    conditions = [{"type": "QuotaReserved", "status": "True" if reserved else "False"}]
    if evicted:
        conditions.append({"type": "Evicted", "status": "True", "reason": "AdmissionCheck", "message": evicted})
    return ladder_rules.LadderView.from_object({
        "metadata": {"name": "wl", "namespace": FLEET_NAMESPACE, "ownerReferences": [{"kind": "RayJob", "name": "j"}],
                     "creationTimestamp": "2026-12-01T11:59:50Z"},
        "spec": {"queueName": queue, "active": active},
        "status": {"conditions": conditions, "admissionChecks": checks, "nominatedClusterNames": list(nominated)}})


def test_a_job_admitted_on_its_step_stays():
    view = workload("fleet-on-demand-w1", [{"name": "fleet-on-demand-w1", "state": "Ready"}])
    assert ladder_rules.decide(LADDER, view, None, NOW) is None


@pytest.mark.parametrize("check", [
    {"name": "fleet-on-demand-w1", "state": "Retry", "message": 'Workload evicted on worker cluster: "w1", resetting'},
    {"name": "fleet-on-demand-w1", "state": "Pending", "retryCount": 1},  # after the eviction
    {"name": "fleet-on-demand-w1", "state": "Ready", "retryCount": 1},  # re-dispatched to the same member already
], ids=["retry", "evicted", "re-admitted"])
def test_a_members_eviction_moves_the_job_to_the_next_step(check):
    action = ladder_rules.decide(LADDER, workload("fleet-on-demand-w1", [check]), None, NOW)
    assert action.move == Move("fleet-on-demand-w1", "fleet-on-demand-w2", "fleet-on-demand-w2",
                               api.MEMBER_EVICTED, "2026-12-01T12:00:00Z", member="w1")


def test_the_evicting_member_is_read_from_kueues_messages():
    view = workload("fleet-queue", [{"name": "fleet-multikueue", "state": "Pending", "retryCount": 1}],
                    evicted='Evicted due to AdmissionCheck in Retry state: "fleet-multikueue" (Workload evicted on '
                            'worker cluster: "w2", resetting for re-admission)')
    assert ladder_rules.evicting_member(LADDER.steps[2], view) == "w2"
    assert ladder_rules.evicting_member(LADDER.steps[0], workload("fleet-on-demand-w1", [])) == "w1"


def test_nothing_moves_past_the_last_step_an_unknown_queue_or_a_deactivated_job():
    evicted = [{"name": "fleet-multikueue", "state": "Pending", "retryCount": 3}]
    assert ladder_rules.decide(LADDER, workload("fleet-queue", evicted), None, NOW) is None
    assert ladder_rules.decide(LADDER, workload("other", [{"name": "other", "state": "Retry"}]), None, NOW) is None
    inactive = workload("fleet-on-demand-w1", [{"name": "fleet-on-demand-w1", "state": "Retry"}], active=False)
    assert ladder_rules.decide(LADDER, inactive, None, NOW) is None


def test_another_steps_check_does_not_count():
    """The old step's check, still listed for an instant after the move, says nothing about the new step."""
    view = workload("fleet-on-demand-w2", [{"name": "fleet-on-demand-w1", "state": "Pending", "retryCount": 1}])
    assert ladder_rules.decide(LADDER, view, None, NOW) is None


def test_a_move_in_progress_is_finished_first_and_a_finished_one_is_not_repeated():
    moving = Move("fleet-on-demand-w1", "fleet-on-demand-w2", "fleet-on-demand-w2", "MemberEvicted",
                  "2026-12-01T11:59:00Z", MOVING)
    view = workload("fleet-on-demand-w1", [{"name": "fleet-on-demand-w1", "state": "Pending"}], active=False)
    assert ladder_rules.decide(LADDER, view, moving.to_json(), NOW).move == moving
    done = Move(**{**moving.__dict__, "state": MOVED})
    fresh = workload("fleet-on-demand-w2", [{"name": "fleet-on-demand-w2", "state": "Pending"}])
    assert ladder_rules.decide(LADDER, fresh, done.to_json(), NOW) is None


def test_a_move_written_on_the_workload_with_its_deactivation_is_finished_whatever_the_rayjob_says():
    """A controller killed right after the first write (the move and the deactivation, one write on the Workload):
    the next one finishes that move, and the Workload's move wins over an older one on the RayJob."""
    moving = Move("fleet-on-demand-w1", "fleet-on-demand-w2", "fleet-on-demand-w2", "MemberEvicted",
                  "2026-12-01T11:59:00Z", MOVING)
    older = Move("fleet-on-demand-w0", "fleet-on-demand-w1", "fleet-on-demand-w1", "StepBusy", "2026-12-01T11:00:00Z",
                 MOVED)
    raw = {"metadata": {"name": "wl", "namespace": FLEET_NAMESPACE,
                        "ownerReferences": [{"kind": "RayJob", "name": "j"}],
                        "annotations": ladder_rules.deactivation(moving)["metadata"]["annotations"]},
           "spec": {"queueName": "fleet-on-demand-w1", "active": False},
           "status": {"admissionChecks": [{"name": "fleet-on-demand-w1", "state": "Pending", "retryCount": 1}]}}
    view = ladder_rules.LadderView.from_object(raw)
    for on_the_rayjob in (None, older.to_json()):
        assert ladder_rules.decide(LADDER, view, on_the_rayjob, NOW) == api.FinishMove(moving)
    assert ladder_rules.deactivation(moving) == {
        "metadata": {"annotations": {ladder_rules.WORKLOAD_MOVE_ANNOTATION: moving.to_json()}},
        "spec": {"active": False}}


class _World:
    """The manager's Workload and RayJob as Kueue keeps them, with what route D needs of Kueue: a deactivated
    Workload releases its quota (its RayJob's status is inactive), a new `spec.queueName` gets the step's check in
    place of the old one. `asked_again` records each moment the Workload was active at the step a decided move
    leaves: MultiKueue would dispatch it there again (the member's eviction loop)."""

    def __init__(self):
        check = {"name": "fleet-on-demand-w1", "state": "Retry", "retryCount": 1,
                 "message": 'Workload evicted on worker cluster: "w1", resetting for re-admission'}
        self.workload = {
            "metadata": {"name": "wl", "namespace": FLEET_NAMESPACE, "resourceVersion": "1",
                         "ownerReferences": [{"kind": "RayJob", "name": "j"}],
                         "creationTimestamp": "2026-12-01T11:59:50Z"},
            "spec": {"queueName": "fleet-on-demand-w1", "active": True},
            "status": {"conditions": [{"type": "QuotaReserved", "status": "True"}], "admissionChecks": [check]}}
        self.rayjob = {"metadata": {"name": "j", "namespace": FLEET_NAMESPACE, "resourceVersion": "1", "uid": "u",
                                    "labels": {api.QUEUE_LABEL: "fleet-on-demand-w1"}},
                       "spec": {"suspend": True}, "status": {"jobDeploymentStatus": "Suspended"}}
        self.writes = 0
        self.events = Events()
        self.asked_again: list[int] = []
        self.moves: set[str] = set()  # the moves written (their JSON, state aside): one per hop

    def decided(self) -> bool:
        """A move or a give-up was written (on either object)."""
        return any(name in (o["metadata"].get("annotations") or {}) for o in (self.workload, self.rayjob)
                   for name in (ladder_rules.WORKLOAD_MOVE_ANNOTATION, api.FAILOVER_ANNOTATION,
                                ladder_rules.WORKLOAD_GIVE_UP_ANNOTATION, api.GAVE_UP_ANNOTATION))

    def patch(self, obj: dict, patch: dict) -> dict:
        if patch["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"]:
            raise AssertionError("a write on a stale read")  # the API server's 409; never expected here
        before = obj["spec"].get("queueName")
        for name in (ladder_rules.WORKLOAD_MOVE_ANNOTATION, api.FAILOVER_ANNOTATION):
            written = Move.from_json((patch["metadata"].get("annotations") or {}).get(name))
            if written is not None:
                self.moves.add(written.done().to_json())
        merge_patch(obj, patch)
        obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
        if obj is self.workload:
            conditions = obj["status"]["conditions"]
            if obj["spec"]["active"] is False:
                conditions[0]["status"] = "False"
            if obj["spec"]["queueName"] != before:
                obj["status"]["admissionChecks"] = [{"name": obj["spec"]["queueName"], "state": "Pending"}]
            if obj["spec"]["active"] and obj["spec"]["queueName"] == "fleet-on-demand-w1" and self.decided():
                self.asked_again.append(self.writes)
        self.writes += 1
        return copy.deepcopy(obj)


def _controller(world: _World, kill_after: int | None,
                max_wait: datetime.timedelta | None = None) -> ladder_controller.LadderController:
    """The real controller's reconcile and route D over `world`, killed after its `kill_after`-th write."""
    from prometheus_client import CollectorRegistry

    from failover.ladder.watches import LadderSeen
    from failover.runtime.cache import Cache
    from failover.runtime.controller import Reconciler
    from failover.runtime.metrics import LadderMetrics

    controller = object.__new__(ladder_controller.LadderController)
    Reconciler.__init__(controller)  # its queue
    controller.ladder, controller.namespace = LADDER, FLEET_NAMESPACE
    controller.step_wait, controller.max_wait = None, max_wait
    controller.clock, controller.members, controller.moves_started = (lambda: NOW), None, 0
    controller.metrics = LadderMetrics(CollectorRegistry())
    cache = Cache(None)
    controller.seen = LadderSeen(cache, LADDER, FLEET_NAMESPACE, controller.clock, None, controller.enqueue)
    for watch in controller.watches():  # as the manager registers it
        cache.subscribe(watch.watched, lambda changes, listed, watch=watch: [
            controller.enqueue(watch.map(change)) for change in changes])
    controller.workloads, controller.rayjobs = "workloads", "rayjobs"
    controller.api = controller.core = KilledAfter(
        lambda resource: world.workload if resource == "workloads" else world.rayjob, world.patch, world.events,
        kill_after)
    cache.informers[controller.seen.watched_workloads].on_event("ADDED", copy.deepcopy(world.workload))
    cache.informers[controller.seen.watched_rayjobs].on_event("ADDED", copy.deepcopy(world.rayjob))
    return controller


def test_route_d_killed_after_any_write_finishes_one_move_and_never_leaves_the_job_active_at_the_old_step():
    """Issue 27: with the move written on the RayJob first and the deactivation after it, a kill -9 between the two
    left the Workload active at the step being left, where MultiKueue dispatched it again while the controller
    restarted. Now the first write is the deactivation itself: killed after any write, the next controller finishes
    the same move, one move and one Event for the hop, and the job is never active at the old step once the move
    is decided."""
    key = (FLEET_NAMESPACE, "wl")
    complete = _World()
    assert _controller(complete, None).reconcile(key) == 1
    writes = complete.writes + len(complete.events)  # the Event is a write too
    assert writes >= 5 and not complete.asked_again and complete.events == [ladder_rules.EVENT_REASON]
    assert len(complete.moves) == 1
    for kill_after in range(1, writes + 1):
        world = _World()
        with pytest.raises(Killed):
            _controller(world, kill_after).reconcile(key)
        # While no controller runs, MultiKueue acts on what the Workload says.
        spec = world.workload["spec"]
        assert not (world.decided() and spec["active"] and spec["queueName"] == "fleet-on-demand-w1"), (
            f"killed after write {kill_after}: the move decided, the job still active at the step it leaves")
        restarted = _controller(world, None)
        restarted.reconcile(key)
        assert restarted.moves_started == 0 and len(world.moves) == 1, kill_after  # it finished the one move
        assert world.asked_again == [], (f"active at the old step after write {world.asked_again} (killed after "
                                         f"{kill_after})")
        assert world.workload["spec"] == {"queueName": "fleet-on-demand-w2", "active": True}, kill_after
        assert ladder_rules.WORKLOAD_MOVE_ANNOTATION not in world.workload["metadata"].get("annotations", {})
        annotations = world.rayjob["metadata"]["annotations"]
        assert Move.from_json(annotations[api.FAILOVER_ANNOTATION]).state == MOVED
        assert len(json.loads(annotations["tpu-fallback/moves"])) == 1, kill_after
        assert world.events == [ladder_rules.EVENT_REASON], kill_after
        assert world.rayjob["metadata"]["labels"][api.QUEUE_LABEL] == "fleet-on-demand-w2"


def test_a_give_up_killed_after_any_write_is_finished_once_and_the_job_never_active_again():
    """The same for giving up (the job waited past its maximum wait): the give-up rides on the Workload's
    deactivation; killed after any write, the next controller finishes it: one record, one Event, and the Workload
    inactive, with nothing of the give-up left on it."""
    key, limit = (FLEET_NAMESPACE, "wl"), datetime.timedelta(seconds=5)  # created 10 s before NOW
    complete = _World()
    assert _controller(complete, None, limit).reconcile(key) == 1
    assert complete.events == [ladder_rules.GAVE_UP_REASON]
    writes = complete.writes + len(complete.events)
    for kill_after in range(1, writes + 1):
        world = _World()
        with pytest.raises(Killed):
            _controller(world, kill_after, limit).reconcile(key)
        assert not (world.decided() and world.workload["spec"]["active"]), kill_after
        _controller(world, None, limit).reconcile(key)
        assert world.workload["spec"]["active"] is False, kill_after
        assert ladder_rules.WORKLOAD_GIVE_UP_ANNOTATION not in world.workload["metadata"].get("annotations", {})
        recorded = api.GiveUp.from_json(
            world.rayjob["metadata"]["annotations"][api.GAVE_UP_ANNOTATION])
        assert recorded.state == api.GAVE_UP, kill_after
        assert world.events == [ladder_rules.GAVE_UP_REASON], kill_after


def _route_d(world: _World, move: Move, to_check: str, running: bool, quota_polls: int = 2) -> list[str]:
    """Route D driven by the pure `next_in_move` alone, each step applied to `world` as the controller writes it and
    Kueue answers: the quota released `quota_polls` looks after the RayJob is inactive; the steps in order."""
    if running:  # the manager's copy of the RayJob's status says it runs in a member
        world.rayjob["status"]["jobDeploymentStatus"] = "Running"
    world.patch(world.workload, {**ladder_rules.deactivation(move), "metadata": {
        **ladder_rules.deactivation(move)["metadata"], "resourceVersion": world.workload["metadata"]["resourceVersion"]}})
    world.workload["status"]["conditions"][0]["status"] = "True"  # Kueue has not released it yet
    steps, polls = [], 0
    while (step := ladder_rules.next_in_move(move, ladder_rules.LadderView.from_object(world.workload), world.rayjob,
                                              to_check)) != ladder_rules.DONE:
        steps.append(step)
        assert len(steps) < 20, steps
        guard = {"resourceVersion": None}
        if step == ladder_rules.RECORD:
            guard["resourceVersion"] = world.rayjob["metadata"]["resourceVersion"]
            world.patch(world.rayjob, {"metadata": {**guard, "annotations": {
                api.FAILOVER_ANNOTATION: move.to_json()}}})
        elif step == ladder_rules.MARK_SUSPENDED:
            world.rayjob["status"]["jobDeploymentStatus"] = "Suspended"
        elif step == ladder_rules.WAIT_FOR_QUOTA:
            polls += 1
            if polls >= quota_polls:
                world.workload["status"]["conditions"][0]["status"] = "False"
        elif step == ladder_rules.RELABEL:
            guard["resourceVersion"] = world.rayjob["metadata"]["resourceVersion"]
            world.patch(world.rayjob, {"metadata": {**guard, "labels": {api.QUEUE_LABEL: move.to_local_queue}}})
        elif step == ladder_rules.REPOINT:
            guard["resourceVersion"] = world.workload["metadata"]["resourceVersion"]
            world.patch(world.workload, {"metadata": guard, "spec": {"queueName": move.to_local_queue}})
            world.workload["status"]["admissionChecks"] = [{"name": move.from_flavor, "state": "Retry"}]  # not yet
        elif step == ladder_rules.WAIT_FOR_CHECKS:  # Kueue puts the new step's check in place of the old one
            world.workload["status"]["admissionChecks"] = [{"name": to_check, "state": "Pending"}]
        elif step == api.WAIT_FOR_BACKOFF_RESET:  # Kueue clears an inactive Workload's requeue backoff
            world.workload["status"].pop("requeueState")
        elif step == api.REACTIVATE:
            guard["resourceVersion"] = world.workload["metadata"]["resourceVersion"]
            world.patch(world.workload, {"metadata": {**guard, "annotations": {
                ladder_rules.WORKLOAD_MOVE_ANNOTATION: None}}, "spec": {"active": True}})
        else:
            raise AssertionError(f"unexpected step {step}")
    return steps


@pytest.mark.parametrize("running, backoff", [(False, False), (True, False), (False, True)])
def test_route_d_takes_its_steps_in_the_measured_order_from_what_it_reads(running, backoff):
    """§8.8's order, decided by `next_in_move` from the objects alone: the move on the RayJob, the RayJob marked
    Suspended only when its copied status still says it runs, the quota awaited, relabel before repoint, the new
    step's check awaited, a requeue backoff cleared (Kueue does it while the Workload is inactive; reactivated first,
    the job would wait it out), then reactivation; and nothing left once both objects say it arrived."""
    move = Move("fleet-on-demand-w1", "fleet-on-demand-w2", "fleet-on-demand-w2", api.MEMBER_EVICTED,
                "2026-12-01T12:00:00Z")
    world = _World()
    world.workload["status"]["admissionChecks"] = []  # Kueue drops the old step's check with the new queue
    if backoff:
        world.workload["status"]["requeueState"] = {"count": 1, "requeueAt": "2026-12-01T12:01:00Z"}
    steps = _route_d(world, move, "fleet-on-demand-w2", running)
    suspended = [ladder_rules.MARK_SUSPENDED] if running else []
    cleared = [api.WAIT_FOR_BACKOFF_RESET] if backoff else []
    assert steps == [ladder_rules.RECORD, *suspended, ladder_rules.WAIT_FOR_QUOTA, ladder_rules.WAIT_FOR_QUOTA,
                     ladder_rules.RELABEL, ladder_rules.REPOINT, ladder_rules.WAIT_FOR_CHECKS, *cleared,
                     api.REACTIVATE], steps
    assert world.workload["spec"] == {"queueName": "fleet-on-demand-w2", "active": True}
    assert not world.asked_again


def test_a_move_read_back_from_any_point_resumes_at_the_step_left_to_do():
    """The pure step of a half-done move: whatever the last pass wrote, the next one does what is left (route D
    resumable from any point), and a move an older controller wrote on the RayJob only is deactivated first."""
    move = Move("fleet-on-demand-w1", "fleet-on-demand-w2", "fleet-on-demand-w2", api.STEP_BUSY,
                "2026-12-01T12:00:00Z")
    job = {"metadata": {"labels": {api.QUEUE_LABEL: "fleet-on-demand-w1"},
                        "annotations": {api.FAILOVER_ANNOTATION: move.to_json()}},
           "spec": {"suspend": True}, "status": {"jobDeploymentStatus": "Suspended"}}
    active_old = workload("fleet-on-demand-w1", [{"name": "fleet-on-demand-w1", "state": "Ready"}])
    assert ladder_rules.next_in_move(move, active_old, job, "fleet-on-demand-w2") == ladder_rules.DEACTIVATE
    released = workload("fleet-on-demand-w1", [], active=False, reserved=False)
    assert ladder_rules.next_in_move(move, released, job, "fleet-on-demand-w2") == ladder_rules.RELABEL
    relabelled = {**job, "metadata": {**job["metadata"], "labels": {api.QUEUE_LABEL: "fleet-on-demand-w2"}}}
    assert ladder_rules.next_in_move(move, released, relabelled, "fleet-on-demand-w2") == ladder_rules.REPOINT
    arrived = workload("fleet-on-demand-w2", [{"name": "fleet-on-demand-w2", "state": "Pending"}], active=True)
    assert ladder_rules.next_in_move(move, arrived, relabelled, "fleet-on-demand-w2") == ladder_rules.DONE
    older = dataclasses.replace(move, at="2026-12-01T11:00:00Z")  # another hop's record on the RayJob
    assert ladder_rules.next_in_move(older, released, job, "fleet-on-demand-w2") == ladder_rules.RECORD


def test_a_give_up_takes_its_steps_from_what_it_reads():
    give_up = api.GiveUp("2026-12-01T12:00:00Z", "5s", "10s", "fleet-on-demand-w1", "fleet")
    job = {"metadata": {"annotations": {}}, "spec": {"suspend": True}, "status": {"jobDeploymentStatus": "Running"}}
    held = workload("fleet-on-demand-w1", [], active=False, reserved=True)
    assert ladder_rules.next_in_give_up(give_up, workload("fleet-on-demand-w1", []), job) == ladder_rules.DEACTIVATE
    assert ladder_rules.next_in_give_up(give_up, held, job) == ladder_rules.MARK_SUSPENDED
    job["status"]["jobDeploymentStatus"] = "Suspended"
    assert ladder_rules.next_in_give_up(give_up, held, job) == ladder_rules.WAIT_FOR_QUOTA
    free = workload("fleet-on-demand-w1", [], active=False, reserved=False)
    assert ladder_rules.next_in_give_up(give_up, free, job) == ladder_rules.RECORD
    job["metadata"]["annotations"][api.GAVE_UP_ANNOTATION] = give_up.to_json()
    assert ladder_rules.next_in_give_up(give_up, free, job) == ladder_rules.ANNOUNCE
    job["metadata"]["annotations"][api.GAVE_UP_ANNOTATION] = give_up.done().to_json()
    assert ladder_rules.next_in_give_up(give_up, free, job) == ladder_rules.DONE
    marked = dataclasses.replace(free, give_up=give_up.to_json())
    assert ladder_rules.next_in_give_up(give_up, marked, job) == ladder_rules.UNMARK


WAIT = datetime.timedelta(seconds=30)


def test_a_step_that_does_not_admit_within_the_step_wait_is_left():
    since = {"lastTransitionTime": "2026-12-01T11:59:20Z"}
    pending = workload("fleet-on-demand-w1", [{"name": "fleet-on-demand-w1", "state": "Pending", **since}],
                       nominated=("w1",))
    action = ladder_rules.decide(LADDER, pending, None, NOW, WAIT)
    assert (action.move.to_flavor, action.move.reason) == ("fleet-on-demand-w2", api.STEP_BUSY)
    assert ladder_rules.decide(LADDER, pending, None, NOW, None) is None  # no wait set: it waits there
    younger = workload("fleet-on-demand-w1", [{"name": "fleet-on-demand-w1", "state": "Pending",
                                               "lastTransitionTime": "2026-12-01T11:59:45Z"}], nominated=("w1",))
    assert ladder_rules.decide(LADDER, younger, None, NOW, WAIT) is None
    assert ladder_rules.next_look(LADDER, younger, WAIT, NOW) == pytest.approx(16.05)  # from the stamp's second end
    # Waiting for the manager's own quota (another fleet job holds the step): since the Workload's creation.
    unlisted = workload("fleet-on-demand-w1", [], reserved=False)
    assert ladder_rules.decide(LADDER, unlisted, None, NOW, WAIT) is None
    assert ladder_rules.decide(LADDER, unlisted, None, NOW + WAIT, WAIT).move.reason == api.STEP_BUSY
    admitted = workload("fleet-on-demand-w1", [{"name": "fleet-on-demand-w1", "state": "Ready", **since}])
    assert ladder_rules.decide(LADDER, admitted, None, NOW, WAIT) is None
    assert ladder_rules.next_look(LADDER, admitted, WAIT, NOW) is None
    last = workload("fleet-queue", [{"name": "fleet-multikueue", "state": "Pending", **since}])
    assert ladder_rules.decide(LADDER, last, None, NOW, WAIT) is None  # DWS everywhere waits as long as it takes


def test_a_step_is_never_left_before_its_wait_whatever_the_stamps_whole_seconds_hide():
    """Issue 27: the API stamps whole seconds, so a job stamped 11:59:55Z may have come at 11:59:55.9; with a 5 s step
    wait it must not be moved at 12:00:00.5 (4.6 s after it came), only from 12:00:01 on."""
    wait = datetime.timedelta(seconds=5)
    came = workload("fleet-on-demand-w1", [{"name": "fleet-on-demand-w1", "state": "Pending",
                                            "lastTransitionTime": "2026-12-01T11:59:55Z"}], nominated=("w1",))
    assert ladder_rules.decide(LADDER, came, None, NOW + datetime.timedelta(milliseconds=500), wait) is None
    assert ladder_rules.decide(LADDER, came, None, NOW + datetime.timedelta(seconds=1),
                                    wait).move.reason == api.STEP_BUSY
    # Without a check entry yet (the manager's quota for the step is in use): counted from the Workload's creation.
    queued = workload("fleet-on-demand-w1", [], reserved=False)  # created 11:59:50Z
    assert ladder_rules.decide(LADDER, queued, None, NOW + datetime.timedelta(seconds=0.9),
                                    datetime.timedelta(seconds=11)) is None


def test_a_steps_wait_begins_once_multikueue_has_sent_the_job_to_its_member():
    """MultiKueue's pass over a Workload may be held by a member that stopped answering (the step the job left): the
    next step has then not been asked yet, so it is not busy; its wait begins when the job is sent there."""
    since = {"lastTransitionTime": "2026-12-01T11:59:20Z"}  # came to the step 40 s before NOW
    held = workload("fleet-on-demand-w1", [{"name": "fleet-on-demand-w1", "state": "Pending", **since}])
    assert ladder_rules.decide(LADDER, held, None, NOW, WAIT) is None
    came = NOW - datetime.timedelta(seconds=40)
    assert ladder_rules.next_look(LADDER, held, WAIT, NOW) == pytest.approx(
        (came + ladder_rules.STAMP_RESOLUTION + ladder_rules.DISPATCH_BOUND + WAIT - NOW).total_seconds()
        + 0.05)
    # A member of another step named (the one the job left, in a stale record) is not this step's dispatch.
    elsewhere = workload("fleet-on-demand-w1", [{"name": "fleet-on-demand-w1", "state": "Pending", **since}],
                         nominated=("w2",))
    assert ladder_rules.decide(LADDER, elsewhere, None, NOW, WAIT) is None
    # Sent there 10 s ago, as the controller saw it: 20 s of its wait are left, whatever the step's own time says.
    sent = workload("fleet-on-demand-w1", [{"name": "fleet-on-demand-w1", "state": "Pending", **since}],
                    nominated=("w1",))
    seen = NOW - datetime.timedelta(seconds=10)
    assert ladder_rules.decide(LADDER, sent, None, NOW, WAIT, dispatched_seen=seen) is None
    assert ladder_rules.next_look(LADDER, sent, WAIT, NOW, dispatched_seen=seen) == pytest.approx(20.05)
    assert ladder_rules.decide(LADDER, sent, None, NOW + datetime.timedelta(seconds=20), WAIT,
                                    dispatched_seen=seen).move.reason == api.STEP_BUSY
    # Never sent (Kueue never reaches the step's member): left as a busy step after the bound and the wait.
    late = NOW + ladder_rules.STAMP_RESOLUTION + ladder_rules.DISPATCH_BOUND + WAIT - datetime.timedelta(
        seconds=40)
    assert ladder_rules.decide(LADDER, held, None, late, WAIT).move.reason == api.STEP_BUSY


# ---- giving up (issue 18 item 3) -----------------------------------------------------------------------------


def test_max_wait_is_off_by_default_and_a_dws_only_fleet_with_it_gives_up_at_the_last_step():
    assert "FLEET_MAX_WAIT_SECONDS" not in {
        e["name"] for e in manifests(cached_ladder_plan(), "Deployment")[fleet_objects.LADDER_NAME]["spec"][
            "template"]["spec"]["containers"][0]["env"]}
    raw = json.loads(config_with({}, FLEET)["tpu-fallback:fleet"])
    plan = OfflineEngine(FLEET, False, {STACKS[m]: StackOutputs.of_plan(plan_for(m)) for m in MEMBERS}).run(
        config_with({"fleet": {**raw, "maxWait": "6h"}}, FLEET))
    (container,) = manifests(plan, "Deployment")[fleet_objects.LADDER_NAME]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["FLEET_MAX_WAIT_SECONDS"] == str(6 * 3600)
    assert [s["localQueue"] for s in json.loads(env["FLEET_LADDER"])] == [FLEET_LOCAL_QUEUE]  # give-up only
    assert json.loads(env["FLEET_MEMBERS"]) == {m: fleet_objects.kubeconfig_secret_name(m) for m in MEMBERS}
    assert "ladder" not in plan.outputs  # and the queues are as without it


@pytest.mark.parametrize("value", ["30s", "721h", "soon", "0s"])
def test_max_wait_rule_names_the_key(value):
    raw = json.loads(config_with({}, FLEET)["tpu-fallback:fleet"])
    with pytest.raises(SettingsError) as failure:
        fleet_plan({"fleet": {**raw, "maxWait": value}})
    assert f"tpu-fallback:fleet.maxWait: {value!r}" in str(failure.value)


def _waiting(queue: str, check: dict | None, created: str = "2026-12-01T11:00:00Z", admitted: bool = False,
             pods_ready: dict | None = None, active: bool = True, cluster: str | None = None
             ) -> ladder_rules.LadderView:
    conditions = [{"type": "QuotaReserved", "status": "True"}]
    if admitted:
        conditions.append({"type": "Admitted", "status": "True"})
    if pods_ready:
        conditions.append({"type": "PodsReady", **pods_ready})
    return ladder_rules.LadderView.from_object({
        "metadata": {"name": "wl", "namespace": FLEET_NAMESPACE, "ownerReferences": [{"kind": "RayJob", "name": "j"}],
                     "creationTimestamp": created},
        "spec": {"queueName": queue, "active": active},
        "status": {"conditions": conditions, "admissionChecks": [check] if check else [],
                   **({"clusterName": cluster} if cluster else {})}})


HOUR = datetime.timedelta(hours=1)
LATE = NOW + ladder_rules.STAMP_RESOLUTION  # an hour after the end of the stamps' second (11:00:00Z)
DWS_PENDING = {"name": "fleet-multikueue", "state": "Pending", "lastTransitionTime": "2026-12-01T11:10:00Z"}


def test_a_job_no_member_admitted_within_max_wait_is_given_up_at_any_step():
    view = _waiting("fleet-queue", DWS_PENDING)  # waiting at the last step (DWS everywhere) since 11:00
    action = ladder_rules.decide(LADDER, view, None, LATE, max_wait=HOUR)
    assert isinstance(action, ladder_rules.StartGiveUp)
    assert (action.give_up.max_wait, action.give_up.waited, action.give_up.step, action.give_up.source) == (
        "1h", "1h", "fleet-queue", "fleet.maxWait")
    assert ladder_rules.decide(LADDER, view, None, NOW, max_wait=HOUR) is None
    assert ladder_rules.next_look(LADDER, view, None, LATE - datetime.timedelta(seconds=10),
                                       max_wait=HOUR) == pytest.approx(10.05)
    # Before the last step too, ahead of a move: the limit is the job's, not the step's.
    busy = _waiting("fleet-on-demand-w1", {"name": "fleet-on-demand-w1", "state": "Pending",
                                           "lastTransitionTime": "2026-12-01T11:00:00Z"})
    assert isinstance(ladder_rules.decide(LADDER, busy, None, LATE, WAIT, max_wait=HOUR),
                      ladder_rules.StartGiveUp)
    assert ladder_rules.decide(LADDER, view, None, NOW) is None  # no maximum wait: it waits as long as it takes


def test_the_jobs_own_annotation_overrides_the_fleets_max_wait():
    view = _waiting("fleet-queue", DWS_PENDING, created="2026-12-01T11:59:00Z")
    action = ladder_rules.decide(LADDER, view, None, NOW, max_wait=HOUR, job_max_wait="44s")
    assert action.give_up.source == api.MAX_WAIT_ANNOTATION and action.give_up.max_wait == "44s"
    assert ladder_rules.decide(LADDER, view, None, NOW, job_max_wait="2m") is None
    old = _waiting("fleet-queue", DWS_PENDING)
    assert ladder_rules.decide(LADDER, old, None, NOW, max_wait=HOUR, job_max_wait="none") is None
    # An unreadable annotation: the fleet's limit holds.
    assert isinstance(ladder_rules.decide(LADDER, old, None, LATE, max_wait=HOUR, job_max_wait="soon"),
                      ladder_rules.StartGiveUp)
    assert [ladder_rules.parse_duration(t) for t in ("90s", "1h30m", "2d", "0s", "", "5 min")] == [
        datetime.timedelta(seconds=90), datetime.timedelta(minutes=90), datetime.timedelta(days=2), None, None, None]


def test_an_admitted_or_running_job_is_never_given_up_and_the_wait_restarts_when_a_run_ends():
    ready = {"name": "fleet-on-demand-w1", "state": "Ready", "lastTransitionTime": "2026-12-01T11:00:05Z"}
    admitted = _waiting("fleet-on-demand-w1", ready, admitted=True)
    assert ladder_rules.decide(LADDER, admitted, None, NOW, max_wait=HOUR) is None
    # It ran until 11:30 (PodsReady turned False then: preempted), and waits again at DWS: 30 minutes, not 1 hour.
    ran = _waiting("fleet-queue", DWS_PENDING,
                   pods_ready={"status": "False", "reason": "WaitForStart",
                               "lastTransitionTime": "2026-12-01T11:30:00Z"})
    assert ladder_rules.decide(LADDER, ran, None, NOW, max_wait=HOUR) is None
    assert isinstance(ladder_rules.decide(LADDER, ran, None, LATE + HOUR / 2, max_wait=HOUR),
                      ladder_rules.StartGiveUp)
    # A deactivated job (given up, or by someone) is left alone.
    assert ladder_rules.decide(LADDER, _waiting("fleet-queue", DWS_PENDING, active=False), None, NOW,
                                    max_wait=HOUR) is None


def test_a_give_up_in_progress_is_finished_first_and_a_finished_one_is_not_repeated():
    give_up = api.GiveUp("2026-12-01T12:00:00Z", "1h", "1h", "fleet-queue", "fleet.maxWait")
    inactive = _waiting("fleet-queue", DWS_PENDING, active=False)
    assert ladder_rules.decide(LADDER, inactive, None, NOW, gave_up=give_up.to_json()) == \
        ladder_rules.FinishGiveUp(give_up)
    # Reactivated by its user after it was given up: it walks on, and is not given up again.
    again = _waiting("fleet-queue", DWS_PENDING)
    assert ladder_rules.decide(LADDER, again, None, NOW, max_wait=HOUR,
                                    gave_up=give_up.done().to_json()) is None
    assert "no member admitted it within its maximum wait of 1h (fleet.maxWait)" in give_up.message()
    # A move in progress comes first: the job is not given up half moved.
    moving = Move("fleet-on-demand-w1", "fleet-on-demand-w2", "fleet-on-demand-w2", "MemberEvicted",
                  "2026-12-01T11:59:00Z", MOVING)
    assert isinstance(ladder_rules.decide(LADDER, inactive, moving.to_json(), NOW, max_wait=HOUR),
                      api.FinishMove)


# ---- the early path (a member's stockout report) -------------------------------------------------------------

GRACE_LADDER = api.Ladder.from_json(json.dumps([
    {"localQueue": "fleet-on-demand-w1", "clusterQueue": "fleet-on-demand-w1", "admissionCheck": "fleet-on-demand-w1",
     "members": ["w1"], "rung": "onDemand",
     "stockoutGracePeriodSeconds": 4},
    {"localQueue": "fleet-queue", "clusterQueue": "fleet-cluster-queue", "admissionCheck": "fleet-multikueue",
     "members": ["w1", "w2"], "rung": ""}]))
READY_W1 = {"name": "fleet-on-demand-w1", "state": "Ready", "lastTransitionTime": "2026-12-01T11:59:50Z"}


def _event(pod: str, first: str, message: str = "Node scale up in zones us-east5-a associated with this pod failed: "
           "GCE out of resources. Pod is at risk of not being scheduled.", reason: str = "FailedScaleUp") -> dict:
    return {"involvedObject": {"kind": "Pod", "name": pod}, "reason": reason, "message": message,
            "firstTimestamp": first, "lastTimestamp": first}


def test_a_members_stockout_report_moves_the_job_once_its_grace_period_has_passed():
    view = _waiting("fleet-on-demand-w1", READY_W1, admitted=True)
    seen = datetime.datetime(2026, 12, 1, 11, 59, 57, tzinfo=datetime.timezone.utc)
    assert ladder_rules.decide(GRACE_LADDER, view, None, NOW, stockout=seen) is None  # 3 s of 4
    assert ladder_rules.next_look(GRACE_LADDER, view, None, NOW, stockout=seen) == pytest.approx(1.05)
    action = ladder_rules.decide(GRACE_LADDER, view, None, NOW + datetime.timedelta(seconds=1), stockout=seen)
    assert (action.move.to_flavor, action.move.reason) == ("fleet-queue", api.MEMBER_STOCKOUT)
    assert "reported no capacity for its pods" in ladder_rules.move_message(action.move, "w1")
    # Not admitted there (yet, or any more): the report is not this admission's.
    pending = _waiting("fleet-on-demand-w1", {**READY_W1, "state": "Pending"})
    assert ladder_rules.decide(GRACE_LADDER, pending, None, NOW + HOUR, stockout=seen) is None
    # A step without a published grace period (a member of an older version) has no early path.
    assert ladder_rules.decide(LADDER, view, None, NOW + HOUR, stockout=seen) is None
    # Capacity came back within the grace and the job runs: the report on its pods is over, as in a region.
    ready = _waiting("fleet-on-demand-w1", READY_W1, admitted=True, pods_ready={"status": "True"})
    assert ladder_rules.decide(GRACE_LADDER, ready, None, NOW + HOUR, stockout=seen) is None


NOT_READY_LADDER = api.Ladder.from_json(json.dumps([
    {"localQueue": "fleet-on-demand-w1", "clusterQueue": "fleet-on-demand-w1", "admissionCheck": "fleet-on-demand-w1",
     "members": ["w1"], "rung": "onDemand",
     "stockoutGracePeriodSeconds": 4, "podsReadyTimeoutSeconds": 30},
    {"localQueue": "fleet-queue", "clusterQueue": "fleet-cluster-queue", "admissionCheck": "fleet-multikueue",
     "members": ["w1", "w2"], "rung": ""}]))


def test_a_job_whose_pods_are_not_ready_moves_just_before_the_members_pods_ready_timeout():
    """The silent stockout: nothing says why, the pods just never become ready. The member would evict the job at its
    podsReadyTimeout and MultiKueue would send it straight back there (no backoff after a member's eviction); the
    ladder moves it PODS_READY_LEAD before, counted from the manager's check turning Ready (after the member's
    admission), and looks again exactly then."""
    not_started = {"status": "False", "reason": ladder_rules.WAIT_FOR_START,
                   "lastTransitionTime": "2026-12-01T11:59:50Z"}
    view = _waiting("fleet-on-demand-w1", READY_W1, admitted=True, pods_ready=not_started)  # admitted at 11:59:50
    assert ladder_rules.not_ready_deadline(NOT_READY_LADDER.steps[0], view) == datetime.datetime(
        2026, 12, 1, 12, 0, 15, tzinfo=datetime.timezone.utc)  # 30 s - 5 s after the stamp
    assert ladder_rules.decide(NOT_READY_LADDER, view, None, NOW) is None
    assert ladder_rules.next_look(NOT_READY_LADDER, view, None, NOW) == pytest.approx(15.05)
    action = ladder_rules.decide(NOT_READY_LADDER, view, None, NOW + datetime.timedelta(seconds=15))
    assert (action.move.to_flavor, action.move.reason) == ("fleet-queue", api.MEMBER_NOT_READY)
    assert "its pods were not ready in member w1" in ladder_rules.move_message(action.move, "w1")
    later = NOW + HOUR
    # Ready, or ready once in this admission and now waiting for recovery (the member's and the lost-slice rules'):
    # not this rule.
    ready = _waiting("fleet-on-demand-w1", READY_W1, admitted=True, pods_ready={"status": "True"})
    recovering = _waiting("fleet-on-demand-w1", READY_W1, admitted=True, pods_ready={
        **not_started, "reason": "WaitForRecovery"})
    assert ladder_rules.decide(NOT_READY_LADDER, ready, None, later) is None
    assert ladder_rules.decide(NOT_READY_LADDER, recovering, None, later) is None
    # Not admitted there (the check not Ready), or a member that did not publish its timeout (an older version).
    pending = _waiting("fleet-on-demand-w1", {**READY_W1, "state": "Pending"}, pods_ready=not_started)
    assert ladder_rules.not_ready_deadline(NOT_READY_LADDER.steps[0], pending) is None
    assert ladder_rules.not_ready_deadline(GRACE_LADDER.steps[0], view) is None
    # A member's own eviction first (it was faster, or preempted the job) is still the member's eviction.
    evicted = _waiting("fleet-on-demand-w1", {**READY_W1, "state": "Retry", "retryCount": 1}, admitted=True,
                       pods_ready=not_started)
    assert ladder_rules.decide(NOT_READY_LADDER, evicted, None, NOW).move.reason == api.MEMBER_EVICTED


def test_the_stockout_events_are_those_of_the_jobs_raycluster_since_this_admission():
    admitted = datetime.datetime(2026, 12, 1, 11, 59, 50, tzinfo=datetime.timezone.utc)
    events = [_event("job-abcde-tpu-group-worker-x1", "2026-12-01T11:59:55Z"),
              _event("job-abcde-tpu-group-worker-x2", "2026-12-01T11:59:52Z"),
              _event("other-zzzzz-tpu-group-worker-x1", "2026-12-01T11:59:51Z"),  # another job's pod
              _event("job-abcde-tpu-group-worker-x1", "2026-12-01T11:59:51Z", "GCE quota exceeded"),  # not capacity
              _event("job-abcde-tpu-group-worker-x3", "2026-12-01T11:58:00Z")]  # before this admission
    assert ladder_rules.stockout_in_member(events, "job-abcde", admitted) == datetime.datetime(
        2026, 12, 1, 11, 59, 52, tzinfo=datetime.timezone.utc)
    assert ladder_rules.stockout_in_member(events, None, admitted) is None  # no RayCluster yet
    assert ladder_rules.is_stockout_event(events[0]) and not ladder_rules.is_stockout_event(events[3])


def test_a_member_offering_steps_publishes_its_grace_and_lets_the_manager_read_its_events_and_patch_its_pods_only():
    plan = plan_for(W1, {**ON_DEMAND_RUNGS, "fallback": {"podsReadyTimeout": "10m", "stockoutGracePeriod": "2m"}})
    (step,) = plan.outputs[FLEET_MEMBER_OUTPUT]["steps"]
    assert (step["stockoutGracePeriodSeconds"], step["podsReadyTimeoutSeconds"]) == (120, 600)
    role = manifests(plan, "Role")["tpu-fallback-fleet-stockout-reader"]
    assert role["metadata"]["namespace"] == FLEET_NAMESPACE
    # The Events (a stockout, a lost slice), and the fleet's pods (a climb's checkpoint request), in its namespace.
    assert role["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list", "watch"]},
                             {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "patch"]}]
    assert "tpu-fallback-fleet-stockout-reader" in manifests(plan_for(W1), "Role")  # DWS only too: a lost slice
    fleet = cached_ladder_plan()
    bindings = [m for m in fleet.kubernetes_manifests() if m["kind"] == "RoleBinding"
                and m["roleRef"]["name"] == "tpu-fallback-fleet-stockout-reader"]
    assert len(bindings) == 2 and all(b["metadata"]["namespace"] == FLEET_NAMESPACE for b in bindings)
    (container,) = manifests(fleet, "Deployment")[fleet_objects.LADDER_NAME]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert json.loads(env["FLEET_MEMBERS"]) == {m: fleet_objects.kubeconfig_secret_name(m) for m in MEMBERS}
    assert [s.get("stockoutGracePeriodSeconds") for s in json.loads(env["FLEET_LADDER"])] == [30, 30, None]
    assert [s.get("podsReadyTimeoutSeconds") for s in json.loads(env["FLEET_LADDER"])] == [900, 900, None]
    secrets = manifests(fleet, "Role")[f"tpu-fallback-{fleet_objects.LADDER_NAME}-secrets"]
    assert secrets["rules"] == [fleet_objects.watch_secret_rule(MEMBERS)]  # those Secrets, to read, and no other


# ---- what `python -m ops status` says of a fleet's ladder job on the manager ---------------------------------


def test_status_says_a_job_was_given_up_and_why_the_ladder_moved_it():
    from ops.status import jobs as status_jobs

    give_up = api.GiveUp("2026-12-01T12:00:00Z", "1h", "1h0m3s", "fleet-queue", "fleet.maxWait").done()
    rayjob = {"metadata": {"name": "j", "namespace": FLEET_NAMESPACE, "labels": {
        "kueue.x-k8s.io/queue-name": "fleet-queue"}, "annotations": {
        api.GAVE_UP_ANNOTATION: give_up.to_json()}}}
    workload = {"metadata": {"name": "wl", "namespace": FLEET_NAMESPACE, "creationTimestamp": "2026-12-01T11:00:00Z"},
                "spec": {"queueName": "fleet-queue", "active": False},
                "status": {"conditions": [
                    {"type": "QuotaReserved", "status": "False", "lastTransitionTime": "2026-12-01T12:00:01Z"},
                    {"type": "Evicted", "status": "True", "reason": "Deactivated",
                     "lastTransitionTime": "2026-12-01T12:00:01Z"}]}}
    state = status_jobs.job_state(rayjob, workload, None, None)
    assert state.words == "given up after 1h0m3s (maximum wait 1h)"
    assert "no member admitted it within its maximum wait of 1h (fleet.maxWait)" in state.detail
    moving = status_jobs.MoveView("fleet-on-demand-w1", "fleet-queue", "fleet-queue",
                                  api.MEMBER_STOCKOUT, "2026-12-01T12:00:00Z")
    workload["spec"]["active"] = True
    assert "reported no TPU capacity for its pods" in status_jobs.job_state(rayjob, workload, None, moving).detail


def test_a_slice_the_member_recorded_lost_moves_the_job_on_at_the_end_of_the_members_recovery_wait():
    """Issue 26, in a fleet: the member's failover controller records the loss on the member's RayJob (it never
    moves a fleet copy); the manager's ladder moves the job to the next step once the member's wait is over and the
    slice did not come back, and looks again exactly then. A recovery, or a loss of an earlier admission, is none."""

    view = _waiting("fleet-on-demand-w1", READY_W1, admitted=True)  # admitted at 11:59:50
    lost = LostSlice("on-demand", "2026-12-01T11:59:55Z", "host gke-tpu-0 is unreachable", "2026-12-01T12:00:25Z")
    assert ladder_rules.decide(GRACE_LADDER, view, None, NOW, lost=lost) is None
    assert ladder_rules.next_look(GRACE_LADDER, view, None, NOW, lost=lost) == pytest.approx(25.05)
    at_the_end = NOW + datetime.timedelta(seconds=25)
    action = ladder_rules.decide(GRACE_LADDER, view, None, at_the_end, lost=lost)
    assert (action.move.from_flavor, action.move.to_flavor, action.move.reason) == (
        "fleet-on-demand-w1", "fleet-queue", api.MEMBER_SLICE_LOST)
    assert "member w1 recorded that the job lost its slice" in ladder_rules.move_message(action.move, "w1")
    # The member's stockout reports meanwhile are about the lost slice's replacement: the loss's wait rules (as in
    # the regional controller), not the early path's grace.
    reported = datetime.datetime(2026, 12, 1, 11, 59, 56, tzinfo=datetime.timezone.utc)
    assert ladder_rules.decide(GRACE_LADDER, view, None, NOW, lost=lost, stockout=reported) is None
    action = ladder_rules.decide(GRACE_LADDER, view, None, at_the_end, lost=lost, stockout=reported)
    assert action.move.reason == api.MEMBER_SLICE_LOST
    back = dataclasses.replace(lost, state=RECOVERED, recovered_at="2026-12-01T12:00:10Z")
    assert ladder_rules.decide(GRACE_LADDER, view, None, at_the_end, lost=back) is None
    earlier = dataclasses.replace(lost, at="2026-12-01T11:40:00Z", until="2026-12-01T11:45:00Z")
    assert ladder_rules.decide(GRACE_LADDER, view, None, at_the_end, lost=earlier) is None


READY_DWS = {"name": "fleet-multikueue", "state": "Ready", "lastTransitionTime": "2026-12-01T11:59:50Z"}


def test_a_slice_lost_at_the_last_step_requeues_the_job_there_once_the_running_members_wait_is_over():
    """Issue 26 at the last step (DWS in every member): no step after it, so the job is requeued there (a move to
    the same step): deactivated, its copy in the member that lost the slice goes, and MultiKueue asks every member
    again. The loss counts only from the member MultiKueue runs it in (`status.clusterName`)."""

    lost = LostSlice("dws", "2026-12-01T11:59:55Z", "host gke-tpu-0 is unreachable", "2026-12-01T12:00:25Z")
    running = _waiting("fleet-queue", READY_DWS, admitted=True, cluster="w2")
    assert ladder_rules.running_member(GRACE_LADDER.steps[-1], running) == "w2"
    assert ladder_rules.decide(GRACE_LADDER, running, None, NOW, lost=lost) is None  # waiting for it to come back
    assert ladder_rules.next_look(GRACE_LADDER, running, None, NOW, lost=lost) == pytest.approx(25.05)
    at_the_end = NOW + datetime.timedelta(seconds=25)
    action = ladder_rules.decide(GRACE_LADDER, running, None, at_the_end, lost=lost)
    assert action.move == Move("fleet-queue", "fleet-queue", "fleet-queue", api.MEMBER_SLICE_LOST,
                               "2026-12-01T12:00:25Z", member="w2") and action.move.requeue
    assert Move.from_json(action.move.to_json()) == action.move  # the member travels with the move (its message)
    message = ladder_rules.move_message(action.move, "w2")
    assert message.startswith("requeued at step fleet-queue") and "member w2 recorded that the job lost" in message
    # No member named (MultiKueue has not said where it runs), a member of no step, a recovery, an earlier
    # admission's loss: nothing to do.
    unnamed = _waiting("fleet-queue", READY_DWS, admitted=True)
    assert ladder_rules.running_member(GRACE_LADDER.steps[-1], unnamed) is None
    assert ladder_rules.decide(GRACE_LADDER, unnamed, None, at_the_end, lost=lost) is None
    stranger = _waiting("fleet-queue", READY_DWS, admitted=True, cluster="w9")
    assert ladder_rules.decide(GRACE_LADDER, stranger, None, at_the_end, lost=lost) is None
    back = dataclasses.replace(lost, state=RECOVERED, recovered_at="2026-12-01T12:00:10Z")
    assert ladder_rules.decide(GRACE_LADDER, running, None, at_the_end, lost=back) is None
    earlier = dataclasses.replace(lost, at="2026-12-01T11:40:00Z", until="2026-12-01T11:45:00Z")
    assert ladder_rules.decide(GRACE_LADDER, running, None, at_the_end, lost=earlier) is None
    # A member's eviction at the last step is MultiKueue's to redispatch, as before: no move.
    evicted = _waiting("fleet-queue", {**READY_DWS, "state": "Pending", "retryCount": 2}, cluster="w2")
    assert ladder_rules.decide(GRACE_LADDER, evicted, None, at_the_end) is None


def test_a_requeue_takes_route_ds_steps_at_its_own_step_and_is_done_only_after_its_deactivation():
    """A requeue relabels and repoints nothing: deactivated (the move on the Workload), recorded on the RayJob, the
    quota released, the backoff cleared, active again; done once active with the record. Active without the record
    is before the deactivation (the record is written only while inactive)."""
    move = Move("fleet-queue", "fleet-queue", "fleet-queue", api.MEMBER_SLICE_LOST, "2026-12-01T12:00:00Z")
    world = _World()
    world.workload["spec"]["queueName"] = "fleet-queue"
    world.workload["status"]["admissionChecks"] = [{"name": "fleet-multikueue", "state": "Retry"}]
    world.workload["status"]["requeueState"] = {"count": 1, "requeueAt": "2026-12-01T12:01:00Z"}
    world.rayjob["metadata"]["labels"][api.QUEUE_LABEL] = "fleet-queue"
    job_before = copy.deepcopy(world.rayjob)
    active = ladder_rules.LadderView.from_object(world.workload)
    assert ladder_rules.next_in_move(move, active, job_before, "fleet-multikueue") == ladder_rules.DEACTIVATE
    steps = _route_d(world, move, "fleet-multikueue", running=True)
    assert steps == [ladder_rules.RECORD, ladder_rules.MARK_SUSPENDED, ladder_rules.WAIT_FOR_QUOTA,
                     ladder_rules.WAIT_FOR_QUOTA, api.WAIT_FOR_BACKOFF_RESET, api.REACTIVATE], steps
    assert world.workload["spec"] == {"queueName": "fleet-queue", "active": True}
    assert world.rayjob["metadata"]["labels"][api.QUEUE_LABEL] == "fleet-queue"
    assert ladder_rules.WORKLOAD_MOVE_ANNOTATION not in (world.workload["metadata"].get("annotations") or {})


def test_the_ladder_reads_a_members_loss_event_on_a_rayjob_and_its_stockouts_on_pods_only():
    loss = {"involvedObject": {"kind": "RayJob", "name": "j"}, "reason": "SliceLost", "message": "lost its slice"}
    assert ladder_rules.is_slice_lost_event(loss) and not ladder_rules.is_stockout_event(loss)
    on_a_rayjob = {**_event("p", "2026-12-01T11:59:55Z"), "involvedObject": {"kind": "RayJob", "name": "j"}}
    assert not ladder_rules.is_stockout_event(on_a_rayjob)
    assert ladder_rules.is_stockout_event(_event("p", "2026-12-01T11:59:55Z"))


def test_a_member_that_does_not_answer_reports_no_stockout_and_the_job_is_decided_on_as_it_is():
    """A partition of the step's member: reading its RayJob fails (no answer), which is no stockout and no error that
    would queue the job again after a delay: Kueue evicts it once it loses the member, and the ladder moves it on."""
    import socket

    from kubernetes import client

    with socket.socket() as closed:  # a port nobody listens on: the connection is refused, as a cut-off member's
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    configuration = client.Configuration(host=f"http://127.0.0.1:{port}")
    configuration.retries = 0
    from failover.ladder.watches import LadderSeen
    from failover.runtime.cache import Cache
    from failover.runtime.members import Member, MemberCaches

    members = MemberCaches(lambda: {})
    seen = LadderSeen(Cache(None), GRACE_LADDER, FLEET_NAMESPACE, lambda: NOW, members, lambda keys: None)
    member = members.add(Member("w1"))
    member.api = client.ApiClient(configuration)
    member.cache = Cache(None, "w1")
    member.cache.store(seen.watched_events).apply("ADDED", {
        **_event("j-cluster-tpu-worker-0", "2026-12-01T11:59:55Z"), "metadata": {"namespace": "n", "name": "e"}})
    controller = object.__new__(ladder_controller.LadderController)  # no manager needed for the early path's read
    controller.ladder, controller.seen = GRACE_LADDER, seen
    assert controller._member_signals(_waiting("fleet-on-demand-w1", READY_W1, admitted=True)) == (None, None)
