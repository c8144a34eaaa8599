"""Where one RayJob is and why, in words: pure functions of the RayJob, its Workload and its ProvisioningRequest.

Kueue's conditions on the Workload say most of it (Ref: https://kueue.sigs.k8s.io/docs/concepts/workload/#status):
QuotaReserved and Admitted (a rung with an admission check reserves quota first, admits once the check is Ready),
PodsReady (for a RayJob: KubeRay reports its RayCluster `ready`), Evicted and Requeued (why it left a rung, and
whether it is back in the queue), Finished. The controller's annotations on the RayJob say how it moved.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import yaml

from failover import api, maintenance, slices
from failover.api import (CHECKPOINTING, CLIMB_BACK, CLIMB_BACK_WAITING, CLIMBS, FAILOVER_ANNOTATION,
                          FLEET_ANNOTATION, PODS_READY_TIMEOUT, QUEUE_LABEL, STOCKOUT, TPU_RESOURCE, Account, JobTimes,
                          Move, WorkloadView, account, move_history, parse_time)
from failover.api import MANAGER_CONFIG_KEY, PROVISIONING_CLASS
from ops.status.objects import (annotations, changed_at, conditions, created_at, is_true, labels, meta, name_of,
                                namespace_of, owned_by, quantity)

# The states, in the words `status` prints them.
NOT_QUEUED = "NotQueued"  # no queue label: Kueue leaves the job alone
NO_WORKLOAD = "NoWorkload"  # queued, but Kueue has not made its Workload (yet)
WAITING_FOR_QUOTA = "WaitingForQuota"
WAITING_FOR_SLICE = "WaitingForSlice"  # quota reserved on a rung with a ProvisioningRequest check (DWS)
WAITING_FOR_CHECKS = "WaitingForChecks"  # quota reserved, another admission check pending
ADMITTED = "Admitted"  # admitted, pods not all ready yet (on a stocked-out rung they never are)
RUNNING = "Running"
SLICE_LOST = "SliceLost"  # admitted and was running; its slice is broken and the controller waits for it (slices.py)
EVICTED = "Evicted"  # evicted and not back in the queue yet (requeue backoff, or deactivated)
DEACTIVATED = "Deactivated"  # spec.active false before it was ever evicted
MOVING = "Moving"  # the failover controller is moving it down the ladder
FINISHED = "Finished"
UNKNOWN = "Unknown"  # its Workload could not be read

DEACTIVATED_REASON = "Deactivated"  # Kueue's Evicted reason once spec.active is false (measured on the tier)
# Kueue's Evicted reasons, in a few words (Kueue's own message follows in the detail); a deactivation's reason may
# carry a cause: DeactivatedDueTo<cause>. Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/apis/kueue/v1beta2/workload_types.go
EVICTION_WORDS = {
    PODS_READY_TIMEOUT: "pods not ready in time",
    "Preempted": "preempted",
    "AdmissionCheck": "an admission check failed",
    "ClusterQueueStopped": "ClusterQueue stopped",
    "LocalQueueStopped": "LocalQueue stopped",
    DEACTIVATED_REASON: "deactivated",
    "NodeFailures": "node failure",
    "MaximumExecutionTimeExceeded": "ran past its maximum execution time",
}
# The controllers' move reasons (failover/api/moves.py), in words.
MOVE_WORDS = {PODS_READY_TIMEOUT: "pods not ready in time", STOCKOUT: "autoscaler reported no TPU capacity",
              # A fleet's manager (plan C): the ladder controller's moves between steps (failover/ladder/).
              api.MEMBER_EVICTED: "the step's member evicted it (pods not ready in time there, or preempted)",
              api.MEMBER_STOCKOUT: "the step's member reported no TPU capacity for its pods",
              api.MEMBER_NOT_READY: "its pods were not ready in the step's member within (just under) the "
                                    "member's podsReadyTimeout",
              api.STEP_BUSY: "the step did not admit it within the fleet's stepWait (its capacity is in use)",
              api.MEMBER_SLICE_LOST: "it lost its slice in the step's member, which was not back within the "
                                     "member's sliceRecoveryWait",
              api.SLICE_LOST: "it lost its slice, which was not back within the rung's sliceRecoveryWait",
              api.DISRUPTION_AHEAD: "a disruption of its slice was coming (a host's maintenance, its DWS run's end): "
                                    "moved first (fallback.maintenance.action: move)",
              # The regional controller's move back up (failover/regional/climb.py).
              CLIMB_BACK: "the rung had a free slice for fallback.climbBack.settle (fleet.climbBack.settle in a fleet)",
              CLIMB_BACK_WAITING: "it waited below its first rung, holding no quota, and the rung had a free slice"}
# A ProvisioningRequest's conditions, most decisive first (a revoked or expired booking was provisioned before).
# Ref: https://github.com/kubernetes/autoscaler/blob/cluster-autoscaler-1.36.1/cluster-autoscaler/apis/provisioningrequest/autoscaling.x-k8s.io/v1/types.go
REQUEST_CONDITIONS = (
    ("Failed", "failed"),
    ("CapacityRevoked", "capacity revoked"),
    ("BookingExpired", "booking expired"),
    ("Provisioned", "provisioned"),
    ("Accepted", "accepted, waiting for capacity"),
)


RAYJOB_KIND = "RayJob"
POSITION_FROM_KUEUE, POSITION_COMPUTED = "kueue", "computed"
# Evictions that mean the rung had no capacity for the job (the reasons the failover controller moves on).
CAPACITY_EVICTIONS = frozenset({PODS_READY_TIMEOUT, "AdmissionCheck"})
# A job loops on its last rung when it failed there this often (its capacity failures beyond its moves): one failure
# is a stockout like any other (or, on a fleet's manager, one re-dispatch after a partition); two mean it keeps
# coming back to a rung it cannot leave.
LOOP_EVICTIONS = 2


@dataclass(frozen=True)
class Size:
    """What a Workload asks for: its TPU chips and hosts (pods that request TPUs) and all its pods."""

    chips: int
    hosts: int
    pods: int


@dataclass(frozen=True)
class RequestView:
    """A ProvisioningRequest Kueue made for the Workload (the newest attempt)."""

    name: str
    provisioning_class: str  # queued-provisioning.gke.io: DWS
    state: str  # the decisive condition's type, or Pending / NotProvisioned
    words: str
    since: datetime.datetime | None
    message: str

    @property
    def dws(self) -> bool:
        return self.provisioning_class == PROVISIONING_CLASS


@dataclass(frozen=True)
class MoveView:
    from_flavor: str
    to_flavor: str
    local_queue: str
    reason: str
    at: str  # RFC 3339, as the controller wrote it

    @classmethod
    def of(cls, move: Move) -> MoveView:
        return cls(move.from_flavor, move.to_flavor, move.to_local_queue, move.reason, move.at)


@dataclass(frozen=True)
class JobView:
    namespace: str
    name: str
    workload: str | None
    local_queue: str | None  # the RayJob's queue label
    cluster_queue: str | None
    rung: str | None  # the flavor it holds quota on, the rung it is moving to, else the rung its queue starts at
    active: bool  # the Workload's spec.active: a deactivated job waits for nothing
    state: str
    words: str
    since: datetime.datetime | None
    detail: str  # why, in Kueue's or the controller's own words; "" when there is nothing to add
    moves: tuple[MoveView, ...]  # completed moves, oldest first
    move_in_progress: MoveView | None
    request: RequestView | None
    checks: tuple[tuple[str, str], ...]  # (admission check, state) from the Workload's status
    fleet: FleetPlacement | None = None  # on a fleet's manager (plan C): where the job runs
    kind: str = RAYJOB_KIND  # what owns the Workload: RayJob, Job, JobSet, Pod, RayCluster...
    size: Size | None = None  # chips, hosts and pods the Workload asks for
    pods_ready: int | None = None  # None: the pods could not be read
    priority: int | None = None
    priority_class: str | None = None
    created: datetime.datetime | None = None  # the Workload's (else the job's) creation: its age
    position: int | None = None  # among the pending Workloads of its ClusterQueue, from 0
    position_source: str | None = None  # POSITION_FROM_KUEUE or POSITION_COMPUTED
    evictions: tuple[tuple[str, int], ...] = ()  # status.schedulingStats.evictions: (reason, count)
    requeues: int = 0  # status.requeueState.count: Kueue's requeues since its last admission
    evict_at: datetime.datetime | None = None  # admitted, waiting for pods: when Kueue evicts it (podsReadyTimeout)
    looping_on: str | None = None  # the last rung, when the job keeps failing there (nothing below to move to)
    pools: tuple[str, ...] | None = None  # the GKE node pools its pods run on; None: Nodes not readable
    ran: tuple[datetime.datetime, datetime.datetime | None] | None = None  # the Ray job's start and end (KubeRay)
    goodput: Account | None = None  # its scheduling goodput and where its time went; None: its Workload unknown
    ahead: api.Ahead | None = None  # a disruption of its slice seen coming, this admission (failover/maintenance.py)

    @property
    def run_seconds(self) -> float | None:
        """How long the last run's Ray job took, once it ended (KubeRay's startTime to endTime)."""
        if self.ran is None or self.ran[1] is None:
            return None
        return (self.ran[1] - self.ran[0]).total_seconds()

    @property
    def eviction_count(self) -> int:
        return sum(count for _, count in self.evictions)


@dataclass(frozen=True)
class FleetPlacement:
    """A fleet job, as the manager shows it: Kueue's record of where it was admitted (status.clusterName) and, from
    the fleet watch (failover/watch/, annotation tpu-fallback/fleet), where it really runs."""

    record: str | None
    runs_in: tuple[str, ...]
    watch_state: str | None  # failover/watch/'s states (Running, RecordStale, ...); None: not seen yet
    since: datetime.datetime | None
    blocked: tuple[tuple[str, str], ...] = ()  # (member, Kueue's reason) where it cannot be admitted
    unreachable: tuple[str, ...] = ()  # members the watch could not reach
    rungs: tuple[tuple[str, str], ...] = ()  # (member, its rung there) where it runs

    def words(self) -> str:
        if self.watch_state is None:
            return f"admitted in {self.record} (Kueue's record; the fleet watch has not seen it yet)"
        rung = dict(self.rungs)
        where = " and ".join(f"{m} ({rung[m]})" if m in rung else m for m in self.runs_in) or "nowhere reachable"
        if self.watch_state == "RecordStale":
            recorded = f"says {self.record}" if self.record else "names no member"
            return f"runs in {where}; Kueue's record {recorded} (it cannot record it: Kueue 0.19.2)"
        if self.watch_state == "RunningTwice":
            return f"runs in {where} at once (a partition's overlap; each run checkpoints apart)"
        if self.watch_state == "Finished":
            return f"finished (Kueue's record: {self.record or 'no member'})"
        if self.watch_state == "Waiting":
            return "runs nowhere now: waits for a slice in every member"
        if self.watch_state == "MemberCannotAdmit":
            return "; ".join(f"{member} cannot admit it: {why}" for member, why in self.blocked)
        if self.watch_state == "MemberLost":
            lost = " and ".join(self.unreachable) or self.record
            return f"{lost} does not answer; a run there may go on, and the manager dispatches again after " \
                   "workerLostTimeout"
        lost = f"; {' and '.join(self.unreachable)} does not answer (a run there may go on)" if self.unreachable else ""
        return f"runs in {where}{lost}"


def fleet_of(rayjob: Mapping, workload: Mapping | None) -> FleetPlacement | None:
    """None for a job that is not a fleet's, or not yet admitted anywhere."""
    record = ((workload or {}).get("status") or {}).get("clusterName")
    try:
        watched = json.loads(annotations(rayjob).get(FLEET_ANNOTATION) or "{}")
    except ValueError:
        watched = {}
    if not record and not watched:
        return None
    return FleetPlacement(record or watched.get("kueueRecord"), tuple(watched.get("runsIn") or ()),
                          watched.get("state"), parse_time(watched.get("since")),
                          tuple(sorted((watched.get("blocked") or {}).items())), tuple(watched.get("unreachable") or ()),
                          tuple(sorted((watched.get("rungs") or {}).items())))


