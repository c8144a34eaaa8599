"""Stack settings: read from Pulumi config once, validated into frozen objects before any resource exists.

Every problem is collected and reported at once, each line naming the config key and what is allowed, so a
bad stack file stops `pulumi up` (and preview) before anything is registered.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pulumi

from infra.cpu import CpuMachineType, lookup_cpu_machine
from infra.rungs import RUNG_KINDS, RungKind
from infra.tpu import MACHINE_TYPES, ZONES_AS_OF, TpuGeneration, TpuSlice, lookup_slice

NAMESPACE = "tpu-fallback"

# The defaults of every project key. Pulumi.yaml documents the same values; tests/test_settings.py keeps the
# two equal. Object keys are merged field by field, so a stack file sets only the fields it changes.
DEFAULTS: Mapping[str, Any] = {
    "zone": "us-east5-b",
    "clusterName": "tpu-cluster",
    "gkeVersion": "1.34",
    "deletionProtection": False,
    "systemPool": {"machineType": "n2-standard-16", "nodeCount": 3},
    "tpu": {"machineType": "ct6e-standard-4t", "topology": "4x4", "allowUnlistedZone": False},
    "reservation": {"nodePool": "reserved-pool", "reservations": []},
    "onDemand": {"nodePool": "on-demand-pool", "maxSlices": 1},
    "spot": {"nodePool": "spot-pool", "maxSlices": 0},
    "flexStart": {"nodePool": "dws-pool", "maxSlices": 1},
    "rungOrder": [],
    "kueue": {"version": "0.19.2", "chartRepository": "oci://registry.k8s.io/kueue/charts"},
    "fallback": {"podsReadyTimeout": "15m", "stockoutGracePeriod": "3m",
                 "sliceRecoveryWait": {"default": "10m", "spot": "2m", "flexStart": "2m"}},
    "failoverController": {"image": "", "pipIndexUrl": ""},
    "monitoring": {"enabled": True, "alerts": {"enabled": True, "pendingTooLong": {"default": "1h", "flexStart": "6h"},
                                               "movesPerHour": 3, "notificationChannels": []}},
    "teams": [],
    "teamShareOrder": "ladder",
    "googleGroupsDomain": "",
    "fleetMember": {"enabled": False, "startRung": "flexStart", "rungs": []},
}

# Kueue 0.16 is the first release that stores v1beta2, the API version every object here is written in.
# Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/CHANGELOG/CHANGELOG-0.16.md
MIN_KUEUE_VERSION = (0, 16, 0)
# TPU flex-start with queued provisioning: "Use version 1.34 or later".
# Ref: https://cloud.google.com/kubernetes-engine/docs/tutorials/ray-kueue-dws
MIN_GKE_FOR_QUEUED_TPU = "1.34"
# Ray Operator add-on. Ref: https://cloud.google.com/kubernetes-engine/docs/add-on/ray-on-gke/how-to/enable-ray-on-gke
MIN_GKE_FOR_RAY_OPERATOR = "1.30.0-gke.1747000"
MAX_SLICES_PER_PLAN = 64  # a sanity bound: 64 multi-host slices is already 64 node pools
# Kueue evicts a job whose pods are not all ready this long after admission. A RayJob is PodsReady only once the Ray
# head answered for the job its submitter pod submitted (kuberay-kwok tier: README), so the wait holds a slice's
# creation from zero (a new node boots in 80-120 s: https://cloud.google.com/kubernetes-engine/docs/how-to/capacity-provisioning),
# the Ray image's pull on the hosts and the CPU pool (0.9 GB compressed, 2.2 GB on disk: kubernetes-sigs/kueue#4917;
# "several minutes to pull": GoogleCloudPlatform/ai-on-gke#520), Ray's start and `ray job submit`. Less than 5 min
# would evict healthy jobs on GKE; the runtime env's pip install comes after (Ray's job is PENDING meanwhile,
# bounded by Ray's own 15 min job start timeout). Over a day, a stocked-out job would hold a rung's quota for nothing.
MIN_PODS_READY_TIMEOUT_SECONDS = 5 * 60
MAX_PODS_READY_TIMEOUT_SECONDS = 24 * 3600

# GKE name rules. Ref: https://cloud.google.com/kubernetes-engine/docs/how-to/creating-a-zonal-cluster
_CLUSTER_NAME = re.compile(r"^[a-z](?:[-a-z0-9]{0,38}[a-z0-9])?$")
_NODE_POOL_NAME = re.compile(r"^[a-z](?:[-a-z0-9]{0,38}[a-z0-9])?$")
# Ref: https://cloud.google.com/resource-manager/docs/creating-managing-projects (project IDs)
_PROJECT_ID = re.compile(r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")
_ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
_GKE_VERSION = re.compile(r"^1\.(\d+)(?:\.(\d+)(?:-gke\.(\d+))?)?$")
# A Helm repository: an OCI registry path or an HTTPS chart repository (no trailing slash).
_CHART_REPOSITORY = re.compile(r"^(oci|https)://[a-z0-9]([-a-z0-9.]*[a-z0-9])?(:[0-9]+)?(/[-a-zA-Z0-9._~]+)*$")
_SEMVER = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
# A reservation in this project by name, or a shared one in another project by its path.
# Ref: https://cloud.google.com/compute/docs/instances/reservations-shared#consuming_shared_reservations
_RESERVATION = re.compile(r"^(?:projects/[a-z][-a-z0-9]{4,28}[a-z0-9]/reservations/)?[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")
# An image reference pinned by tag or digest: registry/path:tag or registry/path@sha256:<64 hex>, never :latest.
# Ref: https://github.com/distribution/reference/blob/main/reference.go (the grammar, simplified to what is pinned)
_PINNED_IMAGE = re.compile(r"^[a-z0-9]([-a-z0-9._]*[a-z0-9])?(:[0-9]+)?(/[a-z0-9]([-a-z0-9._]*[a-z0-9])?)*"
                           r"(:(?!latest$)[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[0-9a-f]{64})$")
_HTTPS_URL = re.compile(r"^https://[a-z0-9]([-a-z0-9.]*[a-z0-9])?(:[0-9]+)?(/[-a-zA-Z0-9._~%+]*)*$")
_DURATION = re.compile(r"^([0-9]+)(s|m|h)$")
# --- Alerts (`monitoring.alerts`, infra/monitoring.py) ---
DEFAULT_RUNG = "default"  # the `pendingTooLong` entry for every rung not named
# A wait alert needs a few 30 s scrapes to be more than a blip; a day is as long as a queued job is watched here.
MIN_PENDING_ALERT_SECONDS, MAX_PENDING_ALERT_SECONDS = 5 * 60, 24 * 3600
# A lost slice's recovery wait (failover/slices.py): at least the time for the controller to see the loss and for
# KubeRay to replace the pods; a wait past a day is no longer a wait.
MIN_RECOVERY_WAIT_SECONDS, MAX_RECOVERY_WAIT_SECONDS = 30, 24 * 3600
MAX_MOVES_PER_HOUR = 1000
# teamShareOrder: the ladder's order (the default) or a free share first (infra/teams.py FIRST_RUNG_FUNGIBILITY).
SHARE_ORDER_LADDER, SHARE_ORDER_FREE_FIRST = "ladder", "freeFirst"
SHARE_ORDERS = (SHARE_ORDER_LADDER, SHARE_ORDER_FREE_FIRST)
# The format AlertPolicy.notificationChannels documents: projects/[PROJECT_ID_OR_NUMBER]/notificationChannels/[CHANNEL_ID]
# Ref: https://cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.alertPolicies#AlertPolicy
_NOTIFICATION_CHANNEL = re.compile(r"^projects/(?:[a-z][-a-z0-9]{4,28}[a-z0-9]|[0-9]+)/notificationChannels/[0-9]+$")
# Another stack, fully qualified as the docs advise for a StackReference: <organization>/<project>/<stack>, each
# part letters, digits, hyphens, underscores or periods (`organization` on a self-managed backend).
# Ref: https://www.pulumi.com/docs/iac/concepts/stacks/#stackreferences
_STACK_PART = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
FULLY_QUALIFIED_STACK = re.compile(rf"^{_STACK_PART}/{_STACK_PART}/{_STACK_PART}$")
_SECONDS_PER_UNIT = {"s": 1, "m": 60, "h": 3600}
# --- Several teams (`teams`): see infra/teams.py for the Kueue objects they become ---
# The rungs a team holds a guaranteed share of: capacity that exists while the team waits (Spot and DWS are shared
# first come, first served on the root Cohort).
GUARANTEED_RUNGS = ("reservation", "onDemand")
# A team's share of the CPU pool per guaranteed slice: one job's Ray head at the workloads' default size (2 CPU,
# 4Gi) plus the submitter pod set Kueue counts for a RayJob (KubeRay's default, 500m and 200Mi), rounded up. A job
# that borrows any resource, this CPU included, cannot reclaim (measured: ../shared/notes/kueue-multi-team.md).
# Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/controller/jobs/rayjob/rayjob_controller.go#L252-L263
JOB_HEAD_CPU = 3
JOB_HEAD_MEMORY_GIB = 5
SUBMITTER_CPU, SUBMITTER_MEMORY_GIB = 0.5, 200 / 1024  # what Kueue counts for KubeRay's submitter pod set
# Namespaces no team may take: Kubernetes' and GKE's own (kube-*, gke-*, GMP's), Kueue's and the failover
# controller's (their objects and RBAC would be editable by the team's groups), and `default`, where the platform's
# own chain keeps its LocalQueues under the same names a team's get.
# Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/gke-managed-namespaces (GKE-managed namespaces)
SYSTEM_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease", "kueue-system",
                               "tpu-fallback-system", "gmp-system", "gmp-public"})
SYSTEM_NAMESPACE_PREFIXES = ("kube-", "gke-")
# GKE Google Groups for RBAC reads group membership through a group of exactly this name in the domain.
# Ref: https://cloud.google.com/kubernetes-engine/docs/how-to/google-groups-rbac
SECURITY_GROUP_NAME = "gke-security-groups"
TEAM_FIELDS = ("name", "namespace", "groups", "shares", "borrowingLimit", "lendingLimit")
DNS_LABEL = _DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_TEAM_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,28}[a-z0-9])?$")  # prefixes cluster-scoped names: kept short
_EMAIL = re.compile(r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+$")
_DOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$")
SYSTEM_POOL_NAME = "default-pool"  # the seed's Kueue flavor and Ray head select this pool by name


class SettingsError(pulumi.RunError, ValueError):
    """The stack configuration is invalid; `problems` holds one line per bad key.

    A RunError: the Pulumi CLI prints its message alone, with no "Program failed with an unhandled exception"
    and no traceback. Ref: https://github.com/pulumi/pulumi/blob/master/sdk/python/cmd/pulumi-language-python-exec
    """

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid stack configuration:\n" + "\n".join(f"  - {p}" for p in problems))


def gke_version_tuple(version: str) -> tuple[int, ...]:
    """(minor, patch, gke-build) of a GKE version such as 1.34 or 1.33.0-gke.1712000; the major is always 1."""
    match = _GKE_VERSION.match(version)
    if match is None:
        raise ValueError(version)
    return tuple(int(part) for part in match.groups() if part is not None)


def gke_version_at_least(version: str, minimum: str) -> bool:
    """True when `version` can only mean a release at or after `minimum`.

    A prefix such as 1.34 lets GKE pick a patch; it is compared on the parts it gives, since GKE only
    offers a minor's recent patches, which are newer than any minimum named here for an older patch.
    """
    given, needed = gke_version_tuple(version), gke_version_tuple(minimum)
    return given >= needed[: len(given)]


class ConfigReader:
    """Reads keys of one Pulumi config namespace, collecting problems instead of stopping at the first."""

    def __init__(self, config: pulumi.Config, namespace: str = NAMESPACE):
        self.config = config
        self.namespace = namespace
        self.problems: list[str] = []

    def key(self, name: str) -> str:
        return f"{self.namespace}:{name}"

    def fail(self, name: str, message: str) -> None:
        self.problems.append(f"{self.key(name)}: {message}")

    def raise_if_failed(self) -> None:
        if self.problems:
            raise SettingsError(self.problems)

    def text(self, name: str, default: str, pattern: re.Pattern[str] | None = None, rule: str = "") -> str:
        value = self.config.get(name)
        if value is None:
            return default
        if pattern is not None and not pattern.match(value):
            self.fail(name, f"{value!r} is not valid; {rule}")
        return value

    def boolean(self, name: str, default: bool) -> bool:
        value = self.config.get(name)
        if value is None:
            return default
        if value.lower() not in ("true", "false"):
            self.fail(name, f"{value!r} is not a boolean; use true or false")
            return default
        return value.lower() == "true"

    def _structured(self, name: str, kind: type, expected: str) -> Any:
        """A JSON object or list key as the CLI passes it; None when unset or (a problem) of another kind."""
        raw = self.config.get(name)
        if raw is None:
            return None
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = None
        if not isinstance(value, kind):
            self.fail(name, f"must be {expected}; got {raw!r}")
            return None
        return value

    def obj(self, name: str, defaults: Mapping[str, Any]) -> dict[str, Any]:
        """An object key merged over its defaults; unknown or mistyped fields are problems."""
        return self.fields(name, self._structured(name, dict, f"an object with fields {', '.join(defaults)}"),
                           defaults)

    def fields(self, name: str, value: Mapping[str, Any] | None, defaults: Mapping[str, Any]) -> dict[str, Any]:
        """An object's fields (a key's, or a nested object's) merged over its defaults; unknown or mistyped
        fields are problems."""
        merged = dict(defaults)
        for field, given in (value or {}).items():
            if field not in defaults:
                self.fail(f"{name}.{field}", f"unknown field; allowed: {', '.join(defaults)}")
            elif type(given) is not type(defaults[field]):
                kind = type(defaults[field]).__name__.replace("str", "string").replace("bool", "boolean")
                self.fail(f"{name}.{field}", f"must be a {kind}; got {given!r}")
            else:
                merged[field] = given
        return merged

    def array(self, name: str, default: list) -> list:
        value = self._structured(name, list, "a list")
        return list(default) if value is None else value

    def check(self, name: str, ok: bool, message: str) -> bool:
        if not ok:
            self.fail(name, message)
        return ok

    def unknown_keys(self, known: set[str]) -> None:
        """Top-level keys of this namespace that nothing reads: typos must not pass silently."""
        prefix = f"{self.namespace}:"
        present = set(pulumi.runtime.config.CONFIG.get()) | set(pulumi.runtime.config.get_config_env())
        for full_key in sorted(present):
            if full_key.startswith(prefix) and full_key[len(prefix):] not in known:
                self.fail(full_key[len(prefix):], f"unknown key; known keys: {', '.join(sorted(known))}")


@dataclass(frozen=True)
class SystemPoolSettings:
    machine: CpuMachineType
    node_count: int
    name: str = SYSTEM_POOL_NAME


@dataclass(frozen=True)
class ReservedSlices:
    """A reservation the reservation rung consumes, and its size in slices (the program cannot read it)."""

    name: str  # a name in this project, or projects/<project>/reservations/<name> for a shared one
    slices: int


@dataclass(frozen=True)
class PoolSpec:
    name: str
    max_nodes: int
    reservation: str | None = None


@dataclass(frozen=True)
class PlanSettings:
    """One rung of the ladder: a kind of capacity (infra/rungs.py) with its pools' name and size."""

    kind: RungKind
    node_pool: str
    max_slices: int
    reservations: tuple[ReservedSlices, ...] = ()

    @property
    def config_key(self) -> str:
        return self.kind.key

    @property
    def flavor(self) -> str:
        return self.kind.flavor

    @property
    def flex_start(self) -> bool:
        return self.kind.flex_start

    @property
    def enabled(self) -> bool:
        return self.max_slices > 0

    def pools(self, tpu: TpuSlice) -> tuple[PoolSpec, ...]:
        """A multi-host slice is a whole node pool, so N slices need N pools; single-host slices share one.
        A reservation rung keeps each reservation's slices in pools of their own."""
        groups = [(r.name, r.slices) for r in self.reservations] if self.reservations else [(None, self.max_slices)]
        specs, index, several = [], 0, self.max_slices > 1 and (tpu.is_multi_host or len(groups) > 1)
        for reservation, slices in groups:
            for _ in range(slices if tpu.is_multi_host else 1):
                index += 1
                name = f"{self.node_pool}-{index}" if several else self.node_pool
                specs.append(PoolSpec(name, tpu.hosts if tpu.is_multi_host else slices, reservation))
        return tuple(specs)

    def pool_names(self, tpu: TpuSlice) -> tuple[str, ...]:
        return tuple(pool.name for pool in self.pools(tpu))

    def chips(self, tpu: TpuSlice) -> int:
        return self.max_slices * tpu.chips

    def hosts(self, tpu: TpuSlice) -> int:
        return self.max_slices * tpu.hosts


