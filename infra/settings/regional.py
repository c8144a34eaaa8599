"""A regional stack's settings as one frozen object, read and checked in one pass."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from infra.rungs import RUNG_KINDS, SPOT
from infra.settings.cluster import (SystemPoolSettings, check_versions_and_zones, read_cluster_keys, read_kueue,
                                    read_tpu)
from infra.settings.constants import SECURITY_GROUP_NAME
from infra.settings.fallback import ControllerRuntime, FallbackSettings, read_controller_runtime, read_fallback_settings
from infra.settings.fleet_member import FleetMemberSettings, read_fleet_member
from infra.settings.keys import DEFAULTS
from infra.settings.monitoring import MonitoringSettings, read_monitoring_settings
from infra.settings.reader import ConfigReader
from infra.settings.rungs import NodeShutdown, PlanSettings, check_plans, read_plan, read_rung_order
from infra.settings.teams import (TeamSettings, check_team_capacity, read_groups_domain, read_team_share_order,
                                  read_teams)
from infra.tpu import TpuSlice


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
    team_share_order: str = DEFAULTS["teamShareOrder"]  # how a team's job picks among its shares (infra/teams.py)
    groups_domain: str = DEFAULTS["googleGroupsDomain"]  # the domain of gke-security-groups@<domain>
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

    @property
    def spot_shutdown(self) -> NodeShutdown:
        """The graceful shutdown the TPU workers' preStop hook and grace period are sized by: the Spot rung's while
        the rung is on, else GKE's default (no pool of this stack extends it)."""
        spot = self.plan(SPOT.key)
        return spot.shutdown if spot is not None and spot.shutdown is not None else NodeShutdown()

    def service_account_id(self, role: str) -> str:
        """`<cluster>-<role>`: service account IDs are 6-30 characters, so a long cluster name is cut."""
        return f"{self.cluster_name[:29 - len(role)].rstrip('-')}-{role}"


def read_platform_settings(reader: ConfigReader, gcp_config: pulumi.Config) -> PlatformSettings | None:
    """The platform half of the settings, built whenever its parts are readable so that the checks which need
    it (pool names, the workloads' fit) run in the same pass; only valid when `reader.problems` is empty.
    None when a part is unreadable (`reader.problems` says why)."""
    keys = read_cluster_keys(reader, gcp_config)
    project, zone, cluster_name, gke_version = keys.project, keys.zone, keys.cluster_name, keys.gke_version
    deletion_protection, machine = keys.deletion_protection, keys.machine

    tpu, generation, allow_unlisted_zone = read_tpu(reader, zone)
    plans = read_rung_order(reader, {key: read_plan(reader, kind) for key, kind in RUNG_KINDS.items()})
    kueue_version, kueue_chart_repository = read_kueue(reader)
    fallback = read_fallback_settings(reader, (plan.kind for plan in plans))
    failover_controller = read_controller_runtime(reader)
    monitoring = read_monitoring_settings(reader)
    teams = read_teams(reader)
    team_share_order = read_team_share_order(reader, teams)
    groups_domain = read_groups_domain(reader, teams)
    fleet_member = read_fleet_member(reader, plans, teams)

    check_versions_and_zones(reader, plans, zone, gke_version, generation, allow_unlisted_zone)
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
    check_plans(reader, settings)
    check_team_capacity(reader, settings)
    return settings
