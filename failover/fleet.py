"""The fleet watch (plan C), on a fleet's manager cluster: where each fleet job really runs, said on its RayJob.

Kueue 0.19.2's MultiKueue records where a job was admitted (`status.clusterName` of the manager's Workload) and
cannot change that record once set, nor set it to a member it did not nominate. Measured on the tier (README
"Plan C"): when the admitting member is cut off, the manager dispatches again after `workerLostTimeout` and
another member runs the job; when the first member comes back, Kueue keeps its older admission, deletes the newer
run, and keeps naming the other member, or none. The job then runs where the manager's record says it does not.

Each pass, this watch lists the manager's Workloads and RayJobs and, in every member it can reach (through the
kubeconfig Secrets MultiKueue uses), the copies and RayJobs that this manager made. Per job it writes what is true
on the manager's RayJob (annotation `tpu-fallback/fleet`: state, where it runs, Kueue's record, members that do not
answer or cannot admit it) and an Event when that changes: `FleetRunning`, `FleetRecordStale`, `FleetRunningTwice`
(a partition's overlap; each run checkpoints under its own run id), `FleetMemberLost`, `FleetMemberCannotAdmit`,
`FleetWaiting`, `FleetFinished`. Its one write to what Kueue reads: an evicted job's RayJob status is marked `Suspended` when Kueue
waits for it to stop and cannot see it (`eviction_stuck`, Event `FleetEvictionUnblocked`).

    python -m failover.fleet     # FLEET_MEMBERS, FLEET_ORIGIN, FLEET_WATCH_SECONDS, FLEET_SECRETS_NAMESPACE,
                                 # FLEET_METRICS_PORT (Prometheus /metrics, default 9090; 0 turns it off)
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from failover.controller import rayjob_event
from failover.decisions import MULTIKUEUE_ORIGIN_LABEL, WorkloadView, format_time
from failover.metrics import FleetMetrics

log = logging.getLogger("tpu-fallback.fleet")

FLEET_ANNOTATION = "tpu-fallback/fleet"
COMPONENT = "tpu-fallback-fleet-watch"
KUEUE = ("kueue.x-k8s.io", "v1beta2")
RAY = ("ray.io", "v1")
REQUEST_TIMEOUT_SECONDS = 5  # a member that does not answer in this long counts as unreachable for this pass
RUNNING, RECORD_STALE, RUNNING_TWICE, MEMBER_LOST = "Running", "RecordStale", "RunningTwice", "MemberLost"
MEMBER_CANNOT_ADMIT = "MemberCannotAdmit"
WAITING = "Waiting"  # runs nowhere, no member refuses it: published only over an earlier finding
FINISHED = "Finished"  # the manager's Workload finished: published only over an earlier finding
WARNINGS = frozenset({RECORD_STALE, RUNNING_TWICE, MEMBER_LOST, MEMBER_CANNOT_ADMIT})
STATES = (RUNNING, RECORD_STALE, RUNNING_TWICE, MEMBER_LOST, MEMBER_CANNOT_ADMIT, WAITING, FINISHED)
EVICTION_UNBLOCKED = "FleetEvictionUnblocked"
INADMISSIBLE = "Inadmissible"  # Kueue's QuotaReserved=False reason for a Workload its queues cannot take
# KubeRay's "not running" states: Kueue's RayJob.IsActive() is false only in these (rayjob_controller.go L107-110).
INACTIVE = frozenset({"Suspended", "New"})


@dataclass(frozen=True)
class Finding:
    """Where one job runs, as the members show it, against Kueue's record."""

    state: str
    runs_in: tuple[str, ...]  # members that have the job's RayJob
    record: str | None  # the manager Workload's status.clusterName
    unreachable: tuple[str, ...] = ()
    blocked: tuple[tuple[str, str], ...] = ()  # (member, Kueue's reason there) where its copy is inadmissible
    rungs: tuple[tuple[str, str], ...] = ()  # (member, the flavor its copy holds quota on) where it runs

    def message(self) -> str:
        where = " and ".join(self.runs_in)
        if self.state == RUNNING:
            lost = f"; {' and '.join(self.unreachable)} does not answer (a run there may go on)" if self.unreachable else ""
            return f"runs in {where}{lost}"
        if self.state == FINISHED:
            return f"finished (Kueue's record: {self.record or 'no member'})"
        if self.state == RECORD_STALE:
            recorded = f"still names {self.record}" if self.record else "names no member"
            return (f"runs in {where}; Kueue's record {recorded}: MultiKueue kept the older admission in {where} "
                    "when it came back and cannot record it (Kueue 0.19.2)")
        if self.state == WAITING:
            return "runs nowhere now: every member's copy waits for a slice"
        if self.state == MEMBER_CANNOT_ADMIT:
            return "; ".join(f"{member} cannot admit it: {why} (run `pulumi up` on its stack)"
                             for member, why in self.blocked) + "; the other members still may"
        if self.state == RUNNING_TWICE:
            return (f"runs in {where} at once (a member was cut off and the job was dispatched again); each run "
                    "checkpoints under its own run id, and MultiKueue keeps one when the member is back")
        lost = " and ".join(self.unreachable)
        where = f"{lost}, where Kueue admitted it," if self.record in self.unreachable else lost
        return (f"{where} does not answer; a run there may go on meanwhile, and the manager dispatches the job "
                "again after workerLostTimeout")

    def annotation(self, since: str) -> str:
        found = {"state": self.state, "runsIn": list(self.runs_in), "kueueRecord": self.record,
                 "unreachable": list(self.unreachable), "blocked": dict(self.blocked), "since": since}
        if self.rungs:  # only where it runs: an annotation without it reads as before
            found["rungs"] = dict(self.rungs)
        return json.dumps(found, sort_keys=True)