@dataclass(frozen=True)
class FallbackSettings:
    """When a job on a rung counts as stocked out: Kueue's PodsReady timeout and, shorter, the grace period
    after which a failover controller may act on clear stockout signs before Kueue evicts."""

    pods_ready_timeout_seconds: int
    stockout_grace_period_seconds: int
    # (rung config key or DEFAULT_RUNG, seconds): how long a running job that lost its slice waits for it to be whole
    # again before it moves on (failover/slices.py)
    slice_recovery_wait: tuple[tuple[str, int], ...]

    def recovery_seconds(self, rung: str) -> int:
        """The recovery wait of a rung (its config key): its own, or the default."""
        waits = dict(self.slice_recovery_wait)
        return waits.get(rung, waits[DEFAULT_RUNG])


@dataclass(frozen=True)
class ControllerRuntime:
    """Where the failover controller's Python packages come from: PyPI at each start (the default), an index
    mirror (`pip_index_url`), or nowhere at start: a prebuilt image that has the pins (`image`)."""

    image: str = ""
    pip_index_url: str = ""


@dataclass(frozen=True)
class AlertSettings:
    """Cloud Monitoring alert policies over the scraped metrics (infra/monitoring.py): how long a job may wait on
    a rung, how many moves down the ladder per hour are too many, and where notifications go (none: the policies
    open incidents in the console only)."""

    enabled: bool = True
    # (rung config key or DEFAULT_RUNG, seconds): the longest a rung's jobs may wait before an alert
    pending_too_long: tuple[tuple[str, int], ...] = ((DEFAULT_RUNG, 3600), ("flexStart", 6 * 3600))
    moves_per_hour: int = 3
    notification_channels: tuple[str, ...] = ()  # projects/<project>/notificationChannels/<id>

    def pending_seconds(self, rung: str) -> int:
        """The wait that alerts on this rung (its config key): its own, or the default."""
        waits = dict(self.pending_too_long)
        return waits.get(rung, waits[DEFAULT_RUNG])


