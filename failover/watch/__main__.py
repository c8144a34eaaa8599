"""The fleet watch (plan C), on a fleet's manager cluster: where each fleet job really runs, said on its RayJob.

Kueue 0.19.2's MultiKueue records where a job was admitted (`status.clusterName` of the manager's Workload) and
cannot change that record once set, nor set it to a member it did not nominate. Measured on the tier (README
"Plan C"): when the admitting member is cut off, the manager dispatches again after `workerLostTimeout` and
another member runs the job; when the first member comes back, Kueue keeps its older admission, deletes the newer
run, and keeps naming the other member, or none. The job then runs where the manager's record says it does not.

The watch keeps, through the runtime's cache (failover/runtime/), the manager's Workloads, RayJobs and
MultiKueueClusters and, in every member it can reach (through the kubeconfig Secrets MultiKueue uses, re-read every period), the copies
and RayJobs this manager made; every change queues the jobs it touches. Per job it writes what is true on the
manager's RayJob (annotation `tpu-fallback/fleet`: state, where it runs, Kueue's record, members that do not answer or
cannot admit it) and an Event when that changes: `FleetRunning`, `FleetRecordStale`, `FleetRunningTwice` (a
partition's overlap; each run checkpoints under its own run id), `FleetMemberLost`, `FleetMemberCannotAdmit`,
`FleetWaiting`, `FleetFinished`. Its writes to what Kueue reads (README "Plan C"; measured on the tier):
- an evicted job's RayJob status is marked `Suspended` when Kueue waits for it to stop, cannot see it, and no member
  that answers runs it (`may_unblock`, Event `FleetEvictionUnblocked`): never where it runs, so never after a return;
- Kueue's record is repaired when Kueue adopted a returning member's copy but cannot record it (`record_to_repair`,
  a server-side apply of the Workload's status as Kueue's own field manager, Event `FleetRecordRepaired`).
And one in the members: a copy and its run that an older step of the fleet's ladder left in a member cut off while
the ladder moved the job on are deleted once the member answers again (`stale_step_copies`, Event
`FleetStaleStepRemoved`): Kueue no longer looks there, and they would run next to the run Kueue records.

    python -m failover.watch

Configuration: the FLEET_* variables of its Deployment (infra/fleet.py), as failover/config.py FleetWatchConfig reads
them (each one named and explained there; every one required: one missing or malformed ends it, exit status 2, naming
it). It serves /healthz and /metrics.
"""

from __future__ import annotations

import sys

from failover.config import FleetWatchConfig
from failover.runtime.cluster_client import api_client  # the same credentials rule as the failover controller
from failover.runtime.manager import Manager, configured
from failover.runtime.members import MemberCaches
from failover.runtime.metrics import FleetMetrics
from failover.watch.controller import FleetWatch
from failover.watch.decisions import STATES


def main() -> int:
    config = configured("failover.watch", FleetWatchConfig.from_env)
    metrics = FleetMetrics(STATES)
    api = api_client()
    manager = Manager(api, metrics=metrics, health_port=config.health_port, metrics_port=config.metrics_port,
                      members=MemberCaches.from_secrets(api, config.members, config.secrets_namespace))
    manager.add(FleetWatch(api, manager.members, config.origin, metrics=metrics, cache=manager.cache,
                           resync_seconds=config.resync.total_seconds(), period_seconds=config.period.total_seconds()))
    manager.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