def assess(record: str | None, running: Mapping[str, bool], unreachable: frozenset[str],
           blocked: Mapping[str, str] | None = None, finished: bool = False,
           flavors: Mapping[str, str] | None = None) -> Finding:
    """The finding for one job: `running` says, per reachable member, whether it has the job's RayJob; `blocked`,
    the members whose copy Kueue finds inadmissible, and why; `flavors`, the rung its copy holds in each member."""
    runs_in = tuple(sorted(member for member, has in running.items() if has))
    lost = tuple(sorted(unreachable))
    finding = _assess(record, runs_in, lost, blocked, finished)
    rungs = tuple((member, (flavors or {})[member]) for member in finding.runs_in if member in (flavors or {}))
    return dataclasses.replace(finding, rungs=rungs) if rungs else finding


def _assess(record: str | None, runs_in: tuple[str, ...], lost: tuple[str, ...], blocked: Mapping[str, str] | None,
            finished: bool) -> Finding:
    if finished:
        return Finding(FINISHED, (), record, lost)
    if not runs_in and blocked:
        return Finding(MEMBER_CANNOT_ADMIT, (), record, lost, tuple(sorted(blocked.items())))
    if len(runs_in) > 1:
        return Finding(RUNNING_TWICE, runs_in, record, lost)
    if runs_in and runs_in != (record,):
        # Elsewhere than recorded, or with no record at all: measured both after a member's return (README "Plan C").
        return Finding(RECORD_STALE, runs_in, record, lost)
    if record is not None and record in lost:
        return Finding(MEMBER_LOST, runs_in, record, lost)
    if runs_in:
        return Finding(RUNNING, runs_in, record, lost)
    if lost:  # runs nowhere that answers: it may still run where nothing answers
        return Finding(MEMBER_LOST, runs_in, record, lost)
    return Finding(WAITING, (), record, lost)


def eviction_stuck(workload: Mapping, rayjob: Mapping) -> bool:
    """Kueue evicted the manager's Workload and suspended its RayJob, and now waits for the job to stop
    (RayJob.IsActive() false), which the manager's RayJob can never show: its status is a copy of the member's
    (MultiKueue's copyJobStatus), and the manager's KubeRay leaves a job managed by MultiKueue alone. Measured:
    after "Admitting remote lost", the Workload stayed Evicted with its quota reserved and no member recorded,
    while a copy ran in the other member."""
    conditions = {c["type"]: c.get("status") for c in (workload.get("status") or {}).get("conditions") or []}
    deployment = (rayjob.get("status") or {}).get("jobDeploymentStatus") or "New"
    return (conditions.get("Evicted") == "True" and conditions.get("QuotaReserved") == "True"
            and bool((rayjob.get("spec") or {}).get("suspend")) and deployment not in INACTIVE)


def changed(previous: str | None, finding: Finding) -> bool:
    """Whether the RayJob's annotation says something else (the time it was first seen aside)."""
    try:
        before = json.loads(previous) if previous else {}
    except ValueError:
        before = {}
    return (before.get("state"), before.get("runsIn"), before.get("kueueRecord"), before.get("blocked") or {}) != (
        finding.state, list(finding.runs_in), finding.record, dict(finding.blocked))


def _owner_rayjob(workload: Mapping) -> str | None:
    return next((o["name"] for o in workload["metadata"].get("ownerReferences") or [] if o.get("kind") == "RayJob"),
                None)


