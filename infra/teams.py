"""Several teams on one platform: per team a namespace, its chain of queues with its guaranteed share, and its
groups' access; the root Cohort holds what no team is guaranteed (Spot, DWS, what is left of the rest).

Where the quota sits decides whether a team can take its share back. Measured on real Kueue 0.19.2 (the teams tier,
tests/test_teams_controlplane.py; docs/teams.md): a share on a Cohort is never reclaimed, and a job that borrows
anything (the Ray head's CPU included) cannot reclaim. So each share, its heads' CPU included, is nominal quota on the
team's first-rung ClusterQueue, and that queue takes its own shares in the ladder's order, reclaiming a lent one
before going down a rung, and anyone else's only when none of its own can serve (FIRST_RUNG_FUNGIBILITY;
`teamShareOrder: freeFirst` prefers a free share on any rung to a reclaim).

Why a DWS (or Spot) job that has its slice is never preempted, the three ways Kueue preempts:
- reclaim: the victim must use a flavor-resource the preemptor lacks, in a queue over its nominal quota (Ref:
  https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/scheduler/preemption/classical/hierarchical_preemption.go
  L81-207). A reclaim is only ever for a guaranteed flavor (no queue has nominal DWS or Spot quota) or default-cpu,
  and a team's default-cpu has `lendingLimit: 0`: nobody else ever holds it, so nobody is reclaimed for it. A DWS
  job uses dws and default-cpu only, so it never qualifies;
- borrowWithinCohort: Never, everywhere;
- withinClusterQueue: Never, everywhere (a team's own jobs never preempt each other).
Only a guaranteed-flavor job that borrows another team's share can be preempted, which is what a share means.

Which job goes, among the borrowers (Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/scheduler/
preemption/common/ordering.go L35-83 and preemption/classical/candidate_generator.go L136-157): a job is a candidate only while its ClusterQueue, and its team's Cohort,
hold more than their nominal quota of the flavor needed (checked again after each victim, so a team never falls
below its share); then lower priority first, then the job whose quota was reserved last (QuotaReserved's
lastTransitionTime, whole seconds), then by UID. A team's own share is taken first, so a job beyond its share is the
team's last one on that flavor; two reserved within one second are equal to Kueue (quota is per queue, not per job).
"""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_kubernetes as k8s

from failover.api import TPU_RESOURCE
from infra import failover as fo
from infra import kueue as kq
from infra.kueue import DEFAULT_FLAVOR, MANAGER_CONFIG_MAP, QueueRung, queue_chain
from infra.settings import (GUARANTEED_RUNGS, JOB_HEAD_CPU, JOB_HEAD_MEMORY_GIB, SHARE_ORDER_FREE_FIRST,
                            SHARE_ORDER_LADDER, PlatformSettings, TeamSettings)

