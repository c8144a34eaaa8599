"""Plan C: fleet members (infra/fleet_member.py) and the fleet stack (roles/fleet.py, infra/fleet.py), offline.

The fleet's StackReferences are answered by its members' own offline plans, secrets kept as secrets. The real
MultiKueue judges these objects in tests/test_fleet_controlplane.py.
"""

from __future__ import annotations

import copy
import json
import functools

import pytest
import yaml

from failover.credentials import inline_kubeconfig
from infra import failover as failover_objects
from infra import fleet as fleet_objects
from infra.fleet_member import (FLEET_LOCAL_QUEUE, FLEET_MEMBER_OUTPUT, FLEET_NAMESPACE, MANAGER_CLUSTER_ROLE,
                                STOCKOUT_READER_ROLE, manager_rules)
from infra.offline import SECRET_MARK, OfflineEngine, Plan, StackOutputs, referenced_stacks, render_tree
from infra.offline import main as offline_main
from infra.settings import MAX_PODS_READY_TIMEOUT_SECONDS, SettingsError
from testbed import upstream
from testbed import versions
from tests.conftest import FLEET_STACKS, REPO, config_with, namespaced, plan_for
from tests.k8s_schema import validation_errors
from workloads import rayjob, train

FLEET = "fleet"
MEMBERS = ("member-us-east5-a", "member-asia-northeast1-b")
MEMBER_STACKS = tuple(f"my-org/tpu-fallback/{member}" for member in MEMBERS)
RAYJOB = "kubernetes:ray.io/v1:RayJob"
SECRET = "kubernetes:core/v1:Secret"
K8S_PROVIDER = "pulumi:providers:kubernetes"


@functools.cache
def member_outputs(member: str) -> StackOutputs:
    """A member's outputs as a StackReference reads them: real (mock) values, secrets known by name."""
    plan = plan_for(member)
    return StackOutputs(plan.outputs, tuple(sorted(plan.secret_outputs)))


def references(**changed: StackOutputs) -> dict[str, StackOutputs]:
    answers = {stack: member_outputs(member) for stack, member in zip(MEMBER_STACKS, MEMBERS)}
    answers.update({f"my-org/tpu-fallback/{name.replace('_', '-')}": outputs for name, outputs in changed.items()})
    return answers


def fleet_plan(overrides: dict[str, object] | None = None, answers: dict[str, StackOutputs] | None = None,
               preview: bool = False, engine: OfflineEngine | None = None) -> Plan:
    engine = engine or OfflineEngine(FLEET, preview, answers or references())
    return engine.run(config_with(overrides or {}, FLEET))


@functools.cache
def cached_fleet_plan() -> Plan:
    return fleet_plan()


def fleet_setting(**fields: object) -> dict:
    raw = yaml.safe_load((REPO / "Pulumi.fleet.yaml").read_text())["config"][namespaced("fleet")]
    return {**raw, **fields}


def manifests(plan: Plan, kind: str) -> dict[str, dict]:
    return {m["metadata"]["name"]: m for m in plan.kubernetes_manifests() if m["kind"] == kind}


# ---- a member ------------------------------------------------------------------------------------------------


