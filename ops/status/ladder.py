"""The capacity ladder as the cluster holds it: the rungs, their queues and their quota (pure functions of dicts).

The rungs come from the failover controller's FAILOVER_CHAIN when its Deployment exists (the stack's `queueChain`),
else from the ClusterQueues themselves: a rung is a flavor with TPU quota, in the order of the queue that lists the
most of them (the chain's top queue tries every rung). With several teams (infra/teams.py) quota also lives on
Cohorts: the root holds the shared rungs and what no team was given, so Cohorts count as quota holders too. The names follow infra/kueue.py: `cluster-queue` /
`user-queue` start at rung 0, `cluster-queue-<flavor>` / `user-queue-<flavor>` at that flavor's rung.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from failover.api import TPU_RESOURCE, Chain
from failover.api import CLUSTER_QUEUE, DEFAULT_FLAVOR, LOCAL_QUEUE
from ops.status.objects import conditions, is_true, name_of, namespace_of, quantity

# The variable the controller reads its chain from (failover/regional/__main__.py; set by infra/failover.py).
CHAIN_ENV = "FAILOVER_CHAIN"
FROM_CONTROLLER, FROM_CLUSTER_QUEUES = "failover-controller", "cluster-queues"
# When the ClusterQueues cannot be read (a namespace-only identity): the LocalQueues' status lists every flavor of
# their ClusterQueue in order, used or not (Kueue's cache filterLocalQueueUsage), so the rungs are still known; the
# quota is not. Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/cache/scheduler/cache.go (L1021-1070)
FROM_LOCAL_QUEUES, UNKNOWN = "local-queues", "unknown"


@dataclass(frozen=True)
class Quota:
    """One resource of one flavor, summed over every ClusterQueue (the cohort counts each flavor once)."""

    resource: str
    nominal: Decimal
    reserved: Decimal  # status.flavorsReservation: held by Workloads with quota reserved (admitted or awaiting checks)
    used: Decimal  # status.flavorsUsage: held by admitted Workloads
    borrowed: Decimal  # flavorsReservation's `borrowed`: held by queues beyond their own nominal quota


@dataclass(frozen=True)
class RungView:
    index: int
    flavor: str
    cluster_queue: str | None  # the ClusterQueue that holds the flavor's quota (nominal > 0)
    entry_queue: str | None  # the ClusterQueue whose flavor list starts here: where a job moved to this rung waits
    local_queue: str | None  # the LocalQueue of entry_queue
    admission_check: str | None  # the check Kueue runs before admitting here (DWS: a ProvisioningRequest)
    check_active: bool | None  # the AdmissionCheck's Active condition (None: no check); inactive blocks the queue
    flavor_exists: bool  # a ClusterQueue naming a missing ResourceFlavor is inactive
    quota: tuple[Quota, ...]

    def quota_of(self, resource: str = TPU_RESOURCE) -> Quota | None:
        return next((q for q in self.quota if q.resource == resource), None)


@dataclass(frozen=True)
class QueueView:
    """One ClusterQueue and what Kueue counts in its status (cluster-wide, whatever the namespace shown)."""

    name: str
    active: bool
    cohort: str | None
    flavors: tuple[str, ...]
    pending: int
    reserving: int
    admitted: int


@dataclass(frozen=True)
class Ladder:
    rungs: tuple[RungView, ...]
    queues: tuple[QueueView, ...]
    source: str  # FROM_CONTROLLER, FROM_CLUSTER_QUEUES, FROM_LOCAL_QUEUES or UNKNOWN
    unknown: str = ""  # why the quota and the ClusterQueues are unknown ("" when they were read)

    @property
    def quota_known(self) -> bool:
        return not self.unknown

    def rung(self, flavor: str | None) -> RungView | None:
        return next((r for r in self.rungs if r.flavor == flavor), None)

    def start_of_cluster_queue(self, cluster_queue: str | None) -> RungView | None:
        """The rung a ClusterQueue starts at: its first flavor that is a rung."""
        queue = next((q for q in self.queues if q.name == cluster_queue), None)
        if queue is None:
            return next((r for r in self.rungs if r.entry_queue == cluster_queue), None)
        return next((self.rung(f) for f in queue.flavors if self.rung(f)), None)


# ---- ClusterQueue readers -------------------------------------------------------------------------------------------
def tpu_group(cluster_queue: Mapping) -> Mapping:
    """The resource group that covers TPUs (the stack has one group; a flavor belongs to one group only)."""
    groups = (cluster_queue.get("spec") or {}).get("resourceGroups") or []
    return next((g for g in groups if TPU_RESOURCE in (g.get("coveredResources") or [])), groups[0] if groups else {})


def flavor_order(cluster_queue: Mapping) -> list[str]:
    return [f["name"] for f in tpu_group(cluster_queue).get("flavors") or []]


def nominal_quota(cluster_queue: Mapping, flavor: str, resource: str = TPU_RESOURCE) -> Decimal:
    for group in (cluster_queue.get("spec") or {}).get("resourceGroups") or []:
        for entry in group.get("flavors") or []:
            if entry.get("name") == flavor:
                for item in entry.get("resources") or []:
                    if item.get("name") == resource:
                        return quantity(item.get("nominalQuota"))
    return Decimal(0)


def covered_resources(cluster_queue: Mapping) -> list[str]:
    return list(tpu_group(cluster_queue).get("coveredResources") or [])


def status_amount(cluster_queue: Mapping, field: str, flavor: str, resource: str) -> tuple[Decimal, Decimal]:
    """(total, borrowed) of a resource of a flavor in status.flavorsUsage or status.flavorsReservation."""
    for entry in (cluster_queue.get("status") or {}).get(field) or []:
        if entry.get("name") == flavor:
            for item in entry.get("resources") or []:
                if item.get("name") == resource:
                    return quantity(item.get("total")), quantity(item.get("borrowed"))
    return Decimal(0), Decimal(0)


def checks_on(cluster_queue: Mapping | None, flavor: str) -> list[str]:
    """The admission checks a ClusterQueue runs for a flavor (v1beta2 admissionChecksStrategy; no onFlavors: all)."""
    strategy = ((cluster_queue or {}).get("spec") or {}).get("admissionChecksStrategy") or {}
    return [c["name"] for c in strategy.get("admissionChecks") or []
            if not c.get("onFlavors") or flavor in c["onFlavors"]]


# ---- the rungs ------------------------------------------------------------------------------------------------------
def chain_of_controller(deployment: Mapping | None) -> Chain | None:
    """The chain the controller runs with (its FAILOVER_CHAIN); None without a Deployment or a readable chain."""
    containers = (((deployment or {}).get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []
    for container in containers:
        for item in container.get("env") or []:
            if item.get("name") == CHAIN_ENV and item.get("value"):
                try:
                    chain = Chain.from_json(item["value"])
                except (ValueError, KeyError, TypeError):
                    return None
                return chain if chain.rungs else None
    return None


def rung_flavors(cluster_queues: Sequence[Mapping], cohorts: Sequence[Mapping] = ()) -> list[str]:
    """Flavors with TPU quota somewhere, in the order of the queue that lists the most of them, then the rest."""
    with_tpus = {f for holder in (*cluster_queues, *cohorts) for f in flavor_order(holder)
                 if nominal_quota(holder, f) > 0}
    lists = sorted(([f for f in flavor_order(cq) if f in with_tpus] for cq in cluster_queues),
                   key=lambda flavors: -len(flavors))  # stable: ties keep the queues' name order
    ordered: list[str] = []
    for flavors in lists:
        ordered += [f for f in flavors if f not in ordered]
    return ordered


def conventional_queues(index: int, flavor: str) -> tuple[str, str]:
    """The chain's names for the queues that start at a rung (infra.kueue.queue_chain)."""
    if index == 0:
        return CLUSTER_QUEUE, LOCAL_QUEUE
    return f"{CLUSTER_QUEUE}-{flavor}", f"{LOCAL_QUEUE}-{flavor}"


