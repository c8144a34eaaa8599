"""Versions of everything the real control plane is built from: the one place they live.

Kueue's version is the stack's own default (`kueue.version`), so the tier runs what `pulumi up` installs.
"""

from __future__ import annotations

import os
from pathlib import Path

from infra.fleet import KUBERAY_VERSION
from infra.settings import DEFAULTS

KUEUE = "v" + DEFAULTS["kueue"]["version"]
# GKE 1.34+ is what plan B needs; the tier's API server is the newest patch the Go proxy serves for 1.36.
KUBERNETES = "v1.36.3"
KUBERNETES_STAGING = "v0.36.3"  # k8s.io/kubernetes' staging modules share the tag with major 0
ETCD = "v3.6.16"
HELM = "v3.22.0"
# KubeRay: the Go proxy does not serve 1.7.0, so the tier installs the newest 1.6 it serves, the one Kueue 0.19.2's
# go.mod requires, and a fleet's manager installs the same (its chart). The tests judge RayJobs by this version's CRDs.
# The tier also runs this version's operator: `go list -m -versions` names only v1.4.0 and v1.5.0, yet the proxy
# serves v1.6.2 and everything it requires, so the operator the tests run is the one a fleet's manager installs.
KUBERAY = "v" + KUBERAY_VERSION
# KWOK: the tier's nodes and pods (their status only; no container runs). The newest release the Go proxy serves.
KWOK = "v0.8.0"
# The ProvisioningRequest API Kueue 0.19.2 is built against (its go.mod).
AUTOSCALER_APIS = "v0.0.0-20240830133931-adfbe7e45277"
# Google Cloud Managed Service for Prometheus: its PodMonitoring CRD (GKE installs its own copy with managed
# collection). The newest release tag the Go proxy serves (2026-01-07; later tags are release candidates).
PROMETHEUS_ENGINE = "v0.17.2"
# Prometheus's own rule engine, for the alert policies' PromQL (`promtool test rules`): the newest the proxy serves.
PROMETHEUS = "v0.316.0"

MODULES = {
    "kueue": ("sigs.k8s.io/kueue", KUEUE),
    "kubernetes": ("k8s.io/kubernetes", KUBERNETES),
    "etcd": ("go.etcd.io/etcd/server/v3", ETCD),
    "helm": ("helm.sh/helm/v3", HELM),
    "kuberay": ("github.com/ray-project/kuberay/ray-operator", KUBERAY),
    "autoscaler": ("k8s.io/autoscaler/cluster-autoscaler/apis", AUTOSCALER_APIS),
    "prometheus-engine": ("github.com/GoogleCloudPlatform/prometheus-engine", PROMETHEUS_ENGINE),
    "kwok": ("sigs.k8s.io/kwok", KWOK),
    "prometheus": ("github.com/prometheus/prometheus", PROMETHEUS),
}


def cache_dir() -> Path:
    """Binaries live outside the repository, keyed by version (TPU_FALLBACK_CACHE overrides the place)."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tpu-fallback" / "controlplane"
    return Path(os.environ.get("TPU_FALLBACK_CACHE", default))


def binary_path(name: str, version: str) -> Path:
    return cache_dir() / "bin" / f"{name}-{version}"


BINARIES = {
    "etcd": ETCD,
    "kube-apiserver": KUBERNETES,
    "kube-controller-manager": KUBERNETES,
    "kueue": KUEUE,
    "helm": HELM,
    # After admission (testbed/runtime.py): the scheduler, KWOK's nodes and KubeRay's operator.
    "kube-scheduler": KUBERNETES,
    "kwok": KWOK,
    "kuberay-operator": KUBERAY,
    # The alert policies' queries on Prometheus's rule engine (tests/test_alerts_promtool.py).
    "promtool": PROMETHEUS,
}
