"""The fleet watch (plan C), on a fleet's manager cluster: where each fleet job really runs, said on its RayJob.

Kueue 0.19.2's MultiKueue records where a job was admitted (`status.clusterName` of the manager's Workload) and
cannot change that record once set, nor set it to a member it did not nominate. Measured on the tier (README
"Plan C"): when the admitting member is cut off, the manager dispatches again after `workerLostTimeout` and
another member runs the job; when the first member comes back, Kueue keeps its older admission, deletes the newer
run, and keeps naming the other member, or none. The job then runs where the manager's record says it does not.

The watch keeps, through informers (failover/informer.py), the manager's Workloads, RayJobs and MultiKueueClusters
and, in every member it can reach (through the kubeconfig Secrets MultiKueue uses, re-read every period), the copies
and RayJobs this manager made; every change queues the jobs it touches. Per job it writes what is true on the
manager's RayJob (annotation `tpu-fallback/fleet`: state, where it runs, Kueue's record, members that do not answer or
cannot admit it) and an Event when that changes: `FleetRunning`, `FleetRecordStale`, `FleetRunningTwice` (a
partition's overlap; each run checkpoints under its own run id), `FleetMemberLost`, `FleetMemberCannotAdmit`,
`FleetWaiting`, `FleetFinished`. Its writes to what Kueue reads (README "Plan C", multikueue-ladder.md §8):
- an evicted job's RayJob status is marked `Suspended` when Kueue waits for it to stop, cannot see it, and no member
  that answers runs it (`may_unblock`, Event `FleetEvictionUnblocked`): never where it runs, so never after a return;
- Kueue's record is repaired when Kueue adopted a returning member's copy but cannot record it (`record_to_repair`,
  a server-side apply of the Workload's status as Kueue's own field manager, Event `FleetRecordRepaired`).
And one in the members: a copy and its run that an older step of the fleet's ladder left in a member cut off while
the ladder moved the job on are deleted once the member answers again (`stale_step_copies`, Event
`FleetStaleStepRemoved`): Kueue no longer looks there, and they would run next to the run Kueue records.

    python -m failover.fleet     # FLEET_MEMBERS, FLEET_ORIGIN, FLEET_WATCH_SECONDS (the period: kubeconfigs re-read,
                                 # members asked for an answer), FLEET_RESYNC_SECONDS (every job again, default 300),
                                 # FLEET_SECRETS_NAMESPACE, FLEET_METRICS_PORT (Prometheus /metrics, default 9090;
                                 # 0 turns it off)
"""

from __future__ import annotations

import base64
import copy as copy_module
import dataclasses
import datetime
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from failover.controller import rayjob_event
from failover.decisions import MULTIKUEUE_ORIGIN_LABEL, WorkloadView, format_time
from failover.informer import METADATA_ONLY_LIST, Informer, RawClient, Watched, release
from failover.metrics import FleetMetrics
from failover.workqueue import WorkQueue

log = logging.getLogger("tpu-fallback.fleet")

FLEET_ANNOTATION = "tpu-fallback/fleet"
COMPONENT = "tpu-fallback-fleet-watch"
KUEUE = ("kueue.x-k8s.io", "v1beta2")
RAY = ("ray.io", "v1")
REQUEST_TIMEOUT_SECONDS = 5  # a probe not answered in this long is missed
MISSES_BEFORE_LOST = 2  # a member that answered is lost after this many missed probes in a row, not one: measured
# on a loaded tier, an API server just resumed after a partition may miss one probe, and a finding that flips for
# one period (MemberLost, then back) is two Warnings that say nothing true
WATCH_SECONDS = 10.0  # the period: kubeconfigs re-read, members asked for an answer
RESYNC_SECONDS = 300.0  # every job evaluated again, the safety net for anything a watch missed
SETTLE_SECONDS = 1.0  # a warning is published once it has held this long
REPAIR_SETTLE_SECONDS = 2.0  # a record to repair must stay so this long (Kueue records ordinary admissions itself)
REPAIR_RETRY_SECONDS = 5.0  # a repair Kueue did not take is applied again after this long
Key = tuple[str, str]  # (namespace, name)
RUNNING, RECORD_STALE, RUNNING_TWICE, MEMBER_LOST = "Running", "RecordStale", "RunningTwice", "MemberLost"
MEMBER_CANNOT_ADMIT = "MemberCannotAdmit"
WAITING = "Waiting"  # runs nowhere, no member refuses it: published only over an earlier finding
FINISHED = "Finished"  # the manager's Workload finished: published only over an earlier finding
WARNINGS = frozenset({RECORD_STALE, RUNNING_TWICE, MEMBER_LOST, MEMBER_CANNOT_ADMIT})
STATES = (RUNNING, RECORD_STALE, RUNNING_TWICE, MEMBER_LOST, MEMBER_CANNOT_ADMIT, WAITING, FINISHED)
EVICTION_UNBLOCKED = "FleetEvictionUnblocked"
RECORD_REPAIRED = "FleetRecordRepaired"
STALE_STEP_REMOVED = "FleetStaleStepRemoved"  # a copy an older step of the fleet's ladder left in a member, deleted
DEACTIVATION_TARGET = "DeactivationTarget"  # the manager asks a member to deactivate its copy (MultiKueue 6b)
KUEUE_ADMISSION = "kueue-admission"  # Kueue's field manager for a Workload's admission status
APPLY_PATCH = "application/apply-patch+yaml"
WATCHED_MANAGER_WORKLOADS = Watched("workloads", "/apis/kueue.x-k8s.io/v1beta2/workloads")
WATCHED_MANAGER_RAYJOBS = Watched("rayjobs", "/apis/ray.io/v1/rayjobs")
WATCHED_CLUSTERS = Watched("multikueueclusters", "/apis/kueue.x-k8s.io/v1beta2/multikueueclusters")
WATCHED_MEMBER_WORKLOADS = Watched("member-workloads", "/apis/kueue.x-k8s.io/v1beta2/workloads")  # + origin label
WATCHED_MEMBER_RAYJOBS = Watched("member-rayjobs", "/apis/ray.io/v1/rayjobs")
INADMISSIBLE = "Inadmissible"  # Kueue's QuotaReserved=False reason for a Workload its queues cannot take
# KubeRay's "not running" states: Kueue's RayJob.IsActive() is false only in these (rayjob_controller.go L107-110).
INACTIVE = frozenset({"Suspended", "New"})


