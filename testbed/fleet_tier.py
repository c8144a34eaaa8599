"""A MultiKueue fleet on the tier: a manager control plane and N member control planes, started concurrently.

Each is a full ControlPlane (its own etcd, kube-apiserver, kube-controller-manager, Kueue, CA and admin client),
with Kueue configured from the Helm values its stack's release passes. The manager reaches a member as Kueue's
MultiKueue does on GKE: a kubeconfig Secret with the member's server, its CA inline and a short-lived token that the
fleet's renewer (failover/credentials.py) writes and rewrites; the token is a Google-like identity token minted by
`google.FakeGoogle`, which every member's kube-apiserver trusts as GKE trusts Google's.
Ref: https://kueue.sigs.k8s.io/docs/concepts/multikueue/, https://kueue.sigs.k8s.io/docs/tasks/manage/setup_multikueue/
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from infra import failover as stack_failover
from infra import fleet as stack_fleet
from infra.fleet_member import FLEET_NAMESPACE
from infra.kueue import KUEUE_API_VERSION
from infra.offline import OfflineEngine, Plan, StackOutputs
from testbed import jobs
from testbed.cluster import ControlPlane
from testbed.google import FakeGoogle
from testbed.kube import Kube, Rejected, condition, server_seconds, wait_for
from testbed.plans import REPO, config_with, plan_for
from testbed.processes import Process, free_port
from testbed.stack import Step, deploy, release_configuration, release_values

MANAGER = "manager"


def loaded_configuration(plane: ControlPlane) -> dict:
    """The configuration a plane's Kueue logged at start ("Configuration loaded"): the file after Kueue's own
    defaulting, so what it really runs (durations as Go prints them: 60s is "1m0s")."""
    for line in plane.kueue.log.read_text(errors="replace").splitlines():
        if '"Configuration loaded"' in line:
            return yaml.safe_load(json.loads(line)["config"])
    raise LookupError(f"no 'Configuration loaded' line in {plane.kueue.log}")


@dataclass
class FleetTier:
    """`with FleetTier(manager_values, {"m1": values, ...}) as fleet:` starts every plane concurrently and stops all
    of them on exit, even when one failed to start (the others are stopped before the error propagates)."""

    manager_values: dict
    member_values: dict[str, dict]
    workdir: Path | None = None
    token_lifetime: float = 60.0  # seconds each of the manager's tokens is valid (GKE's: an hour)
    nodes_of: dict[str, Plan] = field(default_factory=dict)  # plane -> the plan whose pools it runs (runtime.py)
    planes: dict[str, ControlPlane] = field(default_factory=dict)  # the manager first, then the members in order
    start_seconds: dict[str, float] = field(default_factory=dict)  # wall seconds each plane's start() took
    wall_seconds: float = 0.0  # the whole fleet's start, all planes in parallel

    def __post_init__(self) -> None:
        if MANAGER in self.member_values:
            raise ValueError(f"{MANAGER!r} names the manager; give the members other names")
        self._own_workdir = self.workdir is None
        self.workdir = Path(tempfile.mkdtemp(prefix="tpu-fallback-fleet-")) if self.workdir is None else self.workdir
        # Google's side, first: the members' API servers are told to trust its issuer when they start.
        self.google = FakeGoogle(self.workdir / "google", self.token_lifetime).start()
        for name, values in {MANAGER: self.manager_values, **self.member_values}.items():
            folder = self.workdir / name
            folder.mkdir(parents=True, exist_ok=True)
            trusts = () if name == MANAGER else (
                f"--authentication-config={self.google.authentication_config(folder)}",)
            self.planes[name] = ControlPlane(values, workdir=folder, apiserver_args=trusts,
                                             nodes_of=self.nodes_of.get(name))

    @property
    def manager(self) -> ControlPlane:
        return self.planes[MANAGER]

    @property
    def members(self) -> dict[str, ControlPlane]:
        return {name: plane for name, plane in self.planes.items() if name != MANAGER}

    # ---- start / stop ------------------------------------------------------------------------------------------
    def start(self) -> FleetTier:
        """Start every plane, one thread each (each builds its own Kube client in its thread and only hands it
        over once started). A plane that fails stops itself; then the others are stopped and the first error
        (in plane order) is raised, naming the plane."""
        started = time.monotonic()

        def start_one(name: str) -> None:
            began = time.monotonic()
            try:
                self.planes[name].start()
            finally:
                self.start_seconds[name] = round(time.monotonic() - began, 2)

        pool = ThreadPoolExecutor(max_workers=len(self.planes), thread_name_prefix="fleet")
        try:
            futures = {name: pool.submit(start_one, name) for name in self.planes}
            pool.shutdown(wait=True)
        except BaseException:  # Ctrl-C while waiting: let the starts finish, then stop what they started
            pool.shutdown(wait=True)
            self.stop(keep_workdir=True)
            raise
        self.wall_seconds = round(time.monotonic() - started, 2)
        errors = {name: future.exception() for name, future in futures.items() if future.exception() is not None}
        if errors:
            self.stop(keep_workdir=True)
            name, error = next(iter(errors.items()))
            raise RuntimeError(f"fleet plane {name!r} did not start (logs kept in {self.workdir}): {error}; "
                               f"{len(errors)} of {len(self.planes)} failed: {sorted(errors)}") from error
        return self

    def stop(self, keep_workdir: bool = False) -> None:
        """Stop every plane (each thaws its API server first); keep the folder (logs) when asked.

        The manager first: a member's kube-apiserver waits for open requests on SIGTERM, and the manager's Kueue
        holds watches on it (measured: 10 s, the whole grace, then a kill). Then the members in parallel."""
        errors = []

        def stop_one(plane: ControlPlane) -> None:
            try:
                plane.stop(keep_workdir=True)  # the fleet owns the folder
            except Exception as error:  # noqa: BLE001 - stop the others anyway
                errors.append(error)

        stop_one(self.manager)
        with ThreadPoolExecutor(max_workers=max(1, len(self.members)), thread_name_prefix="fleet-stop") as pool:
            list(pool.map(stop_one, self.members.values()))
        self.google.stop()
        if self._own_workdir and not keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if errors:
            raise errors[0]

    def __enter__(self) -> FleetTier:
        return self.start()

    def __exit__(self, kind, error, traceback) -> None:
        self.stop(keep_workdir=error is not None)
        if error is not None:
            print(f"\nfleet tier logs kept in {self.workdir}")

    def timings(self) -> dict[str, dict]:
        """Per plane: its start's wall seconds and its steps; and the fleet's wall seconds."""
        report: dict[str, dict] = {name: {"start": self.start_seconds.get(name), **plane.timings.steps}
                                   for name, plane in self.planes.items()}
        report["fleet"] = {"wall": self.wall_seconds}
        return report

    # ---- connecting the manager to a member --------------------------------------------------------------------
    def kubeconfig(self, member: str, token: str | None) -> str:
        """A kubeconfig text for the manager's Secret for `member`, as the renewer writes it (no user: as the stack
        creates it)."""
        return self.members[member].inline_kubeconfig(token, name=member)

    def manager_configuration_passed(self) -> bool:
        """Kueue on the manager runs the release's `multiKueue` and `integrations` as given (the chart and the
        tier's out-of-cluster changes leave them alone)."""
        given = release_configuration(self.manager_values)
        running = self.manager.kueue_config
        return all(running.get(key) == given.get(key) for key in ("multiKueue", "integrations"))


