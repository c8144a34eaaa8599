"""The TPU node pools of one capacity plan, derived from the slice shape in the catalogue."""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from infra.cluster import node_config_common
from infra.rungs import RESERVATION_AFFINITY_KEY, SPOT_LABEL_KEY
from infra.settings import NodeShutdown, PlanSettings, PlatformSettings, PoolSpec
from infra.tpu import Placement, TpuSlice

# The node label each plan's pools carry and the plan's Kueue ResourceFlavor selects. The seed selects by
# cloud.google.com/gke-nodepool, which names one pool; a plan of several multi-host slices has several.
PLAN_LABEL_KEY = "tpu-fallback/capacity"


def reservation_affinity(pool: PoolSpec) -> dict:
    """Reservation pools consume exactly their reservation; every other rung consumes none, so a reservation
    is never used up by on-demand, Spot or flex-start nodes (queued provisioning requires NO_RESERVATION).
    Ref: https://cloud.google.com/kubernetes-engine/docs/how-to/consuming-reservations"""
    if pool.reservation is None:
        return {"consume_reservation_type": "NO_RESERVATION"}
    return {"consume_reservation_type": "SPECIFIC_RESERVATION", "key": RESERVATION_AFFINITY_KEY,
            "values": [pool.reservation]}


def spot_shutdown_kubelet_config(shutdown: NodeShutdown) -> dict:
    """A Spot pool's graceful shutdown beyond GKE's default 30 s, in its node system config: the total and the system
    pods' part, both given, so that the pods' part (the difference) is the one the TPU workers are sized by
    (workloads/rayjob.py). Needs GKE 1.35.0-gke.1171000 on the control plane (checked with gkeVersion).
    Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms
    Ref: https://cloud.google.com/kubernetes-engine/docs/reference/rest/v1/NodeConfig#NodeKubeletConfig"""
    return {"shutdown_grace_period_seconds": shutdown.seconds,
            "shutdown_grace_period_critical_pods_seconds": shutdown.critical_pods_seconds}


def topology_placement(tpu: TpuSlice, workload_policy: pulumi.Input[str] | None) -> dict:
    """v5e, v5p, v6e: the pool names its topology. Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus#topology"""
    return {"type": "COMPACT", "tpu_topology": tpu.topology}


def workload_policy_placement(tpu: TpuSlice, workload_policy: pulumi.Input[str] | None) -> dict:
    """TPU7x: the pool names the slice's workload policy, which holds the topology; GKE takes no tpu_topology beside
    it. `type` is required by the API's PlacementPolicy (COMPACT, its one value).
    Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/tpu-ironwood
    Ref: https://cloud.google.com/kubernetes-engine/docs/reference/rest/v1/projects.locations.clusters.nodePools#PlacementPolicy"""
    if workload_policy is None:
        raise ValueError(f"a multi-host {tpu.generation.name} pool needs its workload policy")
    return {"type": "COMPACT", "policy_name": workload_policy}


# One function per placement kind in the catalogue (infra/tpu.py): a multi-host pool's placement_policy.
PLACEMENTS = {Placement.TPU_TOPOLOGY: topology_placement, Placement.WORKLOAD_POLICY: workload_policy_placement}


def workload_policy_name(settings: PlatformSettings) -> str:
    """`<cluster>-<generation>-<topology>-<zone letter>`, e.g. ironwood-tpu7x-2x2x2-c. The policy is regional and a
    cluster zonal: the zone's letter keeps two clusters of one name in one region (and project) apart. At most 40 + 17
    lowercase letters, digits and hyphens: within a resource policy's 63 (RFC 1035)."""
    tpu = settings.tpu
    return f"{settings.cluster_name}-{tpu.generation.name}-{tpu.topology}-{settings.zone.rsplit('-', 1)[1]}"


def workload_policy_args(settings: PlatformSettings) -> dict:
    """The ResourcePolicy arguments of the slice's workload policy: high throughput, the slice's topology, in the
    cluster's region (a pool's policy must be in its project and region).
    Ref: https://cloud.google.com/ai-hypercomputer/docs/placement-policy-and-workload-policy"""
    return {
        "project": settings.project,
        "region": settings.region,
        "name": workload_policy_name(settings),
        "description": f"Places each {settings.tpu.pod_type} slice ({settings.tpu.topology}) of {settings.cluster_name}",
        "workload_policy": {"type": "HIGH_THROUGHPUT", "accelerator_topology": settings.tpu.topology},
    }


