"""Kueue: the Helm release and the queue objects that try plan A (on-demand) before plan B (DWS).

The objects are built by small functions returning plain manifests, so tests validate them against the
upstream CRDs and the offline plan prints them, exactly as they are sent.
"""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_kubernetes as k8s

from infra.settings import PlanSettings, PlatformSettings
from infra.tpu import TPU_RESOURCE
from infra.tpu_pool import PLAN_LABEL_KEY

KUEUE_API_VERSION = "kueue.x-k8s.io/v1beta2"
# Ref: https://kueue.sigs.k8s.io/docs/installation/#install-by-helm
CHART = "oci://registry.k8s.io/kueue/charts/kueue"
# Another release name makes the controller crash-loop (kubernetes-sigs/kueue#6797).
RELEASE_NAME = "kueue"
NAMESPACE = "kueue-system"
# Beta and on since 0.18; set so older allowed charts behave the same. Never ProvisioningACC: removed in 0.15,
# the manager exits on an unknown gate.
FEATURE_GATES = ({"name": "ElasticJobsViaWorkloadSlices", "enabled": True},)

# The seed's object names, so its kubectl commands keep working.
DEFAULT_FLAVOR = "default-cpu"
CLUSTER_QUEUE = "cluster-queue"
LOCAL_QUEUE = "user-queue"
LOCAL_QUEUE_NAMESPACE = "default"
ADMISSION_CHECK = "dws-prov"
PROVISIONING_CONFIG = "dws-config"
PROVISIONING_CLASS = "queued-provisioning.gke.io"
NODEPOOL_LABEL_KEY = "cloud.google.com/gke-nodepool"
QUEUED_TAINT_KEY = "cloud.google.com/gke-queued"
COVERED_RESOURCES = ("cpu", "memory", TPU_RESOURCE)


def tolerate_no_schedule(key: str) -> dict:
    """A toleration of any NoSchedule taint with this key (GKE's TPU and queued-provisioning taints)."""
    return {"key": key, "operator": "Exists", "effect": "NoSchedule"}


def _manifest(kind: str, name: str, spec: dict, namespace: str | None = None) -> dict:
    metadata = {"name": name} if namespace is None else {"name": name, "namespace": namespace}
    return {"apiVersion": KUEUE_API_VERSION, "kind": kind, "metadata": metadata, "spec": spec}


def helm_values() -> dict:
    return {"controllerManager": {"featureGates": [dict(gate) for gate in FEATURE_GATES]}}


def default_flavor(settings: PlatformSettings) -> dict:
    return _manifest("ResourceFlavor", DEFAULT_FLAVOR,
                     {"nodeLabels": {NODEPOOL_LABEL_KEY: settings.system_pool.name}})


def plan_flavor(plan: PlanSettings) -> dict:
    spec: dict = {"nodeLabels": {PLAN_LABEL_KEY: plan.flavor}}
    if plan.flex_start:
        # GKE taints queued-provisioning nodes itself; Kueue adds this toleration to every pod it admits on
        # the flavor, so a job that forgot it still lands. Ref: https://kueue.sigs.k8s.io/docs/concepts/resource_flavor/
        spec["tolerations"] = [tolerate_no_schedule(QUEUED_TAINT_KEY)]
    return _manifest("ResourceFlavor", plan.flavor, spec)


def _quota(name: str, cpu: int, memory_gib: int, tpu_chips: int) -> dict:
    values = (str(cpu), f"{memory_gib}Gi", str(tpu_chips))
    return {"name": name, "resources": [
        {"name": resource, "nominalQuota": value} for resource, value in zip(COVERED_RESOURCES, values)]}


def flavor_quotas(settings: PlatformSettings) -> list[dict]:
    """Each flavor's quota is exactly the capacity behind it, derived from the machine types.

    The seed's "infinite" DWS quota made Kueue create ProvisioningRequests the pool can never satisfy and
    retry them forever (kubernetes-sigs/kueue#5129); a quota equal to pool capacity keeps such jobs queued.
    """
    system, tpu = settings.system_pool, settings.tpu
    quotas = [_quota(DEFAULT_FLAVOR, system.node_count * system.machine.vcpus,
                     system.node_count * system.machine.memory_gib, 0)]
    for plan in settings.plans:
        hosts = plan.hosts(settings.tpu)
        quotas.append(_quota(plan.flavor, hosts * tpu.machine_type.vcpus,
                             hosts * tpu.machine_type.memory_gib, plan.chips(tpu)))
    return quotas