class FleetWatch:
    """One pass with `reconcile()`; `members` gives a client per member name (None: unreachable)."""

    def __init__(self, manager: client.ApiClient, members: Callable[[], Mapping[str, client.ApiClient | None]],
                 origin: str, clock: Callable[[], datetime.datetime] | None = None,
                 metrics: FleetMetrics | None = None):
        self.custom = client.CustomObjectsApi(manager)
        self.metrics = metrics
        self.core = client.CoreV1Api(manager)
        self.members, self.origin = members, origin
        self.clock = clock or (lambda: datetime.datetime.now(datetime.timezone.utc))
        # A warning is published only when the previous pass found the same: Kueue records a dispatch and creates
        # the RayJob in one reconcile, and a pass between the two must not cry RecordStale.
        self.seen: dict[tuple[str, str], Finding] = {}

    def _member_state(self, api: client.ApiClient) -> tuple[set[tuple[str, str]], dict[tuple[str, str], str],
                                                            dict[tuple[str, str], str]]:
        """This manager's RayJobs in a member, its Workload copies there that Kueue finds inadmissible (a missing
        fleet LocalQueue, say) with Kueue's message, and the TPU flavor (the member's rung) each admitted copy holds;
        copies share the manager Workload's name."""
        custom, selector = client.CustomObjectsApi(api), f"{MULTIKUEUE_ORIGIN_LABEL}={self.origin}"
        jobs = custom.list_cluster_custom_object(*RAY, "rayjobs", label_selector=selector,
                                                 _request_timeout=REQUEST_TIMEOUT_SECONDS)["items"]
        copies = custom.list_cluster_custom_object(*KUEUE, "workloads", label_selector=selector,
                                                   _request_timeout=REQUEST_TIMEOUT_SECONDS)["items"]
        inadmissible, flavors = {}, {}
        for copy in copies:
            flavor = WorkloadView.from_object(copy).flavor  # while it holds quota there
            if flavor:
                flavors[(copy["metadata"]["namespace"], copy["metadata"]["name"])] = flavor
            reserved = next((c for c in (copy.get("status") or {}).get("conditions") or []
                             if c["type"] == "QuotaReserved"), {})
            if reserved.get("status") == "False" and reserved.get("reason") == INADMISSIBLE:
                inadmissible[(copy["metadata"]["namespace"], copy["metadata"]["name"])] = reserved.get("message", "")
        return {(job["metadata"]["namespace"], job["metadata"]["name"]) for job in jobs}, inadmissible, flavors

    def reconcile(self) -> dict[tuple[str, str], Finding]:  # noqa: C901 - one pass, read top to bottom
        """One pass over every fleet job: the findings by (namespace, RayJob)."""
        started = time.monotonic()
        reachable: dict[str, set[tuple[str, str]]] = {}
        refused: dict[str, dict[tuple[str, str], str]] = {}
        rungs: dict[str, dict[tuple[str, str], str]] = {}
        unreachable: set[str] = set()
        for name, api in self.members().items():
            try:
                if api is None:
                    raise ConnectionError("no client")
                reachable[name], refused[name], rungs[name] = self._member_state(api)
            except Exception as error:  # noqa: BLE001 - any failure to answer is "unreachable" for this pass
                log.warning("member %s unreachable: %s", name, str(error).splitlines()[0][:200])
                unreachable.add(name)
        findings = {}
        rayjobs = {(j["metadata"]["namespace"], j["metadata"]["name"]): j
                   for j in self.custom.list_cluster_custom_object(*RAY, "rayjobs")["items"]}
        for workload in self.custom.list_cluster_custom_object(*KUEUE, "workloads")["items"]:
            job = _owner_rayjob(workload)
            if job is None:
                continue
            key = (workload["metadata"]["namespace"], job)
            if key in rayjobs and eviction_stuck(workload, rayjobs[key]):
                try:
                    self._unblock_eviction(rayjobs[key], sorted(unreachable))
                except ApiException as error:
                    if error.status != 409:
                        raise
                    log.info("%s/%s changed while being unblocked; next pass", *key)
            record = (workload.get("status") or {}).get("clusterName")
            copy = (workload["metadata"]["namespace"], workload["metadata"]["name"])
            finished = any(c["type"] == "Finished" and c.get("status") == "True"
                           for c in (workload.get("status") or {}).get("conditions") or [])
            finding = assess(record, {member: key in jobs for member, jobs in reachable.items()},
                             frozenset(unreachable),
                             {member: why[copy] for member, why in refused.items() if copy in why}, finished,
                             {member: held[copy] for member, held in rungs.items() if copy in held})
            findings[key] = finding
            noted = FLEET_ANNOTATION in (rayjobs.get(key, {}).get("metadata", {}).get("annotations") or {})
            if finding.state in (WAITING, FINISHED) and not noted:
                continue  # nothing said about it before: nothing to correct
            if finding.state not in WARNINGS or self.seen.get(key) == finding:
                try:
                    self._publish(key, finding)
                except ApiException as error:
                    if error.status != 409:
                        raise
                    log.info("%s/%s changed while being annotated; next pass", *key)  # routine: Kueue writes too
        self.seen = findings
        if self.metrics is not None:
            answered = {member: True for member in reachable} | {member: False for member in unreachable}
            self.metrics.record_pass([f.state for f in findings.values()], answered, time.monotonic() - started)
        return findings

    def _unblock_eviction(self, rayjob: Mapping, unreachable: list[str]) -> None:
        """Say on the manager's RayJob what KubeRay would say of a suspended job it managed: Suspended. Kueue then
        finishes the eviction, and dispatches the job again."""
        meta = rayjob["metadata"]
        self.custom.patch_namespaced_custom_object_status(*RAY, meta["namespace"], "rayjobs", meta["name"], {
            "status": {"jobDeploymentStatus": "Suspended"}, "metadata": {"resourceVersion": meta["resourceVersion"]}})
        lost = f"; a run may go on in {', '.join(unreachable)}, which does not answer" if unreachable else ""
        message = ("Kueue evicted the job and waits for it to stop, which the manager's copy of its status never "
                   "shows (MultiKueue jobs are left alone by the manager's KubeRay): marked Suspended, so Kueue "
                   f"dispatches it again{lost}")
        log.info("%s/%s: %s", meta["namespace"], meta["name"], message)
        self._event(rayjob, EVICTION_UNBLOCKED, message, "Warning")

    def _event(self, rayjob: Mapping, reason: str, message: str, kind: str) -> None:
        rayjob_event(self.core, rayjob["metadata"], COMPONENT, reason, message, kind, self.clock())

    def _publish(self, key: tuple[str, str], finding: Finding) -> None:
        namespace, name = key
        try:
            job = self.custom.get_namespaced_custom_object(*RAY, namespace, "rayjobs", name)
        except ApiException as error:
            if error.status == 404:
                return
            raise
        previous = (job["metadata"].get("annotations") or {}).get(FLEET_ANNOTATION)
        if not changed(previous, finding):
            return
        self.custom.patch_namespaced_custom_object(*RAY, namespace, "rayjobs", name, {"metadata": {
            "annotations": {FLEET_ANNOTATION: finding.annotation(format_time(self.clock()))},
            "resourceVersion": job["metadata"]["resourceVersion"]}})
        log.info("%s/%s: %s", namespace, name, finding.message())
        self._event(job, f"Fleet{finding.state}", finding.message(),
                    "Warning" if finding.state in WARNINGS else "Normal")