@dataclass(frozen=True)
class Finding:
    """Where one job runs, as the members show it, against Kueue's record."""

    state: str
    runs_in: tuple[str, ...]  # members that have the job's RayJob
    record: str | None  # the manager Workload's status.clusterName
    unreachable: tuple[str, ...] = ()
    blocked: tuple[tuple[str, str], ...] = ()  # (member, Kueue's reason there) where its copy is inadmissible
    rungs: tuple[tuple[str, str], ...] = ()  # (member, the flavor its copy holds quota on) where it runs

    def message(self) -> str:
        where = " and ".join(self.runs_in)
        if self.state == RUNNING:
            lost = f"; {' and '.join(self.unreachable)} does not answer (a run there may go on)" if self.unreachable else ""
            return f"runs in {where}{lost}"
        if self.state == FINISHED:
            return f"finished (Kueue's record: {self.record or 'no member'})"
        if self.state == RECORD_STALE:
            recorded = f"still names {self.record}" if self.record else "names no member"
            return (f"runs in {where}; Kueue's record {recorded}: MultiKueue kept the older admission in {where} "
                    "when it came back and cannot record it (Kueue 0.19.2)")
        if self.state == WAITING:
            return "runs nowhere now: every member's copy waits for a slice"
        if self.state == MEMBER_CANNOT_ADMIT:
            return "; ".join(f"{member} cannot admit it: {why} (run `pulumi up` on its stack)"
                             for member, why in self.blocked) + "; the other members still may"
        if self.state == RUNNING_TWICE:
            return (f"runs in {where} at once (a member was cut off and the job was dispatched again); each run "
                    "checkpoints under its own run id, and MultiKueue keeps one when the member is back")
        lost = " and ".join(self.unreachable)
        where = f"{lost}, where Kueue admitted it," if self.record in self.unreachable else lost
        return (f"{where} does not answer; a run there may go on meanwhile, and the manager dispatches the job "
                "again after workerLostTimeout")

    def annotation(self, since: str) -> str:
        found = {"state": self.state, "runsIn": list(self.runs_in), "kueueRecord": self.record,
                 "unreachable": list(self.unreachable), "blocked": dict(self.blocked), "since": since}
        if self.rungs:  # only where it runs: an annotation without it reads as before
            found["rungs"] = dict(self.rungs)
        return json.dumps(found, sort_keys=True)


def assess(record: str | None, running: Mapping[str, bool], unreachable: frozenset[str],
           blocked: Mapping[str, str] | None = None, finished: bool = False,
           flavors: Mapping[str, str] | None = None) -> Finding:
    """The finding for one job: `running` says, per reachable member, whether it has the job's RayJob; `blocked`,
    the members whose copy Kueue finds inadmissible, and why; `flavors`, the rung its copy holds in each member."""
    runs_in = tuple(sorted(member for member, has in running.items() if has))
    lost = tuple(sorted(unreachable))
    finding = _assess(record, runs_in, lost, blocked, finished)
    rungs = tuple((member, (flavors or {})[member]) for member in finding.runs_in if member in (flavors or {}))
    return dataclasses.replace(finding, rungs=rungs) if rungs else finding


def _assess(record: str | None, runs_in: tuple[str, ...], lost: tuple[str, ...], blocked: Mapping[str, str] | None,
            finished: bool) -> Finding:
    if finished:
        return Finding(FINISHED, (), record, lost)
    if not runs_in and blocked:
        return Finding(MEMBER_CANNOT_ADMIT, (), record, lost, tuple(sorted(blocked.items())))
    if len(runs_in) > 1:
        return Finding(RUNNING_TWICE, runs_in, record, lost)
    if runs_in and runs_in != (record,):
        # Elsewhere than recorded, or with no record at all: measured both after a member's return (README "Plan C").
        return Finding(RECORD_STALE, runs_in, record, lost)
    if record is not None and record in lost:
        return Finding(MEMBER_LOST, runs_in, record, lost)
    if runs_in:
        return Finding(RUNNING, runs_in, record, lost)
    if lost:  # runs nowhere that answers: it may still run where nothing answers
        return Finding(MEMBER_LOST, runs_in, record, lost)
    return Finding(WAITING, (), record, lost)


