"""Shared fixtures: the recording engine over each shipped stack, and the upstream CRD schemas."""

from __future__ import annotations

import os
import sys

import pytest
import yaml

from infra.offline import namespaced
from testbed import upstream
from testbed.plans import REPO, base_config, config_with, plan_for  # noqa: F401 (the tests import them from here)

_STACK_FILES = {p.name[len("Pulumi."):-len(".yaml")]: p for p in REPO.glob("Pulumi.*.yaml")}
# A stack has one role (__main__.py): team stacks name their platform stack and declare no cluster, so every test of
# the cluster, pools, Kueue and the controller runs over the platform stacks; tests/test_team_stack.py and
# tests/test_fleet.py over the rest.


def _stacks_setting(key: str) -> list[str]:
    return sorted(stack for stack, path in _STACK_FILES.items()
                  if namespaced(key) in (yaml.safe_load(path.read_text()).get("config") or {}))


TEAM_STACKS = _stacks_setting("platformStack")
# Fleet stacks (roles/fleet.py) read their members' stacks; tests/test_fleet.py covers them.
FLEET_STACKS = _stacks_setting("fleet")
SHIPPED_STACKS = sorted(set(_STACK_FILES) - set(TEAM_STACKS) - set(FLEET_STACKS))
# Platform stacks that are fleet members: tests/test_fleet_controlplane.py deploys and destroys them on the tier.
FLEET_MEMBER_STACKS = _stacks_setting("fleetMember")


@pytest.fixture(scope="session")
def crd_schemas() -> None:
    """The upstream CRDs tests/k8s_schema.py judges by, at the tier's versions (testbed/upstream.py): cached, or
    downloaded from the Go module proxy once; where neither can be, the test is skipped (failed under CI)."""
    try:
        for group, plural in (("kueue.x-k8s.io", "clusterqueues"), ("ray.io", "rayjobs")):
            upstream.path(upstream.crd(group, plural))
    except upstream.Unavailable as err:
        message = f"the upstream CRDs are not available: {err}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


# ---- the real control plane (testbed/) -------------------------------------------------------------------------------
CONTROLPLANE_MARK = "controlplane"


def pytest_terminal_summary(terminalreporter):
    # Shown under -q too (a report header is not): which of Google's schemas judged the GCP half.
    from tests.gcp_schema import discovery_header

    terminalreporter.write_line(discovery_header())


# The long files, longest first (seconds each in a loaded `.ci/run`, 2 cores: fleet tier 226, training 212, tier
# scenarios 150, failover tier 145, destroy 124, watch 59, monitoring 48, status 41, ladder 38, teams 38; since then
# the fleet tier grew to about 400 s alone and the fleet ladder's tier, about 240 s alone, came second; on real
# KubeRay and nodes the failover tier (a failed job's retries) and the teams tier grew to about 200 s each, and the
# fleet's run after admission now ends the fleet tier's first test). The training's fits (Ray Train) and its
# in-process JAX tests are two files, so two workers run them at once; the lost-slice tier takes about 120 s.
# `-n 3 --dist loadfile` gives each worker a file to run and one queued behind it, in collection order (pytest.ini
# turns off xdist's reordering by test count): so the three longest start at once, each with a short file queued
# behind it, and the other long ones follow. Three workers, not four, on 2 cores: the suite took 1,290-1,340 CPU-s
# instead of 1,640 and 795-849 s instead of 885 (2026-12-03, fresh clones, idle): the planes' background and Ray's
# processes cost by the second, and four files at once stretched every file's seconds (beside two busy loops three
# were slower: 1,068 s against 942).
LONG_FILES = ("test_fleet_controlplane.py", "test_fleet_ladder_controlplane.py", "test_train_ray.py",
              "test_controlplane.py", "test_failover_controlplane.py", "test_teams_controlplane.py",
              "test_controlplane_destroy.py", "test_lost_slice_controlplane.py", "test_train.py",
              "test_monitoring.py", "test_status_controlplane.py", "test_failover_ladder_controlplane.py",
              "test_after_admission_controlplane.py", "test_climb_back_controlplane.py",
              "test_fleet_climb_controlplane.py")


def pytest_collection_modifyitems(config, items):
    workers = getattr(config.option, "numprocesses", None) or 3
    files = list(dict.fromkeys(item.path.name for item in items))
    long = [name for name in LONG_FILES if name in files]
    short = [name for name in files if name not in LONG_FILES]
    order = long[:workers] + short[:workers] + long[workers:] + short[workers:]
    rank = {name: index for index, name in enumerate(order)}
    items.sort(key=lambda item: rank[item.path.name])  # stable: each file keeps its tests' order


def pytest_configure(config):
    config.addinivalue_line("markers", f"{CONTROLPLANE_MARK}: runs against the real etcd + kube-apiserver + Kueue "
                                       "tier (first run builds it: see README); leave out with -m 'not controlplane'")


def _tier_unavailable_or_fail(message: str) -> None:
    # Under CI a missing tier is a failure, never a skip: the tier is part of what CI proves.
    if os.environ.get("CI") == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


class _SharedPlane:
    """The control plane that consecutive tests share (`control_plane`): started by the first test that needs it and
    stopped after the last of a run of such tests, not at the session's end. An idle plane costs ~5% of a core
    (measured: 3 CPU-s a minute, the API server 1.9 of them), and a worker's session lasts the whole suite."""

    plane = None

    def get(self):
        import shutil

        from testbed import build
        from testbed.cluster import ControlPlane
        from testbed.stack import release_values

        if self.plane is None:
            missing = build.missing()
            if missing and shutil.which("go") is None:
                _tier_unavailable_or_fail(f"the control-plane binaries {missing} are not built and Go is not installed")
            if missing:
                print(f"\nbuilding the control plane ({', '.join(missing)}): about 10-30 min on a fresh machine, "
                      "seconds later", file=sys.__stderr__, flush=True)
            self.plane = ControlPlane(release_values(plan_for("dev"))).start()
        return self.plane

    def stop(self, session) -> None:
        """Its logs (etcd, kube-apiserver, kube-controller-manager, Kueue) are kept when a test has failed."""
        plane, self.plane = self.plane, None
        failed = session.testsfailed > 0
        plane.stop(keep_workdir=failed)
        if failed:
            print(f"\ncontrol plane logs kept in {plane.supervisor.logs}", file=sys.__stderr__, flush=True)


_SHARED_PLANE = _SharedPlane()


@pytest.fixture(scope="module")
def control_plane():
    """The shared control plane, on free ports in a temp dir (_SharedPlane)."""
    return _SHARED_PLANE.get()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield  # after the fixtures that end here: at a module's end, its own on the plane too
    # Kept within a module (its fixture holds the plane), and for a next module that needs it.
    if _SHARED_PLANE.plane is not None and (nextitem is None or (
            nextitem.module is not item.module and "control_plane" not in nextitem.fixturenames)):
        _SHARED_PLANE.stop(item.session)
