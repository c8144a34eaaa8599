"""Small readers of Kubernetes object dicts (as the API returns them): conditions, owners, times, quantities."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from decimal import Decimal

from kubernetes.utils import parse_quantity

from failover.api import parse_time


def meta(obj: Mapping | None) -> Mapping:
    return (obj or {}).get("metadata") or {}


def name_of(obj: Mapping | None) -> str:
    return meta(obj).get("name", "")


def namespace_of(obj: Mapping | None) -> str:
    return meta(obj).get("namespace", "")


def key_of(obj: Mapping) -> tuple[str, str]:
    return namespace_of(obj), name_of(obj)


def labels(obj: Mapping | None) -> Mapping[str, str]:
    return meta(obj).get("labels") or {}


def annotations(obj: Mapping | None) -> Mapping[str, str]:
    return meta(obj).get("annotations") or {}


def created_at(obj: Mapping | None) -> datetime.datetime | None:
    return parse_time(meta(obj).get("creationTimestamp"))


def conditions(obj: Mapping | None) -> dict[str, Mapping]:
    """The status conditions by type."""
    return {c["type"]: c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if "type" in c}


def is_true(condition: Mapping | None) -> bool:
    return (condition or {}).get("status") == "True"


def changed_at(condition: Mapping | None) -> datetime.datetime | None:
    return parse_time((condition or {}).get("lastTransitionTime"))


def owned_by(obj: Mapping, kind: str, name: str | None = None, uid: str | None = None) -> bool:
    """Whether one of `obj`'s ownerReferences is that owner (by uid when given, else by kind and name)."""
    for owner in meta(obj).get("ownerReferences") or []:
        if uid is not None and owner.get("uid") == uid:
            return True
        if uid is None and owner.get("kind") == kind and owner.get("name") == name:
            return True
    return False


def owner_name(obj: Mapping, kind: str) -> str | None:
    return next((o.get("name") for o in meta(obj).get("ownerReferences") or [] if o.get("kind") == kind), None)


def quantity(value: object) -> Decimal:
    """A Kubernetes quantity ("16", "1536Gi", "500m") in base units; 0 when absent."""
    return parse_quantity(value) if value not in (None, "") else Decimal(0)


def plain_number(value: Decimal) -> int | float:
    """A quantity as JSON shows it: an int when whole (chips, bytes), else a float (cores)."""
    return int(value) if value == value.to_integral_value() else float(value)
