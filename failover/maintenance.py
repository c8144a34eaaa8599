"""A disruption of a running job's slice seen coming: what the failover controller decides, as pure functions.

GKE says ahead of time when a TPU host will be maintained: the node's label `cloud.google.com/scheduled-maintenance-
time` holds the window's start (Unix seconds; Cloud TPU gives 7 days' notice of a SCHEDULED maintenance), and during
the window GKE sets `cloud.google.com/active-node-maintenance=ONGOING` and the taint
`cloud.google.com/impending-node-termination:NoSchedule`. A DWS (flex-start) run ends at a time known from its
start (its admission, once its ProvisioningRequest is provisioned) and its `maxRunDurationSeconds`.
Ref: https://cloud.google.com/kubernetes-engine/docs/how-to/view-maintenance-events
Ref: https://cloud.google.com/tpu/docs/view-maintenance-notifications
Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/handle-disruption-gpu-tpu

The earliest such disruption of the job's slice is recorded on the RayJob (failover.api.Ahead: `ops status`, an Event,
a metric). A DWS run's end is known from the run's start, often days ahead: it is recorded then for `ops status`, but
announced (the Event, the metric) only from `announce_at` on, so that the Event and the count say something is
coming soon rather than that a DWS job runs. `fallback.maintenance.leadTime` before it the job is asked to checkpoint (failover/checkpoints.py). With
`fallback.maintenance.action: move`, once the save is taken as done (`saveTimeout`) and before the disruption, the
job moves to another rung that has room for it now (`move_target`), as any move does: one run at a time. Whatever
was done ahead, the window itself is the lost-slice path (failover/slices.py): ONGOING and the taint make the host
going, and the job waits its rung's recovery wait. The window's start is not itself counted as a loss: GKE may begin
the maintenance any time in its window, and says so with its own signals.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from failover import checkpoints
from failover.api import (DISRUPTION_AHEAD, MAINTENANCE, MOVE, NOTHING, RUN_END, TPU_RESOURCE, Ahead, Chain,
                          CheckpointRequest, Move, Rung, WorkloadView, format_time, parse_time)
from failover.api.checkpoint_moves import ASK, SAVING, save_step
from failover.api.checkpoints import pods_to_ask
from failover.slices import HostView, NodeView

@dataclass(frozen=True)
class Policy:
    """fallback.maintenance, as the controller is given it (failover/config.py RegionalConfig)."""

    action: str  # failover.api MOVE, CHECKPOINT or NOTHING
    lead: datetime.timedelta  # leadTime: the checkpoint request this long before the disruption
    save_timeout: datetime.timedelta  # saveTimeout: the save taken as done this long after the request


@dataclass(frozen=True)
class Seen:
    """The disruption the slice meets first, as its nodes and its Workload say now."""

    kind: str  # MAINTENANCE or RUN_END
    at: datetime.datetime
    host: str = ""


def seen_ahead(hosts: Iterable[HostView], nodes: Mapping[str, NodeView],
               run_end: datetime.datetime | None) -> Seen | None:
    """The earliest scheduled maintenance of a node the job's TPU pods run on (not begun yet: a window that has
    begun is the lost-slice path's), or the DWS run's end when that comes first."""
    found = [Seen(MAINTENANCE, node.maintenance_at, node.name) for node in
             (nodes.get(host.node) for host in hosts if host.node)
             if node is not None and node.maintenance_at is not None and not node.maintenance_ongoing]
    if run_end is not None:
        found.append(Seen(RUN_END, run_end))
    return min(found, key=lambda seen: (seen.at, seen.host)) if found else None


def run_end(view: WorkloadView, rung: Rung) -> datetime.datetime | None:
    """When a DWS run ends: its admission (Kueue admits once the ProvisioningRequest is provisioned, which starts
    the run) plus its maxRunDurationSeconds. None on a rung without a check, or when either is unknown."""
    if not rung.admission_check or view.admitted_since is None or view.max_run_seconds is None:
        return None
    return view.admitted_since + datetime.timedelta(seconds=view.max_run_seconds)


def announce_at(seen: Seen, policy: Policy) -> datetime.datetime | None:
    """When a disruption seen coming is announced (Event, metric); None: at once. A maintenance at once: GKE gives days
    of notice of each, and each is news. A DWS run's end one `saveTimeout` before its checkpoint request (`leadTime`
    before it): the Event then precedes what is done about it by as long as the save is given, and a run that ends
    days away is no disruption ahead yet."""
    return seen.at - policy.lead - policy.save_timeout if seen.kind == RUN_END else None


def current(recorded: Ahead | None, flavor: str | None, running_since: datetime.datetime | None) -> Ahead | None:
    """The record, if it is about this admission (the rung it runs on, seen since its pods were all ready)."""
    if recorded is None or flavor is None or running_since is None or recorded.flavor != flavor:
        return None
    seen_at = parse_time(recorded.seen_at)
    return recorded if seen_at is not None and seen_at >= running_since.replace(microsecond=0) else None


def free_tpus(cluster_queue: Mapping) -> dict[str, int]:
    """A ClusterQueue's TPU chips free now, by flavor: its nominal quota less what Kueue has reserved (borrowing
    left out: a move needs room the rung can keep)."""
    nominal: dict[str, int] = {}
    for group in (cluster_queue.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for resource in flavor.get("resources") or []:
                if resource.get("name") == TPU_RESOURCE:
                    nominal[flavor["name"]] = nominal.get(flavor["name"], 0) + int(resource.get("nominalQuota", 0))
    for flavor in (cluster_queue.get("status") or {}).get("flavorsReservation") or []:
        for resource in flavor.get("resources") or []:
            if resource.get("name") == TPU_RESOURCE and flavor.get("name") in nominal:
                nominal[flavor["name"]] -= int(resource.get("total", 0))
    return nominal


def move_target(chain: Chain, flavor: str, chips: int, free: Mapping[str, Mapping[str, int]]) -> Rung | None:
    """The first rung of the chain, other than `flavor`'s, whose ClusterQueue has `chips` free for its flavor now
    (`free`: ClusterQueue -> free_tpus). A rung with a check (DWS) is never a target: its quota says nothing of a
    slice, which it would have to ask for. Free quota on on-demand is no promise of capacity: a stockout there is
    the early path's, as for any job."""
    for rung in chain.rungs:
        if rung.flavor != flavor and not rung.admission_check and chips > 0 and \
                (free.get(rung.cluster_queue) or {}).get(rung.flavor, 0) >= chips:
            return rung
    return None


