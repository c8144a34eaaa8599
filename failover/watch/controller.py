"""The fleet watch: `reconcile(key)` for one fleet job (its manager RayJob's key), over what the runtime keeps of the
manager and of every member it can reach (failover/watch/watches.py), carrying out what failover/watch/decisions.py
finds: an eviction unblocked, Kueue's record repaired, a stale step's copy removed, the finding published on the
RayJob. The manager (failover/runtime/manager.py) runs it, with its period (`tick`: the members' kubeconfigs read
again, each member asked for an answer) and its resync.
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from kubernetes import client
from kubernetes.client.rest import ApiException

from failover.api import FLEET_ANNOTATION, format_time
from failover.runtime.cache import Cache, Key
from failover.runtime.controller import Reconciler, Watch
from failover.runtime.informer import RawClient, Watched, release
from failover.runtime.members import Member, MemberCaches
from failover.runtime.metrics import FleetMetrics
from failover.runtime.writes import rayjob_event
from failover.watch.decisions import (COMPONENT, EVICTION_UNBLOCKED, FINISHED, RECORD_REPAIRED, STALE_STEP_REMOVED,
                                      WAITING, WARNINGS, Finding, Sighting, changed, judge, repaired_status,
                                      settle_for)
from failover.watch.watches import REQUEST_TIMEOUT_SECONDS, FleetSeen

log = logging.getLogger("tpu-fallback.fleet")
KUEUE = ("kueue.x-k8s.io", "v1beta2")
RAY = ("ray.io", "v1")
WATCH_SECONDS = 10.0  # the period: kubeconfigs re-read, members asked for an answer
RESYNC_SECONDS = 300.0  # every job evaluated again, the safety net for anything a watch missed
SETTLE_SECONDS = 1.0  # a warning is published once it has held this long
REPAIR_SETTLE_SECONDS = 2.0  # a record to repair must stay so this long (Kueue records ordinary admissions itself)
REPAIR_RETRY_SECONDS = 5.0  # a repair Kueue did not take is applied again after this long
KUEUE_ADMISSION = "kueue-admission"  # Kueue's field manager for a Workload's admission status
APPLY_PATCH = "application/apply-patch+yaml"


def _held(member: Member, watched: Watched, key: Key | None):
    store = member.store(watched)
    return store.get(key) if store is not None and key is not None else None


class _Writes:
    """The watch's writes: on the manager's RayJob (Suspended, the finding, Events), Kueue's record repaired, and an
    older step's run and copy deleted in a member."""

    custom: client.CustomObjectsApi
    core: client.CoreV1Api
    raw: RawClient
    seen: FleetSeen
    queue: object
    clock: Callable[[], datetime.datetime]
    member_custom: Callable[[client.ApiClient], client.CustomObjectsApi]
    _lock: threading.Lock
    _repair_seen: dict
    _repaired_at: dict

    # ---- the writes --------------------------------------------------------------------------------------------
    def _mark_suspended(self, rayjob: Mapping, message: str) -> None:
        """Say on the manager's RayJob what KubeRay would say of a suspended job it managed: Suspended; Kueue's
        eviction then finishes (`lost_admission`, `may_unblock`)."""
        meta = rayjob["metadata"]
        self.custom.patch_namespaced_custom_object_status(*RAY, meta["namespace"], "rayjobs", meta["name"], {
            "status": {"jobDeploymentStatus": "Suspended"}, "metadata": {"resourceVersion": meta["resourceVersion"]}})
        log.info("%s/%s: %s", meta["namespace"], meta["name"], message)
        self._event(rayjob, EVICTION_UNBLOCKED, message, "Warning")

    def _repair(self, key: Key, workload: Mapping, member: str | None) -> None:
        """Name `member` (the verdict's) in Kueue's record once it has stayed the one to name for
        REPAIR_SETTLE_SECONDS, and again every REPAIR_RETRY_SECONDS until Kueue records it."""
        now = time.monotonic()
        with self._lock:
            if member is None:
                self._repair_seen.pop(key, None)
                return
            seen = self._repair_seen.get(key)
            if seen is None or seen[0] != member:
                seen = self._repair_seen[key] = (member, now)
            due = max(seen[1] + REPAIR_SETTLE_SECONDS, self._repaired_at.get(key, -1e9) + REPAIR_RETRY_SECONDS)
        if now < due:  # Kueue records an ordinary admission itself, within a reconcile; a repair takes 0.2-0.5 s
            self.queue.add(key, delay=due - now + 0.01)
            return
        meta = workload["metadata"]
        body = {"apiVersion": "/".join(KUEUE), "kind": "Workload", "metadata": {
            "name": meta["name"], "namespace": meta["namespace"], "resourceVersion": meta["resourceVersion"]},
            "status": repaired_status(workload, member)}
        release(self.raw.request(
            "PATCH", f"/apis/{'/'.join(KUEUE)}/namespaces/{meta['namespace']}/workloads/{meta['name']}/status",
            body=json.dumps(body), serialize=False, content_type=APPLY_PATCH,
            query_params=[("fieldManager", KUEUE_ADMISSION), ("force", "true")]))
        with self._lock:
            self._repaired_at[key] = now
        self.queue.add(key, delay=REPAIR_RETRY_SECONDS + 0.01)  # recorded by then, or tried again
        rayjob = self.seen.rayjobs.get(key)
        message = (f"runs in {member}, whose copy Kueue adopted when it answered again but cannot record (it was not "
                   f"nominated): named it in the Workload's nominatedClusterNames, so Kueue records {member}")
        log.info("%s/%s: %s", *key, message)
        if rayjob is not None:
            self._event(rayjob, RECORD_REPAIRED, message, "Normal")

    def _remove_stale(self, key: Key, workload: Mapping, members: Iterable[str], copies: Mapping[str, dict | None],
                      jobs: Mapping[str, dict | None]) -> None:
        """Delete, as MultiKueue's GC would, the RayJob (its pods with it) and the copy an older step left in each
        member (`stale_step_copies`), with the member's kubeconfig MultiKueue uses; one Event per member."""
        record = (workload.get("status") or {}).get("clusterName")
        for member in members:
            found = self.seen.members.get(member)
            if found is None or found.api is None:
                continue
            copy, run = copies.get(member) or {}, jobs.get(member)
            if copy["metadata"].get("deletionTimestamp"):
                continue  # being deleted already (Kueue's finalizer): once is enough
            custom = self.member_custom(found.api)
            try:
                if run is not None:
                    custom.delete_namespaced_custom_object(*RAY, key[0], "rayjobs", key[1],
                                                           propagation_policy="Background",
                                                           _request_timeout=REQUEST_TIMEOUT_SECONDS)
                custom.delete_namespaced_custom_object(*KUEUE, key[0], "workloads", copy["metadata"]["name"],
                                                       propagation_policy="Background",
                                                       _request_timeout=REQUEST_TIMEOUT_SECONDS)
            except ApiException as error:
                if error.status != 404:
                    raise
                continue  # gone already: someone else removed it, no Event
            message = (f"deleted the run and the copy in {member} left by an older step of the ladder "
                       f"({(copy.get('spec') or {}).get('queueName')}): the job was moved on while {member} was cut "
                       f"off, and it runs in {record} at step {(workload.get('spec') or {}).get('queueName')}, where "
                       "Kueue admitted it (Kueue 0.19.2 no longer looks at a member outside the job's step)")
            log.info("%s/%s: %s", *key, message)
            rayjob = self.seen.rayjobs.get(key)
            if rayjob is not None:
                self._event(rayjob, STALE_STEP_REMOVED, message, "Warning")

    def _event(self, rayjob: Mapping, reason: str, message: str, kind: str) -> None:
        rayjob_event(self.core, rayjob["metadata"], COMPONENT, reason, message, kind, self.clock())

    def _publish(self, rayjob: Mapping, finding: Finding) -> None:
        meta = rayjob["metadata"]
        previous = (meta.get("annotations") or {}).get(FLEET_ANNOTATION)
        if not changed(previous, finding):
            return
        self.custom.patch_namespaced_custom_object(*RAY, meta["namespace"], "rayjobs", meta["name"], {"metadata": {
            "annotations": {FLEET_ANNOTATION: finding.annotation(format_time(self.clock()))},
            "resourceVersion": meta["resourceVersion"]}})
        log.info("%s/%s: %s", meta["namespace"], meta["name"], finding.message())
        self._event(rayjob, f"Fleet{finding.state}", finding.message(),
                    "Warning" if finding.state in WARNINGS else "Normal")


