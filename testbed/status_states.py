"""Real objects in every state `python -m ops status` names, on one tier: a four-rung ladder (reservation, on-demand,
Spot, two DWS slices) with real KubeRay, scheduler and nodes, and jobs put where each state is, by Kueue itself; the
tests play only GCE capacity (stocked-out pools, GKE's ProvisioningRequest answers), the Ray head's job status, the
controller's annotations and its Deployment's pods (the tier runs no Deployment controller).

Kueue 0.19.2 reads a RayJob's PodsReady from `status.rayClusterStatus.state == "ready"` and its end from
`status.jobDeploymentStatus` Complete/Failed (pkg/controller/jobs/rayjob/rayjob_controller.go, PodsReady and Finished),
both written here by the real KubeRay.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from failover import api
from failover.regional.controller import COMPONENT
from failover.api import MOVE_EVENT_REASON
from infra import failover as stack_failover
from infra import kueue as stack_kueue
from infra.offline import Plan
from testbed import jobs
from testbed.failover_tier import FailoverTier, platform_plan
from testbed.kube import Kube, condition, wait_for

NAMESPACE = "default"
OTHER_NAMESPACE = "research"  # a second team's namespace: shown with -A only
# Kueue's waitForPodsReady on the tier's clock (stack.release_values), long enough that no job is evicted for its
# pods while the tests read it: the evictions here are deactivations.
PODS_READY_TIMEOUT_SECONDS = 600
LADDER = {"reservation": {"reservations": [{"name": "team-a-v6e", "slices": 1}]}, "spot": {"maxSlices": 1},
          "flexStart": {"maxSlices": 2}}
REACTION_TIMEOUT = 60  # Kueue reacting under four parallel test files on two cores


@dataclass(frozen=True)
class Placed:
    """One job as the scenario put it: where it was submitted, and the flavor whose quota it holds (if any)."""

    name: str
    namespace: str
    queue: str | None
    holds: str | None = None  # the flavor Kueue reserved for it, read back from its Workload


def install_kueue_config_map(tier: FailoverTier) -> None:
    """The chart's manager ConfigMap, as the release installs it (the tier's Kueue reads the same configuration
    from a file): where `status` reads the pods-ready timeout."""
    (config_map,) = [c for c in tier.plane.chart.of_kind("ConfigMap") if stack_kueue.MANAGER_CONFIG_KEY in (c.get("data") or {})]
    assert config_map["metadata"]["name"] == stack_kueue.MANAGER_CONFIG_MAP  # the name status reads is the chart's
    namespace = config_map["metadata"]["namespace"] = stack_kueue.NAMESPACE
    if tier.kube.get("v1", "Namespace", namespace) is None:
        tier.kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    tier.kube.create(config_map)


def ladder_plan() -> Plan:
    return platform_plan(grace=60, overrides=LADDER)


def now_text() -> str:
    return api.format_time(datetime.datetime.now(datetime.timezone.utc))


def submit(kube: Kube, name: str, queue: str | None, namespace: str = NAMESPACE) -> Placed:
    """Create a copy of the dev RayJob and wait for Kueue's decision (none without a queue label)."""
    job = jobs.dev_rayjob(name, queue)
    job["metadata"]["namespace"] = namespace
    if queue is None:
        job["metadata"]["labels"].pop(jobs.QUEUE_LABEL, None)
    kube.create(job)
    if queue is None:
        return Placed(name, namespace, None)
    workload = jobs.wait_decided(kube, namespace, name, REACTION_TIMEOUT)
    return Placed(name, namespace, queue, jobs.tpu_flavor(workload)
                  if condition(workload, "QuotaReserved") == "True" else None)


def wait_condition(kube: Kube, placed: Placed, kind: str, status: str = "True") -> dict:
    return wait_for(lambda: (w := jobs.workload_of(kube, placed.namespace, placed.name)) and condition(w, kind) == status
                    and w, REACTION_TIMEOUT, f"{kind}={status} on {placed.name}")


def deactivate(kube: Kube, placed: Placed) -> None:
    workload = jobs.workload_of(kube, placed.namespace, placed.name)
    kube.patch(*jobs.WORKLOAD, workload["metadata"]["name"], {"spec": {"active": False}}, namespace=placed.namespace)
    wait_condition(kube, placed, "Evicted")
    wait_condition(kube, placed, "QuotaReserved", "False")


def record_admitted_flavor(kube: Kube, placed: Placed) -> None:
    """What the controller writes on a Workload while it is admitted (Kueue clears status.admission on eviction)."""
    workload = jobs.workload_of(kube, placed.namespace, placed.name)
    kube.patch(*jobs.WORKLOAD, workload["metadata"]["name"], {"metadata": {"annotations": {
        api.ADMITTED_FLAVOR_ANNOTATION: jobs.tpu_flavor(workload)}}}, namespace=placed.namespace)


