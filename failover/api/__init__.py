"""The vocabulary the programs share with each other, with `ops status`, the benchmarks and the tests: the labels and
annotations they write (annotations), the Events (events), the records kept on a RayJob (moves, records, ahead: a
disruption seen coming), what they read of a Workload (views), a checkpoint request to a running job (checkpoints), a
move that checkpoints first (checkpoint_moves: a climb's, a move ahead of a disruption's), a climb back up the ladder
and the free-capacity signal it reads (climbs), a job's time account (goodput), the queues they are given (queues) and
timestamps (times). Controllers, `ops/` and `bench/` import it from here; nothing outside a controller's package
imports the controller.
"""

from failover.api.ahead import ACTIONS, CHECKPOINT, MAINTENANCE, MOVE, NOTHING, RUN_END, Ahead
from failover.api.annotations import (ACTIVE_MAINTENANCE_LABEL, ADMITTED_FLAVOR_ANNOTATION, AHEAD_ANNOTATION,
                                      CHECKPOINT_REQUEST_ANNOTATION, FAILOVER_ANNOTATION, FLEET_ANNOTATION,
                                      GAVE_UP_ANNOTATION, MAINTENANCE_ONGOING, MAX_RUN_ANNOTATION, MAX_WAIT_ANNOTATION,
                                      MOVES_ANNOTATION, MULTIKUEUE_ORIGIN_LABEL, QUEUE_LABEL,
                                      SCHEDULED_MAINTENANCE_LABEL, SLICE_LOST_ANNOTATION, TPU_RESOURCE)
from failover.api.checkpoints import CheckpointRequest
from failover.api.climbs import (CAPACITY_LABEL, CHECKPOINTING, CLIMB_BACK, CLIMB_BACK_WAITING, CLIMB_EVENT_REASON,
                                 CLIMBS, ClimbPolicy)
from failover.api.events import (AHEAD_EVENT_REASON, LOSS_EVENT_REASON, MOVE_EVENT_REASON, RECOVERY_EVENT_REASON,
                                 SCALE_UP_FAILURE_REASONS, STOCKOUT_MESSAGE, stockout_since)
from failover.api.moves import (DISRUPTION_AHEAD, MEMBER_EVICTED, MEMBER_NOT_READY, MEMBER_SLICE_LOST,
                                MEMBER_STOCKOUT, MOVED, MOVING, PODS_READY_TIMEOUT, REACTIVATE, SLICE_LOST, STEP_BUSY,
                                STOCKOUT, WAIT_FOR_BACKOFF_RESET, FinishMove, Move, StartMove, move_history,
                                reactivation_step, with_move_recorded)
from failover.api.names import (CLUSTER_QUEUE, CONTROLLER_NAME, CONTROLLER_NAMESPACE, DEFAULT_FLAVOR,
                                DWS_ADMISSION_CHECK, FLEET_LADDER_NAME, FLEET_WATCH_NAME, KUEUE_API_VERSION,
                                KUEUE_NAMESPACE, KUEUE_RELEASE, LOCAL_QUEUE, MANAGER_CONFIG_KEY, MANAGER_CONFIG_MAP,
                                MULTIKUEUE_CONTROLLER, NODE_POOL_LABEL, PROVISIONING_CLASS,
                                PROVISIONING_CONTROLLER)
from failover.api.goodput import STATES, Account, JobTimes, Segment, account, clipped
from failover.api.queues import Chain, Ladder, Rung, Step
from failover.api.records import GAVE_UP, GIVING_UP, LOST, RECOVERED, GiveUp, LostSlice
from failover.api.times import format_time, parse_time
from failover.api.views import WorkloadView

__all__ = [
    "ACTIONS", "CHECKPOINT", "MAINTENANCE", "MOVE", "NOTHING", "RUN_END", "Ahead",
    "ACTIVE_MAINTENANCE_LABEL", "AHEAD_ANNOTATION", "MAINTENANCE_ONGOING", "MAX_RUN_ANNOTATION",
    "SCHEDULED_MAINTENANCE_LABEL",
    "ADMITTED_FLAVOR_ANNOTATION", "CHECKPOINT_REQUEST_ANNOTATION", "FAILOVER_ANNOTATION", "FLEET_ANNOTATION",
    "GAVE_UP_ANNOTATION", "MAX_WAIT_ANNOTATION", "MOVES_ANNOTATION", "MULTIKUEUE_ORIGIN_LABEL", "QUEUE_LABEL",
    "SLICE_LOST_ANNOTATION", "TPU_RESOURCE",
    "CheckpointRequest",
    "CAPACITY_LABEL", "CHECKPOINTING", "CLIMB_BACK", "CLIMB_BACK_WAITING", "CLIMB_EVENT_REASON", "CLIMBS",
    "NODE_POOL_LABEL", "ClimbPolicy",
    "AHEAD_EVENT_REASON", "LOSS_EVENT_REASON", "MOVE_EVENT_REASON", "RECOVERY_EVENT_REASON", "SCALE_UP_FAILURE_REASONS",
    "STOCKOUT_MESSAGE", "stockout_since",
    "DISRUPTION_AHEAD", "MEMBER_EVICTED", "MEMBER_NOT_READY", "MEMBER_SLICE_LOST", "MEMBER_STOCKOUT", "MOVED", "MOVING",
    "PODS_READY_TIMEOUT", "REACTIVATE", "SLICE_LOST", "STEP_BUSY", "STOCKOUT", "WAIT_FOR_BACKOFF_RESET",
    "FinishMove", "Move", "StartMove", "move_history", "reactivation_step", "with_move_recorded",
    "CLUSTER_QUEUE", "CONTROLLER_NAME", "CONTROLLER_NAMESPACE", "DEFAULT_FLAVOR", "DWS_ADMISSION_CHECK",
    "FLEET_LADDER_NAME", "FLEET_WATCH_NAME", "KUEUE_API_VERSION", "KUEUE_NAMESPACE", "KUEUE_RELEASE", "LOCAL_QUEUE",
    "MANAGER_CONFIG_KEY", "MANAGER_CONFIG_MAP", "MULTIKUEUE_CONTROLLER", "PROVISIONING_CLASS", "PROVISIONING_CONTROLLER",
    "STATES", "Account", "JobTimes", "Segment", "account", "clipped",
    "Chain", "Ladder", "Rung", "Step",
    "GAVE_UP", "GIVING_UP", "LOST", "RECOVERED", "GiveUp", "LostSlice",
    "format_time", "parse_time",
    "WorkloadView",
]