def test_a_member_declares_the_fleet_queue_and_the_managers_access():
    plan = plan_for(MEMBERS[0])
    queue = manifests(plan, "LocalQueue")[FLEET_LOCAL_QUEUE]
    assert queue["metadata"]["namespace"] == FLEET_NAMESPACE
    assert queue["spec"]["clusterQueue"] == "cluster-queue-dws"  # the DWS rung: admitted once provisioned
    assert manifests(plan, "Namespace")[FLEET_NAMESPACE]
    role = manifests(plan, "ClusterRole")[MANAGER_CLUSTER_ROLE]
    assert role["rules"] == manager_rules()
    verbs = {(rule["apiGroups"][0], resource): set(rule["verbs"]) for rule in role["rules"]
             for resource in rule["resources"]}
    # Exactly MultiKueue's needs in a worker (the note's list), Update included (it drops a copy's finalizer).
    assert verbs[("kueue.x-k8s.io", "workloads")] == verbs[("ray.io", "rayjobs")] == {
        "create", "delete", "get", "list", "patch", "update", "watch"}
    assert verbs[("ray.io", "rayjobs/status")] == {"get"}
    assert not any("*" in rule["verbs"] or "secrets" in rule["resources"] for rule in role["rules"])
    # No credential is made for the manager here: no ServiceAccount, no token Secret, no secret output but the
    # admin kubeconfig `pulumi up` uses (gke-gcloud-auth-plugin: no token in it).
    member = plan.only("tpu-fallback:infra:FleetMember")
    assert sorted(r.type.rsplit(":", 1)[-1] for r in plan.resources if r.parent == member.urn) == [
        "ClusterRole", "LocalQueue", "Namespace", "Role", "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding"]  # the Role: the ladder reads the Events here and asks the fleet's pods to
    # checkpoint (in the fleet's namespace only); the policy: no inactive copy of a job the ladder moves
    # (tests/test_fleet_ladder.py)
    assert manifests(plan, "Role")[STOCKOUT_READER_ROLE]["rules"] == [
        {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "patch"]}]
    assert not [m for m in plan.kubernetes_manifests() if m["kind"] == "ServiceAccount"
                and "multikueue" in m["metadata"]["name"]]
    assert set(plan.secret_outputs) == {"kubeconfig"}
    published = plan.outputs[FLEET_MEMBER_OUTPUT]
    assert published["capacity"] == {"cpu": 48 + 4 * 180, "memoryGi": 192 + 4 * 720, "tpuChips": 16, "slices": 1}
    assert published["managerClusterRole"] == MANAGER_CLUSTER_ROLE
    assert published["access"]["server"].startswith("https://") and published["access"]["certificateAuthorityData"]
    # The queue waits for its ClusterQueue.
    local = plan.named("fleet-member-localqueue")
    assert plan.named("kueue-clusterqueue-cluster-queue-dws").urn in local.dependencies


def test_the_members_kubeconfig_is_one_kueue_accepts():
    """Inline CA data and token; no exec plugin, token file or CA path (all refused by Kueue 0.19.2). Before the
    renewer's first token, no user at all."""
    config = yaml.safe_load(inline_kubeconfig("w1", "https://203.0.113.10", "Q0E=", "tok"))
    user = config["users"][0]["user"]
    assert user == {"token": "tok"}
    cluster = config["clusters"][0]["cluster"]
    assert cluster == {"server": "https://203.0.113.10", "certificate-authority-data": "Q0E="}
    assert yaml.safe_load(inline_kubeconfig("w1", "https://203.0.113.10", "Q0E=", None))["users"][0]["user"] == {}


@pytest.mark.parametrize("overrides, key", [
    ({"fleetMember": {"enabled": True, "startRung": "spot"}}, "fleetMember.startRung"),
    ({"fleetMember": {"enabled": True, "startRung": "nowhere"}}, "fleetMember.startRung"),
    ({"fleetMember": {"enabled": "yes"}}, "fleetMember.enabled"),
], ids=["rung-not-enabled", "unknown-rung", "not-a-boolean"])
def test_member_rules(overrides, key):
    with pytest.raises(SettingsError) as failure:
        plan_for(MEMBERS[0], overrides)
    assert f"tpu-fallback:{key}" in str(failure.value)


def test_a_platform_with_teams_is_not_a_member():
    with pytest.raises(SettingsError) as failure:
        plan_for("platform-us-east5-b", {"fleetMember": {"enabled": True}})
    assert "tpu-fallback:fleetMember.enabled: a platform with teams" in str(failure.value)


def test_a_member_may_start_fleet_jobs_on_a_higher_rung():
    plan = plan_for(MEMBERS[0], {"fleetMember": {"enabled": True, "startRung": "onDemand"}})
    assert manifests(plan, "LocalQueue")[FLEET_LOCAL_QUEUE]["spec"]["clusterQueue"] == "cluster-queue"
    assert plan.outputs[FLEET_MEMBER_OUTPUT]["capacity"]["slices"] == 2  # on-demand and DWS below it


def test_a_platform_that_is_not_a_member_is_unchanged():
    plan = plan_for("dev")
    assert FLEET_MEMBER_OUTPUT not in plan.outputs
    assert not plan.of_type("tpu-fallback:infra:FleetMember")


