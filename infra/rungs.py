"""The capacity ladder: every way of getting TPUs the stack knows, as one frozen table.

A rung is one entry here plus its config key's data; pools, flavors, quotas, the queue chain, the quota output and
the failover controller all derive from it. Kueue tries the enabled rungs in `rungOrder`.
"""

from __future__ import annotations

from dataclasses import dataclass

# Which TPU quota a rung's chips draw on, as the `tpuQuota` output names it. Flex-start and Spot draw on the
# preemptible quota; a reservation on what was reserved. Ref: https://cloud.google.com/tpu/docs/quota
ON_DEMAND_QUOTA, PREEMPTIBLE_QUOTA, RESERVED_QUOTA = "onDemand", "preemptible", "reserved"
# GKE labels every Spot node so; pools of this rung also carry a NoSchedule taint of the same key, so only jobs
# admitted on the Spot flavor (whose toleration Kueue adds) land there.
# Ref: https://cloud.google.com/kubernetes-engine/docs/how-to/spot-vms#scheduling-workloads
SPOT_LABEL_KEY = "cloud.google.com/gke-spot"
# Ref: https://cloud.google.com/kubernetes-engine/docs/how-to/consuming-reservations#consuming_a_specific_reservation
RESERVATION_AFFINITY_KEY = "compute.googleapis.com/reservation-name"


@dataclass(frozen=True)
class RungKind:
    key: str  # the stack config key
    flavor: str  # the Kueue ResourceFlavor and the pools' capacity label value
    default_node_pool: str
    tpu_quota: str
    flex_start: bool = False  # DWS: queued provisioning, flex-start VMs, a ProvisioningRequest admission check
    spot: bool = False
    reservation: bool = False

    @property
    def admission_check(self) -> bool:
        return self.flex_start


RESERVATION = RungKind("reservation", "reservation", "reserved-pool", RESERVED_QUOTA, reservation=True)
ON_DEMAND = RungKind("onDemand", "on-demand", "on-demand-pool", ON_DEMAND_QUOTA)
SPOT = RungKind("spot", "spot", "spot-pool", PREEMPTIBLE_QUOTA, spot=True)
FLEX_START = RungKind("flexStart", "dws", "dws-pool", PREEMPTIBLE_QUOTA, flex_start=True)

# The catalogue order is the default ladder: what is already paid for, then on-demand, then the cheaper but
# interruptible Spot, then DWS, which queues for capacity. The seed enables on-demand and flex-start only.
RUNG_KINDS: dict[str, RungKind] = {kind.key: kind for kind in (RESERVATION, ON_DEMAND, SPOT, FLEX_START)}
