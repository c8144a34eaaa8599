"""Kueue: the Helm release and the queue chain that admits a job on the first rung of the ladder with room.

The objects are built by small functions returning plain manifests, so tests validate them against the
upstream CRDs and the offline plan prints them, exactly as they are sent.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s
import yaml

from failover.api import TPU_RESOURCE
from failover.api.names import (CLUSTER_QUEUE, DEFAULT_FLAVOR, DWS_ADMISSION_CHECK as ADMISSION_CHECK,
                                KUEUE_API_VERSION, KUEUE_NAMESPACE as NAMESPACE, KUEUE_RELEASE as RELEASE_NAME,
                                LOCAL_QUEUE, MANAGER_CONFIG_KEY, MANAGER_CONFIG_MAP, NODE_POOL_LABEL, PROVISIONING_CLASS,
                                PROVISIONING_CONTROLLER)
from infra.rungs import SPOT_LABEL_KEY
from infra.settings import PlanSettings, PlatformSettings
from infra.tpu_pool import PLAN_LABEL_KEY

# The chart's name in its repository (`kueue.chartRepository`, registry.k8s.io's OCI path by default).
# Ref: https://kueue.sigs.k8s.io/docs/installation/#install-by-helm
CHART_NAME = "kueue"
# The release, its namespace and its manager ConfigMap are named in failover/api/names.py (`ops status` reads them).
VALUES_CONFIG_KEY = "controllerManagerConfigYaml"  # the chart value that the ConfigMap's key is rendered from
# Beta and on since 0.18; set so older allowed charts behave the same. Never ProvisioningACC: removed in 0.15,
# the manager exits on an unknown gate.
FEATURE_GATES = ({"name": "ElasticJobsViaWorkloadSlices", "enabled": True},)

# The seed's object names (DEFAULT_FLAVOR, CLUSTER_QUEUE, LOCAL_QUEUE: failover/api/names.py) keep its kubectl commands.
LOCAL_QUEUE_NAMESPACE = "default"
# Every ClusterQueue of the chain is in this cohort, so a queue can borrow the quota another one holds.
# Ref: https://kueue.sigs.k8s.io/docs/concepts/cohort/
COHORT = "tpu-fallback"
PROVISIONING_CONFIG = "dws-config"
QUEUED_TAINT_KEY = "cloud.google.com/gke-queued"
COVERED_RESOURCES = ("cpu", "memory", TPU_RESOURCE)


# GKE taints every TPU node so; a ResourceFlavor's nodeTaints make Kueue give the flavor only to pod sets that
# tolerate them, so a Ray head or submitter (no TPU toleration) is never assigned a TPU flavor. Needed with teams:
# a team's first rung tries every flavor (infra/teams.py FIRST_RUNG_FUNGIBILITY), and without the taint Kueue gave a
# head whose team's head CPU was in use the idle CPU of the team's TPU share (measured on the tier: head and
# submitter on `on-demand`, a pod no node can take). Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/tpus
# Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/scheduler/flavorassigner/flavorassigner.go#L1208-L1257
TPU_NODE_TAINT = {"key": TPU_RESOURCE, "value": "present", "effect": "NoSchedule"}


def tolerate_no_schedule(key: str) -> dict:
    """A toleration of any NoSchedule taint with this key (GKE's TPU and queued-provisioning taints)."""
    return {"key": key, "operator": "Exists", "effect": "NoSchedule"}


def _manifest(kind: str, name: str, spec: dict, namespace: str | None = None) -> dict:
    metadata = {"name": name} if namespace is None else {"name": name, "namespace": namespace}
    return {"apiVersion": KUEUE_API_VERSION, "kind": kind, "metadata": metadata, "spec": spec}


# The chart's default manager configuration, as a dict: `managerConfig.controllerManagerConfigYaml` replaces the
# whole default, so what we keep of it is written here and tests compare it with the chart, value by value.
# Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/charts/kueue/values.yaml (L119-208)
MANAGER_CONFIG_BASE = {
    "apiVersion": "config.kueue.x-k8s.io/v1beta2",
    "kind": "Configuration",
    "health": {"healthProbeBindAddress": ":8081"},
    "metrics": {"bindAddress": ":8443"},
    "webhook": {"port": 9443},
    "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
    "controller": {"groupKindConcurrency": {
        "Job.batch": 5,
        "Pod": 5,
        "Workload.kueue.x-k8s.io": 10,
        "LocalQueue.kueue.x-k8s.io": 5,
        "ClusterQueue.kueue.x-k8s.io": 5,
        "ResourceFlavor.kueue.x-k8s.io": 1,
    }},
    "clientConnection": {"qps": 300, "burst": 500},
    "integrations": {"frameworks": [
        "batch/job",
        "kubeflow.org/mpijob",
        "ray.io/rayjob",
        "ray.io/rayservice",
        "ray.io/raycluster",
        "jobset.x-k8s.io/jobset",
        "workload.codeflare.dev/appwrapper",
        "trainer.kubeflow.org/trainjob",
        "pod",
        "deployment",
        "statefulset",
        "leaderworkerset.x-k8s.io/leaderworkerset",
    ]},
}


def wait_for_pods_ready(settings: PlatformSettings) -> dict:
    """Kueue evicts and requeues a job whose pods are not all ready `podsReadyTimeout` after admission: a
    stocked-out rung (the pods never get nodes) gives its quota back instead of holding it for Kueue's 30m default.

    Config v1beta2 has no `enable` field (Kueue decodes strictly and refuses to start with one); the block is
    on by default, so setting it only changes the values. The timer starts at admission, so a DWS request
    waiting for capacity is not counted.
    Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/apis/config/v1beta2/defaults.go
    """
    timeout = f"{settings.fallback.pods_ready_timeout_seconds}s"
    return {
        "timeout": timeout,
        # A running job whose pods stop being ready (a host lost) gets as long to recover as a new one.
        "recoveryTimeout": timeout,
        # Other jobs keep being admitted while one waits for its pods.
        "blockAdmission": False,
        # Backoff counted from the eviction, 60s doubling to 30m; no backoffLimitCount: requeued forever.
        "requeuingStrategy": {"timestamp": "Eviction", "backoffBaseSeconds": 60, "backoffMaxSeconds": 1800},
    }


def manager_config(settings: PlatformSettings) -> dict:
    """The chart's default configuration plus waitForPodsReady. No `featureGates` here: they stay in
    `controllerManager.featureGates`, and Kueue refuses to start when both are set."""
    return {**copy.deepcopy(MANAGER_CONFIG_BASE), "waitForPodsReady": wait_for_pods_ready(settings)}


def chart_source(repository: str) -> dict:
    """The Release's chart arguments: an OCI repository names the chart by URL, an HTTPS one by repo option."""
    if repository.startswith("oci://"):
        return {"chart": f"{repository}/{CHART_NAME}"}
    return {"chart": CHART_NAME, "repository_opts": {"repo": repository}}


def helm_values(settings: PlatformSettings) -> dict:
    return values_for(manager_config(settings))


def values_for(configuration: dict) -> dict:
    """The chart's values for a manager configuration (a region's, or a fleet manager's: infra/fleet.py)."""
    return {
        "controllerManager": {"featureGates": [dict(gate) for gate in FEATURE_GATES]},
        "managerConfig": {VALUES_CONFIG_KEY: yaml.safe_dump(configuration, sort_keys=False)},
    }


def default_flavor(settings: PlatformSettings) -> dict:
    return _manifest("ResourceFlavor", DEFAULT_FLAVOR,
                     {"nodeLabels": {NODE_POOL_LABEL: settings.system_pool.name}})


def plan_flavor(plan: PlanSettings, shared: bool = False) -> dict:
    """A rung's flavor; `shared` (a platform with teams) also declares GKE's TPU node taint (see TPU_NODE_TAINT)."""
    spec: dict = {"nodeLabels": {PLAN_LABEL_KEY: plan.flavor}}
    if shared:
        spec["nodeTaints"] = [dict(TPU_NODE_TAINT)]
    if plan.kind.spot:
        # GKE's own label on Spot nodes, and the toleration of the taint our Spot pools carry: Kueue adds both to
        # every pod it admits on this flavor. Ref: https://cloud.google.com/kubernetes-engine/docs/how-to/spot-vms
        spec["nodeLabels"][SPOT_LABEL_KEY] = "true"
        spec["tolerations"] = [{**tolerate_no_schedule(SPOT_LABEL_KEY), "operator": "Equal", "value": "true"}]
    if plan.flex_start:
        # GKE taints queued-provisioning nodes itself; Kueue adds this toleration to every pod it admits on
        # the flavor, so a job that forgot it still lands. Ref: https://kueue.sigs.k8s.io/docs/concepts/resource_flavor/
        spec["tolerations"] = [tolerate_no_schedule(QUEUED_TAINT_KEY)]
    return _manifest("ResourceFlavor", plan.flavor, spec)


def flavor_quota(name: str, cpu: int, memory_gib: int, tpu_chips: int) -> dict:
    """One flavor's entry in a resource group: cpu, memory and TPU chips (infra/teams.py builds shares with it)."""
    values = (str(cpu), f"{memory_gib}Gi", str(tpu_chips))
    return {"name": name, "resources": [
        {"name": resource, "nominalQuota": value} for resource, value in zip(COVERED_RESOURCES, values)]}


def no_quota(name: str) -> dict:
    """A flavor listed with nothing of its own: the queue can still borrow it from its Cohort."""
    return {"name": name, "resources": [{"name": resource, "nominalQuota": "0"} for resource in COVERED_RESOURCES]}


def flavor_quotas(settings: PlatformSettings) -> list[dict]:
    """Each flavor's quota is exactly the capacity behind it, derived from the machine types.

    The seed's "infinite" DWS quota made Kueue create ProvisioningRequests the pool can never satisfy and
    retry them forever (kubernetes-sigs/kueue#5129); a quota equal to pool capacity keeps such jobs queued.
    """
    system, tpu = settings.system_pool, settings.tpu
    quotas = [flavor_quota(DEFAULT_FLAVOR, system.node_count * system.machine.vcpus,
                     system.node_count * system.machine.memory_gib, 0)]
    for plan in settings.plans:
        hosts = plan.hosts(settings.tpu)
        quotas.append(flavor_quota(plan.flavor, hosts * tpu.machine_type.vcpus,
                             hosts * tpu.machine_type.memory_gib, plan.chips(tpu)))
    return quotas


@dataclass(frozen=True)
class QueueRung:
    """One rung of the chain: a ClusterQueue whose flavor list starts at `flavor`, and its LocalQueue.

    The first rung is the seed's cluster-queue / user-queue and tries every plan in order; each lower rung's
    queue starts at its own plan, so a job moved there (after a stockout) skips the rungs above.
    """

    flavor: str
    cluster_queue: str
    local_queue: str

    def as_output(self) -> dict:
        return {"flavor": self.flavor, "clusterQueue": self.cluster_queue, "localQueue": self.local_queue}


def queue_chain(settings: PlatformSettings) -> tuple[QueueRung, ...]:
    """One rung per enabled plan, in the order Kueue tries them."""
    first, *lower = settings.plans
    return (QueueRung(first.flavor, CLUSTER_QUEUE, LOCAL_QUEUE),
            *(QueueRung(plan.flavor, f"{CLUSTER_QUEUE}-{plan.flavor}", f"{LOCAL_QUEUE}-{plan.flavor}")
              for plan in lower))


def chain_flavor_quotas(settings: PlatformSettings) -> dict[str, list[dict]]:
    """Per ClusterQueue of the chain, its flavors (default-cpu, then its rung and every rung below) and quotas.

    Each flavor's capacity is counted once: it lives in the queue whose chain starts at that flavor (default-cpu
    with the first rung's); every other queue that lists the flavor has a quota of 0 and, with no borrowingLimit,
    borrows it from the cohort. So the queues together never admit more than the pools hold. With teams, the
    capacity lives on the teams' queues and the root Cohort (infra/teams.py): these hold none and borrow what is left.
    """
    capacity = {quota["name"]: quota for quota in flavor_quotas(settings)}
    chain = queue_chain(settings)
    queues = {}
    for index, rung in enumerate(chain):
        owned = set() if settings.teams else {rung.flavor, DEFAULT_FLAVOR} if index == 0 else {rung.flavor}
        flavors = [DEFAULT_FLAVOR, *(lower.flavor for lower in chain[index:])]
        queues[rung.cluster_queue] = [capacity[name] if name in owned else no_quota(name) for name in flavors]
    return queues


def cluster_queues(settings: PlatformSettings) -> list[dict]:
    quotas = chain_flavor_quotas(settings)
    in_cohort = len(quotas) > 1 or bool(settings.teams)
    return [_cluster_queue(settings, name, flavors, in_cohort) for name, flavors in quotas.items()]


def _cluster_queue(settings: PlatformSettings, name: str, flavors: list[dict], in_cohort: bool) -> dict:
    # One resource group: a resource and a flavor may belong to one group only, and TPU pods must not mix
    # default-cpu's pool selector with a TPU flavor's. default-cpu has no TPU quota, so TPU pods skip it.
    spec: dict = {
        "namespaceSelector": {},
        "resourceGroups": [{"coveredResources": list(COVERED_RESOURCES), "flavors": flavors}],
    }
    if in_cohort:
        spec["cohortName"] = COHORT
    checked = [flavor["name"] for flavor in flavors if flavor["name"] in rungs_with_admission_check(settings)]
    if checked:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": ADMISSION_CHECK, "onFlavors": checked}]}
    manifest = _manifest("ClusterQueue", name, spec)
    # `pulumi up` finishes only once Kueue reports the queue usable: its flavors and checks exist and, for
    # plan B, the ProvisioningRequest API answers. Ref: https://www.pulumi.com/blog/improved-kubernetes-await-logic/
    manifest["metadata"]["annotations"] = {"pulumi.com/waitFor": "condition=Active"}
    return manifest


def local_queues(settings: PlatformSettings, namespace: str = LOCAL_QUEUE_NAMESPACE) -> Iterator[dict]:
    """The chain's LocalQueues in one namespace: jobs there can be queued on, or moved to, any rung."""
    for rung in queue_chain(settings):
        yield _manifest("LocalQueue", rung.local_queue, {"clusterQueue": rung.cluster_queue}, namespace=namespace)


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


def rungs_with_admission_check(settings: PlatformSettings) -> frozenset[str]:
    """The flavors Kueue admits on only after a ProvisioningRequest is provisioned (plan B's DWS)."""
    return frozenset(plan.flavor for plan in settings.plans if plan.kind.admission_check)


def admission_check() -> dict:
    return _manifest("AdmissionCheck", ADMISSION_CHECK, {
        "controllerName": PROVISIONING_CONTROLLER,
        "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "ProvisioningRequestConfig",
                       "name": PROVISIONING_CONFIG},
    })


