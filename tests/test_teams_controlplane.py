"""Three teams on one real kube-apiserver 1.36 + Kueue 0.19.2, with the stack's Cohorts and per-team chains and the
failover controller (its ServiceAccount's rights), over real KubeRay, kube-scheduler and nodes shaped like the plan's
pools (testbed/runtime.py). The tests play only GCE capacity (a stocked-out pool, a provisioned DWS
request). What a team's Google group may do is asked of the real RBAC authorizer (SubjectAccessReviews), on the Kueue
chart's ClusterRoles aggregated into `edit` as on GKE.

Capacity (the dev platform with 3 on-demand and 2 DWS slices): A and B one on-demand slice each, C none; B may
borrow at most one slice per rung. PodsReady timeout 10m, so no job is evicted for its pods while a scenario runs;
the stockout scenario uses the controller's early path (4 s grace).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json

import pytest

from failover import api
from infra import failover as stack_failover
from infra import fleet as stack_fleet
from infra import kueue as stack_kueue
from ops.status import cli as status_cli
from ops.status import health
from testbed import jobs
from testbed.cluster import ControlPlane
from testbed.failover_tier import FailoverTier, controller_running, platform_plan
from testbed.kube import condition, condition_reason, wait_for
from testbed.stack import release_values
from testbed.status_states import install_kueue_config_map

pytestmark = pytest.mark.controlplane

TEAM_A = {"name": "team-a", "namespace": "ns-a", "groups": ["a@example.com"], "shares": {"onDemand": 1}}
TEAM_B = {"name": "team-b", "namespace": "ns-b", "groups": ["b@example.com"], "shares": {"onDemand": 1},
          "borrowingLimit": 1}
TEAM_C = {"name": "team-c", "namespace": "ns-c", "groups": ["c@example.com"], "shares": {}}
TEAMS = (TEAM_A, TEAM_B, TEAM_C)
OVERRIDES = {"teams": list(TEAMS), "googleGroupsDomain": "example.com",
             "onDemand": {"maxSlices": 3}, "flexStart": {"maxSlices": 2}}
DWS_SLICES = 2
CHIPS_PER_SLICE = 16
REACTION_TIMEOUT = 60


def start_teams_tier() -> FailoverTier:
    plan = platform_plan(overrides=OVERRIDES)
    tier = FailoverTier(ControlPlane(release_values(plan), nodes_of=plan), plan).start()
    for team in TEAMS:
        jobs.prepare_namespace(tier.kube, team["namespace"])
    install_kueue_config_map(tier)  # the release's, which `ops status` reads the pods-ready timeout from
    return tier


@pytest.fixture(scope="module")
def tier(request):
    with controller_running(start_teams_tier(), request.session) as tier:
        yield tier


@pytest.fixture
def clean(tier):
    yield tier
    for team in TEAMS:
        namespace = team["namespace"]
        for kind in (jobs.RAYJOB, ("v1", "Pod")):
            for obj in tier.kube.list(*kind, namespace=namespace):
                tier.kube.delete(*kind, obj["metadata"]["name"], namespace, propagation="Background")
    wait_for(lambda: not any(tier.kube.list(*jobs.WORKLOAD, namespace=t["namespace"]) for t in TEAMS), 60,
             "no Workload left")
    tier.gke.restore()
    wait_for(lambda: not any(tier.kube.list("v1", "Pod", namespace=t["namespace"]) for t in TEAMS), 60, "no pod left")
    tier.gke.remove_idle()


def submit(tier: FailoverTier, team: dict, name: str, queue: str = "user-queue", wait: bool = True) -> dict | None:
    """A dev RayJob in the team's namespace; waits for Kueue's first decision and returns the Workload (a job queued
    behind a pending one of its queue may get no condition at all: `wait=False`)."""
    job = jobs.dev_rayjob(name, queue)
    job["metadata"]["namespace"] = team["namespace"]
    tier.kube.create(job)
    return jobs.wait_decided(tier.kube, team["namespace"], name) if wait else None


def workload(tier: FailoverTier, team: dict, name: str) -> dict:
    return jobs.workload_of(tier.kube, team["namespace"], name)


def flavor(tier: FailoverTier, team: dict, name: str) -> str | None:
    return jobs.decision(tier.kube, team["namespace"], name).flavor


def evictions(tier: FailoverTier, teams: tuple[dict, ...] = TEAMS) -> dict[str, str]:
    """Every Workload evicted so far, any team: its owner RayJob -> Kueue's eviction reason (Preempted, ...).
    Read from status.schedulingStats.evictions, which lasts: the Evicted condition goes as soon as the victim is
    admitted again (seen: a victim re-admitted on DWS at once left nothing to see, and the reclaim test waited in
    vain). The stats keep no cause for a preemption (underlyingCause is empty): see preemption_cause."""
    found = {}
    for team in teams:
        for w in tier.kube.list(*jobs.WORKLOAD, namespace=team["namespace"]):
            owner = w["metadata"]["ownerReferences"][0]["name"]
            for record in ((w.get("status") or {}).get("schedulingStats") or {}).get("evictions") or []:
                found[owner] = record.get("reason")
            if condition(w, "Evicted") == "True":
                found[owner] = condition_reason(w, "Evicted")
    return found


def waiting_reason(tier: FailoverTier, team: dict, name: str) -> str:
    """Kueue's verdict on a Workload it found no room for: the message of its QuotaReserved=False condition."""
    w = workload(tier, team, name)
    assert condition(w, "QuotaReserved") == "False", w["status"]
    return next(c["message"] for c in w["status"]["conditions"] if c["type"] == "QuotaReserved")


