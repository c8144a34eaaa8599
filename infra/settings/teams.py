"""Several teams on one platform (`teams`, `teamShareOrder`, `googleGroupsDomain`); infra/teams.py builds their
Kueue objects."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from infra.settings.constants import (GUARANTEED_RUNGS, JOB_HEAD_CPU, JOB_HEAD_MEMORY_GIB, MAX_SLICES_PER_PLAN,
                                      SECURITY_GROUP_NAME, SHARE_ORDERS, SYSTEM_NAMESPACE_PREFIXES, SYSTEM_NAMESPACES)
from infra.settings.formats import DNS_LABEL, DOMAIN, EMAIL, TEAM_NAME
from infra.settings.keys import DEFAULTS, setting
from infra.settings.reader import ConfigReader

if TYPE_CHECKING:
    from infra.settings.regional import PlatformSettings

TEAM_FIELDS = tuple(field.name for field in setting("teams").fields)  # name, namespace, groups, shares, limits


@dataclass(frozen=True)
class TeamSettings:
    """One team on a shared platform: its namespace, the Google groups that may deploy there, and its guaranteed
    slices per guaranteed rung (config key: slices); the limits in slices, None when unset (Kueue: no limit)."""

    name: str
    namespace: str
    groups: tuple[str, ...]
    shares: tuple[tuple[str, int], ...]  # (rung config key, slices), in GUARANTEED_RUNGS order
    borrowing_limit: int | None = None
    lending_limit: int | None = None

    def share(self, key: str) -> int:
        return dict(self.shares).get(key, 0)

    @property
    def guaranteed_slices(self) -> int:
        return sum(slices for _, slices in self.shares)


def _slices(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_SLICES_PER_PLAN


def _read_team(reader: ConfigReader, where: str, item: Any) -> TeamSettings | None:
    """One entry of `teams`, every bad field named; None when it cannot be used."""
    if not isinstance(item, dict) or not {"name", "namespace", "groups", "shares"} <= set(item):
        reader.fail(where, f"must be an object with fields name, namespace, groups, shares (and optionally "
                           f"borrowingLimit, lendingLimit); got {item!r}")
        return None
    ok = reader.check(where, set(item) <= set(TEAM_FIELDS),
                      f"unknown field(s) {', '.join(sorted(set(item) - set(TEAM_FIELDS)))}; allowed: "
                      f"{', '.join(TEAM_FIELDS)}")
    name, namespace, groups, shares = item["name"], item["namespace"], item["groups"], item["shares"]
    ok &= reader.check(f"{where}.name", isinstance(name, str) and bool(TEAM_NAME.match(name)),
                       f"{name!r} is not a team name (1-30 lowercase letters, digits, hyphens; starts with a letter)")
    ok &= reader.check(f"{where}.namespace", isinstance(namespace, str) and bool(DNS_LABEL.match(namespace)),
                       f"{namespace!r} is not a namespace name (a DNS label: 1-63 lowercase letters, digits, hyphens)")
    if ok and (namespace in SYSTEM_NAMESPACES or namespace.startswith(SYSTEM_NAMESPACE_PREFIXES)):
        ok = reader.check(f"{where}.namespace", False, f"{namespace!r} is a system namespace; no team may take "
                          f"{', '.join(sorted(SYSTEM_NAMESPACES))} or {'*, '.join(SYSTEM_NAMESPACE_PREFIXES)}*")
    good_groups = isinstance(groups, list) and bool(groups) and all(
        isinstance(g, str) and EMAIL.match(g) for g in groups)
    ok &= reader.check(f"{where}.groups", good_groups, f"{groups!r} is not a non-empty list of Google group "
                                                       "emails, such as [ml-team-a@example.com]")
    ok &= reader.check(f"{where}.groups", not good_groups or len(set(groups)) == len(groups), "a group is listed twice")
    good_shares = isinstance(shares, dict) and set(shares) <= set(GUARANTEED_RUNGS) and all(
        _slices(v) for v in shares.values())
    ok &= reader.check(f"{where}.shares", good_shares,
                       f"{shares!r} is not an object of slices (0 to {MAX_SLICES_PER_PLAN}) per guaranteed rung: "
                       f"{', '.join(GUARANTEED_RUNGS)}")
    limits = {}
    for field in ("borrowingLimit", "lendingLimit"):
        limits[field] = item.get(field)
        ok &= reader.check(f"{where}.{field}", limits[field] is None or _slices(limits[field]),
                           f"{limits[field]!r} is not a number of slices (0 to {MAX_SLICES_PER_PLAN})")
    if not ok:
        return None
    team = TeamSettings(name, namespace, tuple(groups), tuple((k, shares.get(k, 0)) for k in GUARANTEED_RUNGS),
                        limits["borrowingLimit"], limits["lendingLimit"])
    lent = [slices for _, slices in team.shares if slices > 0]
    if team.lending_limit is not None:
        # Kueue's webhook: lendingLimit <= nominalQuota, and it is set on each rung the team has a share of.
        reader.check(f"{where}.lendingLimit", bool(lent) and team.lending_limit <= min(lent),
                     f"{team.lending_limit} is more than the team's smallest share ({min(lent, default=0)}); a "
                     "team lends at most what it holds")
    return team


def read_teams(reader: ConfigReader) -> tuple[TeamSettings, ...]:
    """`teams`: the teams sharing this platform, each name and namespace once."""
    teams = [team for index, item in enumerate(reader.array("teams", DEFAULTS["teams"]))
             if (team := _read_team(reader, f"teams[{index}]", item)) is not None]
    for field in ("name", "namespace"):
        values = [getattr(team, field) for team in teams]
        twice = sorted({v for v in values if values.count(v) > 1})
        reader.check("teams", not twice, f"{field}(s) {', '.join(twice)} used by more than one team")
    return tuple(teams)


def read_team_share_order(reader: ConfigReader, teams: tuple[TeamSettings, ...]) -> str:
    """`teamShareOrder`: `ladder` (a team's job takes its shares in the ladder's order, reclaiming a lent one before
    it goes down to its next rung) or `freeFirst` (a free share on any rung before a reclaim: fewer restarts of
    borrowers, more cost). Only with teams."""
    order = reader.text("teamShareOrder", DEFAULTS["teamShareOrder"])
    reader.check("teamShareOrder", order in SHARE_ORDERS,
                 f"{order!r} is not a share order; use {' or '.join(SHARE_ORDERS)}")
    reader.check("teamShareOrder", bool(teams) or order == DEFAULTS["teamShareOrder"],
                 "set only with teams (it orders a team's shares)")
    return order


def read_groups_domain(reader: ConfigReader, teams: tuple[TeamSettings, ...]) -> str:
    """`googleGroupsDomain`: needed by teams (their groups are bound through gke-security-groups@<domain>)."""
    domain = reader.text("googleGroupsDomain", DEFAULTS["googleGroupsDomain"])
    reader.check("googleGroupsDomain", not domain or bool(DOMAIN.match(domain)),
                 f"{domain!r} is not a domain; use the Google Workspace or Cloud Identity domain, such as example.com")
    if teams:
        reader.check("googleGroupsDomain", bool(domain), f"required with teams: the cluster reads team groups "
                                                         f"through {SECURITY_GROUP_NAME}@<domain>")
    else:
        reader.check("googleGroupsDomain", not domain, "set only with teams (it changes the cluster's RBAC)")
    return domain


def check_team_capacity(reader: ConfigReader, settings: PlatformSettings) -> None:
    """The shares of a rung fit in it, and the teams' Ray head shares in the CPU pool: capacity counted once."""
    if not settings.teams:
        return
    for key in GUARANTEED_RUNGS:
        plan = settings.plan(key)
        capacity = plan.max_slices if plan else 0
        total = sum(team.share(key) for team in settings.teams)
        reader.check("teams", total <= capacity,
                     f"the teams' {key} shares add up to {total} slices; {key} holds {capacity}")
    slices = sum(team.guaranteed_slices for team in settings.teams)
    system = settings.system_pool
    for need, have, unit in ((slices * JOB_HEAD_CPU, system.node_count * system.machine.vcpus, "vCPUs"),
                             (slices * JOB_HEAD_MEMORY_GIB, system.node_count * system.machine.memory_gib, "GiB")):
        reader.check("teams", need <= have, f"the teams' Ray heads need {need} {unit} of the CPU pool for their "
                                            f"{slices} guaranteed slices; systemPool has {have}")