@dataclass(frozen=True)
class MonitoringSettings:
    """Managed Prometheus on the cluster, PodMonitorings for Kueue and the failover controller, a Cloud
    Monitoring dashboard and alert policies (infra/monitoring.py); a team that has its own can turn them off."""

    enabled: bool = True
    alerts: AlertSettings = AlertSettings()


# A fleet step's queue name is a label value (kueue.x-k8s.io/queue-name on the job): at most 63 characters.
MAX_STEP_NAME = 63


@dataclass(frozen=True)
class FleetMemberSettings:
    """This region as a member of a MultiKueue fleet (infra/fleet_member.py): a fleet job starts here on the
    queue of `start_rung` (config key), flexStart by default: admitted only once DWS has provisioned the slice,
    so the first region with TPUs wins."""

    start_rung: str = "flexStart"
    # The rungs besides the start rung that the fleet may use here one member at a time (config keys, none with an
    # admission check): each becomes a step of the fleet's ladder (infra/fleet_member.py, README "The fleet's
    # ladder"). Empty, the default: the fleet only asks DWS here, as before.
    ladder_rungs: tuple[str, ...] = ()


@dataclass(frozen=True)
class TeamSettings:
    """One team on a shared platform: its namespace, the Google groups that may deploy there, and its guaranteed
    slices per guaranteed rung (config key: slices); the limits in slices, None when unset (Kueue: no limit)."""

    name: str
    namespace: str
    groups: tuple[str, ...]
    shares: tuple[tuple[str, int], ...]  # (rung config key, slices), in GUARANTEED_RUNGS order
    borrowing_limit: int | None = None
    lending_limit: int | None = None

    def share(self, key: str) -> int:
        return dict(self.shares).get(key, 0)

    @property
    def guaranteed_slices(self) -> int:
        return sum(slices for _, slices in self.shares)


