"""Several teams on one platform (`teams`): the rules, the Kueue objects, access and the `teams` output."""

from __future__ import annotations

import pytest

from infra.offline import OfflineEngine
from infra.settings import SYSTEM_NAMESPACES, SettingsError
from infra import failover as stack_failover, kueue as stack_kueue, teams as stack_teams
from tests.conftest import config_with, plan_for

STACK = "platform-us-east5-b"
A = {"name": "team-a", "namespace": "team-a", "groups": ["a@example.com"], "shares": {"onDemand": 1}}
B = {"name": "team-b", "namespace": "team-b", "groups": ["b@example.com"], "shares": {}, "borrowingLimit": 1}
TWO_TEAMS = {"teams": [A, B], "googleGroupsDomain": "example.com"}


def of_kind(plan, kind: str) -> dict[tuple[str | None, str], dict]:
    return {(m["metadata"].get("namespace"), m["metadata"]["name"]): m
            for m in plan.kubernetes_manifests() if m["kind"] == kind}


def tpu(quota: dict) -> str:
    return next(r for r in quota["resources"] if r["name"] == "google.com/tpu")["nominalQuota"]


# (id, teams overrides of the dev stack, the key the message must name)
BAD_TEAMS = [
    ("shares-over-capacity", {"teams": [A, {**B, "shares": {"onDemand": 1}}]}, "tpu-fallback:teams"),
    ("share-of-a-rung-that-is-off", {"teams": [{**A, "shares": {"reservation": 1}}]}, "tpu-fallback:teams"),
    ("name-twice", {"teams": [A, {**B, "name": "team-a"}]}, "tpu-fallback:teams"),
    ("namespace-twice", {"teams": [A, {**B, "namespace": "team-a"}]}, "tpu-fallback:teams"),
    ("namespace-not-dns", {"teams": [{**A, "namespace": "Team_A"}]}, "tpu-fallback:teams[0].namespace"),
    ("namespace-system", {"teams": [{**A, "namespace": "kube-system"}]}, "tpu-fallback:teams[0].namespace"),
    ("namespace-default", {"teams": [{**A, "namespace": "default"}]}, "tpu-fallback:teams[0].namespace"),
    ("namespace-kueue", {"teams": [{**A, "namespace": stack_kueue.NAMESPACE}]}, "tpu-fallback:teams[0].namespace"),
    ("namespace-gke", {"teams": [{**A, "namespace": "gke-managed-system"}]}, "tpu-fallback:teams[0].namespace"),
    ("group-not-email", {"teams": [{**A, "groups": ["team-a"]}]}, "tpu-fallback:teams[0].groups"),
    ("groups-empty", {"teams": [{**A, "groups": []}]}, "tpu-fallback:teams[0].groups"),
    ("share-negative", {"teams": [{**A, "shares": {"onDemand": -1}}]}, "tpu-fallback:teams[0].shares"),
    ("share-of-a-shared-rung", {"teams": [{**A, "shares": {"flexStart": 1}}]}, "tpu-fallback:teams[0].shares"),
    ("lending-over-share", {"teams": [{**A, "lendingLimit": 2}]}, "tpu-fallback:teams[0].lendingLimit"),
    ("borrowing-not-slices", {"teams": [{**A, "borrowingLimit": "1"}]}, "tpu-fallback:teams[0].borrowingLimit"),
    ("field-typo", {"teams": [{**A, "share": {}}]}, "tpu-fallback:teams[0]"),
    ("not-a-list", {"teams": {"team-a": A}}, "tpu-fallback:teams"),
    ("heads-over-cpu-pool", {"teams": [{**A, "shares": {"onDemand": 1}}], "systemPool": {"nodeCount": 1,
                             "machineType": "n2-standard-2"}}, "tpu-fallback:teams"),
    ("domain-missing", {"teams": [A], "googleGroupsDomain": ""}, "tpu-fallback:googleGroupsDomain"),
    ("domain-without-teams", {"teams": [], "googleGroupsDomain": "example.com"}, "tpu-fallback:googleGroupsDomain"),
    ("domain-malformed", {"teams": [A], "googleGroupsDomain": "gke-security-groups@example.com"},
     "tpu-fallback:googleGroupsDomain"),
]