@dataclass(frozen=True)
class State:
    state: str
    words: str
    since: datetime.datetime | None
    detail: str = ""


# ---- matching objects -----------------------------------------------------------------------------------------------
def workload_of(rayjob: Mapping, workloads: Sequence[Mapping]) -> Mapping | None:
    """The RayJob's Workload, found by owner (its name carries a hash); the newest unfinished one if several."""
    uid, namespace = meta(rayjob).get("uid"), namespace_of(rayjob)
    owned = [w for w in workloads if namespace_of(w) == namespace
             and (owned_by(w, "RayJob", uid=uid) if uid else owned_by(w, "RayJob", name=name_of(rayjob)))]
    owned.sort(key=lambda w: (not is_true(conditions(w).get("Finished")), meta(w).get("creationTimestamp", "")))
    return owned[-1] if owned else None


def request_of(workload: Mapping | None, requests: Sequence[Mapping]) -> Mapping | None:
    """The newest ProvisioningRequest owned by the Workload (Kueue names them <workload>-<check>-<attempt>)."""
    if workload is None:
        return None
    uid = meta(workload).get("uid")
    owned = [r for r in requests if namespace_of(r) == namespace_of(workload) and owned_by(r, "Workload", uid=uid)]
    return max(owned, key=lambda r: meta(r).get("creationTimestamp", ""), default=None)