@dataclass(frozen=True)
class PlatformSettings:
    project: str
    zone: str
    cluster_name: str
    gke_version: str
    deletion_protection: bool
    system_pool: SystemPoolSettings
    tpu: TpuSlice
    plans: tuple[PlanSettings, ...]  # the enabled rungs, in the order Kueue tries them
    kueue_version: str
    kueue_chart_repository: str
    fallback: FallbackSettings
    failover_controller: ControllerRuntime = ControllerRuntime()
    monitoring: MonitoringSettings = MonitoringSettings()
    teams: tuple[TeamSettings, ...] = ()  # empty: one team, today's single chain
    team_share_order: str = SHARE_ORDER_LADDER  # how a team's job picks among its shares (infra/teams.py)
    groups_domain: str = ""  # the domain of gke-security-groups@<domain> (GKE Google Groups for RBAC)
    fleet_member: FleetMemberSettings | None = None  # None: not a member of a fleet

    @property
    def security_group(self) -> str:
        return f"{SECURITY_GROUP_NAME}@{self.groups_domain}"

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0]

    def plan(self, key: str) -> PlanSettings | None:
        """The enabled rung of this config key, or None."""
        return next((plan for plan in self.plans if plan.config_key == key), None)

    @property
    def on_demand(self) -> PlanSettings | None:
        return self.plan("onDemand")

    @property
    def flex_start(self) -> PlanSettings | None:
        return self.plan("flexStart")

    def service_account_id(self, role: str) -> str:
        """`<cluster>-<role>`: service account IDs are 6-30 characters, so a long cluster name is cut."""
        return f"{self.cluster_name[:29 - len(role)].rstrip('-')}-{role}"


def _read_plan(reader: ConfigReader, kind: RungKind) -> PlanSettings:
    key = kind.key
    raw = reader.obj(key, DEFAULTS[key])
    reader.check(f"{key}.nodePool", bool(_NODE_POOL_NAME.match(raw["nodePool"])),
                 f"{raw['nodePool']!r} is not a GKE node pool name (lowercase letters, digits and hyphens, "
                 "starting with a letter, at most 40 characters)")
    if kind.reservation:
        reservations = _read_reservations(reader, key, raw["reservations"])
        return PlanSettings(kind, raw["nodePool"], sum(r.slices for r in reservations), reservations)
    reader.check(f"{key}.maxSlices", 0 <= raw["maxSlices"] <= MAX_SLICES_PER_PLAN,
                 f"{raw['maxSlices']} is out of range; use 0 (rung off) to {MAX_SLICES_PER_PLAN}")
    return PlanSettings(kind, raw["nodePool"], raw["maxSlices"])


def _read_reservations(reader: ConfigReader, key: str, items: list) -> tuple[ReservedSlices, ...]:
    """`reservations: [{name, slices}]`: each reservation and how many slices it holds (its Kueue quota)."""
    found: list[ReservedSlices] = []
    for index, item in enumerate(items):
        where = f"{key}.reservations[{index}]"
        if not isinstance(item, dict) or set(item) != {"name", "slices"}:
            reader.fail(where, f"must be an object with fields name, slices; got {item!r}")
            continue
        name, slices = item["name"], item["slices"]
        ok = reader.check(f"{where}.name", isinstance(name, str) and bool(_RESERVATION.match(name)),
                          f"{name!r} is not a reservation name, nor projects/<project>/reservations/<name> for "
                          "a shared reservation")
        ok &= reader.check(f"{where}.slices", type(slices) is int and 1 <= slices <= MAX_SLICES_PER_PLAN,
                           f"{slices!r} is out of range; a reservation holds 1 to {MAX_SLICES_PER_PLAN} slices")
        if ok:
            found.append(ReservedSlices(name, slices))
    names = [r.name for r in found]
    reader.check(f"{key}.reservations", len(set(names)) == len(names), "a reservation is listed twice")
    reader.check(f"{key}.reservations", sum(r.slices for r in found) <= MAX_SLICES_PER_PLAN,
                 f"more than {MAX_SLICES_PER_PLAN} slices in all")
    return tuple(found)


def _read_rung_order(reader: ConfigReader, plans: dict[str, PlanSettings]) -> tuple[PlanSettings, ...]:
    """The enabled rungs in `rungOrder` (default: the catalogue's order), each exactly once."""
    enabled = [key for key, plan in plans.items() if plan.enabled]
    order = reader.array("rungOrder", DEFAULTS["rungOrder"]) or enabled
    unknown = [key for key in order if key not in RUNG_KINDS]
    if not reader.check("rungOrder", not unknown, f"unknown rung(s) {', '.join(map(str, unknown))}; rungs: "
                                                  f"{', '.join(RUNG_KINDS)}"):
        return tuple(plans[key] for key in enabled)
    reader.check("rungOrder", len(set(order)) == len(order), "a rung is listed twice")
    reader.check("rungOrder", set(order) == set(enabled),
                 f"must list exactly the enabled rungs ({', '.join(enabled) or 'none'}); got {', '.join(order)}")
    return tuple(plans[key] for key in dict.fromkeys(order) if key in enabled)


