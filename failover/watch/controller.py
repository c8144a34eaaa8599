"""The fleet watch's I/O: informers on the manager's Workloads, RayJobs and MultiKueueClusters and, in every member
it can reach, on this manager's copies and RayJobs; a work queue; the writes that carry out what
failover/watch/decisions.py finds (an eviction unblocked, Kueue's record repaired, a stale step's copy removed, the
finding published on the RayJob).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from kubernetes import client
from kubernetes.client.rest import ApiException

from failover.api import FLEET_ANNOTATION, MULTIKUEUE_ORIGIN_LABEL, format_time
from failover.runtime.informer import METADATA_ONLY_LIST, Informer, RawClient, Watched, release
from failover.runtime.metrics import FleetMetrics
from failover.runtime.workqueue import WorkQueue
from failover.runtime.writes import rayjob_event
from failover.watch.decisions import (COMPONENT, EVICTION_UNBLOCKED, FINISHED, Key, RECORD_REPAIRED,
                                      STALE_STEP_REMOVED, WAITING, WARNINGS, Finding, Sighting, changed,
                                      condition_true, judge, key_of, owner_rayjob, repaired_status, settle_for,
                                      still_answers)

log = logging.getLogger("tpu-fallback.fleet")
KUEUE = ("kueue.x-k8s.io", "v1beta2")
RAY = ("ray.io", "v1")
REQUEST_TIMEOUT_SECONDS = 5  # a probe not answered in this long is missed
WATCH_SECONDS = 10.0  # the period: kubeconfigs re-read, members asked for an answer
RESYNC_SECONDS = 300.0  # every job evaluated again, the safety net for anything a watch missed
SETTLE_SECONDS = 1.0  # a warning is published once it has held this long
REPAIR_SETTLE_SECONDS = 2.0  # a record to repair must stay so this long (Kueue records ordinary admissions itself)
REPAIR_RETRY_SECONDS = 5.0  # a repair Kueue did not take is applied again after this long
KUEUE_ADMISSION = "kueue-admission"  # Kueue's field manager for a Workload's admission status
APPLY_PATCH = "application/apply-patch+yaml"
WATCHED_MANAGER_WORKLOADS = Watched("workloads", "/apis/kueue.x-k8s.io/v1beta2/workloads")
WATCHED_MANAGER_RAYJOBS = Watched("rayjobs", "/apis/ray.io/v1/rayjobs")
WATCHED_CLUSTERS = Watched("multikueueclusters", "/apis/kueue.x-k8s.io/v1beta2/multikueueclusters")
WATCHED_MEMBER_WORKLOADS = Watched("member-workloads", "/apis/kueue.x-k8s.io/v1beta2/workloads")  # + origin label
WATCHED_MEMBER_RAYJOBS = Watched("member-rayjobs", "/apis/ray.io/v1/rayjobs")


class _Member:
    """One member as the watch sees it: this manager's copies and RayJobs there (informers through the kubeconfig
    MultiKueue uses), and whether it answers. A new kubeconfig, or an answer after none, starts a new generation of
    informers; events from an older one are dropped."""

    def __init__(self, name: str):
        self.name = name
        self.api: client.ApiClient | None = None
        self.generation = 0
        self.informers: list[Informer] = []
        self.copies: dict[Key, dict] = {}  # (namespace, Workload name) -> the copy
        self.rayjobs: dict[Key, dict] = {}  # (namespace, RayJob name) -> the member's RayJob
        self.answers = False  # it answers (`still_answers`)
        self.missed = 0  # probes missed in a row
        self.probe_failed_at: float | None = None  # when it stopped answering
        self.primed = False  # its informers listed since it last did not answer (a new kubeconfig keeps this)

    def synced(self) -> bool:
        return bool(self.informers) and all(informer.synced.is_set() for informer in self.informers)

    def stop(self) -> None:
        for informer in self.informers:
            informer.stop()
        self.informers = []


class FleetWatch:
    """Event-driven: informers on the manager's Workloads, RayJobs and MultiKueueClusters and, in each member, on the
    copies and RayJobs this manager made; every change queues the jobs it touches, and one worker decides for each
    (`evaluate`). `members` gives a client per member name (None: no usable kubeconfig); `tick()`, every period,
    re-reads it (a changed kubeconfig rebuilds that member's informers), asks each member for an answer, and queues
    every job again every `resync_seconds`."""

    def __init__(self, manager: client.ApiClient, members: Callable[[], Mapping[str, client.ApiClient | None]],
                 origin: str, clock: Callable[[], datetime.datetime] | None = None,
                 metrics: FleetMetrics | None = None, resync_seconds: float = RESYNC_SECONDS,
                 settle_seconds: float = SETTLE_SECONDS):
        self.manager_api = manager
        self.custom = client.CustomObjectsApi(manager)
        self.core = client.CoreV1Api(manager)
        self.raw = RawClient(manager)
        self.metrics = metrics
        self.members, self.origin = members, origin
        self.member_custom: Callable[[client.ApiClient], client.CustomObjectsApi] = client.CustomObjectsApi
        self.clock = clock or (lambda: datetime.datetime.now(datetime.timezone.utc))
        self.resync_seconds, self.settle_seconds = resync_seconds, settle_seconds
        self.queue = WorkQueue()
        self._lock = threading.RLock()
        self._workloads: dict[Key, dict] = {}  # manager Workloads by (namespace, name)
        self._rayjobs: dict[Key, dict] = {}  # manager RayJobs by (namespace, name)
        self._job_of: dict[Key, Key] = {}  # (namespace, Workload) -> (namespace, RayJob)
        self._workload_of: dict[Key, Key] = {}  # (namespace, RayJob) -> (namespace, Workload)
        self._connected: dict[str, bool] = {}  # Kueue's MultiKueueCluster Active, per member
        self._members: dict[str, _Member] = {}
        self._manager_informers: list[Informer] = []
        # A finding is published only once it has held as long as `settle_for` says: Kueue creates a member's RayJob
        # and records the member as two writes, and an evaluation between the two must not cry RecordStale.
        self._first_seen: dict[Key, tuple[Finding, float]] = {}
        self._repair_seen: dict[Key, tuple[str, float]] = {}  # the member to record, since when
        self._repaired_at: dict[Key, float] = {}
        self.findings: dict[Key, Finding] = {}
        self._next_resync = 0.0
        self._stopping = threading.Event()
        self._worker: threading.Thread | None = None

    # ---- informers ---------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the manager's informers and the worker; members start with the first `tick()`."""
        self._manager_informers = [
            Informer(self.raw, WATCHED_MANAGER_WORKLOADS, self._workloads_listed, self._workload_changed),
            Informer(self.raw, WATCHED_MANAGER_RAYJOBS, self._rayjobs_listed, self._rayjob_changed),
            Informer(self.raw, WATCHED_CLUSTERS, self._clusters_listed, self._cluster_changed)]
        for informer in self._manager_informers:
            informer.start()
        self._worker = threading.Thread(target=self._work, name="fleet-worker", daemon=True)
        self._worker.start()

    def stop(self) -> None:
        self._stopping.set()
        self.queue.close()
        for informer in self._manager_informers:
            informer.stop()
        for member in self._members.values():
            member.stop()

    def synced(self) -> bool:
        return all(informer.synced.is_set() for informer in self._manager_informers)

    def _workloads_listed(self, items: list[dict]) -> None:
        with self._lock:
            self._workloads.clear()
            self._job_of.clear()
            self._workload_of.clear()
        for item in items:
            self._workload_changed("ADDED", item)

    def _workload_changed(self, event_type: str, obj: dict) -> None:
        key, job = key_of(obj), owner_rayjob(obj)
        with self._lock:
            if event_type == "DELETED":
                self._workloads.pop(key, None)
                job = self._job_of.pop(key, None)
                if job is not None and self._workload_of.get(job) == key:
                    self._workload_of.pop(job, None)
            elif job is not None:
                job = (key[0], job)
                self._workloads[key] = obj
                self._job_of[key], self._workload_of[job] = job, key
        if job is not None:
            self.queue.add(job)

    def _rayjobs_listed(self, items: list[dict]) -> None:
        with self._lock:
            self._rayjobs.clear()
        for item in items:
            self._rayjob_changed("ADDED", item)

    def _rayjob_changed(self, event_type: str, obj: dict) -> None:
        key = key_of(obj)
        with self._lock:
            if event_type == "DELETED":
                self._rayjobs.pop(key, None)
            else:
                self._rayjobs[key] = obj
        self.queue.add(key)

    def _clusters_listed(self, items: list[dict]) -> None:
        with self._lock:
            self._connected.clear()
        for item in items:
            self._cluster_changed("ADDED", item)

    def _cluster_changed(self, event_type: str, obj: dict) -> None:
        name = obj["metadata"]["name"]
        with self._lock:
            before = self._connected.get(name)
            if event_type == "DELETED":
                self._connected.pop(name, None)
            else:
                self._connected[name] = condition_true(obj, "Active")
            now = self._connected.get(name)
        if before != now:
            self._queue_all()

    def _member_handlers(self, member: _Member, generation: int):
        """The (listed, changed) callbacks of a member's informers, for its Workload copies (a change queues the
        manager's job the copy belongs to) and its RayJobs (named as the manager's); a superseded informer's are
        dropped."""
        def handlers(held: str, job_of: Callable[[Key], Key | None]):
            def listed(items: list[dict]) -> None:
                with self._lock:
                    if member.generation != generation:
                        return
                    setattr(member, held, {key_of(item): item for item in items})
                self._queue_all()

            def changed(event_type: str, obj: dict) -> None:
                key = key_of(obj)
                with self._lock:
                    if member.generation != generation:
                        return
                    if event_type == "DELETED":
                        getattr(member, held).pop(key, None)
                    else:
                        getattr(member, held)[key] = obj
                    job = job_of(key)
                if job is not None:
                    self.queue.add(job)

            return listed, changed

        return (*handlers("copies", lambda key: self._job_of.get(key)), *handlers("rayjobs", lambda key: key))

    def _restart_member(self, member: _Member, stale: bool = True) -> None:
        """New informers for a member (its first, a new kubeconfig, or an answer after none): a fresh list. After a
        new kubeconfig alone (`stale` False: a renewed token) what it holds stays until the new list replaces it, and
        the member still answers meanwhile."""
        member.stop()
        with self._lock:
            member.generation += 1
            if stale:
                member.copies, member.rayjobs, member.primed = {}, {}, False
        if member.api is None:
            return
        copies_listed, copy_changed, rayjobs_listed, rayjob_changed = self._member_handlers(member, member.generation)
        selector = f"{MULTIKUEUE_ORIGIN_LABEL}={self.origin}"
        raw = RawClient(member.api)
        member.informers = [
            Informer(raw, dataclasses.replace(WATCHED_MEMBER_WORKLOADS, label_selector=selector), copies_listed,
                     copy_changed),
            Informer(raw, dataclasses.replace(WATCHED_MEMBER_RAYJOBS, label_selector=selector), rayjobs_listed,
                     rayjob_changed)]
        for informer in member.informers:
            informer.name = f"{informer.name}-{member.name}"
            informer.start()

    # ---- the period: kubeconfigs, answers, resync --------------------------------------------------------------
    def tick(self) -> None:
        """Re-read the members' kubeconfigs, ask each member for an answer (in parallel, `REQUEST_TIMEOUT_SECONDS`
        each), and queue every job again when the resync is due. A member answers when it answered this probe and
        its informers have listed since it last did not."""
        clients = self.members()
        for name, api in clients.items():
            with self._lock:
                member = self._members.setdefault(name, _Member(name))
            if api is not member.api:
                member.api = api
                self._restart_member(member, stale=member.api is None or not member.primed)
        with self._lock:
            gone = [self._members.pop(name) for name in set(self._members) - set(clients)]
            members = list(self._members.values())
        for member in gone:
            member.stop()
        threads = [threading.Thread(target=self._probe, args=(member,), daemon=True) for member in members]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(REQUEST_TIMEOUT_SECONDS + 5)
        if self.metrics is not None:  # every period, jobs or none: the "member does not answer" alert reads it
            with self._lock:
                answered = self._answered()
            self.metrics.record_members(answered)
        if time.monotonic() >= self._next_resync:
            self._next_resync = time.monotonic() + self.resync_seconds
            self._queue_all()

    def _probe(self, member: _Member) -> None:
        answered = False
        if member.api is not None:
            try:
                release(RawClient(member.api).request(
                    "GET", WATCHED_MEMBER_WORKLOADS.path, serialize=False, _request_timeout=REQUEST_TIMEOUT_SECONDS,
                    query_params=[("limit", 1), ("labelSelector", f"{MULTIKUEUE_ORIGIN_LABEL}={self.origin}")],
                    header_params={"Accept": METADATA_ONLY_LIST}))
                answered = True
            except Exception as error:  # noqa: BLE001 - any failure to answer is "does not answer"
                log.warning("member %s does not answer: %s", member.name, str(error).splitlines()[0][:200])
        before = member.answers
        member.missed = 0 if answered else member.missed + 1
        answers = still_answers(before, member.missed)
        if answers and not before and member.probe_failed_at is not None:
            self._restart_member(member)  # back: what its informers hold may be stale
        member.answers = answers
        member.probe_failed_at = None if answers else member.probe_failed_at or time.monotonic()
        if answers != before:
            self._queue_all()

    def _queue_all(self) -> None:
        with self._lock:
            keys = set(self._workload_of) | set(self._rayjobs)
        for key in keys:
            self.queue.add(key)

    # ---- the worker --------------------------------------------------------------------------------------------
    def _work(self) -> None:
        while not self._stopping.is_set():
            key = self.queue.get(timeout=1.0)
            if key is None:
                continue
            started = time.monotonic()
            try:
                self.evaluate(key)
            except ApiException as error:
                if error.status in (404, 409):  # gone, or written meanwhile: the watch brings the news
                    self.queue.add(key, delay=0.2)
                else:
                    log.warning("%s/%s: %s; queued again", *key, str(error).splitlines()[0][:300])
                    self._failed()
                    self.queue.add(key, delay=2.0)
            except Exception:  # noqa: BLE001 - one bad object must not end the worker
                log.exception("%s/%s: evaluation failed; queued again", *key)
                self._failed()
                self.queue.add(key, delay=5.0)
            finally:
                self.queue.done(key)
            if self.metrics is not None and not len(self.queue):
                self._record(time.monotonic() - started)  # the findings as they stand once nothing waits

    def _failed(self) -> None:
        if self.metrics is not None:
            self.metrics.pass_failures.inc()

    def _record(self, seconds: float) -> None:
        with self._lock:
            states = [f.state for f in self.findings.values()]
            answered = self._answered()
        self.metrics.record_pass(states, answered, seconds)

    def _answered(self) -> dict[str, bool]:
        """Whether each member answers (the caller holds the lock)."""
        return {name: self._answers(member) for name, member in self._members.items()}

    @staticmethod
    def _answers(member: _Member) -> bool:
        """It answered the last probe, and its informers have listed since it last did not."""
        if member.api is not None and member.answers and member.synced():
            member.primed = True
        return member.api is not None and member.answers and member.primed

    def evaluate(self, key: Key) -> Finding | None:
        """Decide for one job from the caches (`judge`) and carry it out: mark its eviction finished, repair Kueue's
        record, remove an older step's copies, and say where it runs (annotation and Event, once the finding has held
        as long as `settle_for` says); the finding, None if no such job."""
        with self._lock:
            workload_key = self._workload_of.get(key)
            workload = self._workloads.get(workload_key) if workload_key else None
            rayjob = self._rayjobs.get(key)
            answering = {name: m for name, m in self._members.items() if self._answers(m)}
            unreachable = frozenset(set(self._members) - set(answering))
            copies = {name: m.copies.get(workload_key) for name, m in answering.items()} if workload_key else {}
            jobs = {name: m.rayjobs.get(key) for name, m in answering.items()}
            connected = dict(self._connected)
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
        rayjob = self._rayjobs.get(key)
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
            with self._lock:
                found = self._members.get(member)
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
            rayjob = self._rayjobs.get(key)
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
