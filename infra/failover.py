"""The failover controller on the cluster: moves a job down the queue chain when its rung's TPUs never come.

Its code is the `failover/` package, shipped in a ConfigMap named after its content (a change rolls the
Deployment), run by a pinned Python image that installs the pins of failover/requirements.txt at start (from PyPI
or an index mirror), or by a prebuilt image that has them (failover/Dockerfile; `failoverController` config).
"""

from __future__ import annotations

import datetime
import hashlib
import json
from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s

from failover.api import TPU_RESOURCE, Chain, Rung
from failover.api.names import CONTROLLER_NAME as NAME, CONTROLLER_NAMESPACE as NAMESPACE
from failover.api.probes import Probes, ProbeShape
from failover.config import RegionalConfig
from failover.maintenance import Policy
from infra.kueue import NODE_POOL_LABEL, Kueue, plan_flavor, rungs_with_admission_check, tolerate_no_schedule
from infra.tpu import ACCELERATOR_LABEL_KEY, TOPOLOGY_LABEL_KEY
from infra.rungs import RESERVATION
from infra.settings import PlatformSettings

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "failover"
# What the token renewer alone needs (a scrape token's, infra/monitoring.py): shipped where the package is not.
RENEWER_FILES = ("__init__.py", "config.py", "credentials.py", "runtime/__init__.py", "runtime/cluster_client.py",
                 "requirements.txt")
# The programs of the package (`python -m <module>`, failover/__init__.py): each Deployment runs one of them.
REGIONAL_MODULE, WATCH_MODULE, LADDER_MODULE, RENEWER_MODULE = (
    "failover.regional", "failover.watch", "failover.ladder", "failover.credentials")
# The image's Python is the one the tests run the controller with (3.11); a patch release, pinned.
PYTHON_IMAGE = "python:3.11.14-slim"
# The capacity probes' image (failover/api/probes.py): they only have to be placed, so they run Kubernetes' pause
# container, pinned. Ref: https://github.com/kubernetes/kubernetes/blob/master/build/pause/CHANGELOG.md
PROBE_IMAGE = "registry.k8s.io/pause:3.10"
CODE_MOUNT = "/opt/failover"
DEPS_DIR = "/tmp/deps"  # pip installs here at start: the root filesystem stays untouched, the user unprivileged
HEALTH_PORT = 8080
METRICS_PORT = 9090  # Prometheus /metrics, plain HTTP inside the cluster (infra/monitoring.py scrapes it)
METRICS_PORT_NAME = "metrics"  # the container port's name, which the PodMonitorings select
# The controller reacts to watch events; the resync only re-queues every Workload, a safety net.
RESYNC_SECONDS = 300
WORKERS = 4  # Workloads reconciled at once (a move waits up to 10 s for Kueue)

# Least privilege: watch Workloads, RayJobs, events, pods and nodes; write only what a move or a loss changes, and a
# checkpoint request on a job's pods.
RBAC_RULES = (
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["get", "list", "watch", "patch"]},
    # the rungs' free quota, where a move ahead of a maintenance may go (failover/maintenance.py)
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["clusterqueues"], "verbs": ["list", "watch"]},
    {"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]},
    # patch: the checkpoint request on a running job's TPU worker pods (failover/checkpoints.py)
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["list", "watch", "create"]},
)
# In its own namespace only: the capacity probes (failover/api/probes.py), created and deleted.
NAMESPACE_RBAC_RULES = (
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete"]},
)


def package_files() -> tuple[str, ...]:
    """Every module of the failover package (its subpackages included) and its pins, as paths inside it."""
    modules = sorted(str(path.relative_to(PACKAGE_DIR)) for path in PACKAGE_DIR.rglob("*.py")
                     if "__pycache__" not in path.parts)
    return (*modules, "requirements.txt")


def configmap_key(path: str) -> str:
    """A ConfigMap's keys hold no '/' (`[-._a-zA-Z0-9]+`): a module's path with '.' for it (ladder/decisions.py ->
    ladder.decisions.py); the volume's items put each key back at its path."""
    return path.replace("/", ".")


def package_sources(files: tuple[str, ...] | None = None) -> dict[str, str]:
    """The ConfigMap's data: each file's text under its key."""
    return {configmap_key(name): (PACKAGE_DIR / name).read_text() for name in files or package_files()}


def code_volume(configmap: str, files: tuple[str, ...] | None = None) -> dict:
    """The code ConfigMap as a volume, each key at its path in the package (subpackages are folders)."""
    return {"name": "code", "configMap": {"name": configmap, "items": [
        {"key": configmap_key(name), "path": name} for name in files or package_files()]}}