def queued(tier: FailoverTier, team: dict, queue: str) -> int:
    """The Workloads Kueue counts in a team's LocalQueue, holding quota or pending. A job queued behind a pending one
    gets no condition of its own (measured: b-5 behind b-4), so this count, which Kueue writes to the LocalQueue's
    status about a second after its decisions, is where it shows Kueue has it queued."""
    status = tier.kube.get(stack_kueue.KUEUE_API_VERSION, "LocalQueue", queue, team["namespace"]).get("status") or {}
    return int(status.get("pendingWorkloads") or 0) + int(status.get("reservingWorkloads") or 0)


def preemption_cause(tier: FailoverTier, team: dict, rayjob: str) -> str:
    """Kueue's Event on the victim's Workload, which says why it was preempted (it outlives the condition)."""
    name = workload(tier, team, rayjob)["metadata"]["name"]
    return next((e["message"] for e in tier.kube.list("v1", "Event", namespace=team["namespace"])
                 if e["involvedObject"].get("kind") == "Workload" and e["involvedObject"]["name"] == name
                 and e["reason"] == "Preempted"), "")


def reserved_chips(tier: FailoverTier, team: dict, flavor_name: str) -> int:
    """The TPU chips a team's Workloads hold on a flavor (quota reserved), summed over its whole chain."""
    total = 0
    for w in tier.kube.list(*jobs.WORKLOAD, namespace=team["namespace"]):
        if condition(w, "QuotaReserved") == "True" and jobs.tpu_flavor(w) == flavor_name:
            for assignment in w["status"]["admission"]["podSetAssignments"]:
                if "google.com/tpu" in (assignment.get("resourceUsage") or {}):
                    total += int(assignment["resourceUsage"]["google.com/tpu"])
    return total


def all_provisioning_requests(tier: FailoverTier) -> list[dict]:
    return [r for t in TEAMS for r in tier.kube.list(*jobs.PROVISIONING_REQUEST, namespace=t["namespace"])]


def torn_down(tier: FailoverTier, team: dict, name: str) -> None:
    """Once Kueue suspends a preempted RayJob, KubeRay deletes its RayCluster and pods and reports Suspended; the
    pods are gone a moment later (KWOK ends them as a kubelet would)."""
    wait_for(lambda: (tier.kube.get(*jobs.RAYJOB, name, team["namespace"]).get("status") or {}).get(
        "jobDeploymentStatus") == "Suspended", REACTION_TIMEOUT, f"{name} suspended and torn down by KubeRay")
    wait_for(lambda: not [p for p in tier.kube.list("v1", "Pod", namespace=team["namespace"])
                          if (p["metadata"].get("labels") or {}).get("ray.io/cluster", "").startswith(f"{name}-")],
             REACTION_TIMEOUT, f"{name}'s pods gone")


def test_the_team_objects_are_accepted_by_the_real_server(tier):
    for m in tier.plan.kubernetes_manifests():
        if m["kind"] in ("Cohort", "ClusterQueue", "LocalQueue", "RoleBinding", "ClusterRole", "Namespace", "Role",
                         "ClusterRoleBinding"):
            assert tier.kube.get(m["apiVersion"], m["kind"], m["metadata"]["name"],
                                 m["metadata"].get("namespace")), (m["kind"], m["metadata"]["name"])
    cohort = tier.kube.get("kueue.x-k8s.io/v1beta2", "Cohort", "team-b")
    assert cohort["spec"]["parentName"] == "tpu-fallback"


