"""The workloads module: RayJobs derived from the slice, Kueue's RayJob rules, storage and identity."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import shlex
import subprocess
import tempfile
import time

import pytest
import yaml

from failover.api import CHECKPOINT_REQUEST_ANNOTATION
from infra.offline import OfflineEngine
from infra.settings import SettingsError
from workloads import jobs as jobs_module
from workloads import rayjob, train
from workloads.jobs import checkpoint_bucket_name, script_configmap_name
from workloads.rayjob import RUNTIME_REQUIREMENTS, SCRIPT_PATH, runtime_pins
from tests.conftest import config_with, plan_for
from tests.k8s_schema import validation_errors
from tests.test_tpu import ALL_SHAPES

RAYJOB = "kubernetes:ray.io/v1:RayJob"
# Kueue 0.19.2 allows 18 pod sets, the head's included (jobframework.MaxPodSets; the Workload CRD's podSets
# maxItems). Checked against the real webhook in tests/test_controlplane.py.
MAX_RAY_WORKER_GROUPS = 17


def rayjobs(plan) -> dict[str, dict]:
    return {m["metadata"]["name"]: m for m in plan.kubernetes_manifests() if m["kind"] == "RayJob"}


def worker_group(job: dict) -> dict:
    groups = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert len(groups) == 1
    return groups[0]


def test_dev_declares_the_seed_submit_loop():
    jobs = rayjobs(plan_for())
    assert sorted(jobs) == ["rayjob-tpu-v6e-dws-1", "rayjob-tpu-v6e-dws-2"]
    for job in jobs.values():
        assert job["metadata"]["namespace"] == "default"
        assert job["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "user-queue"}
        assert job["metadata"]["annotations"]["kueue.x-k8s.io/elastic-job"] == "true"
        assert job["spec"]["rayClusterSpec"]["enableInTreeAutoscaling"] is True
        assert job["spec"]["shutdownAfterJobFinishes"] is True
        assert job["spec"]["backoffLimit"] >= 1


@pytest.mark.parametrize("stack, hosts, chips, label, topology, max_replicas", [
    ("dev", 4, "4", "tpu-v6e-slice", "4x4", 1),                   # multi-host, one slice per plan
    ("team-b-us-east5-a", 1, "8", "tpu-v6e-slice", "2x4", 2),     # single-host, two on-demand slices
    ("team-c-us-west4-a", 4, "4", "tpu-v5-lite-podslice", "4x4", 2),
])
def test_worker_group_is_derived_from_the_slice(stack, hosts, chips, label, topology, max_replicas):
    for job in rayjobs(plan_for(stack)).values():
        group = worker_group(job)
        assert group["numOfHosts"] == hosts
        assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (1, 1, max_replicas)
        pod = group["template"]["spec"]
        assert pod["nodeSelector"] == {"cloud.google.com/gke-tpu-accelerator": label,
                                       "cloud.google.com/gke-tpu-topology": topology}
        resources = pod["containers"][0]["resources"]
        assert resources["requests"]["google.com/tpu"] == resources["limits"]["google.com/tpu"] == chips
        head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
        assert head["nodeSelector"] == {"cloud.google.com/gke-nodepool": "default-pool"}


def test_max_replicas_never_exceed_what_a_plan_provides():
    jobs = rayjobs(plan_for(overrides={"onDemand": {"maxSlices": 3}, "flexStart": {"maxSlices": 1}}))
    assert all(worker_group(job)["maxReplicas"] == 3 for job in jobs.values())


def test_plan_b_adds_the_queued_toleration_and_max_run_duration():
    job = rayjobs(plan_for())["rayjob-tpu-v6e-dws-1"]
    tolerations = worker_group(job)["template"]["spec"]["tolerations"]
    assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    assert {"key": "cloud.google.com/gke-queued", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    assert job["metadata"]["annotations"]["provreq.kueue.x-k8s.io/maxRunDurationSeconds"] == "86400"


def test_without_plan_b_no_queued_toleration_or_provisioning_annotation():
    job = rayjobs(plan_for(overrides={"flexStart": {"maxSlices": 0}}))["rayjob-tpu-v6e-dws-1"]
    keys = [t["key"] for t in worker_group(job)["template"]["spec"]["tolerations"]]
    assert keys == ["google.com/tpu"]
    assert "provreq.kueue.x-k8s.io/maxRunDurationSeconds" not in job["metadata"]["annotations"]


def test_max_run_duration_comes_from_config():
    # The override replaces the dev stack's workloads object, so the names are the derived default's.
    job = rayjobs(plan_for(overrides={"workloads": {"maxRunDuration": 7200}}))["rayjob-tpu-v6e-4x4-1"]
    assert job["metadata"]["annotations"]["provreq.kueue.x-k8s.io/maxRunDurationSeconds"] == "7200"


def test_image_and_runtime_env_use_the_pinned_versions_the_tests_run_with():
    pins = runtime_pins()
    assert importlib.metadata.version("ray") == pins.ray
    for requirement in pins.packages:
        name, version = requirement.split("==")
        assert importlib.metadata.version(name.split("[")[0]) == version, requirement
    job = rayjobs(plan_for())["rayjob-tpu-v6e-dws-1"]
    cluster = job["spec"]["rayClusterSpec"]
    images = {cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["image"],
              worker_group(job)["template"]["spec"]["containers"][0]["image"]}
    assert images == {f"rayproject/ray:{pins.ray}-py311"}
    assert yaml.safe_load(job["spec"]["runtimeEnvYAML"]) == {"pip": list(pins.packages)}
    assert any(p.startswith("jax[tpu]==") for p in pins.packages)


def test_runtime_pins_must_be_exact(tmp_path):
    loose = tmp_path / "requirements.txt"
    loose.write_text("ray[train]==2.60.0\njax>=0.10\n")
    with pytest.raises(ValueError, match="not pinned"):
        runtime_pins(loose)
    assert RUNTIME_REQUIREMENTS.exists()


class _Config(dict):
    """Raw config values by key, read through `get` as pulumi.Config reads them."""


def _dev_settings():
    """The dev stack's platform and workload settings, read as the program reads them."""
    from infra.settings import ConfigReader, read_platform_settings
    from workloads.settings import read_workload_settings

    reader = ConfigReader(_Config({key.split(":", 1)[1]: value for key, value in config_with({}).items()
                                   if key.startswith("tpu-fallback:")}))
    platform = read_platform_settings(reader, _Config({"project": "example-project"}))
    workloads = read_workload_settings(reader, platform)
    assert reader.problems == []
    return platform, workloads


