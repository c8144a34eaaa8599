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
from infra.tpu import MACHINE_TYPES, ZONES_AS_OF, TpuSlice, lookup_slice

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
    "onDemand": {"nodePool": "on-demand-pool", "maxSlices": 1},
    "flexStart": {"nodePool": "dws-pool", "maxSlices": 1},
    "kueue": {"version": "0.19.2"},
    "fallback": {"podsReadyTimeout": "15m", "stockoutGracePeriod": "3m"},
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
# Kueue evicts a job whose pods are not all ready this long after admission. 30s suits only a test cluster (a TPU
# slice takes minutes to come up); over a day, a stocked-out job would hold a rung's quota for nothing.
MIN_PODS_READY_TIMEOUT_SECONDS = 30
MAX_PODS_READY_TIMEOUT_SECONDS = 24 * 3600

# GKE name rules. Ref: https://cloud.google.com/kubernetes-engine/docs/how-to/creating-a-zonal-cluster
_CLUSTER_NAME = re.compile(r"^[a-z](?:[-a-z0-9]{0,38}[a-z0-9])?$")
_NODE_POOL_NAME = re.compile(r"^[a-z](?:[-a-z0-9]{0,38}[a-z0-9])?$")
# Ref: https://cloud.google.com/resource-manager/docs/creating-managing-projects (project IDs)
_PROJECT_ID = re.compile(r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")
_ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
_GKE_VERSION = re.compile(r"^1\.(\d+)(?:\.(\d+)(?:-gke\.(\d+))?)?$")
_SEMVER = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
_DURATION = re.compile(r"^([0-9]+)(s|m|h)$")
_SECONDS_PER_UNIT = {"s": 1, "m": 60, "h": 3600}
SYSTEM_POOL_NAME = "default-pool"  # the seed's Kueue flavor and Ray head select this pool by name


class SettingsError(ValueError):
    """The stack configuration is invalid; `problems` holds one line per bad key."""

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

    def obj(self, name: str, defaults: Mapping[str, Any]) -> dict[str, Any]:
        """An object key merged over its defaults; unknown or mistyped fields are problems."""
        raw = self.config.get(name)
        if raw is None:
            return dict(defaults)
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = None
        if not isinstance(value, dict):
            self.fail(name, f"must be an object with fields {', '.join(defaults)}; got {raw!r}")
            return dict(defaults)
        merged = dict(defaults)
        for field, given in value.items():
            if field not in defaults:
                self.fail(f"{name}.{field}", f"unknown field; allowed: {', '.join(defaults)}")
            elif type(given) is not type(defaults[field]):
                kind = type(defaults[field]).__name__.replace("str", "string").replace("bool", "boolean")
                self.fail(f"{name}.{field}", f"must be a {kind}; got {given!r}")
            else:
                merged[field] = given
        return merged

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
class PlanSettings:
    """One way of getting TPU capacity: plan A (on-demand) or plan B (DWS flex-start, queued provisioning)."""

    config_key: str  # onDemand / flexStart
    flavor: str  # the Kueue ResourceFlavor name (the seed's on-demand / dws)
    node_pool: str
    max_slices: int
    flex_start: bool

    @property
    def enabled(self) -> bool:
        return self.max_slices > 0

    def pool_names(self, tpu: TpuSlice) -> tuple[str, ...]:
        """A multi-host slice is a whole node pool, so N slices need N pools; single-host slices share one."""
        if not tpu.is_multi_host or self.max_slices == 1:
            return (self.node_pool,)
        return tuple(f"{self.node_pool}-{i}" for i in range(1, self.max_slices + 1))

    def nodes_per_pool(self, tpu: TpuSlice) -> int:
        return tpu.hosts if tpu.is_multi_host else self.max_slices

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


@dataclass(frozen=True)
class PlatformSettings:
    project: str
    zone: str
    cluster_name: str
    gke_version: str
    deletion_protection: bool
    system_pool: SystemPoolSettings
    tpu: TpuSlice
    on_demand: PlanSettings
    flex_start: PlanSettings
    kueue_version: str
    fallback: FallbackSettings

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0]

    @property
    def plans(self) -> tuple[PlanSettings, ...]:
        """The enabled plans in the order Kueue tries them: A, then B."""
        return tuple(p for p in (self.on_demand, self.flex_start) if p.enabled)

    def service_account_id(self, role: str) -> str:
        """`<cluster>-<role>`: service account IDs are 6-30 characters, so a long cluster name is cut."""
        return f"{self.cluster_name[:29 - len(role)].rstrip('-')}-{role}"


