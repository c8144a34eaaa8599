"""What the failover controller decides, as pure functions of what it reads (no I/O here).

Kueue tries the rungs of a queue in order but only by quota: when a rung's TPUs never come (a GCE stockout), the
job is evicted after `waitForPodsReady.timeout` and re-admitted on the same rung, forever (kubernetes-sigs/kueue#2560).
The controller moves such a job to the queue that starts at the next rung. Ref: ../shared/notes/kueue-stockout.md
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# On the copies a MultiKueue manager makes in this cluster (a fleet member's, plan C). The manager owns them: any
# change of a copy's spec makes it delete and recreate the copy, and an eviction here re-dispatches the job to
# every member. So the controller leaves them alone. Ref: ../shared/notes/multikueue.md (workload.go L490-536)
MULTIKUEUE_ORIGIN_LABEL = "kueue.x-k8s.io/multikueue-origin"
# On the Workload: the rung it was last admitted on. Kueue clears `status.admission` when it evicts, so the
# controller writes it down while the Workload is admitted.
ADMITTED_FLAVOR_ANNOTATION = "tpu-fallback/admitted-flavor"
# On the RayJob: the move, written before the first change so a restart finishes it (JSON, see Move).
FAILOVER_ANNOTATION = "tpu-fallback/failover"
# On the RayJob: every completed move, oldest first (a JSON list of Move objects), written in the same guarded patch
# that marks the move done. Events expire (an hour by default); this history lasts as long as the job.
MOVES_ANNOTATION = "tpu-fallback/moves"
TPU_RESOURCE = "google.com/tpu"
PODS_READY_TIMEOUT = "PodsReadyTimeout"
# Kueue's eviction for another queue's claim (a team reclaiming its share, InCohortReclamation): capacity exists,
# it is just someone else's. Never a move. Ref: kueue v0.19.2 apis/kueue/v1beta2/workload_types.go WorkloadPreempted
PREEMPTED = "Preempted"
STOCKOUT = "Stockout"
MOVING, MOVED = "moving", "moved"
# GKE's autoscaler on pods it could not get nodes for. Only a lack of capacity counts; a quota error does not.
# Ref: https://cloud.google.com/kubernetes-engine/docs/troubleshooting/cluster-autoscaler-scale-up
SCALE_UP_FAILURE_REASONS = frozenset({"FailedScaleUp", "NotTriggerScaleUp"})
STOCKOUT_MESSAGE = re.compile(r"GCE out of resources|resource[_ ]pool[_ ]exhausted|stock-?out|"
                              r"does not have enough resources", re.IGNORECASE)


DEFAULT_RECOVERY_SECONDS = 300.0  # when the chain does not say (infra/settings.py has the stack's defaults)


@dataclass(frozen=True)
class Rung:
    flavor: str
    cluster_queue: str
    local_queue: str
    admission_check: bool  # a rung with a check (DWS) provisions before admission: nothing to time out early
    recovery_seconds: float = DEFAULT_RECOVERY_SECONDS  # how long a job that lost its slice here waits for it


@dataclass(frozen=True)
class Chain:
    """The queue chain the stack declared, rung 0 first (the `queueChain` output, passed to the controller)."""

    rungs: tuple[Rung, ...]

    @classmethod
    def from_json(cls, text: str) -> Chain:
        return cls(tuple(Rung(r["flavor"], r["clusterQueue"], r["localQueue"], bool(r.get("admissionCheck")),
                              float(r.get("recoverySeconds", DEFAULT_RECOVERY_SECONDS)))
                         for r in json.loads(text)))

    def start_of_queue(self, local_queue: str) -> int | None:
        """The rung a LocalQueue's ClusterQueue starts at; None for a queue outside the chain."""
        return next((i for i, rung in enumerate(self.rungs) if rung.local_queue == local_queue), None)

    def index_of_flavor(self, flavor: str | None) -> int | None:
        return next((i for i, rung in enumerate(self.rungs) if rung.flavor == flavor), None)

    def stocks_out_after_admission(self, flavor: str | None) -> bool:
        """A rung without an admission check admits before capacity exists; DWS provisions first."""
        rung = self.index_of_flavor(flavor)
        return rung is not None and not self.rungs[rung].admission_check