@pytest.mark.parametrize("machine_type, topology", ALL_SHAPES)
def test_every_slice_gives_train_py_a_peak_per_jax_device(machine_type, topology):
    """train.py splits the batch over jax.device_count() devices and divides the model's FLOP/s by it (a TensorCore on
    TPU7x, two per chip): the peak the entrypoint passes is per device too, so a slice at its chips' peak is MFU 1."""
    import dataclasses

    from infra.tpu import lookup_slice

    platform, workloads = _dev_settings()
    tpu = lookup_slice(machine_type, topology)
    platform = dataclasses.replace(platform, tpu=tpu)
    args = train.build_parser().parse_args(shlex.split(rayjob.entrypoint(platform, workloads, "job", "bucket"))[2:])
    assert (args.num_workers, args.chips_per_host) == (tpu.hosts, tpu.chips_per_host)
    assert args.accelerator_type == tpu.generation.ray_accelerator_type
    devices = tpu.chips * tpu.generation.devices_per_chip  # what JAX counts on the slice
    assert devices == tpu.devices
    slice_peak_flops = tpu.chips * tpu.generation.peak_bf16_tflops_per_chip * 1e12  # Google's per-chip figure
    mfu = slice_peak_flops / 1.0 / devices / 1e12 / args.peak_tflops_per_device  # train.py's, one second a step
    assert mfu == pytest.approx(1.0)