def eviction_stuck(workload: Mapping, rayjob: Mapping) -> bool:
    """Kueue evicted the manager's Workload and suspended its RayJob, and now waits for the job to stop
    (RayJob.IsActive() false), which the manager's RayJob can never show: its status is a copy of the member's
    (MultiKueue's copyJobStatus), and the manager's KubeRay leaves a job managed by MultiKueue alone. Measured:
    after "Admitting remote lost", the Workload stayed Evicted with its quota reserved and no member recorded,
    while a copy ran in the other member."""
    conditions = {c["type"]: c.get("status") for c in (workload.get("status") or {}).get("conditions") or []}
    deployment = (rayjob.get("status") or {}).get("jobDeploymentStatus") or "New"
    return (conditions.get("Evicted") == "True" and conditions.get("QuotaReserved") == "True"
            and bool((rayjob.get("spec") or {}).get("suspend")) and deployment not in INACTIVE)


def changed(previous: str | None, finding: Finding) -> bool:
    """Whether the RayJob's annotation says something else (the time it was first seen aside)."""
    try:
        before = json.loads(previous) if previous else {}
    except ValueError:
        before = {}
    return (before.get("state"), before.get("runsIn"), before.get("kueueRecord"), before.get("blocked") or {}) != (
        finding.state, list(finding.runs_in), finding.record, dict(finding.blocked))


def still_answers(answered_before: bool, missed: int) -> bool:
    """Whether a member answers after a probe, given whether it did before and the probes it missed in a row since
    (0: this one was answered): one that never answered must answer first; one that did is lost only after
    `MISSES_BEFORE_LOST` misses."""
    return missed == 0 or (answered_before and missed < MISSES_BEFORE_LOST)


def _true(obj: Mapping | None, kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True"
               for c in ((obj or {}).get("status") or {}).get("conditions") or [])


def live(copy: Mapping | None, rayjob: Mapping | None) -> bool:
    """Whether the job runs, or is about to, in a member: its RayJob there is not suspended (the member's Kueue
    unsuspends it once the copy is admitted there), or its copy there is admitted and neither evicted nor marked for
    deactivation by the manager. The RayJob MultiKueue makes for an evicted copy stays suspended: no run."""
    if rayjob is not None and not (rayjob.get("spec") or {}).get("suspend"):
        return True
    return (copy is not None and _true(copy, "Admitted") and not _true(copy, "Evicted")
            and not _true(copy, DEACTIVATION_TARGET) and (copy.get("spec") or {}).get("active") is not False)


def may_unblock(workload: Mapping, rayjob: Mapping, live_in: Iterable[str]) -> bool:
    """Mark the manager's RayJob Suspended only where Kueue's eviction waits for it (`eviction_stuck`) and no member
    that answers runs the job, nor has it admitted. Measured on Kueue 0.19.2 (README "Plan C"): the mark finishes the
    eviction, and a finished eviction deletes every copy and run in the members Kueue reaches; so never while the
    job runs in one (the member that took over, or the lost member once it answers again: after the return)."""
    return eviction_stuck(workload, rayjob) and not any(True for _ in live_in)


def lost_admission(workload: Mapping, rayjob: Mapping, connected: Mapping[str, bool],
                   answering: Iterable[str]) -> str | None:
    """The member where Kueue admitted the job, once Kueue has lost it (its MultiKueueCluster not Active) and the
    watch cannot reach it either, while the manager's RayJob still shows that member's last status, a run. Kueue
    will evict the job after workerLostTimeout and wait for that status to stop, which it never will (`eviction_stuck`);
    meanwhile it dispatches the job again, and a member that provisions then has its copy deactivated and its slice
    request deleted (multikueue-ladder.md §8.5). Marked Suspended beforehand, the eviction finishes at once (Kueue
    reads the RayJob's status only to finish an eviction: jobframework reconciler step 6)."""
    record = (workload.get("status") or {}).get("clusterName")
    deployment = (rayjob.get("status") or {}).get("jobDeploymentStatus") or "New"
    if (not record or not _true(workload, "Admitted") or _true(workload, "Evicted") or _true(workload, "Finished")
            or connected.get(record) is not False or record in set(answering) or deployment in INACTIVE):
        return None
    return record


def record_to_repair(workload: Mapping, admitted_in: Iterable[str], connected: Iterable[str]) -> str | None:
    """The member whose admission Kueue cannot record, if any: the manager's Workload holds quota, is neither evicted
    nor admitted nor finished, records no member, and its MultiKueue check waits (Pending) while exactly one member
    has the copy admitted, a member Kueue is connected to again but did not nominate. Kueue adopted that member's
    copy on its return, and its webhook refuses `clusterName` outside `nominatedClusterNames` (multikueue-ladder.md
    §5(b), §8.5): it stays so for good unless the nomination names the member (`repaired_status`)."""
    status = workload.get("status") or {}
    if (not _true(workload, "QuotaReserved") or any(_true(workload, kind) for kind in ("Evicted", "Admitted", "Finished"))
            or status.get("clusterName")):
        return None
    checks = status.get("admissionChecks") or []
    if not checks or any(check.get("state") != "Pending" for check in checks):
        return None
    members = sorted(set(admitted_in))
    if len(members) != 1 or members[0] in (status.get("nominatedClusterNames") or []) \
            or members[0] not in set(connected):
        return None
    return members[0]


