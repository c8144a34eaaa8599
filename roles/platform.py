"""The platform role: one GKE cluster with its TPU pools, Kueue's ladder of queues, the failover controller and
monitoring; and, for a single team, that team's training jobs.

Settings → cluster → TPU pools → Kueue → failover → monitoring → workloads → outputs.
"""

import pulumi

from infra.cluster import GkeCluster
from infra.commands import next_steps
from infra.failover import FailoverController
from infra.fleet_member import FLEET_MEMBER_OUTPUT, FleetMember
from infra.kueue import Kueue
from infra.monitoring import Monitoring
from infra.settings import DEFAULTS, ConfigReader, read_platform_settings, tpu_quota
from infra.teams import Teams
from infra.tpu_pool import TpuNodePool, TpuWorkloadPolicy
from roles.contract import PLATFORM_OUTPUT, platform_output
from workloads.jobs import PlatformHandles, TrainingJobs
from workloads.settings import read_workload_settings


def deploy() -> None:
    """Declare the platform. Resource names and parents are those the program had at the top level of
    __main__.py (the stack is the parent either way), so a deployed stack keeps every URN."""
    # Settings: every key validated before any resource is declared.
    reader = ConfigReader(pulumi.Config())
    platform = read_platform_settings(reader, pulumi.Config("gcp"))
    workloads = read_workload_settings(reader, platform)
    reader.unknown_keys({*DEFAULTS, "workloads"})
    reader.raise_if_failed()

    # Cluster, with the CPU pool `default-pool` and the Kubernetes provider.
    cluster = GkeCluster("platform", platform)

    # TPU7x multi-host slices: one workload policy, which every rung's pools name (so they go before it on destroy).
    workload_policy = (TpuWorkloadPolicy("tpu-workload-policy", platform) if platform.tpu.needs_workload_policy
                       else None)
    # TPU pools: plan A then plan B. They create in parallel with Kueue: nothing below waits for them.
    pools = {
        plan.config_key: TpuNodePool(f"{plan.flavor}-tpu", platform, plan, cluster.cluster,
                                     cluster.node_service_account.email, workload_policy)
        for plan in platform.plans
    }

    # Kueue: the release and the chain of queues that try plan A, then plan B.
    kueue = Kueue("kueue", platform, cluster.provider)
    # A member of a fleet (plan C): the fleet's queue here, and what the fleet's manager may do here.
    member = (FleetMember("fleet-member", platform, kueue, cluster.cluster, cluster.provider)
              if platform.fleet_member else None)
    # The failover controller moves a job down the chain when its rung's TPUs never come (a stockout).
    failover = (FailoverController("failover", platform, kueue, cluster.provider) if len(kueue.queue_chain) > 1
                else None)
    # Several teams: per team its chain, and its groups' access (the status Role in the controller's namespace).
    teams = Teams("teams", platform, kueue, cluster.provider, failover) if platform.teams else None
    # Metrics on managed Prometheus: PodMonitorings for Kueue and the controller, and a Cloud Monitoring dashboard.
    monitoring = (Monitoring("monitoring", platform, kueue, failover, cluster.provider) if platform.monitoring.enabled
                  else None)

    # Workloads: the training RayJobs, queued by Kueue, which picks the plan.
    jobs = None
    if workloads.enabled and workloads.jobs > 0:
        jobs = TrainingJobs("training", PlatformHandles(platform, cluster.provider, cluster.cluster, kueue), workloads)

    # Outputs.
    pulumi.export("clusterName", cluster.cluster.name)
    pulumi.export("kubeconfig", cluster.kubeconfig)
    pulumi.export("nodePools", {key: pool.pool_names for key, pool in pools.items()})
    # The TPU chips each rung needs in the zone, and the quota they draw on (on-demand, preemptible: Spot and
    # flex-start, reserved).
    pulumi.export("tpuChips", {plan.config_key: plan.chips(platform.tpu) for plan in platform.plans})
    pulumi.export("tpuQuota", tpu_quota(platform))
    pulumi.export("flexStart", pools["flexStart"].flex_start if "flexStart" in pools else {})
    pulumi.export("localQueue", kueue.local_queue_name)
    # The queues a job can be moved down to after a stockout, first rung first (for a failover controller).
    pulumi.export("queueChain", [rung.as_output() for rung in kueue.queue_chain])
    if teams:  # {name: {namespace, localQueue, queueChain}}, read by team stacks
        pulumi.export("teams", teams.output)
    if teams or member:  # the settings team stacks and fleets build on
        pulumi.export(PLATFORM_OUTPUT, platform_output(platform))
    if member:  # read by the fleet stack: its queue here, and where its manager reaches this cluster (no secret)
        pulumi.export(FLEET_MEMBER_OUTPUT, member.output)
    pulumi.export("trainingJobs", jobs.job_names if jobs else [])
    pulumi.export("checkpointBucket", jobs.bucket.url if jobs else None)
    pulumi.export("dashboardUrl", monitoring.dashboard_url if monitoring else None)
    pulumi.export("nextSteps", next_steps(platform, jobs.job_names if jobs else []))
