"""Deploy and destroy a recorded plan's Kubernetes objects on the tier the way `pulumi up` / `pulumi destroy` do.

Order: the program's own dependency graph (every recorded resource, so an edge through a GCP resource counts),
ties broken by name. Creation awaits what pulumi-kubernetes awaits (`pulumi.com/waitFor`); deletion runs in the
reverse order with the object's `pulumi.com/deletionPropagationPolicy` (foreground when absent) and waits for
the object to be gone, as pulumi-kubernetes does (provider/pkg/await/await.go: up to 300 s per object).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import yaml

from infra import kueue as stack_kueue
from infra.offline import Plan, Recorded
from testbed.kube import Kube, condition, wait_for

HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
WAIT_FOR = "pulumi.com/waitFor"
DELETION_POLICY = "pulumi.com/deletionPropagationPolicy"
PULUMI_DELETE_TIMEOUT = 300.0


@dataclass(frozen=True)
class Step:
    """One Kubernetes resource of the plan; `manifest` is None for the Helm release (the tier runs Kueue)."""

    resource: Recorded
    manifest: dict | None

    @property
    def label(self) -> str:
        if self.manifest is None:
            return f"Release {self.resource.inputs.get('name')}"
        meta = self.manifest["metadata"]
        where = f"{meta['namespace']}/" if meta.get("namespace") else ""
        return f"{self.manifest['kind']} {where}{meta['name']}"

    def ref(self) -> tuple[str, str, str, str | None]:
        meta = self.manifest["metadata"]
        return self.manifest["apiVersion"], self.manifest["kind"], meta["name"], meta.get("namespace")


def release_values(plan: Plan, pods_ready_seconds: int | None = None) -> dict:
    """The values the stack's Kueue release passes to the chart: the tier renders the chart with exactly these,
    except, where `pods_ready_seconds` is given, Kueue's waitForPodsReady timeouts: the tier's clock.

    On GKE a RayJob's start after admission takes minutes (a slice's creation, the Ray image's pull, Ray's start,
    the submitter's `ray job submit`), so the stack accepts no `fallback.podsReadyTimeout` under
    settings.MIN_PODS_READY_TIMEOUT_SECONDS; on the tier a slice appears and a pod runs within seconds, so a
    scenario that must see Kueue's timeout fire compresses it by as much. It is the only value of a release the
    tier changes; tests/test_kueue.py proves that stack config sets it in the real release.
    (A fleet's manager also installs KubeRay's chart; the tier's planes all have KubeRay's CRDs.)"""
    kueue = [r for r in plan.of_type(HELM_RELEASE) if r.inputs.get("name") == stack_kueue.RELEASE_NAME]
    if len(kueue) != 1:
        raise KeyError(f"{len(kueue)} Kueue releases in the plan")
    values = kueue[0].inputs.get("values") or {}
    if pods_ready_seconds is None:
        return values
    return with_pods_ready_timeout(values, pods_ready_seconds)


def release_configuration(values: dict) -> dict:
    """The Kueue Configuration a release's values carry (`managerConfig.controllerManagerConfigYaml`), {} if none."""
    text = (values.get("managerConfig") or {}).get(stack_kueue.VALUES_CONFIG_KEY)
    return yaml.safe_load(text) if text else {}


def with_pods_ready_timeout(values: dict, seconds: int) -> dict:
    """A copy of a Kueue release's values whose waitForPodsReady timeout and recovery timeout are `seconds`
    (the stack sets both to `fallback.podsReadyTimeout`: infra/kueue.py wait_for_pods_ready)."""
    values = copy.deepcopy(values)
    config = release_configuration(values)
    wait = config["waitForPodsReady"]
    wait["timeout"] = wait["recoveryTimeout"] = f"{seconds}s"
    values["managerConfig"][stack_kueue.VALUES_CONFIG_KEY] = yaml.safe_dump(config, sort_keys=False)
    return values


def _edges(resource: Recorded) -> set[str]:
    return {*resource.dependencies, *(u for us in resource.property_dependencies.values() for u in us)}