# ---- the shipped fleet and member stacks on a FleetTier (tests/test_fleet_controlplane.py, bench/bench_fleet.py) ----
W1, W2 = MEMBERS = ("member-us-east5-a", "member-asia-northeast1-b")
MEMBER_STACKS = {member: f"my-org/tpu-fallback/{member}" for member in MEMBERS}
PODS_READY_TIMEOUT_SECONDS = 30  # the members' waitForPodsReady on the tier's clock (stack.release_values)
WORKER_LOST_SECONDS = 10  # the manager's workerLostTimeout (the shortest allowed)
REACTION = 60  # generous: three control planes share two cores with the rest of the suite
WORKLOAD = (KUEUE_API_VERSION, "Workload")


def member_plan(member: str) -> Plan:
    return plan_for(member, {"fallback": {"stockoutGracePeriod": "4s"}})


def member_values(plan: Plan) -> dict:
    """A member's Kueue release on the tier's clock: its pods' start is timed out after PODS_READY_TIMEOUT_SECONDS."""
    return release_values(plan, PODS_READY_TIMEOUT_SECONDS)


def fleet_plan(members: dict[str, Plan]) -> Plan:
    references = {MEMBER_STACKS[m]: StackOutputs(plan.outputs, tuple(sorted(plan.secret_outputs)))
                  for m, plan in members.items()}
    config = config_with({"fleet": {"members": list(MEMBER_STACKS.values()), "dispatcher": "AllAtOnce",
                                    "workerLostTimeout": f"{WORKER_LOST_SECONDS}s", "checkpointLocation": "US"}},
                         "fleet")
    return OfflineEngine("fleet", False, references).run(config)