COHORT_KIND = "Cohort"
NAMESPACE_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every namespace
# The team's groups deploy and manage workloads in their namespace, nothing else (no RBAC, no quota).
# Ref: https://kubernetes.io/docs/reference/access-authn-authz/rbac/#user-facing-roles
TEAM_CLUSTER_ROLE = "edit"
# `edit` does not cover RayJobs: Kueue 0.19.2's chart aggregates only its *viewer* roles into view/edit/admin
# (rayjob, workload, localqueue, ...: get/list/watch), never its editor roles; KubeRay's chart aggregates nothing
# (its rayjob-editor-role carries no aggregate-to-* label; ray-project/kuberay#1641 and #3193 still open). So the
# platform declares this role once, with exactly what a team member's job needs, and binds it per team namespace
# next to `edit`. A role of our own, not an aggregate-to-edit label: that would widen `edit` in every namespace of
# the cluster; not Kueue's batch-user role: it carries every job framework's editor and follows the release name.
# Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/charts/kueue/templates/rbac/rayjob_viewer_role.yaml
# Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/charts/kueue/templates/rbac/rayjob_editor_role.yaml
# Ref: https://github.com/ray-project/kuberay/blob/master/helm-chart/kuberay-operator/templates/ray_rayjob_editor_role.yaml
# Ref: https://github.com/ray-project/kuberay/issues/1641, https://github.com/ray-project/kuberay/pull/3193
RAYJOB_EDITOR_ROLE = "tpu-fallback-rayjob-editor"
READ = ("get", "list", "watch")
RAYJOB_EDITOR_RULES = (
    {"apiGroups": ["ray.io"], "resources": ["rayjobs"],
     "verbs": ["create", "update", "patch", "delete", *READ]},
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": list(READ)},  # where the job is queued
    {"apiGroups": [""], "resources": ["events", "pods"], "verbs": list(READ)},  # Kueue's, the controller's, KubeRay's
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},  # kubectl logs (-f too)
    # Whether DWS has its slice: Kueue's ProvisioningRequests for the team's jobs (`ops status` lists them; no chart
    # aggregates them into `edit` or `view`).
    {"apiGroups": ["autoscaling.x-k8s.io"], "resources": ["provisioningrequests"], "verbs": list(READ)},
)
# What `ops status` reads outside the team's namespace (ops/status/snapshot.py ClusterReader.read), and nothing more:
# without it a team member's status had ten PROBLEMS lines. Verbs as the code calls them: it lists, or gets by name.
# - The cluster-scoped objects the ladder and quota are read from, and the Nodes its jobs' pods run on (the node pool
#   column): a ClusterRole with only cluster-scoped kinds, so its ClusterRoleBinding grants nothing in any namespace.
# - The failover controller's health: its Deployment by name and its pods (listed by the Deployment's selector: list
#   cannot be limited by name) in tpu-fallback-system, a Role there.
# - Kueue's manager ConfigMap by name (the pods-ready timeout), a Role in kueue-system.
# Not the fleet's objects (MultiKueueClusters, the fleet watch's and ladder's Deployments): a platform with teams is
# never a fleet's manager, and status asks for them only where a MultiKueue AdmissionCheck says there is a fleet.
# Secrets, other ConfigMaps and Deployments, and every other namespace stay closed.
STATUS_READER_ROLE = "tpu-fallback-status-reader"
STATUS_CLUSTER_RULES = (
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["clusterqueues", "cohorts", "resourceflavors", "admissionchecks"],
     "verbs": ["list"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]},
)
STATUS_CONTROLLER_RULES = (
    {"apiGroups": ["apps"], "resources": ["deployments"], "resourceNames": [fo.NAME], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
)
STATUS_KUEUE_RULES = (
    {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [MANAGER_CONFIG_MAP], "verbs": ["get"]},
)
PREEMPTION = {
    # A team takes back its share from any borrower, whatever the priority.
    "reclaimWithinCohort": "Any",
    "withinClusterQueue": "Never",
    "borrowWithinCohort": {"policy": "Never"},
}
# The first rung walks the flavors in the ladder's order and takes the team's own shares in that order: a free share
# stops the search (a fit without borrowing always does), and so does a lent one it can reclaim (whenCanPreempt:
# MayStopSearch), before any lower rung; only when no share of its own can serve the job does it borrow, the
# earliest flavor in ladder order (measured on the tier). A reserved slice is paid for whether used or not, and the
# borrower knew it borrowed.
# - MayStopSearch for borrowing (Kueue's default) stopped at the first flavor that fits by borrowing: a team whose
#   share is on-demand only took another team's idle reservation, and was preempted as soon as its owner came
#   (measured on the tier: evicted 0.2 s after the owner's job was created, re-admitted on its own on-demand share).
# - whenCanPreempt TryNextFlavor (`teamShareOrder: freeFirst`) weighs a reclaim against the later flavors: with
#   PreemptionOverBorrowing a free share of the team's on a lower rung (distance 0, a fit) beats reclaiming its lent
#   reservation (distance 0, a preemption), so the borrower keeps running and the team pays for on-demand
#   (measured on the tier); with the default preference (BorrowingOverPreemption) a fit on DWS beat reclaiming the
#   share (measured: no reclaim).
# Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/scheduler/flavorassigner/flavorassigner.go#L534-L575
# Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/scheduler/flavorassigner/flavorassigner.go#L1170-L1276
# Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/scheduler/preemption/classical/hierarchical_preemption.go#L217-L234
# Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/apis/kueue/v1beta2/clusterqueue_types.go#L453-L494
FIRST_RUNG_FUNGIBILITY = {
    # No `preference`: Kueue accepts one only when both are TryNextFlavor (its CEL rule, seen on the tier).
    SHARE_ORDER_LADDER: {"whenCanBorrow": "TryNextFlavor", "whenCanPreempt": "MayStopSearch"},
    SHARE_ORDER_FREE_FIRST: {"whenCanBorrow": "TryNextFlavor", "whenCanPreempt": "TryNextFlavor",
                             "preference": "PreemptionOverBorrowing"},
}


def team_chain(settings: PlatformSettings, team: TeamSettings) -> tuple[QueueRung, ...]:
    """The single-team chain with the team's ClusterQueues: the LocalQueue names stay, so the failover controller's
    chain (flavor and LocalQueue per rung) applies in every team's namespace unchanged."""
    return tuple(QueueRung(rung.flavor, f"{team.name}-{rung.cluster_queue}", rung.local_queue)
                 for rung in queue_chain(settings))


def _slice_quota(settings: PlatformSettings, flavor: str, slices: int) -> dict:
    tpu = settings.tpu
    hosts = slices * tpu.hosts
    return kq.flavor_quota(flavor, hosts * tpu.machine_type.vcpus, hosts * tpu.machine_type.memory_gib, slices * tpu.chips)


def _head_quota(slices: int) -> dict:
    return kq.flavor_quota(DEFAULT_FLAVOR, slices * JOB_HEAD_CPU, slices * JOB_HEAD_MEMORY_GIB, 0)


def _set_limit(quota: dict, field: str, resources: Sequence[str], value: str) -> dict:
    for resource in quota["resources"]:
        if resource["name"] in resources:
            resource[field] = value
    return quota


def team_share_quotas(settings: PlatformSettings, team: TeamSettings) -> list[dict]:
    """The first rung's flavors with the team's share: its heads' CPU (never lent), each guaranteed rung's slices
    (lent up to lendingLimit), nothing of the shared rungs."""
    shares = {settings.plan(key).flavor: team.share(key) for key in GUARANTEED_RUNGS if settings.plan(key)}
    head = _set_limit(_head_quota(team.guaranteed_slices), "lendingLimit", ("cpu", "memory"), "0")
    quotas = [head]
    for rung in queue_chain(settings):
        slices = shares.get(rung.flavor, 0)
        quota = _slice_quota(settings, rung.flavor, slices) if slices else kq.no_quota(rung.flavor)
        if slices and team.lending_limit is not None:
            _set_limit(quota, "lendingLimit", (TPU_RESOURCE,), str(team.lending_limit * settings.tpu.chips))
        quotas.append(quota)
    return quotas


def root_quotas(settings: PlatformSettings) -> list[dict]:
    """Every flavor's capacity less the teams' shares: Spot and DWS whole, first come, first served."""
    shares = {settings.plan(key).flavor: sum(t.share(key) for t in settings.teams)
              for key in GUARANTEED_RUNGS if settings.plan(key)}
    heads = _head_quota(sum(team.guaranteed_slices for team in settings.teams))
    left = []
    for quota in kq.flavor_quotas(settings):
        taken = heads if quota["name"] == DEFAULT_FLAVOR else _slice_quota(settings, quota["name"],
                                                                            shares.get(quota["name"], 0))
        left.append({"name": quota["name"], "resources": [
            {"name": have["name"], "nominalQuota": _minus(have["nominalQuota"], used["nominalQuota"])}
            for have, used in zip(quota["resources"], taken["resources"])]})
    return left


def _minus(have: str, used: str) -> str:
    unit = "Gi" if have.endswith("Gi") else ""
    left = int(have.removesuffix(unit)) - int(used.removesuffix(unit))
    return f"{left}{unit}" if left else "0"  # as kq._no_quota writes a zero


def _resource_groups(flavors: list[dict]) -> list[dict]:
    return [{"coveredResources": list(kq.COVERED_RESOURCES), "flavors": flavors}]


def root_cohort(settings: PlatformSettings) -> dict:
    # A Cohort without parentName is a root; its quota is shared by every queue below it.
    # Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/apis/kueue/v1beta2/cohort_types.go#L24-L72
    return kq._manifest(COHORT_KIND, kq.COHORT, {"resourceGroups": _resource_groups(root_quotas(settings))})


def team_cohort(settings: PlatformSettings, team: TeamSettings) -> dict:
    """The team's Cohort under the root: no quota (a share held here would never be reclaimed), only the team-wide
    borrowingLimit: on each rung, at most that many slices beyond what its queues hold."""
    spec: dict = {"parentName": kq.COHORT}
    if team.borrowing_limit is not None:
        chips = str(team.borrowing_limit * settings.tpu.chips)
        flavors = [kq.no_quota(DEFAULT_FLAVOR)] + [
            _set_limit(kq.no_quota(rung.flavor), "borrowingLimit", (TPU_RESOURCE,), chips)
            for rung in queue_chain(settings)]
        spec["resourceGroups"] = _resource_groups(flavors)
    return kq._manifest(COHORT_KIND, team.name, spec)


def team_cluster_queues(settings: PlatformSettings, team: TeamSettings) -> list[dict]:
    """The team's chain: the share on the first rung, every lower rung at 0 (it borrows), each queue open to the
    team's namespace only, in the team's Cohort."""
    rungs = team_chain(settings, team)
    share = team_share_quotas(settings, team)
    queues = []
    for index, rung in enumerate(rungs):
        flavors = share if index == 0 else [kq.no_quota(name) for name in
                                            (DEFAULT_FLAVOR, *(lower.flavor for lower in rungs[index:]))]
        manifest = kq._cluster_queue(settings, rung.cluster_queue, flavors, in_cohort=True)
        spec = manifest["spec"]
        spec["cohortName"] = team.name
        spec["namespaceSelector"] = {"matchLabels": {NAMESPACE_LABEL: team.namespace}}
        spec["preemption"] = {**PREEMPTION, "borrowWithinCohort": dict(PREEMPTION["borrowWithinCohort"])}
        if index == 0:
            spec["flavorFungibility"] = dict(FIRST_RUNG_FUNGIBILITY[settings.team_share_order])
        queues.append(manifest)
    return queues


def team_local_queues(settings: PlatformSettings, team: TeamSettings) -> list[dict]:
    return [kq._manifest("LocalQueue", rung.local_queue, {"clusterQueue": rung.cluster_queue},
                         namespace=team.namespace) for rung in team_chain(settings, team)]


def rayjob_editor_role() -> dict:
    """The one ClusterRole every team's RayJob binding names; it grants nothing until a RoleBinding scopes it."""
    return {"metadata": {"name": RAYJOB_EDITOR_ROLE}, "rules": [dict(rule) for rule in RAYJOB_EDITOR_RULES]}


def _group_subjects(team: TeamSettings) -> list[dict]:
    return [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group} for group in team.groups]


