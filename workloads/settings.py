"""Settings of the training jobs (`tpu-fallback:workloads`), validated with the platform's settings."""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infra.settings import ConfigReader, PlatformSettings, key_default
from workloads import train

# The table's (infra/settings/keys_roles.py): each field's one default, its range and why, in one place.
WORKLOAD_DEFAULTS: Mapping[str, Any] = key_default("workloads")

# Flags the workloads module derives from the platform; a user value would contradict the slice.
DERIVED_FLAGS = ("--use-tpu", "--topology", "--accelerator-type", "--num-workers", "--chips-per-host",
                 "--peak-tflops-per-device", "--storage-path", "--checkpoint-dir", "--run-name",
                 "--run-id",  # each run's own (RAY_CLUSTER_NAME): two runs of a job never share checkpoint files
                 "--checkpoint-every", "--notice-file")  # workloads.checkpointEvery; the preStop hook's file
MAX_CHECKPOINT_EVERY = 100_000  # a sanity bound: more steps than that between checkpoints is no checkpointing
MAX_RUN_DURATION = 7 * 24 * 3600  # DWS nodes run for up to seven days
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_CPU = re.compile(r"^([0-9]+)(m)?$")
# An image reference without tag or digest: [registry[:port]/]path, lowercase path components.
# Ref: https://github.com/distribution/reference/blob/main/regexp.go
_IMAGE_REPOSITORY = re.compile(r"^(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$")
_MEMORY = re.compile(r"^([0-9]+)(Mi|Gi)$")


@dataclass(frozen=True)
class WorkloadSettings:
    enabled: bool
    jobs: int
    namespace: str
    name_prefix: str
    head_cpu: str
    head_memory: str
    worker_cpu: str
    worker_memory: str
    training_args: tuple[str, ...]
    checkpoint_every: int
    max_run_duration_seconds: int
    backoff_limit: int
    ray_image_repository: str

    def job_names(self) -> tuple[str, ...]:
        return tuple(f"{self.name_prefix}-{i}" for i in range(1, self.jobs + 1))


def cpu_cores(value: str) -> float | None:
    match = _CPU.match(value)
    return None if match is None else int(match[1]) / (1000 if match[2] else 1)


def memory_gib(value: str) -> float | None:
    match = _MEMORY.match(value)
    return None if match is None else int(match[1]) / (1024 if match[2] == "Mi" else 1)


def _check_training_args(reader: ConfigReader, args: list[str], platform: PlatformSettings | None) -> None:
    """The flags must be ones train.py knows, with valid values, and must not contradict the slice."""
    clash = sorted({a.split("=", 1)[0] for a in args} & set(DERIVED_FLAGS))
    if not reader.check("workloads.trainingArgs", not clash,
                        f"{', '.join(clash)} are derived from the platform (slice, bucket, job name); remove them"):
        return
    parser = train.build_parser()
    parser.exit_on_error = False
    try:
        parsed, unknown = parser.parse_known_args(args)
    except argparse.ArgumentError as err:
        reader.fail("workloads.trainingArgs", f"train.py rejects them: {err}")
        return
    if not reader.check("workloads.trainingArgs", not unknown,
                        f"train.py has no flag(s) {' '.join(unknown)}; see python workloads/train.py --help"):
        return
    if platform is None:
        return  # the slice is unreadable (reported under its own key): nothing to compare the batch with
    tpu = platform.tpu  # the global batch is split evenly across the slice's JAX devices (2 per chip on TPU7x)
    unit = "chips" if tpu.generation.devices_per_chip == 1 else f"JAX devices ({tpu.chips} chips)"
    reader.check("workloads.trainingArgs", parsed.batch_size % tpu.devices == 0,
                 f"--batch-size {parsed.batch_size} is not a multiple of the slice's {tpu.devices} {unit}")


def default_name_prefix(platform: PlatformSettings | None) -> str:
    """Job names that say what runs: rayjob-tpu-<generation>-<topology>, e.g. rayjob-tpu-v5e-4x4."""
    if platform is None:
        return "rayjob-tpu"
    return f"rayjob-tpu-{platform.tpu.generation.name}-{platform.tpu.topology}"


