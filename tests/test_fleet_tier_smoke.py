"""The fleet harness on real control planes (tests/controlplane/fleet_tier.py): a MultiKueue manager and one member,
each its own kube-apiserver 1.36 and Kueue 0.19.2.

What the fleet scenarios build on: the manager's Kueue runs the `multiKueue` and `integrations` its release
values give; the member's kube-controller-manager fills a ServiceAccount token Secret; Kueue accepts the inline
kubeconfig made from it (MultiKueueCluster Active) and refuses the kinds it must refuse (a tokenFile, an exec plugin
such as GKE's gke-gcloud-auth-plugin, a CA by file path); and freeze/thaw partition a member's API server.
"""

from __future__ import annotations

import copy
import ssl
import urllib.error
import urllib.request

import pytest
import yaml

from infra import kueue as stack_kueue
from tests.conftest import plan_for
from tests.controlplane.fleet_tier import FleetTier, loaded_configuration, release_configuration
from tests.controlplane.kube import condition, wait_for
from tests.controlplane.processes import http_ok
from tests.controlplane.stack import release_values

pytestmark = pytest.mark.controlplane

KV = stack_kueue.KUEUE_API_VERSION
KUEUE_NS = stack_kueue.NAMESPACE
MEMBER = "member"
SA = "multikueue-manager"
TOKEN_SECRET = f"{SA}-token"
MULTIKUEUE = {"gcInterval": "30s", "workerLostTimeout": "20s"}
REACTION_TIMEOUT = 60  # generous: the suite runs several tier files at a time on two cores


def manager_values() -> dict:
    """A fleet manager's release values, shaped as infra/kueue.py shapes a region's: the chart's default
    configuration with RayJob as the only framework, no waitForPodsReady, and a `multiKueue` section."""
    config = copy.deepcopy(stack_kueue.MANAGER_CONFIG_BASE)
    config["integrations"] = {"frameworks": ["ray.io/rayjob"]}
    config["multiKueue"] = dict(MULTIKUEUE)
    return {"controllerManager": {"featureGates": [dict(gate) for gate in stack_kueue.FEATURE_GATES]},
            "managerConfig": {"controllerManagerConfigYaml": yaml.safe_dump(config, sort_keys=False)}}


def member_access() -> list[dict]:
    """What a member grants the manager (the verbs Kueue's e2e setup grants for RayJobs), and its token Secret."""
    rw = ["create", "update", "patch", "delete", "get", "list", "watch"]
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUEUE_NS}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SA, "namespace": KUEUE_NS}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": SA}, "rules": [
            {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": rw},
            {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads/status"], "verbs": ["get", "patch", "update"]},
            {"apiGroups": ["kueue.x-k8s.io"], "resources": ["clusterqueues", "localqueues"],
             "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": rw},
            {"apiGroups": ["ray.io"], "resources": ["rayjobs/status"], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": SA},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": SA},
         "subjects": [{"kind": "ServiceAccount", "name": SA, "namespace": KUEUE_NS}]},
        {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
         "metadata": {"name": TOKEN_SECRET, "namespace": KUEUE_NS,
                      "annotations": {"kubernetes.io/service-account.name": SA}}},
    ]


def multikueue_cluster(name: str, secret: str) -> dict:
    return {"apiVersion": KV, "kind": "MultiKueueCluster", "metadata": {"name": name},
            "spec": {"clusterSource": {"kubeConfig": {"locationType": "Secret", "location": secret}}}}


def active(fleet: FleetTier, cluster: str) -> dict | None:
    """The MultiKueueCluster's Active condition once Kueue has written one."""
    found = fleet.manager.kube.get(KV, "MultiKueueCluster", cluster) or {}
    return next((c for c in (found.get("status") or {}).get("conditions") or [] if c["type"] == "Active"), None)


@pytest.fixture(scope="module")
def fleet(request):
    tier = FleetTier(manager_values(), {MEMBER: release_values(plan_for("dev"))}).start()
    print(f"fleet start: {tier.timings()}")
    try:
        for manifest in member_access():
            tier.members[MEMBER].kube.create(manifest)
        tier.manager.kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUEUE_NS}})
        yield tier
    finally:
        failed = request.session.testsfailed > 0
        tier.stop(keep_workdir=failed)
        if failed:
            print(f"\nfleet tier logs kept in {tier.workdir}")


