"""The controller's Prometheus metrics: what it moved and why, how long jobs waited, each job's scheduling goodput,
and its own health; the fleet watch's (failover/watch/): what each pass found, which members answer, how long a pass
takes; and the fleet ladder's (failover/ladder/): what it moved and gave up.

Names are fixed: the stacks' Cloud Monitoring dashboards and alert policies (infra/monitoring.py) query them with
PromQL. Served at /metrics on FAILOVER_METRICS_PORT, FLEET_METRICS_PORT or LADDER_METRICS_PORT (plain HTTP, scraped
by a PodMonitoring inside the cluster).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

# Seconds to TPUs span the early path's grace (minutes) to a DWS queue's wait (hours).
WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 43200, 86400)
# A fleet watch pass lists every member with a 5 s timeout each (failover/watch/ REQUEST_TIMEOUT_SECONDS).
PASS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60)


class _Served:
    registry: CollectorRegistry

    def serve(self, port: int) -> None:
        start_http_server(port, addr="0.0.0.0", registry=self.registry)


class Metrics(_Served):
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.moves = Counter("tpu_fallback_moves", "Jobs moved down the queue chain.",
                             ["from_flavor", "to_flavor", "reason"], registry=r)
        self.move_delay = Histogram(
            "tpu_fallback_move_delay_seconds",
            "Seconds from admission (PodsReadyTimeout), the first stockout signal (Stockout) or the slice's loss "
            "(SliceLost) to the move's first write.", ["reason"], buckets=WAIT_BUCKETS, registry=r)
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
        self.slices_lost = Counter("tpu_fallback_slices_lost", "Running jobs that lost their slice, by flavor.",
                                   ["flavor"], registry=r)
        self.workloads_watched = Gauge("tpu_fallback_workloads_watched", "Workloads in the controller's cache.",
                                       registry=r)
        self.climbs = Counter("tpu_fallback_climbs",
                              "Jobs moved back up the queue chain (fallback.climbBack), once done.",
                              ["from_flavor", "to_flavor"], registry=r)
        # The capacity probes' (failover/regional/probing.py): created, and found (placed: the rung had a slice).
        self.probes = Counter("tpu_fallback_capacity_probes",
                              "Capacity probes on a rung a waiting job could climb to, by outcome (created, found).",
                              ["flavor", "outcome"], registry=r)
        # Computed at each scrape (failover/regional/free_slices.py): a slice nobody uses while a job that could use
        # it waits below is billed for nothing; the climb onto it takes seconds, so a lasting value is a fault.
        self.idle_chips_waiting = Gauge(
            "tpu_fallback_idle_tpu_chips_while_waiting",
            "TPU chips of a rung's idle slice while a job that fits it waits below that rung.", ["flavor"],
            registry=r)
        # The goodput controller's (failover/regional/goodput.py): one series per unfinished job of the chain (its
        # breakdown is `ops status -o json`'s), and per namespace the job-seconds of each state on each rung. Not
        # `namespace` and `job`: the scrape's own target labels (the controller's), which would rename these.
        self.job_goodput = Gauge(
            "tpu_fallback_job_scheduling_goodput",
            "Each unfinished job's scheduling goodput: of the time since it was submitted, the share it ran on a "
            "whole slice (0 to 1).", ["job_namespace", "job_name"], registry=r)
        self.scheduling_seconds = Counter(
            "tpu_fallback_scheduling_seconds",
            "Seconds the jobs of a namespace spent in each state (quota_wait, capacity_wait, starting, running, "
            "broken_slice, moving, unrecorded) on each rung, summed over the jobs, since the controller started.",
            ["job_namespace", "state", "rung"], registry=r)

    def declare_moves(self, moves: Iterable[tuple[str, str, str]]) -> None:
        """Every (from, to, reason) this controller can count, at 0 from its start. A labelled counter is otherwise
        born at 1 by its first move, and `increase()` (or Managed Prometheus, which drops a counter's first sample)
        never sees that move: an alert on moves would miss the first of each kind after every start."""
        for from_flavor, to_flavor, reason in moves:
            self.moves.labels(from_flavor, to_flavor, reason)

    def declare_climbs(self, climbs: Iterable[tuple[str, str]]) -> None:
        """Every (from, to) a climb back can have, at 0 from the start (as declare_moves, for the same reason)."""
        for from_flavor, to_flavor in climbs:
            self.climbs.labels(from_flavor, to_flavor)


class FleetMetrics(_Served):
    """The fleet watch's: set after each pass, so a scrape shows the last pass whole."""

    def __init__(self, states: tuple[str, ...], registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.states = states
        self.findings = Gauge("tpu_fallback_fleet_findings", "Fleet jobs per finding of the last pass.", ["state"],
                              registry=r)
        self.member_reachable = Gauge(
            "tpu_fallback_fleet_member_reachable",
            "1 when the member answered the last pass (through the kubeconfig MultiKueue uses), else 0.", ["member"],
            registry=r)
        self.pass_duration = Histogram("tpu_fallback_fleet_pass_duration_seconds",
                                       "Seconds one pass over every fleet job and member took.",
                                       buckets=PASS_BUCKETS, registry=r)
        self.pass_failures = Counter("tpu_fallback_fleet_pass_failures",
                                     "Passes that failed (the manager did not answer); retried next period.",
                                     registry=r)
        self._members_shown: set[str] = set()

    def record_pass(self, states: Iterable[str], reachable: Mapping[str, bool], seconds: float) -> None:
        """One pass: the jobs per state (every known state, 0 included, so a series never goes missing), each
        member's reachability, and the pass's duration."""
        counts = collections.Counter(states)
        for state in self.states:
            self.findings.labels(state=state).set(counts.get(state, 0))
        self.record_members(reachable)
        self.pass_duration.observe(seconds)

    def record_members(self, reachable: Mapping[str, bool]) -> None:
        """Each member's answer, written every period whether or not a job was evaluated (an idle fleet's member
        that stops answering must still show 0); a member no longer in the fleet loses its series."""
        for member in self._members_shown - set(reachable):
            self.member_reachable.remove(member)
        for member, answered in reachable.items():
            self.member_reachable.labels(member=member).set(1 if answered else 0)
        self._members_shown = set(reachable)


class LadderMetrics(_Served):
    """The fleet's ladder's (failover/ladder/): what it moved and gave up, and its own health. Served at /metrics on
    LADDER_METRICS_PORT."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.moves = Counter("tpu_fallback_ladder_moves",
                             "Fleet jobs moved to another step of the ladder (or requeued at the last), once done.",
                             ["from_step", "to_step", "reason"], registry=r)
        self.climbs = Counter("tpu_fallback_ladder_climbs",
                              "Fleet jobs moved back up to an earlier step of the ladder (climbing back), once done.",
                              ["from_step", "to_step"], registry=r)
        self.give_ups = Counter("tpu_fallback_ladder_give_ups",
                                "Fleet jobs given up (no member admitted them within their maximum wait).", ["step"],
                                registry=r)
        self.watch_events = Counter("tpu_fallback_ladder_watch_events",
                                    "Changes received from the manager's API server.", ["resource"], registry=r)
        self.reconciles = Counter("tpu_fallback_ladder_reconciles", "Fleet Workloads reconciled.", registry=r)
        self.resyncs = Counter("tpu_fallback_ladder_resyncs", "Periodic passes over every fleet Workload.", registry=r)
        self.errors = Counter("tpu_fallback_ladder_errors", "Reconciles, watches or periods that failed (retried).",
                              registry=r)