def test_tpu7x_batch_must_split_over_its_tensorcores():
    """A 2x2x2 TPU7x slice is 8 chips but 16 JAX devices: --batch-size 8 leaves half the cores without a row."""
    with pytest.raises(SettingsError) as raised:
        OfflineEngine().run(config_with({"workloads": {"trainingArgs": ["--batch-size", "8"]}}, "ironwood-us-central1-c"))
    assert raised.value.problems == ["tpu-fallback:workloads.trainingArgs: --batch-size 8 is not a multiple of the slice's 16 JAX "
                        "devices (8 chips)"]


def test_a_slice_ray_cannot_reserve_is_refused_while_jobs_run_there():
    """tpu7x-standard-1t (1x1x1): Ray's slice reservation has no such v7x slice; the platform alone is fine."""
    single = {"tpu": {"machineType": "tpu7x-standard-1t", "topology": "1x1x1"},
              "workloads": {"trainingArgs": ["--batch-size", "2"]}}
    with pytest.raises(SettingsError) as raised:
        OfflineEngine().run(config_with(single, "ironwood-us-central1-c"))
    assert [p for p in raised.value.problems if p.startswith("tpu-fallback:tpu.machineType: ")] == [
        "tpu-fallback:tpu.machineType: tpu7x-standard-1t (1x1x1): Ray's TPU slice reservation, which the training "
        "jobs' JaxTrainer makes, has no TPU-V7X 1x1x1 slice (Ray 2.60, ray/_private/accelerators/tpu.py "
        "VALID_TPU_TOPOLOGY); use another machine type, or set workloads.jobs to 0"]
    assert plan_for("ironwood-us-central1-c", {**single, "workloads": {"jobs": 0}}).of_type(RAYJOB) == []


def test_entrypoint_flags_are_derived_and_accepted_by_train_py():
    job = rayjobs(plan_for())["rayjob-tpu-v6e-dws-1"]
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:2] == ["python", "/app/train.py"]
    args = train.build_parser().parse_args(argv[2:])
    assert args.use_tpu and args.topology == "4x4" and args.accelerator_type == "TPU-V6E"
    assert (args.num_workers, args.chips_per_host, args.peak_tflops_per_device) == (4, 4, 918.0)
    bucket = plan_for().outputs["checkpointBucket"]
    assert args.storage_path == f"{bucket}/ray"
    assert args.checkpoint_dir == f"{bucket}/rayjob-tpu-v6e-dws-1/orbax"
    assert args.run_name == "rayjob-tpu-v6e-dws-1"  # fixed: a retry resumes
    # No fixed --run-id: each RayCluster (dispatch, retry) writes under its own name, from RAY_CLUSTER_NAME.
    assert args.run_id is None
    assert args.steps == 500 and args.dtype == "bfloat16" and args.d_model == 1024  # the configured flags
    assert args.checkpoint_every == 100  # workloads.checkpointEvery
    assert args.notice_file == train.DEFAULT_NOTICE_FILE  # where the workers' preStop hook writes
    assert args.goodput_logger == "file"  # the records in the bucket: the service account's only rights


def test_every_dev_entrypoint_resolves_as_train_py_resolves_it_at_its_start(monkeypatch):
    """Parsing is not enough: train.main resolves the flags before it trains, and a pair it rejects there (once,
    --goodput-logger file with a gs:// --checkpoint-dir) fails every RayJob at its start on GKE."""
    bucket = plan_for().outputs["checkpointBucket"]
    for name, job in rayjobs(plan_for()).items():
        monkeypatch.setenv("RAY_CLUSTER_NAME", f"{name}-x7k2p")  # as KubeRay sets it on the RayCluster's pods
        config = train.resolve_config(train.build_parser().parse_args(shlex.split(job["spec"]["entrypoint"])[2:]))
        records = train.GoodputFileLogger(config["checkpoint_dir"], name, config["run_id"]).path
        assert records == f"{bucket}/{name}/orbax/runs/{name}-x7k2p/goodput/records.jsonl", name


def test_checkpoint_interval_comes_from_config():
    job = rayjobs(plan_for(overrides={"workloads": {"checkpointEvery": 25}}))["rayjob-tpu-v6e-4x4-1"]
    assert train.build_parser().parse_args(shlex.split(job["spec"]["entrypoint"])[2:]).checkpoint_every == 25


