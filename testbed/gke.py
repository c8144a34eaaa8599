"""GKE's half of the tier, derived from the plan: its node pools as node templates, and an autoscaler stand-in.

Every node pool the plan declares (the cluster's `default-pool` and each `NodePool`) becomes a `NodeTemplate`
carrying what GKE puts on that pool's nodes; nothing here is written per test. The `Autoscaler` plays GKE's
cluster autoscaler and DWS over those templates: it grows a pool when a pod the scheduler could not place fits the
pool's template (a multi-host slice appears whole), creates a queued pool's slice once its ProvisioningRequest is
Provisioned, says "GCE out of resources" about a pod when a stockout is scripted, and removes a slice once no pod
runs on it. Nodes are KWOK's (testbed/runtime.py): they become Ready, pods on them Running, no container
runs.

What GKE puts on a node, with where each comes from:
- labels on every node: `cloud.google.com/gke-nodepool`, `node.kubernetes.io/instance-type`,
  `topology.kubernetes.io/zone` and `region`, `kubernetes.io/hostname`, `kubernetes.io/os`, `kubernetes.io/arch`;
  Ref: https://cloud.google.com/kubernetes-engine/docs/how-to/creating-managing-labels#automatically-applied-labels
- TPU nodes: `cloud.google.com/gke-tpu-accelerator` and `cloud.google.com/gke-tpu-topology` (the slice's, or the
  machine's single-host topology), the taint `google.com/tpu=present:NoSchedule` and `google.com/tpu` chips
  allocatable; Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/tpus and
  https://cloud.google.com/kubernetes-engine/docs/how-to/tpus (nodeSelector and toleration examples);
- Spot nodes: the label `cloud.google.com/gke-spot=true` (GKE adds no Spot taint: a pool that wants one declares
  it, and it is then on the template from the pool's own `nodeConfig.taints`);
  Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms#scheduling-workloads
- flex-start nodes: the label `cloud.google.com/gke-flex-start=true`, which a workload selects to run on them;
  Ref: https://cloud.google.com/kubernetes-engine/docs/how-to/dws-flex-start-training (its nodeSelector);
- queued-provisioning nodes: the taint `cloud.google.com/gke-queued` (NoSchedule) and, per ProvisioningRequest, the
  label `autoscaling.gke.io/provisioning-request=<ResizeRequestName>` that Kueue's podSetUpdates select.
  Ref: https://cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest ("tolerate the
  cloud.google.com/gke-queued taint"). **Assumed:** the taint's value `true` (the docs name only its key; every
  toleration here uses `operator: Exists`, so the value cannot matter).
- allocatable: the machine's vCPU and memory less GKE's reservations (CPU: 6 % of the first core, 1 % of the next,
  0.5 % of the next two, 0.25 % above four; memory: 25 % of the first 4 GiB, 20 % of the next 4, 10 % of the next 8,
  6 % of the next 112, 2 % above 128, and a 100 MiB eviction threshold), 110 pods.
  Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/plan-node-sizes#cpu_reservations
"""

from __future__ import annotations

import datetime
import itertools
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from failover.api import ACTIVE_MAINTENANCE_LABEL, MAINTENANCE_ONGOING, SCHEDULED_MAINTENANCE_LABEL, TPU_RESOURCE
from infra import tpu as catalogue
from infra.cpu import lookup_cpu_machine
from infra.offline import Plan
from testbed.kube import Kube, condition

CLUSTER_TYPE = "gcp:container/cluster:Cluster"
NODE_POOL_TYPE = "gcp:container/nodePool:NodePool"
RESOURCE_POLICY_TYPE = "gcp:compute/resourcePolicy:ResourcePolicy"  # a TPU7x workload policy
DEFAULT_POOL = "default-pool"  # the pool GKE makes from the cluster's own node_config
NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"
SPOT_LABEL = "cloud.google.com/gke-spot"
FLEX_START_LABEL = "cloud.google.com/gke-flex-start"
QUEUED_TAINT = "cloud.google.com/gke-queued"
PROVISIONING_REQUEST_LABEL = "autoscaling.gke.io/provisioning-request"
TPU_TAINT = {"key": TPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
# The node lifecycle controller's taint on a host whose kubelet stopped reporting (a failed host: lose_slice's
# going_taint). Ref: https://kubernetes.io/docs/reference/labels-annotations-taints/#node-kubernetes-io-unreachable
UNREACHABLE_TAINT = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}
# GKE's taint on a node that is about to go: a Spot VM's preemption notice, and a host maintenance once it begins.
# Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms#termination-graceful-shutdown
# Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/handle-disruption-gpu-tpu
IMPENDING_TERMINATION_TAINT = MappingProxyType({"key": "cloud.google.com/impending-node-termination",
                                               "effect": "NoSchedule"})
