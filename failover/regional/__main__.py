"""Run the failover controller: `python -m failover.regional`.

Configuration: the FAILOVER_* variables of its Deployment, as failover/config.py RegionalConfig reads them (each
one named and explained there; every one required: one missing or malformed ends it, exit status 2, naming it).
KUBECONFIG outside a cluster; in a Pod the ServiceAccount's credentials are used. It serves /healthz and /metrics.
"""

from __future__ import annotations

import sys

from failover.config import RegionalConfig
from failover.regional.controller import Controller
from failover.regional.climb import possible_climbs
from failover.regional.decisions import possible_moves
from failover.regional.goodput import GoodputController
from failover.regional.probing import ProbeController
from failover.runtime.cluster_client import api_client
from failover.runtime.manager import Manager, configured
from failover.runtime.metrics import Metrics


def main() -> int:
    config = configured("failover.regional", RegionalConfig.from_env)
    metrics = Metrics()
    metrics.declare_moves(possible_moves(config.chain))
    metrics.declare_climbs(possible_climbs(config.chain, config.climb_back))
    manager = Manager(api_client(), metrics=metrics, health_port=config.health_port, metrics_port=config.metrics_port)
    controller = manager.add(Controller(manager.api_client, config.chain, config.stockout_grace, metrics=metrics,
                                        cache=manager.cache, workers=config.workers,
                                        resync_seconds=config.resync.total_seconds(), policy=config.maintenance,
                                        climb_policy=config.climb_back))
    manager.add(ProbeController(manager.api_client, manager.cache, controller.free, config.probes, metrics,
                                resync_seconds=config.resync.total_seconds()))
    manager.add(GoodputController(manager.cache, config.chain, metrics))
    manager.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
