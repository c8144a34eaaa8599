"""The fleet role (plan C): one queue over several regional stacks; a job runs wherever TPUs come first.

A fleet stack sets `tpu-fallback:fleet: {members: [<org>/<project>/<stack>, ...]}`. It declares a small CPU-only
manager cluster with Kueue as a MultiKueue manager (infra/fleet.py), reads each member (a platform stack with
`fleetMember` enabled, infra/fleet_member.py) through a StackReference, and submits the training RayJobs to the
fleet queue. Through each member's own (secret) kubeconfig it declares there what is the fleet's: the manager's
access (its Google identity bound to the member's MultiKueue role) and the jobs' ServiceAccount and script.

Settings → members (read, checked) → manager cluster → MultiKueue → jobs → outputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra.cluster import GkeCluster
from infra.fleet import (FLEET_KEY, LADDER_RUNGS, FleetManager, FleetSettings, MemberHandle,
                         member_cluster_name, read_fleet_settings)
from infra.fleet_member import FLEET_LOCAL_QUEUE, FLEET_MEMBER_OUTPUT, FLEET_NAMESPACE
from infra.monitoring import FleetMonitoring
from infra.settings import (DEFAULTS, MAX_STEP_NAME, ClusterKeys, ConfigReader, ControllerRuntime, MonitoringSettings,
                            NodeShutdown, PlatformSettings, read_cluster_keys, read_controller_runtime,
                            read_monitoring_settings)
from roles.contract import KUBECONFIG_OUTPUT, PLATFORM_OUTPUT, cluster_id, settings_from_output
from roles.team import WORKLOADS_KEY, differs_from_default, read_published
from workloads.jobs import JobSite, PlatformHandles, TeamNamespace, TrainingJobs
from workloads.settings import WORKLOAD_DEFAULTS, read_workload_settings

# The keys a fleet stack reads; any other platform key belongs to the members' stacks.
FLEET_STACK_KEYS = ("zone", "clusterName", "gkeVersion", "deletionProtection", "systemPool", "kueue",
                    "failoverController", "monitoring")


def is_fleet_stack(config: pulumi.Config) -> bool:
    return config.get(FLEET_KEY) is not None


@dataclasses.dataclass(frozen=True)
class Member:
    """A member as read from its stack's outputs."""

    stack: str
    cluster: str  # the MultiKueueCluster's name
    settings: PlatformSettings
    queue: Mapping[str, Any]  # its `fleetMember` output
    reference: pulumi.StackReference


def read_member(reader: ConfigReader, where: str, stack: str, reference: pulumi.StackReference,
                published: Any, queue: Any) -> Member | None:
    """A member's settings and fleet queue from its outputs; a problem names the fleet key that led there."""
    if not isinstance(queue, Mapping) or not isinstance(published, Mapping):
        reader.fail(where, f"{stack} has no `{FLEET_MEMBER_OUTPUT}` output: it is not a fleet member; set "
                           "tpu-fallback:fleetMember {enabled: true} there and run `pulumi up` on it")
        return None
    try:
        settings = settings_from_output(published)
    except (KeyError, TypeError, ValueError) as err:
        reader.fail(where, f"{stack}'s `{PLATFORM_OUTPUT}` output is not readable ({type(err).__name__}: {err}); "
                           "run `pulumi up` on it with this version of tpu-fallback")
        return None
    fits = queue.get("namespace") == FLEET_NAMESPACE and queue.get("localQueue") == FLEET_LOCAL_QUEUE
    if not reader.check(where, fits, f"{stack}'s fleet queue is {queue.get('namespace')}/{queue.get('localQueue')}, "
                                     f"not {FLEET_NAMESPACE}/{FLEET_LOCAL_QUEUE}: it runs another version of "
                                     "tpu-fallback; run `pulumi up` on it"):
        return None
    access = queue.get("access")
    if not reader.check(where, isinstance(access, Mapping) and {"server", "certificateAuthorityData"} <= set(access),
                        f"{stack} publishes no `{FLEET_MEMBER_OUTPUT}.access` (where the manager reaches it): it "
                        "was last deployed by an older version of tpu-fallback; run `pulumi up` on it"):
        return None
    if not _check_steps(reader, where, stack, queue.get("steps") or []):
        return None
    return Member(stack, member_cluster_name(stack), settings, queue, reference)


def _check_steps(reader: ConfigReader, where: str, stack: str, steps: Any) -> bool:
    """The ladder steps a member offers (`fleetMember.steps`, from its `fleetMember.rungs`): each a rung the fleet
    orders (fleet.rungOrder), named for this member, a label value (the job's queue-name label)."""
    if not reader.check(where, isinstance(steps, list) and all(
            isinstance(s, Mapping) and {"rung", "localQueue", "capacity"} <= set(s) for s in steps),
            f"{stack}'s `{FLEET_MEMBER_OUTPUT}.steps` is not readable; run `pulumi up` on it with this version"):
        return False
    ok = True
    for step in steps:
        ok &= reader.check(where, step["rung"] in LADDER_RUNGS,
                           f"{stack} offers the fleet its {step['rung']!r} rung, which is not a step the fleet "
                           f"orders ({', '.join(LADDER_RUNGS)}); fix its fleetMember.rungs")
        name = step["localQueue"]
        ok &= reader.check(where, isinstance(name, str) and len(name) <= MAX_STEP_NAME
                           and name.endswith(f"-{member_cluster_name(stack)}"),
                           f"{stack}'s step queue {name!r} is not named for it or is longer than {MAX_STEP_NAME} "
                           "characters (a label value); use a shorter stack name")
    return ok