def cluster_queue(settings: PlatformSettings) -> dict:
    # One resource group: a resource and a flavor may belong to one group only, and TPU pods must not mix
    # default-cpu's pool selector with a TPU flavor's. default-cpu has no TPU quota, so TPU pods skip it.
    spec: dict = {
        "namespaceSelector": {},
        "resourceGroups": [{"coveredResources": list(COVERED_RESOURCES), "flavors": flavor_quotas(settings)}],
    }
    if settings.flex_start.enabled:
        spec["admissionChecksStrategy"] = {
            "admissionChecks": [{"name": ADMISSION_CHECK, "onFlavors": [settings.flex_start.flavor]}]}
    manifest = _manifest("ClusterQueue", CLUSTER_QUEUE, spec)
    # `pulumi up` finishes only once Kueue reports the queue usable: its flavors and checks exist and, for
    # plan B, the ProvisioningRequest API answers. Ref: https://www.pulumi.com/blog/improved-kubernetes-await-logic/
    manifest["metadata"]["annotations"] = {"pulumi.com/waitFor": "condition=Active"}
    return manifest


def local_queue(namespace: str = LOCAL_QUEUE_NAMESPACE) -> dict:
    return _manifest("LocalQueue", LOCAL_QUEUE, {"clusterQueue": CLUSTER_QUEUE}, namespace=namespace)


def provisioning_request_config() -> dict:
    return _manifest("ProvisioningRequestConfig", PROVISIONING_CONFIG, {
        "provisioningClassName": PROVISIONING_CLASS,
        # Only the TPU pod sets go into the request; the Ray head and submitter run on default-pool.
        "managedResources": [TPU_RESOURCE],
        # Pods land on the very nodes provisioned for their request.
        # Ref: https://cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest (kueue#9048)
        "podSetUpdates": {"nodeSelector": [{
            "key": "autoscaling.gke.io/provisioning-request",
            "valueFromProvisioningClassDetail": "ResizeRequestName",
        }]},
    })


def admission_check() -> dict:
    return _manifest("AdmissionCheck", ADMISSION_CHECK, {
        "controllerName": "kueue.x-k8s.io/provisioning-request",
        "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "ProvisioningRequestConfig",
                       "name": PROVISIONING_CONFIG},
    })


class Kueue(pulumi.ComponentResource):
    """Kueue from its Helm chart, then flavors, the ClusterQueue, the LocalQueue and, for plan B, the DWS check.

    Every queue object waits for the release, which itself waits for the controller and its webhook.
    Destroy runs in reverse, so the controller is still there to release the objects' finalizers.
    """

    release: k8s.helm.v3.Release
    cluster_queue: k8s.apiextensions.CustomResource
    local_queue: k8s.apiextensions.CustomResource
    local_queue_name: str

    def __init__(self, name: str, settings: PlatformSettings, provider: k8s.Provider,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpu-fallback:infra:Kueue", name, None, opts)
        self._name, self._provider = name, provider

        namespace = k8s.core.v1.Namespace(f"{name}-namespace", metadata={"name": NAMESPACE},
                                          opts=pulumi.ResourceOptions(parent=self, provider=provider))
        self.release = k8s.helm.v3.Release(
            f"{name}-release",
            name=RELEASE_NAME,
            chart=CHART,
            version=settings.kueue_version,
            namespace=namespace.metadata["name"],
            values=helm_values(),
            # Awaited (no skip_await): the release is done once the controller and its webhook are ready.
            timeout=600,
            opts=pulumi.ResourceOptions(parent=self, provider=provider),
        )

        flavors = [self._object(default_flavor(settings))]
        flavors += [self._object(plan_flavor(plan)) for plan in settings.plans]
        checks = []
        if settings.flex_start.enabled:
            config = self._object(provisioning_request_config())
            checks.append(self._object(admission_check(), after=[config]))
        self.cluster_queue = self._object(cluster_queue(settings), after=[*flavors, *checks])
        self.local_queue = self._object(local_queue(), after=[self.cluster_queue])
        self.local_queue_name = LOCAL_QUEUE
        self.register_outputs({"localQueue": LOCAL_QUEUE})

    def _object(self, manifest: dict, after: Sequence[pulumi.Resource] = ()) -> k8s.apiextensions.CustomResource:
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        return k8s.apiextensions.CustomResource(
            f"{self._name}-{kind.lower()}-{name}",
            api_version=manifest["apiVersion"],
            kind=kind,
            metadata=manifest["metadata"],
            spec=manifest["spec"],
            opts=pulumi.ResourceOptions(parent=self, provider=self._provider, depends_on=[self.release, *after]),
        )