# ---- the parts ------------------------------------------------------------------------------------------------------
def request_view(request: Mapping | None) -> RequestView | None:
    if request is None:
        return None
    name, found = name_of(request), conditions(request)
    kind = (request.get("spec") or {}).get("provisioningClassName", "")
    for condition, words in REQUEST_CONDITIONS:
        if is_true(found.get(condition)):
            return RequestView(name, kind, condition, words, changed_at(found[condition]),
                               kueue_message(found[condition]))
    provisioned = found.get("Provisioned")
    if provisioned is not None:
        return RequestView(name, kind, "NotProvisioned", f"not provisioned yet ({provisioned.get('reason')})",
                           changed_at(provisioned), kueue_message(provisioned))
    return RequestView(name, kind, "Pending", "created, not accepted yet", created_at(request), "")


def ahead_of(rayjob: Mapping, workload: Mapping | None) -> api.Ahead | None:
    """The disruption the failover controller saw coming for the job's slice (maintenance of host H at T, a DWS run's
    end), while it is about the admission the job runs on."""
    recorded = api.Ahead.from_json(annotations(rayjob).get(api.AHEAD_ANNOTATION))
    if recorded is None or workload is None:
        return None
    view = api.WorkloadView.from_object(workload)
    return maintenance.current(recorded, view.flavor, view.pods_ready_since)


