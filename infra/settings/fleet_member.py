"""`fleetMember`: this regional stack as a member of a MultiKueue fleet (infra/fleet_member.py builds its objects)."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from infra.settings.constants import MAX_STEP_NAME
from infra.settings.keys import DEFAULTS
from infra.settings.reader import ConfigReader
from infra.settings.rungs import PlanSettings
from infra.settings.teams import TeamSettings


@dataclass(frozen=True)
class FleetMemberSettings:
    """This region as a member of a MultiKueue fleet (infra/fleet_member.py): a fleet job starts here on the
    queue of `start_rung` (config key), flexStart by default: admitted only once DWS has provisioned the slice,
    so the first region with TPUs wins."""

    start_rung: str = DEFAULTS["fleetMember"]["startRung"]
    # The rungs besides the start rung that the fleet may use here one member at a time (config keys, none with an
    # admission check): each becomes a step of the fleet's ladder (infra/fleet_member.py, README "The fleet's
    # ladder"). Empty, the default: the fleet only asks DWS here, as before.
    ladder_rungs: tuple[str, ...] = tuple(DEFAULTS["fleetMember"]["rungs"])


def read_fleet_member(reader: ConfigReader, plans: tuple[PlanSettings, ...],
                      teams: tuple[TeamSettings, ...]) -> FleetMemberSettings | None:
    """`fleetMember`: None unless enabled. The start rung must be enabled here; and no teams: a fleet job's
    namespace is the fleet's own (infra/fleet_member.py), which no team's queues admit. `rungs`: the rungs besides
    the start rung (always the fleet's last step, DWS everywhere by default) that the fleet may use here one member at
    a time, each enabled here and without an admission check (a DWS request is the last step's, in every member)."""
    raw = reader.obj("fleetMember", DEFAULTS["fleetMember"])
    if not raw["enabled"]:
        return None
    enabled = [plan.config_key for plan in plans]
    reader.check("fleetMember.startRung", raw["startRung"] in enabled,
                 f"{raw['startRung']!r} is not an enabled rung of this stack; use one of {', '.join(enabled)} "
                 "(flexStart, the default, admits a fleet job only once DWS has provisioned its slice)")
    reader.check("fleetMember.enabled", not teams,
                 "a platform with teams cannot be a fleet member yet: the teams' queues admit only their own "
                 "namespaces; use a single-team platform stack per region as a member")
    rungs = raw["rungs"]
    ladder: list[str] = []
    for index, key in enumerate(rungs):
        where = f"fleetMember.rungs[{index}]"
        plan = next((p for p in plans if p.config_key == key), None)
        if not reader.check(where, plan is not None,
                            f"{key!r} is not an enabled rung of this stack; use some of {', '.join(enabled)}"):
            continue
        # The start rung is always the fleet's last step, in every member at once: listed here it would read as a
        # step of its own, one member at a time, which it never is.
        if not reader.check(where, key != raw["startRung"],
                            f"{key!r} is this member's startRung, always the fleet's last step (in every member at "
                            "once); list only the rungs besides it (reservation, onDemand, spot)"):
            continue
        if not reader.check(where, not plan.kind.admission_check,
                            f"{key!r} provisions before admission: it is the fleet's last step, in every member at "
                            "once (startRung); list reservation, onDemand or spot rungs here"):
            continue
        if not reader.check(where, key not in ladder, f"{key!r} is listed twice"):
            continue
        ladder.append(key)
        # The step's LocalQueue (here and on the manager) is named after the rung and this stack; a job carries the
        # name in its label kueue.x-k8s.io/queue-name, so it must be a label value (infra/fleet_member.py step_name).
        name = f"fleet-{plan.flavor}-{pulumi.get_stack().lower()}"
        reader.check(where, len(name) <= MAX_STEP_NAME,
                     f"the fleet's step here would be named {name!r}, {len(name)} characters; a queue name is a "
                     f"label value, at most {MAX_STEP_NAME}: use a shorter stack name")
    return FleetMemberSettings(raw["startRung"], tuple(k for k in enabled if k in ladder))
