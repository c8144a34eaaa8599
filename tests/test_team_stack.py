"""Team stacks (roles/team.py): one team's workloads on a platform stack's cluster, read through a StackReference.

The reference is answered from a fixture: the platform stack's outputs from its own offline plan, with the
kubeconfig's real (mock) text and its secrecy, so the tests see what a team stack would read.
"""

from __future__ import annotations

import functools
import inspect

import pulumi
import pytest
import yaml

import roles.team
from infra.offline import (SECRET_MARK, OfflineEngine, Plan, StackOutputs, config_value, render_manifests,
                           render_tree)
from infra.offline import main as offline_main
from infra.settings import SettingsError
from roles.contract import PLATFORM_OUTPUT, platform_output, settings_from_output
from tests.conftest import REPO, TEAM_STACKS, base_config, config_with, namespaced, plan_for
from workloads.jobs import TeamNamespace, TrainingJobs, training_account_id

PLATFORM = "platform-us-east5-b"  # three teams: research, prod (namespace prod-training), interns
PLATFORM_STACK = f"my-org/tpu-fallback/{PLATFORM}"
TEAM = "prod"
TEAM_NAMESPACE = "prod-training"
K8S_PROVIDER = "pulumi:providers:kubernetes"
ONLY_TEAM_TYPES = {
    "pulumi:pulumi:StackReference", K8S_PROVIDER, "tpu-fallback:workloads:TrainingJobs",
    "gcp:storage/bucket:Bucket", "gcp:storage/bucketIAMMember:BucketIAMMember", "gcp:serviceaccount/account:Account",
    "gcp:serviceaccount/iAMMember:IAMMember", "kubernetes:core/v1:ServiceAccount", "kubernetes:core/v1:ConfigMap",
    "kubernetes:ray.io/v1:RayJob",
}


@functools.cache
def platform_outputs(stack: str = PLATFORM) -> StackOutputs:
    """The platform's outputs as its StackReference reads them: real values, the kubeconfig secret by name."""
    plan = plan_for(stack)
    return StackOutputs(plan.outputs, tuple(sorted(plan.secret_outputs)))


def team_config(overrides: dict[str, object] | None = None) -> dict[str, str]:
    """A team stack's config: Pulumi.yaml's defaults with the team keys, as the CLI passes them."""
    config = {key: value for key, value in base_config("dev").items()
              if key.startswith("gcp:") or key not in yaml.safe_load((REPO / "Pulumi.dev.yaml").read_text())["config"]}
    config.update({namespaced("platformStack"): PLATFORM_STACK, namespaced("team"): TEAM})
    for key, value in (overrides or {}).items():
        if value is None:
            config.pop(namespaced(key), None)
        else:
            config[namespaced(key)] = config_value(value)
    return config


def team_plan(overrides: dict[str, object] | None = None, references: dict[str, StackOutputs] | None = None,
              preview: bool = False, engine: OfflineEngine | None = None) -> Plan:
    engine = engine or OfflineEngine("team-prod", preview, references or {PLATFORM_STACK: platform_outputs()})
    return engine.run(team_config(overrides))


@functools.cache
def cached_team_plan() -> Plan:
    return team_plan()


def test_a_team_stack_declares_only_its_workloads():
    plan = cached_team_plan()
    assert {r.type for r in plan.resources} == ONLY_TEAM_TYPES
    assert len(plan.of_type("kubernetes:ray.io/v1:RayJob")) == 2
    # No cluster, pools, Kueue, namespace, queues or controller: the platform stack has them.
    assert not any(r.type.startswith(("gcp:container/", "kubernetes:helm.sh", "kubernetes:kueue.x-k8s.io",
                                      "kubernetes:apps/")) for r in plan.resources)


def test_objects_go_to_the_team_namespace_and_local_queue_from_the_platform_outputs():
    plan = cached_team_plan()
    team = platform_outputs().outputs["teams"][TEAM]
    manifests = plan.kubernetes_manifests()
    assert {m["metadata"]["namespace"] for m in manifests} == {team["namespace"]} == {TEAM_NAMESPACE}
    for job in (m for m in manifests if m["kind"] == "RayJob"):
        assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == team["localQueue"]
    assert plan.outputs["localQueue"] == team["localQueue"]
    assert plan.outputs["queueChain"] == team["queueChain"]
    member = plan.named("training-workload-identity").inputs["member"]
    assert member == f"serviceAccount:example-project.svc.id.goog[{TEAM_NAMESPACE}/ray-training]"


