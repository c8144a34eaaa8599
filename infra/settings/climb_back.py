"""`fallback.climbBack`: when the failover controller moves a running job back up the ladder
(failover/regional/climb.py), and `fleet.climbBack`: when a fleet's ladder moves a fleet job back up to an earlier
step (failover/ladder/climb.py), read and checked into the contract the controllers read, failover.api.ClimbPolicy:
one shape from the table to the decision (its JSON in the Deployment's env is ClimbPolicy.as_data)."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping

from failover.api.climbs import ClimbPolicy
from infra.rungs import RESERVATION, RUNG_KINDS, RungKind
from infra.settings.constants import CLIMB_BACK_RUNGS, FLEET_CLIMB_BACK_RUNGS
from infra.settings.formats import duration_seconds
from infra.settings.keys import DEFAULTS
from infra.settings.reader import ConfigReader, read_bounded_duration

# A climb's waits: the table's field (camelCase, a duration) -> ClimbPolicy's field (a timedelta).
_WAITS = {"settle": "settle", "minInterval": "min_interval", "minRuntime": "min_runtime",
          "runEndMargin": "run_end_margin"}


def read_climb_back(reader: ConfigReader, raw: Mapping, defaults: Mapping, rungs_on: Iterable[RungKind],
                    save_timeout_seconds: int) -> ClimbPolicy:
    """`fallback.climbBack` (`raw`: its fields merged over the table's `defaults`) as the controller reads it: the
    rungs by their flavors (only those on in this stack, `rungs_on`), the reservation's marked as the rung whose free
    quota is its capacity, the waits, and the save's wait of fallback.maintenance. The default where a value is
    unreadable (a problem names it)."""
    to = _read_to(reader, "fallback.climbBack", raw, defaults, CLIMB_BACK_RUNGS,
                  f"use rung config keys without an admission check ({', '.join(CLIMB_BACK_RUNGS)}), each once (DWS "
                  "provisions on request: it has no free slice to climb to)")
    on = {kind.key: kind for kind in rungs_on}
    return ClimbPolicy(to=tuple(on[key].flavor for key in to if key in on),
                       reserved=tuple(kind.flavor for kind in on.values() if kind == RESERVATION),
                       save_timeout=datetime.timedelta(seconds=save_timeout_seconds),
                       **_read_waits(reader, "fallback.climbBack", raw, defaults, _WAITS))


def table_climb_back(rungs_on: Iterable[RungKind]) -> ClimbPolicy:
    """fallback.climbBack as the table's defaults make it for these rungs (fallback.maintenance.saveTimeout's too):
    what a team stack holds of its platform's (roles/contract.py), which is not published: it runs no controller."""
    table = DEFAULTS["fallback"]
    return read_climb_back(ConfigReader(None), table["climbBack"], table["climbBack"], rungs_on,
                           duration_seconds(table["maintenance"]["saveTimeout"]))


def read_fleet_climb_back(reader: ConfigReader, given: dict | None, defaults: Mapping) -> ClimbPolicy:
    """`fleet.climbBack` (its fields merged over `defaults`, the table's) as the ladder reads it: the rungs by their
    members' flavor (a member's flavor of a rung is the rung's, infra/rungs.py), each one whose free quota is
    its capacity. The default where a value is unreadable (a problem names it)."""
    raw = reader.fields("fleet.climbBack", given, defaults)
    to = _read_to(reader, "fleet.climbBack", raw, defaults, FLEET_CLIMB_BACK_RUNGS,
                  f"use {', '.join(FLEET_CLIMB_BACK_RUNGS)}, each once (on-demand and Spot would need an idle slice of "
                  "a member's nodes, which the fleet's ladder does not read there)")
    flavors = tuple(RUNG_KINDS[key].flavor for key in to)
    waits = _read_waits(reader, "fleet.climbBack", raw, defaults, {**_WAITS, "saveTimeout": "save_timeout"})
    return ClimbPolicy(to=flavors, reserved=flavors, **waits)


def _read_to(reader: ConfigReader, key: str, raw: Mapping, defaults: Mapping, allowed: tuple[str, ...],
             rule: str) -> list[str]:
    """`to`: rung config keys among `allowed`, each once; else the default, with a problem that says the `rule`."""
    to = raw["to"]
    known = all(rung in allowed for rung in to) and len(set(to)) == len(to)
    return to if reader.check(f"{key}.to", known, f"{to!r}: {rule}") else defaults["to"]


def _read_waits(reader: ConfigReader, key: str, raw: Mapping, defaults: Mapping, fields: Mapping[str, str]
                ) -> dict[str, datetime.timedelta]:
    """{ClimbPolicy field: wait} of the durations (`fields`: table field -> ClimbPolicy field), each within the
    table's range; one unreadable or out of range is a problem that names it, and has the table's default."""
    waits = {}
    for field, policy_field in fields.items():
        seconds = read_bounded_duration(reader, f"{key}.{field}", raw[field])
        waits[policy_field] = datetime.timedelta(seconds=duration_seconds(defaults[field]) if seconds is None
                                                 else seconds)
    return waits
