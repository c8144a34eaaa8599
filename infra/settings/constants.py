"""Domain constants the settings are checked against: version floors, bounds, and the teams' fixed sizes.

The configuration table (infra/settings/keys.py) states its ranges with these numbers, and the readers check with
them, so a bound is written once.
"""

from __future__ import annotations

from failover.api.names import CONTROLLER_NAMESPACE, KUEUE_NAMESPACE

NAMESPACE = "tpu-fallback"  # the Pulumi config namespace of every key here (the project's name)

# --- Versions ---
# Kueue 0.16 is the first release that stores v1beta2, the API version every object here is written in.
# Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/CHANGELOG/CHANGELOG-0.16.md
MIN_KUEUE_VERSION = (0, 16, 0)
# TPU flex-start with queued provisioning: "Use version 1.34 or later".
# Ref: https://cloud.google.com/kubernetes-engine/docs/tutorials/ray-kueue-dws
MIN_GKE_FOR_QUEUED_TPU = "1.34"
# Ray Operator add-on. Ref: https://cloud.google.com/kubernetes-engine/docs/add-on/ray-on-gke/how-to/enable-ray-on-gke
MIN_GKE_FOR_RAY_OPERATOR = "1.30.0-gke.1747000"
# A Standard pool's Spot VMs get more than GKE's default 30 s of graceful shutdown (`spot.gracefulTermination`)
# once the cluster's control plane runs this. Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms
MIN_GKE_FOR_SPOT_GRACE = "1.35.0-gke.1171000"

# --- Sizes ---
MAX_SLICES_PER_PLAN = 64  # a sanity bound: 64 multi-host slices is already 64 node pools
MIN_SYSTEM_NODES, MAX_SYSTEM_NODES = 1, 100  # the CPU pool: Kueue and the Ray heads need at least one node
SYSTEM_POOL_NAME = "default-pool"  # the seed's Kueue flavor and Ray head select this pool by name

# --- Waits ---
# Kueue evicts a job whose pods are not all ready this long after admission. A RayJob is PodsReady only once the Ray
# head answered for the job its submitter pod submitted (kuberay-kwok tier: README), so the wait holds a slice's
# creation from zero (a new node boots in 80-120 s: https://cloud.google.com/kubernetes-engine/docs/how-to/capacity-provisioning),
# the Ray image's pull on the hosts and the CPU pool (0.9 GB compressed, 2.2 GB on disk: kubernetes-sigs/kueue#4917;
# "several minutes to pull": GoogleCloudPlatform/ai-on-gke#520), Ray's start and `ray job submit`. Less than 5 min
# would evict healthy jobs on GKE; the runtime env's pip install comes after (Ray's job is PENDING meanwhile,
# bounded by Ray's own 15 min job start timeout). Over a day, a stocked-out job would hold a rung's quota for nothing.
MIN_PODS_READY_TIMEOUT_SECONDS = 5 * 60
MAX_PODS_READY_TIMEOUT_SECONDS = 24 * 3600
DEFAULT_RUNG = "default"  # the entry of a per-rung wait (sliceRecoveryWait, pendingTooLong) for every rung not named
# A lost slice's recovery wait (failover/slices.py): at least the time for the controller to see the loss and for
# KubeRay to replace the pods; a wait past a day is no longer a wait.
MIN_RECOVERY_WAIT_SECONDS, MAX_RECOVERY_WAIT_SECONDS = 30, 24 * 3600

# --- A Spot VM's notice (`spot.gracefulTermination`) ---
# GKE's graceful node shutdown of a Spot VM, from the preemption notice: 30 s by default, the pods first (15 s),
# then the pods of the system-node-critical and system-cluster-critical priority classes (15 s). The node system
# config sets the total (NodeKubeletConfig.shutdownGracePeriodSeconds: "Allowed values: 0, 30, 120", 0 turning the
# graceful shutdown off) and the critical pods' part (shutdownGracePeriodCriticalPodsSeconds); the other pods get the
# difference. Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms
# Ref: https://cloud.google.com/kubernetes-engine/docs/reference/rest/v1/NodeConfig#NodeKubeletConfig
# Ref: https://kubernetes.io/docs/concepts/cluster-administration/node-shutdown/#graceful-node-shutdown
SPOT_GRACE_SECONDS = 30  # GKE's default, sent to no pool
SPOT_GRACE_CHOICES = (30, 120)
SPOT_CRITICAL_PODS_SECONDS = 15  # the system pods' part at GKE's default, kept when the total is extended

