"""What the status command reports: the objects read from the cluster (`Snapshot`, plain dicts) turned into one
`Report` by pure functions. No I/O here: tests build snapshots from recorded objects."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from failover.decisions import QUEUE_LABEL
from ops.status import jobs as job_states
from ops.status.health import ControllerView, controller_view
from ops.status.jobs import (JobView, current_rung, fleet_of, job_state, moves_of, request_of, request_view,
                             workload_of)
from ops.status.ladder import Ladder, RungView, build_ladder, local_queue_targets
from ops.status.objects import key_of, labels, name_of, namespace_of

# A job counts as admitted on its rung in these states, as pending in these (unless deactivated: a move in progress
# reactivates it at its target).
ADMITTED_STATES = frozenset({job_states.ADMITTED, job_states.RUNNING})
PENDING_STATES = frozenset({job_states.WAITING_FOR_QUOTA, job_states.WAITING_FOR_SLICE,
                            job_states.WAITING_FOR_CHECKS, job_states.EVICTED, job_states.MOVING,
                            job_states.NO_WORKLOAD})


@dataclass
class Snapshot:
    """Everything the report reads, as the API returned it. Namespaced lists hold only the namespace shown
    (`namespace` None: all); the queue objects and the controller are cluster-wide."""

    now: datetime.datetime
    namespace: str | None
    context: str | None = None
    cluster_queues: list[dict] = field(default_factory=list)
    cohorts: list[dict] = field(default_factory=list)  # several teams: shared quota lives on the root Cohort
    resource_flavors: list[dict] = field(default_factory=list)
    admission_checks: list[dict] = field(default_factory=list)
    local_queues: list[dict] = field(default_factory=list)
    workloads: list[dict] = field(default_factory=list)
    rayjobs: list[dict] = field(default_factory=list)
    provisioning_requests: list[dict] = field(default_factory=list)
    controller: dict | None = None  # the failover controller's Deployment
    controller_pods: list[dict] = field(default_factory=list)
    controller_readable: bool = True
    move_events: list[dict] = field(default_factory=list)  # MovedToNextRung Events in the namespaces shown
    problems: list[str] = field(default_factory=list)  # what could not be read, and why


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


def start_rung(ladder: Ladder, cluster_queue: str | None, local_queue: str | None) -> RungView | None:
    """The rung a job's queue starts at: by its ClusterQueue, else by the chain's LocalQueue name."""
    rung = ladder.start_of_cluster_queue(cluster_queue) if cluster_queue else None
    return rung or next((r for r in ladder.rungs if local_queue and r.local_queue == local_queue), None)


def job_view(rayjob: Mapping, snapshot: Snapshot, ladder: Ladder, targets: Mapping[tuple[str, str], str]) -> JobView:
    workload = workload_of(rayjob, snapshot.workloads)
    request = request_view(request_of(workload, snapshot.provisioning_requests))
    moves, in_progress = moves_of(rayjob)
    state = job_state(rayjob, workload, request, in_progress, moves[-1] if moves else None)
    namespace = namespace_of(rayjob)
    local_queue = ((workload or {}).get("spec") or {}).get("queueName") or labels(rayjob).get(QUEUE_LABEL)
    admission = ((workload or {}).get("status") or {}).get("admission") or {}
    cluster_queue = admission.get("clusterQueue") or targets.get((namespace, local_queue or ""))
    start = start_rung(ladder, cluster_queue, local_queue)
    if cluster_queue is None and start is not None:
        cluster_queue = start.entry_queue
    rung = (in_progress.to_flavor if state.state == job_states.MOVING
            else current_rung(workload, state.state, start.flavor if start else None))
    active = ((workload or {}).get("spec") or {}).get("active", True) is not False
    return JobView(namespace, name_of(rayjob), name_of(workload) or None, local_queue, cluster_queue, rung, active,
                   state.state, state.words, state.since, state.detail, moves, in_progress, request,
                   job_states.check_states(workload), fleet_of(rayjob, workload))


def waits(job: JobView) -> bool:
    return job.state in PENDING_STATES and (job.active or job.state == job_states.MOVING)


def rung_statuses(ladder: Ladder, views: Sequence[JobView]) -> tuple[RungStatus, ...]:
    return tuple(RungStatus(rung, sum(1 for j in views if j.rung == rung.flavor and j.state in ADMITTED_STATES),
                            sum(1 for j in views if j.rung == rung.flavor and waits(j)))
                 for rung in ladder.rungs)


def build_report(snapshot: Snapshot, only: Sequence[str] = ()) -> Report:
    """The report; `only` limits the jobs to those names (the rungs still count every job shown)."""
    ladder = build_ladder(snapshot.cluster_queues, snapshot.resource_flavors, snapshot.admission_checks,
                          snapshot.local_queues, snapshot.controller, snapshot.cohorts)
    targets = local_queue_targets(snapshot.local_queues)
    views = [job_view(job, snapshot, ladder, targets) for job in sorted(snapshot.rayjobs, key=key_of)]
    shown = tuple(v for v in views if not only or v.name in only)
    return Report(snapshot.now, snapshot.context, snapshot.namespace, ladder, rung_statuses(ladder, views), shown,
                  controller_view(snapshot.controller, snapshot.controller_pods, snapshot.move_events,
                                  snapshot.controller_readable), tuple(snapshot.problems))
