"""The failover controller's objects in the plan: least-privilege RBAC, the code it runs, its pins and config."""

from __future__ import annotations

import importlib.metadata
import json

from infra import failover
from tests.conftest import plan_for

DEPLOYMENT = "kubernetes:apps/v1:Deployment"
CONTROLLER = "failover-deployment"  # the controller's (monitoring adds the scrape token's renewer)


def _container(plan) -> dict:
    (container,) = plan.named(CONTROLLER).inputs["spec"]["template"]["spec"]["containers"]
    return container


def _env(plan) -> dict[str, str]:
    return {item["name"]: item["value"] for item in _container(plan)["env"]}


def test_dev_deploys_the_controller_on_the_cpu_pool_with_its_own_account():
    plan = plan_for()
    spec = plan.named(CONTROLLER).inputs["spec"]["template"]["spec"]
    assert plan.named(CONTROLLER).inputs["metadata"]["namespace"] == failover.NAMESPACE
    assert spec["nodeSelector"] == {"cloud.google.com/gke-nodepool": "default-pool"}
    assert spec["serviceAccountName"] == failover.NAME
    assert spec["securityContext"]["runAsNonRoot"] is True
    account = plan.named("failover-account").inputs["metadata"]
    assert (account["name"], account["namespace"]) == (failover.NAME, failover.NAMESPACE)


def test_rbac_is_exactly_what_a_move_needs():
    plan = plan_for()
    role = plan.named("failover-role").inputs  # infra/monitoring.py declares a ClusterRole too
    # Watches instead of lists every pass: watch on what it follows (the Ray workers' pods and the nodes: a lost
    # slice); create only Events; patch only what a move or a loss changes, and the TPU pods' checkpoint request
    # (failover/checkpoints.py); read the rungs' free quota (a move ahead of a maintenance). Nothing cluster-wide beyond
    # that (no delete, no update, no exec, no secrets).
    assert role["rules"] == [
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["clusterqueues"], "verbs": ["list", "watch"]},
        {"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["list", "watch", "create"]},
    ]
    binding = plan.named("failover-binding").inputs
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": failover.NAME,
                                    "namespace": failover.NAMESPACE}]


def test_the_controller_runs_the_repositorys_failover_package_at_the_pinned_versions():
    plan = plan_for()
    code = plan.named("failover-code").inputs
    shipped = failover.package_files()
    on_disk = {str(p.relative_to(failover.PACKAGE_DIR)) for p in failover.PACKAGE_DIR.rglob("*.py")
               if "__pycache__" not in p.parts}
    assert set(shipped) == on_disk | {"requirements.txt"}  # every module, subpackages included
    assert {"regional/__main__.py", "ladder/__main__.py", "watch/__main__.py", "runtime/writes.py"} <= set(shipped)
    assert code["data"] == {name.replace("/", "."): (failover.PACKAGE_DIR / name).read_text() for name in shipped}
    (volume,) = plan.named(CONTROLLER).inputs["spec"]["template"]["spec"]["volumes"]
    # Each key back at its path: the package's folders exist in the Pod as in the repository.
    assert volume == {"name": "code", "configMap": {"name": code["metadata"]["name"], "items": [
        {"key": name.replace("/", "."), "path": name} for name in shipped]}}
    container = _container(plan)
    assert container["image"] == failover.PYTHON_IMAGE and ":" in container["image"]
    assert "latest" not in container["image"]
    assert "-r /opt/failover/requirements.txt" in container["command"][-1]
    assert container["command"][-1].endswith("exec python -m failover.regional")


def test_a_changed_controller_gets_a_new_configmap_so_the_deployment_rolls():
    sources = failover.package_sources()
    changed = {**sources, "regional.decisions.py": sources["regional.decisions.py"] + "\n# changed\n"}
    assert failover.code_configmap_name(sources) != failover.code_configmap_name(changed)


def test_pins_are_exact_and_what_the_tests_run_with():
    for line in (failover.PACKAGE_DIR / "requirements.txt").read_text().splitlines():
        requirement = line.split("#", 1)[0].strip()
        if requirement:
            name, _, version = requirement.partition("==")
            assert version, f"{requirement} is not pinned"
            assert importlib.metadata.version(name) == version


