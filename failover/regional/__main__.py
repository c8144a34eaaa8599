"""Run the failover controller: `python -m failover.regional`.

Configuration (environment, set by the stack's Deployment: failover/config.py RegionalConfig, every variable
required; one missing or malformed stops it with exit status 2, naming it):
    FAILOVER_CHAIN            JSON list of {flavor, clusterQueue, localQueue, admissionCheck, recoverySeconds}, rung
                              0 first
    FAILOVER_GRACE_SECONDS    how long the autoscaler must report no capacity before the early move
    FAILOVER_RESYNC_SECONDS   seconds between resyncs, the safety net that queues every Workload again; changes are
                              handled as the watches deliver them
    FAILOVER_WORKERS          Workloads reconciled at once (a move waits up to 10 s for Kueue)
    FAILOVER_HEALTH_PORT      /healthz port (0 turns it off)
    FAILOVER_METRICS_PORT     Prometheus /metrics port (0 turns it off)
    KUBECONFIG                outside a cluster; in a Pod the ServiceAccount's credentials are used
"""

from __future__ import annotations

import sys

from failover.config import RegionalConfig
from failover.regional.controller import Controller
from failover.regional.decisions import possible_moves
from failover.runtime.cluster_client import api_client
from failover.runtime.manager import Manager, configured
from failover.runtime.metrics import Metrics


def main() -> int:
    config = configured("failover.regional", RegionalConfig.from_env)
    metrics = Metrics()
    metrics.declare_moves(possible_moves(config.chain))
    manager = Manager(api_client(), metrics=metrics, health_port=config.health_port, metrics_port=config.metrics_port)
    manager.add(Controller(manager.api_client, config.chain, config.stockout_grace, metrics=metrics,
                           cache=manager.cache, workers=config.workers, resync_seconds=config.resync.total_seconds()))
    manager.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
