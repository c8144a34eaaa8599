"""Files of pinned upstream Go modules, read at test time and never committed: the CRDs our custom resources are
judged by (Kueue's, KubeRay's, the ProvisioningRequest API's, GMP's PodMonitoring), at the versions the tier builds
and installs, and Kueue's metric definitions.

The module comes from the Go module proxy at its version in testbed/versions.py (`go mod download`); only the file
is kept, under versions.cache_dir()/upstream/<module>-<version>/, so later runs need neither Go nor the network. Test
workers started in parallel wait for one download (a lock), and a killed copy never looks done.
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


# Where each API group's generated CRDs lie in its module, as `<group>_<plural>.yaml` (controller-gen's names).
# Kueue: the bases its Helm chart templates (same schemas). KubeRay: the operator's module, whose CRDs its chart ships.
# The ProvisioningRequest API: the version Kueue's go.mod requires, which GKE serves for queued provisioning. Google
# Cloud Managed Service for Prometheus: the PodMonitoring CRD GKE's managed collection installs (v1 served and stored).
# Ref: https://github.com/kubernetes-sigs/kueue/tree/v0.19.2/config/components/crd/bases
# Ref: https://github.com/ray-project/kuberay/tree/v1.6.2/ray-operator/config/crd/bases
# Ref: https://github.com/kubernetes/autoscaler/tree/adfbe7e45277/cluster-autoscaler/apis/config/crd
# Ref: https://github.com/GoogleCloudPlatform/prometheus-engine/tree/v0.17.2/charts/operator/crds
CRD_FOLDERS = {
    "kueue.x-k8s.io": ("kueue", "config/components/crd/bases"),
    "ray.io": ("kuberay", "config/crd/bases"),
    "autoscaling.x-k8s.io": ("autoscaler", "config/crd"),
    "monitoring.googleapis.com": ("prometheus-engine", "charts/operator/crds"),
}


def crd(group: str, plural: str) -> UpstreamFile:
    """The CRD of `plural.group` in its pinned module."""
    module, folder = CRD_FOLDERS[group]
    return UpstreamFile(module, f"{folder}/{group}_{plural}.yaml")


PODMONITORING_CRD = crd("monitoring.googleapis.com", "podmonitorings")
# The teams' root and team Cohorts (v1beta2).
KUEUE_COHORT_CRD = crd("kueue.x-k8s.io", "cohorts")
# MultiKueue's (plan C).
KUEUE_MULTIKUEUE_CRDS = {kind: crd("kueue.x-k8s.io", f"{kind.lower()}s")
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
