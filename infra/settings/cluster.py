"""The cluster's own keys: project, zone, name, GKE version, the CPU pool, the TPU slice shape and Kueue's chart."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi

from infra.cpu import CpuMachineType, lookup_cpu_machine
from infra.settings.constants import (MAX_SYSTEM_NODES, MIN_GKE_FOR_QUEUED_TPU, MIN_GKE_FOR_RAY_OPERATOR,
                                      MIN_GKE_FOR_SPOT_GRACE, MIN_KUEUE_VERSION, MIN_SYSTEM_NODES,
                                      SPOT_GRACE_SECONDS, SYSTEM_POOL_NAME)
from infra.settings.formats import (CHART_REPOSITORY, CLUSTER_NAME, GKE_VERSION, PROJECT_ID, SEMVER, ZONE,
                                    gke_version_at_least)
from infra.settings.keys import DEFAULTS
from infra.settings.reader import ConfigReader, lookup_or_fail
from infra.settings.rungs import PlanSettings
from infra.tpu import MACHINE_TYPES, TpuGeneration, TpuSlice, lookup_slice


@dataclass(frozen=True)
class SystemPoolSettings:
    machine: CpuMachineType
    node_count: int
    name: str = SYSTEM_POOL_NAME


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
    elif not PROJECT_ID.match(project):
        reader.problems.append(f"gcp:project: {project!r} is not a GCP project ID")
    zone = reader.text("zone", DEFAULTS["zone"], ZONE, "use a zone such as us-east5-b")
    cluster_name = reader.text(
        "clusterName", cluster_name_default, CLUSTER_NAME,
        "GKE cluster names are 1-40 lowercase letters, digits or hyphens, start with a letter, end alphanumeric")
    gke_version = reader.text("gkeVersion", DEFAULTS["gkeVersion"], GKE_VERSION,
                              "use a GKE version such as 1.34 or 1.34.1-gke.1829001")
    deletion_protection = reader.boolean("deletionProtection", DEFAULTS["deletionProtection"])

    system_raw = reader.obj("systemPool", system_pool_default)
    machine = lookup_or_fail(reader, "systemPool.machineType", lookup_cpu_machine, system_raw["machineType"])
    reader.check("systemPool.nodeCount", MIN_SYSTEM_NODES <= system_raw["nodeCount"] <= MAX_SYSTEM_NODES,
                 f"{system_raw['nodeCount']} is out of range; Kueue and the Ray heads need {MIN_SYSTEM_NODES} to "
                 f"{MAX_SYSTEM_NODES} nodes")
    return ClusterKeys(project or "", zone, cluster_name, gke_version, deletion_protection, machine,
                       system_raw["nodeCount"])


def read_tpu(reader: ConfigReader, zone: str) -> tuple[TpuSlice | None, TpuGeneration | None, bool]:
    """The slice, and its generation as soon as the machine type is known (the zone is checked against it even
    while the topology is wrong: every key is reported in one pass)."""
    raw = reader.obj("tpu", DEFAULTS["tpu"])
    if not reader.check("tpu.machineType", raw["machineType"] in MACHINE_TYPES,
                        f"unknown TPU machine type {raw['machineType']!r}; known: {', '.join(MACHINE_TYPES)}"):
        return None, None, raw["allowUnlistedZone"]
    generation = MACHINE_TYPES[raw["machineType"]].generation
    if not raw["allowUnlistedZone"]:
        reader.check("zone", zone in generation.zones,
                     f"{zone} offers no TPU {generation.name} per the catalogue ({generation.zones_as_of}, "
                     f"{generation.zones_source}); zones: {', '.join(sorted(generation.zones))}. A zone added since: "
                     "set tpu.allowUnlistedZone")
    tpu = lookup_or_fail(reader, "tpu.topology", lambda topology: lookup_slice(raw["machineType"], topology),
                         raw["topology"])
    return tpu, generation, raw["allowUnlistedZone"]


def check_versions_and_zones(reader: ConfigReader, plans: tuple[PlanSettings, ...], zone: str, gke_version: str,
                             generation: TpuGeneration | None, allow_unlisted_zone: bool) -> None:
    """The rules that need only the version, the zone and the TPU generation."""
    if not GKE_VERSION.match(gke_version):
        return
    reader.check("gkeVersion", gke_version_at_least(gke_version, MIN_GKE_FOR_RAY_OPERATOR),
                 f"{gke_version} is older than the Ray Operator add-on's {MIN_GKE_FOR_RAY_OPERATOR}")
    if generation is not None:
        reader.check("gkeVersion", gke_version_at_least(gke_version, generation.min_gke_version),
                     f"{gke_version} is older than TPU {generation.name}'s {generation.min_gke_version} "
                     f"({generation.source})")
    for plan in plans:  # the enabled rungs: a Spot rung that is off sends nothing to GKE
        if plan.shutdown is not None:
            reader.check(f"{plan.config_key}.gracefulTermination",
                         gke_version_at_least(gke_version, MIN_GKE_FOR_SPOT_GRACE),
                         f"{plan.shutdown.seconds}s needs GKE {MIN_GKE_FOR_SPOT_GRACE} or later on the control plane "
                         f"(gkeVersion is {gke_version}); raise gkeVersion, or use {SPOT_GRACE_SECONDS}s")
    if not any(plan.flex_start for plan in plans):
        return
    reader.check("gkeVersion", gke_version_at_least(gke_version, MIN_GKE_FOR_QUEUED_TPU),
                 f"{gke_version} is too old for TPU flex-start with queued provisioning (plan B); "
                 f"use {MIN_GKE_FOR_QUEUED_TPU} or later, or set flexStart.maxSlices to 0")
    if generation is not None and not allow_unlisted_zone:
        reader.check("zone", zone in generation.flex_start_zones,
                     f"{zone} offers no flex-start TPU {generation.name} per the catalogue "
                     f"({generation.zones_as_of}, {generation.zones_source}); zones: "
                     f"{', '.join(sorted(generation.flex_start_zones))}. A zone added since: set tpu.allowUnlistedZone")


def read_kueue(reader: ConfigReader) -> tuple[str, str]:
    """The Kueue chart's version and the repository it comes from (a mirror for air-gapped clusters)."""
    raw = reader.obj("kueue", DEFAULTS["kueue"])
    version, repository = raw["version"], raw["chartRepository"]
    reader.check("kueue.chartRepository", bool(CHART_REPOSITORY.match(repository)),
                 f"{repository!r} is not a Helm repository URL; use oci://host/path (like the default "
                 f"{DEFAULTS['kueue']['chartRepository']}) or https://host/path")
    match = SEMVER.match(version)
    if not reader.check("kueue.version", match is not None,
                        f"{version!r} is not a chart version like 0.19.2 (no leading v)"):
        return version, repository
    reader.check("kueue.version", tuple(map(int, match.groups())) >= MIN_KUEUE_VERSION,
                 f"{version} predates v1beta2 storage; use {'.'.join(map(str, MIN_KUEUE_VERSION))} or later")
    return version, repository