def check_states(workload: Mapping | None) -> tuple[tuple[str, str], ...]:
    return tuple((c.get("name", ""), c.get("state", ""))
                 for c in ((workload or {}).get("status") or {}).get("admissionChecks") or [])


def moves_of(rayjob: Mapping) -> tuple[tuple[MoveView, ...], MoveView | None]:
    """The completed moves (tpu-fallback/moves) and the one in progress (tpu-fallback/failover while `moving`)."""
    recorded = annotations(rayjob)
    latest = Move.from_json(recorded.get(FAILOVER_ANNOTATION))
    # A climb back is under way from its checkpoint on (the job still runs while it saves).
    in_progress = MoveView.of(latest) if latest is not None and latest.state in (api.MOVING, CHECKPOINTING) else None
    return tuple(MoveView.of(m) for m in move_history(recorded)), in_progress


def tpu_flavor(workload: Mapping | None) -> str | None:
    """The flavor of the TPU pod set in status.admission (kept on a finished Workload, cleared on eviction)."""
    for assignment in (((workload or {}).get("status") or {}).get("admission") or {}).get("podSetAssignments") or []:
        if TPU_RESOURCE in (assignment.get("flavors") or {}):
            return assignment["flavors"][TPU_RESOURCE]
    return None


def eviction_words(reason: str | None) -> str:
    for known, words in EVICTION_WORDS.items():
        if reason and reason.startswith(known):  # e.g. DeactivatedDueToRequeuingLimitExceeded
            return words
    return reason or "unknown reason"