def check_members(reader: ConfigReader, members: list[Member], kueue_version: str) -> None:
    """A job fits every member: the same slice (the RayJob asks for it by machine type and topology), in distinct
    zones (stockouts are zonal: a second member in one zone adds no chance), on the manager's Kueue version."""
    first = members[0]
    zones: dict[str, str] = {}
    for index, member in enumerate(members):
        where = f"{FLEET_KEY}.members[{index}]"
        if member.settings.zone in zones:
            reader.fail(where, f"{member.stack} is in {member.settings.zone}, as {zones[member.settings.zone]} is: "
                               "stockouts are zonal, so members must be in distinct zones")
        zones.setdefault(member.settings.zone, member.stack)
        shape, wanted = member.settings.tpu, first.settings.tpu
        reader.check(where, (shape.machine_type.name, shape.topology) == (wanted.machine_type.name, wanted.topology),
                     f"{member.stack} has {shape.machine_type.name} {shape.topology} slices, {first.stack} has "
                     f"{wanted.machine_type.name} {wanted.topology}: a fleet job asks every member for one slice "
                     "shape; make them equal")
        reader.check(where, member.settings.kueue_version == kueue_version,
                     f"{member.stack} runs Kueue {member.settings.kueue_version}, the manager {kueue_version} "
                     "(kueue.version): MultiKueue copies Workloads between them; use one version")


def check_workloads_fit(reader: ConfigReader, members: list[Member]) -> Any:
    """The workloads' settings, checked against every member's machines (head on its CPU pool, batch over the
    chips): a problem found only against a later member names it."""
    workloads = read_workload_settings(reader, members[0].settings)
    for member in members[1:]:
        against = ConfigReader(reader.config)
        read_workload_settings(against, member.settings)
        reader.problems += [f"{problem} (against {member.stack})" for problem in against.problems
                            if problem not in reader.problems]
    if workloads is not None:
        reader.check(f"{WORKLOADS_KEY}.namespace",
                     workloads.namespace in (WORKLOAD_DEFAULTS["namespace"], FLEET_NAMESPACE),
                     f"{workloads.namespace!r}: a fleet's jobs run in {FLEET_NAMESPACE!r}, the namespace every "
                     "member's fleet queue is in; remove it")
    return workloads


def workers_shutdown(members: list[PlatformSettings]) -> NodeShutdown:
    """The Spot notice a fleet job's TPU workers are sized by: the shortest of the members' (each member's own
    `spot.gracefulTermination`, read and checked against its GKE version by its stack, GKE's default where its Spot
    rung is off). MultiKueue runs the manager's one RayJob unchanged on whichever member admits it, and the kubelet
    gives a pod the lesser of its node's pods' part and its own grace period: a hook sized for a longer notice than
    the member's would be killed in its wait, and `ray start` would never get its SIGTERM (docs/disruptions.md)."""
    return min((member.spot_shutdown for member in members), key=lambda shutdown: shutdown.pods_seconds)


def manager_settings(keys: ClusterKeys, kueue: tuple[str, str], runtime: ControllerRuntime,
                     monitoring: MonitoringSettings, fleet_template: PlatformSettings,
                     shutdown: NodeShutdown) -> PlatformSettings:
    """The manager cluster's settings: its own cluster keys, Kueue, controller runtime and monitoring, and the
    members' slice for the jobs it queues (the template: the first member's settings). `shutdown`
    (workers_shutdown): the notice the jobs' workers are sized by, set on the template's Spot rung, whose
    `spot_shutdown` the RayJob builder reads; the manager declares no pools. A template without a Spot rung already
    has GKE's default, the shortest there is, so the members' shortest is then the same."""
    plans = tuple(dataclasses.replace(plan, shutdown=shutdown) if plan.shutdown is not None else plan
                  for plan in fleet_template.plans)
    return dataclasses.replace(
        fleet_template, plans=plans, project=keys.project, kueue_version=kueue[0], kueue_chart_repository=kueue[1],
        failover_controller=runtime, zone=keys.zone, cluster_name=keys.cluster_name,
        gke_version=keys.gke_version, deletion_protection=keys.deletion_protection,
        system_pool=dataclasses.replace(fleet_template.system_pool, machine=keys.machine or
                                        fleet_template.system_pool.machine, node_count=keys.node_count),
        monitoring=monitoring, teams=(), fleet_member=None)