def entry_queue(cluster_queues: Sequence[Mapping], flavors: Sequence[str], index: int) -> str | None:
    """The ClusterQueue that starts at rung `index`: the chain's name when it exists, else any queue whose first
    rung is this one."""
    conventional, _ = conventional_queues(index, flavors[index])
    starting = [name_of(cq) for cq in cluster_queues
                if next((f for f in flavor_order(cq) if f in flavors), None) == flavors[index]]
    if conventional in starting:
        return conventional
    return starting[0] if starting else None


def local_queue_of(local_queues: Iterable[Mapping], cluster_queue: str | None,
                   conventional: tuple[str, str]) -> str | None:
    """The LocalQueue pointing at `cluster_queue`: the chain's name when listed, or when the queue is the chain's and
    no LocalQueue is visible (another namespace shown)."""
    pointing = sorted({name_of(lq) for lq in local_queues if (lq.get("spec") or {}).get("clusterQueue") == cluster_queue})
    chain_cluster_queue, chain_local_queue = conventional
    if chain_local_queue in pointing or (not pointing and cluster_queue == chain_cluster_queue):
        return chain_local_queue
    return pointing[0] if pointing else None


def holder_of(cluster_queues: Sequence[Mapping], flavor: str, cohorts: Sequence[Mapping] = ()) -> str | None:
    """The ClusterQueue holding the flavor's quota; else the Cohort (shown as `cohort <name>`)."""
    queue = next((name_of(cq) for cq in cluster_queues if nominal_quota(cq, flavor) > 0), None)
    cohort = next((name_of(c) for c in cohorts if nominal_quota(c, flavor) > 0), None)
    return queue or (f"cohort {cohort}" if cohort else None)