# What a team member's kubectl does against the real RBAC authorizer, asked as SubjectAccessReviews for a user of
# TEAM_A's Google group (GKE Google Groups for RBAC: the group's email arrives as a group of the request).
MEMBER = {"user": "alice@example.com", "groups": [TEAM_A["groups"][0], "system:authenticated"]}
RAYJOB_VERBS = ("create", "update", "patch", "delete", "get", "list", "watch")
READ_VERBS = ("get", "list", "watch")
# (API group, resource, subresource, verbs) a member needs in the team's namespace.
NEEDED = [("ray.io", "rayjobs", "", RAYJOB_VERBS), ("kueue.x-k8s.io", "workloads", "", READ_VERBS),
          ("", "events", "", READ_VERBS), ("", "pods", "", READ_VERBS), ("", "pods", "log", ("get",)),
          ("kueue.x-k8s.io", "localqueues", "", READ_VERBS),
          ("autoscaling.x-k8s.io", "provisioningrequests", "", READ_VERBS)]
# (namespace or None for cluster scope, API group, resource, verb) a member must not have.
FORBIDDEN = [(TEAM_B["namespace"], "ray.io", "rayjobs", verb) for verb in RAYJOB_VERBS] + [
    (TEAM_C["namespace"], "ray.io", "rayjobs", "create"),
    (None, "kueue.x-k8s.io", "clusterqueues", "create"), (None, "kueue.x-k8s.io", "clusterqueues", "update"),
    (TEAM_A["namespace"], "", "resourcequotas", "update"),
    (TEAM_A["namespace"], "kueue.x-k8s.io", "localqueues", "update"),
    (TEAM_A["namespace"], "rbac.authorization.k8s.io", "rolebindings", "create")]


def allowed(tier: FailoverTier, namespace: str | None, group: str, resource: str, verb: str,
            subresource: str = "", name: str = "") -> bool:
    attributes = {"group": group, "resource": resource, "verb": verb}
    if namespace:
        attributes["namespace"] = namespace
    if subresource:
        attributes["subresource"] = subresource
    if name:
        attributes["name"] = name
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "metadata": {},
              "spec": {**MEMBER, "resourceAttributes": attributes}}
    return tier.kube.create(review)["status"].get("allowed", False)


def answers_once_in_effect(tier: FailoverTier, wanted: bool, checks: dict[str, tuple]) -> dict[str, bool]:
    """Each check's SubjectAccessReview answer, once the team's `edit` binding is in effect (the authorizer reads
    RoleBindings and aggregated roles from its informers) and, for `wanted`, until all agree or 10 s pass."""
    wait_for(lambda: allowed(tier, TEAM_A["namespace"], "", "pods", "create"), REACTION_TIMEOUT, "edit in effect")
    answers: dict[str, bool] = {}

    def agreed() -> bool:
        answers.update({key: allowed(tier, *check) for key, check in checks.items()})
        return all(value == wanted for value in answers.values())

    with contextlib.suppress(TimeoutError):
        wait_for(agreed, 10 if wanted else 0.5, "the answers", interval=0.5)
    return answers


def test_edit_alone_lets_a_team_read_rayjobs_but_not_submit_them(tier):
    """Why the platform binds its own RayJob role: on the chart's ClusterRoles, aggregated as on GKE, `edit` reads
    RayJobs and Workloads (Kueue's viewer roles) and can create none (Kueue's editor roles are not aggregated,
    KubeRay's chart is not installed by the stack and aggregates nothing)."""
    def rules() -> list[dict]:
        return (tier.kube.get("rbac.authorization.k8s.io/v1", "ClusterRole", "edit") or {}).get("rules") or []

    def verbs_on(resource: str) -> set[str]:
        return {verb for rule in rules() if resource in rule.get("resources", []) for verb in rule.get("verbs", [])}

    wait_for(lambda: "list" in verbs_on("rayjobs"), REACTION_TIMEOUT, "Kueue's viewer roles aggregated into edit")
    assert verbs_on("rayjobs") == {"get", "list", "watch"}
    assert verbs_on("workloads") == {"get", "list", "watch"}
    assert "create" in verbs_on("pods")  # the rest of `edit` is there too


def test_a_teams_groups_may_submit_and_follow_rayjobs_in_their_namespace(tier):
    checks = {f"{verb} {resource}{'/' + sub if sub else ''}": (TEAM_A["namespace"], group, resource, verb, sub)
              for group, resource, sub, verbs in NEEDED for verb in verbs}
    answers = answers_once_in_effect(tier, True, checks)
    assert answers == {key: True for key in checks}, answers