def _read_tpu(reader: ConfigReader, zone: str) -> tuple[TpuSlice | None, TpuGeneration | None, bool]:
    """The slice, and its generation as soon as the machine type is known (the zone is checked against it even
    while the topology is wrong: every key is reported in one pass)."""
    raw = reader.obj("tpu", DEFAULTS["tpu"])
    if not reader.check("tpu.machineType", raw["machineType"] in MACHINE_TYPES,
                        f"unknown TPU machine type {raw['machineType']!r}; known: {', '.join(MACHINE_TYPES)}"):
        return None, None, raw["allowUnlistedZone"]
    generation = MACHINE_TYPES[raw["machineType"]].generation
    if not raw["allowUnlistedZone"]:
        reader.check("zone", zone in generation.zones,
                     f"{zone} offers no TPU {generation.name} per the catalogue ({ZONES_AS_OF}); zones: "
                     f"{', '.join(sorted(generation.zones))}. A zone added since: set tpu.allowUnlistedZone")
    tpu = _lookup_or_fail(reader, "tpu.topology", lambda topology: lookup_slice(raw["machineType"], topology),
                          raw["topology"])
    return tpu, generation, raw["allowUnlistedZone"]


def _check_versions_and_zones(reader: ConfigReader, plans: tuple[PlanSettings, ...], zone: str, gke_version: str,
                              generation: TpuGeneration | None, allow_unlisted_zone: bool) -> None:
    """The rules that need only the version, the zone and the TPU generation."""
    if not _GKE_VERSION.match(gke_version):
        return
    reader.check("gkeVersion", gke_version_at_least(gke_version, MIN_GKE_FOR_RAY_OPERATOR),
                 f"{gke_version} is older than the Ray Operator add-on's {MIN_GKE_FOR_RAY_OPERATOR}")
    if generation is not None:
        reader.check("gkeVersion", gke_version_at_least(gke_version, generation.min_gke_version),
                     f"{gke_version} is older than TPU {generation.name}'s {generation.min_gke_version}")
    if not any(plan.flex_start for plan in plans):
        return
    reader.check("gkeVersion", gke_version_at_least(gke_version, MIN_GKE_FOR_QUEUED_TPU),
                 f"{gke_version} is too old for TPU flex-start with queued provisioning (plan B); "
                 f"use {MIN_GKE_FOR_QUEUED_TPU} or later, or set flexStart.maxSlices to 0")
    if generation is not None and not allow_unlisted_zone:
        reader.check("zone", zone in generation.flex_start_zones,
                     f"{zone} offers no flex-start TPU {generation.name} per the catalogue "
                     f"({ZONES_AS_OF}); zones: {', '.join(sorted(generation.flex_start_zones))}. A zone "
                     "added since: set tpu.allowUnlistedZone")


def _check_plans(reader: ConfigReader, settings: PlatformSettings) -> None:
    reader.check("onDemand.maxSlices", bool(settings.plans),
                 "every rung is off (onDemand.maxSlices and flexStart.maxSlices are 0, no reservation or spot); "
                 "turn one on")
    taken: dict[str, str] = {}
    for plan in settings.plans:
        clash = sorted(name for name in plan.pool_names(settings.tpu) if name in taken)
        reader.check(f"{plan.config_key}.nodePool", not clash,
                     f"node pool name(s) {', '.join(clash)} also used by "
                     f"{', '.join(sorted({taken[name] for name in clash}))}.nodePool")
        taken.update({name: plan.config_key for name in plan.pool_names(settings.tpu)})
    for plan in settings.plans:
        names = plan.pool_names(settings.tpu)
        reader.check(f"{plan.config_key}.nodePool", SYSTEM_POOL_NAME not in names,
                     f"{SYSTEM_POOL_NAME!r} is the CPU pool's name")
        longest = max(names, key=len)
        reader.check(f"{plan.config_key}.nodePool", len(longest) <= 40,
                     f"derived pool name {longest!r} is longer than GKE's 40 characters; shorten nodePool")


def _read_kueue(reader: ConfigReader) -> tuple[str, str]:
    """The Kueue chart's version and the repository it comes from (a mirror for air-gapped clusters)."""
    raw = reader.obj("kueue", DEFAULTS["kueue"])
    version, repository = raw["version"], raw["chartRepository"]
    reader.check("kueue.chartRepository", bool(_CHART_REPOSITORY.match(repository)),
                 f"{repository!r} is not a Helm repository URL; use oci://host/path (like the default "
                 f"{DEFAULTS['kueue']['chartRepository']}) or https://host/path")
    match = _SEMVER.match(version)
    if not reader.check("kueue.version", match is not None,
                        f"{version!r} is not a chart version like 0.19.2 (no leading v)"):
        return version, repository
    reader.check("kueue.version", tuple(map(int, match.groups())) >= MIN_KUEUE_VERSION,
                 f"{version} predates v1beta2 storage; use {'.'.join(map(str, MIN_KUEUE_VERSION))} or later")
    return version, repository


def duration_seconds(value: str) -> int | None:
    """Seconds of a duration such as 90s, 15m or 1h; None when it is not one."""
    match = _DURATION.match(value)
    return None if match is None else int(match[1]) * _SECONDS_PER_UNIT[match[2]]


def _duration_seconds(reader: ConfigReader, name: str, value: str) -> int | None:
    seconds = duration_seconds(value)
    reader.check(name, seconds is not None, f"{value!r} is not a duration; use a number and s, m or h, "
                                            "such as 90s, 15m or 1h")
    return seconds