@dataclass(frozen=True)
class WorkloadView:
    """The parts of a Kueue Workload the decisions read."""

    name: str
    namespace: str
    queue_name: str
    active: bool
    quota_reserved: bool
    admitted: bool
    admitted_at: datetime.datetime | None  # when QuotaReserved last turned True
    flavor: str | None  # the TPU pod set's flavor while quota is reserved
    recorded_flavor: str | None  # ADMITTED_FLAVOR_ANNOTATION
    evicted_reason: str | None  # the Evicted condition's reason while it is True
    rayjob: str | None  # the owning RayJob's name
    pending_since: datetime.datetime | None = None  # waiting for quota since (creation, or losing its quota)
    check_states: tuple[tuple[str, str], ...] = ()  # (admission check, state), as Kueue reports them
    multikueue_origin: str | None = None  # set on a fleet manager's copy (MULTIKUEUE_ORIGIN_LABEL)
    pods_ready_since: datetime.datetime | None = None  # PodsReady True since (this admission), else None
    tpu_hosts: int = 0  # the TPU pods the job needs: its TPU pod sets' counts
    finished: bool = False  # Kueue's Finished: the job ended (its pods go as they should)
    requeue_state: bool = False  # status.requeueState is set (the requeue backoff of a PodsReady eviction)

    @classmethod
    def from_object(cls, obj: Mapping) -> WorkloadView:
        meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
        conditions = {c["type"]: c for c in status.get("conditions") or []}

        def true(kind: str) -> bool:
            return (conditions.get(kind) or {}).get("status") == "True"

        flavor = None
        for assignment in (status.get("admission") or {}).get("podSetAssignments") or []:
            flavor = (assignment.get("flavors") or {}).get(TPU_RESOURCE) or flavor
        reserved = true("QuotaReserved")
        owner = next((o["name"] for o in meta.get("ownerReferences") or [] if o.get("kind") == "RayJob"), None)
        pending_since = None
        tpu_hosts = sum(int(pod_set.get("count", 1)) for pod_set in spec.get("podSets") or []
                        if any(TPU_RESOURCE in ((c.get("resources") or {}).get("requests") or {})
                               for c in ((pod_set.get("template") or {}).get("spec") or {}).get("containers") or []))
        if not reserved:
            pending_since = parse_time((conditions.get("QuotaReserved") or {}).get("lastTransitionTime")
                                       or meta.get("creationTimestamp"))
        return cls(
            name=meta["name"], namespace=meta["namespace"], queue_name=spec.get("queueName", ""),
            active=spec.get("active", True) is not False, quota_reserved=reserved, admitted=true("Admitted"),
            admitted_at=parse_time(conditions["QuotaReserved"]["lastTransitionTime"]) if reserved else None,
            flavor=flavor if reserved else None,
            recorded_flavor=(meta.get("annotations") or {}).get(ADMITTED_FLAVOR_ANNOTATION),
            evicted_reason=conditions["Evicted"].get("reason") if true("Evicted") else None,
            rayjob=owner, pending_since=pending_since,
            check_states=tuple((c["name"], c.get("state", "")) for c in status.get("admissionChecks") or []),
            multikueue_origin=(meta.get("labels") or {}).get(MULTIKUEUE_ORIGIN_LABEL),
            pods_ready_since=(parse_time(conditions["PodsReady"].get("lastTransitionTime"))
                              if reserved and true("PodsReady") else None),
            tpu_hosts=tpu_hosts, finished=true("Finished"), requeue_state=status.get("requeueState") is not None)


