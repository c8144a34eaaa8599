"""What the fleet's ladder watches, as the runtime keeps it: on the manager (the shared cache,
failover/runtime/cache.py) the fleet namespace's Workloads (a LadderView each) and RayJobs (their metadata only); in
every member (the runtime's member caches, failover/runtime/members.py, through the kubeconfig MultiKueue uses) the
Warning Events in the fleet's namespace: the autoscaler's stockouts (the early path) and the member's failover
controller's SliceLost. Each change queues the manager Workloads it touches; the ladder decides for each
(failover/ladder/controller.py).
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Callable, Iterable

from failover.api import Ladder
from failover.ladder.decisions import (JobMeta, Key, LadderView, dispatched, is_slice_lost_event, is_stockout_event,
                                       running_member)
from failover.runtime.cache import DELETED, Cache, Change
from failover.runtime.controller import Watch
from failover.runtime.informer import Watched
from failover.runtime.members import Member, MemberCaches, MemberWatch

log = logging.getLogger("tpu-fallback.ladder")
EVENT_FIELDS = ("metadata", "involvedObject", "reason", "message", "firstTimestamp", "lastTimestamp", "eventTime")


def watched(namespace: str) -> tuple[Watched, Watched, Watched]:
    """The manager's RayJobs (metadata only) and Workloads, and a member's Warning Events, in the fleet's namespace."""
    base = f"namespaces/{namespace}"
    return (Watched("rayjobs", f"/apis/ray.io/v1/{base}/rayjobs", metadata_only=True),
            Watched("workloads", f"/apis/kueue.x-k8s.io/v1beta2/{base}/workloads"),
            Watched("member-events", f"/api/v1/{base}/events", field_selector="type=Warning"))


def said(obj: dict, _before: object = None) -> dict | None:
    """A member's Event the ladder reads (a stockout about a pod, a SliceLost about a RayJob); None for any other."""
    return {k: obj.get(k) for k in EVENT_FIELDS} if is_stockout_event(obj) or is_slice_lost_event(obj) else None


class LadderSeen:
    """The stores the ladder reads (`views`, `jobs`; per member its Events), when this process first saw MultiKueue
    send each job to its step's members (`dispatched_at`), the RayJobs each member's failover controller said lost
    their slice (`said_lost`), and the Workloads each change queues (`enqueue`)."""

    def __init__(self, cache: Cache, ladder: Ladder, namespace: str, clock: Callable[[], datetime.datetime],
                 members: MemberCaches | None, enqueue: Callable[[Iterable[Key]], None]):
        self.ladder, self.clock, self.members, self.enqueue = ladder, clock, members, enqueue
        self.watched_rayjobs, self.watched_workloads, self.watched_events = watched(namespace)
        self.jobs = cache.store(self.watched_rayjobs, lambda obj, _before: JobMeta.of(obj))
        self.views = cache.store(self.watched_workloads, lambda obj, _before: LadderView.from_object(obj), {
            "rayjob": lambda key, view: [(key[0], view.rayjob)] if view.rayjob else []})
        if members is not None:
            members.watches.append(MemberWatch(self.watched_events, self._member_said, said))
        self._lock = threading.Lock()
        # When this process first saw MultiKueue send a job to its step's members: (the step's queue, that moment), or
        # None for the moment when it was so at this process's first list (then the step's own time is used).
        self._dispatched_seen: dict[Key, tuple[str, datetime.datetime | None]] = {}
        self._lost: dict[str, set[str]] = {}  # member -> the RayJobs its failover controller said lost their slice

    def watches(self) -> list[Watch]:
        return [Watch(self.watched_rayjobs, self._rayjob_changed),
                Watch(self.watched_workloads, self._workload_changed)]

    # ---- the manager's objects ---------------------------------------------------------------------------------
    def _workload_changed(self, change: Change) -> list[Key]:
        key = change.key
        with self._lock:
            if change.type == DELETED:
                self._dispatched_seen.pop(key, None)
                return []
            view = change.new
            index = self.ladder.index(view.queue_name)
            seen = self._dispatched_seen.get(key)
            if (index is not None and dispatched(self.ladder.steps[index], view)
                    and (seen is None or seen[0] != view.queue_name)):
                self._dispatched_seen[key] = (view.queue_name, None if change.listed else self.clock())
        return [key]

    def _rayjob_changed(self, change: Change) -> list[Key]:
        """Its Workload, when what the ladder reads of the RayJob changed."""
        if change.type == DELETED or change.old == change.new:
            return []
        workload = self.views.last("rayjob", change.key)
        return [workload] if workload is not None else []

    def dispatched_at(self, key: Key, view: LadderView) -> datetime.datetime | None:
        with self._lock:
            seen = self._dispatched_seen.get(key)
        return seen[1] if seen is not None and seen[0] == view.queue_name else None

    # ---- what the members say ----------------------------------------------------------------------------------
    def _member_said(self, member: Member, changes: list[Change], listed: bool) -> None:
        """A stockout or a lost slice in a member queues the jobs it runs. A SliceLost is remembered until the
        member's Events are listed again (its wait may outlast the Event)."""
        if listed:
            with self._lock:
                self._lost[member.name] = {c.new["involvedObject"].get("name") for c in changes
                                           if c.new is not None and is_slice_lost_event(c.new)}
            self.enqueue(self.admitted_in(member.name))
            return
        for change in changes:
            event = change.new or change.old
            if is_slice_lost_event(event):  # the member's controller recorded a loss: read it (on the member's RayJob)
                if change.type != DELETED:  # and look again when its wait ends
                    with self._lock:
                        self._lost.setdefault(member.name, set()).add(event["involvedObject"].get("name"))
                self.enqueue(self.admitted_in(member.name))
            elif change.type != DELETED:
                log.info("member %s reports a stockout for pod %s", member.name,
                         (event.get("involvedObject") or {}).get("name"))
                self.enqueue(self.admitted_in(member.name))

    def admitted_in(self, member: str) -> list[Key]:
        """The jobs `member` runs (`running_member`): a stockout or a lost slice there may be theirs."""
        return [key for key, view in self.views.items()
                if (step := self.ladder.step_of(view.queue_name)) is not None and running_member(step, view) == member]

    def member_says(self, name: str, rayjob: str) -> tuple[Member | None, list[dict], bool]:
        """The member, the stockouts it reports, and whether its failover controller said `rayjob` lost its slice."""
        member = self.members.get(name) if self.members is not None else None
        store = member.store(self.watched_events) if member is not None else None
        events = [e for e in store.values() if is_stockout_event(e)] if store is not None else []
        with self._lock:
            lost = rayjob in self._lost.get(name, ())
        return member, events, lost