def kueue_message(condition: Mapping | None) -> str:
    return ((condition or {}).get("message") or "").strip()


# ---- the state ------------------------------------------------------------------------------------------------------
def job_state(rayjob: Mapping, workload: Mapping | None, request: RequestView | None,
              move_in_progress: MoveView | None, last_move: MoveView | None = None,
              slice_checks: Sequence[str] = (), requests_problem: str | None = None) -> State:
    """One state in words, when it began, and why. `requests_problem`: ProvisioningRequests could not be read, so a
    pending check among `slice_checks` is taken as waiting for a slice whose request is unknown."""
    if workload is None:
        if QUEUE_LABEL not in labels(rayjob):
            return State(NOT_QUEUED, "not queued (no queue label)", created_at(rayjob),
                         f"Kueue manages only jobs labelled {QUEUE_LABEL}")
        return State(NO_WORKLOAD, "submitted, Kueue has not made its Workload yet", created_at(rayjob))
    found = conditions(workload)
    view = WorkloadView.from_object(workload)
    if is_true(found.get("Finished")):
        finished = found["Finished"]
        return State(FINISHED, f"finished ({finished.get('reason', 'done')})", changed_at(finished),
                     kueue_message(finished))
    if move_in_progress is not None:
        move = move_in_progress
        words = (f"climbing back from {move.from_flavor} to {move.to_flavor} (a checkpoint first)"
                 if move.reason == CLIMB_BACK else f"climbing back from {move.from_flavor} to {move.to_flavor}"
                 if move.reason == CLIMB_BACK_WAITING else
                 f"being requeued on {move.to_flavor} (the last rung or step: no next one)"
                 if move.from_flavor == move.to_flavor else f"moving from {move.from_flavor} to {move.to_flavor}")
        return State(MOVING, words, parse_time(move.at),
                     f"started by the failover controller ({move.reason}): {MOVE_WORDS.get(move.reason, move.reason)}")
    lost = api.LostSlice.from_json(annotations(rayjob).get(api.SLICE_LOST_ANNOTATION))
    if (view.admitted and view.pods_ready_since is not None and lost is not None and lost.state == api.LOST
            and lost.flavor == view.flavor and (parse_time(lost.at) or view.pods_ready_since) >= view.pods_ready_since):
        return State(SLICE_LOST, f"lost its slice, waiting for it until {lost.until}", parse_time(lost.at),
                     f"{slices.loss_message(lost)}; then the failover controller moves it on")
    if view.quota_reserved:
        return _reserved_state(found, view, request, check_states(workload), slice_checks, requests_problem)
    evicted = found.get("Evicted") if is_true(found.get("Evicted")) else None
    last_on = view.recorded_flavor
    requeued = found.get("Requeued")
    gave_up = api.GiveUp.from_json(annotations(rayjob).get(api.GAVE_UP_ANNOTATION))
    if not view.active and gave_up is not None and gave_up.state == api.GAVE_UP:
        # A fleet's job the ladder gave up on (fleet.maxWait, or the job's tpu-fallback/max-wait).
        return State(EVICTED, f"given up after {gave_up.waited} (maximum wait {gave_up.max_wait})",
                     parse_time(gave_up.at), gave_up.message())
    if evicted is not None and (not view.active or (requeued is not None and not is_true(requeued))):
        # Out of the queue: deactivated until spec.active is true again, or Kueue's requeue backoff (Requeued=False
        # until it ends). Evicted stays True until the next admission, and a Workload deactivated before it was ever
        # admitted gets no Requeued condition at all (measured on Kueue 0.19.2; workload_controller.go reconcile).
        where = f" from {last_on}" if last_on else ""
        back = requeue_words(workload, view.active)
        return State(EVICTED, f"evicted{where}: {eviction_words(evicted.get('reason'))}", changed_at(evicted),
                     "; ".join(part for part in (back, kueue_message(evicted)) if part))
    if not view.active:
        return State(DEACTIVATED, "deactivated", created_at(workload),
                     "spec.active is false: not queued until it is true again")
    pending = found.get("QuotaReserved")
    since = changed_at(requeued) if evicted is not None and is_true(requeued) else None
    detail = kueue_message(pending)
    # A move deactivates the Workload on purpose: say it was moved here rather than "deactivated". Judged by the move's
    # target, not by the Evicted condition: a pending Workload moved before Kueue reconciled its deactivation never
    # gets one (seen on the tier, where the status test once found no Evicted condition after a move).
    moved_here = last_move is not None and last_move.local_queue == view.queue_name
    requeued_here = moved_here and last_move.from_flavor == last_move.to_flavor
    climbed_here = moved_here and last_move.reason in CLIMBS
    earlier = (f"requeued here by the failover controller ({MOVE_WORDS.get(last_move.reason, last_move.reason)})"
               if requeued_here else f"climbed back here from {last_move.from_flavor} by the failover controller"
               if climbed_here else f"moved here from {last_move.from_flavor} by the failover controller"
               if moved_here else f"evicted earlier: {eviction_words(evicted.get('reason'))}" if evicted is not None
               else "")
    if earlier:
        detail = earlier + (f"; {detail}" if detail else "")
    return State(WAITING_FOR_QUOTA, "waiting for quota", since or changed_at(pending) or created_at(workload), detail)