@contextlib.contextmanager
def applied_fleet(manager_plan: Plan, members: dict[str, Plan], stacks: type[FleetStacks] | None = None,
                  keep_logs: Callable[[], bool] = lambda: False, nodes: bool = False) -> Iterator[FleetStacks]:
    """A FleetTier for these plans, started, with the stacks applied (the members', then the fleet's); stopped after,
    its logs kept, and where said, when the body raised or `keep_logs()` (a module fixture: a test failed). `nodes`:
    every plane runs its plan's pools, the scheduler and KubeRay (runtime.py)."""
    tier = FleetTier(release_values(manager_plan), {m: member_values(p) for m, p in members.items()},
                     nodes_of={MANAGER: manager_plan, **members} if nodes else {})
    failed = True
    try:
        tier.start()
        fleet = (stacks or FleetStacks)(tier, manager_plan, members)
        fleet.apply()
        yield fleet
        failed = keep_logs()
    finally:
        tier.stop(keep_workdir=failed)
        if failed:
            print(f"\nfleet tier logs kept in {tier.workdir}")


class FleetStacks:
    """The three planes with the stacks applied; helpers to read and play what happens to a job."""

    def __init__(self, tier: FleetTier, manager_plan: Plan, members: dict[str, Plan]):
        self.tier, self.manager_plan, self.member_plans = tier, manager_plan, members
        self.manager: Kube = tier.manager.kube
        self.members: tuple[str, ...] = tuple(members)  # MEMBERS, or the fleet's own (the ladder's: three)
        self.kubes: dict[str, Kube] = {m: tier.members[m].kube for m in self.members}
        self.template = next(m for m in manager_plan.kubernetes_manifests() if m["kind"] == "RayJob")
        self.steps: list[Step] = []
        self.watch: Process | None = None
        self.renewer: Process | None = None

    # ---- apply, as `pulumi up` on the members, then on the fleet ----------------------------------------------------
    def route(self, step: Step) -> Kube:
        """A step of the fleet's plan goes to the cluster of its provider: a member's (`<member>-k8s`) or the
        manager's."""
        provider = step.resource.provider_urn.rsplit("::", 1)[-1]
        return self.kubes.get(provider.removesuffix("-k8s"), self.manager)

    def with_tier_endpoints(self, step: Step) -> dict:
        """What the tier changes in the fleet's plan: the members' endpoints (mock values in the plan) become the
        planes' own, in the kubeconfig Secrets (created without a token, as the stack does) and in the renewer's
        FLEET_ACCESS; nothing else."""
        manifest, meta = step.manifest, step.manifest["metadata"]
        for member in self.members:
            if manifest["kind"] == "Secret" and meta["name"] == stack_fleet.kubeconfig_secret_name(member):
                assert manifest["stringData"] == "[secret]"  # what the plan holds: pulumi-kubernetes keeps it secret
                return {**manifest, "stringData": {"kubeconfig": self.tier.kubeconfig(member, None)}}
        if manifest["kind"] == "Deployment" and meta["name"] == stack_fleet.CREDENTIALS_NAME:
            edited = copy.deepcopy(manifest)
            (container,) = edited["spec"]["template"]["spec"]["containers"]
            (access,) = [e for e in container["env"] if e["name"] == "FLEET_ACCESS"]
            planned = json.loads(access["value"])
            assert set(planned) == set(self.members)
            access["value"] = json.dumps({m: {**planned[m], **self.tier.members[m].access} for m in self.members})
            return edited
        return manifest

    def start_when_created(self, step: Step) -> None:
        """A Deployment the tier runs as a process once `pulumi up` has created it (there is no kubelet): the
        renewer, which the fleet's queue waits for."""
        if step.manifest["kind"] == "Deployment" and step.manifest["metadata"]["name"] == stack_fleet.CREDENTIALS_NAME:
            self.start_renewer(self.manager.get("apps/v1", "Deployment", stack_fleet.CREDENTIALS_NAME,
                                                stack_failover.NAMESPACE))

    def apply(self) -> None:
        for member, plan in self.member_plans.items():
            deploy(self.kubes[member], plan)
        # The identity the metadata server speaks for: the fleet's manager service account, as its output names it.
        self.tier.google.email = self.manager_plan.outputs["managerServiceAccount"]
        # Without the plan's job: each scenario submits its own. (The RayJob's turn is the plan's last step.)
        plan = Plan([r for r in self.manager_plan.resources if r.type != "kubernetes:ray.io/v1:RayJob"],
                    self.manager_plan.outputs, self.manager_plan.secret_outputs)
        self.steps = deploy(self.manager, plan, wait_timeout=REACTION, route=self.route,
                            edit=self.with_tier_endpoints, after_create=self.start_when_created).steps

    # ---- the credentials renewer, as deployed, with its own ServiceAccount's rights ---------------------------
    def start_renewer(self, deployment: dict) -> None:
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container["env"] if e["name"].startswith("FLEET_")}
        kubeconfig = self.tier.manager.kubeconfig_for_service_account(stack_failover.NAMESPACE,
                                                                      stack_fleet.CREDENTIALS_NAME)
        self.renewer = self.tier.manager.supervisor.start(
            "fleet-credentials", [sys.executable, "-m", "failover.credentials"], env={
                **os.environ, **env, "GCE_METADATA_HOST": self.tier.google.metadata_host,
                "KUBECONFIG": str(kubeconfig)}, cwd=REPO)

    # ---- the fleet watch, as deployed, with its own ServiceAccount's rights -----------------------------------
    def start_watch(self) -> None:
        deployment = next(m for m in self.manager_plan.kubernetes_manifests()
                          if m["kind"] == "Deployment" and m["metadata"]["name"] == stack_fleet.WATCH_NAME)
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container["env"] if e["name"].startswith("FLEET_")}
        kubeconfig = self.tier.manager.kubeconfig_for_service_account(stack_failover.NAMESPACE, stack_fleet.WATCH_NAME)
        self.watch = self.tier.manager.supervisor.start("fleet-watch", [sys.executable, "-m", "failover.watch"], env={
            **os.environ, **env, "KUBECONFIG": str(kubeconfig),  # at its deployed period
            "FLEET_METRICS_PORT": str(free_port()),  # another tier's watch may hold the deployed ports
            "FLEET_HEALTH_PORT": str(free_port())}, cwd=REPO)

    # ---- a job -----------------------------------------------------------------------------------------------
    def submit(self, name: str) -> str:
        """Create a copy of the fleet plan's RayJob on the manager; its manager Workload's name."""
        job = {**self.template, "metadata": {**self.template["metadata"], "name": name}}
        self.manager.create(job)
        workload = wait_for(lambda: jobs.workload_of(self.manager, FLEET_NAMESPACE, name), REACTION,
                            f"manager Workload of {name}")
        return workload["metadata"]["name"]

    def copy_in(self, member: str, workload: str) -> dict | None:
        return self.kubes[member].get(*WORKLOAD, workload, FLEET_NAMESPACE)

    def requests_in(self, member: str, workload: str) -> list[dict]:
        found = self.copy_in(member, workload)
        return jobs.provisioning_requests(self.kubes[member], FLEET_NAMESPACE, found) if found else []

    def all_requests(self, member: str) -> list[dict]:
        return self.kubes[member].list(*jobs.PROVISIONING_REQUEST, namespace=FLEET_NAMESPACE)

    def rayjob_in(self, member: str, name: str) -> dict | None:
        return self.kubes[member].get(*jobs.RAYJOB, name, FLEET_NAMESPACE)

    def rayclusters_in(self, member: str, name: str) -> list[str]:
        """The RayClusters KubeRay made in a member for the RayJob `name` (they and their pods are its run)."""
        return [c["metadata"]["name"] for c in self.kubes[member].list(*jobs.RAYCLUSTER, namespace=FLEET_NAMESPACE)
                if any(o.get("kind") == "RayJob" and o.get("name") == name
                       for o in c["metadata"].get("ownerReferences") or [])]

    def running_in(self, name: str) -> list[str]:
        return [m for m in self.members if self.rayjob_in(m, name) is not None]

    def wait_requests_everywhere(self, workload: str) -> dict[str, dict]:
        return {m: wait_for(lambda m=m: (self.requests_in(m, workload) or [None])[0], REACTION,
                            f"{workload}'s ProvisioningRequest in {m}") for m in self.members}

    def provision(self, member: str, request: dict) -> None:
        jobs.mark_provisioned(self.kubes[member], request, f"resize-{member}")

    def provision_until_created(self, member: str, workload: str, name: str, timeout: float = REACTION) -> dict:
        """Provision whatever request the member has for the job until its RayJob is there: the manager may replace
        the copy (and its request) meanwhile, e.g. while it finishes an eviction (seen under a loaded suite)."""
        def attempt() -> dict | None:
            for request in self.requests_in(member, workload):
                try:
                    self.provision(member, request)
                except Rejected as error:
                    if error.status != 404:
                        raise  # replaced meanwhile: the next attempt takes the new one
            return self.rayjob_in(member, name)
        return wait_for(attempt, timeout, f"{name} created in {member}", interval=0.5)

    # ---- GCE capacity in a member (a tier with nodes: runtime.py's autoscaler stand-in) ---------------------------
    def stockout(self, member: str, *flavors: str, reported: bool = True) -> None:
        """No capacity behind these rungs of a member: their pools cannot grow, and its GKE says so on the pods
        unless not `reported`; a DWS rung's provisioned VMs never come."""
        for flavor in flavors:
            for pool in self.pools_of(member, flavor):
                self.tier.members[member].after.gke.stockout(pool, reported)

    def pools_of(self, member: str, flavor: str) -> list[str]:
        """The member's node pools behind one of its rungs: those its plan's ResourceFlavor selects."""
        (manifest,) = [m for m in self.member_plans[member].kubernetes_manifests()
                       if m["kind"] == "ResourceFlavor" and m["metadata"]["name"] == flavor]
        return self.tier.members[member].after.gke.pools_for(manifest)

    def restore(self, member: str | None = None) -> None:
        """Capacity back in a member (every member when None)."""
        for name in [member] if member else self.members:
            self.tier.members[name].after.gke.restore()

    def stockout_reported(self, member: str, name: str, namespace: str = FLEET_NAMESPACE) -> float:
        """When the member's GKE first said "GCE out of resources" about a pod of the job's current run there, on
        the monotonic clock (the Event's firstTimestamp has whole seconds)."""
        stamp = wait_for(lambda: jobs.first_stockout_report(self.kubes[member], namespace, name), REACTION,
                         f"{member}'s stockout report on {name}'s pods")
        return time.monotonic() - (time.time() - server_seconds(stamp))

    def manager_workload(self, workload: str) -> dict:
        return self.manager.get(*WORKLOAD, workload, FLEET_NAMESPACE)

    def finish(self, name: str) -> None:
        """Delete the job on the manager; MultiKueue removes what it made in the members."""
        self.manager.delete(*jobs.RAYJOB, name, FLEET_NAMESPACE, propagation="Background")
        wait_for(lambda: not self.running_in(name) and jobs.workload_of(self.manager, FLEET_NAMESPACE, name) is None,
                 REACTION, f"{name} gone everywhere")