@dataclass(frozen=True)
class Move:
    """A move of one job to the queue starting at rung `to`; its JSON form is the RayJob annotation."""

    from_flavor: str
    to_flavor: str
    to_local_queue: str
    reason: str  # PodsReadyTimeout, Stockout or SliceLost
    at: str  # RFC 3339
    state: str = MOVING
    # The LocalQueue it leaves, for the record's message: a pass that finishes a move started by an earlier one
    # (Kueue slow to release the quota) sees the Workload repointed already. Empty in a ladder's move and in a record
    # an older controller wrote.
    from_local_queue: str = ""
    # A fleet ladder's move: the member it is about (that evicted the job, reported the stockout, lost the slice), for
    # the record's message: at a step of several members the Workload no longer names it once it is deactivated.
    member: str = ""

    def to_json(self) -> str:
        fields = {"from": self.from_flavor, "to": self.to_flavor, "localQueue": self.to_local_queue,
                  "reason": self.reason, "at": self.at, "state": self.state}
        if self.from_local_queue:
            fields["fromLocalQueue"] = self.from_local_queue
        if self.member:
            fields["member"] = self.member
        return json.dumps(fields, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> Move | None:
        if not text:
            return None
        try:
            data = json.loads(text)
            return cls(data["from"], data["to"], data["localQueue"], data["reason"], data["at"], data["state"],
                       data.get("fromLocalQueue", ""), data.get("member", ""))
        except (ValueError, KeyError, TypeError):
            return None

    def done(self) -> Move:
        return dataclasses.replace(self, state=MOVED)

    @property
    def requeue(self) -> bool:
        """On the last rung there is no next one: the job is evicted and queued again where it was (DWS asks for a
        new slice)."""
        return self.from_flavor == self.to_flavor


@dataclass(frozen=True)
class RecordFlavor:
    flavor: str


@dataclass(frozen=True)
class StartMove:
    move: Move


@dataclass(frozen=True)
class FinishMove:
    move: Move


Action = RecordFlavor | StartMove | FinishMove | None


def parse_time(text: str | None) -> datetime.datetime | None:
    if not text:
        return None
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def format_time(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def stockout_since(events: Iterable[Mapping], pods: set[str], admitted_at: datetime.datetime | None
                   ) -> datetime.datetime | None:
    """When the autoscaler first reported, for one of `pods` and since admission, that it has no capacity."""
    first = None
    for event in events:
        involved = event.get("involvedObject") or {}
        if involved.get("kind") != "Pod" or involved.get("name") not in pods:
            continue
        if event.get("reason") not in SCALE_UP_FAILURE_REASONS or not STOCKOUT_MESSAGE.search(event.get("message") or ""):
            continue
        seen_first = parse_time(event.get("firstTimestamp") or event.get("eventTime"))
        seen_last = parse_time(event.get("lastTimestamp") or event.get("eventTime")) or seen_first
        if seen_first is None or (admitted_at is not None and seen_last < admitted_at):
            continue  # from an earlier admission of the same pods' names
        seen = max(seen_first, admitted_at) if admitted_at else seen_first
        first = seen if first is None else min(first, seen)
    return first


def decide(chain: Chain, workload: WorkloadView, job_failover: str | None,
           stockout: datetime.datetime | None, grace: datetime.timedelta, now: datetime.datetime) -> Action:
    """The one next step for a Workload owned by a RayJob; None when there is nothing to do.

    Never moves up the chain nor past its last rung; a move in progress is finished first, so a restart, a
    repeated event or a second replica moves nothing twice.
    """
    if workload.multikueue_origin is not None:
        return None  # a fleet's job: its manager re-dispatches it (README "Plan C")
    pending = Move.from_json(job_failover)
    if pending is not None and pending.state == MOVING:
        return FinishMove(pending)
    start = chain.start_of_queue(workload.queue_name)
    if start is None or workload.rayjob is None:
        return None  # not a job of the chain
    if workload.quota_reserved and workload.flavor and workload.flavor != workload.recorded_flavor:
        return RecordFlavor(workload.flavor)

    if not workload.quota_reserved and workload.evicted_reason == PODS_READY_TIMEOUT:
        # Timeout path. Without a record (the controller was down for the whole admission), the queue's own
        # first rung is the safe guess: the move can then only go down.
        rung = chain.index_of_flavor(workload.recorded_flavor)
        rung = start if rung is None else rung
        return _move_to_next(chain, workload, start, rung, PODS_READY_TIMEOUT, now)

    if workload.evicted_reason == PREEMPTED:
        return None  # a preemption, not a stockout: Kueue requeues it where it was
    if (workload.admitted and chain.stocks_out_after_admission(workload.flavor) and stockout is not None
            and now - stockout >= grace):  # early path
        return _move_to_next(chain, workload, start, chain.index_of_flavor(workload.flavor), STOCKOUT, now)
    return None


SLICE_LOST = "SliceLost"  # a running job lost its slice and it was not back within the rung's recovery wait
MOVE_REASONS = (PODS_READY_TIMEOUT, STOCKOUT, SLICE_LOST)  # why the controller moves a job


def possible_moves(chain: Chain) -> list[tuple[str, str, str]]:
    """Every (from flavor, to flavor, reason) the controller can start: a move goes from a rung to the next one only;
    a job that lost its slice on the last rung is requeued there."""
    moves = [(upper.flavor, lower.flavor, reason) for upper, lower in zip(chain.rungs, chain.rungs[1:])
             for reason in MOVE_REASONS]
    return moves + [(chain.rungs[-1].flavor, chain.rungs[-1].flavor, SLICE_LOST)] if chain.rungs else moves


def move_after_loss(chain: Chain, workload: WorkloadView, lost_on: str, now: datetime.datetime) -> StartMove | None:
    """A job whose slice on `lost_on` was not back in time: to the next rung, or requeued on the last one."""
    start, rung = chain.start_of_queue(workload.queue_name), chain.index_of_flavor(lost_on)
    if start is None or rung is None or workload.multikueue_origin is not None:
        return None
    if rung + 1 < len(chain.rungs):
        return _move_to_next(chain, workload, start, rung, SLICE_LOST, now)
    return StartMove(Move(lost_on, lost_on, workload.queue_name, SLICE_LOST, format_time(now)))


def _move_to_next(chain: Chain, workload: WorkloadView, start: int, rung: int, reason: str,
                  now: datetime.datetime) -> Action:
    target = rung + 1
    if target >= len(chain.rungs) or target <= start:
        return None  # past the last rung, or already in a queue that starts at or below the target
    to = chain.rungs[target]
    return StartMove(Move(chain.rungs[rung].flavor, to.flavor, to.local_queue, reason, format_time(now),
                          from_local_queue=workload.queue_name))


# ---- a move, one step at a time ------------------------------------------------------------------------------
# What a pass of a move does next, from the Workload and RayJob as read now: each pass does the first thing left to
# do and reads both again, so a restart resumes wherever the last one stopped. Measured on Kueue 0.19.2: a relabel
# alone does not move an evicted Workload, and the deactivation skips the requeue backoff
# (tests/test_failover_controlplane.py). The controller carries each step out as one guarded write, or a wait.
DONE = "done"  # at the new queue, active, the RayJob relabelled: record it done (Event first)
DEACTIVATE = "deactivate"  # active at the queue it leaves (or on the admission that lost its slice): deactivate
WAIT_FOR_RELEASE = "wait-for-release"  # Kueue has not released the quota and suspended the job yet
# Inactive, ready to reactivate, but Kueue has not cleared the Workload's requeueState yet: it does so for an inactive
# Workload (workload_controller.go, the !IsActive branch), which is how the deactivation skips the requeue backoff.
# Reactivated first (seen on a loaded run: Kueue's clearing write lost two conflicts to the move's writes), the job
# waited out the whole PodsReady backoff (60 s) at the new rung.
WAIT_FOR_BACKOFF_RESET = "wait-for-backoff-reset"
RELABEL = "relabel"  # the RayJob's queue label to the new LocalQueue
REPOINT = "repoint"  # the Workload's `spec.queueName` to it
REACTIVATE = "reactivate"  # always end active


def reactivation_step(requeue_state: bool) -> str:
    """A move's last step once the Workload is inactive where it should be (here and in the fleet's ladder): wait
    until Kueue has cleared its requeue backoff (WAIT_FOR_BACKOFF_RESET), then reactivate."""
    return WAIT_FOR_BACKOFF_RESET if requeue_state else REACTIVATE


def next_in_move(move: Move, workload: WorkloadView, job: Mapping) -> str:
    """The next step of `move` for this Workload and its RayJob. A requeue (the last rung: no next one) is evicted
    from the admission that lost its slice by a deactivation, then queued again where it was."""
    released = not workload.quota_reserved and bool((job.get("spec") or {}).get("suspend", False))
    if move.requeue:
        on_old = workload.quota_reserved and (workload.admitted_at is None
                                              or workload.admitted_at < parse_time(move.at))
        if workload.active:
            return DEACTIVATE if on_old else DONE
        if not released:
            return WAIT_FOR_RELEASE
        return reactivation_step(workload.requeue_state)
    label = (job["metadata"].get("labels") or {}).get(QUEUE_LABEL)
    arrived = workload.queue_name == move.to_local_queue
    if arrived and label == move.to_local_queue and workload.active:
        return DONE
    if not arrived and workload.active:
        return DEACTIVATE
    if not released:
        return WAIT_FOR_RELEASE  # Kueue has not evicted yet; the next pass continues from here
    if label != move.to_local_queue:
        return RELABEL
    if not arrived:
        return REPOINT
    return reactivation_step(workload.requeue_state)


@dataclass(frozen=True)
class AdmissionWait:
    flavor: str
    seconds: float


@dataclass(frozen=True)
class CheckOutcome:
    admission_check: str
    state: str  # Ready (a ProvisioningRequest provisioned), Retry (an attempt failed), Rejected


CHECK_OUTCOMES = frozenset({"Ready", "Retry", "Rejected"})


def observations(before: WorkloadView | None, after: WorkloadView) -> list[AdmissionWait | CheckOutcome]:
    """What one observed change of a Workload says for the metrics: the wait that ended when it got quota, and
    the admission checks that reached a result. Only changes seen happen count: a Workload first seen admitted
    (a restart) adds nothing, so nothing is counted twice."""
    if before is None:
        return []
    seen: list[AdmissionWait | CheckOutcome] = []
    if (not before.quota_reserved and after.quota_reserved and after.flavor and before.pending_since
            and after.admitted_at):
        seen.append(AdmissionWait(after.flavor, max((after.admitted_at - before.pending_since).total_seconds(), 0.0)))
    earlier = dict(before.check_states)
    seen += [CheckOutcome(name, state) for name, state in after.check_states
             if state in CHECK_OUTCOMES and earlier.get(name) != state]
    return seen


def move_history(annotations: Mapping[str, str] | None) -> list[Move]:
    """The completed moves recorded on a RayJob, oldest first (unreadable entries are skipped)."""
    try:
        entries = json.loads((annotations or {}).get(MOVES_ANNOTATION) or "[]")
    except ValueError:
        return []
    moves = [Move.from_json(json.dumps(entry)) for entry in entries if isinstance(entry, dict)]
    return [move for move in moves if move is not None]


def with_move_recorded(annotations: Mapping[str, str] | None, move: Move) -> str:
    """The history annotation's value once `move` is done (a move already recorded is not added twice)."""
    history = move_history(annotations)
    done = move.done()
    if done not in history:
        history.append(done)
    return json.dumps([json.loads(m.to_json()) for m in history], sort_keys=True)


def move_message(move: Move, from_queue: str) -> str:
    """The one line logged, and the Event's message, for a move."""
    cause = {PODS_READY_TIMEOUT: "its pods were not ready within Kueue's waitForPodsReady timeout",
             STOCKOUT: "GKE's autoscaler reported no TPU capacity for its pods",
             SLICE_LOST: "it lost its slice and the slice was not back within the rung's recovery wait"}[move.reason]
    if move.requeue:
        return f"requeued on {move.to_flavor} (LocalQueue {move.to_local_queue}): {cause}"
    return (f"moved from {move.from_flavor} to {move.to_flavor} (LocalQueue {from_queue} -> {move.to_local_queue}): "
            f"{cause}")
