"""The failover controller on the tier: the stack's platform with a short PodsReady timeout (the tier's clock:
stack.release_values), the controller run
from `failover/` with its ServiceAccount's token (not admin), over real KubeRay, kube-scheduler and nodes shaped like
the plan's pools (runtime.py): the tests script only GCE capacity (`stockout`) and the Ray head.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import os
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from failover import api
from failover.api.probes import PROBE_LABEL
from failover.runtime.manager import LOG_LEVEL_VARIABLE
from infra import failover as stack_failover
from infra.offline import Plan
from testbed import jobs
from testbed.cluster import ControlPlane
from testbed.kube import Kube, wait_for
from testbed.plans import REPO, plan_for
from testbed.processes import Process, start_serving
from testbed.stack import deploy, release_values

# Kueue's waitForPodsReady on the tier's clock (stack.release_values): a slice appears here within seconds, so
# 30 s still leaves a healthy job on a busy machine several times what it needs to be PodsReady.
PODS_READY_TIMEOUT_SECONDS = 30
GRACE_SECONDS = 4  # through stack config, as a user would set it
# The Deployment resyncs every 300 s, the safety net for anything a watch missed; on the tier it is an hour away, so
# every scenario passes on the watches and the times a decision asks to be looked at again, or fails (issue 43).
RESYNC_SECONDS = 3600
NAMESPACE = "default"
LOOK_LABEL = "tpu-fallback-test/look"  # FailoverTier.looked_at: a Workload change nothing reads
# The controller's DEBUG line per key it reconciled (failover/runtime/workqueue.py work; the tier turns DEBUG on),
# stamped by logging's `%(asctime)s` (local time, milliseconds): "2026-12-07 20:50:01,234 DEBUG ns/name: reconciled: 0".
RECONCILED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) DEBUG ([^/\s]+)/(\S+): reconciled: ", re.MULTILINE)


def platform_plan(grace: int = GRACE_SECONDS, overrides: dict | None = None, stack: str = "dev") -> Plan:
    """The dev stack's platform (`stack`: another's; no jobs: the tests submit their own) with the stockout grace
    period given."""
    return plan_for(stack, {"fallback": {"stockoutGracePeriod": f"{grace}s"}, "workloads": {"jobs": 0},
                            **(overrides or {})})


@dataclass
class FailoverTier:
    plane: ControlPlane
    plan: Plan
    controller: Process | None = None
    metrics_url: str = ""
    stack: str = "dev"  # whose RayJob `submit` copies (its slice: the plan's pools)

    @property
    def kube(self) -> Kube:
        return self.plane.kube

    def start(self) -> FailoverTier:
        self.plane.start()
        deploy(self.kube, self.plan)  # the controller's Deployment, RBAC and code included: the server judges them
        jobs.prepare_namespace(self.kube, NAMESPACE)  # what the submitted copies of the dev jobs run as and mount
        return self

    def controller_env(self, resync: float = RESYNC_SECONDS) -> dict[str, str]:
        """The Deployment's own environment, with the tier's credentials: the controller's ServiceAccount."""
        (deployment,) = [m for m in self.plan.kubernetes_manifests()
                         if m["kind"] == "Deployment" and m["metadata"]["name"] == stack_failover.NAME]
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        env = {item["name"]: item["value"] for item in container["env"] if item["name"].startswith("FAILOVER_")}
        kubeconfig = self.plane.kubeconfig_for_service_account(stack_failover.NAMESPACE, stack_failover.NAME)
        return {**os.environ, **env, "FAILOVER_RESYNC_SECONDS": str(resync), "KUBECONFIG": str(kubeconfig),
                LOG_LEVEL_VARIABLE: "DEBUG"}  # a line per reconciled key: `looked_at`

    def start_controller(self, resync: float = RESYNC_SECONDS, environ: dict[str, str] | None = None) -> Process:
        """The controller with the Deployment's environment (`environ`: another, such as a bench's clock)."""
        self.controller, env = start_serving(self.plane.supervisor, "failover", [sys.executable, "-m", "failover.regional"],
                                             environ or self.controller_env(resync), REPO, 30, "FAILOVER_HEALTH_PORT",
                                             ("FAILOVER_METRICS_PORT",))
        self.metrics_url = f"http://127.0.0.1:{env['FAILOVER_METRICS_PORT']}/metrics"
        return self.controller

    def metric(self, name: str, **labels: str) -> float:
        """One sample of the running controller's /metrics (0 when absent), parsed by prometheus-client."""
        return sum(sample.value for sample in self.samples(name, **labels))

    def samples(self, name: str, **labels: str) -> list:
        """The running controller's /metrics samples of `name` with these labels, as scraped."""
        from urllib.request import urlopen

        from prometheus_client.parser import text_string_to_metric_families

        text = urlopen(self.metrics_url, timeout=5).read().decode()
        return [sample for family in text_string_to_metric_families(text) for sample in family.samples
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())]

    def stop_controller(self) -> None:
        if self.controller is not None:
            self.plane.supervisor.stop(self.controller)
            self.controller = None

    @property
    def gke(self):
        """The autoscaler stand-in over the plan's pools (testbed/gke.py)."""
        return self.plane.after.gke

    def pools_of(self, flavor: str) -> list[str]:
        """The node pools behind a rung (its flavor's nodeLabels select their nodes)."""
        (manifest,) = [m for m in self.plan.kubernetes_manifests()
                       if m["kind"] == "ResourceFlavor" and m["metadata"]["name"] == flavor]
        return self.gke.pools_for(manifest)

    def on_one_slice_of(self, flavor: str, workers: list[str]) -> bool:
        """The run's workers (their pools) are all on one pool of this rung, one per host of its slice."""
        template = self.gke.by_pool.get(workers[0]) if workers else None
        return (template is not None and template.pool in self.pools_of(flavor) and set(workers) == {template.pool}
                and len(workers) == template.hosts)

    def stockout(self, *flavors: str, reported: bool = True) -> None:
        """No capacity behind these rungs: their pools cannot grow, and GKE says so on the pods unless not
        `reported` (then only Kueue's PodsReady timeout sees it)."""
        for flavor in flavors:
            for pool in self.pools_of(flavor):
                self.gke.stockout(pool, reported)

    def stockout_reported(self, job: str, namespace: str = NAMESPACE, timeout: float = 60) -> str:
        """The firstTimestamp of the autoscaler's first "GCE out of resources" Event on a pod of the job's run."""
        return wait_for(lambda: jobs.first_stockout_report(self.kube, namespace, job), timeout,
                        f"the autoscaler's stockout report on {job}'s pods")

    def submit(self, name: str, queue: str = "user-queue") -> float:
        """Create a RayJob and wait for Kueue's first decision; the monotonic time it was created."""
        created = time.monotonic()
        self.kube.create(jobs.dev_rayjob(name, queue, self.stack))
        jobs.wait_decided(self.kube, NAMESPACE, name)
        return created

    def delete_all_jobs(self) -> None:
        """Every job and what it ran gone, and, on a tier with nodes, capacity back and every TPU slice scaled
        down: the next scenario starts from an empty cluster, not a slice the last one left running."""
        for job in self.kube.list(*jobs.RAYJOB, namespace=NAMESPACE):
            self.kube.delete(*jobs.RAYJOB, job["metadata"]["name"], NAMESPACE, propagation="Background")
        for pod in self.kube.list("v1", "Pod", namespace=NAMESPACE):
            self.kube.delete("v1", "Pod", pod["metadata"]["name"], NAMESPACE, propagation="Background")
        wait_for(lambda: not self.kube.list(*jobs.WORKLOAD, namespace=NAMESPACE), 60, "no Workload left")
        if self.plane.after is not None:
            self._remove_probes()
            self.gke.restore()
            wait_for(lambda: not self.kube.list("v1", "Pod", namespace=NAMESPACE), 60, "no pod left")
            self.gke.remove_idle()
            assert not any(self.gke.nodes_of(t.pool) for t in self.gke.templates if t.tpu), "a TPU slice left"

    def _remove_probes(self) -> None:
        """The controller's capacity probes (failover/api/probes.py) gone before capacity is back: a probe left for
        a job of the last scenario had the stand-in grow a slice that the next scenario's job ran on (seen in the
        suite). Once the controller's cache holds no Workload it makes none again; then any left are deleted."""
        if self.controller is not None and not self.kube.list(*jobs.WORKLOAD):
            wait_for(lambda: self.metric("tpu_fallback_workloads_watched") == 0, 60,
                     "the controller's cache without a Workload")
        for pod in self.capacity_probes():
            self.kube.delete("v1", "Pod", pod["metadata"]["name"], stack_failover.NAMESPACE, propagation="Background")
        wait_for(lambda: not self.capacity_probes(), 60, "no capacity probe left")

    def capacity_probes(self) -> list[dict]:
        """The controller's probe pods, in its namespace."""
        return [pod for pod in self.kube.list("v1", "Pod", namespace=stack_failover.NAMESPACE)
                if PROBE_LABEL in (pod["metadata"].get("labels") or {})]

    def move_of(self, job: str) -> api.Move | None:
        """The move the controller recorded on the RayJob (its annotation)."""
        rayjob = self.kube.get(*jobs.RAYJOB, job, NAMESPACE)
        return api.Move.from_json((rayjob["metadata"].get("annotations") or {}).get(
            api.FAILOVER_ANNOTATION))

    def queues_of(self, job: str) -> tuple[str, str]:
        """(the RayJob's queue label, its Workload's spec.queueName): a move changes both."""
        rayjob = self.kube.get(*jobs.RAYJOB, job, NAMESPACE)
        workload = jobs.workload_of(self.kube, NAMESPACE, job)
        return rayjob["metadata"]["labels"][jobs.QUEUE_LABEL], workload["spec"]["queueName"]

    # ---- a running job that loses its slice (failover/slices.py) ------------------------------------------------
    def lost_of(self, job: str) -> api.LostSlice | None:
        """The loss the controller recorded on the RayJob."""
        rayjob = self.kube.get(*jobs.RAYJOB, job, NAMESPACE)
        return api.LostSlice.from_json((rayjob["metadata"].get("annotations") or {}).get(
            api.SLICE_LOST_ANNOTATION))

    def running_on(self, job: str, flavor: str) -> bool:
        """Every pod of the job's run Running and Ready, its workers on one slice of this rung."""
        pools = jobs.pools_of(self.kube, NAMESPACE, job)
        return bool(pools) and self.on_one_slice_of(flavor, pools["worker"])

    def slice_of_job(self, job: str) -> tuple[str, list[str]]:
        """The slice the job's workers run on, and its worker pods' names."""
        workers = jobs.pods_of(self.kube, NAMESPACE, job)["worker"]
        return self.gke.slice_of(workers[0]["spec"]["nodeName"]), [p["metadata"]["name"] for p in workers]

    def ahead_of(self, job: str) -> api.Ahead | None:
        """The disruption ahead the controller recorded on the RayJob (failover/maintenance.py)."""
        rayjob = self.kube.get(*jobs.RAYJOB, job, NAMESPACE)
        return api.Ahead.from_json((rayjob["metadata"].get("annotations") or {}).get(api.AHEAD_ANNOTATION))

    def checkpoint_requests(self, pods: list[str]) -> dict[str, api.CheckpointRequest | None]:
        """The checkpoint request on each of these pods now (None: none, or the pod is gone)."""
        found = {}
        for name in pods:
            pod = self.kube.get("v1", "Pod", name, NAMESPACE)
            found[name] = api.CheckpointRequest.parse(((pod or {}).get("metadata", {}).get("annotations") or {}).get(
                api.CHECKPOINT_REQUEST_ANNOTATION))
        return found

    def lose_slice_of(self, job: str, **how) -> tuple[float, datetime.datetime]:
        """Lose the slice the job's workers run on (gke.Autoscaler.lose_slice); the monotonic and wall times of
        GKE's first signal."""
        (worker, *_) = jobs.pods_of(self.kube, NAMESPACE, job)["worker"]
        slice_id = self.gke.slice_of(worker["spec"]["nodeName"])
        wall = datetime.datetime.now(datetime.timezone.utc)
        return self.gke.lose_slice(slice_id, **how), wall

    def runs_of(self, job: str) -> int:
        """How many runs (RayClusters) of the job have pods not being deleted now."""
        return len({p["metadata"]["labels"]["ray.io/cluster"] for p in self.kube.list("v1", "Pod", namespace=NAMESPACE)
                    if (p["metadata"].get("labels") or {}).get("ray.io/cluster", "").startswith(f"{job}-")
                    and not p["metadata"].get("deletionTimestamp")})

    def reconciles_ended_since(self, workload: str, since: float, namespace: str = NAMESPACE) -> int:
        """How many reconciles of the Workload the controller's log shows ending at `since` (time.time()) or later."""
        text = self.controller.log.read_text(errors="replace") if self.controller else ""
        return sum(1 for line in RECONCILED.finditer(text) if (line[3], line[4]) == (namespace, workload)
                   and time.mktime(time.strptime(line[1], "%Y-%m-%d %H:%M:%S")) + int(line[2]) / 1000 >= since)

    def looked_at(self, job: str, timeout: float = 60, since: float | None = None) -> None:
        """Wait until the controller has reconciled the job's Workload in a pass that began at `since` (time.time(),
        now by default) or later: the sign that it looked at the cluster as it is from then on, and decided. Two
        reconciles ending after `since`: the second began after the first ended (a key is never in two workers).
        With the resync an hour away nothing else may come, so while it waits it touches a label on the Workload,
        a change its watch queues and nothing reads. Then a test may assert that nothing happened."""
        since = time.time() if since is None else since
        workload = jobs.workload_of(self.kube, NAMESPACE, job)["metadata"]["name"]
        touches = itertools.count()

        def looked() -> bool:
            if self.reconciles_ended_since(workload, since) >= 2:
                return True
            self.kube.patch(*jobs.WORKLOAD, workload, {"metadata": {"labels": {LOOK_LABEL: str(next(touches))}}},
                            namespace=NAMESPACE)
            return False
        wait_for(looked, max(since - time.time(), 0) + timeout,
                 f"a reconcile of {job}'s Workload begun after {time.strftime('%H:%M:%S', time.localtime(since))}",
                 interval=0.3)

    def moves_recorded(self, job: str) -> list[dict]:
        return [e for e in self.kube.list("v1", "Event", namespace=NAMESPACE)
                if e["involvedObject"].get("kind") == "RayJob" and e["involvedObject"]["name"] == job
                and e["reason"] == "MovedToNextRung"]


