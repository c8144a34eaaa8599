"""Files of pinned upstream Go modules that ../shared/schemas does not hold (GMP's PodMonitoring CRD, Kueue's metric
definitions), read at test time and never committed.

The module comes from the Go module proxy at its version in testbed/versions.py (`go mod download`);
only the file is kept, under versions.cache_dir()/upstream/<module>-<version>/, so later runs need neither Go nor
the network. Test workers started in parallel wait for one download (a lock), and a killed copy never looks done.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from testbed import build, versions


class Unavailable(LookupError):
    """Neither cached nor obtainable here (no Go, or the proxy refused)."""


@dataclass(frozen=True)
class UpstreamFile:
    module: str  # a key of versions.MODULES
    path: str  # inside the module

    @property
    def source(self) -> str:
        module, version = versions.MODULES[self.module]
        return f"{module}@{version}/{self.path}"

    @property
    def cached(self) -> Path:
        _, version = versions.MODULES[self.module]
        return versions.cache_dir() / "upstream" / f"{self.module}-{version}" / self.path


# Google Cloud Managed Service for Prometheus: the CRD GKE's managed collection installs (v1 served and stored).
PODMONITORING_CRD = UpstreamFile("prometheus-engine",
                                 "charts/operator/crds/monitoring.googleapis.com_podmonitorings.yaml")
# Kueue's Cohort CRD (v1beta2), which ../shared/schemas does not hold: the teams' root and team Cohorts.
KUEUE_COHORT_CRD = UpstreamFile("kueue", "config/components/crd/bases/kueue.x-k8s.io_cohorts.yaml")
# MultiKueue's (plan C): not among ../shared/schemas either.
KUEUE_MULTIKUEUE_CRDS = {kind: UpstreamFile("kueue", f"config/components/crd/bases/kueue.x-k8s.io_{kind.lower()}s.yaml")
                         for kind in ("MultiKueueCluster", "MultiKueueConfig")}
# Kueue's metric names and labels, for the dashboard's queries.
KUEUE_METRICS = UpstreamFile("kueue", "pkg/metrics/metrics.go")


def path(item: UpstreamFile) -> Path:
    """The cached copy of an upstream file, downloading its module the first time."""
    return build.made_once(item.cached, lambda target: _copy(item, target))


def _copy(item: UpstreamFile, target: Path) -> None:
    if shutil.which("go") is None:
        raise Unavailable(f"{item.source} is not cached at {target} and Go is not installed to download it")
    try:
        source = build.module_dir(item.module) / item.path
    except RuntimeError as err:
        raise Unavailable(f"{item.source}: go mod download failed: {err}") from err
    if not source.is_file():
        raise Unavailable(f"{item.source}: no such file in the module")
    partial = target.with_name(target.name + ".partial")
    shutil.copyfile(source, partial)
    partial.rename(target)
