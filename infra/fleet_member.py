"""A regional platform stack as a member of a MultiKueue fleet (plan C): what the fleet's manager cluster needs here.

- the fleet's LocalQueue, in the fleet's own namespace, pointing at the queue where a fleet job starts in this region
  (the DWS rung by default: admitted only once a slice is provisioned, so the first region with TPUs wins);
- a ClusterRole with exactly the RBAC MultiKueue uses in a worker, which the fleet stack binds to its manager's Google
  service account (roles/fleet.py): no ServiceAccount token, nothing long-lived leaves this cluster;
- with `fleetMember.rungs`, per rung the fleet may use here one member at a time (the fleet's ladder, README "The
  fleet's ladder"): a ClusterQueue holding only that rung's flavor (and default-cpu for the Ray head), with no quota
  of its own, borrowing the rung's capacity from the region's cohort, so a fleet job there can never fall through
  to another rung nor take what the region's own jobs hold; and its LocalQueue `fleet-<flavor>-<this stack>`, the
  name of the fleet's step (MultiKueue copies the manager's queue name verbatim);
- where the manager reaches this cluster (`fleetMember.access`: its endpoint and CA, neither secret); the manager's
  renewer writes them with a short-lived token into the kubeconfig Secret MultiKueue reads (failover/credentials.py).

Ref: https://kueue.sigs.k8s.io/docs/tasks/manage/setup_multikueue/ (kubeconfig rules, the worker's RBAC) and
https://kueue.sigs.k8s.io/docs/concepts/multikueue/ (dispatch), for Kueue 0.19.2.
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from failover.api import MULTIKUEUE_ORIGIN_LABEL
from failover.ladder.decisions import WORKLOAD_GIVE_UP_ANNOTATION, WORKLOAD_MOVE_ANNOTATION
from infra.kueue import COHORT, COVERED_RESOURCES, DEFAULT_FLAVOR, KUEUE_API_VERSION, Kueue, no_quota, queue_chain
from infra.settings import PlanSettings, PlatformSettings

# The fleet's jobs live in a namespace of their own on the manager and on every member: a MultiKueue worker needs
# the manager's namespace and LocalQueue name (Ref: https://kueue.sigs.k8s.io/docs/tasks/manage/setup_multikueue/),
# and a namespace of its own keeps the fleet's ServiceAccount and script apart from the region's own jobs.
FLEET_NAMESPACE = "tpu-fleet"
FLEET_LOCAL_QUEUE = "fleet-queue"
MANAGER_CLUSTER_ROLE = "tpu-fallback-multikueue-manager"
# In every member: the manager's identity may read the Events in the fleet's namespace here, where GKE's autoscaler
# says it has no capacity for a fleet job's pods (the ladder's early path, failover/ladder/) and the failover
# controller says a fleet job lost its slice; and get, list and patch the fleet's pods here, to ask a running fleet
# job to checkpoint before the ladder moves it back up (climbing back: failover/ladder/climbing.py writes the
# request annotation, failover/checkpoints.py). Nothing else, and nothing outside the fleet's namespace: the
# manager may create and delete the fleet's RayJobs here already, which is more than writing a pod's annotation.
STOCKOUT_READER_ROLE = "tpu-fallback-fleet-stockout-reader"
FLEET_MEMBER_OUTPUT = "fleetMember"
# In every member: no inactive copy of a job the fleet's ladder is moving or giving up. Deactivating the manager's
# Workload (the first write of a move, failover/ladder/) makes Kueue 0.19.2 evict it, which clears its member and
# resets its MultiKueue check to Pending while the quota stays reserved until the manager's RayJob looks stopped;
# MultiKueue deletes the old step's copy (its spec no longer matches) and, in that window, dispatches the Workload
# again: an inactive copy in the step being left, never admitted, gone with the quota (docs/fleet.md, "One copy
# per visit"). Refused here, it is never made; the ladder releases the quota itself.
# Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/controller/admissionchecks/multikueue/workload.go#L651-L660
COPY_GUARD = "tpu-fallback-fleet-no-inactive-copy"

_WRITE = ["create", "delete", "get", "list", "patch", "update", "watch"]
_READ = ["get", "list", "watch"]


def manager_rules() -> list[dict]:
    """What MultiKueue's manager does in a worker, and nothing more: it creates, updates and deletes its Workload
    copies and the RayJob of the winner (an Update drops a copy's finalizer), reads their status, and watches the
    queues. Ref: kueue v0.19.2 test/util/multikueue.go L58-135; multikueue/workload.go L172-173 (the Update)."""
    return [
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": _WRITE},
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads/status"], "verbs": ["get", "patch", "update"]},
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["clusterqueues", "localqueues"], "verbs": _READ},
        {"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": _WRITE},
        {"apiGroups": ["ray.io"], "resources": ["rayjobs/status"], "verbs": ["get"]},
    ]


def stockout_reader_role() -> dict:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": STOCKOUT_READER_ROLE, "namespace": FLEET_NAMESPACE},
            "rules": [{"apiGroups": [""], "resources": ["events"], "verbs": _READ},
                      {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "patch"]}]}


def manager_cluster_role() -> dict:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": MANAGER_CLUSTER_ROLE}, "rules": manager_rules()}


def copy_guard_policy() -> dict:
    """Refuses MultiKueue's copy (its origin label) of a manager Workload that carries a ladder move or give-up and
    is inactive. A copy of an active Workload, or of one nobody in the fleet moves, is never refused; nor is
    anything if the rule cannot be evaluated (failurePolicy Ignore: without it, a harmless copy is made, as before)."""
    ladder = " || ".join(f"'{a}' in object.metadata.annotations"
                         for a in (WORKLOAD_MOVE_ANNOTATION, WORKLOAD_GIVE_UP_ANNOTATION))
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": COPY_GUARD},
            "spec": {"failurePolicy": "Ignore",
                     "matchConstraints": {
                         "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": FLEET_NAMESPACE}},
                         "resourceRules": [{"apiGroups": ["kueue.x-k8s.io"], "apiVersions": ["*"],
                                            "operations": ["CREATE"], "resources": ["workloads"]}]},
                     "matchConditions": [{"name": "a-copy-of-a-job-the-ladder-moves", "expression": (
                         f"has(object.metadata.labels) && '{MULTIKUEUE_ORIGIN_LABEL}' in object.metadata.labels"
                         f" && has(object.metadata.annotations) && ({ladder})")}],
                     "validations": [{"expression": "!has(object.spec.active) || object.spec.active",
                                      "message": "an inactive copy of a job the fleet's ladder is moving: it could "
                                                 "never be admitted here"}]}}


def copy_guard_binding() -> dict:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": COPY_GUARD},
            "spec": {"policyName": COPY_GUARD, "validationActions": ["Deny"]}}


def fleet_local_queue(settings: PlatformSettings) -> dict:
    """The fleet's LocalQueue here: the manager's name and namespace, on the start rung's ClusterQueue."""
    return {"apiVersion": KUEUE_API_VERSION, "kind": "LocalQueue",
            "metadata": {"name": FLEET_LOCAL_QUEUE, "namespace": FLEET_NAMESPACE},
            "spec": {"clusterQueue": start_cluster_queue(settings)}}


def start_cluster_queue(settings: PlatformSettings) -> str:
    start = settings.plan(settings.fleet_member.start_rung)
    return next(rung.cluster_queue for rung in queue_chain(settings) if rung.flavor == start.flavor)


def reachable_plans(settings: PlatformSettings) -> tuple:
    """The rungs a fleet job may hold here: the start rung and every rung below it."""
    start = settings.plans.index(settings.plan(settings.fleet_member.start_rung))
    return settings.plans[start:]


def fleet_capacity(settings: PlatformSettings, reachable: tuple[PlanSettings, ...] | None = None) -> dict[str, int]:
    """What a fleet job can use here: the CPU pool (the Ray heads) and every rung from the start rung down (a job
    evicted there is re-dispatched by the manager, not moved down; see README "Plan C"), derived from the
    machine types as the region's own flavor quotas are; or only the `reachable` rungs (a step of the ladder)."""
    system, tpu = settings.system_pool, settings.tpu
    reachable = reachable_plans(settings) if reachable is None else reachable
    hosts = sum(plan.hosts(tpu) for plan in reachable)
    return {"cpu": system.node_count * system.machine.vcpus + hosts * tpu.machine_type.vcpus,
            "memoryGi": system.node_count * system.machine.memory_gib + hosts * tpu.machine_type.memory_gib,
            "tpuChips": sum(plan.chips(tpu) for plan in reachable),
            "slices": sum(plan.max_slices for plan in reachable)}


# ---- the fleet's ladder: the steps this member offers ------------------------------------------------------------


def step_name(flavor: str, member: str) -> str:
    """A step's LocalQueue here and on the manager, and the manager's ClusterQueue, AdmissionCheck and
    MultiKueueConfig of that step: the rung's flavor and the member's MultiKueueCluster name (its stack name)."""
    return f"fleet-{flavor}-{member}"


def step_cluster_queue_name(flavor: str) -> str:
    return f"fleet-{flavor}"


def ladder_plans(settings: PlatformSettings) -> tuple[PlanSettings, ...]:
    """The rungs the fleet may use here one member at a time (`fleetMember.rungs` less the start rung)."""
    return tuple(plan for plan in settings.plans if plan.config_key in settings.fleet_member.ladder_rungs)


def step_cluster_queue(plan: PlanSettings) -> dict:
    """Only the rung's flavor (and default-cpu, the Ray head's), none of it owned: everything is borrowed from the
    region's cohort, where the region's own ClusterQueues own it. So a fleet job here takes only what the region's
    own jobs leave, and, with no other flavor listed, never falls through to another rung."""
    manifest = {"apiVersion": KUEUE_API_VERSION, "kind": "ClusterQueue",
                "metadata": {"name": step_cluster_queue_name(plan.flavor),
                             "annotations": {"pulumi.com/waitFor": "condition=Active"}},
                "spec": {"namespaceSelector": {}, "cohortName": COHORT, "resourceGroups": [{
                    "coveredResources": list(COVERED_RESOURCES),
                    "flavors": [no_quota(DEFAULT_FLAVOR), no_quota(plan.flavor)]}]}}
    return manifest


def step_local_queue(plan: PlanSettings, member: str) -> dict:
    return {"apiVersion": KUEUE_API_VERSION, "kind": "LocalQueue",
            "metadata": {"name": step_name(plan.flavor, member), "namespace": FLEET_NAMESPACE},
            "spec": {"clusterQueue": step_cluster_queue_name(plan.flavor)}}


def member_steps(settings: PlatformSettings, member: str) -> list[dict]:
    """What the fleet reads of each step here: the rung, its LocalQueue and what one job may use on it."""
    return [{"rung": plan.config_key, "flavor": plan.flavor, "localQueue": step_name(plan.flavor, member),
             "capacity": fleet_capacity(settings, (plan,)),
             # The ladder's early path: this long after GKE's autoscaler reports no capacity for a fleet job's pods
             # here, the fleet moves it on (this stack's own jobs move down its ladder after the same period).
             "stockoutGracePeriodSeconds": settings.fallback.stockout_grace_period_seconds,
             # Kueue here evicts a job whose pods are not ready this long after admitting it; the ladder moves a
             # fleet job just before (failover/ladder/decisions.py MEMBER_NOT_READY), so the fleet's MultiKueue does
             # not send it back here.
             "podsReadyTimeoutSeconds": settings.fallback.pods_ready_timeout_seconds}
            for plan in ladder_plans(settings)]


def fleet_member_output(settings: PlatformSettings, member: str = "") -> dict:
    """What the fleet stack reads of this member (with the `platform` output: its settings); `steps` only when the
    member offers rungs to the fleet's ladder, so a member that does not publishes what it did before."""
    output = {"namespace": FLEET_NAMESPACE, "localQueue": FLEET_LOCAL_QUEUE,
              "startRung": settings.fleet_member.start_rung, "clusterQueue": start_cluster_queue(settings),
              "flavors": [DEFAULT_FLAVOR, *(plan.flavor for plan in reachable_plans(settings))],
              "capacity": fleet_capacity(settings),
              "managerClusterRole": MANAGER_CLUSTER_ROLE}
    if ladder_plans(settings):
        output["steps"] = member_steps(settings, member)
    return output


class FleetMember(pulumi.ComponentResource):
    """The fleet's queue here, and what the fleet's manager is granted here (`tpu-fallback:infra:FleetMember`)."""

    output: dict  # plain: the fleet stack awaits it before declaring anything (roles/fleet.py)

    def __init__(self, name: str, settings: PlatformSettings, kueue: Kueue, cluster: gcp.container.Cluster,
                 provider: k8s.Provider, opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpu-fallback:infra:FleetMember", name, None, opts)
        on_cluster = pulumi.ResourceOptions(parent=self, provider=provider)

        def after(*resources: pulumi.Resource) -> pulumi.ResourceOptions:
            return pulumi.ResourceOptions.merge(on_cluster, pulumi.ResourceOptions(depends_on=list(resources)))

        # Jobs' namespace and queue: the LocalQueue waits for its ClusterQueue, as the region's own do.
        namespace = k8s.core.v1.Namespace(f"{name}-namespace", metadata={"name": FLEET_NAMESPACE}, opts=on_cluster)
        queue = fleet_local_queue(settings)
        k8s.apiextensions.CustomResource(
            f"{name}-localqueue", api_version=queue["apiVersion"], kind=queue["kind"], metadata=queue["metadata"],
            spec=queue["spec"],
            opts=after(namespace, kueue.release, kueue.cluster_queues[queue["spec"]["clusterQueue"]]))

        # The fleet's ladder: per rung offered, its ClusterQueue (in the region's cohort) and the step's LocalQueue.
        member = pulumi.get_stack().lower()
        for plan in ladder_plans(settings):
            step_queue = step_cluster_queue(plan)
            created = k8s.apiextensions.CustomResource(
                f"{name}-clusterqueue-{plan.flavor}", api_version=step_queue["apiVersion"], kind=step_queue["kind"],
                metadata=step_queue["metadata"], spec=step_queue["spec"],
                opts=after(kueue.release, *kueue.cluster_queues.values()))
            local = step_local_queue(plan, member)
            k8s.apiextensions.CustomResource(
                f"{name}-localqueue-{plan.flavor}", api_version=local["apiVersion"], kind=local["kind"],
                metadata=local["metadata"], spec=local["spec"], opts=after(namespace, created))

        # What MultiKueue may do here; the fleet stack binds it to its manager's Google identity.
        role = manager_cluster_role()
        k8s.rbac.v1.ClusterRole(f"{name}-manager-role", metadata=role["metadata"], rules=role["rules"],
                                opts=on_cluster)
        # The fleet's ladder reads the Events here: the autoscaler's stockouts (a step's early path) and the failover
        # controller's SliceLost (any step, the last among them: every member has it).
        reader = stockout_reader_role()
        k8s.rbac.v1.Role(f"{name}-stockout-reader-role", metadata=reader["metadata"], rules=reader["rules"],
                         opts=after(namespace))
        # No inactive copy of a job the fleet's ladder is moving (COPY_GUARD).
        guard = copy_guard_policy()
        policy = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
            f"{name}-copy-guard", metadata=guard["metadata"], spec=guard["spec"], opts=on_cluster)
        binding = copy_guard_binding()
        k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
            f"{name}-copy-guard-binding", metadata=binding["metadata"], spec=binding["spec"], opts=after(policy))
        self.output = {**fleet_member_output(settings, member), "access": {
            "server": pulumi.Output.concat("https://", cluster.endpoint),
            "certificateAuthorityData": cluster.master_auth.cluster_ca_certificate}}
        self.register_outputs({FLEET_MEMBER_OUTPUT: self.output})