def annotate_moves(kube: Kube, placed: Placed, history: list[api.Move], latest: api.Move) -> None:
    """The controller's record on the RayJob: its latest move (`tpu-fallback/failover`) and the completed ones."""
    recorded = None
    for move in history:
        recorded = api.with_move_recorded({api.MOVES_ANNOTATION: recorded} if recorded else None, move)
    annotations = {api.FAILOVER_ANNOTATION: latest.to_json()}
    if recorded:
        annotations[api.MOVES_ANNOTATION] = recorded
    kube.patch(*jobs.RAYJOB, placed.name, {"metadata": {"annotations": annotations}}, namespace=placed.namespace)


def move_by_hand(kube: Kube, placed: Placed, move: api.Move) -> None:
    """The controller's move route (README, "How the fallback works"): intent, deactivate, relabel the RayJob, repoint
    the Workload, reactivate, record the move done."""
    annotate_moves(kube, placed, [], move)
    name = jobs.workload_of(kube, placed.namespace, placed.name)["metadata"]["name"]
    kube.patch(*jobs.WORKLOAD, name, {"spec": {"active": False}}, namespace=placed.namespace)
    wait_for(lambda: jobs.suspended(kube.get(*jobs.RAYJOB, placed.name, placed.namespace)), REACTION_TIMEOUT,
             f"{placed.name} suspended")
    kube.patch(*jobs.RAYJOB, placed.name, {"metadata": {"labels": {jobs.QUEUE_LABEL: move.to_local_queue}}},
               namespace=placed.namespace)
    kube.patch(*jobs.WORKLOAD, name, {"spec": {"queueName": move.to_local_queue}}, namespace=placed.namespace)
    kube.patch(*jobs.WORKLOAD, name, {"spec": {"active": True}}, namespace=placed.namespace)
    annotate_moves(kube, placed, [move], move.done())
    wait_for(lambda: condition(kube.get(*jobs.WORKLOAD, name, placed.namespace), "QuotaReserved") == "False"
             and kube.get(*jobs.WORKLOAD, name, placed.namespace)["spec"].get("active", True), REACTION_TIMEOUT,
             f"{placed.name} pending in {move.to_local_queue}")


def wait_released(kube: Kube, flavor: str) -> None:
    """Until no ClusterQueue reports quota reserved on `flavor` (Kueue writes its status after its cache)."""
    def free() -> bool:
        for queue in kube.list(stack_kueue.KUEUE_API_VERSION, "ClusterQueue"):
            for entry in (queue.get("status") or {}).get("flavorsReservation") or []:
                if entry["name"] == flavor and any(r.get("total") not in ("0", None) for r in entry["resources"]):
                    return False
        return True
    wait_for(free, REACTION_TIMEOUT, f"{flavor} quota released")


