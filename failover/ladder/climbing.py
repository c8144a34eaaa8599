"""The fleet's ladder's part for climbing back (failover/ladder/climb.py decides): the signal, each member's free TPU
quota of each step's flavor (a watch of the member's ClusterQueues through the kubeconfig MultiKueue uses, which
MultiKueue's worker role already lets it read); and the acts: a climb's Move written `checkpointing` on the manager's
RayJob, the checkpoint request on the job's TPU pods in the member running it, then route D
(failover/ladder/controller.py `_finish`), which reactivates the Workload only once the old run's pods are gone.

The request is written in the member by the manager's identity: the member's Role for the fleet's namespace lets it
get, list and patch pods there (infra/fleet_member.py). The member's own failover controller never touches a fleet
job's copy (a change would make the manager recreate it), and a DWS-only member has none at all, so it cannot relay
the request; the manager's identity may already create and delete the RayJobs there, which is more.

Kept in memory only: a restart starts every step's settle time afresh, which only delays a climb.
"""

from __future__ import annotations

import datetime
import logging
import threading

from kubernetes import client
from kubernetes.client import ApiException

from failover import maintenance
from failover.api import (CHECKPOINT_REQUEST_ANNOTATION, FAILOVER_ANNOTATION, MOVES_ANNOTATION, CheckpointRequest, Move,
                          Step, move_history)
from failover.api import checkpoint_moves
from failover.api.checkpoints import pods_to_ask
from failover.api.climbs import CHECKPOINTING, CLIMB_BACK, ClimbPolicy, Need, Sample, free_since, record
from failover.ladder import climb
from failover.ladder.decisions import JobMeta, Key, LadderView, deactivation
from failover.runtime.cache import Change
from failover.runtime.informer import Watched
from failover.runtime.members import Member, MemberWatch

log = logging.getLogger("tpu-fallback.ladder")
# Each member's ClusterQueues (cluster-scoped; MultiKueue's worker role reads them): their free TPU quota by flavor.
WATCHED_MEMBER_QUEUES = Watched("member-clusterqueues", "/apis/kueue.x-k8s.io/v1beta2/clusterqueues")
KEPT_BEYOND_SETTLE = datetime.timedelta(minutes=1)  # samples are kept for the settle time and this much more
WORKER_PODS = "ray.io/node-type=worker"  # a RayCluster's TPU pods (one per host)