class Runs:
    """The job's runs (RayClusters with pods) seen, poll by poll, while waiting: the most at once (never two)."""

    def __init__(self, tier: FailoverTier, job: str, timeout: float, interval: float = 0.1):
        self.tier, self.job, self.timeout, self.interval, self.most = tier, job, timeout, interval, 0

    def wait(self, probe, what: str, timeout: float | None = None):
        def polled():
            self.most = max(self.most, self.tier.runs_of(self.job))
            return probe()
        return wait_for(polled, self.timeout if timeout is None else timeout, what, interval=self.interval)


@contextlib.contextmanager
def controller_running(tier: FailoverTier, session, resync: float = RESYNC_SECONDS) -> Iterator[FailoverTier]:
    """The tier with its failover controller, for a module's tests; stopped at the end, its logs (the
    controller's, Kueue's) kept when a test of the session failed, for whoever reads the failure."""
    try:
        tier.start_controller(resync=resync)
        yield tier
    finally:
        failed = session.testsfailed > 0
        tier.plane.stop(keep_workdir=failed)
        if failed:
            print(f"\nfailover tier logs kept in {tier.plane.supervisor.logs}")


def start_failover_tier(pods_ready_timeout: int = PODS_READY_TIMEOUT_SECONDS, **settings) -> FailoverTier:
    """The platform of `platform_plan(**settings)` with its nodes, KubeRay and the scheduler, Kueue's
    waitForPodsReady on the tier's clock."""
    plan = platform_plan(**settings)
    return FailoverTier(ControlPlane(release_values(plan, pods_ready_timeout), nodes_of=plan), plan,
                        stack=settings.get("stack", "dev")).start()