def install_release(parent: pulumi.Resource, name: str, provider: k8s.Provider, version: str, repository: str,
                    values: dict) -> k8s.helm.v3.Release:
    """Kueue's namespace and Helm release (`<name>-namespace`, `<name>-release`), children of `parent`."""
    namespace = k8s.core.v1.Namespace(f"{name}-namespace", metadata={"name": NAMESPACE},
                                      opts=pulumi.ResourceOptions(parent=parent, provider=provider))
    return k8s.helm.v3.Release(
        f"{name}-release",
        name=RELEASE_NAME,
        **chart_source(repository),
        version=version,
        # The known name, not one lifted from the Namespace (a `pulumi up --target` that skips it has none);
        # depends_on keeps the order.
        namespace=NAMESPACE,
        values=values,
        # Awaited (no skip_await): the release is done once the controller and its webhook are ready.
        timeout=600,
        opts=pulumi.ResourceOptions(parent=parent, provider=provider, depends_on=[namespace]),
    )


class Kueue(pulumi.ComponentResource):
    """Kueue from its Helm chart, then flavors, for plan B the DWS check, and the chain of queues (a ClusterQueue
    and a LocalQueue per rung).

    Every queue object waits for the release, which itself waits for the controller and its webhook.
    Destroy runs in reverse, so the controller is still there to release the objects' finalizers.
    """

    release: k8s.helm.v3.Release
    queue_chain: tuple[QueueRung, ...]
    cluster_queues: dict[str, k8s.apiextensions.CustomResource]  # by name
    local_queues: dict[str, k8s.apiextensions.CustomResource]  # by name, in namespace default
    local_queue: k8s.apiextensions.CustomResource  # the first rung's, which jobs are submitted to
    local_queue_name: str

    def __init__(self, name: str, settings: PlatformSettings, provider: k8s.Provider,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpu-fallback:infra:Kueue", name, None, opts)
        self._name, self._provider = name, provider

        self.release = install_release(self, name, provider, settings.kueue_version,
                                       settings.kueue_chart_repository, helm_values(settings))

        flavors = [self._object(default_flavor(settings))]
        flavors += [self._object(plan_flavor(plan, shared=bool(settings.teams))) for plan in settings.plans]
        checks = []
        if settings.flex_start is not None:
            config = self._object(provisioning_request_config())
            checks.append(self._object(admission_check(), after=[config]))
        self.queue_chain = queue_chain(settings)
        self.cluster_queues = {manifest["metadata"]["name"]: self._object(manifest, after=[*flavors, *checks])
                               for manifest in cluster_queues(settings)}
        self.local_queues = {
            manifest["metadata"]["name"]: self._object(
                manifest, after=[self.cluster_queues[manifest["spec"]["clusterQueue"]]])
            for manifest in local_queues(settings)}
        self.local_queue_name = self.queue_chain[0].local_queue
        self.local_queue = self.local_queues[self.local_queue_name]
        self.register_outputs({"localQueue": self.local_queue_name,
                               "queueChain": [rung.as_output() for rung in self.queue_chain]})

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