def test_a_teams_groups_may_not_touch_other_teams_jobs_queues_quota_or_access(tier):
    checks = {f"{verb} {resource} in {namespace or 'the cluster'}": (namespace, group, resource, verb)
              for namespace, group, resource, verb in FORBIDDEN}
    answers = answers_once_in_effect(tier, False, checks)
    assert answers == {key: False for key in checks}, answers


# What `ops status` reads (ops/status/snapshot.py), as (namespace or None, API group, resource, verb, name): in the
# team's namespace through `edit` and the RayJob role, the rest through the status reader's roles (infra/teams.py).
OWN = TEAM_A["namespace"]
STATUS_READS = [
    *((None, "kueue.x-k8s.io", kind, "list", "") for kind in ("clusterqueues", "cohorts", "resourceflavors",
                                                               "admissionchecks")),
    (None, "", "nodes", "list", ""),
    (OWN, "kueue.x-k8s.io", "localqueues", "list", ""), (OWN, "kueue.x-k8s.io", "workloads", "list", ""),
    (OWN, "ray.io", "rayjobs", "list", ""), (OWN, "autoscaling.x-k8s.io", "provisioningrequests", "list", ""),
    (OWN, "", "pods", "list", ""), (OWN, "", "events", "list", ""),
    (OWN, "visibility.kueue.x-k8s.io", "localqueues/pendingworkloads", "get", "user-queue"),
    (stack_failover.NAMESPACE, "apps", "deployments", "get", stack_failover.NAME),
    (stack_failover.NAMESPACE, "", "pods", "list", ""),
    (stack_kueue.NAMESPACE, "", "configmaps", "get", stack_kueue.MANAGER_CONFIG_MAP),
]
# Nothing beyond: the platform's namespaces' secrets, other ConfigMaps and Deployments, writes, the fleet's objects,
# other teams' namespaces, the rest of the cluster.
BEYOND_STATUS = [
    (stack_failover.NAMESPACE, "", "secrets", "list", ""), (stack_kueue.NAMESPACE, "", "secrets", "list", ""),
    (stack_kueue.NAMESPACE, "", "secrets", "get", "kueue-webhook-server-cert"),
    (stack_kueue.NAMESPACE, "", "configmaps", "list", ""),
    (stack_kueue.NAMESPACE, "", "configmaps", "get", "another"),
    (stack_kueue.NAMESPACE, "", "configmaps", "update", stack_kueue.MANAGER_CONFIG_MAP),
    (stack_kueue.NAMESPACE, "", "pods", "list", ""),
    (stack_failover.NAMESPACE, "apps", "deployments", "list", ""),
    (stack_failover.NAMESPACE, "apps", "deployments", "get", stack_fleet.WATCH_NAME),
    (stack_failover.NAMESPACE, "apps", "deployments", "update", stack_failover.NAME),
    (stack_failover.NAMESPACE, "apps", "deployments", "patch", stack_failover.NAME),
    (stack_failover.NAMESPACE, "", "pods", "delete", ""), (stack_failover.NAMESPACE, "", "pods/log", "get", ""),
    (stack_failover.NAMESPACE, "", "configmaps", "list", ""),
    (None, "kueue.x-k8s.io", "multikueueclusters", "list", ""),
    (None, "kueue.x-k8s.io", "clusterqueues", "update", "team-a-cluster-queue"),
    (None, "kueue.x-k8s.io", "cohorts", "delete", "team-a"), (None, "", "nodes", "update", ""),
    (None, "", "secrets", "list", ""), (None, "", "pods", "list", ""), (None, "kueue.x-k8s.io", "workloads", "list", ""),
    (TEAM_B["namespace"], "", "pods", "list", ""), (TEAM_B["namespace"], "kueue.x-k8s.io", "workloads", "list", ""),
    (TEAM_B["namespace"], "autoscaling.x-k8s.io", "provisioningrequests", "list", ""),
    (TEAM_B["namespace"], "", "events", "list", ""), ("kube-system", "", "pods", "list", ""),
]


def review_checks(reads: list[tuple]) -> dict[str, tuple]:
    def key(namespace, group, resource, verb, name) -> str:
        return f"{verb} {group or 'core'}/{resource}{'/' + name if name else ''} in {namespace or 'the cluster'}"

    def check(namespace, group, resource, verb, name) -> tuple:
        resource, _, subresource = resource.partition("/")
        return namespace, group, resource, verb, subresource, name
    return {key(*read): check(*read) for read in reads}


