"""The fleet's ladder controller (plan C, README "The fleet's ladder"): on a fleet's manager, moves a job to the next
step of the ladder when the member of its step evicted it, reports a stockout for it, or its step is busy, or the job
lost its slice there (at the last step: requeues it there); and gives a job up when no step has admitted it within
its maximum wait: `python -m failover.ladder`.

A step is a manager LocalQueue whose ClusterQueue has its own MultiKueue check and config (one member's reservation,
on-demand or Spot rung; the last step: DWS in every member). MultiKueue re-dispatches a job a member evicted to the
same step, forever (a stockout after admission: the member's podsReadyTimeout, every ~33 s). This controller reads
that from level signals that survive a restart: the step's check is `Retry`, or its `retryCount` is at least 1
(Kueue counts a check's retries per check, so a new step starts a new entry: pkg/workload/evict/evict.go L220-239,
and keeps the count when the check turns Ready again: pkg/workload/patching/patching.go L78-103). It then moves
the job with route D on the manager's Workload, in the order measured clean on Kueue 0.19.2 on the test tier:
deactivate; mark the manager's RayJob `Suspended` if it looks active (Kueue releases the quota only once the RayJob's
status, copied from the member, is inactive: with the member cut off that never happens); wait until quota is released
(`spec.queueName` is immutable before, CEL); relabel the RayJob and repoint the Workload; wait until
`status.admissionChecks` is exactly the new step's check (reactivated sooner, Kueue may reserve quota before it has
swapped the checks, and MultiKueue dispatches with the old step's config: a stray copy in 2 of 46 moves measured);
reactivate.
Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/controller/jobs/rayjob/rayjob_controller.go#L107-L110
Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/apis/kueue/v1beta2/workload_types.go#L1195
Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/controller/admissionchecks/multikueue/workload.go

Early path: a one-member step's member reports that GKE's autoscaler has no capacity for the job's pods ("GCE out
of resources", the regional failover controller's test: failover/api/events.py stockout_since) while the copy there
is admitted. The manager reads it in the member itself, through the kubeconfig Secret MultiKueue uses: a watch of the
Warning Events about pods in the fleet's namespace there, and the member's RayJob for its RayCluster's name (the
pods are named after it). Once the member's stockout grace period (published with its steps) has passed since the
first such Event of this admission, the job moves on (reason MemberStockout), without waiting for the member's
podsReadyTimeout. The member's own failover controller never touches the fleet's copies.

A lost slice: the member running a job (a one-member step's member, or at the last step the one MultiKueue names
in the Workload's `status.clusterName`) records on its RayJob that the job lost its slice (its own failover
controller, failover/slices.py, with a Warning Event `SliceLost`). Once that member's recovery wait is over and the
slice is not back, the job moves to the next step (reason MemberSliceLost); at the last step, where there is none,
it is requeued there (a move to the same step, route D without relabel and repoint): its copy in that member goes
with the deactivation, and MultiKueue asks every member again (DWS: a new ProvisioningRequest in each).

Giving up (Kueue has none: kubernetes-sigs/kueue#8602): a job not admitted by any member `FLEET_MAX_WAIT_SECONDS`
(or its RayJob's `tpu-fallback/max-wait`: a duration, or `none`) after its submission, or after it last ran, is
deactivated (`spec.active=false` on the manager's Workload: MultiKueue deletes its copies and their
ProvisioningRequests), with the annotation `tpu-fallback/gave-up` on the RayJob (why, when, at which step) and a
Warning Event `GaveUp`. Written with the deactivation on the Workload (`tpu-fallback/ladder-give-up`, taken off once
the RayJob records it) and finished by any pass, as a move is.

The move is written on the manager's Workload in the same write as its deactivation (WORKLOAD_MOVE_ANNOTATION:
no moment when a move is decided and the job is still active at the step it leaves), then on the RayJob (the
regional controller's annotation and history, failover/api/moves.py); each write is guarded by the resourceVersion it
was decided on, and each step of the move checks first: a restart, `kill -9` included, finishes the move it finds
and never starts a second one for a hop.

Configuration: the FLEET_* and LADDER_* variables of its Deployment (infra/fleet.py), as failover/config.py
LadderConfig reads them (each one named and explained there; every one required but FLEET_MAX_WAIT_SECONDS: one
missing or malformed ends it, exit status 2, naming it). KUBECONFIG outside a cluster; in a Pod the ServiceAccount's
credentials are used. It serves /healthz and /metrics.
"""

from __future__ import annotations

import sys

from failover.config import LadderConfig
from failover.ladder.controller import LadderController
from failover.runtime.cluster_client import api_client
from failover.runtime.manager import Manager, configured
from failover.runtime.members import MemberCaches  # the kubeconfig Secrets MultiKueue reads
from failover.runtime.metrics import LadderMetrics


def main() -> int:
    config = configured("failover.ladder", LadderConfig.from_env)
    metrics = LadderMetrics()
    api = api_client()
    manager = Manager(api, metrics=metrics, health_port=config.health_port, metrics_port=config.metrics_port,
                      members=MemberCaches.from_secrets(api, config.members, config.secrets_namespace)
                      if config.members else None)  # none: no early path
    manager.add(LadderController(api, config.ladder, config.namespace, config.step_wait, max_wait=config.max_wait,
                                 members=manager.members, cache=manager.cache, metrics=metrics,
                                 workers=config.workers, resync_seconds=config.resync.total_seconds(),
                                 period_seconds=config.period.total_seconds(), climb_policy=config.climb_back))
    manager.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
