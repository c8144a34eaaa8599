"""A MultiKueue fleet on the tier: a manager control plane and N member control planes, started concurrently.

Each is a full ControlPlane (its own etcd, kube-apiserver, kube-controller-manager, Kueue, CA and admin client),
with Kueue configured from the Helm values its stack's release passes. The manager reaches a member as Kueue's
MultiKueue does on GKE: a kubeconfig with the member's server, its CA inline and a ServiceAccount token from a
`kubernetes.io/service-account-token` Secret the member's objects created (`connect`).
Ref: ../shared/notes/multikueue.md
"""

from __future__ import annotations

import base64
import json
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from infra.kueue import NAMESPACE as KUEUE_NAMESPACE
from tests.controlplane.cluster import ControlPlane

MANAGER = "manager"
CONFIG_KEY = "controllerManagerConfigYaml"
KUBECONFIG_KEY = "kubeconfig"  # the key Kueue reads in a MultiKueueCluster's Secret (MultiKueueConfigSecretKey)


def release_configuration(values: dict) -> dict:
    """The Kueue Configuration a release's values carry (`managerConfig.controllerManagerConfigYaml`), {} if none."""
    text = (values.get("managerConfig") or {}).get(CONFIG_KEY)
    return yaml.safe_load(text) if text else {}


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
    planes: dict[str, ControlPlane] = field(default_factory=dict)  # the manager first, then the members in order
    start_seconds: dict[str, float] = field(default_factory=dict)  # wall seconds each plane's start() took
    wall_seconds: float = 0.0  # the whole fleet's start, all planes in parallel

    def __post_init__(self) -> None:
        if MANAGER in self.member_values:
            raise ValueError(f"{MANAGER!r} names the manager; give the members other names")
        self._own_workdir = self.workdir is None
        self.workdir = Path(tempfile.mkdtemp(prefix="tpu-fallback-fleet-")) if self.workdir is None else self.workdir
        for name, values in {MANAGER: self.manager_values, **self.member_values}.items():
            folder = self.workdir / name
            folder.mkdir(parents=True, exist_ok=True)
            self.planes[name] = ControlPlane(values, workdir=folder)

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
    def connect(self, member: str, token_secret: tuple[str, str], timeout: float = 30.0) -> str:
        """The kubeconfig text (key `kubeconfig` of the manager's Secret for this member) that reaches `member`
        with the token of its Secret `token_secret` = (namespace, name), once its token controller filled it."""
        plane = self.members[member]
        namespace, name = token_secret
        return plane.inline_kubeconfig(plane.token_from_secret(namespace, name, timeout), name=member)

    def install_kubeconfig(self, member: str, secret: str, token_secret: tuple[str, str],
                           timeout: float = 30.0) -> str:
        """Write `connect(member, token_secret)` into the manager's Secret `kueue-system/<secret>`, key
        `kubeconfig` (created, or its key replaced: Kueue watches these Secrets and rebuilds its client). The
        namespace must exist on the manager. Returns the kubeconfig text."""
        text = self.connect(member, token_secret, timeout)
        data = {KUBECONFIG_KEY: base64.b64encode(text.encode()).decode()}
        kube = self.manager.kube
        if kube.get("v1", "Secret", secret, KUEUE_NAMESPACE) is None:
            kube.create({"apiVersion": "v1", "kind": "Secret",
                         "metadata": {"name": secret, "namespace": KUEUE_NAMESPACE}, "data": data})
        else:
            kube.patch("v1", "Secret", secret, {"data": data}, namespace=KUEUE_NAMESPACE)
        return text

    def manager_configuration_passed(self) -> bool:
        """Kueue on the manager runs the release's `multiKueue` and `integrations` as given (the chart and the
        tier's out-of-cluster changes leave them alone)."""
        given = release_configuration(self.manager_values)
        running = self.manager.kueue_config
        return all(running.get(key) == given.get(key) for key in ("multiKueue", "integrations"))
