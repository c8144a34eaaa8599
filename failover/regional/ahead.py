"""The failover controller's part for disruptions seen coming (failover/maintenance.py decides): a running job's
record (the RayJob's AHEAD_ANNOTATION, an Event, the metric), the checkpoint request on its TPU pods
(failover/checkpoints.py), and with `fallback.maintenance.action: move` the move ahead of the disruption."""

from __future__ import annotations

import datetime
import logging

from prometheus_client import Counter

from failover import maintenance
from failover.api import AHEAD_ANNOTATION, AHEAD_EVENT_REASON, FAILOVER_ANNOTATION, Ahead
from failover.regional.watches import CachedWorkload
from failover.runtime.writes import rayjob_event

log = logging.getLogger("tpu-fallback.failover")


def disruptions_counter(metrics) -> Counter:
    """tpu_fallback_disruptions_ahead_total{kind, flavor}: disruptions seen coming, on the controller's registry."""
    counter = getattr(metrics, "disruptions_ahead", None)
    if counter is None:
        counter = metrics.disruptions_ahead = Counter(
            "tpu_fallback_disruptions_ahead", "Disruptions of a running job's slice seen coming (a host's scheduled "
            "maintenance, a DWS run's end), by kind and flavor.", ["kind", "flavor"], registry=metrics.registry)
    return counter


class AheadOfDisruptions:
    """Mixed into the Controller (failover/regional/controller.py): `_reconcile_ahead` for one running job."""

    policy: maintenance.Policy

    def _reconcile_ahead(self, cached: CachedWorkload, now: datetime.datetime) -> int | None:
        """None when there is nothing to do now (the key queued again for when there will be); else the actions."""
        view = cached.view
        if not (view.admitted and view.pods_ready_since and view.tpu_hosts and not view.finished
                and view.multikueue_origin is None) or self._losing(view):
            return None  # a fleet's copy is the fleet's to move (its ladder); a lost slice is the loss's to move
        rung = self.chain.index_of_flavor(view.flavor)
        seen = self.seen.job(view.namespace, view.rayjob)
        if rung is None or seen is None:
            return None
        hosts = self.seen.hosts((view.namespace, seen.cluster) if seen.cluster else None)
        nodes, _gone = self.seen.node_views()
        found = maintenance.seen_ahead(hosts.values(), nodes,
                                       maintenance.run_end(view, self.chain.rungs[rung]))
        target = None
        if self.policy.action == maintenance.MOVE:
            target = maintenance.move_target(self.chain, view.flavor, view.tpu_chips, self.seen.free_tpus())
        recorded = Ahead.from_json(seen.ahead)
        asked = {pod: host.checkpoint_request for pod, host in hosts.items()}
        action, again = maintenance.decide_ahead(view, recorded, found, self.policy, asked, target, now)
        key = (view.namespace, cached.meta["name"])
        if again is not None:
            self.queue.add(key, delay=max((again - now).total_seconds(), 0.0) + 0.05)
        if action is None:
            return None
        job = self._fresh_rayjob(view.namespace, view.rayjob, AHEAD_ANNOTATION, Ahead.from_json, recorded, key)
        if job is None:
            return 0
        if isinstance(action, maintenance.ClearAhead):
            self._patch(self.rayjobs, job, {"metadata": {"annotations": {AHEAD_ANNOTATION: None}}})
            log.info("%s/%s: no disruption ahead any more (%s)", view.namespace, view.rayjob, recorded.message())
            return 1
        if isinstance(action, maintenance.RecordAhead):
            ahead = action.ahead
            self._patch(self.rayjobs, job, {"metadata": {"annotations": {AHEAD_ANNOTATION: ahead.to_json()}}})
            if not ahead.quiet:  # a DWS run's end far off is recorded for `ops status`, announced later
                disruptions_counter(self.metrics).labels(ahead.kind, ahead.flavor).inc()
                rayjob_event(self.core, job["metadata"], self.component, AHEAD_EVENT_REASON, ahead.message(),
                             "Normal", now, once=f"{ahead.kind}/{ahead.at}/{ahead.host}/{ahead.flavor}")
            log.info("%s/%s: %s%s", view.namespace, view.rayjob, ahead.message(), " (not announced yet)"
                     if ahead.quiet else "")
            return 1
        if isinstance(action, maintenance.AskCheckpoint):
            if action.ahead != recorded:  # the record first: a restart asks the same request
                self._patch(self.rayjobs, job, {"metadata": {"annotations": {
                    AHEAD_ANNOTATION: action.ahead.to_json()}}})
            asked_now = self._ask_checkpoint(view.namespace, action.pods, action.request)
            log.info("%s/%s: checkpoint request %s on %d pods, ahead of %s", view.namespace, view.rayjob,
                     action.request.id, asked_now, action.ahead.message())
            return 1
        move = action.move  # MoveAhead: recorded with the move, carried out as any move (one run at a time)
        self._patch(self.rayjobs, job, {"metadata": {"annotations": {
            AHEAD_ANNOTATION: action.ahead.to_json(), FAILOVER_ANNOTATION: move.to_json()}}})
        log.info("%s/%s: starting a move to %s ahead of %s", view.namespace, view.rayjob, move.to_flavor,
                 recorded.message())
        self._finish(move, cached.meta["name"], view.namespace, view.queue_name)
        return 1