def role_binding(team: TeamSettings, cluster_role: str = TEAM_CLUSTER_ROLE, suffix: str = "edit") -> dict:
    """The team's Google groups get a ClusterRole in its namespace only (GKE Google Groups for RBAC: kind Group,
    the email)."""
    return {
        "metadata": {"name": f"{team.name}-{suffix}", "namespace": team.namespace},
        "role_ref": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
        "subjects": _group_subjects(team),
    }


def rayjob_editor_binding(team: TeamSettings) -> dict:
    return role_binding(team, RAYJOB_EDITOR_ROLE, "rayjob-editor")


def _rules(rules: Sequence[dict]) -> list[dict]:
    return [{key: list(value) for key, value in rule.items()} for rule in rules]


def status_reader_cluster_role() -> dict:
    """The cluster-scoped objects `ops status` lists; bound per team by status_reader_cluster_binding."""
    return {"metadata": {"name": STATUS_READER_ROLE}, "rules": _rules(STATUS_CLUSTER_RULES)}


def status_reader_role(namespace: str) -> dict:
    """What `ops status` reads in a platform namespace: the controller's health, or Kueue's manager ConfigMap."""
    rules = {fo.NAMESPACE: STATUS_CONTROLLER_RULES, kq.NAMESPACE: STATUS_KUEUE_RULES}[namespace]
    return {"metadata": {"name": STATUS_READER_ROLE, "namespace": namespace}, "rules": _rules(rules)}