class ClimbingBack:
    """Mixed into the LadderController: the samples of each step it may climb to, and `_reconcile_climb`."""

    climb_policy: ClimbPolicy = climb.OFF  # until `_init_climb`

    def _init_climb(self, policy: ClimbPolicy) -> None:
        self.climb_policy = policy
        self._climb_steps = [self.ladder.steps[i] for i in climb.targets(self.ladder, policy, len(self.ladder.steps))]
        self._samples: dict[str, list[Sample]] = {step.local_queue: [] for step in self._climb_steps}
        self._samples_lock = threading.Lock()
        if self._climb_steps and self.members is not None:  # only then is there a member's quota to watch
            self.members.watches.append(MemberWatch(WATCHED_MEMBER_QUEUES, self._member_quota_changed,
                                                    lambda obj, _before=None: maintenance.free_tpus(obj)))

    # ---- the signal ------------------------------------------------------------------------------------------
    def _member_quota_changed(self, member: Member, _changes: list[Change], _listed: bool) -> None:
        """A member's quota again: each of its steps sampled; a step that gained room queues the jobs running below
        it (their reconcile says when it has been free for the settle time)."""
        store = member.store(WATCHED_MEMBER_QUEUES)
        queues = store.values() if store is not None else []
        now, gained = self.clock(), []
        with self._samples_lock:
            for step in self._climb_steps:
                if step.member != member.name:
                    continue
                samples = self._samples[step.local_queue]
                before = samples[-1] if samples else None
                chips = climb.free_chips(step.flavor, queues)
                if record(samples, Sample(now, chips, 0), now - self.climb_policy.settle - KEPT_BEYOND_SETTLE) and (
                        before is None or chips > before.free_chips):
                    gained.append(self.ladder.index(step.local_queue))
        if gained:
            top = min(gained)
            self.enqueue([key for key, view in self.seen.views.items()
                          if (index := self.ladder.index(view.queue_name)) is not None and index > top
                          and climb.running(view)])

    def _free_since(self, step: Step, need: Need) -> datetime.datetime | None:
        with self._samples_lock:
            samples = list(self._samples.get(step.local_queue, ()))
        return free_since(samples, need, step.flavor in self.climb_policy.reserved)

    def _last_failure(self, step: Step) -> datetime.datetime | None:
        """The newest capacity failure at a step: any fleet job's move down from it (its history, its latest)."""
        times = [at for meta in self.seen.jobs.values()
                 for left, at in climb.capacity_failures((*move_history(_moves(meta)),
                                                          Move.from_json(meta.move))).items()
                 if left == step.local_queue]
        return max(times, default=None)

    # ---- a job --------------------------------------------------------------------------------------------------
    def _reconcile_climb(self, key: Key, view: LadderView, meta: JobMeta, losing: bool,
                         now: datetime.datetime) -> int:
        """A climb's next step, or whether one starts; the writes made. Queued again when the rules say to look."""
        pending = Move.from_json(meta.move)
        history = tuple(move_history(_moves(meta)))
        need = Need(view.tpu_chips, view.tpu_hosts)
        if pending is not None and pending.state == CHECKPOINTING:
            # Carried on (or called off) even with climbing back turned off since: no step is free then.
            return self._climbing(key, view, pending, history, losing, need, now)
        if not self.climb_policy.enabled or not climb.running(view):
            return 0
        job = climb.FleetJob(pending, history, {}, losing)
        decided = climb.decide_climb(self.ladder, self.climb_policy, view, job,
                                     lambda step: self._free_since(step, need), self._last_failure, now)
        if isinstance(decided, climb.Climb):  # a save it was asked for (read in the member) may still hold it
            job = climb.FleetJob(pending, history, self._pods(decided.move.member, view)[1], losing)
            decided = climb.decide_climb(self.ladder, self.climb_policy, view, job,
                                         lambda step: self._free_since(step, need), self._last_failure, now)
        if isinstance(decided, climb.NotYet):
            if decided.at is not None:
                self.queue.add(key, delay=max((decided.at - now).total_seconds(), 0.0) + 0.05)
            return 0
        rayjob = self._fresh_rayjob(view.namespace, view.rayjob, FAILOVER_ANNOTATION, Move.from_json, pending,
                                    again=(view.namespace, view.name))
        if rayjob is None:
            return 0
        move = decided.move
        log.info("%s/%s: climbing back from step %s to %s: asking for a checkpoint first", key[0], view.rayjob,
                 move.from_flavor, move.to_flavor)
        self._patch(self.rayjobs, rayjob, {"metadata": {"annotations": {FAILOVER_ANNOTATION: move.to_json()}}})
        self.queue.add(key)  # the next step (ask for the save) on the record as written
        return 1

    def _climbing(self, key: Key, view: LadderView, move: Move, history: tuple[Move, ...], losing: bool,
                  need: Need, now: datetime.datetime) -> int:
        step_to = self.ladder.step_of(move.to_local_queue)
        still_free = step_to is not None and self._free_since(step_to, need) is not None
        _, checkpoints = self._pods(move.member, view)
        job = climb.FleetJob(move, history, checkpoints, losing)
        step, until = climb.next_in_climb(self.ladder, move, view, job, still_free, self.climb_policy, now)
        if step == checkpoint_moves.SAVING:
            self.queue.add(key, delay=max((until - now).total_seconds(), 0.0) + 0.05)
            return 0
        if step == checkpoint_moves.ASK:
            request = climb.checkpoint_of(move)
            asked = self._ask(move.member, view.namespace, pods_to_ask(request, checkpoints), request)
            log.info("%s/%s: checkpoint %s asked of %d TPU pods in member %s", key[0], view.rayjob, request.id, asked,
                     move.member)
            self.queue.add(key, delay=0.5)  # read the pods again, then the save's wait
            return 1
        rayjob = self._fresh_rayjob(view.namespace, view.rayjob, FAILOVER_ANNOTATION, Move.from_json, move,
                                    again=(view.namespace, view.name))
        if rayjob is None:
            return 0
        if step == checkpoint_moves.GO:
            log.info("%s/%s: the checkpoint is taken as saved: moving to step %s", key[0], view.rayjob,
                     move.to_flavor)
            workload = self._get(self.workloads, key[1], key[0])
            if workload is None or LadderView.from_object(workload).move is not None:
                return 0
            moving = climb.moving(move)
            self._patch(self.workloads, workload, deactivation(moving))  # route D's first write, as a move down's
            self.moves_started += 1
            self._finish(moving, key[1], key[0], move.member)
            return 1
        before = checkpoint_moves.restored(history)  # CALL_OFF
        log.info("%s/%s: climb to step %s called off (the job or the step changed while it saved)", key[0],
                 view.rayjob, move.to_flavor)
        self._patch(self.rayjobs, rayjob, {"metadata": {"annotations": {
            FAILOVER_ANNOTATION: before.to_json() if before is not None else None}}})
        return 1

    # ---- in the member running the job ----------------------------------------------------------------------
    def _member_api(self, name: str) -> client.ApiClient | None:
        member = self.members.get(name) if self.members is not None and name else None
        return member.api if member is not None else None

    def _pods(self, member: str, view: LadderView) -> tuple[str | None, dict[str, str | None]]:
        """The job's RayCluster in `member` and its TPU pods there with their checkpoint request ({} when the member
        does not answer or runs none)."""
        api = self._member_api(member)
        if api is None or view.rayjob is None:
            return None, {}
        try:
            job = client.CustomObjectsApi(api).get_namespaced_custom_object(
                "ray.io", "v1", view.namespace, "rayjobs", view.rayjob, _request_timeout=5)
            cluster = (job.get("status") or {}).get("rayClusterName")
            if not cluster:
                return None, {}
            pods = client.CoreV1Api(api).list_namespaced_pod(
                view.namespace, label_selector=f"{WORKER_PODS},ray.io/cluster={cluster}", _request_timeout=5)
        except ApiException as error:
            if error.status == 404:
                return None, {}
            raise
        except Exception as error:  # noqa: BLE001 - cut off: nothing read there (a climb is then called off)
            log.info("%s/%s: member %s does not answer (%s)", view.namespace, view.rayjob, member,
                     type(error).__name__)
            return None, {}
        return cluster, {pod.metadata.name: (pod.metadata.annotations or {}).get(CHECKPOINT_REQUEST_ANNOTATION)
                         for pod in pods.items}

    def _ask(self, member: str, namespace: str, pods: list[str], request: CheckpointRequest) -> int:
        """The checkpoint request on each pod in the member (not guarded: the same value whoever writes it)."""
        api, written = self._member_api(member), 0
        body = {"metadata": {"annotations": {CHECKPOINT_REQUEST_ANNOTATION: request.value()}}}
        for pod in pods if api is not None else ():
            try:
                client.CoreV1Api(api).patch_namespaced_pod(pod, namespace, body, _request_timeout=5)
                written += 1
            except ApiException as error:
                if error.status != 404:
                    raise
        return written

    def _old_run_left(self, move: Move, namespace: str, rayjob: str) -> bool:
        """Whether a climb's old run still has pods in the member it leaves (route D waits before reactivating). A
        member that does not answer is taken as still running it: the climb waits (its pass is retried)."""
        api = self._member_api(move.member) if move.reason == CLIMB_BACK else None
        if api is None:
            return False
        try:
            pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector="ray.io/cluster",
                                                             _request_timeout=5)
        except Exception as error:  # noqa: BLE001
            log.info("%s/%s: member %s does not answer (%s): the old run is taken as still there", namespace,
                     rayjob, move.member, type(error).__name__)
            return True
        return bool(climb.old_run(move, rayjob, ((p.metadata.name, (p.metadata.labels or {}).get("ray.io/cluster"))
                                                 for p in pods.items)))


def _moves(meta: JobMeta) -> dict[str, str]:
    """The annotations `move_history` reads, from what the ladder keeps of a RayJob."""
    return {MOVES_ANNOTATION: meta.moves} if meta.moves else {}
