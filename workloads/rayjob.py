"""The RayJob of one training run, as a plain manifest derived from the slice shape and the runtime pins.

Follows the seed's `rayjob-tpu-v6e-dws.yaml`, with everything it typed by hand derived instead.
Ref: https://cloud.google.com/kubernetes-engine/docs/tutorials/ray-kueue-dws
"""

from __future__ import annotations

import functools
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

from failover.api import TPU_RESOURCE
from infra.kueue import NODE_POOL_LABEL, QUEUED_TAINT_KEY, tolerate_no_schedule
from infra.settings import NodeShutdown, PlatformSettings
from infra.tpu import ACCELERATOR_LABEL_KEY, TOPOLOGY_LABEL_KEY
from workloads.settings import WorkloadSettings
from workloads.train import DEFAULT_NOTICE_FILE, DEFAULT_POD_ANNOTATIONS_FILE

RUNTIME_REQUIREMENTS = Path(__file__).resolve().parent / "requirements-runtime.txt"
SCRIPT_PATH = Path(__file__).resolve().parent / "train.py"
# GKE shuts a preempted Spot VM down gracefully, the pods first, in their part of the notice (15 s of GKE's default
# 30 s, 105 s of 120 s: `spot.gracefulTermination`, infra/settings NodeShutdown). The kubelet runs the preStop hook
# first, then sends SIGTERM, which `ray start --block` answers with a 30 s drain (Ray 2.60) that never reaches the
# training workers in time. So the hook itself tells them (train.py --notice-file) and waits while they save the step
# they reached: until train.py has consumed the notice (it removes the file once saved), at most the pods' part less
# SIGTERM_SECONDS. The pods' terminationGracePeriodSeconds is the pods' part: on a node's shutdown the kubelet gives a
# pod the lesser of the two, so a longer part needs a longer grace period. docs/disruptions.md has the timeline.
# Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms
# Ref: https://kubernetes.io/docs/concepts/cluster-administration/node-shutdown/#graceful-node-shutdown
SIGTERM_SECONDS = 5  # the end of the pods' part, left to `ray start` to stop the host's Ray processes before the kill
SCRIPT_MOUNT = "/app"
SCRIPT_KEY = "train.py"
RAY_IMAGE_REPOSITORY = "rayproject/ray"
PYTHON_TAG = "py311"  # the image's Python; the tests run the same minor version
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
ELASTIC_ANNOTATION = "kueue.x-k8s.io/elastic-job"
MAX_RUN_ANNOTATION = "provreq.kueue.x-k8s.io/maxRunDurationSeconds"
# pulumi-kubernetes deletes in the foreground by default. A RayJob whose Workload waits on a DWS request can then
# hang: Kueue re-creates the ProvisioningRequest while the garbage collector deletes it (measured on the real
# tier, tests/test_controlplane_destroy.py). Deleted in the background, the job goes at once and its Workload after.
# Ref: https://github.com/pulumi/pulumi-kubernetes/pull/3011 (the annotation, pulumi-kubernetes 4.12)
DELETION_POLICY_ANNOTATION = "pulumi.com/deletionPropagationPolicy"


@dataclass(frozen=True)
class RuntimePins:
    """The training job's versions, read from workloads/requirements-runtime.txt (their one place)."""

    ray: str
    packages: tuple[str, ...]  # pip requirements for the runtime env, as the cluster installs them

    def image(self, repository: str = RAY_IMAGE_REPOSITORY) -> str:
        """The Ray image at the pinned version, from Docker Hub or a mirror of it (`workloads.rayImageRepository`)."""
        return f"{repository}:{self.ray}-{PYTHON_TAG}"


@functools.cache  # read once per program run, not once per RayJob
def runtime_pins(path: Path = RUNTIME_REQUIREMENTS) -> RuntimePins:
    ray, packages = None, []
    for line in path.read_text().splitlines():
        requirement = line.split("#", 1)[0].strip()
        if not requirement:
            continue
        name, _, version = requirement.partition("==")
        if not version:
            raise ValueError(f"{path.name}: {requirement!r} is not pinned with ==")
        base = name.split("[", 1)[0]
        if base == "ray":
            ray = version  # comes with the image
        elif base == "jax":
            packages.append(f"jax[tpu]=={version}")  # libtpu on the cluster, the CPU build in tests
        else:
            packages.append(requirement)
    if ray is None:
        raise ValueError(f"{path.name} pins no ray version")
    return RuntimePins(ray, tuple(packages))


