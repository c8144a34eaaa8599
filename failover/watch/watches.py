"""What the fleet watch watches, as the runtime keeps it: on the manager (the shared cache, failover/runtime/cache.py)
the Workloads that belong to a RayJob, the RayJobs and Kueue's MultiKueueClusters; in every member it can reach
(the runtime's member caches, failover/runtime/members.py, through the kubeconfig MultiKueue uses) this manager's
copies and RayJobs; and whether each member answers. Each change queues the jobs it touches (by their manager
RayJob's key); the watch decides for each (failover/watch/controller.py).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable

from failover.api import MULTIKUEUE_ORIGIN_LABEL
from failover.runtime.cache import DELETED, Cache, Change
from failover.runtime.controller import Watch
from failover.runtime.informer import METADATA_ONLY_LIST, RawClient, Watched, release
from failover.runtime.members import Member, MemberCaches, MemberWatch
from failover.watch.decisions import Key, condition_true, owner_rayjob, still_answers

log = logging.getLogger("tpu-fallback.fleet")
REQUEST_TIMEOUT_SECONDS = 5  # a probe not answered in this long is missed
WATCHED_MANAGER_WORKLOADS = Watched("workloads", "/apis/kueue.x-k8s.io/v1beta2/workloads")
WATCHED_MANAGER_RAYJOBS = Watched("rayjobs", "/apis/ray.io/v1/rayjobs")
WATCHED_CLUSTERS = Watched("multikueueclusters", "/apis/kueue.x-k8s.io/v1beta2/multikueueclusters")
WATCHED_MEMBER_WORKLOADS = Watched("member-workloads", "/apis/kueue.x-k8s.io/v1beta2/workloads")  # + origin label
WATCHED_MEMBER_RAYJOBS = Watched("member-rayjobs", "/apis/ray.io/v1/rayjobs")


def owned(obj: dict, _before: object = None) -> dict | None:
    """A manager Workload that belongs to a RayJob (the fleet's jobs); None (not kept) for any other."""
    return obj if owner_rayjob(obj) else None


def active(obj: dict, _before: object = None) -> bool:
    """Kueue's view of a member: its MultiKueueCluster's Active condition."""
    return condition_true(obj, "Active")


class FleetSeen:
    """The stores the watch reads (`workloads`, `rayjobs`, `connected`; per member its `copies` and `member_rayjobs`
    stores), the keys each change queues (`enqueue`), and each member's answer (`tick`): a member answers when it
    answered the last probe (`still_answers`) and its informers have listed since it last did not."""

    def __init__(self, cache: Cache, members: MemberCaches, origin: str,
                 enqueue: Callable[[Iterable[Key]], None]):
        self.members, self.origin, self.enqueue = members, origin, enqueue
        self.workloads = cache.store(WATCHED_MANAGER_WORKLOADS, owned, {
            "rayjob": lambda key, workload: [(key[0], owner_rayjob(workload))]})
        self.rayjobs = cache.store(WATCHED_MANAGER_RAYJOBS)
        self.connected = cache.store(WATCHED_CLUSTERS, active)
        selector = f"{MULTIKUEUE_ORIGIN_LABEL}={origin}"
        self.copies = dataclasses.replace(WATCHED_MEMBER_WORKLOADS, label_selector=selector)
        self.member_rayjobs = dataclasses.replace(WATCHED_MEMBER_RAYJOBS, label_selector=selector)
        members.watches += [MemberWatch(self.copies, self._copy_changed),
                            MemberWatch(self.member_rayjobs, self._member_rayjob_changed)]
        # A member cut off keeps nothing; a renewed token keeps what it holds until the new list (it still answers).
        members.keep = lambda member: member.primed

    def watches(self) -> list[Watch]:
        return [Watch(WATCHED_MANAGER_WORKLOADS, self._workload_changed),
                Watch(WATCHED_MANAGER_RAYJOBS, self._rayjob_changed),
                Watch(WATCHED_CLUSTERS, self._cluster_changed, listed=lambda changes: self.all_keys())]

    # ---- the jobs each change queues ---------------------------------------------------------------------------
    def _workload_changed(self, change: Change) -> list[Key]:
        if change.listed and change.type == DELETED:
            return []
        return [(change.key[0], owner_rayjob(change.new or change.old))]

    def _rayjob_changed(self, change: Change) -> list[Key]:
        return [] if change.listed and change.type == DELETED else [change.key]

    def _cluster_changed(self, change: Change) -> list[Key]:
        return self.all_keys() if change.old != change.new else []  # Kueue lost or found a member: every job

    def _copy_changed(self, member: Member, changes: list[Change], listed: bool) -> None:
        """A copy's change queues the manager's job it belongs to; a (re)list, every job."""
        if listed:
            self.enqueue(self.all_keys())
            return
        for change in changes:
            workload = self.workloads.get(change.key)
            if workload is not None:
                self.enqueue([(change.key[0], owner_rayjob(workload))])

    def _member_rayjob_changed(self, member: Member, changes: list[Change], listed: bool) -> None:
        """A member's RayJob is named as the manager's."""
        self.enqueue(self.all_keys() if listed else [change.key for change in changes])

    def all_keys(self) -> list[Key]:
        """Every job: each manager Workload's RayJob, and each RayJob."""
        jobs = {(key[0], owner_rayjob(workload)): None for key, workload in self.workloads.items()}
        return list({**jobs, **dict.fromkeys(self.rayjobs.keys())})

    # ---- the members: read again, asked for an answer ----------------------------------------------------------
    def tick(self) -> dict[str, bool]:
        """Re-read the members' kubeconfigs (a changed one rebuilds that member's cache), ask each member for an
        answer (in parallel, `REQUEST_TIMEOUT_SECONDS` each); whether each answers now."""
        members = self.members.refresh()
        threads = [threading.Thread(target=self.probe, args=(member,), daemon=True) for member in members]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(REQUEST_TIMEOUT_SECONDS + 5)
        return self.answered()

    def probe(self, member: Member) -> None:
        answered = False
        if member.api is not None:
            try:
                release(RawClient(member.api).request(
                    "GET", WATCHED_MEMBER_WORKLOADS.path, serialize=False, _request_timeout=REQUEST_TIMEOUT_SECONDS,
                    query_params=[("limit", 1), ("labelSelector", f"{MULTIKUEUE_ORIGIN_LABEL}={self.origin}")],
                    header_params={"Accept": METADATA_ONLY_LIST}))
                answered = True
            except Exception as error:  # noqa: BLE001 - any failure to answer is "does not answer"
                log.warning("member %s does not answer: %s", member.name, str(error).splitlines()[0][:200])
        before = member.answers
        member.missed = 0 if answered else member.missed + 1
        answers = still_answers(before, member.missed)
        if answers and not before and member.probe_failed_at is not None:
            self.members.restart(member)  # back: what its informers hold may be stale
        member.answers = answers
        member.probe_failed_at = None if answers else member.probe_failed_at or time.monotonic()
        if answers != before:
            self.enqueue(self.all_keys())

    def answered(self) -> dict[str, bool]:
        return {name: answers(member) for name, member in self.members.all().items()}

    def answering(self) -> dict[str, Member]:
        return {name: member for name, member in self.members.all().items() if answers(member)}


def answers(member: Member) -> bool:
    """It answered the last probe, and its informers have listed since it last did not."""
    if member.api is not None and member.answers and member.synced():
        member.primed = True
    return member.api is not None and member.answers and member.primed