def member_clients(core: client.CoreV1Api, secrets: Mapping[str, str],
                   namespace: str) -> Callable[[], dict[str, client.ApiClient | None]]:
    """A client per member from the kubeconfig Secrets MultiKueue reads (key `kubeconfig`), re-read each pass
    so a rotated token is picked up; None for a member whose Secret cannot be read."""
    built: dict[str, tuple[str, client.ApiClient]] = {}  # member -> (kubeconfig text, its client)

    def load() -> dict[str, client.ApiClient | None]:
        clients: dict[str, client.ApiClient | None] = {}
        for member, secret in secrets.items():
            try:
                data = core.read_namespaced_secret(secret, namespace).data or {}
                text = base64.b64decode(data["kubeconfig"]).decode()
                if member not in built or built[member][0] != text:  # a client per kubeconfig, not per pass
                    configuration = client.Configuration()
                    config.load_kube_config_from_dict(yaml.safe_load(text), client_configuration=configuration)
                    configuration.retries = 0  # a member that does not answer is unreachable for this pass
                    built[member] = (text, client.ApiClient(configuration))
                clients[member] = built[member][1]
            except (ApiException, KeyError, ValueError, config.ConfigException) as error:
                log.warning("member %s: no usable kubeconfig in %s/%s: %s", member, namespace, secret, error)
                clients[member] = None
        return clients
    return load


def main() -> int:
    from failover.__main__ import api_client  # the same credentials rule as the failover controller

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    manager = api_client()
    secrets = json.loads(os.environ["FLEET_MEMBERS"])  # {member: kubeconfig Secret name}
    namespace = os.environ.get("FLEET_SECRETS_NAMESPACE", "kueue-system")
    period = float(os.environ.get("FLEET_WATCH_SECONDS", "10"))
    metrics = FleetMetrics(STATES)
    metrics_port = int(os.environ.get("FLEET_METRICS_PORT", "9090"))
    if metrics_port:
        metrics.serve(metrics_port)
    watch = FleetWatch(manager, member_clients(client.CoreV1Api(manager), secrets, namespace),
                       os.environ["FLEET_ORIGIN"], metrics=metrics)
    log.info("watching fleet jobs of origin %s over %s every %.0f s", watch.origin, ", ".join(secrets), period)
    while True:
        try:
            watch.reconcile()
        except Exception:  # noqa: BLE001 - the manager unreachable for a pass: try again next one
            metrics.pass_failures.inc()
            log.exception("fleet watch pass failed")
        time.sleep(period)


if __name__ == "__main__":
    sys.exit(main())