def read_fallback_settings(reader: ConfigReader) -> FallbackSettings | None:
    """`fallback` in seconds, or None when a duration is unreadable (`reader.problems` says why)."""
    raw = reader.obj("fallback", DEFAULTS["fallback"])
    timeout = _duration_seconds(reader, "fallback.podsReadyTimeout", raw["podsReadyTimeout"])
    grace = _duration_seconds(reader, "fallback.stockoutGracePeriod", raw["stockoutGracePeriod"])
    if timeout is None or grace is None:
        return None
    reader.check("fallback.podsReadyTimeout",
                 MIN_PODS_READY_TIMEOUT_SECONDS <= timeout <= MAX_PODS_READY_TIMEOUT_SECONDS,
                 f"{raw['podsReadyTimeout']} is out of range; use {MIN_PODS_READY_TIMEOUT_SECONDS}s to "
                 f"{MAX_PODS_READY_TIMEOUT_SECONDS // 3600}h")
    reader.check("fallback.stockoutGracePeriod", grace < timeout,
                 f"{raw['stockoutGracePeriod']} is not shorter than podsReadyTimeout {raw['podsReadyTimeout']}; "
                 "by then Kueue has already evicted the job, so the early failover would never act")
    recovery = _read_per_rung_durations(reader, "fallback.sliceRecoveryWait", raw["sliceRecoveryWait"],
                                        DEFAULTS["fallback"]["sliceRecoveryWait"], MIN_RECOVERY_WAIT_SECONDS,
                                        MAX_RECOVERY_WAIT_SECONDS)
    return FallbackSettings(timeout, grace, tuple(sorted(recovery)))  # one order, whatever the config's


def read_controller_runtime(reader: ConfigReader) -> ControllerRuntime:
    """`failoverController`: a pinned prebuilt image, or a pip index mirror; not both (the image needs no pip)."""
    raw = reader.obj("failoverController", DEFAULTS["failoverController"])
    image, index = raw["image"], raw["pipIndexUrl"]
    if image:
        reader.check("failoverController.image", bool(_PINNED_IMAGE.match(image)),
                     f"{image!r} is not an image pinned by tag or digest, such as "
                     "us-docker.pkg.dev/my-project/tools/tpu-fallback-failover:1 (never :latest)")
    if index:
        reader.check("failoverController.pipIndexUrl", bool(_HTTPS_URL.match(index)),
                     f"{index!r} is not an https:// index URL, such as https://pypi.example.com/simple")
    reader.check("failoverController", not (image and index),
                 "set image or pipIndexUrl, not both: the prebuilt image installs nothing at start")
    return ControllerRuntime(image, index)


def read_monitoring_settings(reader: ConfigReader) -> MonitoringSettings:
    """`monitoring`, with its `alerts` object merged field by field over the defaults."""
    raw = reader.obj("monitoring", DEFAULTS["monitoring"])
    alerts = reader.fields("monitoring.alerts", raw["alerts"], DEFAULTS["monitoring"]["alerts"])
    return MonitoringSettings(raw["enabled"], AlertSettings(
        alerts["enabled"], _read_pending_too_long(reader, alerts["pendingTooLong"]),
        _read_moves_per_hour(reader, alerts["movesPerHour"]),
        _read_notification_channels(reader, alerts["notificationChannels"])))


def _read_pending_too_long(reader: ConfigReader, given: dict) -> tuple[tuple[str, int], ...]:
    return _read_per_rung_durations(reader, "monitoring.alerts.pendingTooLong", given,
                                    DEFAULTS["monitoring"]["alerts"]["pendingTooLong"], MIN_PENDING_ALERT_SECONDS,
                                    MAX_PENDING_ALERT_SECONDS)


def _read_per_rung_durations(reader: ConfigReader, name: str, given: dict, defaults: Mapping[str, str],
                             minimum: int, maximum: int) -> tuple[tuple[str, int], ...]:
    """A duration per rung config key, or `default`; the given keys over the defaults. A rung that is off in this
    stack is allowed (its entry waits for it), a name that is no rung is not."""
    waits = dict(defaults)
    for rung, value in given.items():
        where = f"{name}.{rung}"
        if rung != DEFAULT_RUNG and rung not in RUNG_KINDS:
            reader.fail(where, f"unknown rung {rung!r}; use {DEFAULT_RUNG} or one of {', '.join(RUNG_KINDS)}")
        elif not isinstance(value, str):
            reader.fail(where, f"must be a duration string such as 90m; got {value!r}")
        else:
            waits[rung] = value
    found = []
    for rung, value in waits.items():
        seconds = _duration_seconds(reader, f"{name}.{rung}", value)
        if seconds is None:
            continue
        if reader.check(f"{name}.{rung}", minimum <= seconds <= maximum,
                        f"{value} is out of range; use {_short(minimum)} to {_short(maximum)}"):
            found.append((rung, seconds))
    return tuple(found)


