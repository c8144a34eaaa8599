"""The failover's timing (`fallback`) and where the failover controller's packages come from (`failoverController`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from failover.api.climbs import ClimbPolicy
from infra.rungs import RungKind

from infra.settings.constants import (DEFAULT_RUNG, MAINTENANCE_ACTIONS, MAX_PODS_READY_TIMEOUT_SECONDS,
                                      MIN_PODS_READY_TIMEOUT_SECONDS)
from infra.settings.formats import HTTPS_URL, PINNED_IMAGE, duration_seconds
from infra.settings.climb_back import read_climb_back
from infra.settings.keys import DEFAULTS
from infra.settings.reader import ConfigReader, read_bounded_duration, read_duration, read_per_rung_durations


_MAINTENANCE = DEFAULTS["fallback"]["maintenance"]
_CLIMB_BACK = DEFAULTS["fallback"]["climbBack"]


@dataclass(frozen=True)
class MaintenanceSettings:
    """`fallback.maintenance`: what the failover controller does ahead of a disruption it sees coming
    (failover/maintenance.py)."""

    action: str = _MAINTENANCE["action"]  # checkpoint, move or none
    lead_seconds: int = duration_seconds(_MAINTENANCE["leadTime"])
    save_timeout_seconds: int = duration_seconds(_MAINTENANCE["saveTimeout"])


@dataclass(frozen=True)
class FallbackSettings:
    """When a job on a rung counts as stocked out: Kueue's PodsReady timeout and, shorter, the grace period
    after which a failover controller may act on clear stockout signs before Kueue evicts."""

    pods_ready_timeout_seconds: int
    stockout_grace_period_seconds: int
    # (rung config key or DEFAULT_RUNG, seconds): how long a running job that lost its slice waits for it to be whole
    # again before it moves on (failover/slices.py)
    slice_recovery_wait: tuple[tuple[str, int], ...]
    maintenance: MaintenanceSettings = MaintenanceSettings()  # the regional controller's only: not published
    # fallback.climbBack as the controller reads it (infra/settings/climb_back.py); likewise (a team stack holds the
    # table's: table_climb_back)
    climb_back: ClimbPolicy | None = None
    probe: bool = _CLIMB_BACK["probe"]  # fallback.climbBack.probe (infra/failover.py probes)

    def recovery_seconds(self, rung: str) -> int:
        """The recovery wait of a rung (its config key): its own, or the default."""
        waits = dict(self.slice_recovery_wait)
        return waits.get(rung, waits[DEFAULT_RUNG])


@dataclass(frozen=True)
class ControllerRuntime:
    """Where the failover controller's Python packages come from: PyPI at each start (the default), an index
    mirror (`pip_index_url`), or nowhere at start: a prebuilt image that has the pins (`image`)."""

    image: str = DEFAULTS["failoverController"]["image"]
    pip_index_url: str = DEFAULTS["failoverController"]["pipIndexUrl"]


def read_fallback_settings(reader: ConfigReader, rungs_on: Iterable[RungKind]) -> FallbackSettings | None:
    """`fallback` in seconds, or None when a duration is unreadable (`reader.problems` says why); the climb back's
    rungs among `rungs_on`, the rungs on in this stack."""
    raw = reader.obj("fallback", DEFAULTS["fallback"])
    timeout = read_duration(reader, "fallback.podsReadyTimeout", raw["podsReadyTimeout"])
    grace = read_duration(reader, "fallback.stockoutGracePeriod", raw["stockoutGracePeriod"])
    if timeout is None or grace is None:
        return None
    reader.check("fallback.podsReadyTimeout",
                 MIN_PODS_READY_TIMEOUT_SECONDS <= timeout <= MAX_PODS_READY_TIMEOUT_SECONDS,
                 f"{raw['podsReadyTimeout']} is out of range; use {MIN_PODS_READY_TIMEOUT_SECONDS}s to "
                 f"{MAX_PODS_READY_TIMEOUT_SECONDS // 3600}h")
    reader.check("fallback.stockoutGracePeriod", grace < timeout,
                 f"{raw['stockoutGracePeriod']} is not shorter than podsReadyTimeout {raw['podsReadyTimeout']}; "
                 "by then Kueue has already evicted the job, so the early failover would never act")
    recovery = read_per_rung_durations(reader, "fallback.sliceRecoveryWait", raw["sliceRecoveryWait"],
                                       DEFAULTS["fallback"]["sliceRecoveryWait"])
    maintenance = read_maintenance_settings(reader, raw["maintenance"])
    climb = reader.fields("fallback.climbBack", raw["climbBack"], _CLIMB_BACK)
    climb_back = read_climb_back(reader, climb, _CLIMB_BACK, rungs_on, maintenance.save_timeout_seconds)
    return FallbackSettings(timeout, grace, tuple(sorted(recovery)), maintenance,  # one order, whatever the config's
                            climb_back, climb["probe"])


def read_maintenance_settings(reader: ConfigReader, given: dict) -> MaintenanceSettings:
    """`fallback.maintenance`, its fields merged over the defaults; the defaults where a value is unreadable (a
    problem names it)."""
    raw = reader.fields("fallback.maintenance", given, _MAINTENANCE)
    reader.check("fallback.maintenance.action", raw["action"] in MAINTENANCE_ACTIONS,
                 f"{raw['action']!r} is not an action; use {', '.join(MAINTENANCE_ACTIONS)}")
    bounded = {field: seconds for field in ("leadTime", "saveTimeout")
               if (seconds := read_bounded_duration(reader, f"fallback.maintenance.{field}", raw[field])) is not None}
    defaults = MaintenanceSettings()
    lead = bounded.get("leadTime", defaults.lead_seconds)
    save = bounded.get("saveTimeout", defaults.save_timeout_seconds)
    reader.check("fallback.maintenance.saveTimeout", save < lead,
                 f"{raw['saveTimeout']} is not shorter than leadTime {raw['leadTime']}: the save must be taken as done "
                 "before the disruption, for a move to come first")
    action = raw["action"] if raw["action"] in MAINTENANCE_ACTIONS else defaults.action
    return MaintenanceSettings(action, lead, save)


def read_controller_runtime(reader: ConfigReader) -> ControllerRuntime:
    """`failoverController`: a pinned prebuilt image, or a pip index mirror; not both (the image needs no pip)."""
    raw = reader.obj("failoverController", DEFAULTS["failoverController"])
    image, index = raw["image"], raw["pipIndexUrl"]
    if image:
        reader.check("failoverController.image", bool(PINNED_IMAGE.match(image)),
                     f"{image!r} is not an image pinned by tag or digest, such as "
                     "us-docker.pkg.dev/my-project/tools/tpu-fallback-failover:1 (never :latest)")
    if index:
        reader.check("failoverController.pipIndexUrl", bool(HTTPS_URL.match(index)),
                     f"{index!r} is not an https:// index URL, such as https://pypi.example.com/simple")
    reader.check("failoverController", not (image and index),
                 "set image or pipIndexUrl, not both: the prebuilt image installs nothing at start")
    return ControllerRuntime(image, index)