def test_tpu_workers_get_gkes_termination_notice_as_the_training_reads_it():
    """GKE's notice reaches the TPU workers through their preStop hook (the SIGTERM goes to `ray start`, which drains
    for 30 s first): the hook creates the file train.py looks for after each step, then gives it time to save. With
    GKE's default 30 s, a Spot VM's pods get 15 s (the system pods the next 15 s): the pods' grace period is those
    15 s, the hook waits at most 10 of them and leaves 5 to the SIGTERM.
    Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms"""
    job = rayjobs(plan_for())["rayjob-tpu-v6e-dws-1"]
    (worker,) = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    (container,) = worker["template"]["spec"]["containers"]
    assert container["lifecycle"] == rayjob.termination_notice_hook(10, train.DEFAULT_NOTICE_FILE)
    assert worker["template"]["spec"]["terminationGracePeriodSeconds"] == 15
    assert rayjob.SIGTERM_SECONDS == 5
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert "lifecycle" not in head["containers"][0]  # the head trains nothing
    assert "terminationGracePeriodSeconds" not in head


def _run_hook(seconds: int, notice: str, consume_after: float | None = None) -> float:
    """Run the preStop hook's script here, as the kubelet would; `consume_after`: train.py's save, which removes the
    notice once done. The seconds the hook took."""
    command = rayjob.termination_notice_hook(seconds, notice)["preStop"]["exec"]["command"]
    assert command[:2] == ["/bin/sh", "-c"]
    started = time.monotonic()
    hook = subprocess.Popen(command)
    if consume_after is not None:
        deadline = started + 5
        while not os.path.exists(notice):  # the hook creates it where train.py looks
            assert time.monotonic() < deadline, "the hook created no notice"
            time.sleep(0.01)
        time.sleep(consume_after)
        os.remove(notice)
    assert hook.wait(timeout=seconds + 10) == 0
    return time.monotonic() - started


def test_the_notice_hook_ends_once_the_training_has_saved():
    """A pod deleted for a move or an eviction gets the same hook: it must not wait out the whole notice once
    train.py has saved (train.py removes the notice file after its save)."""
    with tempfile.TemporaryDirectory() as directory:
        notice = f"{directory}/notice/file"
        assert _run_hook(8, notice, consume_after=0.2) < 4  # polled once a second
        assert not os.path.exists(notice)


def test_the_notice_hook_waits_at_most_its_window_when_nothing_saves():
    with tempfile.TemporaryDirectory() as directory:
        notice = f"{directory}/notice/file"
        took = _run_hook(2, notice)
        assert os.path.exists(notice)  # left for train.py, whenever it looks
        assert 2 <= took < 6
        assert _run_hook(0, notice) < 2


@pytest.mark.parametrize("grace, pods, window", [("30s", 15, 10), ("120s", 105, 100)])
def test_worker_grace_and_notice_window_follow_spot_graceful_termination(grace, pods, window):
    """On a node's shutdown the kubelet gives a pod the lesser of the pods' part and its terminationGracePeriodSeconds:
    the workers' grace period is the pods' part, so an extended one reaches them.
    Ref: https://kubernetes.io/docs/concepts/cluster-administration/node-shutdown/#graceful-node-shutdown"""
    plan = plan_for(overrides={"gkeVersion": "1.35.0-gke.1171000",
                               "spot": {"maxSlices": 1, "gracefulTermination": grace}})
    for job in rayjobs(plan).values():
        spec = worker_group(job)["template"]["spec"]
        assert spec["terminationGracePeriodSeconds"] == pods
        (container,) = spec["containers"]
        assert container["lifecycle"] == rayjob.termination_notice_hook(window, train.DEFAULT_NOTICE_FILE)
        assert window + rayjob.SIGTERM_SECONDS == pods


