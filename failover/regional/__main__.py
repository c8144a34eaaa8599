"""Run the failover controller: `python -m failover.regional`.

Configuration (environment, set by the stack's Deployment):
    FAILOVER_CHAIN            JSON list of {flavor, clusterQueue, localQueue, admissionCheck}, rung 0 first
    FAILOVER_GRACE_SECONDS    how long the autoscaler must report no capacity before the early move (default 180)
    FAILOVER_RESYNC_SECONDS   seconds between resyncs, the safety net that queues every Workload again (default
                              300); changes are handled as the watches deliver them
    FAILOVER_WORKERS          Workloads reconciled at once (default 4; a move waits up to 10 s for Kueue)
    FAILOVER_HEALTH_PORT      /healthz port (default 8080; 0 turns it off)
    FAILOVER_METRICS_PORT     Prometheus /metrics port (default 9090; 0 turns it off)
    KUBECONFIG                outside a cluster; in a Pod the ServiceAccount's credentials are used
"""

from __future__ import annotations

import datetime
import logging
import os
import sys

from failover.regional.controller import Controller
from failover.regional.decisions import possible_moves
from failover.api import Chain
from failover.runtime.cluster_client import api_client
from failover.runtime.manager import Manager
from failover.runtime.metrics import Metrics

log = logging.getLogger("tpu-fallback.failover")


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    chain = Chain.from_json(os.environ["FAILOVER_CHAIN"])
    grace = datetime.timedelta(seconds=float(os.environ.get("FAILOVER_GRACE_SECONDS", "180")))
    resync = float(os.environ.get("FAILOVER_RESYNC_SECONDS", "300"))
    workers = int(os.environ.get("FAILOVER_WORKERS", "4"))
    metrics = Metrics()
    metrics.declare_moves(possible_moves(chain))
    metrics_port = int(os.environ.get("FAILOVER_METRICS_PORT", "9090"))
    port = int(os.environ.get("FAILOVER_HEALTH_PORT", "8080"))
    client = api_client()
    manager = Manager(client, metrics=metrics, health_port=port, metrics_port=metrics_port,
                      on_event=lambda resource: metrics.watch_events.labels(resource).inc(),
                      on_error=lambda _error: metrics.errors.inc())
    controller = manager.add(Controller(client, chain, grace, metrics=metrics, cache=manager.cache))
    controller.workers, controller.resync_seconds = workers, resync
    manager.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