# --- Alerts (`monitoring.alerts`, infra/monitoring.py) ---
# A wait alert needs a few 30 s scrapes to be more than a blip; a day is as long as a queued job is watched here.
MIN_PENDING_ALERT_SECONDS, MAX_PENDING_ALERT_SECONDS = 5 * 60, 24 * 3600
MAX_MOVES_PER_HOUR = 1000
# A disruption seen coming (fallback.maintenance): the checkpoint request from a minute to Cloud TPU's 7 days' notice
# ahead; the save taken as done 10 s to 10 min after it (the kubelet's refresh of the pods' file takes up to 1 min).
MIN_MAINTENANCE_LEAD_SECONDS, MAX_MAINTENANCE_LEAD_SECONDS = 60, 7 * 24 * 3600
MIN_SAVE_TIMEOUT_SECONDS, MAX_SAVE_TIMEOUT_SECONDS = 10, 10 * 60
MAINTENANCE_ACTIONS = ("checkpoint", "move", "none")  # failover.api.ACTIONS, the default first
# Climbing back (fallback.climbBack): the rungs it may go to (a DWS rung has no free slice to see: it provisions on
# request); its waits' ranges and defaults are the table's (infra/settings/keys_roles.py climb_wait).
CLIMB_BACK_RUNGS = ("reservation", "onDemand", "spot")
# A fleet's (fleet.climbBack): a reservation only, whose free quota in a member is itself a free slice; on-demand and
# Spot would also need an idle slice of the member's nodes, which the fleet's ladder does not read there.
FLEET_CLIMB_BACK_RUNGS = ("reservation",)
# The goodput alert's window: a few scrapes at least, and a day at most, as the waits'.
MIN_GOODPUT_WINDOW_SECONDS, MAX_GOODPUT_WINDOW_SECONDS = 30 * 60, 24 * 3600

# --- Several teams (`teams`): see infra/teams.py for the Kueue objects they become ---
# The rungs a team holds a guaranteed share of: capacity that exists while the team waits (Spot and DWS are shared
# first come, first served on the root Cohort).
GUARANTEED_RUNGS = ("reservation", "onDemand")
# A team's share of the CPU pool per guaranteed slice: one job's Ray head at the workloads' default size (2 CPU,
# 4Gi) plus the submitter pod set Kueue counts for a RayJob (KubeRay's default, 500m and 200Mi), rounded up. Held in
# the team's own quota because a job that borrows any resource, this CPU included, cannot reclaim a lent share (seen
# with Kueue 0.19.2 on the test control plane: "Workload requires preemption, but there are no candidate workloads
# allowed for preemption").
# Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/scheduler/preemption/preemption.go
# Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/controller/jobs/rayjob/rayjob_controller.go#L252-L263
JOB_HEAD_CPU = 3
JOB_HEAD_MEMORY_GIB = 5
SUBMITTER_CPU, SUBMITTER_MEMORY_GIB = 0.5, 200 / 1024  # what Kueue counts for KubeRay's submitter pod set
# Namespaces no team may take: Kubernetes' and GKE's own (kube-*, gke-*, GMP's), Kueue's and the failover
# controller's (their objects and RBAC would be editable by the team's groups), and `default`, where the platform's
# own chain keeps its LocalQueues under the same names a team's get.
# Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/gke-managed-namespaces (GKE-managed namespaces)
SYSTEM_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease", KUEUE_NAMESPACE,
                               CONTROLLER_NAMESPACE, "gmp-system", "gmp-public"})
SYSTEM_NAMESPACE_PREFIXES = ("kube-", "gke-")
# GKE Google Groups for RBAC reads group membership through a group of exactly this name in the domain.
# Ref: https://cloud.google.com/kubernetes-engine/docs/how-to/google-groups-rbac
SECURITY_GROUP_NAME = "gke-security-groups"
# teamShareOrder: the ladder's order (the default) or a free share first (infra/teams.py FIRST_RUNG_FUNGIBILITY).
SHARE_ORDER_LADDER, SHARE_ORDER_FREE_FIRST = "ladder", "freeFirst"
SHARE_ORDERS = (SHARE_ORDER_LADDER, SHARE_ORDER_FREE_FIRST)

# --- A fleet member (`fleetMember`) ---
# A fleet step's queue name is a label value (kueue.x-k8s.io/queue-name on the job): at most 63 characters.
MAX_STEP_NAME = 63
