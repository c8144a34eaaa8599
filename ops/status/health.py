"""The failover controller's health: its Deployment, its pods' restarts, and the last move it announced.

A stack with one rung has no controller (nothing to move to), so "not deployed" is a state, not an error.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from failover.api import parse_time
from failover.api import CONTROLLER_NAME, CONTROLLER_NAMESPACE
from ops.status.objects import conditions, is_true, name_of

NOT_DEPLOYED, HEALTHY, DEGRADED, SCALED_TO_ZERO, UNKNOWN = "NotDeployed", "Healthy", "NotReady", "ScaledToZero", "Unknown"


@dataclass(frozen=True)
class MoveEvent:
    """The newest MovedToNextRung Event the controller wrote (on the RayJob it moved)."""

    namespace: str
    job: str
    message: str
    at: datetime.datetime | None


@dataclass(frozen=True)
class ControllerView:
    namespace: str
    name: str
    state: str
    words: str
    desired: int
    ready: int
    restarts: int  # over its pods' containers
    pods: tuple[str, ...]
    latest_move: MoveEvent | None


def event_time(event: Mapping) -> datetime.datetime | None:
    """core/v1 Events carry lastTimestamp; events.k8s.io/v1 ones (and series) eventTime."""
    return parse_time(event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp")
                      or (event.get("metadata") or {}).get("creationTimestamp"))


def latest_move(events: Sequence[Mapping]) -> MoveEvent | None:
    if not events:
        return None
    event = max(events, key=lambda e: event_time(e) or datetime.datetime.min.replace(tzinfo=datetime.timezone.utc))
    involved = event.get("involvedObject") or event.get("regarding") or {}
    return MoveEvent(involved.get("namespace", ""), involved.get("name", ""),
                     event.get("message") or event.get("note") or "", event_time(event))


def restarts(pods: Sequence[Mapping]) -> int:
    return sum(int(s.get("restartCount") or 0) for pod in pods
               for s in (pod.get("status") or {}).get("containerStatuses") or [])


def controller_view(deployment: Mapping | None, pods: Sequence[Mapping], events: Sequence[Mapping],
                    readable: bool = True, name: str = CONTROLLER_NAME, namespace: str = CONTROLLER_NAMESPACE,
                    absent: str = "not deployed (a one-rung ladder has none)",
                    scaled_to_zero: str = "scaled to 0 replicas: no job is moved") -> ControllerView:
    """`readable` False: the user may not read the controller's namespace, so its absence proves nothing."""
    move = latest_move(events)
    if deployment is None:
        state, words = (NOT_DEPLOYED, absent) if readable else (UNKNOWN, f"unknown (cannot read {namespace})")
        return ControllerView(namespace, name, state, words, 0, 0, 0, (), move)
    spec, status = deployment.get("spec") or {}, deployment.get("status") or {}
    desired = int(spec.get("replicas", 1))
    ready = int(status.get("readyReplicas") or 0)
    if desired == 0:
        state, words = SCALED_TO_ZERO, scaled_to_zero
    elif ready >= desired:
        state, words = HEALTHY, "healthy"
    else:
        available = conditions(deployment).get("Available")
        why = f": {available.get('message')}" if available and not is_true(available) and available.get("message") else ""
        state, words = DEGRADED, f"not ready{why}"
    return ControllerView(namespace, name_of(deployment) or name, state, words, desired, ready, restarts(pods),
                          tuple(sorted(name_of(p) for p in pods)), move)