def _reserved_state(found: Mapping, view: WorkloadView, request: RequestView | None,
                    checks: tuple[tuple[str, str], ...], slice_checks: Sequence[str] = (),
                    requests_problem: str | None = None) -> State:
    reserved = found["QuotaReserved"]
    if view.admitted:
        if is_true(found.get("PodsReady")):
            return State(RUNNING, "running", changed_at(found["PodsReady"]))
        # Kueue evicts it if they are not all ready within its waitForPodsReady timeout (a stockout looks so).
        return State(ADMITTED, "admitted, waiting for pods", changed_at(found.get("Admitted")))
    waiting = ", ".join(f"{name} {state}" for name, state in checks if state != "Ready")
    if request is not None:
        slice_kind = "a DWS slice" if request.dws else "capacity"
        return State(WAITING_FOR_SLICE, f"waiting for {slice_kind}", changed_at(reserved),
                     f"ProvisioningRequest {request.name} {request.state}" + (f"; checks: {waiting}" if waiting else ""))
    if requests_problem and any(name in slice_checks and state != "Ready" for name, state in checks):
        return State(WAITING_FOR_SLICE, "waiting for a DWS slice", changed_at(reserved),
                     f"ProvisioningRequest unknown ({requests_problem})" + (f"; checks: {waiting}" if waiting else ""))
    return State(WAITING_FOR_CHECKS, "quota reserved, waiting for admission checks",
                 changed_at(reserved), f"checks: {waiting}" if waiting else "")


def requeue_words(workload: Mapping, active: bool) -> str:
    if not active:
        return "spec.active is false: out of the queue until it is true again"
    at = parse_time((((workload.get("status") or {}).get("requeueState")) or {}).get("requeueAt"))
    return f"back in the queue at {at:%Y-%m-%dT%H:%M:%SZ}" if at else "back in the queue after Kueue's backoff"


def current_rung(workload: Mapping | None, state: str, start: str | None) -> str | None:
    """The flavor the job holds quota on (or finished on), else the rung its queue starts at (Kueue tries it first)."""
    flavor = tpu_flavor(workload)
    return flavor if flavor and state in HOLDING_QUOTA else start


# The states in which the Workload holds quota on a flavor (or did, when it finished).
HOLDING_QUOTA = frozenset({WAITING_FOR_SLICE, WAITING_FOR_CHECKS, ADMITTED, RUNNING, SLICE_LOST, FINISHED})


# ---- what a Workload asks for and has been through ------------------------------------------------------------------
def controller_owner(workload: Mapping) -> Mapping:
    """The ownerReference Kueue made the Workload for (the controller one; a pod group has several Pods)."""
    owners = meta(workload).get("ownerReferences") or []
    return next((o for o in owners if o.get("controller")), owners[0] if owners else {})


