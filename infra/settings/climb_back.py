"""`fallback.climbBack`: when the failover controller moves a running job back up the ladder
(failover/regional/climb.py), read and checked."""

from __future__ import annotations

from dataclasses import dataclass

from infra.settings.constants import CLIMB_BACK_RUNGS, CLIMB_WAITS
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
    waits = {}
    for field, attribute in _FIELDS:
        name, (low, high) = f"fallback.climbBack.{field}", CLIMB_WAITS[field][:2]
        seconds = read_duration(reader, name, raw[field])
        if seconds is not None and reader.check(name, low <= seconds <= high, f"{raw[field]} is out of range; use "
                                                f"{short_duration(low)} to {short_duration(high)}"):
            waits[attribute] = seconds
    return ClimbBackSettings(tuple(to), **{attribute: waits.get(attribute, getattr(defaults, attribute))
                                           for _field, attribute in _FIELDS})
