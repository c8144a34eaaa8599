"""Reading what Kueue decided about a RayJob on the tier, and playing GKE's autoscaler for DWS requests."""

from __future__ import annotations

import copy
import datetime
from collections.abc import Callable
from dataclasses import dataclass

from infra.kueue import KUEUE_API_VERSION
from testbed.plans import plan_for
from testbed.stack import Step
from workloads.rayjob import QUEUE_LABEL
from testbed.kube import Kube, condition, condition_reason, wait_for

RAYJOB = ("ray.io/v1", "RayJob")
RAYCLUSTER = ("ray.io/v1", "RayCluster")
WORKLOAD = (KUEUE_API_VERSION, "Workload")
PROVISIONING_REQUEST = ("autoscaling.x-k8s.io/v1", "ProvisioningRequest")
PROVISIONING_REQUEST_LABEL = "autoscaling.gke.io/provisioning-request"


def workload_of(kube: Kube, namespace: str, rayjob: str) -> dict | None:
    """The Workload Kueue made for a RayJob (found by owner, as its name carries a hash)."""
    for workload in kube.list(*WORKLOAD, namespace=namespace):
        owners = workload["metadata"].get("ownerReferences") or []
        if any(o["kind"] == RAYJOB[1] and o["name"] == rayjob for o in owners):
            return workload
    return None


def decided(workload: dict | None) -> bool:
    """Kueue has either reserved quota for the Workload or found it does not fit (pending)."""
    return workload is not None and condition(workload, "QuotaReserved") is not None


def tpu_flavor(workload: dict, tpu_resource: str = "google.com/tpu") -> str | None:
    """The flavor Kueue assigned to the pod set that requests TPUs."""
    admission = (workload.get("status") or {}).get("admission") or {}
    for assignment in admission.get("podSetAssignments") or []:
        if tpu_resource in (assignment.get("flavors") or {}):
            return assignment["flavors"][tpu_resource]
    return None


def check_states(workload: dict) -> dict[str, str]:
    return {check["name"]: check["state"] for check in (workload.get("status") or {}).get("admissionChecks") or []}


@dataclass(frozen=True)
class Decision:
    """What Kueue decided for one job: flavor (None: still pending), admitted, and the check states."""

    job: str
    flavor: str | None
    admitted: bool
    checks: dict[str, str]
    reason: str | None


def decision(kube: Kube, namespace: str, rayjob: str) -> Decision:
    workload = workload_of(kube, namespace, rayjob) or {}
    return Decision(rayjob, tpu_flavor(workload) if condition(workload, "QuotaReserved") == "True" else None,
                    condition(workload, "Admitted") == "True", check_states(workload),
                    condition_reason(workload, "QuotaReserved"))


def wait_decided(kube: Kube, namespace: str, rayjob: str, timeout: float = 30.0) -> dict:
    def judged() -> dict | None:
        workload = workload_of(kube, namespace, rayjob)
        return workload if decided(workload) else None
    return wait_for(judged, timeout, f"Kueue's decision on {rayjob}")


def judged_in_order(kube: Kube, timeout: float = 30.0) -> Callable[[Step], None]:
    """A deploy hook that waits for Kueue's decision on each RayJob before the next is created, so jobs are
    judged in submission order (pulumi up creates them in parallel; the tests need a fixed order)."""
    def hook(step: Step) -> None:
        if step.manifest and step.manifest["kind"] == "RayJob":
            meta = step.manifest["metadata"]
            wait_decided(kube, meta["namespace"], meta["name"], timeout)
    return hook


def dev_rayjob(name: str | None = None, queue: str | None = None, stack: str = "dev") -> dict:
    """A copy of the dev stack's first RayJob (`stack`: another stack's), optionally renamed and queued elsewhere."""
    (template,) = [m for m in plan_for(stack).kubernetes_manifests() if m["kind"] == "RayJob"][:1]
    job = copy.deepcopy(template)
    if name:
        job["metadata"]["name"] = name
    if queue:
        job["metadata"]["labels"][QUEUE_LABEL] = queue
    return job


def dev_job_objects(namespace: str | None = None) -> list[dict]:
    """What the dev stack's RayJobs need in their namespace (`namespace`: another one's copies): the ServiceAccount
    they run as and the ConfigMap of the training script. KubeRay creates no pod for a RayCluster whose
    ServiceAccount is missing (measured: the RayCluster stays without pods, `ServiceAccount "ray-training" not
    found`), so a tier that submits copies of these jobs where the plan declares none creates them first."""
    (template,) = [m for m in plan_for().kubernetes_manifests() if m["kind"] == "RayJob"][:1]
    spec = template["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    wanted = {("ServiceAccount", spec["serviceAccountName"]),
              *(("ConfigMap", v["configMap"]["name"]) for v in spec.get("volumes") or [] if "configMap" in v)}
    found = [copy.deepcopy(m) for m in plan_for().kubernetes_manifests()
             if (m["kind"], m["metadata"]["name"]) in wanted
             and m["metadata"].get("namespace") == template["metadata"]["namespace"]]
    for manifest in found:
        manifest["metadata"]["namespace"] = namespace or manifest["metadata"]["namespace"]
    return found