def admitted_at_current_step(workload: Mapping, copies: Mapping[str, Mapping | None]) -> list[str]:
    """The members where the job's copy of its current step (the manager Workload's queue name) is admitted. A copy
    of an older step of the fleet's ladder is not one: a member cut off in the middle of a move still shows it (its
    last state, while the manager's Workload waits at the next step), and naming that member in Kueue's record would
    dispatch the job back to the step it left (seen on the tier before this rule)."""
    queue = (workload.get("spec") or {}).get("queueName")
    return [member for member, found in copies.items()
            if live(found, None) and (found.get("spec") or {}).get("queueName") == queue]


def stale_step_copies(workload: Mapping, copies: Mapping[str, Mapping | None],
                      rayjobs: Mapping[str, Mapping | None]) -> list[str]:
    """The members holding a copy of the job from an older step of the fleet's ladder (README "The fleet's ladder"):
    its `spec.queueName` is not the manager Workload's, while the job is admitted in, and runs in, another member
    that answers. Only a partition leaves one: the ladder moved the job on while the member was cut off, so
    MultiKueue could not delete the copy, and once the member answers again Kueue 0.19.2 no longer looks there (the
    job's check names only the new step's members) and its GC keeps copies whose manager Workload exists
    (multikueuecluster.go runGC): the run there would go on next to the one Kueue records. A member of the job's
    current step never holds one (MultiKueue re-creates a copy whose spec differs), and a DWS-only fleet has one
    queue name: nothing there is ever stale."""
    record = (workload.get("status") or {}).get("clusterName")
    queue = (workload.get("spec") or {}).get("queueName")
    if (not record or not queue or not _true(workload, "Admitted")
            or any(_true(workload, kind) for kind in ("Evicted", "Finished"))
            or record not in copies or not live(copies.get(record), rayjobs.get(record))):
        return []
    return sorted(member for member, found in copies.items() if found is not None and member != record
                  and (found.get("spec") or {}).get("queueName") not in (None, queue))


def repaired_status(workload: Mapping, member: str) -> dict:
    """The Workload's whole current status with `member` added to `nominatedClusterNames`: applied (server-side,
    forced) as Kueue's own field manager, Kueue's next reconcile records `clusterName: member` (measured 0.2-0.5 s,
    multikueue-ladder.md §8.6). A merge patch of the list alone is refused by CEL once Kueue writes again."""
    status = copy_module.deepcopy(dict(workload.get("status") or {}))
    status["nominatedClusterNames"] = sorted(set(status.get("nominatedClusterNames") or []) | {member})
    return status


def _owner_rayjob(workload: Mapping) -> str | None:
    return next((o["name"] for o in workload["metadata"].get("ownerReferences") or [] if o.get("kind") == "RayJob"),
                None)


def _key(obj: Mapping) -> Key:
    return obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


class _Member:
    """One member as the watch sees it: this manager's copies and RayJobs there (informers through the kubeconfig
    MultiKueue uses), and whether it answers. A new kubeconfig, or an answer after none, starts a new generation of
    informers; events from an older one are dropped."""

    def __init__(self, name: str):
        self.name = name
        self.api: client.ApiClient | None = None
        self.generation = 0
        self.informers: list[Informer] = []
        self.copies: dict[Key, dict] = {}  # (namespace, Workload name) -> the copy
        self.rayjobs: dict[Key, dict] = {}  # (namespace, RayJob name) -> the member's RayJob
        self.answers = False  # it answers (`still_answers`)
        self.missed = 0  # probes missed in a row
        self.probe_failed_at: float | None = None  # when it stopped answering
        self.primed = False  # its informers listed since it last did not answer (a new kubeconfig keeps this)

    def synced(self) -> bool:
        return bool(self.informers) and all(informer.synced.is_set() for informer in self.informers)

    def stop(self) -> None:
        for informer in self.informers:
            informer.stop()
        self.informers = []