class Timeline:
    """What a fleet job's objects go through, from watches (no change between two looks is missed, and an idle
    timeline asks nothing: polling every 0.2 s cost a partition scenario ~12 CPU-s more of API servers, pytest and
    etcd): the manager's Workload and RayJob and, in each member that is not frozen, the copy, its
    ProvisioningRequests and the RayJob; each change recorded with the seconds since `zero` (the test's freeze). A
    frozen member's watches are dropped at the freeze (its API server answers nothing meanwhile) and listed afresh at
    the thaw."""

    def __init__(self, fleet: FleetStacks, job: str, workload: str):
        self.fleet, self.job, self.workload = fleet, job, workload
        self.zero = time.monotonic()
        self.frozen: set[str] = set()
        self.events: list[tuple[float, str, object]] = []
        self._last: dict[str, object] = {}
        self._lock = threading.Lock()
        self._informers: dict[str, list] = {}  # who ("manager" or a member) -> its informers, the current ones

    def __enter__(self) -> Timeline:
        self._start("manager")
        for member in self.fleet.members:
            self._start(member)
        return self

    def now(self) -> float:
        """Seconds since the timeline's zero."""
        return round(time.monotonic() - self.zero, 2)

    def freeze(self, member: str) -> None:
        """Freeze the member's API server (a partition: what runs there goes on), from now the timeline's zero."""
        self.frozen.add(member)
        self._stop(member)
        self.fleet.tier.members[member].freeze()
        self.zero = time.monotonic()

    def thaw(self, member: str) -> float:
        """The member answers again; the seconds since the freeze, recorded as an event."""
        self.fleet.tier.members[member].thaw()
        self.frozen.discard(member)
        at = self.now()
        with self._lock:
            self.events.append((at, "thawed", member))
        self._start(member)
        return at

    def __exit__(self, *_) -> None:
        for who in list(self._informers):
            self._stop(who)

    # ---- the watches -------------------------------------------------------------------------------------------
    def _sources(self, who: str) -> list[tuple[str, str, Callable[[dict[str, dict]], object]]]:
        """(what, collection path, its value from the collection's objects by name) for the manager or a member."""
        base = f"namespaces/{FLEET_NAMESPACE}"
        workloads, rayjobs = f"/apis/{KUEUE_API_VERSION}/{base}/workloads", f"/apis/{jobs.RAYJOB[0]}/{base}/rayjobs"
        if who == "manager":
            return [("manager", workloads, lambda found: self._manager(found.get(self.workload))),
                    ("manager-rayjob", rayjobs, lambda found: self._manager_rayjob(found.get(self.job)))]
        requests = f"/apis/{jobs.PROVISIONING_REQUEST[0]}/{base}/provisioningrequests"
        return [(f"{who}-copy", workloads, lambda found: self._copy(found.get(self.workload))),
                (f"{who}-requests", requests, lambda found: tuple(sorted(
                    (r["metadata"]["uid"][:8], condition(r, "Provisioned") == "True") for r in found.values()))),
                (f"{who}-rayjob", rayjobs, lambda found: self._run(found.get(self.job)))]

    def _start(self, who: str) -> None:
        from failover.runtime.informer import Informer, RawClient, Watched

        kube = self.fleet.manager if who == "manager" else self.fleet.kubes[who]
        informers = []
        for what, path, value_of in self._sources(who):
            found: dict[str, dict] = {}

            def listed(items: list[dict], what=what, found=found, value_of=value_of, mine=informers) -> None:
                found.clear()
                found.update({item["metadata"]["name"]: item for item in items})
                self._record(who, mine, what, value_of(found))

            def changed(kind: str, obj: dict, what=what, found=found, value_of=value_of, mine=informers) -> None:
                if kind == "DELETED":
                    found.pop(obj["metadata"]["name"], None)
                else:
                    found[obj["metadata"]["name"]] = obj
                self._record(who, mine, what, value_of(found))

            informer = Informer(RawClient(kube.api_client), Watched(what, path), listed, changed)
            informer.name = f"timeline-{what}"
            informers.append(informer)
        self._informers[who] = informers
        for informer in informers:
            informer.start()
        wait_for(lambda: all(i.synced.is_set() for i in informers), REACTION, f"the timeline's watches of {who}")

    def _stop(self, who: str) -> None:
        for informer in self._informers.pop(who, []):
            informer.stop()

    def _record(self, who: str, informers: list, what: str, value: object) -> None:
        with self._lock:
            if self._informers.get(who) is not informers:
                return  # a watch dropped at a freeze, still delivering
            if self._last.get(what, "unseen") != value:
                self._last[what] = value
                self.events.append((round(time.monotonic() - self.zero, 2), what, value))

    @staticmethod
    def _manager(workload: dict | None) -> object:
        status = (workload or {}).get("status") or {}
        return (tuple(sorted(c["type"] for c in status.get("conditions") or [] if c.get("status") == "True"
                             and c["type"] in ("QuotaReserved", "Admitted", "Evicted", "Finished"))),
                status.get("clusterName"), tuple(status.get("nominatedClusterNames") or ()))

    @staticmethod
    def _manager_rayjob(rayjob: dict | None) -> object:
        return (bool(((rayjob or {}).get("spec") or {}).get("suspend")),
                ((rayjob or {}).get("status") or {}).get("jobDeploymentStatus"))

    @staticmethod
    def _copy(copy: dict | None) -> object:
        return None if copy is None else (copy["metadata"]["uid"][:8], tuple(sorted(
            c["type"] for c in (copy.get("status") or {}).get("conditions") or [] if c.get("status") == "True"
            and c["type"] in ("QuotaReserved", "Admitted", "Evicted", "DeactivationTarget"))))

    @staticmethod
    def _run(rayjob: dict | None) -> object:
        return None if rayjob is None else (rayjob["metadata"]["uid"][:8], bool((rayjob.get("spec") or {}).get(
            "suspend")))

    def seen(self, what: str) -> list[object]:
        """Every value `what` took, in order."""
        with self._lock:
            return [value for _, name, value in self.events if name == what]

    def text(self) -> str:
        return "\n".join(f"  {t:7.2f}  {what}: {value}" for t, what, value in self.events)
