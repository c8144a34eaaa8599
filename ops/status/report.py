"""What the status command reports: the objects read from the cluster (`Snapshot`, plain dicts) turned into one
`Report` by pure functions. No I/O here: tests build snapshots from recorded objects."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from failover.api import QUEUE_LABEL
from failover.api import DWS_ADMISSION_CHECK, PROVISIONING_CONTROLLER
from ops.status import jobs as job_states
from ops.status.fleet import FleetView, fleet_view
from ops.status.health import ControllerView, controller_view
from ops.status.jobs import (JobView, current_rung, fleet_of, job_state, kueue_pods_ready_timeout, moves_of,
                             request_of, request_view, workload_of)
from ops.status.ladder import Ladder, RungView, build_ladder, local_queue_targets
from ops.status.objects import conditions, created_at, is_true, key_of, labels, meta, name_of, namespace_of

# What the snapshot reads, by its field: JSON's `readable` says which of them the cluster allowed.
READS = ("cluster_queues", "cohorts", "resource_flavors", "admission_checks", "local_queues", "workloads", "rayjobs",
         "provisioning_requests", "pods", "move_events", "controller", "controller_pods", "fleet_watch",
         "fleet_watch_pods", "fleet_ladder", "fleet_ladder_pods", "multikueue_clusters", "kueue_config")

# A job counts as admitted on its rung in these states, as pending in these (unless deactivated: a move in progress
# reactivates it at its target).
ADMITTED_STATES = frozenset({job_states.ADMITTED, job_states.RUNNING, job_states.SLICE_LOST})
PENDING_STATES = frozenset({job_states.WAITING_FOR_QUOTA, job_states.WAITING_FOR_SLICE,
                            job_states.WAITING_FOR_CHECKS, job_states.EVICTED, job_states.MOVING,
                            job_states.NO_WORKLOAD})


@dataclass
class Snapshot:
    """Everything the report reads, as the API returned it. Namespaced lists hold only the namespace shown
    (`namespace` None: all); the queue objects and the controller are cluster-wide. A read the cluster refused is
    in `unreadable` (field -> the problem): its list is empty because it is unknown, not because it is empty."""

    now: datetime.datetime
    namespace: str | None
    context: str | None = None
    server: str | None = None
    cluster_queues: list[dict] = field(default_factory=list)
    cohorts: list[dict] = field(default_factory=list)  # several teams: shared quota lives on the root Cohort
    resource_flavors: list[dict] = field(default_factory=list)
    admission_checks: list[dict] = field(default_factory=list)
    local_queues: list[dict] = field(default_factory=list)
    workloads: list[dict] = field(default_factory=list)
    rayjobs: list[dict] = field(default_factory=list)
    provisioning_requests: list[dict] = field(default_factory=list)
    pods: list[dict] = field(default_factory=list)  # the jobs' pods: ready / needed
    node_pools: dict[str, str] | None = None  # node -> GKE node pool; None: Nodes not readable (no problem line)
    controller: dict | None = None  # the failover controller's Deployment
    controller_pods: list[dict] = field(default_factory=list)
    fleet_watch: dict | None = None  # on a fleet's manager: the fleet watch's Deployment
    fleet_watch_pods: list[dict] = field(default_factory=list)
    fleet_ladder: dict | None = None  # on a fleet's manager: the ladder controller's Deployment
    fleet_ladder_pods: list[dict] = field(default_factory=list)
    multikueue_clusters: list[dict] = field(default_factory=list)  # on a fleet's manager: its members
    kueue_config: dict | None = None  # Kueue's manager ConfigMap: the pods-ready timeout
    move_events: list[dict] = field(default_factory=list)  # MovedToNextRung Events in the namespaces shown
    queue_positions: dict[tuple[str, str], int] = field(default_factory=dict)  # from Kueue's visibility API
    positions_from_kueue: bool = False
    unreadable: dict[str, str] = field(default_factory=dict)  # field -> why it could not be read
    problems: list[str] = field(default_factory=list)  # what could not be read, and why

    def deny(self, what: str, problem: str, matters: bool = True) -> None:
        """A read the cluster refused. `matters` False: what it would have read cannot be there (a fleet's objects
        on a cluster that is no fleet's manager), so nothing shown is unknown: no problem line."""
        self.unreadable[what] = problem
        if matters:
            self.problems.append(problem)

    def readable(self, what: str) -> bool:
        return what not in self.unreadable

    @property
    def controller_readable(self) -> bool:
        return self.readable("controller")


@dataclass(frozen=True)
class RungStatus:
    rung: RungView
    admitted: int  # jobs shown that are admitted here
    pending: int  # jobs shown that wait for this rung: their queue starts here, they hold quota here awaiting a check,
    # or they are moving here


@dataclass(frozen=True)
class Report:
    generated_at: datetime.datetime
    context: str | None
    namespace: str | None
    ladder: Ladder
    rungs: tuple[RungStatus, ...]
    jobs: tuple[JobView, ...]
    controller: ControllerView
    problems: tuple[str, ...]
    jobs_known: bool = True  # False: neither Workloads nor RayJobs could be read, so `jobs` is unknown, not empty
    missing: tuple[str, ...] = ()  # jobs asked for by name that do not exist (NotFound)
    fleet: FleetView | None = None  # on a fleet's manager: its members and the fleet watch
    readable: Mapping[str, bool] = field(default_factory=dict)  # per read: whether the cluster allowed it
    server: str | None = None

    @property
    def complete(self) -> bool:
        """Everything was read: nothing shown is unknown."""
        return not self.problems


def start_rung(ladder: Ladder, cluster_queue: str | None, local_queue: str | None) -> RungView | None:
    """The rung a job's queue starts at: by its ClusterQueue, else by the chain's LocalQueue name."""
    rung = ladder.start_of_cluster_queue(cluster_queue) if cluster_queue else None
    return rung or next((r for r in ladder.rungs if local_queue and r.local_queue == local_queue), None)


@dataclass(frozen=True)
class Shared:
    """What every job's view reads, worked out once per report rather than once per job."""

    ladder: Ladder
    targets: Mapping[tuple[str, str], str]  # (namespace, LocalQueue) -> ClusterQueue
    positions: Mapping[tuple[str, str], int]  # (namespace, Workload) -> its place among the pending
    position_source: str
    pods: job_states.PodIndex
    pods_ready_timeout: int | None  # Kueue's waitForPodsReady timeout (None: its ConfigMap unread)
    slice_checks: frozenset[str]  # the checks that wait for a ProvisioningRequest, when those cannot be read

    @classmethod
    def of(cls, snapshot: Snapshot, ladder: Ladder) -> Shared:
        targets = local_queue_targets(snapshot.local_queues)
        if snapshot.positions_from_kueue:
            positions, source = snapshot.queue_positions, job_states.POSITION_FROM_KUEUE
        else:
            positions, source = computed_positions(snapshot, targets), job_states.POSITION_COMPUTED
        timeout = kueue_pods_ready_timeout(snapshot.kueue_config) if snapshot.kueue_config is not None else None
        checks = frozenset() if snapshot.readable("provisioning_requests") else provisioning_checks(snapshot)
        return cls(ladder, targets, positions, source, job_states.PodIndex(snapshot.pods), timeout, checks)


def job_view(owner: Mapping, workload: Mapping | None, snapshot: Snapshot, shared: Shared) -> JobView:
    """One job: `owner` is the RayJob (or, for other kinds, the Workload's owner reference as a stub object)."""
    ladder = shared.ladder
    kind = owner.get("kind") or job_states.RAYJOB_KIND
    is_rayjob = kind == job_states.RAYJOB_KIND
    request = request_view(request_of(workload, snapshot.provisioning_requests))
    moves, in_progress = moves_of(owner) if is_rayjob else ((), None)
    if workload is None and is_rayjob and not snapshot.readable("workloads"):
        state = job_states.State(job_states.UNKNOWN, "unknown", None, snapshot.unreadable["workloads"])
    else:
        state = job_state(owner, workload, request, in_progress, moves[-1] if moves else None, shared.slice_checks,
                          snapshot.unreadable.get("provisioning_requests"))
    namespace = namespace_of(owner)
    local_queue = ((workload or {}).get("spec") or {}).get("queueName") or labels(owner).get(QUEUE_LABEL)
    admission = ((workload or {}).get("status") or {}).get("admission") or {}
    cluster_queue = admission.get("clusterQueue") or shared.targets.get((namespace, local_queue or ""))
    start = start_rung(ladder, cluster_queue, local_queue)
    if cluster_queue is None and start is not None:
        cluster_queue = start.entry_queue
    rung = (in_progress.to_flavor if state.state == job_states.MOVING
            else current_rung(workload, state.state, start.flavor if start else None))
    active = ((workload or {}).get("spec") or {}).get("active", True) is not False
    size = job_states.size_of(workload)
    pods = job_states.pods_of(kind, name_of(owner), namespace, shared.pods, owner)
    pods_ready = job_states.ready_pods(pods) if snapshot.readable("pods") and size is not None else None
    pools = (job_states.node_pools_of(pods, snapshot.node_pools)
             if snapshot.readable("pods") and snapshot.node_pools is not None else None)
    priority, priority_class = job_states.priority_of(workload)
    evictions = job_states.evictions_of(workload)
    last = ladder.rungs[-1].flavor if ladder.rungs else None
    looping = (last if last is not None and rung == last and state.state != job_states.FINISHED
               and job_states.capacity_failures(evictions) - len(moves) >= job_states.LOOP_EVICTIONS else None)
    key = (namespace, name_of(workload))
    return JobView(namespace, name_of(owner), name_of(workload) or None, local_queue, cluster_queue, rung, active,
                   state.state, state.words, state.since, state.detail, moves, in_progress, request,
                   job_states.check_states(workload), fleet_of(owner, workload), kind=kind, size=size,
                   pods_ready=pods_ready, priority=priority, priority_class=priority_class,
                   created=created_at(workload) or created_at(owner),
                   position=shared.positions.get(key),
                   position_source=shared.position_source if key in shared.positions else None,
                   evictions=evictions, requeues=job_states.requeues_of(workload),
                   evict_at=job_states.evict_deadline(workload, state.state, shared.pods_ready_timeout),
                   looping_on=looping, pools=pools, ran=job_states.run_span(owner) if is_rayjob else None,
                   goodput=(job_states.goodput_of(owner, workload, start.flavor if start else None, snapshot.now)
                            if state.state != job_states.UNKNOWN else None),
                   ahead=job_states.ahead_of(owner, workload) if is_rayjob else None)


def provisioning_checks(snapshot: Snapshot) -> frozenset[str]:
    """The admission checks that wait for a ProvisioningRequest: from the AdmissionCheck objects, else the stack's."""
    if not snapshot.readable("admission_checks"):
        return frozenset({DWS_ADMISSION_CHECK})
    return frozenset(name_of(c) for c in snapshot.admission_checks
                     if (c.get("spec") or {}).get("controllerName") == PROVISIONING_CONTROLLER)


def waits(job: JobView) -> bool:
    return job.state in PENDING_STATES and (job.active or job.state == job_states.MOVING)


def rung_statuses(ladder: Ladder, views: Sequence[JobView]) -> tuple[RungStatus, ...]:
    return tuple(RungStatus(rung, sum(1 for j in views if j.rung == rung.flavor and j.state in ADMITTED_STATES),
                            sum(1 for j in views if j.rung == rung.flavor and waits(j)))
                 for rung in ladder.rungs)


def owner_stub(workload: Mapping) -> dict:
    """A job Kueue admits that is not a RayJob: its kind and name from the Workload's owner reference."""
    owner = job_states.controller_owner(workload)
    pod_group = labels(workload).get(job_states.POD_GROUP_LABEL)  # a pod group's Workload has one owner per Pod
    name = pod_group if owner.get("kind") == "Pod" and pod_group else owner.get("name") or name_of(workload)
    return {"apiVersion": owner.get("apiVersion", ""), "kind": owner.get("kind") or "Workload",
            "metadata": {"name": name, "namespace": namespace_of(workload), "uid": owner.get("uid"),
                         "labels": {QUEUE_LABEL: (workload.get("spec") or {}).get("queueName", "")}}}


def jobs_and_workloads(snapshot: Snapshot) -> list[tuple[Mapping, Mapping | None]]:
    """Every job shown: each RayJob with its Workload (or none yet), then every other Workload with its owner."""
    pairs: list[tuple[Mapping, Mapping | None]] = []
    claimed: set[tuple[str, str]] = set()
    by_owner_uid: dict[str, list[Mapping]] = {}
    for w in snapshot.workloads:
        by_owner_uid.setdefault(job_states.controller_owner(w).get("uid") or "", []).append(w)
    for rayjob in snapshot.rayjobs:
        uid = meta(rayjob).get("uid")
        candidates = by_owner_uid.get(uid, []) if uid else snapshot.workloads
        owned = [w for w in candidates if namespace_of(w) == namespace_of(rayjob)
                 and job_states.controller_owner(w).get("kind") == job_states.RAYJOB_KIND]
        claimed |= {key_of(w) for w in owned}
        pairs.append((rayjob, workload_of(rayjob, owned)))
    others: dict[tuple[str, str, str], list[Mapping]] = {}
    rayjobs_known = snapshot.readable("rayjobs")
    for w in snapshot.workloads:
        if key_of(w) in claimed:
            continue
        stub = owner_stub(w)
        if stub["kind"] == job_states.RAYJOB_KIND and rayjobs_known:
            continue  # its RayJob is gone (Kueue's Workload outlives it until the garbage collector comes)
        others.setdefault((namespace_of(w), stub["kind"], name_of(stub)), []).append(w)
    for workloads in others.values():
        stub = owner_stub(workloads[0])
        chosen = workload_of(stub, workloads) if stub["metadata"]["uid"] else workloads[0]
        pairs.append((stub, chosen or workloads[0]))
    return pairs


def computed_positions(snapshot: Snapshot, targets: Mapping[tuple[str, str], str]) -> dict[tuple[str, str], int]:
    """Each pending Workload's place in its ClusterQueue, as Kueue orders its queue: priority, then the queue time
    (BestEffortFIFO); only among the Workloads this identity can see."""
    queues: dict[str, list[Mapping]] = {}
    for w in snapshot.workloads:
        found = conditions(w)
        if is_true(found.get("QuotaReserved")) or is_true(found.get("Finished")):
            continue
        if ((w.get("spec") or {}).get("active", True)) is False:
            continue
        queue = targets.get((namespace_of(w), (w.get("spec") or {}).get("queueName", "")))
        if queue:
            queues.setdefault(queue, []).append(w)
    far = datetime.datetime.max.replace(tzinfo=datetime.timezone.utc)
    positions = {}
    for pending in queues.values():
        pending.sort(key=lambda w: (-int((w.get("spec") or {}).get("priority") or 0),
                                    job_states.queue_order_time(w) or far, name_of(w)))
        positions.update({key_of(w): i for i, w in enumerate(pending)})
    return positions


def build_report(snapshot: Snapshot, only: Sequence[str] = ()) -> Report:
    """The report; `only` limits the jobs to those names (the rungs still count every job shown)."""
    ladder = build_ladder(snapshot.cluster_queues, snapshot.resource_flavors, snapshot.admission_checks,
                          snapshot.local_queues, snapshot.controller, snapshot.cohorts,
                          unreadable=snapshot.unreadable)
    shared = Shared.of(snapshot, ladder)
    pairs = sorted(jobs_and_workloads(snapshot), key=lambda pair: (key_of(pair[0]), pair[0].get("kind", "")))
    views = [job_view(owner, workload, snapshot, shared) for owner, workload in pairs]
    shown = tuple(v for v in views if not only or v.name in only)
    jobs_known = snapshot.readable("workloads") or snapshot.readable("rayjobs")
    missing = tuple(name for name in only if jobs_known and name not in {v.name for v in views})
    fleet = fleet_view(snapshot)
    absent = ("not deployed (a fleet's manager has none: see FLEET WATCH)" if fleet is not None
              else "not deployed (a one-rung ladder has none)")
    return Report(snapshot.now, snapshot.context, snapshot.namespace, ladder, rung_statuses(ladder, views), shown,
                  controller_view(snapshot.controller, snapshot.controller_pods, snapshot.move_events,
                                  snapshot.controller_readable, absent=absent), tuple(snapshot.problems),
                  jobs_known=jobs_known, missing=missing, fleet=fleet,
                  readable={what: snapshot.readable(what) for what in READS}, server=snapshot.server)