class FleetWatch(_Writes, Reconciler):
    """Event-driven: the manager's Workloads, RayJobs and MultiKueueClusters and, in each member, the copies and
    RayJobs this manager made (watches.py); every change queues the jobs it touches, and one worker decides for
    each (`reconcile`). `tick()`, every period, re-reads the members (a changed kubeconfig rebuilds that member's
    cache), asks each for an answer, and exports each member's answer; the manager queues every job again every
    `resync_seconds`."""

    name = "fleet-watch"
    log = log
    period_seconds = WATCH_SECONDS
    resync_seconds = RESYNC_SECONDS
    resync_at_start = True
    api_error_delay = 2.0

    def __init__(self, manager: client.ApiClient, members: MemberCaches, origin: str,
                 clock: Callable[[], datetime.datetime] | None = None, metrics: FleetMetrics | None = None,
                 resync_seconds: float = RESYNC_SECONDS, settle_seconds: float = SETTLE_SECONDS,
                 cache: Cache | None = None, period_seconds: float = WATCH_SECONDS):
        Reconciler.__init__(self)
        self.period_seconds = period_seconds
        self.custom = client.CustomObjectsApi(manager)
        self.core = client.CoreV1Api(manager)
        self.raw = RawClient(manager)
        self.metrics, self.origin = metrics, origin
        self.member_custom: Callable[[client.ApiClient], client.CustomObjectsApi] = client.CustomObjectsApi
        self.clock = clock or (lambda: datetime.datetime.now(datetime.timezone.utc))
        self.resync_seconds, self.settle_seconds = resync_seconds, settle_seconds
        self.seen = FleetSeen(cache or Cache(manager), members, origin, self.enqueue)
        self._lock = threading.Lock()
        # A finding is published only once it has held as long as `settle_for` says: Kueue creates a member's RayJob
        # and records the member as two writes, and an evaluation between the two must not cry RecordStale.
        self._first_seen: dict[Key, tuple[Finding, float]] = {}
        self._repair_seen: dict[Key, tuple[str, float]] = {}  # the member to record, since when
        self._repaired_at: dict[Key, float] = {}
        self.findings: dict[Key, Finding] = {}

    # ---- what the manager runs ---------------------------------------------------------------------------------
    def watches(self) -> list[Watch]:
        return self.seen.watches()

    def keys(self) -> list[Key]:
        return self.seen.all_keys()

    def tick(self) -> None:
        """The period: the members read again and asked; each one's answer exported every period, jobs or none (the
        "member does not answer" alert reads it)."""
        answered = self.seen.tick()
        if self.metrics is not None:
            self.metrics.record_members(answered)

    def failed(self) -> None:
        if self.metrics is not None:
            self.metrics.pass_failures.inc()

    def reconciled(self, seconds: float) -> None:
        if self.metrics is not None and not len(self.queue):
            self.record(seconds)  # the findings as they stand once nothing waits

    def record(self, seconds: float) -> None:
        with self._lock:
            states = [f.state for f in self.findings.values()]
        self.metrics.record_pass(states, self.seen.answered(), seconds)

    def started(self) -> None:
        log.info("watching fleet jobs of origin %s over %s (members asked every %.0f s)", self.origin,
                 ", ".join(self.seen.members.all()), self.period_seconds)

    def reconcile(self, key: Key) -> Finding | None:
        """Decide for one job from the caches (`judge`) and carry it out: mark its eviction finished, repair Kueue's
        record, remove an older step's copies, and say where it runs (annotation and Event, once the finding has held
        as long as `settle_for` says); the finding, None if no such job."""
        seen = self.seen
        workload_key = seen.workloads.last("rayjob", key)
        workload = seen.workloads.get(workload_key) if workload_key else None
        rayjob = seen.rayjobs.get(key)
        answering = seen.answering()
        unreachable = frozenset(set(seen.members.all()) - set(answering))
        copies = {name: _held(m, seen.copies, workload_key) for name, m in answering.items()} if workload_key else {}
        jobs = {name: _held(m, seen.member_rayjobs, key) for name, m in answering.items()}
        connected = {name: value for (_, name), value in seen.connected.items()}
        if workload is None:
            with self._lock:
                self.findings.pop(key, None)
                self._first_seen.pop(key, None)
                self._repair_seen.pop(key, None)
                self._repaired_at.pop(key, None)
            return None
        verdict = judge(Sighting(workload, rayjob, copies, jobs, unreachable, connected))
        if verdict.lost is not None:
            self._mark_suspended(rayjob, (
                f"Kueue lost {verdict.lost}, where it admitted the job, and will evict it after workerLostTimeout, then "
                "wait for a stop the manager's copy of its status never shows (MultiKueue jobs are left alone by the "
                "manager's KubeRay): marked Suspended now, so the eviction releases the quota at once and the job's "
                f"dispatch to the other members is not undone; the run in {verdict.lost} may go on until Kueue reaches "
                "it again"))
        elif verdict.unblock:
            lost = f"; a run may go on in {', '.join(sorted(unreachable))}, which does not answer" \
                if unreachable else ""
            self._mark_suspended(rayjob, (
                "Kueue evicted the job and waits for it to stop, which the manager's copy of its status never "
                "shows (MultiKueue jobs are left alone by the manager's KubeRay), and no member that answers runs "
                f"it: marked Suspended, so Kueue releases its quota and dispatches it again{lost}"))
        elif verdict.left_to_kueue:
            log.info("%s/%s: Kueue's eviction waits, and the job runs in %s: left to Kueue", *key,
                     " and ".join(verdict.left_to_kueue))
        self._repair(key, workload, verdict.repair)
        if verdict.stale:
            self._remove_stale(key, workload, verdict.stale, copies, jobs)
        finding = verdict.finding
        now = time.monotonic()
        with self._lock:
            self.findings[key] = finding
            first = self._first_seen.get(key)
            if first is None or first[0] != finding:
                first = self._first_seen[key] = (finding, now)
        if rayjob is None:
            return finding
        noted = FLEET_ANNOTATION in (rayjob["metadata"].get("annotations") or {})
        if finding.state in (WAITING, FINISHED) and not noted:
            return finding  # nothing said about it before: nothing to correct
        settle = settle_for(workload, finding, self.settle_seconds)
        if now - first[1] < settle:
            self.queue.add(key, delay=first[1] + settle - now + 0.01)
            return finding
        self._publish(rayjob, finding)
        return finding