def create_every_state(tier: FailoverTier) -> dict[str, Placed]:
    """Every job state, in an order that makes Kueue put each where intended; placed jobs by name."""
    kube, placed = tier.kube, {}

    def keep(job: Placed) -> Placed:
        placed[job.name] = job
        return job

    # Finished: admitted on rung 0, where it runs; the Ray job ends and KubeRay completes the RayJob; Kueue releases
    # its quota.
    done = keep(submit(kube, "st-finished", "user-queue"))
    wait_condition(kube, done, "PodsReady")
    tier.plane.after.ray_head.finish(NAMESPACE, done.name, "SUCCEEDED")
    wait_condition(kube, done, "Finished")
    wait_released(kube, done.holds)
    # Running: rung 0 again; its pods run, KubeRay reports its RayCluster ready, which Kueue takes as PodsReady.
    running = keep(submit(kube, "st-running", "user-queue"))
    wait_condition(kube, running, "PodsReady")
    # Every rung below is out of capacity and nothing says so (DWS: provisioned, but its VMs never come): what is
    # admitted there waits for its pods.
    tier.stockout("on-demand", "spot", "dws", reported=False)
    # Admitted, pods not ready: the next rung, stocked out.
    keep(submit(kube, "st-admitted", "user-queue"))
    # Evicted: admitted on the next rung down, recorded as the controller does, then deactivated.
    evicted = keep(submit(kube, "st-evicted", "user-queue"))
    record_admitted_flavor(kube, evicted)
    deactivate(kube, evicted)
    wait_released(kube, evicted.holds)
    # Moving: admitted where the last one was (its quota is free again), then a move the controller began.
    moving = keep(submit(kube, "st-moving", "user-queue"))
    annotate_moves(kube, moving, [], api.Move(moving.holds, "dws", "user-queue-dws", api.STOCKOUT,
                                              now_text()))
    deactivate(kube, moving)
    wait_released(kube, moving.holds)
    # Another namespace's job takes that rung once more (it borrows: its quota lives in the rung's own queue).
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OTHER_NAMESPACE}})
    kube.create({"apiVersion": stack_kueue.KUEUE_API_VERSION, "kind": "LocalQueue",
                 "metadata": {"name": stack_kueue.LOCAL_QUEUE, "namespace": OTHER_NAMESPACE},
                 "spec": {"clusterQueue": stack_kueue.CLUSTER_QUEUE}})
    keep(submit(kube, "st-other-team", "user-queue", namespace=OTHER_NAMESPACE))
    # Waiting for a DWS slice, after two moves: quota reserved on dws, its ProvisioningRequest accepted by GKE.
    walked = keep(submit(kube, "st-dws-wait", "user-queue-dws"))
    hops = [api.Move("on-demand", "spot", "user-queue-spot", api.STOCKOUT, now_text()),
            api.Move("spot", "dws", "user-queue-dws", api.PODS_READY_TIMEOUT, now_text())]
    annotate_moves(kube, walked, hops, hops[-1].done())
    jobs.mark_accepted(kube, jobs.wait_provisioning_request(kube, NAMESPACE, walked.name, REACTION_TIMEOUT))
    # Provisioned: the second DWS slice came; Kueue admits it.
    provisioned = keep(submit(kube, "st-dws-provisioned", "user-queue-dws"))
    jobs.mark_provisioned(kube, jobs.wait_provisioning_request(kube, NAMESPACE, provisioned.name, REACTION_TIMEOUT),
                          "tier-resize-1")
    wait_condition(kube, provisioned, "Admitted")
    # Waiting for quota: both DWS slices are taken.
    keep(submit(kube, "st-waiting", "user-queue-dws"))
    # Moved, waiting: found no quota on any rung of user-queue, then moved down the chain by the controller's route.
    moved = keep(submit(kube, "st-moved-waiting", "user-queue"))
    move_by_hand(kube, moved, api.Move("on-demand", "dws", "user-queue-dws", api.STOCKOUT, now_text()))
    placed[moved.name] = Placed(moved.name, moved.namespace, "user-queue-dws", moved.holds)
    # Not queued: no queue label, so Kueue leaves it alone.
    keep(submit(kube, "st-no-queue", None))
    return placed


def play_a_healthy_controller(kube: Kube, restarts: int, moved: Placed, message: str) -> None:
    """What the tier has no deployment controller or kubelet for: the Deployment's ready status and its pod's restart
    count, plus the Event the controller writes when it moves a job. The pod is scheduling-gated: otherwise the
    tier's real scheduler binds it to a KWOK node, whose status (no restarts) replaces the one played here."""
    kube.patch("apps/v1", "Deployment", stack_failover.NAME, {"status": {
        "replicas": 1, "readyReplicas": 1, "availableReplicas": 1, "updatedReplicas": 1}},
        namespace=stack_failover.NAMESPACE, subresource="status")
    deployment = kube.get("apps/v1", "Deployment", stack_failover.NAME, stack_failover.NAMESPACE)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    pod = f"{stack_failover.NAME}-tier"
    kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": pod, "namespace": stack_failover.NAMESPACE,
        "labels": deployment["spec"]["selector"]["matchLabels"]},
        "spec": {"containers": [{"name": container["name"], "image": container["image"]}],
                 "schedulingGates": [{"name": "tpu-fallback.test/played-by-the-test"}]}})
    kube.patch("v1", "Pod", pod, {"status": {"phase": "Running", "containerStatuses": [{
        "name": container["name"], "ready": True, "restartCount": restarts, "image": container["image"],
        "imageID": "", "state": {"running": {"startedAt": now_text()}}}]}},
        namespace=stack_failover.NAMESPACE, subresource="status")
    rayjob = kube.get(*jobs.RAYJOB, moved.name, moved.namespace)
    now = now_text()
    kube.create({"apiVersion": "v1", "kind": "Event",
                 "metadata": {"name": f"{moved.name}.tier-move", "namespace": moved.namespace},
                 "involvedObject": {"apiVersion": jobs.RAYJOB[0], "kind": jobs.RAYJOB[1], "name": moved.name,
                                    "namespace": moved.namespace, "uid": rayjob["metadata"]["uid"]},
                 "reason": MOVE_EVENT_REASON, "message": message, "type": "Normal", "count": 1,
                 "firstTimestamp": now, "lastTimestamp": now, "source": {"component": COMPONENT}})
