"""What a platform stack publishes for its team stacks, and how a team stack reads it back.

A team stack builds its RayJobs with the same workloads module as a single-team stack, which takes the platform's
settings as plain values (the slice shape, the CPU pool that runs the Ray heads, the rungs). The platform stack
publishes them as one plain output, `platform`; a team stack rebuilds a PlatformSettings from it and checks it
the way the platform checked its config (an unknown machine type or slice is a problem, not a crash).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infra.cpu import lookup_cpu_machine
from infra.rungs import RUNG_KINDS
from infra.settings import (FallbackSettings, NodeShutdown, PlanSettings, PlatformSettings, ReservedSlices,
                            SystemPoolSettings)
from infra.settings.climb_back import table_climb_back
from infra.tpu import lookup_slice
from workloads.jobs import TeamNamespace

PLATFORM_OUTPUT = "platform"
TEAMS_OUTPUT = "teams"  # {name: {namespace, localQueue, queueChain}}, exported by the platform with teams
KUBECONFIG_OUTPUT = "kubeconfig"  # secret


def platform_output(settings: PlatformSettings) -> dict[str, Any]:
    """The platform's settings that team stacks build on, as plain data (known at preview: no resource output)."""
    return {
        "project": settings.project,
        "zone": settings.zone,
        "clusterName": settings.cluster_name,
        "gkeVersion": settings.gke_version,
        "systemPool": {"machineType": settings.system_pool.machine.name, "nodeCount": settings.system_pool.node_count},
        "tpu": {"machineType": settings.tpu.machine_type.name, "topology": settings.tpu.topology},
        # The enabled rungs in the order Kueue tries them.
        "rungs": [_rung_output(plan) for plan in settings.plans],
        "kueue": {"version": settings.kueue_version, "chartRepository": settings.kueue_chart_repository},
        "fallback": {"podsReadyTimeoutSeconds": settings.fallback.pods_ready_timeout_seconds,
                     "stockoutGracePeriodSeconds": settings.fallback.stockout_grace_period_seconds,
                     "sliceRecoveryWaitSeconds": dict(settings.fallback.slice_recovery_wait)},
    }


def _rung_output(plan: PlanSettings) -> dict[str, Any]:
    """One enabled rung; the Spot rung's extended graceful shutdown only when set (a team stack sizes its TPU
    workers' grace period from it: workloads/rayjob.py), so a platform at GKE's default publishes what it did."""
    rung = {"rung": plan.config_key, "nodePool": plan.node_pool, "maxSlices": plan.max_slices,
            "reservations": [{"name": r.name, "slices": r.slices} for r in plan.reservations]}
    if plan.shutdown is not None:
        rung["gracefulTerminationSeconds"] = plan.shutdown.seconds
    return rung


def cluster_id(settings: PlatformSettings) -> str:
    """The GKE cluster's ID as pulumi-gcp gives it (`projects/{{project}}/locations/{{location}}/clusters/{{name}}`):
    the identity of a team stack's Kubernetes provider, so a new kubeconfig text alone replaces nothing.
    Ref: https://registry.terraform.io/providers/hashicorp/google/latest/docs/resources/container_cluster#id-1"""
    return f"projects/{settings.project}/locations/{settings.zone}/clusters/{settings.cluster_name}"


def settings_from_output(published: Mapping[str, Any]) -> PlatformSettings:
    """The platform's settings from its `platform` output. Raises KeyError, TypeError or ValueError (an unknown
    machine type or slice: the platform runs another version of this program) naming what is wrong."""
    system, tpu, kueue, fallback = (published["systemPool"], published["tpu"], published["kueue"],
                                    published["fallback"])
    plans = []
    for rung in published["rungs"]:
        if rung["rung"] not in RUNG_KINDS:
            raise ValueError(f"unknown rung {rung['rung']!r}")
        shutdown = rung.get("gracefulTerminationSeconds")
        plans.append(PlanSettings(RUNG_KINDS[rung["rung"]], rung["nodePool"], int(rung["maxSlices"]),
                                  tuple(ReservedSlices(r["name"], int(r["slices"])) for r in rung["reservations"]),
                                  NodeShutdown(int(shutdown)) if shutdown is not None else None))
    return PlatformSettings(
        project=str(published["project"]), zone=str(published["zone"]), cluster_name=str(published["clusterName"]),
        gke_version=str(published["gkeVersion"]), deletion_protection=False,  # the platform's to decide, not read
        system_pool=SystemPoolSettings(lookup_cpu_machine(system["machineType"]), int(system["nodeCount"])),
        tpu=lookup_slice(tpu["machineType"], tpu["topology"]), plans=tuple(plans),
        kueue_version=str(kueue["version"]), kueue_chart_repository=str(kueue["chartRepository"]),
        fallback=FallbackSettings(int(fallback["podsReadyTimeoutSeconds"]),
                                  int(fallback["stockoutGracePeriodSeconds"]),
                                  _recovery_waits(fallback["sliceRecoveryWaitSeconds"]),
                                  climb_back=table_climb_back(plan.kind for plan in plans)),
    )


def _recovery_waits(published: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    """The platform's lost-slice waits, as it published them (the stack's settings hold their one default)."""
    return tuple(sorted((str(rung), int(seconds)) for rung, seconds in published.items()))


def team_from_output(teams: Mapping[str, Any], team: str) -> TeamNamespace:
    """A team's namespace and LocalQueue from the platform's `teams` output (KeyError when it has no such team)."""
    entry = teams[team]
    namespace, local_queue = entry["namespace"], entry["localQueue"]
    if not (isinstance(namespace, str) and isinstance(local_queue, str)):
        raise TypeError(f"namespace and localQueue must be strings; got {entry!r}")
    return TeamNamespace(team, namespace, local_queue)