def creation_order(plan: Plan) -> list[Step]:
    """The plan's Kubernetes resources in an order `pulumi up` could create them in."""
    index = plan.by_urn()
    pending = {urn: {d for d in _edges(r) if d in index} for urn, r in index.items()}
    ordered: list[Recorded] = []
    while pending:
        ready = sorted((urn for urn, deps in pending.items() if not deps), key=lambda u: (index[u].type, u))
        if not ready:
            raise ValueError(f"dependency cycle among {sorted(pending)}")
        for urn in ready:
            ordered.append(index[urn])
            del pending[urn]
        for deps in pending.values():
            deps.difference_update(ready)
    steps = []
    for resource in ordered:
        if resource.type == HELM_RELEASE:
            steps.append(Step(resource, None))
        elif resource.type.startswith("kubernetes:") and resource.custom and "apiVersion" in resource.outputs:
            body = copy.deepcopy({k: v for k, v in resource.outputs.items() if k not in ("id", "urn", "status")})
            steps.append(Step(resource, body))
    return steps


@dataclass
class Deployed:
    steps: list[Step]


Route = Callable[[Step], Kube]  # the cluster a step goes to (a fleet's plan spans several, by provider)


def deploy(kube: Kube, plan: Plan, wait_timeout: float = 60.0,
           after_create: Callable[[Step], None] | None = None, route: Route | None = None,
           edit: Callable[[Step], dict] | None = None) -> Deployed:
    """Create each object in order; `after_create` runs after each (the tests wait there for Kueue's
    decision on a RayJob, so jobs are judged in submission order). `route` picks each step's cluster (default
    `kube`); `edit` gives the manifest to create instead of the plan's (a secret the plan only marks)."""
    steps = creation_order(plan)
    deployed = Deployed(steps)
    for step in steps:
        if step.manifest is None:
            continue  # the tier already runs Kueue with what this release renders
        target = route(step) if route else kube
        target.create(edit(step) if edit else step.manifest)
        awaited = (step.manifest["metadata"].get("annotations") or {}).get(WAIT_FOR)
        if awaited:
            kind, _, wanted = awaited.partition("=")
            assert kind == "condition", f"{step.label}: unsupported {WAIT_FOR} {awaited!r}"
            wait_for(lambda s=step, c=wanted: condition(target.get(*s.ref()), c) == "True", wait_timeout,
                     f"{step.label} {awaited}")
        if after_create is not None:
            after_create(step)
    return deployed


def deletion_policy(manifest: dict) -> str:
    """pulumi-kubernetes' propagation: the annotation's value, foreground by default."""
    value = (manifest["metadata"].get("annotations") or {}).get(DELETION_POLICY, "foreground")
    return value.capitalize()


@dataclass
class Destroyed:
    seconds: dict[str, float] = field(default_factory=dict)
    stuck: dict[str, dict] = field(default_factory=dict)  # label -> what was left (finalizers, deletionTimestamp)


def destroy(kube: Kube, steps: list[Step], timeout: float = 60.0,
            uninstall_release: Callable[[], None] | None = None, route: Route | None = None) -> Destroyed:
    """Delete in reverse creation order, each awaited until gone (or recorded as stuck after `timeout`).

    The release's turn calls `uninstall_release` (ControlPlane.uninstall_kueue); without it the tier keeps
    Kueue running for the next stack."""
    result = Destroyed()
    for step in reversed(steps):
        if step.manifest is None:
            if uninstall_release is not None:
                started = time.monotonic()
                uninstall_release()
                result.seconds[step.label] = round(time.monotonic() - started, 2)
            continue
        started = time.monotonic()
        target = route(step) if route else kube
        target.delete(*step.ref(), propagation=deletion_policy(step.manifest))
        try:
            wait_for(lambda s=step: target.get(*s.ref()) is None, timeout, f"{step.label} gone", interval=0.05)
        except TimeoutError:
            left = target.get(*step.ref()) or {}
            result.stuck[step.label] = {"finalizers": left.get("metadata", {}).get("finalizers"),
                                        "deletionTimestamp": left.get("metadata", {}).get("deletionTimestamp")}
        result.seconds[step.label] = round(time.monotonic() - started, 2)
    return result