def pod_tpus(template: Mapping) -> int:
    """TPU chips one pod of a pod set requests (a container's request, else its limit, which GKE requires equal)."""
    chips = 0
    for container in ((template or {}).get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        amount = (resources.get("requests") or {}).get(TPU_RESOURCE) or (resources.get("limits") or {}).get(TPU_RESOURCE)
        chips += int(quantity(amount))
    return chips


def size_of(workload: Mapping | None) -> Size | None:
    if workload is None:
        return None
    chips = hosts = pods = 0
    for pod_set in ((workload.get("spec") or {}).get("podSets")) or []:
        count, per_pod = int(pod_set.get("count") or 0), pod_tpus(pod_set.get("template") or {})
        pods += count
        if per_pod:
            chips, hosts = chips + count * per_pod, hosts + count
    return Size(chips, hosts, pods)


def priority_of(workload: Mapping | None) -> tuple[int | None, str | None]:
    spec = (workload or {}).get("spec") or {}
    return spec.get("priority"), (spec.get("priorityClassRef") or {}).get("name") or spec.get("priorityClassName")


def evictions_of(workload: Mapping | None) -> tuple[tuple[str, int], ...]:
    """Kueue's eviction counts by reason (and underlying cause), kept across requeues and restarts."""
    found = (((workload or {}).get("status") or {}).get("schedulingStats") or {}).get("evictions") or []
    return tuple((e.get("reason", "") + (f"/{e['underlyingCause']}" if e.get("underlyingCause") else ""),
                  int(e.get("count") or 0)) for e in found)


def requeues_of(workload: Mapping | None) -> int:
    return int((((workload or {}).get("status") or {}).get("requeueState") or {}).get("count") or 0)


def capacity_failures(evictions: Sequence[tuple[str, int]]) -> int:
    return sum(count for reason, count in evictions if reason.split("/")[0] in CAPACITY_EVICTIONS)


def queue_order_time(workload: Mapping) -> datetime.datetime | None:
    """When Kueue queues the Workload from: its eviction by the pods-ready timeout or an admission check (the stack
    requeues by eviction time), else its creation. Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/workload/workload.go (GetQueueOrderTimestamp)"""
    evicted = conditions(workload).get("Evicted")
    if is_true(evicted) and (evicted.get("reason") or "") in CAPACITY_EVICTIONS:
        return changed_at(evicted)
    return created_at(workload)


def evict_deadline(workload: Mapping | None, state: str, timeout_seconds: int | None) -> datetime.datetime | None:
    """Admitted and waiting for pods: Kueue evicts it podsReadyTimeout after admission
    (Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/controller/core/workload_controller.go, admittedNotReadyWorkload)."""
    if state != ADMITTED or timeout_seconds is None:
        return None
    admitted_at = changed_at(conditions(workload).get("Admitted"))
    return admitted_at + datetime.timedelta(seconds=timeout_seconds) if admitted_at else None


# Pods of a job by the labels their controllers put on them (no pod names its Workload). A RayJob's pods are its
# RayCluster's (status.rayClusterName, label ray.io/cluster) and its submitter Job's (named as the RayJob).
# Ref: https://github.com/ray-project/kuberay/blob/v1.6.2/ray-operator/controllers/ray/utils/constant.go (RayClusterLabelKey)
# Ref: https://kubernetes.io/docs/reference/labels-annotations-taints/#batchkubernetesiojob-name
# Ref: https://github.com/kubernetes-sigs/jobset/blob/v0.10.1/api/jobset/v1alpha2/jobset_types.go (JobSetNameKey)
RAY_CLUSTER_LABEL = "ray.io/cluster"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
POD_LABEL_OF_KIND = {"RayCluster": RAY_CLUSTER_LABEL, "Job": JOB_NAME_LABEL, "JobSet": JOBSET_NAME_LABEL}
POD_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"  # Ref: https://kueue.sigs.k8s.io/docs/tasks/run/plain_pods/
POD_NAME = "metadata.name"  # the index's key for a pod's own name


class PodIndex:
    """The namespace's pods by (namespace, label, value) for the labels a job's pods carry, and by name: built once
    per report, so each job's lookup does not scan every pod (1,000 jobs over thousands of pods)."""

    KEYS = (RAY_CLUSTER_LABEL, JOB_NAME_LABEL, JOBSET_NAME_LABEL, POD_GROUP_LABEL)

    def __init__(self, pods: Sequence[Mapping]):
        self._found: dict[tuple[str, str, str], list[Mapping]] = {}
        for pod in pods:
            keys = [(POD_NAME, name_of(pod))] + [(k, labels(pod)[k]) for k in self.KEYS if labels(pod).get(k)]
            for key, value in keys:
                self._found.setdefault((namespace_of(pod), key, value), []).append(pod)

    def with_label(self, namespace: str, key: str, value: str | None) -> list[Mapping]:
        return self._found.get((namespace, key, value), []) if value else []


def pods_of(kind: str, name: str, namespace: str, pods: PodIndex, owner: Mapping | None = None) -> list[Mapping]:
    if kind == "Pod":
        found = pods.with_label(namespace, POD_NAME, name) + pods.with_label(namespace, POD_GROUP_LABEL, name)
    elif kind == RAYJOB_KIND:
        cluster = ((owner or {}).get("status") or {}).get("rayClusterName")
        found = pods.with_label(namespace, RAY_CLUSTER_LABEL, cluster) + pods.with_label(namespace, JOB_NAME_LABEL,
                                                                                         name)
    else:
        found = pods.with_label(namespace, POD_LABEL_OF_KIND.get(kind, ""), name)
    return list({id(p): p for p in found}.values())  # a pod found by two of its labels counts once


def node_pools_of(pods: Sequence[Mapping], node_pools: Mapping[str, str]) -> tuple[str, ...]:
    """The node pools the pods that hold a node run on, each once, in name order."""
    placed = {(p.get("spec") or {}).get("nodeName") for p in pods if not meta(p).get("deletionTimestamp")}
    return tuple(sorted({node_pools.get(node, "?") for node in placed if node}))


def run_span(rayjob: Mapping) -> tuple[datetime.datetime, datetime.datetime | None] | None:
    """KubeRay's `status.startTime` and `endTime` of the RayJob's run (the end once it is Complete or Failed)."""
    status = rayjob.get("status") or {}
    started = parse_time(status.get("startTime"))
    return None if started is None else (started, parse_time(status.get("endTime")))


def ready_pods(pods: Sequence[Mapping]) -> int:
    return sum(1 for p in pods if not meta(p).get("deletionTimestamp") and is_true(conditions(p).get("Ready")))


# Kueue v1beta2 turns waitForPodsReady on, with this timeout when its configuration sets none (no block, or no
# timeout in it). Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/apis/config/v1beta2/defaults.go (L48, L99-108)
KUEUE_DEFAULT_PODS_READY_SECONDS = 30 * 60
_GO_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s)")
_GO_UNITS = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}


