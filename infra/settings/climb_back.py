"""`fallback.climbBack`: when the failover controller moves a running job back up the ladder
(failover/regional/climb.py), and `fleet.climbBack`: when a fleet's ladder moves a fleet job back up to an earlier
step (failover/ladder/climb.py), read and checked."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from infra.settings.constants import (CLIMB_BACK_RUNGS, CLIMB_WAITS, FLEET_CLIMB_BACK_RUNGS, MAX_SAVE_TIMEOUT_SECONDS,
                                      MIN_SAVE_TIMEOUT_SECONDS)
from infra.settings.formats import duration_seconds, short_duration
from infra.settings.keys import DEFAULTS
from infra.settings.reader import ConfigReader, read_duration

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
    waits = _read_waits(reader, "fallback.climbBack", raw,
                        {field: (attribute, *CLIMB_WAITS[field][:2]) for field, attribute in _FIELDS})
    return ClimbBackSettings(tuple(to), **{attribute: waits.get(attribute, getattr(defaults, attribute))
                                           for _field, attribute in _FIELDS}, probe=raw["probe"])


def _read_waits(reader: ConfigReader, key: str, raw: Mapping, fields: Mapping[str, tuple[str, int, int]]
                ) -> dict[str, int]:
    """{attribute: seconds} of the durations within their bounds (`fields`: field -> (attribute, low, high)); one
    unreadable or out of range is a problem that names it, and left out."""
    waits = {}
    for field, (attribute, low, high) in fields.items():
        name = f"{key}.{field}"
        seconds = read_duration(reader, name, raw[field])
        if seconds is not None and reader.check(name, low <= seconds <= high, f"{raw[field]} is out of range; use "
                                                f"{short_duration(low)} to {short_duration(high)}"):
            waits[attribute] = seconds
    return waits


@dataclass(frozen=True)
class FleetClimbBackSettings:
    """`fleet.climbBack`: the rungs (config keys) a fleet job may climb back to, and the waits in seconds."""

    to: tuple[str, ...]
    settle_seconds: int
    min_interval_seconds: int
    min_runtime_seconds: int
    run_end_margin_seconds: int
    save_timeout_seconds: int


_FLEET_FIELDS = {**{field: (attribute, *CLIMB_WAITS[field][:2]) for field, attribute in _FIELDS},
                 "saveTimeout": ("save_timeout_seconds", MIN_SAVE_TIMEOUT_SECONDS, MAX_SAVE_TIMEOUT_SECONDS)}


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
              for field, (attribute, _low, _high) in _FLEET_FIELDS.items()}
    return FleetClimbBackSettings(tuple(to), **chosen)
