"""What the fleet watch decides (failover/watch/controller.py carries it out), as pure functions of what it reads:
the manager's Workload and RayJob, each member's copy and run, which members answer; no I/O here. See
failover/watch/__main__.py for the program and what it writes.
"""

from __future__ import annotations

import copy as copy_module
import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from failover.api import WorkloadView

COMPONENT = "tpu-fallback-fleet-watch"
RECORDING_SECONDS = 10.0  # the longest a dispatch Kueue is recording may show no record before it is called stale
MISSES_BEFORE_LOST = 2  # a member that answered is lost after this many missed probes in a row, not one: measured
# on a loaded tier, an API server just resumed after a partition may miss one probe, and a finding that flips for
# one period (MemberLost, then back) is two Warnings that say nothing true
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


def being_recorded(workload: Mapping, finding: Finding) -> bool:
    """Whether a RecordStale without a record is Kueue recording a dispatch: the job runs only in members the
    manager's Workload nominates, so Kueue's next reconcile records one of them (it created the member's RayJob
    first, its record is a second write). After a member's return (the real case) the member was not nominated
    (`record_to_repair`). Measured on a loaded tier: the RayJob in member 1, then the record more than 1 s later."""
    nominated = set((workload.get("status") or {}).get("nominatedClusterNames") or ())
    return (finding.state == RECORD_STALE and finding.record is None and bool(finding.runs_in)
            and set(finding.runs_in) <= nominated)


def settle_for(workload: Mapping, finding: Finding, warning_settle: float) -> float:
    """How long a finding must hold before it is published: a warning `warning_settle` (Kueue writes a dispatch as
    several writes, and a look between two of them must not cry out), a dispatch being recorded
    (`being_recorded`) at least RECORDING_SECONDS, anything else at once."""
    if being_recorded(workload, finding):
        return max(warning_settle, RECORDING_SECONDS)
    return warning_settle if finding.state in WARNINGS else 0.0


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


def condition_true(obj: Mapping | None, kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True"
               for c in ((obj or {}).get("status") or {}).get("conditions") or [])


def live(copy: Mapping | None, rayjob: Mapping | None) -> bool:
    """Whether the job runs, or is about to, in a member: its RayJob there is not suspended (the member's Kueue
    unsuspends it once the copy is admitted there), or its copy there is admitted and neither evicted nor marked for
    deactivation by the manager. The RayJob MultiKueue makes for an evicted copy stays suspended: no run."""
    if rayjob is not None and not (rayjob.get("spec") or {}).get("suspend"):
        return True
    return (copy is not None and condition_true(copy, "Admitted") and not condition_true(copy, "Evicted")
            and not condition_true(copy, DEACTIVATION_TARGET) and (copy.get("spec") or {}).get("active") is not False)


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
    request deleted (measured on the tier). Marked Suspended beforehand, the eviction finishes at once (Kueue reads
    the RayJob's status only to finish an eviction: jobframework reconciler step 6).
    Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/controller/jobframework/reconciler.go"""
    record = (workload.get("status") or {}).get("clusterName")
    deployment = (rayjob.get("status") or {}).get("jobDeploymentStatus") or "New"
    if (not record or not condition_true(workload, "Admitted") or condition_true(workload, "Evicted")
            or condition_true(workload, "Finished") or connected.get(record) is not False or record in set(answering)
            or deployment in INACTIVE):
        return None
    return record


def record_to_repair(workload: Mapping, admitted_in: Iterable[str], connected: Iterable[str]) -> str | None:
    """The member whose admission Kueue cannot record, if any: the manager's Workload holds quota, is neither evicted
    nor admitted nor finished, records no member, and its MultiKueue check waits (Pending) while exactly one member
    has the copy admitted, a member Kueue is connected to again but did not nominate. Kueue adopted that member's
    copy on its return, and its webhook refuses `clusterName` outside `nominatedClusterNames` (measured on the tier):
    it stays so for good unless the nomination names the member (`repaired_status`).
    Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/webhooks/workload_webhook.go"""
    status = workload.get("status") or {}
    if (not condition_true(workload, "QuotaReserved") or any(condition_true(workload, kind) for kind in ("Evicted", "Admitted", "Finished"))
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
    if (not record or not queue or not condition_true(workload, "Admitted")
            or any(condition_true(workload, kind) for kind in ("Evicted", "Finished"))
            or record not in copies or not live(copies.get(record), rayjobs.get(record))):
        return []
    return sorted(member for member, found in copies.items() if found is not None and member != record
                  and (found.get("spec") or {}).get("queueName") not in (None, queue))


def repaired_status(workload: Mapping, member: str) -> dict:
    """The Workload's whole current status with `member` added to `nominatedClusterNames`: applied (server-side,
    forced) as Kueue's own field manager, Kueue's next reconcile records `clusterName: member` (measured on the tier:
    0.2-0.5 s). A merge patch of the list alone is refused by CEL once Kueue writes again.
    Ref: https://kubernetes.io/docs/reference/using-api/server-side-apply/#conflicts"""
    status = copy_module.deepcopy(dict(workload.get("status") or {}))
    status["nominatedClusterNames"] = sorted(set(status.get("nominatedClusterNames") or []) | {member})
    return status