def _read_plan(reader: ConfigReader, key: str, flavor: str, flex_start: bool) -> PlanSettings:
    raw = reader.obj(key, DEFAULTS[key])
    reader.check(f"{key}.nodePool", bool(_NODE_POOL_NAME.match(raw["nodePool"])),
                 f"{raw['nodePool']!r} is not a GKE node pool name (lowercase letters, digits and hyphens, "
                 "starting with a letter, at most 40 characters)")
    reader.check(f"{key}.maxSlices", 0 <= raw["maxSlices"] <= MAX_SLICES_PER_PLAN,
                 f"{raw['maxSlices']} is out of range; use 0 (plan off) to {MAX_SLICES_PER_PLAN}")
    return PlanSettings(key, flavor, raw["nodePool"], raw["maxSlices"], flex_start)


def _read_tpu(reader: ConfigReader, zone: str) -> tuple[TpuSlice | None, bool]:
    raw = reader.obj("tpu", DEFAULTS["tpu"])
    if not reader.check("tpu.machineType", raw["machineType"] in MACHINE_TYPES,
                        f"unknown TPU machine type {raw['machineType']!r}; known: {', '.join(MACHINE_TYPES)}"):
        return None, raw["allowUnlistedZone"]
    tpu = _lookup_or_fail(reader, "tpu.topology", lambda topology: lookup_slice(raw["machineType"], topology),
                          raw["topology"])
    if tpu is None:
        return None, raw["allowUnlistedZone"]
    if not raw["allowUnlistedZone"]:
        reader.check("zone", zone in tpu.generation.zones,
                     f"{zone} offers no TPU {tpu.generation.name} per the catalogue ({ZONES_AS_OF}); zones: "
                     f"{', '.join(sorted(tpu.generation.zones))}. A zone added since: set tpu.allowUnlistedZone")
    return tpu, raw["allowUnlistedZone"]


def _check_plans(reader: ConfigReader, settings: PlatformSettings, allow_unlisted_zone: bool) -> None:
    on_demand, flex = settings.on_demand, settings.flex_start
    reader.check("onDemand.maxSlices", on_demand.enabled or flex.enabled,
                 "both plans are off (onDemand.maxSlices and flexStart.maxSlices are 0); turn one on")
    if on_demand.enabled and flex.enabled:
        clash = set(on_demand.pool_names(settings.tpu)) & set(flex.pool_names(settings.tpu))
        reader.check("flexStart.nodePool", not clash,
                     f"node pool name(s) {', '.join(sorted(clash))} also used by onDemand.nodePool")
    for plan in settings.plans:
        names = plan.pool_names(settings.tpu)
        reader.check(f"{plan.config_key}.nodePool", SYSTEM_POOL_NAME not in names,
                     f"{SYSTEM_POOL_NAME!r} is the CPU pool's name")
        longest = max(names, key=len)
        reader.check(f"{plan.config_key}.nodePool", len(longest) <= 40,
                     f"derived pool name {longest!r} is longer than GKE's 40 characters; shorten nodePool")
    if flex.enabled:
        reader.check("gkeVersion", gke_version_at_least(settings.gke_version, MIN_GKE_FOR_QUEUED_TPU),
                     f"{settings.gke_version} is too old for TPU flex-start with queued provisioning (plan B); "
                     f"use {MIN_GKE_FOR_QUEUED_TPU} or later, or set flexStart.maxSlices to 0")
        generation = settings.tpu.generation
        if not allow_unlisted_zone:
            reader.check("zone", settings.zone in generation.flex_start_zones,
                         f"{settings.zone} offers no flex-start TPU {generation.name} per the catalogue "
                         f"({ZONES_AS_OF}); zones: {', '.join(sorted(generation.flex_start_zones))}. A zone "
                         "added since: set tpu.allowUnlistedZone")