def _short(seconds: int) -> str:
    """A bound as a duration a user types: 30s, 5m, 24h."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _read_moves_per_hour(reader: ConfigReader, value: int) -> int:
    reader.check("monitoring.alerts.movesPerHour", 0 <= value <= MAX_MOVES_PER_HOUR,
                 f"{value} is out of range; moves per hour from one rung above which the alert fires, 0 (any "
                 f"move) to {MAX_MOVES_PER_HOUR}")
    return value


def _read_notification_channels(reader: ConfigReader, channels: list) -> tuple[str, ...]:
    name = "monitoring.alerts.notificationChannels"
    for index, channel in enumerate(channels):
        reader.check(f"{name}[{index}]", isinstance(channel, str) and bool(_NOTIFICATION_CHANNEL.match(channel)),
                     f"{channel!r} is not a notification channel's name, "
                     "projects/<project>/notificationChannels/<id> (gcloud beta monitoring channels list)")
    reader.check(name, len(set(map(str, channels))) == len(channels), "a channel is listed twice")
    return tuple(channels)


def read_fleet_member(reader: ConfigReader, plans: tuple[PlanSettings, ...],
                      teams: tuple[TeamSettings, ...]) -> FleetMemberSettings | None:
    """`fleetMember`: None unless enabled. The start rung must be enabled here; and no teams: a fleet job's
    namespace is the fleet's own (infra/fleet_member.py), which no team's queues admit. `rungs`: the rungs besides
    the start rung (always the fleet's last step, DWS everywhere by default) that the fleet may use here one member at
    a time, each enabled here and without an admission check (a DWS request is the last step's, in every member)."""
    raw = reader.obj("fleetMember", DEFAULTS["fleetMember"])
    if not raw["enabled"]:
        return None
    enabled = [plan.config_key for plan in plans]
    reader.check("fleetMember.startRung", raw["startRung"] in enabled,
                 f"{raw['startRung']!r} is not an enabled rung of this stack; use one of {', '.join(enabled)} "
                 "(flexStart, the default, admits a fleet job only once DWS has provisioned its slice)")
    reader.check("fleetMember.enabled", not teams,
                 "a platform with teams cannot be a fleet member yet: the teams' queues admit only their own "
                 "namespaces; use a single-team platform stack per region as a member")
    rungs = raw["rungs"]
    ladder: list[str] = []
    for index, key in enumerate(rungs):
        where = f"fleetMember.rungs[{index}]"
        plan = next((p for p in plans if p.config_key == key), None)
        if not reader.check(where, plan is not None,
                            f"{key!r} is not an enabled rung of this stack; use some of {', '.join(enabled)}"):
            continue
        # The start rung is always the fleet's last step, in every member at once: listed here it would read as a
        # step of its own, one member at a time, which it never is.
        if not reader.check(where, key != raw["startRung"],
                            f"{key!r} is this member's startRung, always the fleet's last step (in every member at "
                            "once); list only the rungs besides it (reservation, onDemand, spot)"):
            continue
        if not reader.check(where, not plan.kind.admission_check,
                            f"{key!r} provisions before admission: it is the fleet's last step, in every member at "
                            "once (startRung); list reservation, onDemand or spot rungs here"):
            continue
        if not reader.check(where, key not in ladder, f"{key!r} is listed twice"):
            continue
        ladder.append(key)
        # The step's LocalQueue (here and on the manager) is named after the rung and this stack; a job carries the
        # name in its label kueue.x-k8s.io/queue-name, so it must be a label value (infra/fleet_member.py step_name).
        name = f"fleet-{plan.flavor}-{pulumi.get_stack().lower()}"
        reader.check(where, len(name) <= MAX_STEP_NAME,
                     f"the fleet's step here would be named {name!r}, {len(name)} characters; a queue name is a "
                     f"label value, at most {MAX_STEP_NAME}: use a shorter stack name")
    return FleetMemberSettings(raw["startRung"], tuple(k for k in enabled if k in ladder))


@dataclass(frozen=True)
class ClusterKeys:
    """The keys every cluster of this program reads (a region's, or a fleet's manager): machine None when unreadable."""

    project: str
    zone: str
    cluster_name: str
    gke_version: str
    deletion_protection: bool
    machine: CpuMachineType | None
    node_count: int


def read_cluster_keys(reader: ConfigReader, gcp_config: pulumi.Config, cluster_name_default: str = DEFAULTS[
        "clusterName"], system_pool_default: Mapping[str, Any] = DEFAULTS["systemPool"]) -> ClusterKeys:
    project = gcp_config.get("project")
    if project is None:
        reader.problems.append("gcp:project: required; run `pulumi config set gcp:project <your-project-id>`")
    elif not _PROJECT_ID.match(project):
        reader.problems.append(f"gcp:project: {project!r} is not a GCP project ID")
    zone = reader.text("zone", DEFAULTS["zone"], _ZONE, "use a zone such as us-east5-b")
    cluster_name = reader.text(
        "clusterName", cluster_name_default, _CLUSTER_NAME,
        "GKE cluster names are 1-40 lowercase letters, digits or hyphens, start with a letter, end alphanumeric")
    gke_version = reader.text("gkeVersion", DEFAULTS["gkeVersion"], _GKE_VERSION,
                              "use a GKE version such as 1.34 or 1.34.1-gke.1829001")
    deletion_protection = reader.boolean("deletionProtection", DEFAULTS["deletionProtection"])

    system_raw = reader.obj("systemPool", system_pool_default)
    machine = _lookup_or_fail(reader, "systemPool.machineType", lookup_cpu_machine, system_raw["machineType"])
    reader.check("systemPool.nodeCount", 1 <= system_raw["nodeCount"] <= 100,
                 f"{system_raw['nodeCount']} is out of range; Kueue and the Ray heads need 1 to 100 nodes")
    return ClusterKeys(project or "", zone, cluster_name, gke_version, deletion_protection, machine,
                       system_raw["nodeCount"])


def read_platform_settings(reader: ConfigReader, gcp_config: pulumi.Config) -> PlatformSettings | None:
    """The platform half of the settings, built whenever its parts are readable so that the checks which need
    it (pool names, the workloads' fit) run in the same pass; only valid when `reader.problems` is empty.
    None when a part is unreadable (`reader.problems` says why)."""
    keys = read_cluster_keys(reader, gcp_config)
    project, zone, cluster_name, gke_version = keys.project, keys.zone, keys.cluster_name, keys.gke_version
    deletion_protection, machine = keys.deletion_protection, keys.machine

    tpu, generation, allow_unlisted_zone = _read_tpu(reader, zone)
    plans = _read_rung_order(reader, {key: _read_plan(reader, kind) for key, kind in RUNG_KINDS.items()})
    kueue_version, kueue_chart_repository = _read_kueue(reader)
    fallback = read_fallback_settings(reader)
    failover_controller = read_controller_runtime(reader)
    monitoring = read_monitoring_settings(reader)
    teams = read_teams(reader)
    team_share_order = read_team_share_order(reader, teams)
    groups_domain = read_groups_domain(reader, teams)
    fleet_member = read_fleet_member(reader, plans, teams)

    _check_versions_and_zones(reader, plans, zone, gke_version, generation, allow_unlisted_zone)
    if tpu is None or machine is None or fallback is None:
        return None
    settings = PlatformSettings(
        project=project or "", zone=zone, cluster_name=cluster_name, gke_version=gke_version,
        deletion_protection=deletion_protection,
        system_pool=SystemPoolSettings(machine, keys.node_count),
        tpu=tpu, plans=plans, kueue_version=kueue_version, kueue_chart_repository=kueue_chart_repository,
        fallback=fallback, failover_controller=failover_controller, monitoring=monitoring,
        teams=teams, team_share_order=team_share_order, groups_domain=groups_domain, fleet_member=fleet_member,
    )
    _check_plans(reader, settings)
    _check_team_capacity(reader, settings)
    return settings


def _slices(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_SLICES_PER_PLAN


def _read_team(reader: ConfigReader, where: str, item: Any) -> TeamSettings | None:
    """One entry of `teams`, every bad field named; None when it cannot be used."""
    if not isinstance(item, dict) or not {"name", "namespace", "groups", "shares"} <= set(item):
        reader.fail(where, f"must be an object with fields name, namespace, groups, shares (and optionally "
                           f"borrowingLimit, lendingLimit); got {item!r}")
        return None
    ok = reader.check(where, set(item) <= set(TEAM_FIELDS),
                      f"unknown field(s) {', '.join(sorted(set(item) - set(TEAM_FIELDS)))}; allowed: "
                      f"{', '.join(TEAM_FIELDS)}")
    name, namespace, groups, shares = item["name"], item["namespace"], item["groups"], item["shares"]
    ok &= reader.check(f"{where}.name", isinstance(name, str) and bool(_TEAM_NAME.match(name)),
                       f"{name!r} is not a team name (1-30 lowercase letters, digits, hyphens; starts with a letter)")
    ok &= reader.check(f"{where}.namespace", isinstance(namespace, str) and bool(_DNS_LABEL.match(namespace)),
                       f"{namespace!r} is not a namespace name (a DNS label: 1-63 lowercase letters, digits, hyphens)")
    if ok and (namespace in SYSTEM_NAMESPACES or namespace.startswith(SYSTEM_NAMESPACE_PREFIXES)):
        ok = reader.check(f"{where}.namespace", False, f"{namespace!r} is a system namespace; no team may take "
                          f"{', '.join(sorted(SYSTEM_NAMESPACES))} or {'*, '.join(SYSTEM_NAMESPACE_PREFIXES)}*")
    good_groups = isinstance(groups, list) and bool(groups) and all(
        isinstance(g, str) and _EMAIL.match(g) for g in groups)
    ok &= reader.check(f"{where}.groups", good_groups, f"{groups!r} is not a non-empty list of Google group "
                                                       "emails, such as [ml-team-a@example.com]")
    ok &= reader.check(f"{where}.groups", not good_groups or len(set(groups)) == len(groups), "a group is listed twice")
    good_shares = isinstance(shares, dict) and set(shares) <= set(GUARANTEED_RUNGS) and all(
        _slices(v) for v in shares.values())
    ok &= reader.check(f"{where}.shares", good_shares,
                       f"{shares!r} is not an object of slices (0 to {MAX_SLICES_PER_PLAN}) per guaranteed rung: "
                       f"{', '.join(GUARANTEED_RUNGS)}")
    limits = {}
    for field in ("borrowingLimit", "lendingLimit"):
        limits[field] = item.get(field)
        ok &= reader.check(f"{where}.{field}", limits[field] is None or _slices(limits[field]),
                           f"{limits[field]!r} is not a number of slices (0 to {MAX_SLICES_PER_PLAN})")
    if not ok:
        return None
    team = TeamSettings(name, namespace, tuple(groups), tuple((k, shares.get(k, 0)) for k in GUARANTEED_RUNGS),
                        limits["borrowingLimit"], limits["lendingLimit"])
    lent = [slices for _, slices in team.shares if slices > 0]
    if team.lending_limit is not None:
        # Kueue's webhook: lendingLimit <= nominalQuota, and it is set on each rung the team has a share of.
        reader.check(f"{where}.lendingLimit", bool(lent) and team.lending_limit <= min(lent),
                     f"{team.lending_limit} is more than the team's smallest share ({min(lent, default=0)}); a "
                     "team lends at most what it holds")
    return team


def read_teams(reader: ConfigReader) -> tuple[TeamSettings, ...]:
    """`teams`: the teams sharing this platform, each name and namespace once."""
    teams = [team for index, item in enumerate(reader.array("teams", DEFAULTS["teams"]))
             if (team := _read_team(reader, f"teams[{index}]", item)) is not None]
    for field in ("name", "namespace"):
        values = [getattr(team, field) for team in teams]
        twice = sorted({v for v in values if values.count(v) > 1})
        reader.check("teams", not twice, f"{field}(s) {', '.join(twice)} used by more than one team")
    return tuple(teams)


def read_team_share_order(reader: ConfigReader, teams: tuple[TeamSettings, ...]) -> str:
    """`teamShareOrder`: `ladder` (a team's job takes its shares in the ladder's order, reclaiming a lent one before
    it goes down to its next rung) or `freeFirst` (a free share on any rung before a reclaim: fewer restarts of
    borrowers, more cost). Only with teams."""
    order = reader.text("teamShareOrder", DEFAULTS["teamShareOrder"])
    reader.check("teamShareOrder", order in SHARE_ORDERS,
                 f"{order!r} is not a share order; use {' or '.join(SHARE_ORDERS)}")
    reader.check("teamShareOrder", bool(teams) or order == DEFAULTS["teamShareOrder"],
                 "set only with teams (it orders a team's shares)")
    return order


def read_groups_domain(reader: ConfigReader, teams: tuple[TeamSettings, ...]) -> str:
    """`googleGroupsDomain`: needed by teams (their groups are bound through gke-security-groups@<domain>)."""
    domain = reader.text("googleGroupsDomain", DEFAULTS["googleGroupsDomain"])
    reader.check("googleGroupsDomain", not domain or bool(_DOMAIN.match(domain)),
                 f"{domain!r} is not a domain; use the Google Workspace or Cloud Identity domain, such as example.com")
    if teams:
        reader.check("googleGroupsDomain", bool(domain), f"required with teams: the cluster reads team groups "
                                                         f"through {SECURITY_GROUP_NAME}@<domain>")
    else:
        reader.check("googleGroupsDomain", not domain, "set only with teams (it changes the cluster's RBAC)")
    return domain


def _check_team_capacity(reader: ConfigReader, settings: PlatformSettings) -> None:
    """The shares of a rung fit in it, and the teams' Ray head shares in the CPU pool: capacity counted once."""
    if not settings.teams:
        return
    for key in GUARANTEED_RUNGS:
        plan = settings.plan(key)
        capacity = plan.max_slices if plan else 0
        total = sum(team.share(key) for team in settings.teams)
        reader.check("teams", total <= capacity,
                     f"the teams' {key} shares add up to {total} slices; {key} holds {capacity}")
    slices = sum(team.guaranteed_slices for team in settings.teams)
    system = settings.system_pool
    for need, have, unit in ((slices * JOB_HEAD_CPU, system.node_count * system.machine.vcpus, "vCPUs"),
                             (slices * JOB_HEAD_MEMORY_GIB, system.node_count * system.machine.memory_gib, "GiB")):
        reader.check("teams", need <= have, f"the teams' Ray heads need {need} {unit} of the CPU pool for their "
                                            f"{slices} guaranteed slices; systemPool has {have}")


def _lookup_or_fail(reader: ConfigReader, name: str, lookup: Callable[[str], Any], value: str) -> Any:
    try:
        return lookup(value)
    except ValueError as err:
        reader.fail(name, str(err))
        return None


def tpu_quota(settings: PlatformSettings) -> dict[str, int]:
    """Chips per TPU quota kind (onDemand, preemptible, reserved) the enabled rungs draw on."""
    quota: dict[str, int] = {}
    for plan in settings.plans:
        quota[plan.kind.tpu_quota] = quota.get(plan.kind.tpu_quota, 0) + plan.chips(settings.tpu)
    return quota