def test_a_teams_groups_may_read_what_ops_status_reads_and_nothing_beyond(tier):
    """SubjectAccessReviews for a member of TEAM_A's group: every read of status says yes (the status reader's
    bindings in effect), and nothing next to them."""
    wait_for(lambda: allowed(tier, None, "kueue.x-k8s.io", "clusterqueues", "list"), REACTION_TIMEOUT,
             "the status reader's binding in effect")
    answers = answers_once_in_effect(tier, True, review_checks(STATUS_READS))
    assert answers == {key: True for key in answers}, answers
    answers = answers_once_in_effect(tier, False, review_checks(BEYOND_STATUS))
    assert answers == {key: False for key in answers}, answers


def member_status(kubeconfig: str, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    args = status_cli.add_arguments(argparse.ArgumentParser()).parse_args(["--kubeconfig", kubeconfig, *argv])
    return status_cli.run(args, out, err), out.getvalue(), err.getvalue()


def test_a_team_members_status_in_its_namespace_is_complete(clean):
    """A person of TEAM_A's Google group (a client certificate: the user and the group, as GKE presents them) runs
    `ops status` in the team's namespace, with a job running there: exit 0, no problem, nothing unknown: the ladder
    and its quota, the controller's health, the job's state, pods and node pools. The one read refused, the fleet's
    (this platform has no MultiKueue check), is named in `readable` and leaves nothing unknown."""
    tier = clean
    submit(tier, TEAM_A, "a-status")
    placed = wait_for(lambda: jobs.pools_of(tier.kube, TEAM_A["namespace"], "a-status"), REACTION_TIMEOUT,
                      "a-status running")
    kubeconfig = str(tier.plane.kubeconfig_for_user(MEMBER["user"], TEAM_A["groups"][0], TEAM_A["namespace"]))

    with contextlib.suppress(TimeoutError):  # the bindings in effect (the authorizer reads them from informers)
        wait_for(lambda: member_status(kubeconfig, "-o", "json")[0] == status_cli.EXIT_OK, REACTION_TIMEOUT,
                 "the member's status complete")
    code, out, err = member_status(kubeconfig, "-o", "json")
    data = json.loads(out)
    assert code == status_cli.EXIT_OK and err == "", (code, err, data["problems"])
    assert data["complete"] is True and data["problems"] == []
    assert data["namespace"] == TEAM_A["namespace"]
    refused = {what for what, ok in data["readable"].items() if not ok}
    assert refused == {"multikueue_clusters", "fleet_watch", "fleet_ladder"} and data["fleet"] is None
    assert data["ladderFrom"] != "unknown" and data["quotaKnown"] is True
    assert {q["name"] for q in data["clusterQueues"]} >= {"team-a-cluster-queue", "team-a-cluster-queue-dws"}
    assert all(r["quota"] is not None and r["flavorExists"] for r in data["rungs"])
    assert data["failoverController"]["state"] not in (health.UNKNOWN, health.NOT_DEPLOYED)
    (job,) = [j for j in data["jobs"] if j["name"] == "a-status"]
    assert job["state"] == "Running" and job["rung"] == "on-demand"
    assert job["podsReady"] == job["podsNeeded"] and job["nodePools"] is not None
    assert set(job["nodePools"]) == {pool for pools in placed.values() for pool in pools}

    code, out, err = member_status(kubeconfig)
    assert code == status_cli.EXIT_OK and err == "", err
    assert "PROBLEMS" not in out and "unknown" not in out.lower() and "?" not in out, out
    # Another team's namespace is not its to read: unknown, never "no jobs", and the exit code says so.
    code, out, _ = member_status(kubeconfig, "-n", TEAM_B["namespace"])
    assert code == status_cli.EXIT_PARTIAL and f"JOBS (namespace {TEAM_B['namespace']}) unknown" in out


def test_a_local_queue_pointing_at_another_teams_queue_admits_nothing(clean):
    tier = clean
    tier.kube.create({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                      "metadata": {"name": "sneaky", "namespace": TEAM_B["namespace"]},
                      "spec": {"clusterQueue": "team-a-cluster-queue"}})
    try:
        # On-demand and DWS are all free: only the namespace selector can stop it. Kueue checks the selector before
        # it looks for quota, and judges the Workload again only when its namespace changes (pkg/scheduler/
        # scheduler.go, nominate): its verdict, which submit waits for, is the last word.
        submit(tier, TEAM_B, "b-sneaky", queue="sneaky")
        assert "namespace" in waiting_reason(tier, TEAM_B, "b-sneaky")
    finally:
        tier.kube.delete("kueue.x-k8s.io/v1beta2", "LocalQueue", "sneaky", TEAM_B["namespace"])


def test_a_stocked_out_job_walks_down_its_own_teams_chain(clean):
    tier = clean
    tier.stockout("on-demand")
    submit(tier, TEAM_A, "a-stockout")
    assert flavor(tier, TEAM_A, "a-stockout") == "on-demand"
    wait_for(lambda: (tier.kube.get(*jobs.RAYJOB, "a-stockout", TEAM_A["namespace"])["metadata"].get("labels") or {})
             .get(jobs.QUEUE_LABEL) == "user-queue-dws", REACTION_TIMEOUT, "the move to A's dws rung")
    w = wait_for(lambda: (w := workload(tier, TEAM_A, "a-stockout")) and condition(w, "QuotaReserved") == "True"
                 and w, REACTION_TIMEOUT, "a-stockout re-admitted")
    assert w["spec"]["queueName"] == "user-queue-dws"
    assert w["status"]["admission"]["clusterQueue"] == "team-a-cluster-queue-dws"
    assert jobs.tpu_flavor(w) == "dws"
    jobs.wait_provisioning_request(tier.kube, TEAM_A["namespace"], "a-stockout", REACTION_TIMEOUT)
    # Nothing of it anywhere else: no Workload, no request in the other teams' namespaces.
    for other in (TEAM_B, TEAM_C):
        assert not tier.kube.list(*jobs.WORKLOAD, namespace=other["namespace"])
        assert not tier.kube.list(*jobs.PROVISIONING_REQUEST, namespace=other["namespace"])


def test_own_jobs_and_jobs_moved_down_are_never_preempted(clean):
    tier = clean
    for name in ("a-1", "a-2", "a-3"):  # A's share, then the idle on-demand it borrows, all of it
        submit(tier, TEAM_A, name)
    submit(tier, TEAM_A, "a-dws", queue="user-queue-dws")  # a job already moved down the ladder
    submit(tier, TEAM_A, "a-4")  # on-demand full: DWS
    submit(tier, TEAM_A, "a-5")  # nothing left: waits
    assert [flavor(tier, TEAM_A, n) for n in ("a-1", "a-2", "a-3", "a-dws", "a-4", "a-5")] == [
        "on-demand", "on-demand", "on-demand", "dws", "dws", None]
    # Kueue issues the preemptions a Workload needs in the scheduling cycle that judges it, before it writes why the
    # Workload waits (pkg/scheduler/scheduler.go: processEntry, then requeueAndUpdate), and judges it again only
    # when quota is freed, which nothing here does: a-5's verdict (submit waited for it) is the last word.
    reason = waiting_reason(tier, TEAM_A, "a-5")
    assert "insufficient unused quota" in reason and "Pending the preemption" not in reason, reason
    assert evictions(tier) == {}


def test_reclaim_borrowing_limits_and_dws_capacity_across_teams(clean):
    tier = clean
    # C (no share) takes the on-demand slice nobody owns; B its share and A's idle one, then DWS up to its limit.
    submit(tier, TEAM_C, "c-1")
    for name in ("b-1", "b-2", "b-3", "b-4"):
        submit(tier, TEAM_B, name)
    submit(tier, TEAM_B, "b-5", wait=False)
    wait_for(lambda: queued(tier, TEAM_B, "user-queue") == 5, REACTION_TIMEOUT, "b-5 queued behind b-4")
    assert [flavor(tier, TEAM_B, n) for n in ("b-1", "b-2", "b-3", "b-4", "b-5")] == [
        "on-demand", "on-demand", "dws", None, None]
    assert flavor(tier, TEAM_C, "c-1") == "on-demand"
    # B never holds more than its share plus its borrowing limit, on any rung, while jobs queue.
    assert reserved_chips(tier, TEAM_B, "on-demand") == 2 * CHIPS_PER_SLICE
    assert reserved_chips(tier, TEAM_B, "dws") == 1 * CHIPS_PER_SLICE
    # B's DWS job gets its slice: from now on it must never be preempted.
    request = jobs.wait_provisioning_request(tier.kube, TEAM_B["namespace"], "b-3")
    jobs.mark_provisioned(tier.kube, request, "b-3-resize")
    wait_for(lambda: condition(workload(tier, TEAM_B, "b-3"), "Admitted") == "True", REACTION_TIMEOUT, "b-3 admitted")

    # A wants its share back: one borrower is preempted for it, and A runs on on-demand, not on DWS.
    submit(tier, TEAM_A, "a-1")
    victims = wait_for(lambda: evictions(tier), REACTION_TIMEOUT, "a reclaim")
    assert len(victims) == 1 and set(victims.values()) == {"Preempted"}, victims
    (victim,) = victims
    # A job of a borrowing queue on on-demand; never b-3 (DWS). Within B's queue either on-demand job may go
    # (measured: Kueue evicted b-1 once, b-2 another time): quota is per queue, not per job.
    assert victim in ("b-1", "b-2", "c-1"), victims
    owner = TEAM_B if victim.startswith("b-") else TEAM_C
    # Kueue's words for InCohortReclamation (the Preempted condition's reason while it lasts).
    assert "due to reclamation within the cohort" in wait_for(
        lambda: preemption_cause(tier, owner, victim), REACTION_TIMEOUT, "Kueue's Preempted event")
    torn_down(tier, owner, victim)
    wait_for(lambda: flavor(tier, TEAM_A, "a-1") is not None, REACTION_TIMEOUT, "a-1 admitted")
    assert flavor(tier, TEAM_A, "a-1") == "on-demand"
    # The reclaimed run's pods were gone before A's arrived; A's run on an on-demand slice, head on default-pool.
    placed = wait_for(lambda: jobs.pools_of(tier.kube, TEAM_A["namespace"], "a-1"), REACTION_TIMEOUT, "a-1 running")
    assert (placed["head"], placed["submitter"]) == (["default-pool"], ["default-pool"])
    assert tier.on_one_slice_of("on-demand", placed["worker"]), placed
    # A reclaim takes back A's share only: B still holds its own.
    assert reserved_chips(tier, TEAM_B, "on-demand") >= CHIPS_PER_SLICE
    # A preemption is not a stockout: the controller moved nothing.
    rayjob = tier.kube.get(*jobs.RAYJOB, victim, owner["namespace"])
    assert api.FAILOVER_ANNOTATION not in (rayjob["metadata"].get("annotations") or {})
    assert rayjob["metadata"]["labels"][jobs.QUEUE_LABEL] == "user-queue"

    # DWS across all teams: more jobs queued on the DWS rungs than the pool has slices.
    for team, name in ((TEAM_A, "a-dws"), (TEAM_C, "c-dws-1"), (TEAM_C, "c-dws-2")):
        submit(tier, team, name, queue="user-queue-dws", wait=False)
    # Until Kueue has all three: its verdict on A's (the first of its queue), C's two in C's queue. Once it has judged
    # a-dws the DWS rung's last slice is taken, by a-dws or before it, and C's jobs queue behind the full rung.
    wait_for(lambda: jobs.decided(workload(tier, TEAM_A, "a-dws")) and queued(tier, TEAM_C, "user-queue-dws") == 2,
             REACTION_TIMEOUT, "Kueue's decisions on the DWS jobs")
    on_dws = [w for t in TEAMS for w in tier.kube.list(*jobs.WORKLOAD, namespace=t["namespace"])
              if condition(w, "QuotaReserved") == "True" and jobs.tpu_flavor(w) == "dws"]
    assert len(on_dws) == DWS_SLICES
    assert len(all_provisioning_requests(tier)) <= DWS_SLICES
    assert reserved_chips(tier, TEAM_B, "on-demand") <= 2 * CHIPS_PER_SLICE
    # Through all of it, the DWS job that had its slice was never touched, and only the one borrower was evicted.
    assert condition(workload(tier, TEAM_B, "b-3"), "Evicted") != "True"
    assert condition(workload(tier, TEAM_B, "b-3"), "Admitted") == "True"
    assert set(evictions(tier)) <= {victim}


# A second platform's teams on the same tier, with the reservation rung the first one lacks: the shipped example's
# `prod` (a reservation and an on-demand share) and `interns` (on-demand only). Its objects are the stack's own
# (infra/teams.py for that config) under a root Cohort of their own, so the two platforms share no quota and the
# tests above see nothing of it (a second control plane would cost ~20 s more).
OWNER = {"name": "res-owner", "namespace": "ns-res-owner", "groups": ["o@example.com"],
         "shares": {"reservation": 1, "onDemand": 1}}
INTERNS = {"name": "interns", "namespace": "ns-interns", "groups": ["i@example.com"], "shares": {"onDemand": 1}}
LADDER_ROOT = "ladder-root"
LADDER_OVERRIDES = {"teams": [OWNER, INTERNS], "googleGroupsDomain": "example.com",
                    "reservation": {"reservations": [{"name": "r", "slices": 1}]},
                    "onDemand": {"maxSlices": 3}, "flexStart": {"maxSlices": 2}}
LADDER_KINDS = ("ResourceFlavor", "Namespace", "Cohort", "ClusterQueue", "LocalQueue")


def ladder_objects(tier: FailoverTier) -> list[dict]:
    """The second platform's team objects, their root renamed; flavors the tier already has are left out."""
    plan = platform_plan(overrides=LADDER_OVERRIDES)
    teams = {team["name"] for team in LADDER_OVERRIDES["teams"]}
    namespaces = {team["namespace"] for team in LADDER_OVERRIDES["teams"]}
    wanted = []
    for m in plan.kubernetes_manifests():
        kind, meta, spec = m["kind"], m["metadata"], m.get("spec") or {}
        if kind == "ResourceFlavor" and tier.kube.get(m["apiVersion"], kind, meta["name"]) is None:
            wanted.append(m)
        elif kind == "Namespace" and meta["name"] in namespaces:
            wanted.append(m)
        elif kind == "Cohort":
            if meta["name"] == "tpu-fallback":
                wanted.append({**m, "metadata": {**meta, "name": LADDER_ROOT}})
            else:
                wanted.append({**m, "spec": {**spec, "parentName": LADDER_ROOT}})
        elif kind == "ClusterQueue" and spec.get("cohortName") in teams:
            wanted.append(m)
        elif kind == "LocalQueue" and meta.get("namespace") in namespaces:
            wanted.append(m)
    return sorted(wanted, key=lambda m: LADDER_KINDS.index(m["kind"]))


@pytest.fixture(scope="module")
def ladder(tier):
    for manifest in ladder_objects(tier):
        tier.kube.create(manifest)
        if manifest["kind"] == "ClusterQueue":
            wait_for(lambda m=manifest: condition(tier.kube.get(m["apiVersion"], "ClusterQueue",
                                                                m["metadata"]["name"]), "Active") == "True",
                     REACTION_TIMEOUT, f"{manifest['metadata']['name']} active")
    for team in (OWNER, INTERNS):
        jobs.prepare_namespace(tier.kube, team["namespace"])
    return tier


def test_a_team_takes_its_shares_in_ladder_order_and_only_a_borrower_is_reclaimed(ladder):
    """Issue 27, `teamShareOrder: ladder` (the default). The interns' first job lands on their own on-demand share
    while the owner's reservation is idle (Kueue's MayStopSearch for borrowing took the reservation, and the owner's
    first job preempted it at once); only a job beyond its team's share borrows, in ladder order (the idle
    reservation), and only such a job is a reclaim victim. The owner's first job takes its reservation share back
    from that borrower before its own free on-demand share (under the earlier `freeFirst` behaviour it took
    on-demand and left its paid reservation lent); its second job then takes the on-demand share."""
    tier, teams = ladder, (OWNER, INTERNS)
    submit(tier, INTERNS, "i-own")
    assert flavor(tier, INTERNS, "i-own") == "on-demand"  # its share, though the reservation is idle and first
    submit(tier, INTERNS, "i-borrow")  # beyond its share: the idle reservation, the first rung that can lend
    assert flavor(tier, INTERNS, "i-borrow") == "reservation"
    submit(tier, OWNER, "o-1", wait=False)  # its reservation share is lent: reclaimed before its on-demand share
    evicted = wait_for(lambda: evictions(tier, teams), REACTION_TIMEOUT, "a reclaim")
    assert evicted == {"i-borrow": "Preempted"}, evicted
    assert "due to reclamation within the cohort" in wait_for(
        lambda: preemption_cause(tier, INTERNS, "i-borrow"), REACTION_TIMEOUT, "Kueue's Preempted event")
    torn_down(tier, INTERNS, "i-borrow")
    wait_for(lambda: flavor(tier, OWNER, "o-1") is not None, REACTION_TIMEOUT, "o-1 admitted")
    assert flavor(tier, OWNER, "o-1") == "reservation"
    submit(tier, OWNER, "o-2")  # the reservation is its own now: its free on-demand share, no preemption
    assert flavor(tier, OWNER, "o-2") == "on-demand"
    # The borrower waits its turn elsewhere; the job within its share was never touched.
    wait_for(lambda: flavor(tier, INTERNS, "i-borrow") not in (None, "reservation"), REACTION_TIMEOUT,
             "i-borrow admitted again")
    assert evictions(tier, teams) == {"i-borrow": "Preempted"}
    assert flavor(tier, INTERNS, "i-own") == "on-demand"