class FleetWatch:
    """Event-driven: informers on the manager's Workloads, RayJobs and MultiKueueClusters and, in each member, on the
    copies and RayJobs this manager made; every change queues the jobs it touches, and one worker decides for each
    (`evaluate`). `members` gives a client per member name (None: no usable kubeconfig); `tick()`, every period,
    re-reads it (a changed kubeconfig rebuilds that member's informers), asks each member for an answer, and queues
    every job again every `resync_seconds`."""

    def __init__(self, manager: client.ApiClient, members: Callable[[], Mapping[str, client.ApiClient | None]],
                 origin: str, clock: Callable[[], datetime.datetime] | None = None,
                 metrics: FleetMetrics | None = None, resync_seconds: float = RESYNC_SECONDS,
                 settle_seconds: float = SETTLE_SECONDS):
        self.manager_api = manager
        self.custom = client.CustomObjectsApi(manager)
        self.core = client.CoreV1Api(manager)
        self.raw = RawClient(manager)
        self.metrics = metrics
        self.members, self.origin = members, origin
        self.member_custom: Callable[[client.ApiClient], client.CustomObjectsApi] = client.CustomObjectsApi
        self.clock = clock or (lambda: datetime.datetime.now(datetime.timezone.utc))
        self.resync_seconds, self.settle_seconds = resync_seconds, settle_seconds
        self.queue = WorkQueue()
        self._lock = threading.RLock()
        self._workloads: dict[Key, dict] = {}  # manager Workloads by (namespace, name)
        self._rayjobs: dict[Key, dict] = {}  # manager RayJobs by (namespace, name)
        self._job_of: dict[Key, Key] = {}  # (namespace, Workload) -> (namespace, RayJob)
        self._workload_of: dict[Key, Key] = {}  # (namespace, RayJob) -> (namespace, Workload)
        self._connected: dict[str, bool] = {}  # Kueue's MultiKueueCluster Active, per member
        self._members: dict[str, _Member] = {}
        self._manager_informers: list[Informer] = []
        # A warning is published only once it has held for `settle_seconds`: Kueue records a dispatch and creates
        # the RayJob in one reconcile, but as two writes, and an evaluation between the two must not cry RecordStale.
        self._first_seen: dict[Key, tuple[Finding, float]] = {}
        self._repair_seen: dict[Key, tuple[str, float]] = {}  # the member to record, since when
        self._repaired_at: dict[Key, float] = {}
        self.findings: dict[Key, Finding] = {}
        self._next_resync = 0.0
        self._stopping = threading.Event()
        self._worker: threading.Thread | None = None

    # ---- informers ---------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the manager's informers and the worker; members start with the first `tick()`."""
        self._manager_informers = [
            Informer(self.raw, WATCHED_MANAGER_WORKLOADS, self._workloads_listed, self._workload_changed),
            Informer(self.raw, WATCHED_MANAGER_RAYJOBS, self._rayjobs_listed, self._rayjob_changed),
            Informer(self.raw, WATCHED_CLUSTERS, self._clusters_listed, self._cluster_changed)]
        for informer in self._manager_informers:
            informer.start()
        self._worker = threading.Thread(target=self._work, name="fleet-worker", daemon=True)
        self._worker.start()

    def stop(self) -> None:
        self._stopping.set()
        self.queue.close()
        for informer in self._manager_informers:
            informer.stop()
        for member in self._members.values():
            member.stop()

    def synced(self) -> bool:
        return all(informer.synced.is_set() for informer in self._manager_informers)

    def _workloads_listed(self, items: list[dict]) -> None:
        with self._lock:
            self._workloads.clear()
            self._job_of.clear()
            self._workload_of.clear()
        for item in items:
            self._workload_changed("ADDED", item)

    def _workload_changed(self, event_type: str, obj: dict) -> None:
        key, job = _key(obj), _owner_rayjob(obj)
        with self._lock:
            if event_type == "DELETED":
                self._workloads.pop(key, None)
                job = self._job_of.pop(key, None)
                if job is not None and self._workload_of.get(job) == key:
                    self._workload_of.pop(job, None)
            elif job is not None:
                job = (key[0], job)
                self._workloads[key] = obj
                self._job_of[key], self._workload_of[job] = job, key
        if job is not None:
            self.queue.add(job)

    def _rayjobs_listed(self, items: list[dict]) -> None:
        with self._lock:
            self._rayjobs.clear()
        for item in items:
            self._rayjob_changed("ADDED", item)

    def _rayjob_changed(self, event_type: str, obj: dict) -> None:
        key = _key(obj)
        with self._lock:
            if event_type == "DELETED":
                self._rayjobs.pop(key, None)
            else:
                self._rayjobs[key] = obj
        self.queue.add(key)

    def _clusters_listed(self, items: list[dict]) -> None:
        with self._lock:
            self._connected.clear()
        for item in items:
            self._cluster_changed("ADDED", item)

    def _cluster_changed(self, event_type: str, obj: dict) -> None:
        name = obj["metadata"]["name"]
        with self._lock:
            before = self._connected.get(name)
            if event_type == "DELETED":
                self._connected.pop(name, None)
            else:
                self._connected[name] = _true(obj, "Active")
            now = self._connected.get(name)
        if before != now:
            self._queue_all()

    def _member_handlers(self, member: _Member, generation: int):
        """The (listed, changed) callbacks of a member's informers, for its Workload copies (a change queues the
        manager's job the copy belongs to) and its RayJobs (named as the manager's); a superseded informer's are
        dropped."""
        def handlers(held: str, job_of: Callable[[Key], Key | None]):
            def listed(items: list[dict]) -> None:
                with self._lock:
                    if member.generation != generation:
                        return
                    setattr(member, held, {_key(item): item for item in items})
                self._queue_all()

            def changed(event_type: str, obj: dict) -> None:
                key = _key(obj)
                with self._lock:
                    if member.generation != generation:
                        return
                    if event_type == "DELETED":
                        getattr(member, held).pop(key, None)
                    else:
                        getattr(member, held)[key] = obj
                    job = job_of(key)
                if job is not None:
                    self.queue.add(job)

            return listed, changed

        return (*handlers("copies", lambda key: self._job_of.get(key)), *handlers("rayjobs", lambda key: key))

    def _restart_member(self, member: _Member, stale: bool = True) -> None:
        """New informers for a member (its first, a new kubeconfig, or an answer after none): a fresh list. After a
        new kubeconfig alone (`stale` False: a renewed token) what it holds stays until the new list replaces it, and
        the member still answers meanwhile."""
        member.stop()
        with self._lock:
            member.generation += 1
            if stale:
                member.copies, member.rayjobs, member.primed = {}, {}, False
        if member.api is None:
            return
        copies_listed, copy_changed, rayjobs_listed, rayjob_changed = self._member_handlers(member, member.generation)
        selector = f"{MULTIKUEUE_ORIGIN_LABEL}={self.origin}"
        raw = RawClient(member.api)
        member.informers = [
            Informer(raw, dataclasses.replace(WATCHED_MEMBER_WORKLOADS, label_selector=selector), copies_listed,
                     copy_changed),
            Informer(raw, dataclasses.replace(WATCHED_MEMBER_RAYJOBS, label_selector=selector), rayjobs_listed,
                     rayjob_changed)]
        for informer in member.informers:
            informer.name = f"{informer.name}-{member.name}"
            informer.start()

    # ---- the period: kubeconfigs, answers, resync --------------------------------------------------------------
    def tick(self) -> None:
        """Re-read the members' kubeconfigs, ask each member for an answer (in parallel, `REQUEST_TIMEOUT_SECONDS`
        each), and queue every job again when the resync is due. A member answers when it answered this probe and
        its informers have listed since it last did not."""
        clients = self.members()
        for name, api in clients.items():
            with self._lock:
                member = self._members.setdefault(name, _Member(name))
            if api is not member.api:
                member.api = api
                self._restart_member(member, stale=member.api is None or not member.primed)
        with self._lock:
            gone = [self._members.pop(name) for name in set(self._members) - set(clients)]
            members = list(self._members.values())
        for member in gone:
            member.stop()
        threads = [threading.Thread(target=self._probe, args=(member,), daemon=True) for member in members]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(REQUEST_TIMEOUT_SECONDS + 5)
        if self.metrics is not None:  # every period, jobs or none: the "member does not answer" alert reads it
            with self._lock:
                answered = self._answered()
            self.metrics.record_members(answered)
        if time.monotonic() >= self._next_resync:
            self._next_resync = time.monotonic() + self.resync_seconds
            self._queue_all()

    def _probe(self, member: _Member) -> None:
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
            self._restart_member(member)  # back: what its informers hold may be stale
        member.answers = answers
        member.probe_failed_at = None if answers else member.probe_failed_at or time.monotonic()
        if answers != before:
            self._queue_all()

    def _queue_all(self) -> None:
        with self._lock:
            keys = set(self._workload_of) | set(self._rayjobs)
        for key in keys:
            self.queue.add(key)

    # ---- the worker --------------------------------------------------------------------------------------------
    def _work(self) -> None:
        while not self._stopping.is_set():
            key = self.queue.get(timeout=1.0)
            if key is None:
                continue
            started = time.monotonic()
            try:
                self.evaluate(key)
            except ApiException as error:
                if error.status in (404, 409):  # gone, or written meanwhile: the watch brings the news
                    self.queue.add(key, delay=0.2)
                else:
                    log.warning("%s/%s: %s; queued again", *key, str(error).splitlines()[0][:300])
                    self._failed()
                    self.queue.add(key, delay=2.0)
            except Exception:  # noqa: BLE001 - one bad object must not end the worker
                log.exception("%s/%s: evaluation failed; queued again", *key)
                self._failed()
                self.queue.add(key, delay=5.0)
            finally:
                self.queue.done(key)
            if self.metrics is not None and not len(self.queue):
                self._record(time.monotonic() - started)  # the findings as they stand once nothing waits

    def _failed(self) -> None:
        if self.metrics is not None:
            self.metrics.pass_failures.inc()

    def _record(self, seconds: float) -> None:
        with self._lock:
            states = [f.state for f in self.findings.values()]
            answered = self._answered()
        self.metrics.record_pass(states, answered, seconds)

    def _answered(self) -> dict[str, bool]:
        """Whether each member answers (the caller holds the lock)."""
        return {name: self._answers(member) for name, member in self._members.items()}

    @staticmethod
    def _answers(member: _Member) -> bool:
        """It answered the last probe, and its informers have listed since it last did not."""
        if member.api is not None and member.answers and member.synced():
            member.primed = True
        return member.api is not None and member.answers and member.primed

    def evaluate(self, key: Key) -> Finding | None:
        """Decide for one job from the caches: mark its eviction finished (`may_unblock`), repair Kueue's record
        (`record_to_repair`), and say where it runs (annotation and Event); the finding, None if no such job."""
        with self._lock:
            workload_key = self._workload_of.get(key)
            workload = self._workloads.get(workload_key) if workload_key else None
            rayjob = self._rayjobs.get(key)
            answering = {name: m for name, m in self._members.items() if self._answers(m)}
            unreachable = frozenset(set(self._members) - set(answering))
            copies = {name: m.copies.get(workload_key) for name, m in answering.items()} if workload_key else {}
            jobs = {name: m.rayjobs.get(key) for name, m in answering.items()}
            connected_map = dict(self._connected)
            connected = {name for name, active in connected_map.items() if active}
        if workload is None:
            with self._lock:
                self.findings.pop(key, None)
                self._first_seen.pop(key, None)
                self._repair_seen.pop(key, None)
                self._repaired_at.pop(key, None)
            return None
        lost = lost_admission(workload, rayjob, connected_map, answering) if rayjob is not None else None
        if lost is not None:
            self._mark_suspended(rayjob, (
                f"Kueue lost {lost}, where it admitted the job, and will evict it after workerLostTimeout, then wait "
                "for a stop the manager's copy of its status never shows (MultiKueue jobs are left alone by the "
                "manager's KubeRay): marked Suspended now, so the eviction releases the quota at once and the job's "
                f"dispatch to the other members is not undone; the run in {lost} may go on until Kueue reaches it "
                "again"))
        elif rayjob is not None and eviction_stuck(workload, rayjob):
            live_in = sorted(name for name in answering if live(copies.get(name), jobs.get(name)))
            if may_unblock(workload, rayjob, live_in):
                lost = f"; a run may go on in {', '.join(sorted(unreachable))}, which does not answer" \
                    if unreachable else ""
                self._mark_suspended(rayjob, (
                    "Kueue evicted the job and waits for it to stop, which the manager's copy of its status never "
                    "shows (MultiKueue jobs are left alone by the manager's KubeRay), and no member that answers runs "
                    f"it: marked Suspended, so Kueue releases its quota and dispatches it again{lost}"))
            else:
                log.info("%s/%s: Kueue's eviction waits, and the job runs in %s: left to Kueue", *key,
                         " and ".join(live_in))
        self._repair(key, workload, copies, connected)
        stale = stale_step_copies(workload, copies, jobs)
        if stale:
            self._remove_stale(key, workload, stale, copies, jobs)
            for name in stale:  # gone (or going): not a run the finding counts
                copies[name], jobs[name] = None, None
        blocked, flavors = {}, {}
        for name, found in copies.items():
            if found is None:
                continue
            reserved = next((c for c in (found.get("status") or {}).get("conditions") or []
                             if c["type"] == "QuotaReserved"), {})
            if reserved.get("status") == "False" and reserved.get("reason") == INADMISSIBLE:
                blocked[name] = reserved.get("message", "")
            flavor = WorkloadView.from_object(found).flavor  # while it holds quota there
            if flavor:
                flavors[name] = flavor
        record = (workload.get("status") or {}).get("clusterName")
        finding = assess(record, {name: job is not None for name, job in jobs.items()}, unreachable, blocked,
                         _true(workload, "Finished"), flavors)
        now = time.monotonic()
        with self._lock:
            self.findings[key] = finding
            first = self._first_seen.get(key)
            if first is None or first[0] != finding:
                first = self._first_seen[key] = (finding, now)
        if rayjob is None:
            return finding
        noted = FLEET_ANNOTATION in (rayjob["metadata"].get("annotations") or {})
        if finding.state in (WAITING, FINISHED) and not noted:
            return finding  # nothing said about it before: nothing to correct
        if finding.state in WARNINGS and now - first[1] < self.settle_seconds:
            self.queue.add(key, delay=first[1] + self.settle_seconds - now + 0.01)
            return finding
        self._publish(rayjob, finding)
        return finding

    # ---- the writes --------------------------------------------------------------------------------------------
    def _mark_suspended(self, rayjob: Mapping, message: str) -> None:
        """Say on the manager's RayJob what KubeRay would say of a suspended job it managed: Suspended; Kueue's
        eviction then finishes (`lost_admission`, `may_unblock`)."""
        meta = rayjob["metadata"]
        self.custom.patch_namespaced_custom_object_status(*RAY, meta["namespace"], "rayjobs", meta["name"], {
            "status": {"jobDeploymentStatus": "Suspended"}, "metadata": {"resourceVersion": meta["resourceVersion"]}})
        log.info("%s/%s: %s", meta["namespace"], meta["name"], message)
        self._event(rayjob, EVICTION_UNBLOCKED, message, "Warning")

    def _repair(self, key: Key, workload: Mapping, copies: Mapping[str, dict | None], connected: set[str]) -> None:
        admitted_in = admitted_at_current_step(workload, copies)
        member = record_to_repair(workload, admitted_in, connected)
        now = time.monotonic()
        with self._lock:
            if member is None:
                self._repair_seen.pop(key, None)
                return
            seen = self._repair_seen.get(key)
            if seen is None or seen[0] != member:
                seen = self._repair_seen[key] = (member, now)
            due = max(seen[1] + REPAIR_SETTLE_SECONDS, self._repaired_at.get(key, -1e9) + REPAIR_RETRY_SECONDS)
        if now < due:  # Kueue records an ordinary admission itself, within a reconcile; a repair takes 0.2-0.5 s
            self.queue.add(key, delay=due - now + 0.01)
            return
        meta = workload["metadata"]
        body = {"apiVersion": "/".join(KUEUE), "kind": "Workload", "metadata": {
            "name": meta["name"], "namespace": meta["namespace"], "resourceVersion": meta["resourceVersion"]},
            "status": repaired_status(workload, member)}
        release(self.raw.request(
            "PATCH", f"/apis/{'/'.join(KUEUE)}/namespaces/{meta['namespace']}/workloads/{meta['name']}/status",
            body=json.dumps(body), serialize=False, content_type=APPLY_PATCH,
            query_params=[("fieldManager", KUEUE_ADMISSION), ("force", "true")]))
        with self._lock:
            self._repaired_at[key] = now
        self.queue.add(key, delay=REPAIR_RETRY_SECONDS + 0.01)  # recorded by then, or tried again
        rayjob = self._rayjobs.get(key)
        message = (f"runs in {member}, whose copy Kueue adopted when it answered again but cannot record (it was not "
                   f"nominated): named it in the Workload's nominatedClusterNames, so Kueue records {member}")
        log.info("%s/%s: %s", *key, message)
        if rayjob is not None:
            self._event(rayjob, RECORD_REPAIRED, message, "Normal")

    def _remove_stale(self, key: Key, workload: Mapping, members: Iterable[str], copies: Mapping[str, dict | None],
                      jobs: Mapping[str, dict | None]) -> None:
        """Delete, as MultiKueue's GC would, the RayJob (its pods with it) and the copy an older step left in each
        member (`stale_step_copies`), with the member's kubeconfig MultiKueue uses; one Event per member."""
        record = (workload.get("status") or {}).get("clusterName")
        for member in members:
            with self._lock:
                found = self._members.get(member)
            if found is None or found.api is None:
                continue
            copy, run = copies.get(member) or {}, jobs.get(member)
            if copy["metadata"].get("deletionTimestamp"):
                continue  # being deleted already (Kueue's finalizer): once is enough
            custom = self.member_custom(found.api)
            try:
                if run is not None:
                    custom.delete_namespaced_custom_object(*RAY, key[0], "rayjobs", key[1],
                                                           propagation_policy="Background",
                                                           _request_timeout=REQUEST_TIMEOUT_SECONDS)
                custom.delete_namespaced_custom_object(*KUEUE, key[0], "workloads", copy["metadata"]["name"],
                                                       propagation_policy="Background",
                                                       _request_timeout=REQUEST_TIMEOUT_SECONDS)
            except ApiException as error:
                if error.status != 404:
                    raise
                continue  # gone already: someone else removed it, no Event
            message = (f"deleted the run and the copy in {member} left by an older step of the ladder "
                       f"({(copy.get('spec') or {}).get('queueName')}): the job was moved on while {member} was cut "
                       f"off, and it runs in {record} at step {(workload.get('spec') or {}).get('queueName')}, where "
                       "Kueue admitted it (Kueue 0.19.2 no longer looks at a member outside the job's step)")
            log.info("%s/%s: %s", *key, message)
            rayjob = self._rayjobs.get(key)
            if rayjob is not None:
                self._event(rayjob, STALE_STEP_REMOVED, message, "Warning")

    def _event(self, rayjob: Mapping, reason: str, message: str, kind: str) -> None:
        rayjob_event(self.core, rayjob["metadata"], COMPONENT, reason, message, kind, self.clock())

    def _publish(self, rayjob: Mapping, finding: Finding) -> None:
        meta = rayjob["metadata"]
        previous = (meta.get("annotations") or {}).get(FLEET_ANNOTATION)
        if not changed(previous, finding):
            return
        self.custom.patch_namespaced_custom_object(*RAY, meta["namespace"], "rayjobs", meta["name"], {"metadata": {
            "annotations": {FLEET_ANNOTATION: finding.annotation(format_time(self.clock()))},
            "resourceVersion": meta["resourceVersion"]}})
        log.info("%s/%s: %s", meta["namespace"], meta["name"], finding.message())
        self._event(rayjob, f"Fleet{finding.state}", finding.message(),
                    "Warning" if finding.state in WARNINGS else "Normal")