def entrypoint(platform: PlatformSettings, settings: WorkloadSettings, job_name: str, bucket: str) -> str:
    """`python train.py` with the slice-derived flags first, then the user's training flags."""
    tpu = platform.tpu
    run = f"gs://{bucket}/{job_name}"
    flags = [
        "--use-tpu", "--topology", tpu.topology, "--accelerator-type", tpu.generation.ray_accelerator_type,
        "--num-workers", str(tpu.hosts), "--chips-per-host", str(tpu.chips_per_host),
        # Per JAX device: train.py divides the model's FLOP/s by the devices JAX counts (a TensorCore on TPU7x).
        "--peak-tflops-per-device", f"{tpu.generation.peak_bf16_tflops_per_device:g}",
        # A fixed run name and storage: a RayJob retry (a new RayCluster) resumes from the checkpoints.
        "--run-name", job_name, "--storage-path", f"gs://{bucket}/ray", "--checkpoint-dir", f"{run}/orbax",
        "--checkpoint-every", str(settings.checkpoint_every),
        # Goodput records beside the checkpoints: the training's service account may write the bucket only. Cloud
        # Logging (`--goodput-logger cloud`) needs roles/logging.logWriter and roles/logging.viewer on the project,
        # rights over every log of it, so it is the user's choice (docs/goodput.md).
        "--goodput-logger", "file",
    ]
    return shlex.join(["python", f"{SCRIPT_MOUNT}/{SCRIPT_KEY}", *flags, *settings.training_args])


def notice_save_seconds(shutdown: NodeShutdown) -> int:
    """How long the preStop hook waits at most for the training's save: the pods' part, less the SIGTERM's end."""
    return shutdown.pods_seconds - SIGTERM_SECONDS


def termination_notice_hook(seconds: int, notice_file: str = DEFAULT_NOTICE_FILE) -> dict:
    """The TPU workers' preStop hook: the termination notice train.py looks for after each step, then a wait, once a
    second, until train.py has consumed it (saved) or `seconds` have passed, before the kubelet's SIGTERM. Ending at
    the save keeps a pod deleted for a move or an eviction from waiting out the whole notice."""
    directory = notice_file.rsplit("/", 1)[0]
    notice = shlex.quote(notice_file)
    return {"preStop": {"exec": {"command": [
        "/bin/sh", "-c", shlex.join(["mkdir", "-p", directory]) + " && " + shlex.join(["touch", notice_file])
        + f' && i=0 && while [ "$i" -lt {seconds} ] && [ -e {notice} ]; do sleep 1; i=$((i + 1)); done']}}}


def pod_annotations_volume(annotations_file: str = DEFAULT_POD_ANNOTATIONS_FILE) -> tuple[dict, dict]:
    """The TPU workers' own annotations as a file (a downwardAPI volume), where train.py reads the failover
    controller's checkpoint request (failover/checkpoints.py): the job needs no API access for it. Mounted whole: the
    kubelet refreshes a downwardAPI volume when it syncs the pod (at the latest at its sync period, 1 minute by
    default), never one mounted with subPath.
    Ref: https://kubernetes.io/docs/concepts/storage/volumes/#downwardapi"""
    directory, _, name = annotations_file.rpartition("/")
    volume = {"name": "pod-annotations", "downwardAPI": {"items": [
        {"path": name, "fieldRef": {"fieldPath": "metadata.annotations"}}]}}
    return volume, {"name": "pod-annotations", "mountPath": directory, "readOnly": True}


def max_replicas(platform: PlatformSettings) -> int:
    """Slices one job may scale to: a job keeps the flavor it was admitted on, so the largest plan bounds it."""
    return max(plan.max_slices for plan in platform.plans)


def _script_volume(configmap: str) -> tuple[dict, dict]:
    volume = {"name": "train-script", "configMap": {"name": configmap}}
    mount = {"name": "train-script", "mountPath": SCRIPT_MOUNT}
    return volume, mount


# KubeRay's labels on a worker pod: its group, its RayCluster, and (KubeRay 1.6's RayMultiHostIndexing, on by default)
# the multi-host replica it belongs to, one replica being one slice.
# Ref: https://github.com/ray-project/kuberay/blob/v1.6.2/ray-operator/controllers/ray/utils/constant.go
RAY_GROUP_LABEL = "ray.io/group"
RAY_CLUSTER_LABEL = "ray.io/cluster"
RAY_REPLICA_LABEL = "ray.io/worker-group-replica-name"
WORKER_GROUP = "tpu-group"