def test_the_kubeconfig_stays_secret_and_every_object_uses_the_platform_provider():
    plan = cached_team_plan()
    provider = plan.only(K8S_PROVIDER)
    assert provider.inputs["kubeconfig"] == SECRET_MARK
    assert provider.inputs["clusterIdentifier"] == "projects/example-project/locations/us-east5-b/clusters/ml-platform"
    assert "gke-gcloud-auth-plugin" in platform_outputs().outputs["kubeconfig"]  # the fixture holds the real text
    for rendered in (render_tree(plan), render_manifests(plan)):
        assert "gke-gcloud-auth-plugin" not in rendered
    for r in plan.resources:
        if r.type.startswith("kubernetes:"):
            assert r.provider_urn == provider.urn, r.name


def test_the_rayjobs_are_the_single_team_module_s_jobs_for_the_same_platform():
    """Same code, no fork: the team's RayJob equals the one a single-team stack with the platform's settings makes,
    but for what is the team's (namespace, queue, bucket, names)."""
    single = plan_for(PLATFORM, {"workloads": {"enabled": True, "jobs": 2}, "teams": [], "googleGroupsDomain": ""})
    team_jobs = sorted(cached_team_plan().of_type("kubernetes:ray.io/v1:RayJob"), key=lambda r: r.name)
    single_jobs = sorted(single.of_type("kubernetes:ray.io/v1:RayJob"), key=lambda r: r.name)
    assert [r.name for r in team_jobs] == [r.name for r in single_jobs]
    team_bucket = cached_team_plan().named("training-checkpoints").inputs["name"]
    single_bucket = single.named("training-checkpoints").inputs["name"]
    for team_job, single_job in zip(team_jobs, single_jobs):
        assert team_job.inputs["spec"]["rayClusterSpec"] == single_job.inputs["spec"]["rayClusterSpec"]
        assert team_job.inputs["spec"]["entrypoint"] == single_job.inputs["spec"]["entrypoint"].replace(
            single_bucket, team_bucket)
    assert "TrainingJobs" in inspect.getsource(roles.team) and TrainingJobs.__module__ == "workloads.jobs"


def test_the_platform_output_round_trips_to_the_platform_settings():
    pulumi.runtime.set_all_config(base_config(PLATFORM))
    from infra.settings import ConfigReader, read_platform_settings

    settings = read_platform_settings(ConfigReader(pulumi.Config()), pulumi.Config("gcp"))
    published = platform_output(settings)
    assert published == platform_outputs().outputs[PLATFORM_OUTPUT]  # what the platform stack exports
    back = settings_from_output(yaml.safe_load(yaml.safe_dump(published)))  # plain data only
    for field in ("project", "zone", "cluster_name", "gke_version", "system_pool", "tpu", "plans", "kueue_version",
                  "kueue_chart_repository", "fallback"):
        assert getattr(back, field) == getattr(settings, field), field


def test_preview_declares_the_jobs_too():
    preview, up = team_plan(preview=True), cached_team_plan()
    assert sorted((r.type, r.name) for r in preview.resources) == sorted((r.type, r.name) for r in up.resources)
    assert len(preview.of_type("kubernetes:ray.io/v1:RayJob")) == 2


def test_single_team_platforms_publish_nothing_for_team_stacks():
    outputs = plan_for("dev").outputs
    assert PLATFORM_OUTPUT not in outputs and "teams" not in outputs


def _problems(overrides: dict[str, object] | None = None, references: dict[str, StackOutputs] | None = None):
    engine = OfflineEngine("team-prod", False, references or {PLATFORM_STACK: platform_outputs()})
    with pytest.raises(SettingsError) as failure:
        team_plan(overrides, engine=engine)
    assert not [r for r in engine.recorded if not r.options.get("read")], "a bad team stack registered resources"
    return failure.value.problems


@pytest.mark.parametrize("overrides, key, message", [
    ({"platformStack": PLATFORM}, "platformStack", "not a fully qualified stack name"),
    ({"platformStack": "my-org/tpu-fallback/team-prod"}, "platformStack", "names this stack"),
    ({"team": None}, "team", "required"),
    ({"team": "Prod"}, "team", "not a team name"),
    ({"team": "platform"}, "team", "'platform' is not a team of my-org/tpu-fallback/platform-us-east5-b; its teams: "
                                   "interns, prod, research"),
    ({"zone": "us-west4-a"}, "zone", "set on the platform stack"),
    ({"tpu": {"topology": "2x2"}}, "tpu", "set on the platform stack"),
    ({"teamz": "prod"}, "teamz", "unknown key"),
    ({"workloads": {"namespace": "research"}}, "workloads.namespace", "deploys into its team's namespace"),
    ({"workloads": {"headCpu": "64"}}, "workloads.headCpu", "does not fit one n2-standard-16"),
    # Fits the pool, but more than the share holds per job: every job would borrow, so reclaim would never happen.
    ({"workloads": {"headCpu": "3"}}, "workloads.headCpu", "cannot reclaim the team's share"),
    ({"workloads": {"headMemory": "6Gi"}}, "workloads.headMemory", "cannot reclaim the team's share"),
    ({"workloads": {"trainingArgs": ["--batch-size", "12"]}}, "workloads.trainingArgs", "slice's 8 chips"),
])
def test_a_bad_team_stack_fails_naming_the_key(overrides, key, message):
    problems = _problems(overrides)
    assert any(p.startswith(f"tpu-fallback:{key}: ") and message in p for p in problems), problems