def member_clients(core: client.CoreV1Api, secrets: Mapping[str, str],
                   namespace: str) -> Callable[[], dict[str, client.ApiClient | None]]:
    """A client per member from the kubeconfig Secrets MultiKueue reads (key `kubeconfig`), re-read each pass
    so a rotated token is picked up; None for a member whose Secret cannot be read."""
    built: dict[str, tuple[str, client.ApiClient]] = {}  # member -> (kubeconfig text, its client)

    def load() -> dict[str, client.ApiClient | None]:
        clients: dict[str, client.ApiClient | None] = {}
        for member, secret in secrets.items():
            try:
                data = core.read_namespaced_secret(secret, namespace).data or {}
                text = base64.b64decode(data["kubeconfig"]).decode()
                if member not in built or built[member][0] != text:  # a client per kubeconfig, not per pass
                    configuration = client.Configuration()
                    config.load_kube_config_from_dict(yaml.safe_load(text), client_configuration=configuration)
                    configuration.retries = 0  # a member that does not answer is unreachable for this pass
                    built[member] = (text, client.ApiClient(configuration))
                clients[member] = built[member][1]
            except (ApiException, KeyError, ValueError, config.ConfigException) as error:
                log.warning("member %s: no usable kubeconfig in %s/%s: %s", member, namespace, secret, error)
                clients[member] = None
        return clients
    return load