def quota_of(cluster_queues: Sequence[Mapping], flavor: str, cohorts: Sequence[Mapping] = ()) -> tuple[Quota, ...]:
    resources: list[str] = []
    for cq in cluster_queues:
        resources += [r for r in covered_resources(cq) if r not in resources]
    quotas = []
    for resource in resources:
        listing = [cq for cq in cluster_queues if flavor in flavor_order(cq)]
        nominal = sum((nominal_quota(holder, flavor, resource) for holder in (*listing, *cohorts)), Decimal(0))
        reservation = [status_amount(cq, "flavorsReservation", flavor, resource) for cq in listing]
        usage = [status_amount(cq, "flavorsUsage", flavor, resource) for cq in listing]
        quotas.append(Quota(resource, nominal, sum((t for t, _ in reservation), Decimal(0)),
                            sum((t for t, _ in usage), Decimal(0)), sum((b for _, b in reservation), Decimal(0))))
    return tuple(quotas)


def queue_view(cluster_queue: Mapping) -> QueueView:
    status = cluster_queue.get("status") or {}
    return QueueView(name_of(cluster_queue), is_true(conditions(cluster_queue).get("Active")),
                     (cluster_queue.get("spec") or {}).get("cohortName"), tuple(flavor_order(cluster_queue)),
                     int(status.get("pendingWorkloads") or 0), int(status.get("reservingWorkloads") or 0),
                     int(status.get("admittedWorkloads") or 0))


def local_queue_flavors(local_queue: Mapping) -> list[str]:
    """The rungs of a LocalQueue's ClusterQueue, in its order (status.flavorsReservation lists every flavor): those
    covering TPUs, less the stack's CPU flavor (it covers TPUs too, with no quota, which a LocalQueue cannot show)."""
    return [f.get("name", "") for f in (local_queue.get("status") or {}).get("flavorsReservation") or []
            if f.get("name") != DEFAULT_FLAVOR and any(r.get("name") == TPU_RESOURCE for r in f.get("resources") or [])]


