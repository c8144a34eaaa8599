"""The controller's Prometheus metrics: what it moved and why, how long jobs waited, and its own health.

Names are fixed: the stack's Cloud Monitoring dashboard (infra/monitoring.py) queries them with PromQL.
Served on FAILOVER_METRICS_PORT at /metrics (plain HTTP, scraped by a PodMonitoring inside the cluster).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

# Seconds to TPUs span the early path's grace (minutes) to a DWS queue's wait (hours).
WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 43200, 86400)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.moves = Counter("tpu_fallback_moves", "Jobs moved down the queue chain.",
                             ["from_flavor", "to_flavor", "reason"], registry=r)
        self.move_delay = Histogram(
            "tpu_fallback_move_delay_seconds",
            "Seconds from admission (PodsReadyTimeout) or the first stockout signal (Stockout) to the move's first "
            "write.", ["reason"], buckets=WAIT_BUCKETS, registry=r)
        self.admission_wait = Histogram(
            "tpu_fallback_admission_wait_seconds",
            "Seconds a Workload waited for quota, from creation or its last requeue, by the flavor it got.",
            ["flavor"], buckets=WAIT_BUCKETS, registry=r)
        self.check_outcomes = Counter(
            "tpu_fallback_admission_check_outcomes",
            "Admission check results seen on Workloads (ProvisioningRequest: Ready is provisioned, Retry a failed "
            "attempt, Rejected given up).", ["admission_check", "state"], registry=r)
        self.watch_events = Counter("tpu_fallback_watch_events", "Changes received from the API server.",
                                    ["resource"], registry=r)
        self.reconciles = Counter("tpu_fallback_reconciles", "Workloads reconciled.", registry=r)
        self.resyncs = Counter("tpu_fallback_resyncs", "Periodic passes over every Workload (the safety net).",
                               registry=r)
        self.errors = Counter("tpu_fallback_errors", "Reconciles or watches that failed (retried).", registry=r)
        self.workloads_watched = Gauge("tpu_fallback_workloads_watched", "Workloads in the controller's cache.",
                                       registry=r)

    def serve(self, port: int) -> None:
        start_http_server(port, addr="0.0.0.0", registry=self.registry)