# ---- the fleet stack -----------------------------------------------------------------------------------------


def test_the_shipped_fleet_stack_is_found_and_reads_its_members():
    assert FLEET_STACKS == [FLEET]
    assert referenced_stacks(config_with({}, FLEET)) == list(MEMBER_STACKS)


def test_the_fleet_declares_a_manager_and_no_tpus():
    plan = cached_fleet_plan()
    cluster = plan.only("gcp:container/cluster:Cluster")
    assert cluster.inputs["name"] == "tpu-fleet" and cluster.inputs["location"] == "us-central1-a"
    assert "addonsConfig" not in cluster.inputs  # no Ray add-on: the pinned KubeRay chart instead
    assert cluster.inputs["nodeConfig"]["machineType"] == "e2-standard-4" and cluster.inputs["initialNodeCount"] == 2
    assert not plan.of_type("gcp:container/nodePool:NodePool")
    releases = {r.inputs["name"]: r for r in plan.helm_releases()}
    assert set(releases) == {"kueue", "kuberay-operator"}
    assert releases["kuberay-operator"].inputs["version"] == fleet_objects.KUBERAY_VERSION
    assert versions.KUBERAY == "v" + fleet_objects.KUBERAY_VERSION  # the tier installs the same CRDs


def test_the_managers_kueue_has_multikueue_and_only_the_rayjob_integration():
    release = next(r for r in cached_fleet_plan().helm_releases() if r.inputs["name"] == "kueue")
    config = yaml.safe_load(release.inputs["values"]["managerConfig"]["controllerManagerConfigYaml"])
    assert config["integrations"] == {"frameworks": ["ray.io/rayjob"]}
    assert config["multiKueue"] == {"gcInterval": "1m", "origin": "tpu-fallback-fleet", "workerLostTimeout": "900s",
                                    "dispatcherName": "kueue.x-k8s.io/multikueue-dispatcher-all-at-once"}
    # Kueue turns waitForPodsReady on (30m) when it is absent; the members' own timeouts decide, so: out of the way.
    assert config["waitForPodsReady"] == {"timeout": "86400s", "recoveryTimeout": "86400s", "blockAdmission": False}
    assert fleet_objects.MANAGER_PODS_READY_SECONDS == MAX_PODS_READY_TIMEOUT_SECONDS


def test_each_member_is_a_secret_kubeconfig_and_a_multikueue_cluster():
    plan = cached_fleet_plan()
    secrets = {r.inputs["metadata"]["name"]: r for r in plan.of_type(SECRET)}
    assert {r.name for r in plan.of_type("pulumi:pulumi:StackReference")} == set(MEMBERS)
    for member in MEMBERS:
        secret = secrets[f"{member}-kubeconfig"]
        assert secret.inputs["metadata"]["namespace"] == "kueue-system"
        # The stack writes the member's server and CA with no user; the renewer adds the token, which the stack
        # never sees or reverts.
        # (pulumi-kubernetes keeps a Secret's data secret in state and preview, whatever it holds.)
        assert secret.inputs["stringData"] == SECRET_MARK and {"data", "stringData"} <= set(secret.options["ignoreChanges"])
        access = member_outputs(member).outputs[FLEET_MEMBER_OUTPUT]["access"]
        handle = fleet_objects.MemberHandle(member, access, {}, "example-project", None)
        config = yaml.safe_load(fleet_objects.tokenless_kubeconfig(handle))
        assert config["clusters"][0]["cluster"] == {"server": access["server"],
                                                     "certificate-authority-data": access["certificateAuthorityData"]}
        assert config["users"][0]["user"] == {}
        cluster = manifests(plan, "MultiKueueCluster")[member]
        assert cluster["spec"] == {"clusterSource": {"kubeConfig": {"locationType": "Secret",
                                                                    "location": f"{member}-kubeconfig"}}}
    assert manifests(plan, "MultiKueueConfig")["fleet"]["spec"] == {"clusters": list(MEMBERS)}
    # The members' own kubeconfigs (the providers') stay secret; no token is in any input (the code ConfigMaps
    # aside: the renewer's source names the plugin it cannot use).
    inputs = str([r.inputs for r in plan.resources if r.type != "kubernetes:core/v1:ConfigMap"])
    for rendered in (render_tree(plan), inputs):
        assert "gke-gcloud-auth-plugin" not in rendered and "token:" not in rendered