def read_stack_keys(reader: ConfigReader) -> tuple[FleetSettings, str, str]:
    """The fleet's own keys, and no key the members own: (fleet, kueue version, chart repository)."""
    fleet = read_fleet_settings(reader, (pulumi.get_project(), pulumi.get_stack()))
    for key, default in DEFAULTS.items():
        raw = reader.config.get(key)
        if key not in FLEET_STACK_KEYS and raw is not None and differs_from_default(raw, default):
            reader.fail(key, "a fleet stack does not read it: the members' stacks own their TPUs and rungs; "
                             "remove it here")
    kueue = reader.obj("kueue", DEFAULTS["kueue"])
    reader.unknown_keys({*DEFAULTS, WORKLOADS_KEY, FLEET_KEY})
    return fleet, kueue["version"], kueue["chartRepository"]


def deploy() -> None:
    """Declare the fleet: manager cluster, MultiKueue, and the jobs submitted to the fleet queue."""
    reader = ConfigReader(pulumi.Config())
    fleet, kueue_version, kueue_repository = read_stack_keys(reader)
    keys = read_cluster_keys(reader, pulumi.Config("gcp"))
    runtime = read_controller_runtime(reader)  # the fleet watch's Python packages (infra/fleet.py)
    monitoring = read_monitoring_settings(reader)  # the manager has no rungs: pendingTooLong.default applies
    reader.raise_if_failed()
    # Reads of the members' outputs; they create nothing.
    references = {stack: pulumi.StackReference(member_cluster_name(stack), stack_name=stack)
                  for stack in fleet.members}

    # As a team stack does (roles/team.py): await the members' plain outputs before declaring anything, so every
    # check runs before the first resource and preview shows the jobs. Ref: https://github.com/pulumi/pulumi/pull/23945
    async def declare_fleet() -> pulumi.Inputs:
        members = []
        for index, (stack, reference) in enumerate(references.items()):
            member = read_member(reader, f"{FLEET_KEY}.members[{index}]", stack, reference,
                                 await read_published(reference, PLATFORM_OUTPUT),
                                 await read_published(reference, FLEET_MEMBER_OUTPUT))
            if member is not None:
                members.append(member)
        reader.raise_if_failed()
        check_members(reader, members, kueue_version)
        workloads = check_workloads_fit(reader, members)
        reader.raise_if_failed()
        settings = manager_settings(keys, (kueue_version, kueue_repository), runtime, monitoring, members[0].settings,
                                    workers_shutdown([member.settings for member in members]))
        workloads = dataclasses.replace(workloads, namespace=FLEET_NAMESPACE)

        cluster = GkeCluster("fleet", settings, ray_operator=False)
        # Each member's own kubeconfig (secret, the one its `pulumi up` used): what this stack declares there (the
        # manager's access, the jobs' ServiceAccount and script) is removed with this stack.
        providers = {member.cluster: k8s.Provider(
            f"{member.cluster}-k8s", kubeconfig=member.reference.require_output(KUBECONFIG_OUTPUT),
            cluster_identifier=cluster_id(member.settings)) for member in members}
        manager = FleetManager("fleet", fleet, settings, [
            MemberHandle(member.cluster, member.queue["access"], member.queue["capacity"], member.settings.project,
                         providers[member.cluster], tuple(member.queue.get("steps") or ()))
            for member in members], cluster.provider)
        # Managed Prometheus on the manager (infra/cluster.py): Kueue and the fleet watch scraped, a dashboard, alerts.
        metrics = (FleetMonitoring("monitoring", settings, manager, cluster.provider) if monitoring.enabled
                       else None)

        jobs = None
        if workloads.enabled and workloads.jobs > 0:
            # The jobs' pods run on the members: their ServiceAccount and script go there.
            sites = tuple(JobSite(member.cluster, providers[member.cluster], member.settings.project)
                          for member in members)
            handles = PlatformHandles(settings, cluster.provider, cluster.cluster, None,
                                      TeamNamespace("fleet", FLEET_NAMESPACE, manager.local_queue_name), sites=sites,
                                      ready=tuple(manager.ready),
                                      bucket_location=fleet.checkpoint_location or members[0].settings.region)
            jobs = TrainingJobs("training", handles, workloads)
        return {
            "clusterName": cluster.cluster.name,
            "kubeconfig": cluster.kubeconfig,
            "members": {member.cluster: {"stack": member.stack, "zone": member.settings.zone,
                                         "startRung": member.queue["startRung"],
                                         "clusterQueue": member.queue["clusterQueue"]} for member in members},
            "localQueue": {"namespace": FLEET_NAMESPACE, "name": manager.local_queue_name},
            # The fleet's ladder, first step first (only when a member offers a step before DWS everywhere).
            **({"ladder": [step.as_output() for step in manager.steps]} if len(manager.steps) > 1 else {}),
            "dispatcher": fleet.dispatcher,
            "workerLostTimeoutSeconds": fleet.worker_lost_timeout_seconds,
            # The identity the manager reaches every member with; its tokens last an hour (failover/credentials.py).
            "managerServiceAccount": manager.service_account.email,
            "trainingJobs": jobs.job_names if jobs else [],
            "checkpointBucket": jobs.bucket.url if jobs else None,
            "dashboardUrl": metrics.dashboard_url if metrics else None,
        }

    pulumi.run(declare_fleet)

