"""A report as people read it (tables like kubectl's, then the why per job) or as JSON (`-o json`)."""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence

from failover.api import CLIMBS, TPU_RESOURCE, Account, format_time
from ops.status.health import ControllerView
from ops.status.fleet import FleetView
from ops.status.jobs import MOVE_WORDS, POSITION_COMPUTED, POSITION_FROM_KUEUE, JobView, MoveView
from ops.status.ladder import FROM_CLUSTER_QUEUES, FROM_CONTROLLER, FROM_LOCAL_QUEUES, UNKNOWN, Quota
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


def times(count: int) -> str:
    return f"{count} time" + ("" if count == 1 else "s")


def time_or_none(moment: datetime.datetime | None) -> str | None:
    return format_time(moment) if moment else None


def seconds_since(moment: datetime.datetime | None, now: datetime.datetime) -> int | None:
    return max(0, int((now - moment).total_seconds())) if moment else None


def move_words(move: MoveView) -> str:
    if move.reason in CLIMBS:  # a move up the ladder (failover/regional/climb.py)
        return f"climbed back from {move.from_flavor} to {move.to_flavor} at {move.at} ({MOVE_WORDS[move.reason]})"
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
            "kueueRecord": job.fleet.record, "runsIn": list(job.fleet.runs_in), "rungs": dict(job.fleet.rungs),
            "state": job.fleet.watch_state,
            "since": time_or_none(job.fleet.since), "words": job.fleet.words()},
        "kind": job.kind,
        "chips": job.size.chips if job.size else None, "hosts": job.size.hosts if job.size else None,
        "podsNeeded": job.size.pods if job.size else None, "podsReady": job.pods_ready,  # null: unknown
        "nodePools": None if job.pools is None else list(job.pools),  # null: Nodes not readable
        "runStartedAt": time_or_none(job.ran[0]) if job.ran else None,
        "runEndedAt": time_or_none(job.ran[1]) if job.ran else None, "runSeconds": job.run_seconds,
        "priority": job.priority, "priorityClass": job.priority_class,
        "createdAt": time_or_none(job.created), "ageSeconds": seconds_since(job.created, now),
        "position": None if job.position is None else {"inClusterQueue": job.position, "source": job.position_source},
        "evictions": dict(job.evictions), "evictionCount": job.eviction_count, "requeues": job.requeues,
        "evictAt": time_or_none(job.evict_at),
        "evictInSeconds": None if job.evict_at is None else max(0, int((job.evict_at - now).total_seconds())),
        "loopingOn": job.looping_on,
        "disruptionAhead": None if job.ahead is None else {
            "kind": job.ahead.kind, "at": job.ahead.at, "host": job.ahead.host or None, "flavor": job.ahead.flavor,
            "seenAt": job.ahead.seen_at, "checkpointRequest": job.ahead.checkpoint or None,
            "movedTo": job.ahead.moved_to or None, "words": job.ahead.message()},
        "goodput": goodput_dict(job.goodput),  # null: its Workload could not be read
    }


def goodput_dict(found: Account | None) -> dict | None:
    """Scheduling goodput (running over the time since submission, null in its first second) and where the time
    went: seconds per state, per state and rung, and the timeline itself (`exact` false: estimated, docs/goodput.md)."""
    if found is None:
        return None
    return {"scheduling": None if found.goodput is None else round(found.goodput, 4),
            "submittedAt": format_time(found.submitted), "until": format_time(found.end),
            "elapsedSeconds": round(found.elapsed_seconds, 1),
            "seconds": {state: round(seconds, 1) for state, seconds in found.seconds.items()},
            "byRung": [{"state": state, "rung": rung, "seconds": round(seconds, 1)}
                       for (state, rung), seconds in found.by_rung.items()],
            "estimatedSeconds": round(found.estimated_seconds, 1),
            "timeline": [{"state": s.state, "rung": s.rung, "from": format_time(s.start), "to": format_time(s.end),
                          "seconds": round(s.seconds, 1), "exact": s.exact} for s in found.segments]}


def controller_dict(controller: ControllerView) -> dict:
    move = controller.latest_move
    return {"namespace": controller.namespace, "name": controller.name, "state": controller.state,
            "words": controller.words, "replicas": controller.desired, "readyReplicas": controller.ready,
            "restarts": controller.restarts, "pods": list(controller.pods),
            "latestMove": None if move is None else {"namespace": move.namespace, "job": move.job,
                                                     "message": move.message, "at": time_or_none(move.at)}}