def code_configmap_name(sources: dict[str, str], prefix: str = NAME) -> str:
    digest = hashlib.sha256(json.dumps(sources, sort_keys=True).encode()).hexdigest()[:10]
    return f"{prefix}-code-{digest}"


def controller_chain(kueue: Kueue, settings: PlatformSettings) -> Chain:
    """The chain as the controller reads it (FAILOVER_CHAIN): the stack's queueChain plus which rungs have a check
    and how long a job that lost its slice on each waits for it (fallback.sliceRecoveryWait)."""
    checked = rungs_with_admission_check(settings)
    key_of = {plan.flavor: plan.config_key for plan in settings.plans}
    return Chain(tuple(Rung(rung.flavor, rung.cluster_queue, rung.local_queue, rung.flavor in checked,
                            settings.fallback.recovery_seconds(key_of[rung.flavor]))
                       for rung in kueue.queue_chain))


def regional_config(kueue: Kueue, settings: PlatformSettings) -> RegionalConfig:
    """What the controller runs with (failover/config.py): the stack's settings and this module's constants."""
    maintenance = settings.fallback.maintenance
    return RegionalConfig(controller_chain(kueue, settings),
                          datetime.timedelta(seconds=settings.fallback.stockout_grace_period_seconds),
                          datetime.timedelta(seconds=RESYNC_SECONDS), WORKERS, HEALTH_PORT, METRICS_PORT,
                          Policy(maintenance.action, datetime.timedelta(seconds=maintenance.lead_seconds),
                                 datetime.timedelta(seconds=maintenance.save_timeout_seconds)),
                          climb_back=settings.fallback.climb_back, probes=probes(kueue, settings))


def probes(kueue: Kueue, settings: PlatformSettings) -> Probes:
    """fallback.climbBack.probe as the controller reads it: a probe shape for each rung a waiting job may climb to
    whose capacity only a try shows (no admission check, not a reservation, not the last rung), shaped as the job's
    TPU workers are there: the slice's accelerator and topology (workloads/rayjob.py), the rung's ResourceFlavor
    labels and tolerations (which Kueue adds to an admitted job's pods), one host's chips. None with probing off."""
    if not settings.fallback.probe:
        return Probes(NAMESPACE, PROBE_IMAGE)
    checked = rungs_with_admission_check(settings)
    by_flavor = {plan.flavor: plan for plan in settings.plans}
    shapes = []
    for rung in kueue.queue_chain[:-1]:
        plan = by_flavor[rung.flavor]
        if rung.flavor in checked or plan.config_key == RESERVATION.key:
            continue
        flavor = plan_flavor(plan)["spec"]
        shapes.append(ProbeShape(
            plan.flavor, {ACCELERATOR_LABEL_KEY: settings.tpu.accelerator_label,
                          TOPOLOGY_LABEL_KEY: settings.tpu.topology, **flavor["nodeLabels"]},
            (tolerate_no_schedule(TPU_RESOURCE), *flavor.get("tolerations", ())), settings.tpu.chips_per_host))
    return Probes(NAMESPACE, PROBE_IMAGE, tuple(shapes))


def start_command(settings: PlatformSettings, module: str = REGIONAL_MODULE) -> tuple[str, list[dict]]:
    """The container's shell command and the environment it needs: install the pins first (PyPI or the
    configured index), or nothing with a prebuilt image."""
    runtime = settings.failover_controller
    if runtime.image:
        return f"exec python -m {module}", []
    install = (f"pip install --quiet --no-cache-dir --target {DEPS_DIR} -r {CODE_MOUNT}/requirements.txt "
               f"&& exec python -m {module}")
    env = [{"name": "PYTHONPATH", "value": DEPS_DIR}]
    if runtime.pip_index_url:
        env.append({"name": "PIP_INDEX_URL", "value": runtime.pip_index_url})  # pip reads it; no PyPI
    return install, env


def deployment(settings: PlatformSettings, config: RegionalConfig, configmap: str) -> dict:
    return controller_deployment(settings, NAME, REGIONAL_MODULE, configmap, env=config.to_env(),
                                 **served(config.health_port, config.metrics_port))


def served(health_port: int, metrics_port: int) -> dict:
    """A controller's ports and liveness probe: every program serves /healthz and /metrics (failover/runtime/
    manager.py), the failover controller, the fleet watch and the fleet ladder alike."""
    return {"ports": [{"name": "health", "containerPort": health_port},
                      {"name": METRICS_PORT_NAME, "containerPort": metrics_port}],
            "probe": {"httpGet": {"path": "/healthz", "port": "health"}}}