# ---- what to do now ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RecordAhead:
    """A disruption newly seen (or moved in time): the record, and unless it is quiet an Event and the metric. A
    quiet record made loud (`ahead.quiet` False again) is the announcement of one recorded earlier."""

    ahead: Ahead


@dataclass(frozen=True)
class AskCheckpoint:
    """The checkpoint request on `pods` (those of the job's TPU pods without it), and the record that says so."""

    ahead: Ahead
    request: CheckpointRequest
    pods: tuple[str, ...]


@dataclass(frozen=True)
class MoveAhead:
    ahead: Ahead  # the record, moved_to set: written with the move's annotation
    move: Move


@dataclass(frozen=True)
class ClearAhead:
    """GKE no longer says it (the maintenance was cancelled, or ended): the record goes."""


AheadAction = RecordAhead | AskCheckpoint | MoveAhead | ClearAhead | None


def decide_ahead(view: WorkloadView, recorded: Ahead | None, seen: Seen | None, policy: Policy,
                 asked: Mapping[str, str | None], target: Rung | None,
                 now: datetime.datetime) -> tuple[AheadAction, datetime.datetime | None]:
    """The next step for a running job (`view` admitted, its pods all ready) and when to look again (None: at the
    next change). `asked`: the job's TPU pods and their checkpoint request now; `target`: where a move would go."""
    flavor, running_since = view.flavor, view.pods_ready_since
    if flavor is None or running_since is None:
        return None, None
    ahead = current(recorded, flavor, running_since)
    if seen is None:  # cancelled before its time: the record goes; once its time has come it stays, as history
        cancelled = ahead is not None and not ahead.moved_to and (parse_time(ahead.at) or now) > now
        return (ClearAhead() if cancelled else None), None
    announce = announce_at(seen, policy)
    loud = announce is None or now >= announce
    found = Ahead(seen.kind, format_time(seen.at), seen.host, flavor, format_time(now), quiet=not loud)
    if ahead is None or not found.same_disruption(ahead):
        return RecordAhead(found), now
    if ahead.quiet:
        return (RecordAhead(ahead.with_(quiet=False)), now) if loud else (None, announce)
    if policy.action == NOTHING or ahead.moved_to:
        return None, None
    ask_at = checkpoints.ask_at(seen.at, policy.lead)
    if now < ask_at:
        return None, ask_at
    # The save's steps are a checkpoint-then-move's (failover/api/checkpoint_moves.py); not its call-off: the job is
    # still on this admission (`current`), and with no target it waits for one until the disruption.
    request = CheckpointRequest.parse(ahead.checkpoint) or CheckpointRequest.about(seen.kind, seen.at, now)
    save, saved_at = save_step(request, asked, policy.save_timeout, now)
    if not ahead.checkpoint or save == ASK:
        pods = tuple(pods_to_ask(request, asked))
        return AskCheckpoint(ahead.with_(checkpoint=request.value()), request, pods), now
    if policy.action != MOVE or now >= seen.at:
        return None, None
    if save == SAVING:
        return None, saved_at
    if target is None:  # a ClusterQueue's change queues the job (regional/watches.py); else the window's look
        return None, seen.at
    move = Move(flavor, target.flavor, target.local_queue, DISRUPTION_AHEAD, format_time(now),
                from_local_queue=view.queue_name)
    return MoveAhead(ahead.with_(moved_to=target.flavor), move), None