def read_workload_settings(reader: ConfigReader, platform: PlatformSettings | None) -> WorkloadSettings | None:
    """The workloads' settings, checked in the same pass as the platform's; the checks that compare them with
    the machines run when the platform's shapes are readable."""
    raw = reader.obj("workloads", WORKLOAD_DEFAULTS)
    reader.check("workloads.jobs", 0 <= raw["jobs"] <= 50, f"{raw['jobs']} is out of range; use 0 to 50")
    reader.check("workloads.namespace", bool(_DNS_LABEL.match(raw["namespace"])) and len(raw["namespace"]) <= 63,
                 f"{raw['namespace']!r} is not a Kubernetes namespace name")
    name_prefix = raw["namePrefix"] or default_name_prefix(platform)
    longest = f"{name_prefix}-{max(raw['jobs'], 1)}"
    # KubeRay names the head service <rayjob>-<random>-head-svc; the RayJob name must leave room for that.
    reader.check("workloads.namePrefix", bool(_DNS_LABEL.match(name_prefix)) and len(longest) <= 40,
                 f"{name_prefix!r}: job names like {longest!r} must be DNS labels of at most 40 characters")
    for field, parse in (("headCpu", cpu_cores), ("headMemory", memory_gib), ("workerCpu", cpu_cores),
                         ("workerMemory", memory_gib)):
        amount = parse(raw[field])
        if amount is None:
            reader.fail(f"workloads.{field}", f"{raw[field]!r} is not a quantity like "
                                              f"{WORKLOAD_DEFAULTS[field]!r}")
        elif platform is not None:
            host_machine = platform.system_pool.machine if field.startswith("head") else platform.tpu.machine_type
            capacity = (host_machine.vcpus if field.endswith("Cpu") else host_machine.memory_gib)
            unit, host = ("vCPUs" if field.endswith("Cpu") else "GiB"), host_machine.name
            reader.check(f"workloads.{field}", 0 < amount <= capacity,
                         f"{raw[field]} does not fit one {host} ({capacity} {unit})")
    if platform is not None and raw["enabled"] and raw["jobs"] > 0:
        tpu = platform.tpu
        reader.check("tpu.machineType", tpu.machine_type.ray_trains_single_host or tpu.is_multi_host,
                     f"{tpu.machine_type.name} ({tpu.topology}): Ray's TPU slice reservation, which the training jobs' "
                     f"JaxTrainer makes, has no {tpu.generation.ray_accelerator_type} {tpu.topology} slice (Ray "
                     "2.60, ray/_private/accelerators/tpu.py VALID_TPU_TOPOLOGY); use another machine type, or "
                     "set workloads.jobs to 0")
    args = raw["trainingArgs"]
    if reader.check("workloads.trainingArgs", all(isinstance(a, str) for a in args),
                    "must be a list of strings, e.g. [\"--steps\", \"200\"]"):
        _check_training_args(reader, args, platform)
    reader.check("workloads.checkpointEvery", type(raw["checkpointEvery"]) is int
                 and 1 <= raw["checkpointEvery"] <= MAX_CHECKPOINT_EVERY,
                 f"{raw['checkpointEvery']!r} is out of range; use 1 to {MAX_CHECKPOINT_EVERY} steps (a slice lost "
                 "without notice costs up to this many)")
    reader.check("workloads.maxRunDuration", 0 < raw["maxRunDuration"] <= MAX_RUN_DURATION,
                 f"{raw['maxRunDuration']} is out of range; use 1 to {MAX_RUN_DURATION} seconds (7 days)")
    reader.check("workloads.rayImageRepository", bool(_IMAGE_REPOSITORY.match(raw["rayImageRepository"])),
                 f"{raw['rayImageRepository']!r} is not an image repository like rayproject/ray or "
                 "registry.example.com:5000/mirror/rayproject/ray (no tag: the tag comes from the Ray pin)")
    reader.check("workloads.backoffLimit", 1 <= raw["backoffLimit"] <= 10,
                 f"{raw['backoffLimit']} is out of range; use 1 to 10 (each retry resumes from the checkpoint)")
    if reader.problems:
        return None
    return WorkloadSettings(
        enabled=raw["enabled"], jobs=raw["jobs"], namespace=raw["namespace"], name_prefix=name_prefix,
        head_cpu=raw["headCpu"], head_memory=raw["headMemory"], worker_cpu=raw["workerCpu"],
        worker_memory=raw["workerMemory"], training_args=tuple(args), checkpoint_every=raw["checkpointEvery"],
        max_run_duration_seconds=raw["maxRunDuration"], backoff_limit=raw["backoffLimit"],
        ray_image_repository=raw["rayImageRepository"],
    )
