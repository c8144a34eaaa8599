"""The vocabulary the programs share with each other, with `ops status`, the benchmarks and the tests: the labels and
annotations they write (annotations), the Events (events), the records kept on a RayJob (moves, records), what they
read of a Workload (views), the queues they are given (queues) and timestamps (times). Controllers, `ops/` and
`bench/` import it from here; nothing outside a controller's package imports the controller.
"""

from failover.api.annotations import (ADMITTED_FLAVOR_ANNOTATION, FAILOVER_ANNOTATION, FLEET_ANNOTATION,
                                      GAVE_UP_ANNOTATION, MAX_WAIT_ANNOTATION, MOVES_ANNOTATION,
                                      MULTIKUEUE_ORIGIN_LABEL, QUEUE_LABEL, SLICE_LOST_ANNOTATION, TPU_RESOURCE)
from failover.api.events import (LOSS_EVENT_REASON, MOVE_EVENT_REASON, RECOVERY_EVENT_REASON,
                                 SCALE_UP_FAILURE_REASONS, STOCKOUT_MESSAGE, stockout_since)
from failover.api.moves import (MEMBER_EVICTED, MEMBER_NOT_READY, MEMBER_SLICE_LOST, MEMBER_STOCKOUT, MOVED, MOVING,
                                PODS_READY_TIMEOUT, REACTIVATE, SLICE_LOST, STEP_BUSY, STOCKOUT,
                                WAIT_FOR_BACKOFF_RESET, FinishMove, Move, StartMove, move_history,
                                reactivation_step, with_move_recorded)
from failover.api.queues import Chain, Ladder, Rung, Step
from failover.api.records import GAVE_UP, GIVING_UP, LOST, RECOVERED, GiveUp, LostSlice
from failover.api.times import format_time, parse_time
from failover.api.views import WorkloadView

__all__ = [
    "ADMITTED_FLAVOR_ANNOTATION", "FAILOVER_ANNOTATION", "FLEET_ANNOTATION", "GAVE_UP_ANNOTATION",
    "MAX_WAIT_ANNOTATION", "MOVES_ANNOTATION", "MULTIKUEUE_ORIGIN_LABEL", "QUEUE_LABEL", "SLICE_LOST_ANNOTATION",
    "TPU_RESOURCE",
    "LOSS_EVENT_REASON", "MOVE_EVENT_REASON", "RECOVERY_EVENT_REASON", "SCALE_UP_FAILURE_REASONS",
    "STOCKOUT_MESSAGE", "stockout_since",
    "MEMBER_EVICTED", "MEMBER_NOT_READY", "MEMBER_SLICE_LOST", "MEMBER_STOCKOUT", "MOVED", "MOVING",
    "PODS_READY_TIMEOUT", "REACTIVATE", "SLICE_LOST", "STEP_BUSY", "STOCKOUT", "WAIT_FOR_BACKOFF_RESET",
    "FinishMove", "Move", "StartMove", "move_history", "reactivation_step", "with_move_recorded",
    "Chain", "Ladder", "Rung", "Step",
    "GAVE_UP", "GIVING_UP", "LOST", "RECOVERED", "GiveUp", "LostSlice",
    "format_time", "parse_time",
    "WorkloadView",
]