def status_reader_cluster_binding(team: TeamSettings) -> dict:
    return {"metadata": {"name": f"{team.name}-status-reader"},
            "role_ref": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": STATUS_READER_ROLE},
            "subjects": _group_subjects(team)}


def status_reader_binding(team: TeamSettings, namespace: str) -> dict:
    """The team's groups get the namespace's status Role (a Role, not a ClusterRole: it names its namespace)."""
    return {"metadata": {"name": f"{team.name}-status-reader", "namespace": namespace},
            "role_ref": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": STATUS_READER_ROLE},
            "subjects": _group_subjects(team)}


def teams_output(settings: PlatformSettings) -> dict:
    """Per team, what its stack needs: {name: {namespace, localQueue, queueChain}} (plain data)."""
    return {team.name: {"namespace": team.namespace,
                        "localQueue": team_chain(settings, team)[0].local_queue,
                        "queueChain": [rung.as_output() for rung in team_chain(settings, team)]}
            for team in settings.teams}


class Teams(pulumi.ComponentResource):
    """The root Cohort, the RayJob editor ClusterRole and the status reader's roles, and per team its namespace,
    Cohort, chain of ClusterQueues, LocalQueues and bindings. Nothing at all without teams. `failover`: the platform's
    failover controller (None with a one-rung ladder), whose namespace the status Role lives in."""

    output: dict

    def __init__(self, name: str, settings: PlatformSettings, kueue: kq.Kueue, provider: k8s.Provider,
                 failover: fo.FailoverController | None = None, opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpu-fallback:infra:Teams", name, None, opts)
        self._name, self._provider = name, provider
        # After the platform's queues, which wait for Kueue, the flavors and the DWS check.
        self._after = [kueue.release, *kueue.cluster_queues.values()]
        self.output = teams_output(settings)
        self._rayjob_editor = None
        self._status_roles: dict[str | None, pulumi.Resource] = {}
        if settings.teams:
            self._object(root_cohort(settings))
            child = pulumi.ResourceOptions(parent=self, provider=provider)
            self._rayjob_editor = k8s.rbac.v1.ClusterRole(f"{name}-rayjob-editor", **rayjob_editor_role(), opts=child)
            self._status_roles[None] = k8s.rbac.v1.ClusterRole(f"{name}-status-reader",
                                                                **status_reader_cluster_role(), opts=child)
            # Kueue's namespace comes with its release; the controller's with the controller.
            homes = {kq.NAMESPACE: ("kueue", [kueue.release])}
            if failover is not None:
                homes[fo.NAMESPACE] = ("controller", [failover.namespace])
            for namespace, (suffix, after) in homes.items():
                self._status_roles[namespace] = k8s.rbac.v1.Role(
                    f"{name}-status-reader-{suffix}", **status_reader_role(namespace),
                    opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=after)))
        for team in settings.teams:
            self._team(settings, team)
        self.register_outputs({"teams": self.output})

    def _team(self, settings: PlatformSettings, team: TeamSettings) -> None:
        child = pulumi.ResourceOptions(parent=self, provider=self._provider)
        namespace = k8s.core.v1.Namespace(f"{self._name}-{team.name}-namespace",
                                          metadata={"name": team.namespace}, opts=child)
        in_namespace = pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[namespace]))
        k8s.rbac.v1.RoleBinding(f"{self._name}-{team.name}-role", **role_binding(team), opts=in_namespace)
        k8s.rbac.v1.RoleBinding(f"{self._name}-{team.name}-rayjob-editor", **rayjob_editor_binding(team),
                                opts=pulumi.ResourceOptions.merge(in_namespace, pulumi.ResourceOptions(
                                    depends_on=[self._rayjob_editor])))
        self._status_bindings(team)
        cohort = self._object(team_cohort(settings, team))
        queues = {m["metadata"]["name"]: self._object(m, after=[cohort])
                  for m in team_cluster_queues(settings, team)}
        for manifest in team_local_queues(settings, team):
            self._object(manifest, after=[namespace, queues[manifest["spec"]["clusterQueue"]]])

    def _status_bindings(self, team: TeamSettings) -> None:
        """What `ops status` reads outside the team's namespace (STATUS_*_RULES), for the team's groups."""
        for namespace, role in self._status_roles.items():
            after = pulumi.ResourceOptions(parent=self, provider=self._provider, depends_on=[role])
            if namespace is None:
                k8s.rbac.v1.ClusterRoleBinding(f"{self._name}-{team.name}-status-reader",
                                               **status_reader_cluster_binding(team), opts=after)
            else:
                suffix = "controller" if namespace == fo.NAMESPACE else "kueue"
                k8s.rbac.v1.RoleBinding(f"{self._name}-{team.name}-status-reader-{suffix}",
                                        **status_reader_binding(team, namespace), opts=after)

    def _object(self, manifest: dict, after: Sequence[pulumi.Resource] = ()) -> k8s.apiextensions.CustomResource:
        meta = manifest["metadata"]
        where = f"{meta['namespace']}-" if "namespace" in meta else ""
        return k8s.apiextensions.CustomResource(
            f"{self._name}-{manifest['kind'].lower()}-{where}{meta['name']}",
            api_version=manifest["apiVersion"], kind=manifest["kind"], metadata=meta, spec=manifest["spec"],
            opts=pulumi.ResourceOptions(parent=self, provider=self._provider, depends_on=[*self._after, *after]))