def ladder_from_local_queues(local_queues: Sequence[Mapping], unknown: str) -> Ladder:
    """The rungs as a namespace sees them: flavors in the order of the LocalQueue that lists the most, each rung's
    queues those whose first flavor it is. Quota, checks and ClusterQueues stay unknown."""
    listed = {id(lq): local_queue_flavors(lq) for lq in local_queues}
    flavors: list[str] = []
    for rungs_of_one in sorted((listed[id(lq)] for lq in sorted(local_queues, key=name_of)), key=lambda f: -len(f)):
        flavors += [f for f in rungs_of_one if f not in flavors]
    rungs = []
    for index, flavor in enumerate(flavors):
        starting = sorted((lq for lq in local_queues if (listed[id(lq)] or [None])[0] == flavor),
                          key=lambda lq: (name_of(lq) != conventional_queues(index, flavor)[1], name_of(lq)))
        entry = starting[0] if starting else None
        rungs.append(RungView(index, flavor, None, ((entry or {}).get("spec") or {}).get("clusterQueue"),
                              name_of(entry) or None, None, None, True, ()))
    return Ladder(tuple(rungs), (), FROM_LOCAL_QUEUES if rungs else UNKNOWN, unknown)


def build_ladder(cluster_queues: Sequence[Mapping], resource_flavors: Sequence[Mapping],
                 admission_checks: Sequence[Mapping], local_queues: Sequence[Mapping],
                 controller: Mapping | None, cohorts: Sequence[Mapping] = (),
                 unreadable: Mapping[str, str] | None = None) -> Ladder:
    """The rungs, from the controller's chain when it has one, else from the ClusterQueues; when the ClusterQueues
    cannot be read (`unreadable`, by Snapshot field), from the chain or the LocalQueues, with the quota unknown."""
    unreadable = unreadable or {}
    if "cluster_queues" in unreadable:
        unknown = unreadable["cluster_queues"]
        chain = chain_of_controller(controller)
        if chain is not None:
            return Ladder(tuple(RungView(i, r.flavor, None, r.cluster_queue, r.local_queue, None, None, True, ())
                                for i, r in enumerate(chain.rungs)), (), FROM_CONTROLLER, unknown)
        if "local_queues" in unreadable:
            return Ladder((), (), UNKNOWN, unknown)
        return ladder_from_local_queues(local_queues, unknown)
    cluster_queues = sorted(cluster_queues, key=name_of)
    by_name = {name_of(cq): cq for cq in cluster_queues}
    existing = {name_of(f) for f in resource_flavors}
    checks_active = {name_of(c): is_true(conditions(c).get("Active")) for c in admission_checks}
    chain = chain_of_controller(controller)
    if chain is not None:
        source = FROM_CONTROLLER
        flavors = [r.flavor for r in chain.rungs]
        entries = [(r.cluster_queue, r.local_queue) for r in chain.rungs]
    else:
        source = FROM_CLUSTER_QUEUES
        flavors = rung_flavors(cluster_queues, cohorts)
        entries = []
        for index, flavor in enumerate(flavors):
            entry = entry_queue(cluster_queues, flavors, index)
            entries.append((entry, local_queue_of(local_queues, entry, conventional_queues(index, flavor))))
    rungs = []
    for index, (flavor, (entry, local)) in enumerate(zip(flavors, entries)):
        holder = holder_of(cluster_queues, flavor, cohorts)
        checks = checks_on(by_name.get(holder or "") or by_name.get(entry or ""), flavor)
        check = checks[0] if checks else None
        # An unreadable list proves nothing missing: a check's state is then unknown (None), a flavor assumed there.
        active = None if check is None or "admission_checks" in unreadable else checks_active.get(check, False)
        rungs.append(RungView(index, flavor, holder, entry, local, check, active,
                              flavor in existing or "resource_flavors" in unreadable,
                              quota_of(cluster_queues, flavor, cohorts)))
    return Ladder(tuple(rungs), tuple(queue_view(cq) for cq in cluster_queues), source)


def local_queue_targets(local_queues: Iterable[Mapping]) -> dict[tuple[str, str], str]:
    """(namespace, LocalQueue) -> its ClusterQueue."""
    return {(namespace_of(lq), name_of(lq)): (lq.get("spec") or {}).get("clusterQueue", "") for lq in local_queues}
