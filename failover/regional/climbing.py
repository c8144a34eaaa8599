"""The failover controller's part for climbing back (failover/regional/climb.py decides, free_slices.py keeps the
signal): a running job below its chain's first rung gets a climb's Move written `checkpointing`, its TPU pods are
asked to save (failover/checkpoints.py), and once the save is taken as done the Move turns `moving` and the
controller's own move carries it out (controller.py `_finish`: deactivate, relabel, repoint, reactivate; one run at a
time). Called off, the record before it is put back and the job keeps running where it is. A job that waits below
(holding no quota, or a DWS request not provisioned yet) gets its climb's Move written `moving` at once: nothing to
save."""

from __future__ import annotations

import datetime
import logging

from failover import maintenance
from failover.api import FAILOVER_ANNOTATION, MOVING, Move, WorkloadView
from failover.api import checkpoint_moves
from failover.api.checkpoints import pods_to_ask
from failover.api.climbs import CHECKPOINTING, ClimbPolicy
from failover.regional import climb
from failover.regional.free_slices import FreeSlices
from failover.regional.watches import CachedJob, CachedWorkload

log = logging.getLogger("tpu-fallback.failover")


class ClimbingBack:
    """Mixed into the Controller (failover/regional/controller.py): `_reconcile_climb` for one Workload."""

    climb_policy: ClimbPolicy
    free: FreeSlices

    def _climb_facts(self, view: WorkloadView, seen: CachedJob) -> climb.JobFacts:
        hosts = self.seen.hosts((view.namespace, seen.cluster) if seen.cluster else None)
        rung = self.chain.index_of_flavor(view.flavor)
        return climb.JobFacts(Move.from_json(seen.move), seen.history, self._losing(view),
                              {pod: host.checkpoint_request for pod, host in hosts.items()},
                              maintenance.run_end(view, self.chain.rungs[rung]) if rung is not None else None)

    def _others_hold_nothing(self, key) -> bool:
        """Whether another job waits below its chain's first rung holding no quota (climb.decide_climb_waiting)."""
        return any(other != key and (cached := self.seen.workloads.get(other)) is not None
                   and not (cached.view.admitted and cached.view.pods_ready_since) and not cached.view.quota_reserved
                   for other, _rung in self.free.rungs_below())

    def _reconcile_climb(self, cached: CachedWorkload, now: datetime.datetime) -> int:
        """A climb's next step, or whether one starts; the actions taken. The key is queued again for the time the
        rules say to look (the settle time's end, a save's end)."""
        view, key = cached.view, (cached.view.namespace, cached.meta["name"])
        seen = self.seen.job(view.namespace, view.rayjob)
        pending = Move.from_json(seen.move) if seen is not None else None
        need = climb.Need(view.tpu_chips, view.tpu_hosts)
        if pending is not None and pending.state == CHECKPOINTING:
            # Carried on (or called off) even with climbing back turned off since: no rung is free then.
            return self._climbing(cached, self._climb_facts(view, seen), need, now)
        if seen is None:
            return 0
        running = view.admitted and view.pods_ready_since
        if running and not self.climb_policy.enabled:
            return 0  # climbing back off: a running job stays; a waiting one still goes up (nothing to lose)
        if not running and climb.waiting_rung(self.chain, view, bool(seen.history)) is None:
            return 0  # most Workloads: nothing more to read
        facts = self._climb_facts(view, seen)
        free = lambda flavor: self.free.free_since(flavor, need)  # noqa: E731
        if running:
            decided = climb.decide_climb(self.chain, self.climb_policy, view, facts, free, self.free.last_failure, now)
        else:
            decided = climb.decide_climb_waiting(self.chain, self.climb_policy, view, facts, free,
                                                 self.free.last_failure, now, self._others_hold_nothing(key))
            if isinstance(decided, climb.Climb) and not self.free.claim(decided.move.to_flavor, key, need):
                decided = climb.NotYet(self.free.claims_end(decided.move.to_flavor))  # another climb took it
        if isinstance(decided, climb.NotYet):
            if decided.at is not None:
                self.queue.add(key, delay=max((decided.at - now).total_seconds(), 0.0) + 0.05)
            return 0
        job = self._fresh_rayjob(view.namespace, view.rayjob, FAILOVER_ANNOTATION, Move.from_json, facts.pending,
                                 again=(view.namespace, view.name))
        if job is None:
            return 0
        move = decided.move
        self._patch(self.rayjobs, job, {"metadata": {"annotations": {FAILOVER_ANNOTATION: move.to_json()}}})
        if move.state == MOVING:  # a waiting job's: nothing to save, the move's own steps follow
            log.info("%s/%s: climbing back from %s to %s: it waits there with nothing to lose", view.namespace,
                     view.rayjob, move.from_flavor, move.to_flavor)
            self._finish(move, cached.meta["name"], view.namespace, view.queue_name)
            return 1
        log.info("%s/%s: climbing back from %s to %s: asking for a checkpoint first", view.namespace, view.rayjob,
                 move.from_flavor, move.to_flavor)
        self.queue.add(key)  # the next step (ask for the save) on the record as written
        return 1

    def _climbing(self, cached: CachedWorkload, facts: climb.JobFacts, need: climb.Need,
                  now: datetime.datetime) -> int:
        view, move = cached.view, facts.pending
        key = (view.namespace, cached.meta["name"])
        still_free = self.free.free_since(move.to_flavor, need) is not None
        step, until = climb.next_in_climb(move, view, facts, still_free, self.climb_policy, now)
        if step == checkpoint_moves.SAVING:
            self.queue.add(key, delay=max((until - now).total_seconds(), 0.0) + 0.05)
            return 0
        if step == checkpoint_moves.ASK:
            request = climb.checkpoint_of(move)
            asked = self._ask_checkpoint(view.namespace, pods_to_ask(request, facts.checkpoints), request)
            log.info("%s/%s: checkpoint %s asked of %d TPU pods", view.namespace, view.rayjob, request.id, asked)
            self.queue.add(key, delay=0.2)  # the pods' cache shows the request, then the save's wait
            return 1
        job = self._fresh_rayjob(view.namespace, view.rayjob, FAILOVER_ANNOTATION, Move.from_json, move,
                                 again=(view.namespace, view.name))
        if job is None:
            return 0
        if step == checkpoint_moves.GO:
            log.info("%s/%s: the checkpoint is taken as saved: moving to %s", view.namespace, view.rayjob,
                     move.to_flavor)
            moving = Move(move.from_flavor, move.to_flavor, move.to_local_queue, move.reason, move.at, MOVING,
                          move.from_local_queue)
            self._patch(self.rayjobs, job, {"metadata": {"annotations": {FAILOVER_ANNOTATION: moving.to_json()}}})
            self._finish(moving, cached.meta["name"], view.namespace, view.queue_name)
            return 1
        before = checkpoint_moves.restored(facts.history)  # CALL_OFF
        log.info("%s/%s: climb to %s called off (the job or the rung changed while it saved)", view.namespace,
                 view.rayjob, move.to_flavor)
        self._patch(self.rayjobs, job, {"metadata": {"annotations": {
            FAILOVER_ANNOTATION: before.to_json() if before is not None else None}}})
        return 1