def prepare_namespace(kube: Kube, namespace: str) -> None:
    """`dev_job_objects` in `namespace`, those it lacks."""
    for manifest in dev_job_objects(namespace):
        meta = manifest["metadata"]
        if kube.get(manifest["apiVersion"], manifest["kind"], meta["name"], namespace) is None:
            kube.create(manifest)


def provisioning_requests(kube: Kube, namespace: str, workload: dict) -> list[dict]:
    uid = workload["metadata"]["uid"]
    return [request for request in kube.list(*PROVISIONING_REQUEST, namespace=namespace)
            if any(o.get("uid") == uid for o in request["metadata"].get("ownerReferences") or [])]


def wait_provisioning_request(kube: Kube, namespace: str, rayjob: str, timeout: float = 30.0) -> dict:
    def find():
        workload = workload_of(kube, namespace, rayjob)
        return workload and (provisioning_requests(kube, namespace, workload) or [None])[0]
    return wait_for(find, timeout, f"ProvisioningRequest for {rayjob}")


def mark_provisioned(kube: Kube, request: dict, resize_request: str) -> None:
    """What GKE's autoscaler reports once DWS has the slice: Provisioned=True and the resize request's name."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    meta = request["metadata"]
    kube.patch(*PROVISIONING_REQUEST, meta["name"], {"status": {
        "conditions": [
            {"type": "Accepted", "status": "True", "reason": "Accepted", "message": "tier", "lastTransitionTime": now},
            {"type": "Provisioned", "status": "True", "reason": "Provisioned", "message": "tier",
             "lastTransitionTime": now}],
        "provisioningClassDetails": {"ResizeRequestName": resize_request},
    }}, namespace=meta["namespace"], subresource="status")


def mark_accepted(kube: Kube, request: dict) -> None:
    """What GKE reports once DWS has queued the request: Accepted=True, nothing provisioned yet."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    meta = request["metadata"]
    kube.patch(*PROVISIONING_REQUEST, meta["name"], {"status": {"conditions": [
        {"type": "Accepted", "status": "True", "reason": "Accepted", "message": "tier", "lastTransitionTime": now}]}},
        namespace=meta["namespace"], subresource="status")


def suspended(rayjob: dict) -> bool:
    return bool(rayjob["spec"].get("suspend", False))  # the server may omit `suspend: false`


def worker_template(rayjob: dict) -> dict:
    (group,) = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    return group["template"]


# ---- a run's pods, as KubeRay made them and the scheduler placed them (tiers with nodes: runtime.py) -----------
NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"


def pods_of(kube: Kube, namespace: str, rayjob: str) -> dict[str, list[dict]]:
    """The current run's pods by role: head and worker (KubeRay's `ray.io/node-type`) and submitter (KubeRay's
    Job, named after the RayJob)."""
    job = kube.get(*RAYJOB, rayjob, namespace) or {}
    cluster = (job.get("status") or {}).get("rayClusterName")
    roles: dict[str, list[dict]] = {"head": [], "worker": [], "submitter": []}
    for pod in kube.list("v1", "Pod", namespace=namespace):
        labels = pod["metadata"].get("labels") or {}
        if cluster and labels.get("ray.io/cluster") == cluster:
            roles.setdefault(labels.get("ray.io/node-type", "?"), []).append(pod)
        elif any(o["kind"] == "Job" and o["name"] == rayjob for o in pod["metadata"].get("ownerReferences") or []):
            roles["submitter"].append(pod)
    return roles


def running(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running" and condition(pod, "Ready") == "True"


def pools_of(kube: Kube, namespace: str, rayjob: str) -> dict[str, list[str]] | None:
    """role -> the node pools its pods run on, once every pod of the run (submitter included) is Running and
    Ready; None before."""
    roles = pods_of(kube, namespace, rayjob)
    if not roles["submitter"] or not all(running(p) for ps in roles.values() for p in ps):
        return None
    pools = {n["metadata"]["name"]: n["metadata"]["labels"].get(NODEPOOL_LABEL) for n in kube.list("v1", "Node")}
    if any(p["spec"]["nodeName"] not in pools for ps in roles.values() for p in ps):
        return None  # a pod on a node that is gone: not running anywhere that counts
    return {role: sorted(pools[p["spec"]["nodeName"]] for p in ps) for role, ps in roles.items()}


def wait_pods_ready(kube: Kube, namespace: str, rayjob: str, timeout: float) -> dict:
    """The Workload once Kueue says PodsReady (read from KubeRay's RayCluster status, after the head answered)."""
    def ready():
        workload = workload_of(kube, namespace, rayjob)
        return workload if condition(workload, "PodsReady") == "True" else None
    return wait_for(ready, timeout, f"{rayjob}: PodsReady")


def first_stockout_report(kube: Kube, namespace: str, rayjob: str) -> str | None:
    """The firstTimestamp of GKE's first "GCE out of resources" Event (FailedScaleUp) on a pod of the job's current
    run, or None yet."""
    cluster = ((kube.get(*RAYJOB, rayjob, namespace) or {}).get("status") or {}).get("rayClusterName")
    stamps = [e["firstTimestamp"] for e in kube.list("v1", "Event", namespace=namespace)
              if cluster and e["reason"] == "FailedScaleUp" and e["involvedObject"]["name"].startswith(f"{cluster}-")]
    return min(stamps) if stamps else None