@pytest.mark.parametrize("overrides, key", [pytest.param(o, k, id=i) for i, o, k in BAD_TEAMS])
def test_a_bad_team_config_is_rejected_by_key_before_any_resource(overrides, key):
    engine = OfflineEngine()
    with pytest.raises(SettingsError) as raised:
        engine.run(config_with({"googleGroupsDomain": "example.com", **overrides}))
    assert any(problem.startswith(f"{key}:") for problem in raised.value.problems), raised.value.problems
    assert engine.recorded == []


def test_every_team_problem_is_reported_in_one_pass():
    with pytest.raises(SettingsError) as raised:
        OfflineEngine().run(config_with({"googleGroupsDomain": "example.com", "teams": [
            {**A, "namespace": "kube-system", "groups": ["x"]}, {**B, "name": "B"}]}))
    named = {problem.split(":", 2)[1] for problem in raised.value.problems}
    assert {"teams[0].namespace", "teams[0].groups", "teams[1].name"} <= named


def test_the_platforms_own_namespaces_are_system_namespaces():
    assert {stack_kueue.NAMESPACE, stack_failover.NAMESPACE, stack_kueue.LOCAL_QUEUE_NAMESPACE} <= SYSTEM_NAMESPACES


def test_the_head_cpu_share_covers_the_default_head_and_kueues_submitter():
    from infra.settings import JOB_HEAD_CPU, JOB_HEAD_MEMORY_GIB
    from workloads.settings import WORKLOAD_DEFAULTS
    # KubeRay's default submitter as Kueue counts it: 500m, 200Mi (rayjob_controller.go L252-263).
    assert JOB_HEAD_CPU >= float(WORKLOAD_DEFAULTS["headCpu"]) + 0.5
    assert JOB_HEAD_MEMORY_GIB >= float(WORKLOAD_DEFAULTS["headMemory"].removesuffix("Gi")) + 200 / 1024


def test_without_teams_there_is_no_team_object_and_no_groups_on_the_cluster():
    plan = plan_for()
    assert not of_kind(plan, "Cohort")
    assert not [key for key in of_kind(plan, "RoleBinding") if key[1].endswith(("-edit", "-rayjob-editor"))]
    assert (None, stack_teams.RAYJOB_EDITOR_ROLE) not in of_kind(plan, "ClusterRole")
    assert (None, stack_teams.STATUS_READER_ROLE) not in of_kind(plan, "ClusterRole")
    assert not [key for key in of_kind(plan, "Role") if key[1] == stack_teams.STATUS_READER_ROLE]
    assert "teams" not in plan.outputs
    cluster = plan.only("gcp:container/cluster:Cluster")
    assert "authenticatorGroupsConfig" not in cluster.inputs


def test_each_team_gets_the_chain_with_the_same_local_queue_names_in_its_namespace():
    plan = plan_for("dev", TWO_TEAMS)
    assert plan.outputs["teams"] == {team["name"]: {
        "namespace": team["namespace"], "localQueue": "user-queue",
        "queueChain": [
            {"flavor": "on-demand", "clusterQueue": f"{team['name']}-cluster-queue", "localQueue": "user-queue"},
            {"flavor": "dws", "clusterQueue": f"{team['name']}-cluster-queue-dws", "localQueue": "user-queue-dws"}]}
        for team in (A, B)}
    local = of_kind(plan, "LocalQueue")
    for team in (A, B):
        assert {name: q["spec"]["clusterQueue"] for (ns, name), q in local.items() if ns == team["namespace"]} == {
            "user-queue": f"{team['name']}-cluster-queue", "user-queue-dws": f"{team['name']}-cluster-queue-dws"}
    # The controller's chain (flavor and LocalQueue per rung) is the same for every team's namespace.
    for team in plan.outputs["teams"].values():
        assert [(r["flavor"], r["localQueue"]) for r in team["queueChain"]] == [
            (r["flavor"], r["localQueue"]) for r in plan.outputs["queueChain"]]