class TpuWorkloadPolicy(pulumi.ComponentResource):
    """The workload policy every multi-host pool of the stack's slice shape names (TPU7x): one per shape, shared
    by the pools of every rung. The pools take its name as an input, so Pulumi deletes them before it."""

    policy: gcp.compute.ResourcePolicy
    name: pulumi.Output[str]

    def __init__(self, name: str, settings: PlatformSettings, opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpu-fallback:infra:TpuWorkloadPolicy", name, None, opts)
        self.policy = gcp.compute.ResourcePolicy(name, **workload_policy_args(settings),
                                                 opts=pulumi.ResourceOptions(parent=self))
        self.name = self.policy.name
        self.register_outputs({"name": self.name})


def node_pool_args(settings: PlatformSettings, plan: PlanSettings, pool: PoolSpec,
                   cluster_name: pulumi.Input[str], service_account_email: pulumi.Input[str],
                   workload_policy: pulumi.Input[str] | None = None) -> dict:
    """The NodePool arguments of one pool of `plan`, as keyword arguments for gcp.container.NodePool;
    `workload_policy` is the policy's name where the slice needs one (TpuSlice.needs_workload_policy)."""
    tpu = settings.tpu
    node_config = {
        "machine_type": tpu.machine_type.name,
        "labels": {PLAN_LABEL_KEY: plan.flavor},
        "reservation_affinity": reservation_affinity(pool),
        **node_config_common(service_account_email),
    }
    args: dict = {
        "project": settings.project,
        "cluster": cluster_name,
        "location": settings.zone,
        "name": pool.name,
        "initial_node_count": 0,
        # Per-zone limits: GKE validates a multi-host slice against max_node_count, and rejects total_*.
        # Ref: https://github.com/vllm-project/ci-infra/pull/545
        "autoscaling": {"min_node_count": 0, "max_node_count": pool.max_nodes},
        "node_config": node_config,
    }
    if tpu.is_multi_host:
        args["placement_policy"] = PLACEMENTS[tpu.generation.placement](tpu, workload_policy)
    if plan.flex_start:
        # DWS: nodes come only through ProvisioningRequests, all of a request at once.
        # Ref: https://cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest
        args["queued_provisioning"] = {"enabled": True}
        node_config["flex_start"] = True
        args["autoscaling"]["location_policy"] = "ANY"
        # "enable_flex_start needs node auto_repair set to false" (GKE; Cluster Toolkit gke-node-pool checks).
        args["management"] = {"auto_repair": False, "auto_upgrade": True}
    if plan.kind.spot:
        # Spot VMs (GKE labels them cloud.google.com/gke-spot=true); the taint keeps other pods off them.
        # Ref: https://cloud.google.com/kubernetes-engine/docs/how-to/spot-vms
        node_config["spot"] = True
        node_config["taints"] = [{"key": SPOT_LABEL_KEY, "value": "true", "effect": "NO_SCHEDULE"}]
        if plan.shutdown is not None:  # extended beyond GKE's default
            node_config["kubelet_config"] = spot_shutdown_kubelet_config(plan.shutdown)
    if plan.kind.reservation:
        # Take the reserved VMs wherever they are free first. Ref: gke-tpu.md (location_policy)
        args["autoscaling"]["location_policy"] = "ANY"
    return args


class TpuNodePool(pulumi.ComponentResource):
    """One plan's TPU capacity: a node pool per multi-host slice, or one pool of single-host nodes.

    Every pool autoscales from zero and carries the plan's node label.
    """

    pools: list[gcp.container.NodePool]
    pool_names: pulumi.Output[list[str]]
    flex_start: pulumi.Output[dict[str, bool]]

    def __init__(self, name: str, settings: PlatformSettings, plan: PlanSettings,
                 cluster: gcp.container.Cluster, service_account_email: pulumi.Input[str],
                 workload_policy: TpuWorkloadPolicy | None = None, opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpu-fallback:infra:TpuNodePool", name, None, opts)
        policy_name = workload_policy.name if workload_policy is not None else None
        self.pools = [
            gcp.container.NodePool(
                f"{name}-{pool.name}",
                **node_pool_args(settings, plan, pool, cluster.name, service_account_email, policy_name),
                opts=pulumi.ResourceOptions(parent=self),
            )
            for pool in plan.pools(settings.tpu)
        ]
        self.pool_names = pulumi.Output.all(*(pool.name for pool in self.pools))
        # The seed's check: gcloud container node-pools describe ... --format="get(config.flexStart)".
        self.flex_start = pulumi.Output.all(*(
            pulumi.Output.all(pool.name, pool.node_config.flex_start) for pool in self.pools
        )).apply(lambda pairs: {pool: bool(flag) for pool, flag in pairs})
        self.register_outputs({"poolNames": self.pool_names, "flexStart": self.flex_start})
