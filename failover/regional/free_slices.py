"""The free-slice signal of the rungs a job may climb back to (failover/regional/climb.py says what counts), kept from
what the controller watches: Kueue's ClusterQueues (each flavor's TPU quota less what is reserved of it), the
TPU nodes (labelled with the rung their pool serves) and the TPU worker pods on them. Each change that moves a rung's
numbers is a sample; a rung that gains room queues the jobs running below it, whose reconcile then says when to look
again (when the rung has been free for the settle time).

Kept in memory only: a restart starts every rung's settle time afresh, which only delays a climb.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from failover.api import Chain, Move
from failover.api.climbs import CAPACITY_LABEL, ClimbPolicy, free_since, record
from failover.api.names import NODE_POOL_LABEL
from failover.regional import climb
from failover.regional.watches import WATCHED_CLUSTERQUEUES, WATCHED_PODS
from failover.runtime.cache import Cache, Change, Key
from failover.runtime.controller import Watch
from failover.runtime.informer import Watched
from failover.slices import NodeView

# The TPU nodes only (every TPU pool carries the label), a store of their own beside the loss rules' view of nodes.
WATCHED_TPU_NODES = Watched("tpu-nodes", "/api/v1/nodes", label_selector=CAPACITY_LABEL)
KEPT_BEYOND_SETTLE = datetime.timedelta(minutes=1)  # samples are kept for the settle time and this much more
# A waiting job's climb holds what it takes of the rung until Kueue reserves its quota there (the rung's numbers then
# show it), or this long at most: a move takes seconds.
CLAIM_KEPT = datetime.timedelta(seconds=60)


@dataclass(frozen=True)
class Claim:
    key: Key
    need: climb.Need
    until: datetime.datetime
    free_chips: int  # the rung's free chips when it was made: a drop says Kueue's reservation shows in the numbers


@dataclass(frozen=True)
class CapacityNode:
    flavor: str
    pool: str
    usable: bool  # Ready, not going (failover/slices.py GOING_TAINTS), no maintenance scheduled, schedulable


def capacity_node(obj: dict, _before: object = None) -> CapacityNode:
    """A host with a maintenance scheduled is no free capacity: a job moved off its slice ahead of the window, then
    waiting below, climbed straight back onto it (found on the tier once every change of its RayJob queued it)."""
    labels = obj["metadata"].get("labels") or {}
    view = NodeView.from_object(obj)
    usable = (view.ready and view.going is None and view.maintenance_at is None
              and not (obj.get("spec") or {}).get("unschedulable"))
    return CapacityNode(labels.get(CAPACITY_LABEL, ""), labels.get(NODE_POOL_LABEL, ""), usable)


def rung_numbers(flavor: str, free_tpus: Iterable[Mapping[str, int]], nodes: Iterable[tuple[str, CapacityNode]],
                 busy: Callable[[str], bool]) -> tuple[int, int]:
    """(free chips, idle hosts) of one rung: its chips free over every ClusterQueue (`free_tpus`: each one's nominal
    quota less what Kueue reserved there, by flavor, failover/maintenance.py; a queue that borrows the flavor lists it
    with no quota, so its reservation counts against the lender's), and the most usable nodes without a TPU pod in one
    of its pools (a multi-host slice is one pool)."""
    free = sum(queue.get(flavor, 0) for queue in free_tpus)
    idle: dict[str, int] = {}
    for name, node in nodes:
        if node.flavor == flavor and node.usable and not busy(name):
            idle[node.pool] = idle.get(node.pool, 0) + 1
    return max(free, 0), max(idle.values(), default=0)


class FreeSlices:
    """Each rung's samples (climb.Sample) for the flavors the policy may climb to, and the Workloads a rung's gain
    queues. `seen` is the controller's stores (watches.Seen): its TPU pods by node, RayJobs, Workloads, stockouts."""

    def __init__(self, cache: Cache, seen, chain: Chain, policy: ClimbPolicy,
                 clock: Callable[[], datetime.datetime]):
        self.seen, self.chain, self.policy, self.clock = seen, chain, policy, clock
        # Every rung without an admission check above the last: a running job climbs only to those in `policy.to`
        # (climbing back on), a waiting one to any above it (climb.waiting_targets).
        self.flavors = [rung.flavor for rung in chain.rungs[:-1] if not rung.admission_check]
        # The TPU nodes are watched only when there is a rung to climb to.
        self.nodes = cache.store(WATCHED_TPU_NODES, capacity_node) if self.flavors else None
        self._lock = threading.Lock()
        self._samples: dict[str, list[climb.Sample]] = {flavor: [] for flavor in self.flavors}
        # Told after a change moved any rung's numbers (a probe's decision reads them: probing.py)
        self.listeners: list[Callable[[], None]] = []
        self._claims: dict[str, list[Claim]] = {flavor: [] for flavor in self.flavors}
        for flavor in self.flavors:
            seen.metrics.idle_chips_waiting.labels(flavor).set_function(lambda flavor=flavor: self.idle_chips(flavor))

    def watches(self) -> list[Watch]:
        if not self.flavors:
            return []  # one rung, or only rungs with a check above the last: nothing to climb to
        return [Watch(WATCHED_CLUSTERQUEUES, self._changed), Watch(WATCHED_TPU_NODES, self._changed),
                Watch(WATCHED_PODS, self._changed)]

    # ---- the samples -------------------------------------------------------------------------------------------
    def _changed(self, _change: Change) -> list[Key]:
        """A rung's numbers again; when one gained room, the Workloads running below it (their reconcile says when
        the rung has been free long enough). Whoever listens is told of any change of the numbers."""
        changed, gained = self.sample()
        if changed:
            for listener in self.listeners:
                listener()
        return self.workloads_below(gained)

    def sample(self) -> tuple[list[str], list[str]]:
        """Take each rung's numbers now; the flavors whose numbers changed, and those that gained room."""
        if not self.flavors:
            return [], []
        now = self.clock()
        quotas = list(self.seen.free_tpus().values())
        nodes = self.nodes.items()
        changed, gained = [], []
        with self._lock:
            for flavor in self.flavors:
                free_chips, idle_hosts = rung_numbers(flavor, quotas, ((key[1], node) for key, node in nodes),
                                                      lambda name: bool(self.seen.pods.by("node", name)))
                samples = self._samples[flavor]
                before = samples[-1] if samples else None
                if not record(samples, climb.Sample(now, free_chips, idle_hosts),
                                    now - self.policy.settle - KEPT_BEYOND_SETTLE):
                    continue
                changed.append(flavor)
                if before is None or free_chips > before.free_chips or idle_hosts > before.idle_hosts:
                    gained.append(flavor)
        return changed, gained

    def latest(self, flavor: str) -> climb.Sample | None:
        """What the rung has now, as last sampled (None before its first sample, or for a rung not sampled)."""
        with self._lock:
            samples = self._samples.get(flavor)
            return samples[-1] if samples else None

    def idle_chips(self, flavor: str) -> int:
        """The chips of the rung's idle slice while a job that could take it waits below (climb.idle_chips_beside)."""
        rung = self.chain.index_of_flavor(flavor)
        waiting = [climb.Need(cached.view.tpu_chips, cached.view.tpu_hosts) for key, below in self.rungs_below()
                   if below > rung and (cached := self.seen.workloads.get(key)) is not None
                   and not (cached.view.admitted and cached.view.pods_ready_since)]
        return climb.idle_chips_beside(self.latest(flavor), waiting)

    def claim(self, flavor: str, key: Key, need: climb.Need) -> bool:
        """Hold what `need` takes of the rung for a waiting job about to climb there, if the rung's numbers, less what
        other climbs hold, still fit it: jobs that climb at once take no more slices than the rung has (four jobs once
        climbed onto one slice, each seeing it free before Kueue admitted any). Decided under one lock, so two
        workers never hold the same slice."""
        now = self.clock()
        with self._lock:
            samples = self._samples.get(flavor)
            if not samples:
                return False
            latest = samples[-1]
            held = [c for c in self._claims[flavor] if c.key != key and self._holds(c, flavor, now, latest)]
            left = climb.Sample(now, latest.free_chips - sum(c.need.chips for c in held),
                                latest.idle_hosts - sum(c.need.hosts for c in held))
            if not climb.fits(left, need, flavor in self.policy.reserved):
                self._claims[flavor] = held
                return False
            self._claims[flavor] = [*held, Claim(key, need, now + CLAIM_KEPT, latest.free_chips)]
            return True

    def claims_end(self, flavor: str) -> datetime.datetime | None:
        """When the earliest hold on the rung ends at the latest (a job it held back looks again then)."""
        with self._lock:
            return min((c.until for c in self._claims.get(flavor, ())), default=None)

    def _holds(self, claim: Claim, flavor: str, now: datetime.datetime, latest: climb.Sample) -> bool:
        """Whether a claim still holds: not past its time, its job still there, and not yet counted by the rung's own
        numbers (its job holds quota on the rung, and the rung's free chips dropped since: the ClusterQueue's status
        comes a moment after the Workload's; a claim let go on the Workload alone let a second job climb)."""
        cached = self.seen.workloads.get(claim.key)
        counted = (cached is not None and cached.view.quota_reserved and cached.view.flavor == flavor
                   and latest.free_chips < claim.free_chips)
        return now < claim.until and cached is not None and not counted

    def free_since(self, flavor: str, need: climb.Need) -> datetime.datetime | None:
        with self._lock:
            samples = list(self._samples.get(flavor, ()))
        return free_since(samples, need, flavor in self.policy.reserved)

    def workloads_below(self, flavors: list[str]) -> list[Key]:
        """The Workloads running on a rung below any of `flavors`, or waiting below it (climb.waiting_rung)."""
        if not flavors:
            return []
        top = min(self.chain.index_of_flavor(flavor) for flavor in flavors)
        return [key for key, rung in self.rungs_below() if rung > top]

    def rungs_below(self) -> list[tuple[Key, int]]:
        """(Workload, its rung) of every job that runs on a rung, or waits below its chain's first rung."""
        found = []
        for key, cached in self.seen.workloads.items():
            view = cached.view
            if view.admitted and view.pods_ready_since:
                rung = self.chain.index_of_flavor(view.flavor)
            else:
                job = self.seen.job(view.namespace, view.rayjob) if view.rayjob else None
                rung = climb.waiting_rung(self.chain, view, bool(job is not None and job.history))
            if rung is not None:
                found.append((key, rung))
        return found

    # ---- capacity failures -------------------------------------------------------------------------------------
    def last_failure(self, flavor: str) -> datetime.datetime | None:
        """The newest capacity failure seen on a rung: a job's move down from it for a stockout, a PodsReady timeout
        or a slice not back (recorded on every RayJob the controller sees), or a stockout the autoscaler reported on
        a TPU pod of a job admitted there."""
        times = [at for job in self.seen.rayjobs.values()
                 for failed, at in climb.capacity_failures((*job.history, Move.from_json(job.move))).items()
                 if failed == flavor]
        for event in self.seen.stockouts.values():
            if self._flavor_of_pod((event.get("involvedObject") or {})) == flavor:
                at = climb.event_time(event)
                if at is not None:
                    times.append(at)
        return max(times, default=None)

    def _flavor_of_pod(self, involved: Mapping) -> str | None:
        host = self.seen.pods.get((involved.get("namespace", ""), involved.get("name", "")))
        job = self.seen.rayjobs.last("raycluster", host.cluster) if host is not None else None
        key = self.seen.workloads.last("rayjob", job) if job is not None else None
        cached = self.seen.workloads.get(key) if key is not None else None
        return None if cached is None else (cached.view.flavor or cached.view.recorded_flavor)

