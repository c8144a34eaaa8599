"""Stack settings: read from Pulumi config once, validated into frozen objects before any resource exists.

Every problem is collected and reported at once, each line naming the config key and what is allowed, so a
bad stack file stops `pulumi up` (and preview) before anything is registered.

    keys.py, keys_roles.py   the configuration table: every key's one default, type, range and description
    table.py                 renders Pulumi.yaml's `config:` block and docs/configuration.md from it
    schema.py                the table's shape (Setting, Bounds)
    constants.py             domain constants: version floors, bounds, the teams' fixed sizes
    formats.py               patterns and parsers: names, versions, durations
    reader.py                ConfigReader, SettingsError and the shared reading helpers
    cluster.py, rungs.py, fallback.py, monitoring.py, teams.py, fleet_member.py
                             one concern each: its frozen settings and its reader
    regional.py              PlatformSettings and read_platform_settings, the regional stack's whole pass

Everything other modules import is re-exported here: `from infra.settings import X`.
"""

from infra.settings.cluster import ClusterKeys, SystemPoolSettings, read_cluster_keys
from infra.settings.constants import (DEFAULT_RUNG, GUARANTEED_RUNGS, JOB_HEAD_CPU, JOB_HEAD_MEMORY_GIB,
                                      MAX_MOVES_PER_HOUR, MAX_PENDING_ALERT_SECONDS, MAX_PODS_READY_TIMEOUT_SECONDS,
                                      MAX_RECOVERY_WAIT_SECONDS, MAX_SLICES_PER_PLAN, MAX_STEP_NAME,
                                      MIN_GKE_FOR_QUEUED_TPU, MIN_GKE_FOR_RAY_OPERATOR, MIN_KUEUE_VERSION,
                                      MIN_PENDING_ALERT_SECONDS, MIN_PODS_READY_TIMEOUT_SECONDS,
                                      MIN_RECOVERY_WAIT_SECONDS, NAMESPACE, SECURITY_GROUP_NAME,
                                      SHARE_ORDER_FREE_FIRST, SHARE_ORDER_LADDER, SHARE_ORDERS, SUBMITTER_CPU,
                                      SUBMITTER_MEMORY_GIB, SYSTEM_NAMESPACE_PREFIXES, SYSTEM_NAMESPACES,
                                      SYSTEM_POOL_NAME)
from infra.settings.fallback import ControllerRuntime, FallbackSettings, read_controller_runtime, read_fallback_settings
from infra.settings.fleet_member import FleetMemberSettings, read_fleet_member
from infra.settings.formats import (CLUSTER_NAME as _CLUSTER_NAME, DNS_LABEL, FULLY_QUALIFIED_STACK,
                                    GKE_VERSION as _GKE_VERSION, duration_seconds, gke_version_at_least,
                                    gke_version_tuple)
from infra.settings.keys import DEFAULTS, KEYS, key_default, setting
from infra.settings.monitoring import AlertSettings, MonitoringSettings, read_monitoring_settings
from infra.settings.regional import PlatformSettings, read_platform_settings
from infra.settings.reader import ConfigReader, SettingsError
from infra.settings.rungs import NodeShutdown, PlanSettings, PoolSpec, ReservedSlices, tpu_quota
from infra.settings.teams import (TEAM_FIELDS, TeamSettings, read_groups_domain, read_team_share_order,
                                  read_teams)

__all__ = [
    "DEFAULTS", "KEYS", "key_default", "setting",
    "AlertSettings", "ClusterKeys", "ConfigReader", "ControllerRuntime", "FallbackSettings", "FleetMemberSettings",
    "MonitoringSettings", "NodeShutdown", "PlanSettings", "PlatformSettings", "PoolSpec", "ReservedSlices", "SettingsError",
    "SystemPoolSettings", "TeamSettings",
    "read_cluster_keys", "read_controller_runtime", "read_fallback_settings", "read_fleet_member",
    "read_groups_domain", "read_monitoring_settings", "read_platform_settings", "read_team_share_order",
    "read_teams", "tpu_quota",
    "duration_seconds", "gke_version_at_least", "gke_version_tuple", "DNS_LABEL", "FULLY_QUALIFIED_STACK",
    "_CLUSTER_NAME", "_GKE_VERSION",
    "DEFAULT_RUNG", "GUARANTEED_RUNGS", "JOB_HEAD_CPU", "JOB_HEAD_MEMORY_GIB", "MAX_MOVES_PER_HOUR",
    "MAX_PENDING_ALERT_SECONDS", "MAX_PODS_READY_TIMEOUT_SECONDS", "MAX_RECOVERY_WAIT_SECONDS",
    "MAX_SLICES_PER_PLAN", "MAX_STEP_NAME", "MIN_GKE_FOR_QUEUED_TPU", "MIN_GKE_FOR_RAY_OPERATOR",
    "MIN_KUEUE_VERSION", "MIN_PENDING_ALERT_SECONDS", "MIN_PODS_READY_TIMEOUT_SECONDS", "MIN_RECOVERY_WAIT_SECONDS",
    "NAMESPACE", "SECURITY_GROUP_NAME", "SHARE_ORDER_FREE_FIRST", "SHARE_ORDER_LADDER", "SHARE_ORDERS",
    "SUBMITTER_CPU", "SUBMITTER_MEMORY_GIB", "SYSTEM_NAMESPACE_PREFIXES", "SYSTEM_NAMESPACES", "SYSTEM_POOL_NAME",
    "TEAM_FIELDS",
]