# KWOK manages exactly the nodes carrying this annotation (runtime.py starts it with that selector).
KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
# The tier's own bookkeeping on a node: which slice it belongs to (a multi-host slice comes and goes whole).
SLICE_ANNOTATION = "tier.tpu-fallback/slice"
MAX_PODS = "110"
MIN_GAP = 0.1  # seconds between two autoscaler passes: the changes of a burst (a RayCluster's pods) make one pass
# The cluster autoscaler's taint on a node it is about to remove.
# Ref: https://github.com/kubernetes/autoscaler/blob/cluster-autoscaler-1.36.1/cluster-autoscaler/utils/taints/taints.go
TO_BE_DELETED_TAINT = MappingProxyType({"key": "ToBeDeletedByClusterAutoscaler", "value": "tier",
                                        "effect": "NoSchedule"})
# What GKE's autoscaler says on a pod when the zone has no capacity (failover/api/events.py STOCKOUT_MESSAGE matches it).
STOCKOUT_MESSAGE = ("Node scale up in zones {zone} associated with this pod failed: GCE out of resources. "
                    "Pod is at risk of not being scheduled.")
# The Pulumi enum of a taint's effect and the Kubernetes one.
_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "PREFER_NO_SCHEDULE": "PreferNoSchedule", "NO_EXECUTE": "NoExecute"}


# ---- what GKE leaves to pods ------------------------------------------------------------------------------------
def reserved_millicores(vcpus: int) -> int:
    """GKE's CPU reservation for a node of `vcpus` cores, in millicores."""
    tiers = ((1, 60), (1, 10), (2, 5))  # (cores, millicores reserved per core)
    reserved, left = 0.0, vcpus
    for cores, per_core in tiers:
        taken = min(left, cores)
        reserved, left = reserved + taken * per_core, left - taken
    return round(reserved + left * 2.5)


def reserved_mebibytes(memory_gib: int) -> int:
    """GKE's memory reservation (eviction threshold included) for a node of `memory_gib` GiB, in MiB."""
    tiers = ((4, 0.25), (4, 0.20), (8, 0.10), (112, 0.06))  # (GiB, fraction reserved)
    reserved, left = 0.0, float(memory_gib)
    for gib, fraction in tiers:
        taken = min(left, gib)
        reserved, left = reserved + taken * fraction, left - taken
    return round((reserved + left * 0.02) * 1024) + 100


def allocatable(vcpus: int, memory_gib: int, tpu_chips: int = 0) -> dict[str, str]:
    resources = {"cpu": f"{vcpus * 1000 - reserved_millicores(vcpus)}m",
                 "memory": f"{memory_gib * 1024 - reserved_mebibytes(memory_gib)}Mi", "pods": MAX_PODS}
    if tpu_chips:
        resources[TPU_RESOURCE] = str(tpu_chips)
    return resources


# ---- node templates ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeTemplate:
    """One node pool as GKE makes its nodes: a slice is `hosts` nodes created and removed together."""

    pool: str
    machine_type: str
    labels: Mapping[str, str]
    taints: tuple[Mapping[str, str], ...]
    allocatable: Mapping[str, str]
    hosts: int
    max_nodes: int  # autoscaling.maxNodeCount (one zone), or the fixed size of a pool that does not autoscale
    autoscaled: bool
    queued: bool  # queued provisioning: nodes only through a ProvisioningRequest
    spot: bool

    @property
    def tpu(self) -> bool:
        return TPU_RESOURCE in self.allocatable


def node_templates(plan: Plan) -> tuple[NodeTemplate, ...]:
    """Every pool the plan declares, as GKE would make its nodes."""
    cluster = plan.only(CLUSTER_TYPE).inputs
    zone = cluster["location"]
    default = cluster["nodeConfig"]
    templates = [_template(DEFAULT_POOL, default, zone, autoscaling=None, topology=None, queued=False,
                           fixed_nodes=int(cluster["initialNodeCount"]))]
    policies = {policy.inputs["name"]: policy.inputs for policy in plan.of_type(RESOURCE_POLICY_TYPE)}
    for pool in plan.of_type(NODE_POOL_TYPE):
        inputs = pool.inputs
        templates.append(_template(
            inputs["name"], inputs["nodeConfig"], inputs.get("location") or zone, inputs.get("autoscaling"),
            _pool_topology(inputs.get("placementPolicy") or {}, policies),
            bool((inputs.get("queuedProvisioning") or {}).get("enabled")),
            fixed_nodes=int(inputs.get("nodeCount") or inputs.get("initialNodeCount") or 0)))
    return tuple(templates)


def _pool_topology(placement: Mapping, policies: Mapping[str, Mapping]) -> str | None:
    """A multi-host pool's slice topology, where GKE reads it: the pool's own (v5e, v5p, v6e), or the accelerator
    topology of the workload policy the pool names (TPU7x). None: a single-host pool."""
    if placement.get("tpuTopology"):
        return placement["tpuTopology"]
    if placement.get("policyName"):
        return policies[placement["policyName"]]["workloadPolicy"]["acceleratorTopology"]
    return None