def fleet_dict(fleet: FleetView | None) -> dict | None:
    if fleet is None:
        return None
    return {"members": [{"name": m.name, "active": m.active, "reason": m.reason, "message": m.message,
                         "since": time_or_none(m.since), "words": m.words()} for m in fleet.members]
            if fleet.members_known else None,  # null: the MultiKueueClusters could not be read
            "watch": controller_dict(fleet.watch), "ladder": controller_dict(fleet.ladder)}


def report_dict(report: Report) -> dict:
    """Unknown is null, never an empty list: `readable` says which read the cluster refused, `complete` whether
    any refusal left something unknown (then the command exits with EXIT_PARTIAL): a refused read of a fleet's
    objects on a cluster that is no fleet's manager leaves nothing unknown."""
    ladder = report.ladder
    return {
        "generatedAt": format_time(report.generated_at),
        "context": report.context,
        "server": report.server,
        "namespace": report.namespace,  # null: all namespaces
        "complete": report.complete,
        "readable": dict(report.readable),
        "ladderFrom": ladder.source,
        "quotaKnown": ladder.quota_known,
        "rungs": None if ladder.source == UNKNOWN else [
            {"index": s.rung.index, "flavor": s.rung.flavor, "clusterQueue": s.rung.cluster_queue,
             "entryClusterQueue": s.rung.entry_queue, "localQueue": s.rung.local_queue,
             "admissionCheck": s.rung.admission_check, "admissionCheckActive": s.rung.check_active,
             "flavorExists": s.rung.flavor_exists,
             "quota": {q.resource: quota_dict(q) for q in s.rung.quota} if ladder.quota_known else None,
             "admittedJobs": s.admitted, "pendingJobs": s.pending} for s in report.rungs],
        "clusterQueues": None if not ladder.quota_known else [
            {"name": q.name, "active": q.active, "cohort": q.cohort, "flavors": list(q.flavors),
             "pendingWorkloads": q.pending, "reservingWorkloads": q.reserving, "admittedWorkloads": q.admitted}
            for q in ladder.queues],
        "jobs": [job_dict(j, report.generated_at) for j in report.jobs] if report.jobs_known else None,
        "notFound": list(report.missing),
        "failoverController": controller_dict(report.controller),
        "fleet": fleet_dict(report.fleet),
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


UNKNOWN_QUOTA = object()  # a rung whose quota could not be read: "?" rather than "-" (none)


def chips(quota: Quota | None, field: str) -> str:
    if quota is UNKNOWN_QUOTA:
        return "?"
    return NONE if quota is None else str(plain_number(getattr(quota, field)))


LADDER_SOURCES = {FROM_CONTROLLER: "the failover controller's chain",
                  FROM_CLUSTER_QUEUES: "the ClusterQueues (no failover controller chain)",
                  FROM_LOCAL_QUEUES: "the LocalQueues shown"}


def ladder_lines(report: Report) -> list[str]:
    ladder = report.ladder
    if ladder.source == UNKNOWN:
        return ["LADDER unknown", f"  {ladder.unknown}"]
    lines = [f"LADDER (rungs from {LADDER_SOURCES[ladder.source]}; TPU chips: reserved = held by Workloads, "
             "used = admitted)"]
    if not ladder.quota_known:
        lines.append(f"  quota unknown: {ladder.unknown}")
    if not report.rungs:
        return lines + ["  no ClusterQueue with TPU quota"]
    rows = []
    for status in report.rungs:
        rung, tpu = status.rung, status.rung.quota_of(TPU_RESOURCE)
        if not ladder.quota_known:
            tpu = UNKNOWN_QUOTA
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
    if not report.ladder.quota_known:
        return ["CLUSTERQUEUES unknown", f"  {report.ladder.unknown}"]
    rows = [(q.name, "yes" if q.active else "NO", q.cohort, ",".join(q.flavors), q.pending, q.reserving, q.admitted)
            for q in report.ladder.queues]
    return ["CLUSTERQUEUES (Kueue's counts, all namespaces)"] + table(
        ("NAME", "ACTIVE", "COHORT", "FLAVORS", "PENDING", "RESERVING", "ADMITTED"), rows)


def pools_cell(job: JobView) -> str | None:
    """The GKE node pools the job's pods run on ("?" where Nodes may not be read; empty: none placed)."""
    if job.pools is None:
        return "?"
    return ",".join(job.pools) or None


def pods_cell(job: JobView) -> str | None:
    if job.size is None:
        return None
    return f"{'?' if job.pods_ready is None else job.pods_ready}/{job.size.pods}"


def position_cell(job: JobView) -> str | None:
    if job.position is None:
        return None
    return f"{job.position}" if job.position_source == POSITION_FROM_KUEUE else f"~{job.position}"


def goodput_cell(job: JobView) -> str | None:
    """Its scheduling goodput in percent; ~ where part of its time is estimated (docs/goodput.md)."""
    if job.goodput is None or job.goodput.goodput is None:
        return None
    return f"{'~' if job.goodput.estimated_seconds else ''}{round(100 * job.goodput.goodput)}%"


def job_lines(report: Report) -> list[str]:
    where = "all namespaces" if report.namespace is None else f"namespace {report.namespace}"
    if not report.jobs_known:
        return [f"JOBS ({where}) unknown"] + [f"  {p}" for p in report.problems if "Workload" in p or "RayJob" in p]
    if not report.jobs:
        return [f"JOBS ({where})", "  no jobs"]
    all_namespaces = report.namespace is None
    rows = []
    for job in report.jobs:
        request = job.request.words if job.request else None
        row = (job.local_queue, job.rung, job.words, time_or_none(job.since),
               duration(seconds_since(job.since, report.generated_at)) if job.since else None,
               len(job.moves), request, job.kind, job.size.chips if job.size else None, pods_cell(job),
               pools_cell(job), job.priority,
               duration(seconds_since(job.created, report.generated_at)) if job.created else None,
               position_cell(job), job.eviction_count, goodput_cell(job))
        rows.append(((job.namespace,) if all_namespaces else ()) + (job.name,) + row)
    headers = (("NAMESPACE",) if all_namespaces else ()) + (
        "NAME", "QUEUE", "RUNG", "STATE", "SINCE", "FOR", "MOVES", "PROVISIONING REQUEST", "KIND", "CHIPS", "PODS",
        "NODE POOLS", "PRIORITY", "AGE", "POSITION", "EVICTIONS", "GOODPUT")
    lines = [f"JOBS ({where})"] + table(headers, rows)
    if any(j.position_source == POSITION_COMPUTED for j in report.jobs):
        lines += ["", "POSITION ~n: computed from the Workloads shown (Kueue's visibility API is not served here), "
                     "from 0"]
    if any(j.goodput is not None and j.goodput.estimated_seconds for j in report.jobs):
        lines += ["", "GOODPUT: the share of the time since submission the job ran on a whole slice; ~n%: part of "
                      "that time is estimated (docs/goodput.md; -o json has the breakdown)"]
    return lines


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
        if job.run_seconds is not None:
            parts.append(f"ran {duration(job.run_seconds)} (KubeRay: {format_time(job.ran[0])} to "
                         f"{format_time(job.ran[1])})")
        if job.ahead is not None:
            parts.append(f"ahead: {job.ahead.message()}")
        if job.looping_on:
            parts.append(f"looping on the last rung ({job.looping_on}): evicted there again and again, with no "
                         "rung below to move to")
        if job.evict_at is not None:
            left = duration((job.evict_at - report.generated_at).total_seconds())
            parts.append(f"Kueue evicts it at {format_time(job.evict_at)} (in {left}) unless all its pods are ready")
        if job.evictions or job.requeues:
            counted = ", ".join(f"{count} {reason}" for reason, count in job.evictions)
            parts.append(f"evicted {times(job.eviction_count)}" + (f" ({counted})" if counted else "")
                         + f", requeued {times(job.requeues)} since its last admission")
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


def fleet_lines(report: Report) -> list[str]:
    fleet = report.fleet
    if fleet is None:
        return []
    head = [f"{title} {view.namespace}/{view.name}: {view.words}"
            + (f", {view.ready}/{view.desired} ready, {view.restarts} restarts" if view.desired else "")
            for title, view in (("FLEET WATCH", fleet.watch), ("FLEET LADDER", fleet.ladder))]
    if not fleet.members_known:
        return [*head, "MEMBERS unknown (see PROBLEMS)"]
    rows = [(m.name, {True: "yes", False: "NO", None: "?"}[m.active], m.reason,
             time_or_none(m.since), m.message if not m.active else None) for m in fleet.members]
    return [*head, f"MEMBERS (Kueue's MultiKueueClusters: {fleet.connected}/{len(fleet.members)} connected)"] + table(
        ("NAME", "CONNECTED", "REASON", "SINCE", "MESSAGE"), rows)


def render_table(report: Report) -> str:
    header = (f"context {report.context or NONE} · "
              f"{'all namespaces' if report.namespace is None else 'namespace ' + report.namespace} · "
              f"{format_time(report.generated_at)}")
    sections = [[header], ladder_lines(report), queue_lines(report), job_lines(report)]
    why = why_lines(report)
    if why:
        sections.append(why)
    sections.append(controller_lines(report))
    if report.fleet is not None:
        sections.append(fleet_lines(report))
    if report.problems:
        sections.append(["PROBLEMS"] + [f"  {p}" for p in report.problems])
    return "\n\n".join("\n".join(section) for section in sections) + "\n"