def main() -> int:
    from failover.cluster_client import api_client  # the same credentials rule as the failover controller

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    manager = api_client()
    secrets = json.loads(os.environ["FLEET_MEMBERS"])  # {member: kubeconfig Secret name}
    namespace = os.environ.get("FLEET_SECRETS_NAMESPACE", "kueue-system")
    period = float(os.environ.get("FLEET_WATCH_SECONDS", str(WATCH_SECONDS)))
    metrics = FleetMetrics(STATES)
    metrics_port = int(os.environ.get("FLEET_METRICS_PORT", "9090"))
    if metrics_port:
        metrics.serve(metrics_port)
    watch = FleetWatch(manager, member_clients(client.CoreV1Api(manager), secrets, namespace),
                       os.environ["FLEET_ORIGIN"], metrics=metrics,
                       resync_seconds=float(os.environ.get("FLEET_RESYNC_SECONDS", str(RESYNC_SECONDS))))
    watch.start()
    log.info("watching fleet jobs of origin %s over %s (members asked every %.0f s)", watch.origin,
             ", ".join(secrets), period)
    while True:
        began = time.monotonic()
        try:
            watch.tick()
        except Exception:  # noqa: BLE001 - the manager unreachable for a period: try again next one
            metrics.pass_failures.inc()
            log.exception("fleet watch period failed")
        time.sleep(max(0.0, period - (time.monotonic() - began)))


if __name__ == "__main__":
    sys.exit(main())
