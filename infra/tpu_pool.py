"""The TPU node pools of one capacity plan, derived from the slice shape in the catalogue."""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from infra.cluster import node_config_common
from infra.settings import PlanSettings, PlatformSettings

# The node label each plan's pools carry and the plan's Kueue ResourceFlavor selects. The seed selects by
# cloud.google.com/gke-nodepool, which names one pool; a plan of several multi-host slices has several.
PLAN_LABEL_KEY = "tpu-fallback/capacity"


def node_pool_args(settings: PlatformSettings, plan: PlanSettings, pool_name: str,
                   cluster_name: pulumi.Input[str], service_account_email: pulumi.Input[str]) -> dict:
    """The NodePool arguments of one pool of `plan`, as keyword arguments for gcp.container.NodePool."""
    tpu = settings.tpu
    node_config = {
        "machine_type": tpu.machine_type.name,
        "labels": {PLAN_LABEL_KEY: plan.flavor},
        # On-demand and flex-start capacity; reservations would be another plan.
        "reservation_affinity": {"consume_reservation_type": "NO_RESERVATION"},
        **node_config_common(service_account_email),
    }
    args: dict = {
        "project": settings.project,
        "cluster": cluster_name,
        "location": settings.zone,
        "name": pool_name,
        "initial_node_count": 0,
        # Per-zone limits: GKE validates a multi-host slice against max_node_count, and rejects total_*.
        # Ref: https://github.com/vllm-project/ci-infra/pull/545
        "autoscaling": {"min_node_count": 0, "max_node_count": plan.nodes_per_pool(tpu)},
        "node_config": node_config,
    }
    if tpu.is_multi_host:
        # Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus#topology
        args["placement_policy"] = {"type": "COMPACT", "tpu_topology": tpu.topology}
    if plan.flex_start:
        # DWS: nodes come only through ProvisioningRequests, all of a request at once.
        # Ref: https://cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest
        args["queued_provisioning"] = {"enabled": True}
        node_config["flex_start"] = True
        args["autoscaling"]["location_policy"] = "ANY"
        # "enable_flex_start needs node auto_repair set to false" (GKE; Cluster Toolkit gke-node-pool checks).
        args["management"] = {"auto_repair": False, "auto_upgrade": True}
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
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpu-fallback:infra:TpuNodePool", name, None, opts)
        self.pools = [
            gcp.container.NodePool(
                f"{name}-{pool_name}",
                **node_pool_args(settings, plan, pool_name, cluster.name, service_account_email),
                opts=pulumi.ResourceOptions(parent=self),
            )
            for pool_name in plan.pool_names(settings.tpu)
        ]
        self.pool_names = pulumi.Output.all(*(pool.name for pool in self.pools))
        # The seed's check: gcloud container node-pools describe ... --format="get(config.flexStart)".
        self.flex_start = pulumi.Output.all(*(
            pulumi.Output.all(pool.name, pool.node_config.flex_start) for pool in self.pools
        )).apply(lambda pairs: {pool: bool(flag) for pool, flag in pairs})
        self.register_outputs({"poolNames": self.pool_names, "flexStart": self.flex_start})