def test_the_controller_gets_the_chain_and_the_grace_period_from_the_stack():
    plan = plan_for("dev", {"fallback": {"podsReadyTimeout": "10m", "stockoutGracePeriod": "90s",
                                         "sliceRecoveryWait": {"flexStart": "45s"}}})
    env = _env(plan)
    chain = json.loads(env["FAILOVER_CHAIN"])
    assert [{k: v for k, v in rung.items() if k not in ("admissionCheck", "recoverySeconds")}
            for rung in chain] == plan.outputs["queueChain"]
    assert [rung["admissionCheck"] for rung in chain] == [False, True]
    # Each rung's lost-slice wait: on-demand the default's (10m), flex-start its own.
    assert [rung["recoverySeconds"] for rung in chain] == [600, 45]
    assert env["FAILOVER_GRACE_SECONDS"] == "90"
    probe = _container(plan)["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz" and str(failover.HEALTH_PORT) == env["FAILOVER_HEALTH_PORT"]


def test_the_controller_waits_for_kueue_its_code_and_its_rights():
    plan = plan_for()
    deployment = plan.named(CONTROLLER)
    for name in ("kueue-release", "failover-code", "failover-binding"):
        assert plan.named(name).urn in deployment.dependencies, name


def test_a_single_rung_stack_has_no_controller():
    assert [d.name for d in plan_for("team-c-us-west4-a").of_type(DEPLOYMENT)] == ["monitoring-renewer"]


def test_metrics_are_served_on_a_named_port_the_stack_declares():
    container = _container(plan_for())
    assert {"name": "metrics", "containerPort": failover.METRICS_PORT} in container["ports"]
    assert _env(plan_for())["FAILOVER_METRICS_PORT"] == str(failover.METRICS_PORT)


def test_by_default_the_pins_come_from_pypi_at_start():
    container = _container(plan_for())
    assert container["image"] == failover.PYTHON_IMAGE
    assert "pip install" in container["command"][-1]
    assert "PIP_INDEX_URL" not in _env(plan_for())


def test_an_index_mirror_replaces_pypi():
    plan = plan_for("dev", {"failoverController": {"pipIndexUrl": "https://pypi.corp.example/simple"}})
    env = _env(plan)
    assert env["PIP_INDEX_URL"] == "https://pypi.corp.example/simple"
    assert env["PYTHONPATH"] == failover.DEPS_DIR
    assert "pip install" in _container(plan)["command"][-1]


def test_a_prebuilt_image_installs_nothing_at_start():
    image = "us-docker.pkg.dev/my-project/tools/tpu-fallback-failover:0.26.0-37.0.2"
    plan = plan_for("dev", {"failoverController": {"image": image}})
    container = _container(plan)
    assert container["image"] == image
    assert container["command"] == ["sh", "-c", "exec python -m failover.regional"]
    assert not {"PYTHONPATH", "PIP_INDEX_URL"} & set(_env(plan))
    # The code still comes from the stack, so the image need not change with it.
    (volume,) = plan.named(CONTROLLER).inputs["spec"]["template"]["spec"]["volumes"]
    assert volume["configMap"]["name"] == plan.named("failover-code").inputs["metadata"]["name"]


def test_the_dockerfile_builds_on_the_stacks_python_and_installs_the_pins():
    dockerfile = (failover.PACKAGE_DIR / "Dockerfile").read_text()
    assert f"ARG PYTHON_IMAGE={failover.PYTHON_IMAGE}\n" in dockerfile
    assert "COPY requirements.txt" in dockerfile and "pip install --no-cache-dir -r /tmp/requirements.txt" in dockerfile
    # The Deployment's user: the image must not need root.
    user = plan_for().named(CONTROLLER).inputs["spec"]["template"]["spec"]["securityContext"]
    assert f"USER {user['runAsUser']}:{user['runAsGroup']}" in dockerfile
