"""A report as people read it (tables like kubectl's, then the why per job) or as JSON (`-o json`)."""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence

from failover.decisions import TPU_RESOURCE, format_time
from ops.status.health import ControllerView
from ops.status.jobs import JobView, MoveView
from ops.status.ladder import FROM_CONTROLLER, Quota
from ops.status.objects import plain_number
from ops.status.report import Report

NONE = "-"


# ---- shared ---------------------------------------------------------------------------------------------------------
def duration(seconds: float) -> str:
    """kubectl-style: 45s, 3m12s, 2h5m, 3d4h."""
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds}s" if seconds else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours}h" if hours else f"{days}d"


def time_or_none(moment: datetime.datetime | None) -> str | None:
    return format_time(moment) if moment else None


def seconds_since(moment: datetime.datetime | None, now: datetime.datetime) -> int | None:
    return max(0, int((now - moment).total_seconds())) if moment else None


def move_words(move: MoveView) -> str:
    return f"{move.from_flavor} -> {move.to_flavor} ({move.reason}, {move.at})"


# ---- JSON -----------------------------------------------------------------------------------------------------------
def quota_dict(quota: Quota) -> dict:
    return {"nominal": plain_number(quota.nominal), "reserved": plain_number(quota.reserved),
            "used": plain_number(quota.used), "borrowed": plain_number(quota.borrowed)}


def move_dict(move: MoveView) -> dict:
    return {"from": move.from_flavor, "to": move.to_flavor, "localQueue": move.local_queue, "reason": move.reason,
            "at": move.at}


def job_dict(job: JobView, now: datetime.datetime) -> dict:
    request = job.request
    return {
        "namespace": job.namespace, "name": job.name, "workload": job.workload, "localQueue": job.local_queue,
        "clusterQueue": job.cluster_queue, "rung": job.rung, "state": job.state, "words": job.words,
        "since": time_or_none(job.since), "forSeconds": seconds_since(job.since, now), "detail": job.detail,
        "moves": [move_dict(m) for m in job.moves],
        "moveInProgress": move_dict(job.move_in_progress) if job.move_in_progress else None,
        "provisioningRequest": None if request is None else {
            "name": request.name, "provisioningClassName": request.provisioning_class, "state": request.state,
            "words": request.words, "since": time_or_none(request.since), "message": request.message},
        "admissionChecks": dict(job.checks),
        "fleet": None if job.fleet is None else {
            "kueueRecord": job.fleet.record, "runsIn": list(job.fleet.runs_in), "state": job.fleet.watch_state,
            "since": time_or_none(job.fleet.since), "words": job.fleet.words()},
    }


def controller_dict(controller: ControllerView) -> dict:
    move = controller.latest_move
    return {"namespace": controller.namespace, "name": controller.name, "state": controller.state,
            "words": controller.words, "replicas": controller.desired, "readyReplicas": controller.ready,
            "restarts": controller.restarts, "pods": list(controller.pods),
            "latestMove": None if move is None else {"namespace": move.namespace, "job": move.job,
                                                     "message": move.message, "at": time_or_none(move.at)}}


def report_dict(report: Report) -> dict:
    return {
        "generatedAt": format_time(report.generated_at),
        "context": report.context,
        "namespace": report.namespace,  # null: all namespaces
        "ladderFrom": report.ladder.source,
        "rungs": [{"index": s.rung.index, "flavor": s.rung.flavor, "clusterQueue": s.rung.cluster_queue,
                   "entryClusterQueue": s.rung.entry_queue, "localQueue": s.rung.local_queue,
                   "admissionCheck": s.rung.admission_check, "admissionCheckActive": s.rung.check_active,
                   "flavorExists": s.rung.flavor_exists,
                   "quota": {q.resource: quota_dict(q) for q in s.rung.quota},
                   "admittedJobs": s.admitted, "pendingJobs": s.pending} for s in report.rungs],
        "clusterQueues": [{"name": q.name, "active": q.active, "cohort": q.cohort, "flavors": list(q.flavors),
                           "pendingWorkloads": q.pending, "reservingWorkloads": q.reserving,
                           "admittedWorkloads": q.admitted} for q in report.ladder.queues],
        "jobs": [job_dict(j, report.generated_at) for j in report.jobs],
        "failoverController": controller_dict(report.controller),
        "problems": list(report.problems),
    }


def render_json(report: Report, indent: int | None = 2) -> str:
    return json.dumps(report_dict(report), indent=indent)