def _template(pool: str, node_config: Mapping, zone: str, autoscaling: Mapping | None, topology: str | None,
              queued: bool, fixed_nodes: int) -> NodeTemplate:
    machine_type = node_config["machineType"]
    spot = bool(node_config.get("spot"))
    labels = {**(node_config.get("labels") or {}), NODEPOOL_LABEL: pool,
              "node.kubernetes.io/instance-type": machine_type, "topology.kubernetes.io/zone": zone,
              "topology.kubernetes.io/region": zone.rsplit("-", 1)[0], "kubernetes.io/os": "linux",
              "kubernetes.io/arch": "amd64"}
    taints = [{"key": t["key"], "value": t.get("value", ""), "effect": _EFFECTS[t["effect"]]}
              for t in node_config.get("taints") or []]
    hosts = 1
    machine = catalogue.MACHINE_TYPES.get(machine_type)
    if machine is not None:
        tpu_slice = catalogue.lookup_slice(machine_type, topology or machine.single_host_topology)
        hosts = tpu_slice.hosts
        labels |= {catalogue.ACCELERATOR_LABEL_KEY: tpu_slice.accelerator_label,
                   catalogue.TOPOLOGY_LABEL_KEY: tpu_slice.topology}
        taints.append(dict(TPU_TAINT))
        resources = allocatable(machine.vcpus, machine.memory_gib, machine.chips_per_host)
    else:
        shape = lookup_cpu_machine(machine_type)
        resources = allocatable(shape.vcpus, shape.memory_gib)
    if spot:
        labels[SPOT_LABEL] = "true"
    if node_config.get("flexStart"):
        labels[FLEX_START_LABEL] = "true"
    if queued:
        taints.append({"key": QUEUED_TAINT, "value": "true", "effect": "NoSchedule"})
    return NodeTemplate(pool, machine_type, MappingProxyType(labels), tuple(MappingProxyType(t) for t in taints),
                        MappingProxyType(resources), hosts,
                        int(autoscaling["maxNodeCount"]) if autoscaling else fixed_nodes,
                        autoscaled=autoscaling is not None, queued=queued, spot=spot)


# ---- would a pod fit a template? (the scheduler's own tests, for the autoscaler and for static checks) ----------
_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIXES = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
             "Ti": 2**40}


def quantity(text: str | int | float) -> float:
    number, suffix = _QUANTITY.match(str(text)).groups()
    return float(number) * _SUFFIXES[suffix]


def pod_requests(spec: Mapping) -> dict[str, float]:
    """What the scheduler counts for a pod: the sum of its containers' requests (limits where only those are set),
    or its largest init container's where that is more."""
    def of(containers: Iterable[Mapping]) -> list[dict[str, float]]:
        out = []
        for container in containers:
            resources = container.get("resources") or {}
            wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
            out.append({name: quantity(value) for name, value in wanted.items()})
        return out

    total: dict[str, float] = {}
    for each in of(spec.get("containers") or []):
        for name, value in each.items():
            total[name] = total.get(name, 0) + value
    for each in of(spec.get("initContainers") or []):
        for name, value in each.items():
            total[name] = max(total.get(name, 0), value)
    return total


def tolerated(taint: Mapping[str, str], tolerations: Iterable[Mapping]) -> bool:
    for toleration in tolerations:
        if toleration.get("effect") and toleration["effect"] != taint["effect"]:
            continue
        if not toleration.get("key") and toleration.get("operator") == "Exists":
            return True
        if toleration.get("key") != taint["key"]:
            continue
        if toleration.get("operator", "Equal") == "Exists" or toleration.get("value", "") == taint.get("value", ""):
            return True
    return False


def _matches_expression(labels: Mapping[str, str], expression: Mapping) -> bool:
    key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
    if operator == "In":
        return labels.get(key) in values
    if operator == "NotIn":
        return labels.get(key) not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    raise ValueError(f"node affinity operator {operator!r} is not played by the tier")


def why_not(template: NodeTemplate, spec: Mapping, labels: Mapping[str, str] | None = None) -> str | None:
    """Why a pod with this spec could never run on a node of this template (None: it fits an empty node). `labels`
    are the node's own when they differ from the template's (a DWS node's provisioning-request label)."""
    labels = template.labels if labels is None else labels
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return f"nodeSelector {key}={value} (the pool's nodes have {labels.get(key)!r})"
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or []
    if terms and not any(all(_matches_expression(labels, e) for e in term.get("matchExpressions") or [])
                         for term in terms):
        return "required node affinity"
    for taint in template.taints:
        if taint["effect"] in ("NoSchedule", "NoExecute") and not tolerated(taint, spec.get("tolerations") or []):
            return f"untolerated taint {taint['key']}={taint.get('value', '')}:{taint['effect']}"
    for name, wanted in pod_requests(spec).items():
        have = quantity(template.allocatable.get(name, "0"))
        if wanted > have:
            return f"{name}: requests {wanted:g}, a node has {have:g}"
    return None