def go_duration_seconds(text: str) -> int | None:
    """A Go duration as Kueue's configuration holds it (90s, 5m, 1h30m0s); None when it is not one."""
    parts = _GO_DURATION.findall(text or "")
    if not parts or "".join(number + unit for number, unit in parts) != text:
        return None
    return int(sum(float(number) * _GO_UNITS[unit] for number, unit in parts))


def kueue_pods_ready_timeout(config_map: Mapping) -> int | None:
    """The waitForPodsReady timeout in Kueue's manager ConfigMap; None when the configuration cannot be read."""
    try:
        configuration = yaml.safe_load(((config_map.get("data") or {}).get(MANAGER_CONFIG_KEY)) or "")
    except yaml.YAMLError:
        return None
    if not isinstance(configuration, dict):
        return None
    wait = configuration.get("waitForPodsReady") or {}
    if not isinstance(wait, dict):
        return None
    return go_duration_seconds(str(wait["timeout"])) if wait.get("timeout") else KUEUE_DEFAULT_PODS_READY_SECONDS


def goodput_of(owner: Mapping, workload: Mapping | None, waiting_on: str | None,
               now: datetime.datetime) -> Account | None:
    """The job's scheduling goodput and where its time went (failover/api/goodput.py), from its objects: the RayJob's
    creation and the failover controller's records on it, the Workload's conditions; `waiting_on`: the rung its
    queue starts at."""
    times = JobTimes.of(meta(owner), WorkloadView.from_object(workload) if workload is not None else None, waiting_on)
    return account(times, now) if times is not None else None