def test_each_teams_queues_admit_its_namespace_only_and_reclaim_without_preempting_otherwise():
    queues = of_kind(plan_for("dev", TWO_TEAMS), "ClusterQueue")
    for team in (A, B):
        for name in (f"{team['name']}-cluster-queue", f"{team['name']}-cluster-queue-dws"):
            spec = queues[(None, name)]["spec"]
            assert spec["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": team["namespace"]}}
            assert spec["cohortName"] == team["name"]
            assert spec["preemption"] == {"reclaimWithinCohort": "Any", "withinClusterQueue": "Never",
                                          "borrowWithinCohort": {"policy": "Never"}}
        # The first rung takes the team's shares in ladder order (a lent one reclaimed before a lower rung), and
        # borrows only when none serves (the tier proves it: test_teams_controlplane).
        first = queues[(None, f"{team['name']}-cluster-queue")]["spec"]
        assert first["flavorFungibility"] == {"whenCanBorrow": "TryNextFlavor", "whenCanPreempt": "MayStopSearch"}
        assert "flavorFungibility" not in queues[(None, f"{team['name']}-cluster-queue-dws")]["spec"]


def test_with_teams_a_tpu_flavor_is_never_given_to_a_ray_head():
    """A first rung that weighs every flavor would give a head whose team's head CPU is in use the idle CPU of a
    TPU share (measured on the tier): each TPU flavor declares GKE's TPU taint, which the jobs' TPU pods tolerate
    and their heads do not. Without teams nothing changes."""
    taint = {"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}
    plan = plan_for(STACK)
    flavors = {name: f["spec"] for (_, name), f in of_kind(plan, "ResourceFlavor").items()}
    assert set(flavors) == {"default-cpu", "reservation", "on-demand", "spot", "dws"}
    assert {name: spec.get("nodeTaints") for name, spec in flavors.items()} == {
        "default-cpu": None, "reservation": [taint], "on-demand": [taint], "spot": [taint], "dws": [taint]}
    for name, spec in of_kind(plan_for("dev", TWO_TEAMS), "ResourceFlavor").items():
        assert spec["spec"].get("nodeTaints") == (None if name[1] == "default-cpu" else [taint])
    assert all("nodeTaints" not in f["spec"] for f in of_kind(plan_for(), "ResourceFlavor").values())
    # The stack's own jobs: TPU pods tolerate the taint, the head does not (Kueue checks the pod templates).
    (job, *_) = [m for m in plan_for().kubernetes_manifests() if m["kind"] == "RayJob"]
    cluster = job["spec"]["rayClusterSpec"]
    (worker,) = cluster["workerGroupSpecs"]
    assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in worker["template"]["spec"][
        "tolerations"]
    assert not cluster["headGroupSpec"]["template"]["spec"].get("tolerations")


def test_shares_sit_on_the_first_rung_with_the_heads_cpu_never_lent_and_the_rest_on_the_root():
    plan = plan_for("dev", TWO_TEAMS)
    queues, cohorts = of_kind(plan, "ClusterQueue"), of_kind(plan, "Cohort")
    a_first = {f["name"]: f for f in queues[(None, "team-a-cluster-queue")]["spec"]["resourceGroups"][0]["flavors"]}
    assert tpu(a_first["on-demand"]) == "16" and tpu(a_first["dws"]) == "0"
    assert [(r["name"], r["nominalQuota"], r.get("lendingLimit")) for r in a_first["default-cpu"]["resources"]] == [
        ("cpu", "3", "0"), ("memory", "5Gi", "0"), ("google.com/tpu", "0", None)]
    root = {f["name"]: f for f in cohorts[(None, "tpu-fallback")]["spec"]["resourceGroups"][0]["flavors"]}
    assert "parentName" not in cohorts[(None, "tpu-fallback")]["spec"]
    assert tpu(root["on-demand"]) == "0" and tpu(root["dws"]) == "16"  # on-demand is A's; DWS shared whole
    assert [r["nominalQuota"] for r in root["default-cpu"]["resources"][:2]] == ["45", "187Gi"]
    # B's Cohort holds no quota (a share on a Cohort is never reclaimed), only its borrowing limit.
    b = cohorts[(None, "team-b")]["spec"]
    assert b["parentName"] == "tpu-fallback"
    for flavor in b["resourceGroups"][0]["flavors"]:
        assert {r["nominalQuota"] for r in flavor["resources"]} == {"0"}
        limits = {r["name"]: r.get("borrowingLimit") for r in flavor["resources"]}
        assert limits == {"cpu": None, "memory": None, "google.com/tpu": None if flavor["name"] == "default-cpu"
                          else "16"}
    assert cohorts[(None, "team-a")]["spec"] == {"parentName": "tpu-fallback"}
    # The platform's own chain holds nothing now: it borrows what the teams leave.
    for (_, name), queue in queues.items():
        if not name.startswith("team-"):
            assert {r["nominalQuota"] for f in queue["spec"]["resourceGroups"][0]["flavors"]
                    for r in f["resources"]} == {"0"}, name


def test_a_lending_limit_keeps_part_of_the_share():
    plan = plan_for("dev", {**TWO_TEAMS, "teams": [{**A, "lendingLimit": 0}, B]})
    first = of_kind(plan, "ClusterQueue")[(None, "team-a-cluster-queue")]["spec"]["resourceGroups"][0]["flavors"]
    on_demand = next(f for f in first if f["name"] == "on-demand")
    assert {r["name"]: r.get("lendingLimit") for r in on_demand["resources"]} == {
        "cpu": None, "memory": None, "google.com/tpu": "0"}


def test_each_teams_groups_edit_its_namespace_only_and_the_cluster_reads_google_groups():
    plan = plan_for("dev", TWO_TEAMS)
    bindings = {key: b for key, b in of_kind(plan, "RoleBinding").items() if b["roleRef"]["name"] == "edit"}
    assert set(bindings) == {("team-a", "team-a-edit"), ("team-b", "team-b-edit")}
    binding = bindings[("team-a", "team-a-edit")]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"}
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                                    "name": "a@example.com"}]
    namespaces = {name for (_, name) in of_kind(plan, "Namespace")}
    assert {"team-a", "team-b"} <= namespaces
    cluster = plan.only("gcp:container/cluster:Cluster")
    assert cluster.inputs["authenticatorGroupsConfig"] == {"securityGroup": "gke-security-groups@example.com"}