def controller_deployment(settings: PlatformSettings, name: str, module: str, configmap: str, env: list[dict],
                          ports: list[dict] | None = None, probe: dict | None = None,
                          namespace: str = NAMESPACE, files: tuple[str, ...] | None = None) -> dict:
    """A Deployment running `python -m <module>` from the code ConfigMap, as the ServiceAccount `name`: the
    failover controller, a fleet's watch and renewer (infra/fleet.py), a scrape token's renewer
    (infra/monitoring.py)."""
    run, runtime_env = start_command(settings, module)
    container: dict = {
        "name": "controller",
        "image": settings.failover_controller.image or PYTHON_IMAGE,
        "command": ["sh", "-c", run],
        "workingDir": str(Path(CODE_MOUNT).parent),
        "env": [*runtime_env, {"name": "HOME", "value": "/tmp"}, *env],
    }
    if ports:
        container["ports"] = ports
    if probe:
        # /healthz answers once pip is done and the watches have listed: a minute's start.
        container["livenessProbe"] = {**probe, "initialDelaySeconds": 60, "periodSeconds": 20, "failureThreshold": 3}
    container.update({
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "code", "mountPath": CODE_MOUNT, "readOnly": True}],
    })
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {
            "replicas": 1,  # its writes are idempotent, so a second replica during a rollout is harmless
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "serviceAccountName": name,
                    "nodeSelector": {NODE_POOL_LABEL: settings.system_pool.name},
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532},
                    "containers": [container],
                    "volumes": [code_volume(configmap, files)],
                },
            },
        },
    }


class FailoverController(pulumi.ComponentResource):
    """Namespace, ServiceAccount, ClusterRole and binding, the probes' Role and binding in its namespace, the code's
    ConfigMap and the Deployment."""

    def __init__(self, name: str, settings: PlatformSettings, kueue: Kueue, provider: k8s.Provider,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpu-fallback:infra:FailoverController", name, None, opts)
        on_cluster = pulumi.ResourceOptions(parent=self, provider=provider)
        namespace = k8s.core.v1.Namespace(f"{name}-namespace", metadata={"name": NAMESPACE}, opts=on_cluster)
        self.namespace = namespace  # what others put objects in wait for (a team's status Role: infra/teams.py)
        in_namespace = pulumi.ResourceOptions.merge(on_cluster, pulumi.ResourceOptions(depends_on=[namespace]))
        account = k8s.core.v1.ServiceAccount(f"{name}-account", metadata={"name": NAME, "namespace": NAMESPACE},
                                             opts=in_namespace)
        role = k8s.rbac.v1.ClusterRole(f"{name}-role", metadata={"name": f"tpu-fallback-{NAME}"},
                                       rules=[dict(rule) for rule in RBAC_RULES], opts=on_cluster)
        binding = k8s.rbac.v1.ClusterRoleBinding(
            f"{name}-binding", metadata={"name": f"tpu-fallback-{NAME}"},
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                      "name": f"tpu-fallback-{NAME}"},
            subjects=[{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}],
            opts=pulumi.ResourceOptions.merge(on_cluster, pulumi.ResourceOptions(depends_on=[role, account])))
        # The capacity probes' pods, in its own namespace only (NAMESPACE_RBAC_RULES).
        local_role = k8s.rbac.v1.Role(
            f"{name}-probes-role", metadata={"name": f"{NAME}-probes", "namespace": NAMESPACE},
            rules=[dict(rule) for rule in NAMESPACE_RBAC_RULES], opts=in_namespace)
        local_binding = k8s.rbac.v1.RoleBinding(
            f"{name}-probes-binding", metadata={"name": f"{NAME}-probes", "namespace": NAMESPACE},
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{NAME}-probes"},
            subjects=[{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}],
            opts=pulumi.ResourceOptions.merge(in_namespace, pulumi.ResourceOptions(depends_on=[local_role, account])))
        sources = package_sources()
        self.configmap_name = code_configmap_name(sources)
        code = k8s.core.v1.ConfigMap(f"{name}-code", metadata={"name": self.configmap_name, "namespace": NAMESPACE},
                                     data=sources, opts=in_namespace)
        manifest = deployment(settings, regional_config(kueue, settings), self.configmap_name)
        # After Kueue: the Workload API must exist before the controller lists it.
        self.deployment = k8s.apps.v1.Deployment(
            f"{name}-deployment", metadata=manifest["metadata"], spec=manifest["spec"],
            opts=pulumi.ResourceOptions.merge(on_cluster, pulumi.ResourceOptions(
                depends_on=[code, binding, local_binding, kueue.release])))
        self.register_outputs({"namespace": NAMESPACE, "deployment": NAME})