def test_script_configmap_is_named_by_content_and_mounted_everywhere():
    plan = plan_for()
    configmap = plan.named("training-script")
    script = SCRIPT_PATH.read_text()
    # Named by the program from the script's content: known at preview, and a new script is a new ConfigMap.
    name = f"train-script-{hashlib.sha256(script.encode()).hexdigest()[:10]}"
    assert configmap.inputs["metadata"] == {"name": name, "namespace": "default"}
    assert configmap.inputs["data"] == {"train.py": script}
    assert configmap.options["deleteBeforeReplace"] is False  # a new name: created before the old one goes
    for recorded in plan.of_type(RAYJOB):
        assert configmap.urn in recorded.dependencies  # an explicit dependency, no name lifted from it
    for job in rayjobs(plan).values():
        cluster = job["spec"]["rayClusterSpec"]
        for pod in (cluster["headGroupSpec"]["template"]["spec"], worker_group(job)["template"]["spec"]):
            assert pod["volumes"][0] == {"name": "train-script", "configMap": {"name": name}}
            assert pod["containers"][0]["volumeMounts"][0] == {"name": "train-script", "mountPath": "/app"}
            assert pod["serviceAccountName"] == "ray-training"
        assert len(cluster["headGroupSpec"]["template"]["spec"]["volumes"]) == 1  # the head trains nothing


