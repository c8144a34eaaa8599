"""Build the real control plane's binaries from Go modules into a cache outside the repository.

    python -m testbed build          # what is missing; reuses binaries keyed by version
    python -m testbed wrappers       # regenerate the wrapper go.mod files (after a version bump)

kube-apiserver and kube-controller-manager come from k8s.io/kubernetes through a wrapper module, because its
go.mod replaces its staging modules with local folders, which `go install pkg@version` refuses; etcd's server
module replaces its siblings the same way. Kueue and helm install straight from their tags. Only the wrappers'
go.mod/go.sum live in the repository (testbed/gomod/); sources and binaries stay in Go's caches and
`versions.cache_dir()`.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from testbed import versions

GOMOD = Path(__file__).resolve().parent / "gomod"
WRAPPER_GO = "1.26.0"


def _go_env() -> dict[str, str]:
    # Two cores: two packages at a time. A fixed CGO setting keeps Go's build cache keys stable.
    return {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-p=2 -buildvcs=false"}


def _go(*args: str, cwd: Path | None = None) -> str:
    result = subprocess.run(["go", *args], cwd=cwd, env=_go_env(), text=True, capture_output=True)
    if result.returncode != 0:
        raise RuntimeError(f"go {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result.stdout


def module_dir(name: str) -> Path:
    """The folder of a pinned module in Go's module cache (downloaded if needed): CRDs and the Kueue chart."""
    path, version = versions.MODULES[name]
    with tempfile.TemporaryDirectory() as scratch:  # outside any module, so no go.mod is consulted
        info = json.loads(_go("mod", "download", "-json", f"{path}@{version}", cwd=Path(scratch)))
    if info.get("Error"):
        raise RuntimeError(info["Error"])
    return Path(info["Dir"])


def _version_ldflags(version: str) -> str:
    # Without these, /version says v0.0.0-master+$Format:%H$, which Kueue cannot parse (it exits).
    major, minor = version.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {package}.gitVersion={version}", f"-X {package}.gitMajor={major}",
                  f"-X {package}.gitMinor={minor}", f"-X {package}.gitTreeState=clean"]
    return " ".join(flags)


# name -> (wrapper folder or None, Go package, ldflags)
def _targets() -> dict[str, tuple[str | None, str, str]]:
    kueue_path, kueue_version = versions.MODULES["kueue"]
    kuberay_path, kuberay_version = versions.MODULES["kuberay"]
    kwok_path, kwok_version = versions.MODULES["kwok"]
    prometheus_path, prometheus_version = versions.MODULES["prometheus"]
    return {
        "etcd": ("etcd", "go.etcd.io/etcd/server/v3", "-s -w"),
        "kube-apiserver": ("kubernetes", "k8s.io/kubernetes/cmd/kube-apiserver",
                           _version_ldflags(versions.KUBERNETES)),
        "kube-controller-manager": ("kubernetes", "k8s.io/kubernetes/cmd/kube-controller-manager",
                                    _version_ldflags(versions.KUBERNETES)),
        "kueue": (None, f"{kueue_path}/cmd/kueue@{kueue_version}",
                  f"-s -w -X {kueue_path}/pkg/version.GitVersion={kueue_version}"),
        "helm": (None, f"helm.sh/helm/v3/cmd/helm@{versions.HELM}",
                 f"-s -w -X helm.sh/helm/v3/internal/version.version={versions.HELM}"),
        "kube-scheduler": ("kubernetes", "k8s.io/kubernetes/cmd/kube-scheduler",
                           _version_ldflags(versions.KUBERNETES)),
        # KWOK's own version constant already says the tag; KubeRay's main has only build-time and commit strings.
        "kwok": (None, f"{kwok_path}/cmd/kwok@{kwok_version}", "-s -w"),
        "kuberay-operator": (None, f"{kuberay_path}@{kuberay_version}", "-s -w"),
        "promtool": (None, f"{prometheus_path}/cmd/promtool@{prometheus_version}", "-s -w"),
    }


# Build tags per binary: promtool without the service-discovery plugins (it never scrapes), a much smaller build.
_TAGS = {"promtool": "remove_all_sd"}


def made_once(target: Path, make: Callable[[Path], None]) -> Path:
    """`target`, made by `make(target)` only when the cache lacks it. Test workers started in parallel on a fresh
    machine wait for one maker (a lock) instead of running four."""
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(f".{target.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            make(target)
    return target


def build(name: str) -> Path:
    """The binary `name` at its pinned version, built only when the cache lacks it."""
    return made_once(versions.binary_path(name, versions.BINARIES[name]), lambda target: _build(name, target))


def _build(name: str, target: Path) -> None:
    wrapper, package, ldflags = _targets()[name]
    started = time.monotonic()
    partial = target.with_name(target.name + ".partial")
    if wrapper is None:
        # `go install pkg@version` builds the module with its own go.mod/go.sum; GOBIN puts it in a scratch dir.
        with tempfile.TemporaryDirectory(dir=target.parent) as gobin:
            tags = ["-tags", _TAGS[name]] if name in _TAGS else []
            result = subprocess.run(["go", "install", "-trimpath", *tags, "-ldflags", ldflags, package],
                                    env={**_go_env(), "GOBIN": gobin}, text=True, capture_output=True)
            if result.returncode != 0:
                raise RuntimeError(f"building {name} failed:\n{result.stderr[-4000:]}")
            # `go install` names the binary after the package's last element (ray-operator for KubeRay).
            installed = package.split("@")[0].rsplit("/", 1)[-1]
            shutil.move(Path(gobin) / installed, partial)
    else:
        _go("build", "-trimpath", "-ldflags", ldflags, "-o", str(partial), package, cwd=GOMOD / wrapper)
    partial.rename(target)  # atomic: a killed build never leaves a binary that looks finished
    print(f"built {target.name} in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)


def build_all() -> dict[str, Path]:
    return {name: build(name) for name in versions.BINARIES}


def missing() -> list[str]:
    return [name for name, version in versions.BINARIES.items() if not versions.binary_path(name, version).exists()]


def write_wrappers() -> None:
    """Generate the wrapper modules from the pinned modules' own go.mod (the staging list is never typed)."""
    kubernetes_mod = (module_dir("kubernetes") / "go.mod").read_text()
    staging = sorted(set(re.findall(r"^\s*(k8s\.io/[\w./-]+) => \./staging/", kubernetes_mod, re.MULTILINE)))
    replaces = "\n".join(f"\t{module} => {module} {versions.KUBERNETES_STAGING}" for module in staging)
    _write_wrapper("kubernetes", f"require k8s.io/kubernetes {versions.KUBERNETES}\n\nreplace (\n{replaces}\n)\n",
                   [f"k8s.io/kubernetes/cmd/kube-apiserver@{versions.KUBERNETES}",
                    f"k8s.io/kubernetes/cmd/kube-controller-manager@{versions.KUBERNETES}",
                    f"k8s.io/kubernetes/cmd/kube-scheduler@{versions.KUBERNETES}"])
    _write_wrapper("etcd", "", [f"go.etcd.io/etcd/server/v3@{versions.ETCD}"])


def _write_wrapper(folder: str, body: str, tools: list[str]) -> None:
    directory = GOMOD / folder
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "go.sum").unlink(missing_ok=True)
    (directory / "go.mod").write_text(
        f"// Generated by `python -m testbed wrappers`: builds pinned upstream binaries, holds no code.\n"
        f"module tpu-fallback/controlplane/{folder}\n\ngo {WRAPPER_GO}\n\n{body}")
    for tool in tools:
        _go("get", "-tool", tool, cwd=directory)
