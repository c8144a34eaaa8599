"""A fleet's manager (plan C), as `status` shows it: each member's connection as Kueue's MultiKueueCluster reports
it (no member kubeconfig needed), and the health of the fleet watch and of the ladder controller. Where each fleet job runs is per job
(jobs.FleetPlacement). Pure functions of dicts, like the rest of the report."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass

from failover.api import CONTROLLER_NAMESPACE, FLEET_LADDER_NAME, FLEET_WATCH_NAME, MULTIKUEUE_CONTROLLER
from ops.status.health import ControllerView, controller_view
from ops.status.objects import changed_at, conditions, name_of


@dataclass(frozen=True)
class MemberView:
    """One member cluster: Kueue's MultiKueueCluster and its Active condition."""

    name: str
    active: bool | None  # None: Kueue has not reported yet
    reason: str
    message: str
    since: datetime.datetime | None

    def words(self) -> str:
        if self.active is None:
            return "not checked by Kueue yet"
        state = "connected" if self.active else "NOT connected"
        return f"{state} ({self.reason})" + (f": {self.message}" if self.message and not self.active else "")


@dataclass(frozen=True)
class FleetView:
    members: tuple[MemberView, ...]
    members_known: bool  # False: the MultiKueueClusters could not be read (see the problems)
    watch: ControllerView
    ladder: ControllerView  # the fleet's ladder controller (failover/ladder/): moves jobs from step to step

    @property
    def connected(self) -> int:
        return sum(1 for m in self.members if m.active)


def member_view(cluster: Mapping) -> MemberView:
    active = conditions(cluster).get("Active")
    return MemberView(name_of(cluster), None if active is None else active.get("status") == "True",
                      (active or {}).get("reason", ""), ((active or {}).get("message") or "").strip(),
                      changed_at(active))


def may_be_a_fleets_manager(snapshot) -> bool:
    """Whether this cluster may be a fleet's manager, from what status reads anyway: a manager dispatches every fleet
    job through a MultiKueue AdmissionCheck (each step of its ladder has one, infra/fleet.py), so AdmissionChecks read
    without one say no fleet is served here. Unread AdmissionChecks say nothing: it may be one."""
    if not snapshot.readable("admission_checks"):
        return True
    return any((check.get("spec") or {}).get("controllerName") == MULTIKUEUE_CONTROLLER
               for check in snapshot.admission_checks)


def fleet_view(snapshot) -> FleetView | None:
    """None on a cluster that shows no sign of being a fleet's manager: no MultiKueueCluster, no fleet watch (when
    neither could be read, the problems say so)."""
    if not snapshot.multikueue_clusters and snapshot.fleet_watch is None and snapshot.fleet_ladder is None:
        return None
    watch = controller_view(snapshot.fleet_watch, snapshot.fleet_watch_pods, (), snapshot.readable("fleet_watch"),
                            name=FLEET_WATCH_NAME, namespace=CONTROLLER_NAMESPACE, absent="not deployed",
                            scaled_to_zero="scaled to 0 replicas: no fleet job is watched")
    ladder = controller_view(snapshot.fleet_ladder, snapshot.fleet_ladder_pods, (), snapshot.readable("fleet_ladder"),
                             name=FLEET_LADDER_NAME, namespace=CONTROLLER_NAMESPACE,
                             absent="not deployed (every fleet stack deploys it: run `pulumi up` on the fleet stack)",
                             scaled_to_zero="scaled to 0 replicas: no fleet job moves to the next step, is requeued "
                                            "after losing its slice, or is given up")
    return FleetView(tuple(member_view(c) for c in sorted(snapshot.multikueue_clusters, key=name_of)),
                     snapshot.readable("multikueue_clusters"), watch, ladder)