def owner_rayjob(workload: Mapping) -> str | None:
    return next((o["name"] for o in workload["metadata"].get("ownerReferences") or [] if o.get("kind") == "RayJob"),
                None)


def key_of(obj: Mapping) -> Key:
    return obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


# ---- one job, decided whole ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sighting:
    """What the watch sees of one job at a moment: the manager's Workload and RayJob, and in each member that answers
    its copy and its run there (None where there is none); the members that do not answer; Kueue's MultiKueueCluster
    Active per member."""

    workload: Mapping
    rayjob: Mapping | None
    copies: Mapping[str, Mapping | None]
    runs: Mapping[str, Mapping | None]
    unreachable: frozenset[str] = frozenset()
    connected: Mapping[str, bool] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    """What to do for one job (failover/watch/controller.py carries it out) and what is true of it."""

    finding: Finding
    lost: str | None = None  # Kueue lost the member where it admitted the job: mark the RayJob Suspended now
    unblock: bool = False  # Kueue's eviction waits for a stop it cannot see, and no member that answers runs it
    left_to_kueue: tuple[str, ...] = ()  # the eviction waits, and the job runs in these: nothing to do
    repair: str | None = None  # the member to name in Kueue's record (once it has stayed so: the controller times it)
    stale: tuple[str, ...] = ()  # members where an older step's copy and run are left: delete them


def judge(seen: Sighting) -> Verdict:
    """Decide for one job from what is seen: an admission Kueue lost (`lost_admission`) or an eviction it cannot
    finish (`eviction_stuck`, `may_unblock`), a record to repair (`record_to_repair`), an older step's copies to
    remove (`stale_step_copies`), and where it runs (`assess`, counting neither those copies nor their runs)."""
    workload, rayjob = seen.workload, seen.rayjob
    lost = lost_admission(workload, rayjob, seen.connected, seen.runs) if rayjob is not None else None
    unblock, left = False, ()
    if lost is None and rayjob is not None and eviction_stuck(workload, rayjob):
        live_in = tuple(sorted(name for name in seen.copies if live(seen.copies.get(name), seen.runs.get(name))))
        unblock, left = may_unblock(workload, rayjob, live_in), live_in
    connected = {name for name, active in seen.connected.items() if active}
    repair = record_to_repair(workload, admitted_at_current_step(workload, seen.copies), connected)
    stale = tuple(stale_step_copies(workload, seen.copies, seen.runs))
    copies = {name: None if name in stale else found for name, found in seen.copies.items()}
    runs = {name: None if name in stale else run for name, run in seen.runs.items()}
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
    finding = assess((workload.get("status") or {}).get("clusterName"),
                     {name: run is not None for name, run in runs.items()}, seen.unreachable, blocked,
                     condition_true(workload, "Finished"), flavors)
    return Verdict(finding, lost, unblock, () if unblock else left, repair, stale)