# ---- the table ------------------------------------------------------------------------------------------------------
def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """Columns left-aligned, three spaces apart, as kubectl prints them."""
    cells = [[str(c) for c in headers], *[[NONE if c is None or c == "" else str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return ["   ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells]


def chips(quota: Quota | None, field: str) -> str:
    return NONE if quota is None else str(plain_number(getattr(quota, field)))


def ladder_lines(report: Report) -> list[str]:
    source = ("the failover controller's chain" if report.ladder.source == FROM_CONTROLLER
              else "the ClusterQueues (no failover controller chain)")
    lines = [f"LADDER (rungs from {source}; TPU chips: reserved = held by Workloads, used = admitted)"]
    if not report.rungs:
        return lines + ["  no ClusterQueue with TPU quota"]
    rows = []
    for status in report.rungs:
        rung, tpu = status.rung, status.rung.quota_of(TPU_RESOURCE)
        check = rung.admission_check
        if check and rung.check_active is False:
            check += " (inactive)"
        flavor = rung.flavor if rung.flavor_exists else f"{rung.flavor} (no ResourceFlavor)"
        rows.append((rung.index, flavor, rung.cluster_queue, rung.local_queue, check, chips(tpu, "nominal"),
                     chips(tpu, "reserved"), chips(tpu, "used"), chips(tpu, "borrowed"), status.admitted,
                     status.pending))
    return lines + table(("RUNG", "FLAVOR", "QUOTA IN", "LOCALQUEUE", "CHECK", "NOMINAL", "RESERVED", "USED",
                          "BORROWED", "ADMITTED", "PENDING"), rows)


def queue_lines(report: Report) -> list[str]:
    rows = [(q.name, "yes" if q.active else "NO", q.cohort, ",".join(q.flavors), q.pending, q.reserving, q.admitted)
            for q in report.ladder.queues]
    return ["CLUSTERQUEUES (Kueue's counts, all namespaces)"] + table(
        ("NAME", "ACTIVE", "COHORT", "FLAVORS", "PENDING", "RESERVING", "ADMITTED"), rows)


def job_lines(report: Report) -> list[str]:
    where = "all namespaces" if report.namespace is None else f"namespace {report.namespace}"
    if not report.jobs:
        return [f"JOBS ({where})", "  no RayJobs"]
    all_namespaces = report.namespace is None
    rows = []
    for job in report.jobs:
        request = job.request.words if job.request else None
        row = (job.local_queue, job.rung, job.words, time_or_none(job.since),
               duration(seconds_since(job.since, report.generated_at)) if job.since else None,
               len(job.moves), request)
        rows.append(((job.namespace,) if all_namespaces else ()) + (job.name,) + row)
    headers = (("NAMESPACE",) if all_namespaces else ()) + ("NAME", "QUEUE", "RUNG", "STATE", "SINCE", "FOR",
                                                           "MOVES", "PROVISIONING REQUEST")
    return [f"JOBS ({where})"] + table(headers, rows)


def why_lines(report: Report) -> list[str]:
    """Per job, what the table has no room for: Kueue's reason, the moves, the ProvisioningRequest's message."""
    lines = []
    for job in report.jobs:
        parts = []
        if job.detail:
            parts.append(f"why: {job.detail}")
        if job.fleet:
            parts.append(f"fleet: {job.fleet.words()}")
        if job.moves:
            parts.append("moves: " + ", ".join(move_words(m) for m in job.moves))
        if job.request and job.request.message:
            parts.append(f"{job.request.name}: {job.request.message}")
        if parts:
            name = f"{job.namespace}/{job.name}" if report.namespace is None else job.name
            lines += [name] + [f"  {part}" for part in parts]
    return lines


def controller_lines(report: Report) -> list[str]:
    controller = report.controller
    head = f"FAILOVER CONTROLLER {controller.namespace}/{controller.name}: {controller.words}"
    if controller.desired:
        head += f", {controller.ready}/{controller.desired} ready, {controller.restarts} restarts"
    lines = [head]
    move = controller.latest_move
    if move is not None:
        ago = f"{duration(seconds_since(move.at, report.generated_at))} ago" if move.at else "at an unknown time"
        lines.append(f"  latest move {ago}: {move.namespace}/{move.job}: {move.message}")
    return lines


def render_table(report: Report) -> str:
    header = (f"context {report.context or NONE} · "
              f"{'all namespaces' if report.namespace is None else 'namespace ' + report.namespace} · "
              f"{format_time(report.generated_at)}")
    sections = [[header], ladder_lines(report), queue_lines(report), job_lines(report)]
    why = why_lines(report)
    if why:
        sections.append(why)
    sections.append(controller_lines(report))
    if report.problems:
        sections.append(["PROBLEMS"] + [f"  {p}" for p in report.problems])
    return "\n\n".join("\n".join(section) for section in sections) + "\n"
