"""The Events the programs write (their reasons, read back by `ops status` and by the fleet's ladder in a member), and
the autoscaler's Events they read as a stockout."""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable, Mapping

from failover.api.times import parse_time

MOVE_EVENT_REASON = "MovedToNextRung"  # the regional controller moved (or requeued) a job: on its RayJob
# The regional controller's Events on a RayJob whose slice was lost, and whole again; the fleet's ladder reads the
# first in the step's member (failover/ladder/).
LOSS_EVENT_REASON, RECOVERY_EVENT_REASON = "SliceLost", "SliceRecovered"
# The regional controller's Event on a RayJob whose slice will be disrupted at a known time (failover/maintenance.py).
AHEAD_EVENT_REASON = "DisruptionAhead"

# GKE's autoscaler on pods it could not get nodes for. Only a lack of capacity counts; a quota error does not.
# Ref: https://cloud.google.com/kubernetes-engine/docs/troubleshooting/cluster-autoscaler-scale-up
SCALE_UP_FAILURE_REASONS = frozenset({"FailedScaleUp", "NotTriggerScaleUp"})
STOCKOUT_MESSAGE = re.compile(r"GCE out of resources|resource[_ ]pool[_ ]exhausted|stock-?out|"
                              r"does not have enough resources", re.IGNORECASE)


def stockout_since(events: Iterable[Mapping], pods: set[str], admitted_at: datetime.datetime | None
                   ) -> datetime.datetime | None:
    """When the autoscaler first reported, for one of `pods` and since admission, that it has no capacity."""
    first = None
    for event in events:
        involved = event.get("involvedObject") or {}
        if involved.get("kind") != "Pod" or involved.get("name") not in pods:
            continue
        if event.get("reason") not in SCALE_UP_FAILURE_REASONS or not STOCKOUT_MESSAGE.search(event.get("message") or ""):
            continue
        seen_first = parse_time(event.get("firstTimestamp") or event.get("eventTime"))
        seen_last = parse_time(event.get("lastTimestamp") or event.get("eventTime")) or seen_first
        if seen_first is None or (admitted_at is not None and seen_last < admitted_at):
            continue  # from an earlier admission of the same pods' names
        seen = max(seen_first, admitted_at) if admitted_at else seen_first
        first = seen if first is None else min(first, seen)
    return first