def test_tpu_workers_see_their_own_annotations_where_train_py_reads_the_checkpoint_request():
    """The failover controller's checkpoint request (failover/checkpoints.py) is an annotation on the TPU workers;
    a downwardAPI volume, mounted whole (a subPath mount is never refreshed), puts it where train.py looks."""
    for job in rayjobs(plan_for()).values():
        pod = worker_group(job)["template"]["spec"]
        assert pod["volumes"][1] == {"name": "pod-annotations", "downwardAPI": {"items": [
            {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]}}
        mount = pod["containers"][0]["volumeMounts"][1]
        assert mount == {"name": "pod-annotations", "mountPath": "/etc/tpu-fallback/pod", "readOnly": True}
        assert f"{mount['mountPath']}/annotations" == train.DEFAULT_POD_ANNOTATIONS_FILE
        args = train.build_parser().parse_args(shlex.split(job["spec"]["entrypoint"])[2:])
        assert args.pod_annotations_file == train.DEFAULT_POD_ANNOTATIONS_FILE
    assert train.CHECKPOINT_REQUEST_ANNOTATION == CHECKPOINT_REQUEST_ANNOTATION  # train.py imports nothing of ours


def test_a_changed_script_gives_a_new_configmap_the_rayjobs_follow(monkeypatch, tmp_path):
    changed = tmp_path / "train.py"
    changed.write_text(SCRIPT_PATH.read_text() + "\n# changed\n")
    monkeypatch.setattr(jobs_module, "SCRIPT_PATH", changed)
    plan = OfflineEngine().run(config_with({}))
    name = plan.named("training-script").inputs["metadata"]["name"]
    assert name == script_configmap_name(changed.read_text())
    assert name != plan_for().named("training-script").inputs["metadata"]["name"]
    for job in rayjobs(plan).values():
        volumes = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["volumes"]
        assert volumes == [{"name": "train-script", "configMap": {"name": name}}]


def test_configmap_name_depends_on_the_script_only():
    assert script_configmap_name("print(1)\n") == script_configmap_name("print(1)\n")
    assert script_configmap_name("print(1)\n") != script_configmap_name("print(2)\n")
    assert re.fullmatch(r"train-script-[0-9a-f]{10}", script_configmap_name(""))


# GCS bucket naming rules, as Google states them (no dots: ours never have any).
# Ref: https://cloud.google.com/storage/docs/buckets#naming
def bucket_name_problems(name: str) -> list[str]:
    problems = []
    if not 3 <= len(name) <= 63:
        problems.append(f"{len(name)} characters")
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*[a-z0-9]", name):
        problems.append("not lowercase letters, digits, dashes, starting and ending with a letter or digit")
    if name.startswith("goog"):
        problems.append('starts with "goog"')
    if re.search(r"g[o0]{2,}g[l1]*e?", name):  # "google" and close misspellings such as "g00gle"
        problems.append('contains "google" or a close misspelling')
    return problems


LONG_PROJECT = "a-very-long-project-id-of-30ch"  # the longest a GCP project ID gets
assert len(LONG_PROJECT) == 30


@pytest.mark.parametrize("project, stack", [
    ("example-project", "dev"),
    (LONG_PROJECT, "team-b-us-east5-a"),
    (LONG_PROJECT, "s" * 100),                      # Pulumi allows stack names of 100 characters
    ("p" * 6, "Team_B.US-East5" + "-x" * 40),       # upper case, "_" and "." as Pulumi allows them
    ("google-project", "dev"),
    ("goog-research", "goog"),
    ("my-g00gle-lab", "GOOGLE"),
    ("googoogle-x", "google_google"),
    ("abcdef", "---"),
])
def test_bucket_name_obeys_gcs_rules(project, stack):
    name = checkpoint_bucket_name(project, stack, "tpu-fallback")
    assert bucket_name_problems(name) == [], name
    assert re.fullmatch(r"(?:[a-z0-9-]+-)?ckpt-[0-9a-f]{8}", name)


def test_bucket_name_is_readable_and_deterministic():
    name = checkpoint_bucket_name("example-project", "dev", "tpu-fallback")
    assert name.startswith("example-project-dev-ckpt-")
    assert name == checkpoint_bucket_name("example-project", "dev", "tpu-fallback")
    # The program's bucket gets exactly this name, and the RayJobs write to it.
    plan = plan_for()
    assert plan.only("gcp:storage/bucket:Bucket").inputs["name"] == name
    assert plan.outputs["checkpointBucket"] == f"gs://{name}"
    for job in rayjobs(plan).values():
        assert f"--storage-path gs://{name}/ray" in job["spec"]["entrypoint"]


def test_long_names_are_cut_and_stay_apart():
    stack = "team-" + "x" * 90
    names = {checkpoint_bucket_name(LONG_PROJECT, stack + end, "tpu-fallback") for end in ("-a", "-b", "_a", ".a")}
    assert len(names) == 4  # the same readable part, told apart by the hash of the full names
    assert all(len(name) == 63 and name.startswith(LONG_PROJECT[:24]) for name in names)
    # A short stack leaves the project whole.
    assert checkpoint_bucket_name(LONG_PROJECT, "dev", "p").startswith(f"{LONG_PROJECT}-dev-ckpt-")


def test_bucket_names_differ_by_stack_project_and_pulumi_project():
    stacks = ["dev", "team-b-us-east5-a", "team-c-us-west4-a", "Dev", "team_b", "team-b", "team.b"]
    assert len({checkpoint_bucket_name("example-project", stack, "tpu-fallback") for stack in stacks}) == len(stacks)
    assert len({checkpoint_bucket_name("example-project", "dev", "tpu-fallback"),
                checkpoint_bucket_name("example-project-2", "dev", "tpu-fallback"),
                checkpoint_bucket_name("example-project", "dev", "another-copy")}) == 3
    buckets = {plan_for(stack).only("gcp:storage/bucket:Bucket").inputs["name"]
               for stack in ("dev", "team-b-us-east5-a", "team-c-us-west4-a")}
    assert len(buckets) == 3


@pytest.mark.parametrize("stack", ["dev", "team-b-us-east5-a", "team-c-us-west4-a"])
def test_rayjobs_validate_strictly_against_kuberay_crd(stack, crd_schemas):
    for job in rayjobs(plan_for(stack)).values():
        assert validation_errors(job) == []


def test_rayjobs_obey_kueue_rayjob_rules():
    plan = plan_for()
    local_queues = {(m["metadata"]["namespace"], m["metadata"]["name"])
                    for m in plan.kubernetes_manifests() if m["kind"] == "LocalQueue"}
    for job in rayjobs(plan).values():
        spec = job["spec"]
        assert "clusterSelector" not in spec and "rayClusterSpec" in spec
        assert spec["shutdownAfterJobFinishes"] is True
        if spec["rayClusterSpec"].get("enableInTreeAutoscaling"):
            assert job["metadata"]["annotations"]["kueue.x-k8s.io/elastic-job"] == "true"
        assert len(spec["rayClusterSpec"]["workerGroupSpecs"]) <= MAX_RAY_WORKER_GROUPS
        queue = (job["metadata"]["namespace"], job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"])
        assert queue in local_queues
        assert "suspend" not in spec  # Kueue's webhook suspends it; we never unsuspend by hand


def test_rayjobs_wait_for_kueue_and_their_queue():
    plan = plan_for()
    release = plan.only("kubernetes:helm.sh/v3:Release")
    local_queue = plan.named("kueue-localqueue-user-queue")
    jobs = plan.of_type(RAYJOB)
    assert len(jobs) == 2
    grants = [*plan.of_type("gcp:storage/bucketIAMMember:BucketIAMMember"),
              *plan.of_type("gcp:serviceaccount/iAMMember:IAMMember")]
    assert len(grants) == 3
    for job in jobs:
        assert release.urn in job.dependencies and local_queue.urn in job.dependencies
        assert all(grant.urn in job.dependencies for grant in grants)  # checkpoints writable from the start


def test_checkpoint_bucket_and_keyless_identity():
    plan = plan_for()
    bucket = plan.only("gcp:storage/bucket:Bucket")
    assert bucket.inputs["location"] == "us-east5"
    assert bucket.inputs["uniformBucketLevelAccess"] is True
    assert bucket.inputs["publicAccessPrevention"] == "enforced"
    accounts = {a.inputs["accountId"]: a for a in plan.of_type("gcp:serviceaccount/account:Account")}
    email = accounts["tpu-cluster-train"].outputs["email"]
    grants = plan.of_type("gcp:storage/bucketIAMMember:BucketIAMMember")
    assert {g.inputs["role"] for g in grants} == {"roles/storage.objectUser", "roles/storage.legacyBucketReader"}
    assert all(g.inputs["bucket"] == bucket.outputs["name"] and g.inputs["member"] == f"serviceAccount:{email}"
               for g in grants)
    # The training identity has no project-wide role: the bucket only.
    assert all(email not in m.inputs["member"] for m in plan.of_type("gcp:projects/iAMMember:IAMMember"))
    binding = plan.only("gcp:serviceaccount/iAMMember:IAMMember").inputs
    assert binding["role"] == "roles/iam.workloadIdentityUser"
    assert binding["member"] == "serviceAccount:example-project.svc.id.goog[default/ray-training]"
    ksa = plan.named("training-ksa").inputs
    assert ksa["metadata"]["annotations"] == {"iam.gke.io/gcp-service-account": email}
    assert not [r for r in plan.resources if r.type == "gcp:serviceaccount/key:Key"]


def test_workload_identity_binding_waits_for_the_cluster():
    plan = plan_for()
    binding = plan.only("gcp:serviceaccount/iAMMember:IAMMember")
    assert plan.only("gcp:container/cluster:Cluster").urn in binding.dependencies


@pytest.mark.parametrize("workloads", [{"enabled": False}, {"jobs": 0}])
def test_platform_only_stack_declares_no_job(workloads):
    plan = plan_for(overrides={"workloads": workloads})
    assert not plan.of_type(RAYJOB)
    assert not plan.of_type("gcp:storage/bucket:Bucket")
    assert plan.outputs["trainingJobs"] == []
    assert plan.of_type("kubernetes:helm.sh/v3:Release")  # the platform is still there


def test_own_namespace_gets_its_own_local_queues(crd_schemas):
    plan = plan_for(overrides={"workloads": {"namespace": "team-a"}})
    queues = [m for m in plan.kubernetes_manifests() if m["kind"] == "LocalQueue"]
    assert {(q["metadata"]["namespace"], q["spec"]["clusterQueue"]) for q in queues} == {
        ("default", "cluster-queue"), ("default", "cluster-queue-dws"),
        ("team-a", "cluster-queue"), ("team-a", "cluster-queue-dws")}
    assert all(validation_errors(q) == [] for q in queues)
    assert {j["metadata"]["namespace"] for j in rayjobs(plan).values()} == {"team-a"}
    namespaces = {m["metadata"]["name"] for m in plan.kubernetes_manifests() if m["kind"] == "Namespace"}
    assert "team-a" in namespaces


BAD_WORKLOADS = [
    ("jobs-negative", {"jobs": -1}, "workloads.jobs"),
    ("namespace-invalid", {"namespace": "Team_A"}, "workloads.namespace"),
    ("prefix-too-long", {"namePrefix": "x" * 40}, "workloads.namePrefix"),
    ("derived-flag-overridden", {"trainingArgs": ["--topology", "2x2"]}, "workloads.trainingArgs"),
    ("run-id-fixed", {"trainingArgs": ["--run-id", "shared"]}, "workloads.trainingArgs"),
    ("training-args-not-strings", {"trainingArgs": ["--steps", 10]}, "workloads.trainingArgs"),
    ("training-flag-unknown", {"trainingArgs": ["--stepz", "10"]}, "workloads.trainingArgs"),
    ("training-flag-bad-value", {"trainingArgs": ["--steps", "ten"]}, "workloads.trainingArgs"),
    ("batch-not-divisible-by-chips", {"trainingArgs": ["--batch-size", "24"]}, "workloads.trainingArgs"),
    ("worker-cpu-exceeds-host", {"workerCpu": "181"}, "workloads.workerCpu"),
    ("worker-memory-not-quantity", {"workerMemory": "16GB"}, "workloads.workerMemory"),
    ("head-memory-exceeds-cpu-node", {"headMemory": "65Gi"}, "workloads.headMemory"),
    ("max-run-over-seven-days", {"maxRunDuration": 700000}, "workloads.maxRunDuration"),
    ("no-retry", {"backoffLimit": 0}, "workloads.backoffLimit"),
    ("checkpoint-every-zero", {"checkpointEvery": 0}, "workloads.checkpointEvery"),
    ("checkpoint-every-not-int", {"checkpointEvery": "100"}, "workloads.checkpointEvery"),
    ("checkpoint-every-in-training-args", {"trainingArgs": ["--checkpoint-every", "5"]}, "workloads.trainingArgs"),
    ("field-typo", {"job": 2}, "workloads.job"),
]


@pytest.mark.parametrize("workloads, key", [pytest.param(w, k, id=i) for i, w, k in BAD_WORKLOADS])
def test_bad_workload_config_is_rejected_by_key(workloads, key):
    engine = OfflineEngine()
    with pytest.raises(SettingsError) as raised:
        engine.run(config_with({"workloads": workloads}))
    assert any(p.startswith(f"tpu-fallback:{key}:") for p in raised.value.problems), raised.value.problems
    assert engine.recorded == []


def test_job_names_say_what_runs_unless_the_stack_names_them():
    # Dev keeps the tutorial's literal in its stack file; others get the slice shape in the name.
    assert plan_for("dev").outputs["trainingJobs"] == ["rayjob-tpu-v6e-dws-1", "rayjob-tpu-v6e-dws-2"]
    assert plan_for("team-c-us-west4-a").outputs["trainingJobs"] == ["rayjob-tpu-v5e-4x4-1", "rayjob-tpu-v5e-4x4-2"]
    assert plan_for("team-b-us-east5-a").outputs["trainingJobs"] == ["rayjob-tpu-v6e-2x4-1", "rayjob-tpu-v6e-2x4-2"]
    named = plan_for("team-c-us-west4-a", {"workloads": {"namePrefix": "llm-pretrain"}})
    assert named.outputs["trainingJobs"] == ["llm-pretrain-1", "llm-pretrain-2"]


def test_tpu7x_workers_one_per_host_of_the_slice_with_its_labels():
    job = next(iter(rayjobs(plan_for("ironwood-us-central1-c")).values()))
    group = worker_group(job)
    assert group["numOfHosts"] == 2  # a 2x2x2 slice: 8 chips on two 4-chip VMs
    spec = group["template"]["spec"]
    assert spec["nodeSelector"] == {"cloud.google.com/gke-tpu-accelerator": "tpu7x",
                                    "cloud.google.com/gke-tpu-topology": "2x2x2"}
    assert spec["containers"][0]["resources"]["limits"]["google.com/tpu"] == "4"
    args = train.build_parser().parse_args(shlex.split(job["spec"]["entrypoint"])[2:])
    assert (args.accelerator_type, args.topology, args.peak_tflops_per_device) == ("TPU-V7X", "2x2x2", 1153.5)