def fitting(templates: Iterable[NodeTemplate], spec: Mapping) -> list[NodeTemplate]:
    return [t for t in templates if why_not(t, spec) is None]


# ---- the autoscaler and DWS -------------------------------------------------------------------------------------
def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def unschedulable(pod: Mapping) -> bool:
    """The scheduler tried the pod and found no node: what the cluster autoscaler acts on."""
    spec, status = pod["spec"], pod.get("status") or {}
    if spec.get("nodeName") or pod["metadata"].get("deletionTimestamp") or spec.get("schedulingGates"):
        return False
    return any(c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable"
               for c in status.get("conditions") or [])


def holds_node(pod: Mapping) -> bool:
    return bool(pod["spec"].get("nodeName")) and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


@dataclass
class Slice:
    id: str
    pool: str
    nodes: tuple[str, ...]
    provisioning_request: str | None = None
    created: float = field(default_factory=time.monotonic)
    used: bool = False  # a pod has run on it
    idle_since: float | None = None


@dataclass
class Autoscaler:
    """Plays GKE's cluster autoscaler and DWS over `templates` in one thread (`start`, `stop`).

    Scripted by the tests: `stockout(pool)` makes the pool unable to grow: the autoscaler reports it on each pod it
    could not serve, as GKE does, unless `reported=False` (a stockout nothing says: only Kueue's PodsReady timeout
    sees it); a queued pool's Provisioned request then brings no slice. `restore(pool)` gives capacity back.
    `scale_up_seconds` is how long a new slice takes to appear (GKE: minutes), `scale_down_seconds` how long a slice
    stays once its pods are gone (GKE: about 10 min), `unused_seconds` how long a new slice waits for its first pod
    (GKE's scale-down-delay-after-add, 10 min by default: on a loaded machine KubeRay's pods can come seconds after
    the slice)."""

    kubeconfig: object
    templates: tuple[NodeTemplate, ...]
    cluster_name: str
    zone: str
    log: Path | None = None  # what it did and could not do, a line each (the tier's logs folder)
    scale_up_seconds: float = 0.5
    scale_down_seconds: float = 1.0
    unused_seconds: float = 60.0
    # Between changes, a pass every `period` for the clocks (arrivals, scale-downs); a change seen on a watch starts
    # one at once (at most one every MIN_GAP s). A pass reads the watches' caches: listing every Pod and
    # ProvisioningRequest each pass cost each plane ~3% of a core at 0.2 s.
    period: float = 0.5
    slices: dict[str, Slice] = field(default_factory=dict)
    stocked_out: dict[str, bool] = field(default_factory=dict)  # pool -> whether GKE reports it on the pods
    reported: dict[str, str] = field(default_factory=dict)  # pod uid -> pool it was reported for
    problems: list[str] = field(default_factory=list)  # what the stand-in could not do: a test asserts none
    # (monotonic time, "up" | "down" | "lost" (provisioned in a stocked-out pool), pool, slice or resize request)
    history: list[tuple[float, str, str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.by_pool = {t.pool: t for t in self.templates}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ids = itertools.count(1)
        self._arriving: dict[str, list[tuple[float, Slice]]] = {}  # pool -> slices not created yet
        self._provisioned: set[str] = set()  # the ProvisioningRequests (uids) whose slice was made (or lost)
        self._waiting: set[str] = set()  # requests waiting for room in their pool (noted once)
        self._clients = threading.local()
        self._informers: list = []  # started: the watches on Pods and ProvisioningRequests (`start`)
        self._seen: dict[str, dict[str, dict]] = {"pods": {}, "requests": {}}  # what they saw: kind -> uid -> object
        self._seen_lock = threading.Lock()
        self._changed = threading.Event()

    @property
    def kube(self) -> Kube:
        """An API client of the calling thread's own: the autoscaler's passes and a test's scripting (lose_slice,
        remove_idle) run at once, and a Kube must not be shared across threads (once, on a loaded run, the
        autoscaler made no pass again after a test's lose_slice)."""
        kube = getattr(self._clients, "kube", None)
        if kube is None:
            kube = self._clients.kube = Kube(self.kubeconfig)
        return kube

    @kube.setter
    def kube(self, client: Kube) -> None:  # the calling thread's (a unit test's fake)
        self._clients.kube = client

    # ---- scripting ---------------------------------------------------------------------------------------------
    def stockout(self, pool: str, reported: bool = True) -> None:
        with self._lock:
            self.stocked_out[self._known(pool)] = reported

    def restore(self, pool: str | None = None) -> None:
        """Capacity back in `pool` (every pool when None)."""
        with self._lock:
            if pool is None:
                self.stocked_out.clear()
            else:
                self.stocked_out.pop(self._known(pool), None)

    def pools_for(self, flavor: Mapping) -> list[str]:
        """The pools whose nodes a ResourceFlavor selects (its nodeLabels): one per multi-host slice of a rung, as
        a multi-host pool holds one slice."""
        return [t.pool for t in self.templates
                if all(t.labels.get(k) == v for k, v in (flavor["spec"].get("nodeLabels") or {}).items())]

    def _known(self, pool: str) -> str:
        if pool not in self.by_pool:
            raise KeyError(f"no node pool {pool!r} in the plan; pools: {', '.join(self.by_pool)}")
        return pool

    def nodes_of(self, pool: str) -> list[str]:
        with self._lock:
            return [n for s in self.slices.values() if s.pool == pool for n in s.nodes]

    # ---- running -----------------------------------------------------------------------------------------------
    def start(self) -> Autoscaler:
        for template in self.templates:  # pools that do not autoscale have their nodes from the start
            if not template.autoscaled and not template.queued:
                for _ in range(template.max_nodes // template.hosts):
                    self._create_slice(template)
        self._watch()
        self._thread = threading.Thread(target=self._run, daemon=True, name="gke-autoscaler")
        self._thread.start()
        return self

    def _watch(self) -> None:
        """Watches on every Pod and ProvisioningRequest (a client of their own), each kept by uid in `_seen`."""
        from failover.runtime.informer import Informer, RawClient, Watched

        api = RawClient(Kube(self.kubeconfig).api_client)
        for kind, path in (("pods", "/api/v1/pods"),
                           ("requests", "/apis/autoscaling.x-k8s.io/v1/provisioningrequests")):
            found = self._seen[kind]

            def listed(items: list[dict], found=found) -> None:
                with self._seen_lock:
                    found.clear()
                    found.update({item["metadata"]["uid"]: item for item in items})
                self._changed.set()

            def changed(event: str, obj: dict, found=found) -> None:
                with self._seen_lock:
                    if event == "DELETED":
                        found.pop(obj["metadata"]["uid"], None)
                    else:
                        found[obj["metadata"]["uid"]] = obj
                self._changed.set()

            informer = Informer(api, Watched(f"gke-{kind}", path), listed, changed)
            informer.name = f"gke-{kind}-{self.cluster_name}"
            informer.start()
            self._informers.append(informer)
        for informer in self._informers:
            informer.synced.wait(60)

    def _listed(self) -> tuple[list[dict], list[dict]]:
        """Every Pod and ProvisioningRequest: from the watches once started, else (a unit test's pass) listed."""
        if not self._informers:
            return self.kube.list("v1", "Pod"), self.kube.list("autoscaling.x-k8s.io/v1", "ProvisioningRequest")
        with self._seen_lock:
            return list(self._seen["pods"].values()), list(self._seen["requests"].values())

    def stop(self) -> None:
        self._stop.set()
        self._changed.set()
        for informer in self._informers:
            informer.stop()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._changed.wait(self.period)
            if self._stop.wait(MIN_GAP):  # a burst of changes (a RayCluster's pods) is one pass
                break
            self._changed.clear()
            try:
                self.step()
            except Exception as error:  # noqa: BLE001 - a pass that failed (API server frozen) is tried again
                self._problem(f"autoscaler pass failed: {error!r}")
                if len(self.problems) > 1000:
                    del self.problems[:500]

    def _problem(self, text: str) -> None:
        self.problems.append(text)
        self._note(f"problem: {text}")

    def _note(self, text: str) -> None:
        if self.log is not None:
            with self.log.open("a") as sink:
                sink.write(f"{datetime.datetime.now(datetime.timezone.utc).isoformat()} {text}\n")

    def step(self) -> None:
        """One pass: arrivals, DWS requests, scale-ups for unschedulable pods, scale-downs of empty slices."""
        pods, listed = self._listed()
        now = time.monotonic()
        with self._lock:
            self._arrive(now)
            requests = self._provision(listed)
            self._scale_up(pods)
            self._scale_down(pods, now, requests=requests)

    def _arrive(self, now: float) -> None:
        for pool, arriving in self._arriving.items():
            due = [s for at, s in arriving if at <= now]
            self._arriving[pool] = [(at, s) for at, s in arriving if at > now]
            for planned in due:
                self._create_slice(self.by_pool[pool], planned.id)

    def _create_slice(self, template: NodeTemplate, slice_id: str | None = None,
                      provisioning_request: str | None = None) -> Slice:
        slice_id = slice_id or f"{next(self._ids):04x}"
        labels = dict(template.labels)
        if provisioning_request:
            labels[PROVISIONING_REQUEST_LABEL] = provisioning_request
        names = []
        for host in range(template.hosts):
            name = f"gke-{self.cluster_name}-{template.pool}-{slice_id}-{host}"[:63].rstrip("-")
            self.kube.create({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {**labels, "kubernetes.io/hostname": name},
                             "annotations": {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1], SLICE_ANNOTATION: slice_id}},
                "spec": {"taints": [dict(t) for t in template.taints]},
                "status": {"allocatable": dict(template.allocatable), "capacity": dict(template.allocatable)}})
            names.append(name)
        created = Slice(slice_id, template.pool, tuple(names), provisioning_request)
        self.slices[slice_id] = created
        self.history.append((time.monotonic(), "up", template.pool, slice_id))
        self._note(f"up {template.pool} {slice_id} {provisioning_request or ''}")
        return created

    def _provision(self, listed: list[dict]) -> set[str]:
        """DWS: a Provisioned request's slice appears in the queued pool its pods select, labelled with the
        request's ResizeRequestName (GKE creates it before it says Provisioned; here the test's mark comes first).
        The ResizeRequestNames of the requests that exist."""
        existing = {((r.get("status") or {}).get("provisioningClassDetails") or {}).get("ResizeRequestName")
                    for r in listed}
        for request in listed:
            if condition(request, "Provisioned") != "True":
                continue
            resize = ((request.get("status") or {}).get("provisioningClassDetails") or {}).get("ResizeRequestName")
            uid = request["metadata"].get("uid") or request["metadata"]["name"]
            if not resize or uid in self._provisioned:  # by request: a test may reuse a ResizeRequestName
                continue
            namespace, name = request["metadata"]["namespace"], request["metadata"]["name"]
            planned = []  # (pool, slices) per pod set; None: its VMs never come (a stocked-out rung)
            for pod_set in request["spec"]["podSets"]:
                template = self.kube.get("v1", "PodTemplate", pod_set["podTemplateRef"]["name"], namespace)
                spec = template["template"]["spec"] if template else {}
                hosts = int(pod_set["count"])
                # The first queued pool its pods fit with room for them (a rung of multi-host slices is one pool
                # per slice, each its own DWS pool); where they are all stocked out, the VMs never come.
                fitting = [t for t in self.templates if t.queued and why_not(t, spec) is None]
                if not fitting:
                    self._problem(f"ProvisioningRequest {namespace}/{name}: no queued pool fits its pods")
                    planned = []
                    break
                if all(t.pool in self.stocked_out for t in fitting):
                    planned.append((fitting[0], None))
                    continue
                pools = [t for t in fitting if t.pool not in self.stocked_out
                         and t.max_nodes - len(self._nodes(t.pool)) >= hosts]
                if not pools:  # the pool is still full (an earlier slice about to go): DWS waits, so does this
                    if uid not in self._waiting:
                        self._waiting.add(uid)
                        self._note(f"waiting {namespace}/{name}: no room for {hosts} hosts yet "
                                   f"(slices: {sorted(self.slices)})")
                    planned = []
                    break
                planned.append((pools[0], math.ceil(hosts / pools[0].hosts)))
            if not planned:
                continue
            self._provisioned.add(uid)
            for pool, slices in planned:
                if slices is None:
                    self.history.append((time.monotonic(), "lost", pool.pool, resize))
                    self._note(f"lost {pool.pool} {resize}")
                    continue
                for _ in range(slices):
                    self._create_slice(pool, provisioning_request=resize)
        return existing

    def _scale_up(self, pods: list[dict]) -> None:
        """Each pod the scheduler could not place goes to the first pool that fits it and can still take it (free
        hosts, slices on their way, room to grow: a rung of multi-host slices is one pool per slice); a pool grows by
        whole slices for the pods it got. Fitting pools all stocked out: GKE's report on the pod, when reported."""
        arriving = {pool: template.hosts * len(self._arriving.get(pool, []))
                    for pool, template in self.by_pool.items()}
        free = {pool: self._free_hosts(pool, pods) + arriving[pool] for pool in self.by_pool}
        room = {pool: t.max_nodes - len(self._nodes(pool)) - arriving[pool] for pool, t in self.by_pool.items()}
        taken: dict[str, int] = {}
        for pod in pods:
            if not unschedulable(pod):
                continue
            fitting = [t for t in self.templates if t.autoscaled and not t.queued and why_not(t, pod["spec"]) is None]
            open_pools = [t for t in fitting if t.pool not in self.stocked_out]
            if fitting and not open_pools:
                if any(self.stocked_out[t.pool] for t in fitting):
                    self._report_stockout(pod, fitting[0])
                continue
            for template in open_pools:
                if taken.get(template.pool, 0) < free[template.pool] + room[template.pool]:
                    taken[template.pool] = taken.get(template.pool, 0) + 1
                    break
        for pool, count in taken.items():
            template = self.by_pool[pool]
            need = count - free[pool]
            for _ in range(max(0, min(math.ceil(need / template.hosts), room[pool] // template.hosts))):
                planned = Slice(f"{next(self._ids):04x}", pool, ())
                self._arriving.setdefault(pool, []).append((time.monotonic() + self.scale_up_seconds, planned))

    def _nodes(self, pool: str) -> list[str]:
        return [n for s in self.slices.values() if s.pool == pool for n in s.nodes]

    def _free_hosts(self, pool: str, pods: list[dict]) -> int:
        busy = {p["spec"]["nodeName"] for p in pods if holds_node(p)}
        return sum(1 for node in self._nodes(pool) if node not in busy)

    def _report_stockout(self, pod: dict, template: NodeTemplate) -> None:
        uid = pod["metadata"]["uid"]
        if self.reported.get(uid) == template.pool:
            return
        self.reported[uid] = template.pool
        meta, stamp = pod["metadata"], _now()
        self.kube.create({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{time.time_ns():x}", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                               "namespace": meta["namespace"], "uid": uid},
            "reason": "FailedScaleUp", "message": STOCKOUT_MESSAGE.format(zone=self.zone), "type": "Warning",
            "source": {"component": "cluster-autoscaler"}, "count": 1, "firstTimestamp": stamp,
            "lastTimestamp": stamp})

    def _scale_down(self, pods: list[dict], now: float, at_once: bool = False,
                    requests: set[str] | None = None) -> None:
        """A slice goes once no pod runs on it: after `scale_down_seconds` when it was used, or when it is a DWS
        slice whose ProvisioningRequest is gone (the booking ended: MultiKueue deleted a losing member's copy);
        after `unused_seconds` otherwise."""
        busy = {p["spec"]["nodeName"] for p in pods if holds_node(p)}
        for slice_id, each in list(self.slices.items()):
            template = self.by_pool[each.pool]
            if not (template.autoscaled or template.queued):
                continue
            if any(node in busy for node in each.nodes):
                each.idle_since, each.used = None, True
                continue
            each.idle_since = each.idle_since or now
            booking_ended = requests is not None and each.provisioning_request not in (None, *requests)
            wait = self.scale_down_seconds if each.used or booking_ended else self.unused_seconds
            if (at_once or now - max(each.idle_since, each.created) >= wait) and self._drained(each, template):
                for node in each.nodes:
                    self.kube.delete("v1", "Node", node, propagation="Background")
                del self.slices[slice_id]
                self.history.append((now, "down", each.pool, slice_id))
                self._note(f"down {each.pool} {slice_id}")

    def _drained(self, each: Slice, template: NodeTemplate) -> bool:
        """As the cluster autoscaler does before it removes a node: taint it ToBeDeletedByClusterAutoscaler, then
        look again; a pod the scheduler bound meanwhile keeps the slice (the taint goes). Without the second look a
        pod bound between the pass's pod list and the delete ran on a node that was gone (seen on a loaded suite)."""
        taints = [dict(t) for t in template.taints]
        for node in each.nodes:
            self.kube.patch("v1", "Node", node, {"spec": {"taints": [*taints, dict(TO_BE_DELETED_TAINT)]}})
        busy = {p["spec"]["nodeName"] for p in self.kube.list("v1", "Pod") if holds_node(p)}
        if not busy & set(each.nodes):
            return True
        for node in each.nodes:
            self.kube.patch("v1", "Node", node, {"spec": {"taints": taints}})
        each.idle_since, each.used = None, True
        return False

    # ---- GKE's disruptions, as GKE signals them -------------------------------------------------------------------
    def preempt_spot(self, slice_id: str, grace_seconds: int) -> float:
        """A Spot VM preempted: GKE's termination notice as the taint on the slice's nodes first, then the kubelets'
        graceful shutdown of its pods (`grace_seconds`: the pods' part of the notice), then the nodes go. The
        monotonic time of the taint, GKE's first signal."""
        return self.lose_slice(slice_id, grace_seconds, notice=dict(IMPENDING_TERMINATION_TAINT))

    def schedule_maintenance(self, slice_id: str, at: datetime.datetime, host: int = 0) -> float:
        """A host maintenance ahead (days ahead on GKE, compressed here): the label with the window's start, in Unix
        seconds, on one host of the slice. The monotonic time of the label, GKE's first signal."""
        with self._lock:
            node = self.slices[slice_id].nodes[host]
            signal = time.monotonic()
            self.kube.patch("v1", "Node", node, {"metadata": {"labels": {
                SCHEDULED_MAINTENANCE_LABEL: str(int(at.timestamp()))}}})
            self._note(f"maintenance of {node} scheduled at {at.isoformat()}")
            return signal

    def begin_maintenance(self, slice_id: str, grace_seconds: int, host: int = 0) -> float:
        """The window begins: the host labelled ONGOING (its scheduled label gone) and tainted; then, the slice being
        one unit, its pods are shut down gracefully and its nodes go. The monotonic time of the first change."""
        node = self.slices[slice_id].nodes[host]
        signal = time.monotonic()
        self.kube.patch("v1", "Node", node, {"metadata": {"labels": {
            SCHEDULED_MAINTENANCE_LABEL: None, ACTIVE_MAINTENANCE_LABEL: MAINTENANCE_ONGOING}}})
        self.lose_slice(slice_id, grace_seconds, notice=dict(IMPENDING_TERMINATION_TAINT), noticed=(host,))
        return signal

    def fail_host(self, slice_id: str) -> float:
        """A host that fails: NotReady (its kubelet stops reporting, then the node lifecycle controller's unreachable
        taint), no graceful shutdown; the slice's pods go at once and its nodes after."""
        return self.lose_slice(slice_id, 0, going_taint=UNREACHABLE_TAINT)

    def lose_slice(self, slice_id: str, grace_seconds: int, going_taint: Mapping[str, str] | None = None,
                   notice: Mapping[str, str] | None = None, noticed: tuple[int, ...] | None = None) -> float:
        """A slice lost as GKE loses one: a multi-host TPU slice is one unit, so when one host is preempted, fails or
        ends, the whole node group goes and is recreated (https://cloud.google.com/kubernetes-engine/docs/concepts/tpus
        "multi-host slice"). `going_taint` first (the node lifecycle controller's unreachable taint on a failed host);
        then the kubelets' shutdown of every pod on the slice with `grace_seconds` (Spot: 15 s for non-system pods,
        https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms); then the nodes go. The slice comes back
        like any other, from the autoscaler's next pass for the pods KubeRay makes again, unless the pool is stocked
        out. `notice`: a taint GKE puts first on the hosts `noticed` (every host when None), with its time. The
        monotonic time of the first signal."""
        with self._lock:
            lost = self.slices.pop(slice_id)
            signal = time.monotonic()
            kube = self.kube
            if notice is not None:
                for host in noticed if noticed is not None else range(len(lost.nodes)):
                    self._taint(kube, lost.nodes[host], notice)
            if going_taint is not None:
                self._fail_host(kube, lost.nodes[0], going_taint)
            on_slice = [p for p in kube.list("v1", "Pod") if (p.get("spec") or {}).get("nodeName") in lost.nodes]
            for pod in on_slice:
                kube.delete("v1", "Pod", pod["metadata"]["name"], pod["metadata"]["namespace"],
                            grace_seconds=grace_seconds)
            for node in lost.nodes:
                kube.delete("v1", "Node", node, propagation="Background")
            self.history.append((time.monotonic(), "lost-slice", lost.pool, slice_id))
            self._note(f"lost slice {lost.pool} {slice_id} ({len(on_slice)} pods, grace {grace_seconds} s)")
            return signal

    @staticmethod
    def _taint(kube: Kube, node: str, taint: Mapping[str, str]) -> None:
        found = kube.get("v1", "Node", node)
        taints = [*(((found or {}).get("spec") or {}).get("taints") or []), {**taint, "timeAdded": _now()}]
        kube.patch("v1", "Node", node, {"spec": {"taints": taints}})

    @staticmethod
    def _fail_host(kube: Kube, node: str, taint: Mapping[str, str]) -> None:
        """A host whose kubelet stopped reporting, as the node lifecycle controller shows it: Ready Unknown, then its
        taint. KWOK lets go of the node first (it heartbeats only the nodes with its annotation): a node it kept
        Ready had the controller take the taint off again (seen on a loaded run: a loss recorded, "whole again"
        0.25 s later, then recorded anew when the pods were deleted)."""
        kube.patch("v1", "Node", node, {"metadata": {"annotations": {KWOK_ANNOTATION[0]: None}}})
        now = _now()
        kube.patch("v1", "Node", node, {"status": {"conditions": [{
            "type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown", "lastTransitionTime": now,
            "lastHeartbeatTime": now, "message": "Kubelet stopped posting node status."}]}}, subresource="status")
        found = kube.get("v1", "Node", node)
        taints = [*(((found or {}).get("spec") or {}).get("taints") or []), {**taint, "timeAdded": now}]
        kube.patch("v1", "Node", node, {"spec": {"taints": taints}})

    def slice_of(self, node: str) -> str | None:
        with self._lock:
            return next((s.id for s in self.slices.values() if node in s.nodes), None)

    def remove_idle(self) -> None:
        """Between scenarios: every slice no pod runs on goes now, and no slice is on its way (a test's next
        scenario starts from an empty cluster, not a slice the last one asked for)."""
        with self._lock:
            self._arriving.clear()
            self._scale_down(self.kube.list("v1", "Pod"), time.monotonic(), at_once=True)


def placement(kube: Kube, namespace: str, selector: Callable[[dict], bool]) -> dict[str, list[str]]:
    """pod name -> [its node, the node's pool] for the pods `selector` picks (a pod not placed: [])."""
    nodes = {n["metadata"]["name"]: n for n in kube.list("v1", "Node")}
    out = {}
    for pod in kube.list("v1", "Pod", namespace=namespace):
        if not selector(pod):
            continue
        node = nodes.get(pod["spec"].get("nodeName") or "")
        out[pod["metadata"]["name"]] = [node["metadata"]["name"], node["metadata"]["labels"][NODEPOOL_LABEL]] \
            if node else []
    return out
