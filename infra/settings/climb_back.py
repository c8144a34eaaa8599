"""`fallback.climbBack`: when the failover controller moves a running job back up the ladder
(failover/regional/climb.py), and `fleet.climbBack`: when a fleet's ladder moves a fleet job back up to an earlier
step (failover/ladder/climb.py), read and checked."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from infra.settings.constants import CLIMB_BACK_RUNGS, FLEET_CLIMB_BACK_RUNGS
from infra.settings.formats import duration_seconds
from infra.settings.keys import DEFAULTS
from infra.settings.reader import ConfigReader, read_bounded_duration

_CLIMB_BACK = DEFAULTS["fallback"]["climbBack"]


@dataclass(frozen=True)
class ClimbBackSettings:
    """The rungs (config keys) a job may climb back to, and the waits in seconds (the table's defaults)."""

    to: tuple[str, ...] = tuple(_CLIMB_BACK["to"])
    settle_seconds: int = duration_seconds(_CLIMB_BACK["settle"])
    min_interval_seconds: int = duration_seconds(_CLIMB_BACK["minInterval"])
    min_runtime_seconds: int = duration_seconds(_CLIMB_BACK["minRuntime"])
    run_end_margin_seconds: int = duration_seconds(_CLIMB_BACK["runEndMargin"])
    probe: bool = _CLIMB_BACK["probe"]


_FIELDS = (("settle", "settle_seconds"), ("minInterval", "min_interval_seconds"),
           ("minRuntime", "min_runtime_seconds"), ("runEndMargin", "run_end_margin_seconds"))


def read_climb_back_settings(reader: ConfigReader, given: dict) -> ClimbBackSettings:
    """`fallback.climbBack`, its fields merged over the defaults; the default where a value is unreadable (a problem
    names it)."""
    raw = reader.fields("fallback.climbBack", given, _CLIMB_BACK)
    defaults = ClimbBackSettings()
    to = raw["to"]
    known = all(rung in CLIMB_BACK_RUNGS for rung in to) and len(set(to)) == len(to)
    if not reader.check("fallback.climbBack.to", known,
                        f"{to!r}: use rung config keys without an admission check ({', '.join(CLIMB_BACK_RUNGS)}), "
                        "each once (DWS provisions on request: it has no free slice to climb to)"):
        to = list(defaults.to)
    waits = _read_waits(reader, "fallback.climbBack", raw, dict(_FIELDS))
    return ClimbBackSettings(tuple(to), **{attribute: waits.get(attribute, getattr(defaults, attribute))
                                           for _field, attribute in _FIELDS}, probe=raw["probe"])


def _read_waits(reader: ConfigReader, key: str, raw: Mapping, fields: Mapping[str, str]) -> dict[str, int]:
    """{attribute: seconds} of the durations within the table's ranges (`fields`: field -> attribute); one unreadable
    or out of range is a problem that names it, and left out."""
    return {attribute: seconds for field, attribute in fields.items()
            if (seconds := read_bounded_duration(reader, f"{key}.{field}", raw[field])) is not None}


@dataclass(frozen=True)
class FleetClimbBackSettings:
    """`fleet.climbBack`: the rungs (config keys) a fleet job may climb back to, and the waits in seconds."""

    to: tuple[str, ...]
    settle_seconds: int
    min_interval_seconds: int
    min_runtime_seconds: int
    run_end_margin_seconds: int
    save_timeout_seconds: int


_FLEET_FIELDS = {**dict(_FIELDS), "saveTimeout": "save_timeout_seconds"}


def read_fleet_climb_back(reader: ConfigReader, given: dict | None, defaults: Mapping) -> FleetClimbBackSettings:
    """`fleet.climbBack` (its fields merged over `defaults`, the table's); the default where a value is unreadable
    (a problem names it)."""
    raw = reader.fields("fleet.climbBack", given, defaults)
    to = raw["to"]
    known = all(rung in FLEET_CLIMB_BACK_RUNGS for rung in to) and len(set(to)) == len(to)
    if not reader.check("fleet.climbBack.to", known,
                        f"{to!r}: use {', '.join(FLEET_CLIMB_BACK_RUNGS)}, each once (on-demand and Spot would need "
                        "an idle slice of a member's nodes, which the fleet's ladder does not read there)"):
        to = list(defaults["to"])
    waits = _read_waits(reader, "fleet.climbBack", raw, _FLEET_FIELDS)
    chosen = {attribute: waits.get(attribute, duration_seconds(defaults[field]))
              for field, attribute in _FLEET_FIELDS.items()}
    return FleetClimbBackSettings(tuple(to), **chosen)
