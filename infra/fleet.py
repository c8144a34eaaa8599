"""Plan C: a fleet of regional stacks behind one queue, with Kueue MultiKueue on a small manager cluster.

A job is submitted once, to the manager. Kueue copies its Workload to every member; each member asks DWS for a
slice (its fleet queue starts at the DWS rung, infra/fleet_member.py); the first member whose request is provisioned
admits it, the manager creates the RayJob there and deletes the other copies and their requests.

Settings (`tpu-fallback:fleet`) are read here; the objects are built by small functions returning manifests; the
`FleetManager` component declares them. Kueue 0.19.2's MultiKueue, read and measured on the tier.
Ref: https://github.com/kubernetes-sigs/kueue/tree/v0.19.2/pkg/controller/admissionchecks/multikueue
"""

from __future__ import annotations

import copy
import datetime
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from failover.api import ClimbPolicy, Ladder, Step
from failover.api.names import FLEET_LADDER_NAME as LADDER_NAME, FLEET_WATCH_NAME as WATCH_NAME, MULTIKUEUE_CONTROLLER
from failover.config import FleetRenewerConfig, FleetWatchConfig, LadderConfig, MemberAccess
from failover.credentials import inline_kubeconfig
from infra import failover
from infra.fleet_member import FLEET_LOCAL_QUEUE, FLEET_NAMESPACE, MANAGER_CLUSTER_ROLE, STOCKOUT_READER_ROLE
from infra.kueue import (COVERED_RESOURCES, KUEUE_API_VERSION, MANAGER_CONFIG_BASE, NAMESPACE as KUEUE_NAMESPACE,
                         install_release, values_for)
from infra.settings import (DNS_LABEL, FULLY_QUALIFIED_STACK, MAX_PODS_READY_TIMEOUT_SECONDS, ConfigReader,
                            PlatformSettings, duration_seconds, key_default)
from infra.settings.climb_back import read_fleet_climb_back

FLEET_KEY = "fleet"
FLEET_DEFAULTS: Mapping = key_default(FLEET_KEY)  # the table's (infra/settings/keys_roles.py): one default a knob
# The fleet's ladder (README "The fleet's ladder"): the steps the members offer (fleetMember.rungs), rung by rung in
# this order (what is paid for first, then on-demand, then Spot), each rung member by member in `memberOrder`; then
# DWS in every member at once, the last step, which is the fleet queue as before.
LADDER_RUNGS = ("reservation", "onDemand", "spot")
MIN_STEP_WAIT, MAX_STEP_WAIT = 5, 3600
# Giving up (kubernetes-sigs/kueue#8602: Kueue has none): a fleet job no member admits within `fleet.maxWait` is
# deactivated by the ladder controller. "" (the default): never.
MIN_MAX_WAIT, MAX_MAX_WAIT = 60, 720 * 3600
DISPATCHERS = {"AllAtOnce": "kueue.x-k8s.io/multikueue-dispatcher-all-at-once",
               "Incremental": "kueue.x-k8s.io/multikueue-dispatcher-incremental"}