def test_a_platform_without_teams_is_named():
    dev = plan_for("dev")
    problems = _problems(references={PLATFORM_STACK: StackOutputs(dev.outputs, tuple(dev.secret_outputs))})
    assert any(p.startswith("tpu-fallback:platformStack: ") and "no `platform` output" in p for p in problems)
    assert any(p.startswith("tpu-fallback:team: ") and "none (set `teams` on the platform stack)" in p
               for p in problems)


def test_an_unreadable_platform_output_is_named():
    outputs = dict(platform_outputs().outputs)
    outputs[PLATFORM_OUTPUT] = {**outputs[PLATFORM_OUTPUT], "tpu": {"machineType": "ct9-future", "topology": "2x4"}}
    problems = _problems(references={PLATFORM_STACK: StackOutputs(outputs, ("kubeconfig",))})
    assert any(p.startswith("tpu-fallback:platformStack: ") and "ct9-future" in p for p in problems), problems


def test_the_default_workloads_namespace_and_the_team_one_are_both_accepted():
    plan = team_plan({"workloads": {"namespace": TEAM_NAMESPACE, "jobs": 1}})
    assert {m["metadata"]["namespace"] for m in plan.kubernetes_manifests()} == {TEAM_NAMESPACE}


def test_each_team_gets_its_own_training_account():
    settings = settings_from_output(platform_outputs().outputs[PLATFORM_OUTPUT])
    ids = {training_account_id(settings, TeamNamespace(team, team, "user-queue"))
           for team in ("research", "prod", "interns", "a" * 30, "a" * 29 + "b")}
    assert len(ids) == 5 and "ml-platform-prod-train" in ids
    assert all(6 <= len(i) <= 30 and i[0].isalpha() and i[-1].isalnum() for i in ids), ids
    assert training_account_id(settings, None) == "ml-platform-train"  # a single-team stack keeps its account


@pytest.mark.parametrize("stack", TEAM_STACKS)
def test_offline_command_plans_a_shipped_team_stack(stack, tmp_path, capsys):
    assert offline_main([stack, "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "tpu-fallback:workloads:TrainingJobs training" in printed
    assert "> read pulumi:pulumi:StackReference platform" in printed
    assert "tpu-fallback:infra:" not in printed
    kinds = {d["kind"] for d in yaml.safe_load_all((tmp_path / "manifests.yaml").read_text())}
    assert kinds == {"ConfigMap", "RayJob", "ServiceAccount"}


def test_offline_command_takes_the_platform_outputs_from_a_file(tmp_path, capsys):
    platform_dir, team_dir = tmp_path / "platform", tmp_path / "team"
    assert offline_main([PLATFORM, "--out", str(platform_dir)]) == 0
    written = StackOutputs.from_json((platform_dir / "outputs.json").read_text())
    assert written.outputs["kubeconfig"] == SECRET_MARK and written.secret_output_names == ("kubeconfig",)
    assert offline_main([TEAM_STACKS[0], "--out", str(team_dir), "--platform-outputs",
                         str(platform_dir / "outputs.json")]) == 0
    assert "answered by " + str(platform_dir / "outputs.json") in capsys.readouterr().out


def test_offline_command_names_a_missing_platform_stack(tmp_path, monkeypatch, capsys):
    import infra.offline as offline

    monkeypatch.setattr(offline, "stack_config", lambda stack, root=REPO: {
        **config_with({}, "dev"), namespaced("platformStack"): "my-org/tpu-fallback/nowhere"})
    with pytest.raises(SystemExit):
        offline_main(["anything", "--out", str(tmp_path)])
    assert "Pulumi.nowhere.yaml" in capsys.readouterr().err


def test_a_platforms_extended_spot_grace_reaches_its_team_stacks():
    """A team stack sizes its TPU workers' grace period from the platform's Spot rung: 105 s of a 120 s shutdown,
    not GKE's default 15 s (the platform publishes the extension only when it has one)."""
    overrides = {"gkeVersion": "1.35.0-gke.1171000", "spot": {"maxSlices": 1, "gracefulTermination": "120s"}}
    pulumi.runtime.set_all_config(config_with(overrides, PLATFORM))
    from infra.settings import ConfigReader, read_platform_settings

    settings = read_platform_settings(ConfigReader(pulumi.Config()), pulumi.Config("gcp"))
    back = settings_from_output(yaml.safe_load(yaml.safe_dump(platform_output(settings))))
    assert back.plans == settings.plans
    assert (back.spot_shutdown.seconds, back.spot_shutdown.pods_seconds) == (120, 105)