def test_the_fleet_queue_holds_the_members_capacity_and_only_the_multikueue_check():
    plan = cached_fleet_plan()
    queue = manifests(plan, "ClusterQueue")[fleet_objects.CLUSTER_QUEUE]
    assert queue["spec"]["admissionChecksStrategy"] == {"admissionChecks": [{"name": "fleet-multikueue"}]}
    quota = {r["name"]: r["nominalQuota"] for r in queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"]}
    capacities = [member_outputs(m).outputs[FLEET_MEMBER_OUTPUT]["capacity"] for m in MEMBERS]
    assert quota == {"cpu": str(sum(c["cpu"] for c in capacities)),
                     "memory": f"{sum(c['memoryGi'] for c in capacities)}Gi",
                     "google.com/tpu": str(sum(c["tpuChips"] for c in capacities))} == {
        "cpu": "1536", "memory": "6144Gi", "google.com/tpu": "32"}
    check = manifests(plan, "AdmissionCheck")["fleet-multikueue"]
    assert check["spec"]["controllerName"] == "kueue.x-k8s.io/multikueue"
    local = manifests(plan, "LocalQueue")[FLEET_LOCAL_QUEUE]
    assert (local["metadata"]["namespace"], local["spec"]["clusterQueue"]) == (FLEET_NAMESPACE,
                                                                               fleet_objects.CLUSTER_QUEUE)


def test_every_fleet_custom_resource_validates_against_the_crds(crd_schemas):
    for plan in (cached_fleet_plan(), plan_for(MEMBERS[0])):
        kueue = [m for m in plan.kubernetes_manifests() if m["apiVersion"].startswith("kueue.x-k8s.io/")]
        assert kueue
        for manifest in kueue + [m for m in plan.kubernetes_manifests() if m["kind"] == "RayJob"]:
            assert validation_errors(manifest, _crd(manifest["kind"])) == [], (manifest["kind"],
                                                                              manifest["metadata"]["name"])
    broken = copy.deepcopy(fleet_objects.multikueue_cluster("w1"))
    broken["spec"] = {"kubeConfig": {"location": "x"}}  # the v1beta1 shape
    assert validation_errors(broken, _crd("MultiKueueCluster"))


def _crd(kind: str):
    return upstream.path(upstream.KUEUE_MULTIKUEUE_CRDS[kind]) if kind in upstream.KUEUE_MULTIKUEUE_CRDS else None


def test_the_jobs_are_queued_on_the_manager_and_their_pods_prepared_on_every_member():
    plan = cached_fleet_plan()
    manager = plan.named("fleet-k8s")
    job = plan.only(RAYJOB)
    assert job.provider_urn == manager.urn
    assert job.inputs["metadata"]["namespace"] == FLEET_NAMESPACE
    assert job.inputs["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == FLEET_LOCAL_QUEUE
    # Waits for the manager's Kueue, KubeRay and queue, and for what the pods need on every member.
    waits = {plan.by_urn()[urn].name for urn in job.dependencies}
    assert {"fleet-kueue-release", "fleet-kuberay", "fleet-localqueue-fleet-queue"} <= waits
    for member in MEMBERS:
        provider = plan.named(f"{member}-k8s")
        assert provider.inputs["kubeconfig"] == SECRET_MARK
        for role in ("ksa", "script"):
            site = plan.named(f"training-{member}-{role}")
            assert site.provider_urn == provider.urn and site.inputs["metadata"]["namespace"] == FLEET_NAMESPACE
            assert f"training-{member}-{role}" in waits
    # The RayJob itself is the slice's, as a member builds it: same machine type, topology, workers.
    worker = job.inputs["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    assert worker["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "4x4"
    bucket = plan.named("training-checkpoints")
    assert bucket.inputs["location"] == "US"
    # One Workload Identity binding for the jobs: both members are in the placeholder project (and the manager's).
    assert sorted(r.name for r in plan.of_type("gcp:serviceaccount/iAMMember:IAMMember")) == [
        "fleet-manager-workload-identity", "training-workload-identity"]


def _member_with(member: str, overrides: dict[str, object]) -> StackOutputs:
    plan = plan_for(member, overrides)
    return StackOutputs(plan.outputs, tuple(sorted(plan.secret_outputs)))


@pytest.mark.parametrize("graces, pods, window", [
    ((None, None), 15, 10), (("30s", "30s"), 15, 10), (("120s", "120s"), 105, 100),
    (("120s", "30s"), 15, 10), (("30s", "120s"), 15, 10), (("120s", None), 15, 10),
], ids=["no-spot", "30s-30s", "120s-120s", "first-120s", "second-120s", "one-without-spot"])
def test_the_fleet_jobs_workers_are_sized_by_the_members_shortest_spot_notice(graces, pods, window):
    """MultiKueue runs the manager's one RayJob unchanged on any member, and the kubelet gives a pod the lesser of its
    node's pods' part and its grace period: the workers follow the shortest of the members' `spot.gracefulTermination`
    (GKE's default 30 s where a member's Spot rung is off), as a member sizes its own jobs (test_workloads.py)."""
    answers = {}
    for member, grace in zip(MEMBERS, graces):
        if grace is not None:
            answers[member.replace("-", "_")] = _member_with(member, {
                "gkeVersion": "1.35.0-gke.1171000", "spot": {"maxSlices": 1, "gracefulTermination": grace}})
    job = fleet_plan(answers=references(**answers)).only(RAYJOB)
    spec = job.inputs["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] == pods
    (container,) = spec["containers"]
    assert container["lifecycle"] == rayjob.termination_notice_hook(window, train.DEFAULT_NOTICE_FILE)


def test_preview_declares_the_same_resources():
    preview = fleet_plan(preview=True)
    assert sorted((r.type, r.name) for r in preview.resources) == sorted(
        (r.type, r.name) for r in cached_fleet_plan().resources)


def test_the_fleet_outputs_say_where_jobs_can_go():
    outputs = cached_fleet_plan().outputs
    assert outputs["members"]["member-us-east5-a"] == {"stack": MEMBER_STACKS[0], "zone": "us-east5-a",
                                                       "startRung": "flexStart", "clusterQueue": "cluster-queue-dws"}
    assert outputs["localQueue"] == {"namespace": FLEET_NAMESPACE, "name": FLEET_LOCAL_QUEUE}
    assert outputs["trainingJobs"] == ["fleet-v6e-1"] and outputs["workerLostTimeoutSeconds"] == 900
    assert "kubeconfig" in cached_fleet_plan().secret_outputs
    assert outputs["managerServiceAccount"] == "fleet-fleet@example-project.iam.gserviceaccount.com"


# ---- the fleet's rules: a failing config each, nothing declared ----------------------------------------------


def _changed_member(member: str, change) -> StackOutputs:
    outputs = copy.deepcopy(member_outputs(member).outputs)
    change(outputs)
    return StackOutputs(outputs, member_outputs(member).secret_output_names)


def _set(path: tuple[str, ...], value):
    def change(outputs):
        node = outputs
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return change


@pytest.mark.parametrize("overrides, message", [
    ({"fleet": fleet_setting(members=[MEMBER_STACKS[0]])}, "fleet.members: 1 member(s)"),
    ({"fleet": fleet_setting(members=[MEMBER_STACKS[0], "my-org/tpu-fallback/fleet"])},
     "fleet.members[1]: my-org/tpu-fallback/fleet is this fleet stack"),
    ({"fleet": fleet_setting(members=["member-us-east5-a", MEMBER_STACKS[1]])},
     "fleet.members[0]: 'member-us-east5-a' is not a fully qualified stack name"),
    ({"fleet": fleet_setting(members=[MEMBER_STACKS[0], MEMBER_STACKS[0]])}, "listed more than once"),
    ({"fleet": fleet_setting(dispatcher="Random")}, "fleet.dispatcher: 'Random'"),
    ({"fleet": fleet_setting(workerLostTimeout="5s")}, "fleet.workerLostTimeout: '5s'"),
    ({"fleet": fleet_setting(checkpointLocation="us east")}, "fleet.checkpointLocation"),
    ({"tpu": {"machineType": "ct5lp-hightpu-4t", "topology": "4x4"}}, "tpu-fallback:tpu: a fleet stack does not"),
    ({"fleetMember": {"enabled": True}}, "tpu-fallback:fleetMember: a fleet stack does not"),
    ({"systemPool": {"machineType": "e2-standard-3"}}, "systemPool.machineType"),
], ids=["one-member", "itself", "not-qualified", "twice", "dispatcher", "lost-timeout", "location", "tpu-key",
        "member-key", "system-pool"])
def test_fleet_rules_before_any_member_is_read(overrides, message):
    engine = OfflineEngine(FLEET, False, references())
    with pytest.raises(SettingsError) as failure:
        fleet_plan(overrides, engine=engine)
    assert message in str(failure.value)
    assert engine.recorded == []  # not even a StackReference


@pytest.mark.parametrize("answers, message", [
    (references(member_asia_northeast1_b=StackOutputs.of_plan(plan_for("dev"))),
     "fleet.members[1]: my-org/tpu-fallback/member-asia-northeast1-b has no `fleetMember` output"),
    (references(member_asia_northeast1_b=_changed_member(MEMBERS[1], _set(("platform", "zone"), "us-east5-a"))),
     "is in us-east5-a, as my-org/tpu-fallback/member-us-east5-a is"),
    (references(member_asia_northeast1_b=_changed_member(MEMBERS[1], _set(("platform", "tpu"), {
        "machineType": "ct6e-standard-4t", "topology": "2x4"}))), "has ct6e-standard-4t 2x4 slices"),
    (references(member_asia_northeast1_b=_changed_member(MEMBERS[1], _set(("platform", "kueue", "version"),
                                                                          "0.18.0"))), "runs Kueue 0.18.0"),
    (references(member_asia_northeast1_b=_changed_member(MEMBERS[1], _set(("fleetMember", "localQueue"), "other"))),
     "fleet queue is tpu-fleet/other"),
    (references(member_asia_northeast1_b=_changed_member(MEMBERS[1], _set(("platform", "systemPool"), {
        "machineType": "e2-highcpu-2", "nodeCount": 3}))),
     "workloads.headMemory: 4Gi does not fit one e2-highcpu-2 (2 GiB) (against my-org/tpu-fallback/member-asia"),
    (references(member_asia_northeast1_b=_changed_member(MEMBERS[1], _set(("fleetMember", "access"), None))),
     "my-org/tpu-fallback/member-asia-northeast1-b publishes no `fleetMember.access`"),
], ids=["not-a-member", "same-zone", "other-slice", "other-kueue", "other-queue", "head-does-not-fit", "no-access"])
def test_fleet_rules_on_what_the_members_publish(answers, message):
    engine = OfflineEngine(FLEET, False, answers)
    with pytest.raises(SettingsError) as failure:
        fleet_plan(engine=engine)
    assert message in str(failure.value)
    assert {r.type for r in engine.recorded} <= {"pulumi:pulumi:StackReference"}  # read, nothing declared


def test_the_workloads_namespace_is_the_fleets():
    with pytest.raises(SettingsError) as failure:
        fleet_plan({"workloads": {"namespace": "ml"}})
    assert "tpu-fallback:workloads.namespace: 'ml': a fleet's jobs run in 'tpu-fleet'" in str(failure.value)
    assert fleet_plan({"workloads": {"namespace": FLEET_NAMESPACE, "jobs": 1, "namePrefix": "fleet-v6e"}})


def test_offline_command_plans_the_fleet_from_its_members_plans(tmp_path, capsys):
    assert offline_main([FLEET, "--out", str(tmp_path / "fleet")]) == 0
    printed = capsys.readouterr().out
    for stack in MEMBER_STACKS:
        assert f"the StackReference to {stack} is answered by the offline plan of" in printed
    assert "tpu-fallback:infra:FleetManager fleet" in printed
    member_dir = tmp_path / MEMBERS[1]
    assert offline_main([MEMBERS[1], "--out", str(member_dir)]) == 0
    assert offline_main([FLEET, "--out", str(tmp_path / "again"), "--stack-outputs",
                         f"{MEMBER_STACKS[1]}={member_dir / 'outputs.json'}"]) == 0
    assert f"answered by {member_dir / 'outputs.json'}" in capsys.readouterr().out


def test_the_fleet_watch_runs_on_the_manager_with_the_members_secrets_only():
    plan = cached_fleet_plan()
    watch = manifests(plan, "Deployment")[fleet_objects.WATCH_NAME]
    container = watch["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert json.loads(env["FLEET_MEMBERS"]) == {m: f"{m}-kubeconfig" for m in MEMBERS}
    assert env["FLEET_ORIGIN"] == "tpu-fallback-fleet" and "python -m failover.watch" in container["command"][-1]
    role = manifests(plan, "Role")[f"tpu-fallback-{fleet_objects.WATCH_NAME}"]
    assert role["metadata"]["namespace"] == "kueue-system"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
                              "resourceNames": [f"{m}-kubeconfig" for m in MEMBERS]}]
    cluster_role = manifests(plan, "ClusterRole")[f"tpu-fallback-{fleet_objects.WATCH_NAME}"]
    assert not any("secrets" in rule["resources"] for rule in cluster_role["rules"])
    code = manifests(plan, "ConfigMap")[watch["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"]]
    assert {"watch.__main__.py", "watch.decisions.py", "runtime.members.py"} <= set(code["data"])


def test_the_manager_reaches_the_members_with_one_hour_google_tokens_and_no_key():
    """The manager's Google service account, usable only by the renewer's ServiceAccount (Workload Identity); in each
    member's project the IAM role to reach its API server, and in each member the RBAC of a MultiKueue manager for
    that identity; the renewer may rewrite the members' Secrets and nothing else."""
    plan = cached_fleet_plan()
    account = plan.named("fleet-manager-gsa")
    email = account.outputs["email"]
    assert account.inputs["accountId"] == "fleet-fleet"
    assert not plan.of_type("gcp:serviceaccount/key:Key")  # no key: tokens come from the metadata server
    identity = plan.named("fleet-manager-workload-identity")
    assert identity.inputs["role"] == "roles/iam.workloadIdentityUser"
    assert identity.inputs["member"] == (f"serviceAccount:example-project.svc.id.goog[{failover_objects.NAMESPACE}/"
                                         f"{fleet_objects.CREDENTIALS_NAME}]")
    viewer = plan.named("fleet-manager-viewer-example-project")
    assert (viewer.inputs["role"], viewer.inputs["member"]) == ("roles/container.clusterViewer",
                                                                f"serviceAccount:{email}")
    for member in MEMBERS:
        binding = plan.named(f"fleet-{member}-manager-binding")
        assert binding.provider_urn == plan.named(f"{member}-k8s").urn  # declared in the member
        assert binding.inputs["roleRef"]["name"] == MANAGER_CLUSTER_ROLE
        assert binding.inputs["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                               "name": email}]
    renewer = manifests(plan, "Deployment")[fleet_objects.CREDENTIALS_NAME]
    container = renewer["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    access = json.loads(env["FLEET_ACCESS"])
    assert set(access) == set(MEMBERS)
    assert access[MEMBERS[0]] == {"secret": f"{MEMBERS[0]}-kubeconfig",
                                  **member_outputs(MEMBERS[0]).outputs[FLEET_MEMBER_OUTPUT]["access"]}
    assert "python -m failover.credentials" in container["command"][-1]
    assert renewer["spec"]["template"]["spec"]["serviceAccountName"] == fleet_objects.CREDENTIALS_NAME
    ksa = manifests(plan, "ServiceAccount")[fleet_objects.CREDENTIALS_NAME]
    assert ksa["metadata"]["annotations"] == {"iam.gke.io/gcp-service-account": email}
    role = manifests(plan, "Role")[f"tpu-fallback-{fleet_objects.CREDENTIALS_NAME}"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "patch"],
                              "resourceNames": [f"{m}-kubeconfig" for m in MEMBERS]}]
    assert not [b for b in manifests(plan, "ClusterRoleBinding").values()
                if any(s.get("name") == fleet_objects.CREDENTIALS_NAME for s in b["subjects"])]
    # The fleet's queue is Active only once a member is connected: after the renewer wrote the first tokens.
    queue = plan.named(f"fleet-clusterqueue-{fleet_objects.CLUSTER_QUEUE}")
    assert plan.named("fleet-credentials").urn in queue.dependencies