def test_the_manager_runs_the_multikueue_section_its_release_values_give(fleet):
    assert fleet.manager_configuration_passed()
    assert fleet.manager.kueue_config["multiKueue"] == MULTIKUEUE
    assert fleet.manager.kueue_config["integrations"] == {"frameworks": ["ray.io/rayjob"]}
    assert release_configuration(fleet.member_values[MEMBER])["integrations"] != \
        fleet.manager.kueue_config["integrations"]
    # What Kueue itself loaded (after its defaulting), not only the file the tier wrote.
    loaded = loaded_configuration(fleet.manager)
    assert {key: loaded["multiKueue"][key] for key in MULTIKUEUE} == MULTIKUEUE
    assert loaded["multiKueue"]["dispatcherName"] == "kueue.x-k8s.io/multikueue-dispatcher-all-at-once"
    assert loaded["integrations"]["frameworks"] == ["ray.io/rayjob"]
    assert all(plane.kueue.alive() for plane in fleet.planes.values())


def test_a_service_account_token_kubeconfig_connects_the_manager(fleet):
    text = fleet.install_kubeconfig(MEMBER, f"{MEMBER}-kubeconfig", (KUEUE_NS, TOKEN_SECRET))
    config = yaml.safe_load(text)
    (cluster,) = config["clusters"]
    assert cluster["cluster"]["server"] == fleet.members[MEMBER].server
    assert cluster["cluster"]["server"].startswith("https://127.0.0.1:")  # the serving cert's IP SAN
    assert set(cluster["cluster"]) == {"server", "certificate-authority-data"}
    assert set(config["users"][0]["user"]) == {"token"}
    fleet.manager.kube.create(multikueue_cluster(MEMBER, f"{MEMBER}-kubeconfig"))
    condition_seen = wait_for(lambda: active(fleet, MEMBER), REACTION_TIMEOUT, "an Active condition")
    assert (condition_seen["status"], condition_seen["message"]) == ("True", "Connected"), condition_seen


@pytest.mark.parametrize(("broken", "message"), [
    ("tokenFile", "tokenFile is not allowed"),
    ("exec", "exec plugins are not allowed"),
    ("caFile", "certificate-authority file paths are not allowed"),
])
def test_kueue_refuses_kubeconfigs_that_read_files_or_run_plugins(fleet, broken, message):
    config = yaml.safe_load(fleet.connect(MEMBER, (KUEUE_NS, TOKEN_SECRET)))
    user, cluster = config["users"][0]["user"], config["clusters"][0]["cluster"]
    if broken == "tokenFile":
        user.clear()
        user["tokenFile"] = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    elif broken == "exec":  # what `gcloud container clusters get-credentials` writes
        user.clear()
        user["exec"] = {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "gke-gcloud-auth-plugin",
                        "interactiveMode": "Never"}
    else:
        del cluster["certificate-authority-data"]
        cluster["certificate-authority"] = str(fleet.members[MEMBER].ca.cert)
    name = f"broken-{broken.lower()}"
    fleet.manager.kube.create({"apiVersion": "v1", "kind": "Secret",
                               "metadata": {"name": name, "namespace": KUEUE_NS},
                               "stringData": {"kubeconfig": yaml.safe_dump(config)}})
    fleet.manager.kube.create(multikueue_cluster(name, name))
    seen = wait_for(lambda: active(fleet, name), REACTION_TIMEOUT, f"an Active condition on {name}")
    assert (seen["status"], seen["reason"]) == ("False", "InsecureKubeConfig"), seen
    assert message in seen["message"], seen


def test_freeze_hangs_a_members_api_server_and_thaw_brings_it_back(fleet):
    plane = fleet.members[MEMBER]
    context = ssl.create_default_context(cafile=str(plane.ca.cert))
    assert http_ok(f"{plane.server}/readyz", context)
    plane.freeze()
    try:
        # The kernel still accepts the connection; the TLS handshake never ends (urllib wraps the timeout).
        with pytest.raises(urllib.error.URLError, match="timed out"):
            urllib.request.urlopen(f"{plane.server}/readyz", timeout=1, context=context)
    finally:
        plane.thaw()
    assert wait_for(lambda: http_ok(f"{plane.server}/readyz", context), 10, "/readyz after the thaw")
    assert not plane.frozen