def test_each_teams_groups_manage_rayjobs_in_its_namespace_through_one_platform_role():
    """`edit` grants no RayJob create (Kueue's chart aggregates only its viewer roles, KubeRay's nothing): one
    ClusterRole with exactly what a job needs, bound per team namespace next to `edit`. Proved on a real RBAC
    authorizer in tests/test_teams_controlplane.py."""
    plan = plan_for("dev", {**TWO_TEAMS, "teams": [A, {**B, "groups": ["b@example.com", "b-oncall@example.com"]}]})
    roles = {name: r for (_, name), r in of_kind(plan, "ClusterRole").items()
             if name == stack_teams.RAYJOB_EDITOR_ROLE}
    assert set(roles) == {"tpu-fallback-rayjob-editor"}
    assert roles["tpu-fallback-rayjob-editor"]["rules"] == [
        {"apiGroups": ["ray.io"], "resources": ["rayjobs"],
         "verbs": ["create", "update", "patch", "delete", "get", "list", "watch"]},
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["events", "pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
        {"apiGroups": ["autoscaling.x-k8s.io"], "resources": ["provisioningrequests"],
         "verbs": ["get", "list", "watch"]}]
    assert "aggregationRule" not in roles["tpu-fallback-rayjob-editor"]
    assert not (roles["tpu-fallback-rayjob-editor"]["metadata"].get("labels") or {})  # aggregated into nothing
    bindings = {key: b for key, b in of_kind(plan, "RoleBinding").items()
                if b["roleRef"]["name"] == stack_teams.RAYJOB_EDITOR_ROLE}
    assert set(bindings) == {("team-a", "team-a-rayjob-editor"), ("team-b", "team-b-rayjob-editor")}
    assert bindings[("team-b", "team-b-rayjob-editor")]["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "tpu-fallback-rayjob-editor"}
    assert [s["name"] for s in bindings[("team-b", "team-b-rayjob-editor")]["subjects"]] == [
        "b@example.com", "b-oncall@example.com"]
    assert {s["kind"] for b in bindings.values() for s in b["subjects"]} == {"Group"}
    # The binding waits for its namespace and the role.
    binding = plan.named("teams-team-a-rayjob-editor")
    waits_for = {plan.by_urn()[urn].name for urn in plan.ancestors_and_dependencies(binding) if urn in plan.by_urn()}
    assert {"teams-rayjob-editor", "teams-team-a-namespace"} <= waits_for


def status_reads() -> dict[tuple[str | None, str], list[tuple]]:
    """Every read `ops status` makes outside a team's namespace, as (API group, resource, verb, name or None), by
    (namespace or None for cluster scope, what it reads): from ops/status/snapshot.py's own constants."""
    from ops.status import snapshot as snap

    def group(kind: tuple[str, str]) -> str:
        return kind[0].rpartition("/")[0]

    cluster = {kind: (group(kind), snap.plural(kind[1]).lower(), "list", None)
               for kind in (snap.CLUSTER_QUEUE, snap.COHORT, snap.RESOURCE_FLAVOR, snap.ADMISSION_CHECK, snap.NODE)}
    return {(None, "cluster"): list(cluster.values()),
            (stack_failover.NAMESPACE, "controller"): [("apps", "deployments", "get", stack_failover.NAME),
                                                       ("", "pods", "list", None)],
            (stack_kueue.NAMESPACE, "kueue"): [("", "configmaps", "get", stack_kueue.MANAGER_CONFIG_MAP)]}


def grants(rules: list[dict]) -> set[tuple]:
    return {(g, r, v, n) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"] for n in rule.get("resourceNames") or [None]}


def test_each_teams_groups_read_exactly_what_ops_status_reads_outside_their_namespace():
    """Without these a team member's `ops status` had ten PROBLEMS lines. Per platform: one ClusterRole of
    cluster-scoped kinds only (its ClusterRoleBinding then opens no namespace), a Role in the controller's namespace
    and one in Kueue's (gets by name where status gets by name); per team, bindings of its groups. Nothing of a
    fleet's (a platform with teams is never a manager). Proved on a real RBAC authorizer, with the team member's
    `ops status`, in tests/test_teams_controlplane.py."""
    plan = plan_for("dev", {**TWO_TEAMS, "teams": [A, {**B, "groups": ["b@example.com", "b-oncall@example.com"]}]})
    reads = status_reads()
    (cluster_role,) = [r for (_, name), r in of_kind(plan, "ClusterRole").items()
                       if name == stack_teams.STATUS_READER_ROLE]
    assert grants(cluster_role["rules"]) == set(reads[(None, "cluster")])
    assert "aggregationRule" not in cluster_role and not (cluster_role["metadata"].get("labels") or {})
    roles = {namespace: r for (namespace, name), r in of_kind(plan, "Role").items()
             if name == stack_teams.STATUS_READER_ROLE}
    assert set(roles) == {stack_failover.NAMESPACE, stack_kueue.NAMESPACE}
    for (namespace, _), wanted in reads.items():
        if namespace is not None:
            assert grants(roles[namespace]["rules"]) == set(wanted), namespace
    every = [rule for role in (cluster_role, *roles.values()) for rule in role["rules"]]
    assert not {"secrets", "multikueueclusters", "workloads", "rayjobs"} & {r for rule in every
                                                                           for r in rule["resources"]}
    assert {verb for rule in every for verb in rule["verbs"]} == {"get", "list"}

    subjects = {"team-a": ["a@example.com"], "team-b": ["b@example.com", "b-oncall@example.com"]}
    cluster_bindings = {name: b for (_, name), b in of_kind(plan, "ClusterRoleBinding").items()
                        if b["roleRef"]["name"] == stack_teams.STATUS_READER_ROLE}
    assert set(cluster_bindings) == {"team-a-status-reader", "team-b-status-reader"}
    bindings = {key: b for key, b in of_kind(plan, "RoleBinding").items()
                if b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                    "name": stack_teams.STATUS_READER_ROLE}}
    assert set(bindings) == {(namespace, f"{team}-status-reader") for team in subjects
                             for namespace in (stack_failover.NAMESPACE, stack_kueue.NAMESPACE)}
    for team, groups in subjects.items():
        for binding in (cluster_bindings[f"{team}-status-reader"],
                        *(b for (_, name), b in bindings.items() if name == f"{team}-status-reader")):
            assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}
                                           for group in groups]
    assert cluster_bindings["team-a-status-reader"]["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": stack_teams.STATUS_READER_ROLE}
    # Each Role waits for its namespace (the controller's, Kueue's release), each binding for its role.
    waits_for = {name: {plan.by_urn()[urn].name for urn in plan.ancestors_and_dependencies(plan.named(name))
                        if urn in plan.by_urn()}
                 for name in ("teams-status-reader-controller", "teams-status-reader-kueue",
                              "teams-team-a-status-reader", "teams-team-b-status-reader-controller")}
    assert "failover-namespace" in waits_for["teams-status-reader-controller"]
    assert "kueue-release" in waits_for["teams-status-reader-kueue"]
    assert "teams-status-reader" in waits_for["teams-team-a-status-reader"]
    assert "teams-status-reader-controller" in waits_for["teams-team-b-status-reader-controller"]