def one_slice_affinity() -> dict:
    """A multi-host run's workers on the hosts of one slice, and no other run's workers there.

    GKE makes each multi-host slice a node pool of its own (infra/tpu_pool.py: one pool per slice), so the pool label
    is the slice. Without this, the scheduler is free to spread a run over the free hosts of two slices of the same
    rung: measured on the tier, a 4x4 run got 2 hosts of one slice and 2 of another after a reclaim left both half
    free. The first worker goes to any pool with room for it; the others follow it (pod affinity on their own run,
    `matchLabelKeys`: GA in Kubernetes 1.33, beta and on by default since 1.31); another run's workers stay off that
    pool (anti-affinity). A replica name, where KubeRay gives one, keeps each slice of a job scaled to more than one
    together; without it (KubeRay before 1.6, or its RayMultiHostIndexing gate off) the key is ignored and the whole
    RayCluster is kept on one slice, which is the same for the one replica a job starts with.
    Ref: https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#matchlabelkeys-and-mismatchlabelkeys
    """
    workers = {"matchLabels": {RAY_GROUP_LABEL: WORKER_GROUP}}
    return {
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": workers, "matchLabelKeys": [RAY_CLUSTER_LABEL, RAY_REPLICA_LABEL],
            "topologyKey": NODE_POOL_LABEL}]},
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": workers, "mismatchLabelKeys": [RAY_CLUSTER_LABEL],
            "topologyKey": NODE_POOL_LABEL}]},
    }


def _resources(cpu: str, memory: str, tpu_chips: int = 0) -> dict:
    amounts = {"cpu": cpu, "memory": memory, **({TPU_RESOURCE: str(tpu_chips)} if tpu_chips else {})}
    return {"requests": dict(amounts), "limits": dict(amounts)}


def rayjob_manifest(platform: PlatformSettings, settings: WorkloadSettings, job_name: str,
                    configmap: str, bucket: str, service_account: str, local_queue: str) -> dict:
    tpu, pins = platform.tpu, runtime_pins()
    plan_b = platform.flex_start is not None
    volume, mount = _script_volume(configmap)
    annotations_volume, annotations_mount = pod_annotations_volume()
    annotations = {
        ELASTIC_ANNOTATION: "true",  # Kueue admits in-tree autoscaling only for elastic jobs
        DELETION_POLICY_ANNOTATION: "background",
    }
    if plan_b:
        annotations[MAX_RUN_ANNOTATION] = str(settings.max_run_duration_seconds)
    tolerations = [tolerate_no_schedule(TPU_RESOURCE)]
    if plan_b:
        tolerations.append(tolerate_no_schedule(QUEUED_TAINT_KEY))
    replicas = max_replicas(platform)
    shutdown = platform.spot_shutdown
    head = {
        "rayStartParams": {},
        "template": {"spec": {
            "serviceAccountName": service_account,
            "nodeSelector": {NODE_POOL_LABEL: platform.system_pool.name},
            "containers": [{
                "name": "ray-head",
                "image": pins.image(settings.ray_image_repository),
                "ports": [{"containerPort": 6379, "name": "gcs-server"},
                          {"containerPort": 8265, "name": "dashboard"},
                          {"containerPort": 10001, "name": "client"}],
                "resources": _resources(settings.head_cpu, settings.head_memory),
                "volumeMounts": [mount],
            }],
            "volumes": [volume],
        }},
    }
    worker = {
        "groupName": WORKER_GROUP,
        "replicas": 1,
        "minReplicas": 1,  # Ray 2.53's slice reservation waits only 100 s for a slice from zero
        "maxReplicas": replicas,
        "numOfHosts": tpu.hosts,
        "rayStartParams": {},
        "template": {"spec": {
            "serviceAccountName": service_account,
            "nodeSelector": {ACCELERATOR_LABEL_KEY: tpu.accelerator_label, TOPOLOGY_LABEL_KEY: tpu.topology},
            "tolerations": tolerations,
            "terminationGracePeriodSeconds": shutdown.pods_seconds,
            "containers": [{
                "name": "ray-worker",
                "image": pins.image(settings.ray_image_repository),
                "env": [{"name": "JAX_PLATFORMS", "value": "tpu,cpu"}],
                "resources": _resources(settings.worker_cpu, settings.worker_memory, tpu.chips_per_host),
                "volumeMounts": [mount, annotations_mount],
                "lifecycle": termination_notice_hook(notice_save_seconds(shutdown)),
            }],
            "volumes": [volume, annotations_volume],
        }},
    }
    if tpu.is_multi_host:
        worker["template"]["spec"]["affinity"] = one_slice_affinity()
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": job_name, "namespace": settings.namespace,
                     "labels": {QUEUE_LABEL: local_queue}, "annotations": annotations},
        "spec": {
            "entrypoint": entrypoint(platform, settings, job_name, bucket),
            "runtimeEnvYAML": yaml.safe_dump({"pip": list(pins.packages)}, sort_keys=False),
            # Kueue requires it; the cluster goes once the job ends, so its TPUs go back to the queue.
            "shutdownAfterJobFinishes": True,
            # Each retry is a new RayCluster that resumes from the run's checkpoints.
            "backoffLimit": settings.backoff_limit,
            "rayClusterSpec": {
                "enableInTreeAutoscaling": True,
                "headGroupSpec": head,
                "workerGroupSpecs": [worker],
            },
        },
    }
