"""A move of a job to another queue, as both controllers that move jobs (the regional one between the rungs of a
chain, the fleet's ladder between the steps of a ladder) record it on the RayJob and carry it out."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass

from failover.api.annotations import MOVES_ANNOTATION

MOVING, MOVED = "moving", "moved"

# Why a job moves (a Move's reason). The regional controller's:
PODS_READY_TIMEOUT = "PodsReadyTimeout"  # Kueue evicted it: its pods were not ready within waitForPodsReady.timeout
STOCKOUT = "Stockout"  # GKE's autoscaler reported no TPU capacity for its pods for the grace period (the early path)
SLICE_LOST = "SliceLost"  # a running job lost its slice and it was not back within the rung's recovery wait
# a running job moved before a disruption of its slice it saw coming (fallback.maintenance.action: move)
DISRUPTION_AHEAD = "DisruptionAhead"
# The fleet's ladder's:
MEMBER_EVICTED = "MemberEvicted"  # the step's member evicted the job
MEMBER_STOCKOUT = "MemberStockout"  # or: the member reported no capacity for its pods for its grace period
# or: its pods were not ready and the member's podsReadyTimeout was about to end (the ladder's PODS_READY_LEAD
# before): the ladder moves it before the member evicts it, because after a member's eviction MultiKueue sends the job
# back to the same member at once (the manager's eviction for reason AdmissionCheck has no requeue backoff: 0.7-2.5 s
# measured on the tier), and a ladder that loses that race asks the member's pool a second time (seen in CI: two
# copies admitted at one step).
# Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/controller/core/workload_controller.go#L993-L998
MEMBER_NOT_READY = "MemberPodsNotReady"
STEP_BUSY = "StepBusy"  # or: the step did not admit it within the step wait (its capacity is in use)
# or: the running job lost its slice in the step's member, and the member's controller recorded that it did not come
# back within the member's recovery wait for the rung (failover/slices.py: its annotation on the member's RayJob)
MEMBER_SLICE_LOST = "MemberSliceLost"


@dataclass(frozen=True)
class Move:
    """A move of one job to the queue starting at rung `to`; its JSON form is the RayJob annotation."""

    from_flavor: str
    to_flavor: str
    to_local_queue: str
    reason: str  # PodsReadyTimeout, Stockout or SliceLost (a ladder's: MemberEvicted, ..., StepBusy)
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
class StartMove:
    move: Move


@dataclass(frozen=True)
class FinishMove:
    move: Move


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


# A move's last step once the Workload is inactive where it should be. Kueue clears an inactive Workload's
# requeueState (workload_controller.go, the !IsActive branch), which is how the deactivation skips the requeue backoff.
# Reactivated first (seen on a loaded run: Kueue's clearing write lost two conflicts to the move's writes), the job
# waited out the whole PodsReady backoff (60 s) at the new rung.
# Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/controller/core/workload_controller.go
WAIT_FOR_BACKOFF_RESET = "wait-for-backoff-reset"
REACTIVATE = "reactivate"  # always end active


def reactivation_step(requeue_state: bool) -> str:
    """A move's last step once the Workload is inactive where it should be (in the regional controller and in the
    fleet's ladder): wait until Kueue has cleared its requeue backoff (WAIT_FOR_BACKOFF_RESET), then reactivate."""
    return WAIT_FOR_BACKOFF_RESET if requeue_state else REACTIVATE