def _read_kueue_version(reader: ConfigReader) -> str:
    version = reader.obj("kueue", DEFAULTS["kueue"])["version"]
    match = _SEMVER.match(version)
    if not reader.check("kueue.version", match is not None,
                        f"{version!r} is not a chart version like 0.19.2 (no leading v)"):
        return version
    reader.check("kueue.version", tuple(map(int, match.groups())) >= MIN_KUEUE_VERSION,
                 f"{version} predates v1beta2 storage; use {'.'.join(map(str, MIN_KUEUE_VERSION))} or later")
    return version


def _duration_seconds(reader: ConfigReader, name: str, value: str) -> int | None:
    match = _DURATION.match(value)
    if not reader.check(name, match is not None, f"{value!r} is not a duration; use a number and s, m or h, "
                                                  "such as 90s, 15m or 1h"):
        return None
    return int(match[1]) * _SECONDS_PER_UNIT[match[2]]


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
    return FallbackSettings(timeout, grace)


def read_platform_settings(reader: ConfigReader, gcp_config: pulumi.Config) -> PlatformSettings | None:
    """The platform half of the settings, or None when `reader.problems` says why not."""
    project = gcp_config.get("project")
    if project is None:
        reader.problems.append("gcp:project: required; run `pulumi config set gcp:project <your-project-id>`")
    elif not _PROJECT_ID.match(project):
        reader.problems.append(f"gcp:project: {project!r} is not a GCP project ID")
    zone = reader.text("zone", DEFAULTS["zone"], _ZONE, "use a zone such as us-east5-b")
    cluster_name = reader.text(
        "clusterName", DEFAULTS["clusterName"], _CLUSTER_NAME,
        "GKE cluster names are 1-40 lowercase letters, digits or hyphens, start with a letter, end alphanumeric")
    gke_version = reader.text("gkeVersion", DEFAULTS["gkeVersion"], _GKE_VERSION,
                              "use a GKE version such as 1.34 or 1.34.1-gke.1829001")
    deletion_protection = reader.boolean("deletionProtection", DEFAULTS["deletionProtection"])

    system_raw = reader.obj("systemPool", DEFAULTS["systemPool"])
    machine = _lookup_or_fail(reader, "systemPool.machineType", lookup_cpu_machine, system_raw["machineType"])
    reader.check("systemPool.nodeCount", 1 <= system_raw["nodeCount"] <= 100,
                 f"{system_raw['nodeCount']} is out of range; Kueue and the Ray heads need 1 to 100 nodes")

    tpu, allow_unlisted_zone = _read_tpu(reader, zone)
    on_demand = _read_plan(reader, "onDemand", "on-demand", flex_start=False)
    flex_start = _read_plan(reader, "flexStart", "dws", flex_start=True)
    kueue_version = _read_kueue_version(reader)
    fallback = read_fallback_settings(reader)

    if reader.problems or tpu is None or machine is None or project is None or fallback is None:
        return None
    settings = PlatformSettings(
        project=project, zone=zone, cluster_name=cluster_name, gke_version=gke_version,
        deletion_protection=deletion_protection,
        system_pool=SystemPoolSettings(machine, system_raw["nodeCount"]),
        tpu=tpu, on_demand=on_demand, flex_start=flex_start, kueue_version=kueue_version, fallback=fallback,
    )
    reader.check("gkeVersion", gke_version_at_least(gke_version, MIN_GKE_FOR_RAY_OPERATOR),
                 f"{gke_version} is older than the Ray Operator add-on's {MIN_GKE_FOR_RAY_OPERATOR}")
    reader.check("gkeVersion", gke_version_at_least(gke_version, tpu.generation.min_gke_version),
                 f"{gke_version} is older than TPU {tpu.generation.name}'s {tpu.generation.min_gke_version}")
    _check_plans(reader, settings, allow_unlisted_zone)
    return None if reader.problems else settings


def _lookup_or_fail(reader: ConfigReader, name: str, lookup: Callable[[str], Any], value: str) -> Any:
    try:
        return lookup(value)
    except ValueError as err:
        reader.fail(name, str(err))
        return None