def test_a_one_rung_platform_has_no_controller_and_so_no_status_role_in_its_namespace():
    plan = plan_for("dev", {**TWO_TEAMS, "flexStart": {"maxSlices": 0}})
    assert not [m for m in plan.kubernetes_manifests() if m["metadata"].get("namespace") == stack_failover.NAMESPACE]
    roles = {key for key, r in of_kind(plan, "Role").items() if key[1] == stack_teams.STATUS_READER_ROLE}
    assert roles == {(stack_kueue.NAMESPACE, stack_teams.STATUS_READER_ROLE)}


def test_the_example_platform_stack_plans_three_teams():
    plan = plan_for(STACK)
    assert set(plan.outputs["teams"]) == {"research", "prod", "interns"}
    assert [r["flavor"] for r in plan.outputs["teams"]["prod"]["queueChain"]] == [
        "reservation", "on-demand", "spot", "dws"]
    assert len(of_kind(plan, "Cohort")) == 4
    assert stack_teams.TEAM_CLUSTER_ROLE == "edit"


def test_a_platform_may_prefer_a_free_share_to_a_reclaim_and_says_so_with_teams_only():
    """`teamShareOrder: freeFirst`: the other trade (fewer restarts of borrowers, more cost), explicit."""
    plan = plan_for("platform-us-east5-b", {"teamShareOrder": "freeFirst"})
    first = [m for m in plan.kubernetes_manifests() if m["kind"] == "ClusterQueue"
             and m["metadata"]["name"].endswith("-cluster-queue") and "flavorFungibility" in m["spec"]]
    assert first and all(m["spec"]["flavorFungibility"]["whenCanPreempt"] == "TryNextFlavor" for m in first)
    with pytest.raises(SettingsError) as failure:
        plan_for("platform-us-east5-b", {"teamShareOrder": "cheapest"})
    assert "tpu-fallback:teamShareOrder: 'cheapest' is not a share order; use ladder or freeFirst" in str(failure.value)
    with pytest.raises(SettingsError, match="tpu-fallback:teamShareOrder: set only with teams"):
        plan_for("dev", {"teamShareOrder": "freeFirst"})