ADMISSION_CHECK = "fleet-multikueue"
MULTIKUEUE_CONFIG = "fleet"
FLAVOR = "fleet"
CLUSTER_QUEUE = "fleet-cluster-queue"
# The manager's RayJob CRD must have `spec.managedBy` (KubeRay >= 1.3): Kueue's webhook sets it so that the
# manager's KubeRay leaves the job to MultiKueue. The same version as the tier's CRDs (testbed/versions.py).
# Ref: https://kueue.sigs.k8s.io/docs/tasks/run/multikueue/kuberay/
KUBERAY_VERSION = "1.6.2"
KUBERAY_CHART = {"chart": "kuberay-operator", "repository_opts": {"repo": "https://ray-project.github.io/kuberay-helm/"}}
KUBERAY_NAMESPACE = "kuberay-system"
# A member of up to 20 (MultiKueueConfig.spec.clusters: 1-20); at least two, or there is nothing to fail over to.
MIN_MEMBERS, MAX_MEMBERS = 2, 20
# Kueue's default is 15m. Shorter re-dispatches sooner after a real loss, but makes two runs at once likelier
# after a short partition (README "Plan C"); the tests use seconds.
MIN_WORKER_LOST_SECONDS, MAX_WORKER_LOST_SECONDS = 10, 24 * 3600
MANAGER_PODS_READY_SECONDS = MAX_PODS_READY_TIMEOUT_SECONDS  # the longest a member may have
# The fleet watch (failover/watch/, WATCH_NAME): says on each job where it really runs; runs from the failover package.
WATCH_SECONDS = 10  # how often the watch (and the ladder) read the members' kubeconfigs again and ask each member
WATCH_RESYNC_SECONDS = 300  # every job evaluated again, the safety net for anything a watch missed
WATCH_RULES = (
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads", "multikueueclusters"], "verbs": ["list", "watch"]},
    # Only to repair Kueue's record after a member's return (failover/watch/ record_to_repair).
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads/status"], "verbs": ["patch"]},
    {"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": ["get", "list", "watch", "patch"]},
    # Only to finish an eviction Kueue cannot finish on a manager (failover/watch/ may_unblock).
    {"apiGroups": ["ray.io"], "resources": ["rayjobs/status"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
)
# The ladder controller (failover/ladder/): moves a fleet job down the ladder's steps (route D on the manager:
# deactivate, repoint, reactivate; docs/ladder-and-failover.md "Route D").
# Only in the fleet's namespace: its Workloads (deactivate, repoint), its RayJobs (relabel, the move's record, the
# Suspended mark that lets Kueue finish an eviction) and Events there. Its name: LADDER_NAME.
LADDER_RESYNC_SECONDS = 60  # every job evaluated again, the safety net
LADDER_WORKERS = 2  # jobs handled at once
LADDER_RULES = (
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": ["ray.io"], "resources": ["rayjobs/status"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
)
# The ladder controller's early path reads the members through the kubeconfig Secrets MultiKueue uses (a Role in
# Kueue's namespace, those Secrets only: watch_secret_rule); in a member that offers steps, the manager's identity may
# read the Events in the fleet's namespace there (infra/fleet_member.py STOCKOUT_READER_ROLE).
# The credentials renewer (failover/credentials.py): the manager's Google service account's one-hour tokens, written
# into the members' kubeconfig Secrets. Its Kubernetes identity is the one Workload Identity maps to that account.
CREDENTIALS_NAME = "fleet-credentials"
# What the manager's Google identity needs in a member's project to reach its API server; what it may do there comes
# from the member's RBAC alone. Ref: https://cloud.google.com/kubernetes-engine/docs/role-based-access-control
# ("users need at least the container.clusters.get IAM permission in the project that contains the cluster").
MEMBER_PROJECT_ROLE = "roles/container.clusterViewer"
_LOCATION = re.compile(r"^[a-z]+(-[a-z]+[0-9]+)?$", re.IGNORECASE)


@dataclass(frozen=True)
class FleetSettings:
    members: tuple[str, ...]  # <organization>/<project>/<stack>, in the order the manager lists them
    dispatcher: str  # a key of DISPATCHERS
    worker_lost_timeout_seconds: int
    checkpoint_location: str  # "" : the first member's region
    origin: str  # the value of kueue.x-k8s.io/multikueue-origin on the copies this manager makes
    service_account_id: str  # the manager's Google service account (account_id: 6-30 of [a-z0-9-])
    # The fleet's ladder, read from `fleet` (no defaults here: the table's, infra/settings/keys_roles.py, are the only)
    member_order: tuple[str, ...]  # cluster names, the order of a rung's steps
    rung_order: tuple[str, ...]  # config keys, the order of the ladder's rungs
    step_wait_seconds: int  # how long a job may wait at a step before the last without being admitted
    max_wait_seconds: int  # how long a job may wait with no member admitting it before it is given up; 0: never
    # fleet.climbBack as the ladder reads it: when a job climbs back to an earlier step (failover/ladder/climb.py)
    climb_back: ClimbPolicy

    @property
    def cluster_names(self) -> tuple[str, ...]:
        return tuple(member_cluster_name(member) for member in self.members)


def member_cluster_name(member: str) -> str:
    """The MultiKueueCluster's name: the member's stack name."""
    return member.rsplit("/", 1)[-1].lower()


def read_fleet_settings(reader: ConfigReader, this_stack: tuple[str, str]) -> FleetSettings:
    """`fleet`: every problem named by its key, before any resource. `this_stack`: (project, stack)."""
    raw = reader.obj(FLEET_KEY, FLEET_DEFAULTS)
    members = raw["members"]
    if not reader.check(f"{FLEET_KEY}.members", isinstance(members, list) and all(isinstance(m, str) for m in members),
                        "must be a list of stack names, <organization>/<project>/<stack>"):
        members = []
    for index, member in enumerate(members):
        where = f"{FLEET_KEY}.members[{index}]"
        if not reader.check(where, bool(FULLY_QUALIFIED_STACK.match(member)),
                            f"{member!r} is not a fully qualified stack name; use <organization>/<project>/<stack>"):
            continue
        reader.check(where, member.split("/")[1:] != list(this_stack),
                     f"{member} is this fleet stack; list the regional stacks (tpu-fallback:fleetMember enabled)")
        reader.check(where, bool(DNS_LABEL.match(member_cluster_name(member))),
                     f"the stack name {member.rsplit('/', 1)[-1]!r} names its MultiKueueCluster: it must be a DNS "
                     "label (lowercase letters, digits, hyphens)")
    reader.check(f"{FLEET_KEY}.members", MIN_MEMBERS <= len(members) <= MAX_MEMBERS,
                 f"{len(members)} member(s); a fleet has {MIN_MEMBERS} to {MAX_MEMBERS} regional stacks")
    names = [member_cluster_name(m) for m in members]
    twice = sorted({n for n in names if names.count(n) > 1})
    reader.check(f"{FLEET_KEY}.members", not twice,
                 f"stack name(s) {', '.join(twice)} listed more than once (a MultiKueueCluster is named after it)")
    reader.check(f"{FLEET_KEY}.dispatcher", raw["dispatcher"] in DISPATCHERS,
                 f"{raw['dispatcher']!r}: use AllAtOnce (every member asks for capacity at once) or Incremental")
    lost = duration_seconds(raw["workerLostTimeout"])
    reader.check(f"{FLEET_KEY}.workerLostTimeout",
                 lost is not None and MIN_WORKER_LOST_SECONDS <= lost <= MAX_WORKER_LOST_SECONDS,
                 f"{raw['workerLostTimeout']!r} is not a duration from {MIN_WORKER_LOST_SECONDS}s to "
                 f"{MAX_WORKER_LOST_SECONDS // 3600}h, such as 15m")
    location = raw["checkpointLocation"]
    reader.check(f"{FLEET_KEY}.checkpointLocation", not location or bool(_LOCATION.match(location)),
                 f"{location!r} is not a Cloud Storage location such as US, EU or us-east5")
    member_order = _read_member_order(reader, raw["memberOrder"], members)
    rung_order = raw["rungOrder"] or list(LADDER_RUNGS)
    reader.check(f"{FLEET_KEY}.rungOrder", sorted(map(str, rung_order)) == sorted(LADDER_RUNGS),
                 f"{raw['rungOrder']!r} must list {', '.join(LADDER_RUNGS)}, each once, in the order the fleet tries "
                 "them (DWS everywhere is always the last step)")
    step_wait = duration_seconds(raw["stepWait"])
    reader.check(f"{FLEET_KEY}.stepWait", step_wait is not None and MIN_STEP_WAIT <= step_wait <= MAX_STEP_WAIT,
                 f"{raw['stepWait']!r} is not a duration from {MIN_STEP_WAIT}s to {MAX_STEP_WAIT // 60}m: how long a "
                 "job waits at a busy step (a free reservation or on-demand slice admits within a second)")
    max_wait = duration_seconds(str(raw["maxWait"])) if raw["maxWait"] else 0
    reader.check(f"{FLEET_KEY}.maxWait", not raw["maxWait"] or (
        max_wait is not None and MIN_MAX_WAIT <= max_wait <= MAX_MAX_WAIT),
                 f"{raw['maxWait']!r} is not a duration from {MIN_MAX_WAIT // 60}m to {MAX_MAX_WAIT // 3600}h, such as "
                 "6h: how long a job may wait with no member admitting it before it is given up (leave it out: "
                 "never)")
    climb_back = read_fleet_climb_back(reader, raw["climbBack"], FLEET_DEFAULTS["climbBack"])
    return FleetSettings(tuple(members), raw["dispatcher"], lost or 0, location,
                         member_order=member_order, rung_order=tuple(rung_order), step_wait_seconds=step_wait or 0,
                         max_wait_seconds=max_wait or 0, climb_back=climb_back,
                         origin=f"tpu-fallback-{this_stack[1]}"[:63].rstrip("-.").lower(),
                         service_account_id=re.sub(r"[^a-z0-9-]", "-", f"fleet-{this_stack[1]}".lower())[:30]
                         .rstrip("-"))


def _read_member_order(reader: ConfigReader, order: list, members: list) -> tuple[str, ...]:
    """`fleet.memberOrder`: the members again (as listed in `members`), in the order a rung's steps are tried."""
    if not order:
        return tuple(member_cluster_name(m) for m in members if isinstance(m, str))
    ok = all(isinstance(m, str) for m in order) and sorted(order) == sorted(m for m in members if isinstance(m, str))
    reader.check(f"{FLEET_KEY}.memberOrder", ok,
                 "must list every stack of fleet.members once, as written there, in the order a rung's steps are "
                 "tried; leave it out for the members' order")
    return tuple(member_cluster_name(m) for m in order) if ok else ()


# ---- the fleet's ladder ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FleetStep:
    """One step of the fleet's ladder: a manager LocalQueue and ClusterQueue (the step's quota) with its own
    MultiKueue AdmissionCheck and MultiKueueConfig (the step's members). A member declares the same LocalQueue name
    at the step's rung (MultiKueue copies the manager's queue name verbatim, multikueue/workload.go L1348-1366)."""

    local_queue: str
    cluster_queue: str
    admission_check: str
    config: str
    rung: str  # the config key of the members' rung; "" for the last step (each member's start rung)
    members: tuple[str, ...]
    quota: Mapping[str, str]
    # The member's stockout grace period (its fallback.stockoutGracePeriod): the ladder's early path moves a job on
    # once the member has reported no capacity for its pods this long. None: the last step, or a member that did not
    # publish it (an older version).
    stockout_grace_seconds: int | None = None
    # The member's podsReadyTimeout (its fallback.podsReadyTimeout): the ladder moves a job whose pods are not ready
    # just before it ends. None: the last step, or a member that did not publish it (an older version).
    pods_ready_timeout_seconds: int | None = None
    flavor: str = ""  # the member's Kueue flavor of the rung (a climb back reads the member's quota of it); "": last

    def step(self) -> Step:
        """The step as the ladder controller reads it (failover/api/queues.py)."""
        return Step(self.local_queue, self.cluster_queue, self.admission_check, self.members, self.rung,
                    _seconds(self.stockout_grace_seconds), _seconds(self.pods_ready_timeout_seconds), self.flavor)

    def as_output(self) -> dict:
        return self.step().as_data()


def _seconds(seconds: int | None) -> datetime.timedelta | None:
    return datetime.timedelta(seconds=seconds) if seconds is not None else None


def ladder_steps(fleet: FleetSettings, members: Sequence[MemberHandle]) -> tuple[FleetStep, ...]:
    """Every step the members offer, rung by rung (`rungOrder`), member by member (`memberOrder`), then the last
    step: every member at its start rung (DWS by default), today's fleet queue."""
    by_cluster = {member.cluster: member for member in members}
    order = [c for c in fleet.member_order if c in by_cluster] or list(by_cluster)
    steps = []
    for rung in fleet.rung_order:
        for cluster in order:
            for offered in by_cluster[cluster].steps:
                if offered["rung"] == rung:
                    name = offered["localQueue"]
                    steps.append(FleetStep(name, name, name, name, rung, (cluster,),
                                           fleet_quota([offered["capacity"]]),
                                           offered.get("stockoutGracePeriodSeconds"),
                                           offered.get("podsReadyTimeoutSeconds"), offered.get("flavor", "")))
    steps.append(FleetStep(FLEET_LOCAL_QUEUE, CLUSTER_QUEUE, ADMISSION_CHECK, MULTIKUEUE_CONFIG, "",
                           tuple(fleet.cluster_names), fleet_quota([m.capacity for m in members])))
    return tuple(steps)


def fleet_ladder(steps: Sequence[FleetStep]) -> Ladder:
    """What the ladder controller reads (FLEET_LADDER): the steps in order, the last one DWS everywhere."""
    return Ladder(tuple(step.step() for step in steps))


# ---- the manager's Kueue -------------------------------------------------------------------------------------


def manager_config(fleet: FleetSettings) -> dict:
    """The chart's default configuration with MultiKueue's section and only the RayJob integration: the manager
    watches every enabled integration in every member, and one failed watch keeps a member disconnected
    (multikueuecluster.go L349-363).

    waitForPodsReady cannot be left out: Kueue's v1beta2 defaulting turns it on with 30m when the block is absent
    (apis/config/v1beta2/defaults.go L99-112; measured: the manager's Workload showed PodsReady=False WaitForStart).
    A manager's PodsReady is a copy of the member's (the RayJob status MultiKueue mirrors), and the member's own
    podsReadyTimeout decides when a run there failed to start; so the manager's is set out of its way."""
    config = copy.deepcopy(MANAGER_CONFIG_BASE)
    config["integrations"] = {"frameworks": ["ray.io/rayjob"]}
    config["waitForPodsReady"] = {"timeout": f"{MANAGER_PODS_READY_SECONDS}s",
                                  "recoveryTimeout": f"{MANAGER_PODS_READY_SECONDS}s", "blockAdmission": False}
    config["multiKueue"] = {
        "gcInterval": "1m",
        # Distinct per manager, so two fleets sharing a member never take each other's copies.
        "origin": fleet.origin,
        "workerLostTimeout": f"{fleet.worker_lost_timeout_seconds}s",
        "dispatcherName": DISPATCHERS[fleet.dispatcher],
    }
    return config


def _manifest(kind: str, name: str, spec: dict, namespace: str | None = None) -> dict:
    metadata = {"name": name} if namespace is None else {"name": name, "namespace": namespace}
    return {"apiVersion": KUEUE_API_VERSION, "kind": kind, "metadata": metadata, "spec": spec}


def kubeconfig_secret_name(cluster: str) -> str:
    return f"{cluster}-kubeconfig"


def multikueue_cluster(cluster: str) -> dict:
    """A member, reached through the kubeconfig Secret in Kueue's namespace (key `kubeconfig`)."""
    return _manifest("MultiKueueCluster", cluster, {"clusterSource": {"kubeConfig": {
        "locationType": "Secret", "location": kubeconfig_secret_name(cluster)}}})


def multikueue_config(fleet: FleetSettings, name: str = MULTIKUEUE_CONFIG,
                      clusters: Sequence[str] | None = None) -> dict:
    return _manifest("MultiKueueConfig", name, {"clusters": list(fleet.cluster_names if clusters is None
                                                                 else clusters)})


def admission_check(name: str = ADMISSION_CHECK, config: str = MULTIKUEUE_CONFIG) -> dict:
    return _manifest("AdmissionCheck", name, {
        "controllerName": MULTIKUEUE_CONTROLLER,
        "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "MultiKueueConfig", "name": config}})


def flavor() -> dict:
    """One flavor without node labels: nothing is scheduled on the manager, its quota only gates dispatch."""
    return _manifest("ResourceFlavor", FLAVOR, {})


def fleet_quota(capacities: Sequence[Mapping[str, int]]) -> dict[str, str]:
    """The members' fleet capacity added up: Kueue advises a manager quota equal to the workers' total.
    Ref: https://kueue.sigs.k8s.io/docs/concepts/multikueue/"""
    total = {key: sum(int(c[key]) for c in capacities) for key in ("cpu", "memoryGi", "tpuChips")}
    return dict(zip(COVERED_RESOURCES, (str(total["cpu"]), f"{total['memoryGi']}Gi", str(total["tpuChips"]))))


def cluster_queue(quota: Mapping[str, str], name: str = CLUSTER_QUEUE, check: str = ADMISSION_CHECK) -> dict:
    """Only the MultiKueue check: a ClusterQueue with a ProvisioningRequest check too goes inactive
    (pkg/cache/scheduler/clusterqueue.go L334-347); the DWS checks are the members'."""
    manifest = _manifest("ClusterQueue", name, {
        "namespaceSelector": {},
        "resourceGroups": [{"coveredResources": list(COVERED_RESOURCES), "flavors": [{"name": FLAVOR, "resources": [
            {"name": resource, "nominalQuota": quota[resource]} for resource in COVERED_RESOURCES]}]}],
        "admissionChecksStrategy": {"admissionChecks": [{"name": check}]},
    })
    # Active once the check is: at least one member connected. Ref: multikueue/admissioncheck.go
    manifest["metadata"]["annotations"] = {"pulumi.com/waitFor": "condition=Active"}
    return manifest


def local_queue(name: str = FLEET_LOCAL_QUEUE, cluster_queue_name: str = CLUSTER_QUEUE) -> dict:
    return _manifest("LocalQueue", name, {"clusterQueue": cluster_queue_name}, namespace=FLEET_NAMESPACE)


def watch_secret_rule(clusters: Sequence[str]) -> dict:
    """The watch reads the members' kubeconfig Secrets and no other (a Role in Kueue's namespace)."""
    return {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
            "resourceNames": [kubeconfig_secret_name(cluster) for cluster in clusters]}


def credentials_secret_rule(clusters: Sequence[str]) -> dict:
    """The renewer reads and rewrites the members' kubeconfig Secrets and no other; it creates none (the stack
    does, so `pulumi destroy` removes them)."""
    return {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "patch"],
            "resourceNames": [kubeconfig_secret_name(cluster) for cluster in clusters]}


def watch_config(fleet: FleetSettings) -> FleetWatchConfig:
    """What the fleet watch runs with (failover/config.py)."""
    return FleetWatchConfig({c: kubeconfig_secret_name(c) for c in fleet.cluster_names}, fleet.origin,
                            KUEUE_NAMESPACE, datetime.timedelta(seconds=WATCH_SECONDS),
                            datetime.timedelta(seconds=WATCH_RESYNC_SECONDS), failover.HEALTH_PORT,
                            failover.METRICS_PORT)


def watch_deployment(settings: PlatformSettings, fleet: FleetSettings, configmap: str) -> dict:
    config = watch_config(fleet)
    return failover.controller_deployment(settings, WATCH_NAME, failover.WATCH_MODULE, configmap, env=config.to_env(),
                                          **failover.served(config.health_port, config.metrics_port))


def ladder_config(fleet: FleetSettings, steps: Sequence[FleetStep]) -> LadderConfig:
    """What the ladder controller runs with (failover/config.py): the ladder, the fleet's waits, the members it
    reads (a stockout, a lost slice, a member's free quota) through the kubeconfig Secrets MultiKueue uses, and when
    a job climbs back."""
    return LadderConfig(fleet_ladder(steps), FLEET_NAMESPACE, datetime.timedelta(seconds=fleet.step_wait_seconds),
                        datetime.timedelta(seconds=fleet.max_wait_seconds) if fleet.max_wait_seconds else None,
                        {c: kubeconfig_secret_name(c) for c in read_members(steps)}, KUEUE_NAMESPACE,
                        datetime.timedelta(seconds=WATCH_SECONDS), datetime.timedelta(seconds=LADDER_RESYNC_SECONDS),
                        LADDER_WORKERS, failover.HEALTH_PORT, failover.METRICS_PORT, fleet.climb_back)


def ladder_deployment(settings: PlatformSettings, fleet: FleetSettings, configmap: str,
                      steps: Sequence[FleetStep]) -> dict:
    config = ladder_config(fleet, steps)
    return failover.controller_deployment(settings, LADDER_NAME, failover.LADDER_MODULE, configmap, env=config.to_env(),
                                          **failover.served(config.health_port, config.metrics_port))


def read_members(steps: Sequence[FleetStep]) -> list[str]:
    """The members the ladder reads: every member of a step, so every member (the last step has them all). A
    one-member step's member says when it has no capacity (the early path); the member running a job, at any step,
    says when the job lost its slice there."""
    return list(dict.fromkeys(member for step in steps for member in step.members))


def stockout_reader_binding(fleet: FleetSettings, email: pulumi.Input[str]) -> dict:
    """In every member: the manager's Google identity may read the Events in the fleet's namespace there (the
    ladder's early path, a lost slice), through the member's Role."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": f"{STOCKOUT_READER_ROLE}-{fleet.origin}"[:253], "namespace": FLEET_NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": STOCKOUT_READER_ROLE},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": email}]}


def member_access(members: Sequence[MemberHandle]) -> dict[str, MemberAccess]:
    """What the renewer reads (FLEET_ACCESS): per member, its Secret here, its server and its CA."""
    return {m.cluster: MemberAccess(kubeconfig_secret_name(m.cluster), m.access["server"],
                                    m.access["certificateAuthorityData"]) for m in members}


def credentials_deployment(settings: PlatformSettings, configmap: str, members: Sequence[MemberHandle]) -> dict:
    config = FleetRenewerConfig(member_access(members), KUEUE_NAMESPACE)
    return failover.controller_deployment(settings, CREDENTIALS_NAME, failover.RENEWER_MODULE, configmap,
                                          env=config.to_env())


def tokenless_kubeconfig(member: MemberHandle) -> str:
    """The Secret as the stack creates it: the member's server and CA, no user yet (the renewer adds the token)."""
    return inline_kubeconfig(member.cluster, member.access["server"], member.access["certificateAuthorityData"], None)


def member_binding(fleet: FleetSettings, email: pulumi.Input[str]) -> dict:
    """In a member: the manager's Google identity (a user named by its email on GKE) gets the member's MultiKueue
    worker role. Named after this fleet, so two fleets sharing a member each have their own."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{MANAGER_CLUSTER_ROLE}-{fleet.origin}"[:253]},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": MANAGER_CLUSTER_ROLE},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": email}]}


@dataclass(frozen=True)
class MemberHandle:
    """A member as the manager sees it: its cluster name, where its API server is (`fleetMember.access`), what a
    fleet job may use there, and how this stack reaches it (its project; a provider with its own kubeconfig)."""

    cluster: str
    access: Mapping[str, str]  # server, certificateAuthorityData (infra/fleet_member.py); nothing secret
    capacity: Mapping[str, int]
    project: str
    provider: k8s.Provider
    steps: Sequence[Mapping] = ()  # the ladder's steps it offers (`fleetMember.steps`), none by default


class FleetManager(pulumi.ComponentResource):
    """Kueue as a MultiKueue manager, KubeRay's CRDs (its operator leaves managed jobs alone), one kubeconfig
    Secret and MultiKueueCluster per member, the Google identity the manager reaches the members with and the
    renewer of its tokens, the fleet watch, and the fleet's queue (`tpu-fallback:infra:FleetManager`)."""

    release: k8s.helm.v3.Release
    local_queue: k8s.apiextensions.CustomResource  # the first step's, where jobs are submitted
    local_queue_name: str
    steps: tuple[FleetStep, ...]  # the ladder, the last step DWS everywhere (the fleet queue)
    ladder: k8s.apps.v1.Deployment | None  # the ladder controller, when there is a step before the last
    ready: list[pulumi.Resource]  # what a fleet job waits for
    watch: k8s.apps.v1.Deployment  # the fleet watch, scraped by infra/monitoring.py FleetMonitoring
    service_account: gcp.serviceaccount.Account  # the manager's identity in every member

    def __init__(self, name: str, fleet: FleetSettings, settings: PlatformSettings,
                 members: Sequence[MemberHandle], provider: k8s.Provider,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpu-fallback:infra:FleetManager", name, None, opts)
        self._name, self._provider = name, provider
        on_cluster = pulumi.ResourceOptions(parent=self, provider=provider)

        self.release = install_release(self, f"{name}-kueue", provider, settings.kueue_version,
                                       settings.kueue_chart_repository, values_for(manager_config(fleet)))
        # The operator and the CRDs, from KubeRay's chart (its crds/ are installed on first install only).
        # Ref: https://docs.ray.io/en/latest/cluster/kubernetes/getting-started/kuberay-operator-installation.html
        kuberay = k8s.helm.v3.Release(
            f"{name}-kuberay", name="kuberay-operator", **KUBERAY_CHART, version=KUBERAY_VERSION,
            namespace=KUBERAY_NAMESPACE, create_namespace=True, timeout=600, opts=on_cluster)
        grants = self._identity(name, fleet, settings, members)

        clusters, secrets = [], []
        for member in members:
            # Created without a token; the renewer writes the token, so it never lands in this stack's inputs.
            secrets.append(k8s.core.v1.Secret(
                f"{name}-{member.cluster}-kubeconfig",
                metadata={"name": kubeconfig_secret_name(member.cluster), "namespace": KUEUE_NAMESPACE},
                string_data={"kubeconfig": tokenless_kubeconfig(member)},
                opts=pulumi.ResourceOptions.merge(on_cluster, pulumi.ResourceOptions(
                    depends_on=[self.release], ignore_changes=["data", "stringData"]))))
            clusters.append(self._object(multikueue_cluster(member.cluster), after=[secrets[-1]]))
        system_namespace = k8s.core.v1.Namespace(f"{name}-watch-namespace", metadata={"name": failover.NAMESPACE},
                                                 opts=on_cluster)
        sources = failover.package_sources()
        configmap = failover.code_configmap_name(sources)
        code = k8s.core.v1.ConfigMap(f"{name}-watch-code", metadata={"name": configmap,
                                                                     "namespace": failover.NAMESPACE},
                                     data=sources, opts=self._after(on_cluster, system_namespace))
        renewer = self._renewer(name, fleet, settings, members, on_cluster, configmap,
                                after=[code, system_namespace, *secrets, *grants])
        self.steps = ladder_steps(fleet, members)
        *ladder, last = self.steps
        config = self._object(multikueue_config(fleet), after=clusters)
        check = self._object(admission_check(), after=[config])
        # Active only once a member is connected: after the renewer has written the first tokens.
        fleet_flavor = self._object(flavor())
        queue = self._object(cluster_queue(last.quota), after=[fleet_flavor, check, renewer])
        namespace = k8s.core.v1.Namespace(f"{name}-namespace", metadata={"name": FLEET_NAMESPACE}, opts=on_cluster)
        last_queue = self._object(local_queue(), after=[namespace, queue])
        # The ladder's steps before the last, each with its own check and config (one MultiKueue check per
        # ClusterQueue: pkg/cache/scheduler/clusterqueue.go L334-347).
        step_queues = []
        for step in ladder:
            step_config = self._object(multikueue_config(fleet, step.config, step.members),
                                       after=[clusters[fleet.cluster_names.index(c)] for c in step.members])
            step_check = self._object(admission_check(step.admission_check, step.config), after=[step_config])
            step_cluster_queue = self._object(cluster_queue(step.quota, step.cluster_queue, step.admission_check),
                                              after=[fleet_flavor, step_check, renewer])
            step_queues.append(self._object(local_queue(step.local_queue, step.cluster_queue),
                                            after=[namespace, step_cluster_queue]))
        # Jobs are submitted to the first step's queue: the last one's when the members offer no other step.
        self.local_queue = step_queues[0] if step_queues else last_queue
        self.local_queue_name = self.steps[0].local_queue
        self.ready = [self.release, kuberay, last_queue, *step_queues]
        self.watch = self._watch(name, fleet, settings, on_cluster, configmap,
                                 after=[self.release, code, system_namespace, *clusters])
        # The ladder controller moves a job down the steps, gives up on jobs past fleet.maxWait, and requeues a job
        # that lost its slice at the last step (DWS everywhere): so every fleet has one, steps before the last or not.
        self.ladder = self._ladder(name, fleet, settings, on_cluster, configmap,
                                   after=[self.release, code, system_namespace, namespace, *step_queues])
        self.register_outputs({"localQueue": self.local_queue_name, "members": [m.cluster for m in members],
                               "serviceAccount": self.service_account.email})

    @staticmethod
    def _after(base: pulumi.ResourceOptions, *resources: pulumi.Resource) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions.merge(base, pulumi.ResourceOptions(depends_on=list(resources)))

    def _identity(self, name: str, fleet: FleetSettings, settings: PlatformSettings,
                  members: Sequence[MemberHandle]) -> list[pulumi.Resource]:
        """The manager's Google service account, usable only by the renewer's Kubernetes identity (Workload
        Identity), and in each member: the IAM role to reach its API server and the RBAC of a MultiKueue manager."""
        mine = pulumi.ResourceOptions(parent=self)
        self.service_account = gcp.serviceaccount.Account(
            f"{name}-manager-gsa", account_id=fleet.service_account_id, project=settings.project,
            display_name=f"MultiKueue manager of fleet {fleet.origin}", opts=mine)
        grants: list[pulumi.Resource] = [gcp.serviceaccount.IAMMember(
            f"{name}-manager-workload-identity", service_account_id=self.service_account.name,
            role="roles/iam.workloadIdentityUser",
            member=f"serviceAccount:{settings.project}.svc.id.goog[{failover.NAMESPACE}/{CREDENTIALS_NAME}]",
            opts=mine)]
        email = self.service_account.email
        for project in dict.fromkeys(member.project for member in members):  # one grant per project
            grants.append(gcp.projects.IAMMember(
                f"{name}-manager-viewer-{project}", project=project, role=MEMBER_PROJECT_ROLE,
                member=pulumi.Output.concat("serviceAccount:", email), opts=mine))
        binding = member_binding(fleet, email)
        reader = stockout_reader_binding(fleet, email)
        for member in members:
            grants.append(k8s.rbac.v1.ClusterRoleBinding(
                f"{name}-{member.cluster}-manager-binding", metadata=binding["metadata"],
                role_ref=binding["roleRef"], subjects=binding["subjects"],
                opts=pulumi.ResourceOptions(parent=self, provider=member.provider)))
            grants.append(k8s.rbac.v1.RoleBinding(  # every member: the ladder reads every one (read_members)
                f"{name}-{member.cluster}-stockout-reader-binding", metadata=reader["metadata"],
                role_ref=reader["roleRef"], subjects=reader["subjects"],
                opts=pulumi.ResourceOptions(parent=self, provider=member.provider)))
        return grants

    def _renewer(self, name: str, fleet: FleetSettings, settings: PlatformSettings, members: Sequence[MemberHandle],
                 on_cluster: pulumi.ResourceOptions, configmap: str,
                 after: Sequence[pulumi.Resource]) -> k8s.apps.v1.Deployment:
        """The credentials renewer: its ServiceAccount (mapped to the manager's Google service account), the right
        to rewrite the members' Secrets and nothing else, and its Deployment."""
        account = k8s.core.v1.ServiceAccount(f"{name}-credentials-account", metadata={
            "name": CREDENTIALS_NAME, "namespace": failover.NAMESPACE,
            "annotations": {"iam.gke.io/gcp-service-account": self.service_account.email}},
            opts=self._after(on_cluster, *after))
        role_name = f"tpu-fallback-{CREDENTIALS_NAME}"
        role = k8s.rbac.v1.Role(f"{name}-credentials-secrets",
                                metadata={"name": role_name, "namespace": KUEUE_NAMESPACE},
                                rules=[credentials_secret_rule(fleet.cluster_names)],
                                opts=self._after(on_cluster, self.release))
        binding = k8s.rbac.v1.RoleBinding(
            f"{name}-credentials-secrets-binding", metadata={"name": role_name, "namespace": KUEUE_NAMESPACE},
            subjects=[{"kind": "ServiceAccount", "name": CREDENTIALS_NAME, "namespace": failover.NAMESPACE}],
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_name},
            opts=self._after(on_cluster, role, account))
        manifest = credentials_deployment(settings, configmap, members)
        return k8s.apps.v1.Deployment(f"{name}-credentials", metadata=manifest["metadata"], spec=manifest["spec"],
                                      opts=self._after(on_cluster, binding, *after))

    def _watch(self, name: str, fleet: FleetSettings, settings: PlatformSettings, on_cluster: pulumi.ResourceOptions,
               configmap: str, after: Sequence[pulumi.Resource]) -> k8s.apps.v1.Deployment:
        """The fleet watch: its ServiceAccount and RBAC, and the Deployment (the failover package's code)."""
        def opts(*resources: pulumi.Resource) -> pulumi.ResourceOptions:
            return self._after(on_cluster, *resources)

        account = k8s.core.v1.ServiceAccount(f"{name}-watch-account", metadata={
            "name": WATCH_NAME, "namespace": failover.NAMESPACE}, opts=opts(*after))
        subject = [{"kind": "ServiceAccount", "name": WATCH_NAME, "namespace": failover.NAMESPACE}]
        role_name = f"tpu-fallback-{WATCH_NAME}"
        role = k8s.rbac.v1.ClusterRole(f"{name}-watch-role", metadata={"name": role_name},
                                       rules=[dict(rule) for rule in WATCH_RULES], opts=on_cluster)
        binding = k8s.rbac.v1.ClusterRoleBinding(
            f"{name}-watch-binding", metadata={"name": role_name}, subjects=subject,
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
            opts=opts(role, account))
        secrets = k8s.rbac.v1.Role(f"{name}-watch-secrets", metadata={"name": role_name, "namespace": KUEUE_NAMESPACE},
                                   rules=[watch_secret_rule(fleet.cluster_names)], opts=opts(self.release))
        secrets_binding = k8s.rbac.v1.RoleBinding(
            f"{name}-watch-secrets-binding", metadata={"name": role_name, "namespace": KUEUE_NAMESPACE},
            subjects=subject, role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_name},
            opts=opts(secrets, account))
        manifest = watch_deployment(settings, fleet, configmap)
        return k8s.apps.v1.Deployment(f"{name}-watch", metadata=manifest["metadata"], spec=manifest["spec"],
                                      opts=opts(binding, secrets_binding, *after))

    def _ladder(self, name: str, fleet: FleetSettings, settings: PlatformSettings, on_cluster: pulumi.ResourceOptions, configmap: str,
                after: Sequence[pulumi.Resource]) -> k8s.apps.v1.Deployment:
        """The ladder controller: its ServiceAccount, a Role in the fleet's namespace only, and the Deployment."""
        account = k8s.core.v1.ServiceAccount(f"{name}-ladder-account", metadata={
            "name": LADDER_NAME, "namespace": failover.NAMESPACE}, opts=self._after(on_cluster, *after))
        role_name = f"tpu-fallback-{LADDER_NAME}"
        role = k8s.rbac.v1.Role(f"{name}-ladder-role", metadata={"name": role_name, "namespace": FLEET_NAMESPACE},
                                rules=[dict(rule) for rule in LADDER_RULES], opts=self._after(on_cluster, *after))
        binding = k8s.rbac.v1.RoleBinding(
            f"{name}-ladder-binding", metadata={"name": role_name, "namespace": FLEET_NAMESPACE},
            subjects=[{"kind": "ServiceAccount", "name": LADDER_NAME, "namespace": failover.NAMESPACE}],
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_name},
            opts=self._after(on_cluster, role, account))
        readers = read_members(self.steps)
        if readers:  # the kubeconfig Secrets of the members it reads, and no other
            secrets_role = f"{role_name}-secrets"
            secrets = k8s.rbac.v1.Role(f"{name}-ladder-secrets", metadata={"name": secrets_role,
                                                                          "namespace": KUEUE_NAMESPACE},
                                       rules=[watch_secret_rule(readers)], opts=self._after(on_cluster, *after))
            binding = k8s.rbac.v1.RoleBinding(
                f"{name}-ladder-secrets-binding", metadata={"name": secrets_role, "namespace": KUEUE_NAMESPACE},
                subjects=[{"kind": "ServiceAccount", "name": LADDER_NAME, "namespace": failover.NAMESPACE}],
                role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": secrets_role},
                opts=self._after(on_cluster, secrets, account, binding))
        manifest = ladder_deployment(settings, fleet, configmap, self.steps)
        return k8s.apps.v1.Deployment(f"{name}-ladder", metadata=manifest["metadata"], spec=manifest["spec"],
                                      opts=self._after(on_cluster, binding, *after))

    def _object(self, manifest: dict, after: Sequence[pulumi.Resource] = ()) -> k8s.apiextensions.CustomResource:
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        return k8s.apiextensions.CustomResource(
            f"{self._name}-{kind.lower()}-{name}", api_version=manifest["apiVersion"], kind=kind,
            metadata=manifest["metadata"], spec=manifest["spec"],
            opts=pulumi.ResourceOptions(parent=self, provider=self._provider, depends_on=[self.release, *after]))
