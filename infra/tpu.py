"""The TPU catalogue: the one table every pool, quota, selector and resource request derives from.

Like xpk's `system_characteristics.py`, but frozen and typed. Nothing else in the project types a
number about a TPU slice: chips, hosts, labels and zones all come from here.

Sources (read 2026-11-29):
- Machine types, chips per VM, topologies, GKE node labels: AI-Hypercomputer/xpk
  `src/xpk/core/system_characteristics.py`; Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus
- vCPUs and memory (GiB) per VM: the GKE cluster autoscaler's machine table (NewMachineTypeInfo entries),
  agreeing with Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus
- Peak bf16 per chip: Ref: https://cloud.google.com/tpu/docs/v6e, https://cloud.google.com/tpu/docs/v5e,
  https://cloud.google.com/tpu/docs/v5p
- Zones: Ref: https://cloud.google.com/tpu/docs/regions-zones (as of 2026-04); flex-start zones: GKE
  "About flex-start provisioning" (as of 2026-04). Zones added later are accepted with
  `tpu.allowUnlistedZone: true`.
- TPU7x (Ironwood), read 2026-12-07: 2 TensorCores per chip, 2,307 bf16 TFLOP/s per chip, 192 GiB HBM per chip,
  224 vCPUs and 960 GB of RAM per 4-chip VM: Ref: https://cloud.google.com/tpu/docs/tpu7x. GKE Standard from 1.34.0-gke.2201000, multi-host pools placed by a
  workload policy instead of a TPU topology: Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/tpu-ironwood.
  Zone us-central1-c: Ref: https://cloud.google.com/tpu/docs/types-zones; flex-start there: Cluster Toolkit's
  examples/gke-consumption-options/dws-flex-start/gke-tpu-7x (a 2x2x2 flex-start pool, zone us-central1-c).
  Topologies: those both xpk (system_characteristics.py) and Ray 2.60 (ray/_private/accelerators/tpu.py,
  VALID_TPU_TOPOLOGY["v7x"]) list. Each TensorCore is a JAX device (no megacore: jax.experimental.pallas.tpu.ChipVersion
  lists 7x without megacore support; Ray: "v7x exposes 2 logical XLA devices per chip"). Not confirmed at a Google
  source: tpu7x-standard-1t's vCPUs and memory (a quarter of the 4-chip VM's, a guess; xpk lists the machine type
  with topology 1x1x1, which Ray 2.60's TPU table lacks: the training jobs are refused there), and which TPU7x zones offer Spot VMs.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from types import MappingProxyType

# The date the zone lists below were read from Google's pages; error messages quote it.
ZONES_AS_OF = "2026-04"


class Placement(enum.Enum):
    """How GKE places the VMs of a multi-host slice; infra/tpu_pool.py has one function per kind."""

    TPU_TOPOLOGY = "tpu_topology"  # the pool's placement policy names the topology (v5e, v5p, v6e)
    # A Compute Engine workload policy (a resource policy of type high throughput with the slice's accelerator
    # topology), named by the pool's placement policy instead. Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/tpu-ironwood
    WORKLOAD_POLICY = "workload_policy"


@dataclass(frozen=True)
class TpuGeneration:
    name: str
    accelerator_label: str  # value of the GKE node label cloud.google.com/gke-tpu-accelerator
    ray_accelerator_type: str  # ray.train ScalingConfig(accelerator_type=...)
    peak_bf16_tflops_per_chip: float
    topology_rank: int  # 2D torus (v5e, v6e) or 3D torus (v5p, TPU7x)
    multi_host_topologies: tuple[str, ...]
    zones: frozenset[str]
    flex_start_zones: frozenset[str]
    min_gke_version: str
    # JAX devices per chip: 1 where a chip is one device (v5e, v6e one core; v5p its two cores as one megacore),
    # 2 on TPU7x, whose two TensorCores are each a device. The mesh, the batch split and MFU count devices.
    devices_per_chip: int = 1
    tensorcores_per_chip: int = 1  # what Google's slice names count on v5p and TPU7x (tpu7x-8 is 4 chips)
    placement: Placement = Placement.TPU_TOPOLOGY
    # Where a config error sends the user: the page with the generation's GKE minimum, and its zones' page.
    source: str = "https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus"
    zones_source: str = "https://cloud.google.com/tpu/docs/regions-zones"
    zones_as_of: str = ZONES_AS_OF

    @property
    def peak_bf16_tflops_per_device(self) -> float:
        return self.peak_bf16_tflops_per_chip / self.devices_per_chip


@dataclass(frozen=True)
class TpuMachineType:
    name: str
    generation: TpuGeneration
    chips_per_host: int
    vcpus: int
    memory_gib: int
    single_host_topology: str
    multi_host: bool  # only the 4-chip VMs can form multi-host slices
    # Whether Ray's TPU slice reservation (JaxTrainer's SlicePlacementGroup, which the training jobs use) knows the
    # machine's single-host topology: Ray 2.60's VALID_TPU_TOPOLOGY (ray/_private/accelerators/tpu.py) has no v7x
    # 1x1x1. tests/test_train.py checks every row against Ray's own table.
    ray_trains_single_host: bool = True

    def topologies(self) -> tuple[str, ...]:
        extra = self.generation.multi_host_topologies if self.multi_host else ()
        return (self.single_host_topology, *extra)


@dataclass(frozen=True)
class TpuSlice:
    """One slice shape: a machine type and a topology, with everything a pool or a job needs."""

    machine_type: TpuMachineType
    topology: str

    @property
    def generation(self) -> TpuGeneration:
        return self.machine_type.generation

    @property
    def chips(self) -> int:
        return math.prod(int(d) for d in self.topology.split("x"))

    @property
    def chips_per_host(self) -> int:
        return self.machine_type.chips_per_host

    @property
    def hosts(self) -> int:
        return self.chips // self.chips_per_host

    @property
    def is_multi_host(self) -> bool:
        return self.hosts > 1

    @property
    def devices(self) -> int:
        """JAX devices of the whole slice: what the global batch is split over."""
        return self.chips * self.generation.devices_per_chip

    @property
    def needs_workload_policy(self) -> bool:
        """A multi-host slice of a generation GKE places by a workload policy (single-host pools have none)."""
        return self.is_multi_host and self.generation.placement is Placement.WORKLOAD_POLICY

    @property
    def accelerator_label(self) -> str:
        return self.generation.accelerator_label

    @property
    def pod_type(self) -> str:
        """The name Google and Ray give this slice, e.g. v6e-16, tpu7x-16 (8 chips: TPU7x and v5p count cores)."""
        return f"{self.generation.name}-{self.chips * self.generation.tensorcores_per_chip}"


V6E = TpuGeneration(
    name="v6e",
    accelerator_label="tpu-v6e-slice",
    ray_accelerator_type="TPU-V6E",
    peak_bf16_tflops_per_chip=918.0,
    topology_rank=2,
    multi_host_topologies=("2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
    zones=frozenset({
        "us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b",
        "europe-west4-a", "asia-northeast1-b",
    }),
    flex_start_zones=frozenset({"us-east5-a", "us-east5-b", "asia-northeast1-b"}),
    min_gke_version="1.31.2-gke.1115000",
)
V5E = TpuGeneration(
    name="v5e",
    accelerator_label="tpu-v5-lite-podslice",
    ray_accelerator_type="TPU-V5LITEPOD",
    peak_bf16_tflops_per_chip=197.0,
    topology_rank=2,
    multi_host_topologies=("2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
    zones=frozenset({"us-central1-a", "us-south1-a", "us-west1-c", "us-west4-a"}),
    flex_start_zones=frozenset({"us-west4-a"}),
    min_gke_version="1.27.6",
)
V5P = TpuGeneration(
    name="v5p",
    accelerator_label="tpu-v5p-slice",
    ray_accelerator_type="TPU-V5P",
    peak_bf16_tflops_per_chip=459.0,
    topology_rank=3,
    multi_host_topologies=(
        "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8",
        "8x8x16", "8x16x16", "16x16x16", "16x16x24",
    ),
    zones=frozenset({"us-central1-a", "us-east5-a"}),
    flex_start_zones=frozenset({"us-east5-a"}),
    min_gke_version="1.28.7-gke.1020000",
    tensorcores_per_chip=2,  # one megacore: one JAX device per chip
)

TPU7X = TpuGeneration(
    name="tpu7x",
    accelerator_label="tpu7x",
    ray_accelerator_type="TPU-V7X",
    peak_bf16_tflops_per_chip=2307.0,
    topology_rank=3,
    multi_host_topologies=("2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16", "8x16x16"),
    zones=frozenset({"us-central1-c"}),
    flex_start_zones=frozenset({"us-central1-c"}),
    min_gke_version="1.34.0-gke.2201000",
    devices_per_chip=2,
    tensorcores_per_chip=2,
    placement=Placement.WORKLOAD_POLICY,
    source="https://cloud.google.com/kubernetes-engine/docs/concepts/tpu-ironwood",
    zones_source="https://cloud.google.com/tpu/docs/types-zones",
    zones_as_of="2026-12",
)

MACHINE_TYPES: MappingProxyType[str, TpuMachineType] = MappingProxyType({
    m.name: m
    for m in (
        TpuMachineType("ct6e-standard-1t", V6E, 1, 44, 176, "1x1", multi_host=False),
        TpuMachineType("ct6e-standard-4t", V6E, 4, 180, 720, "2x2", multi_host=True),
        TpuMachineType("ct6e-standard-8t", V6E, 8, 180, 1440, "2x4", multi_host=False),
        TpuMachineType("ct5lp-hightpu-1t", V5E, 1, 24, 48, "1x1", multi_host=False),
        TpuMachineType("ct5lp-hightpu-4t", V5E, 4, 112, 192, "2x2", multi_host=True),
        TpuMachineType("ct5lp-hightpu-8t", V5E, 8, 224, 384, "2x4", multi_host=False),
        TpuMachineType("ct5p-hightpu-4t", V5P, 4, 208, 448, "2x2x1", multi_host=True),
        # tpu7x-standard-1t's vCPUs and memory: not confirmed at a Google source (see the module docstring).
        TpuMachineType("tpu7x-standard-4t", TPU7X, 4, 224, 960, "2x2x1", multi_host=True),
        TpuMachineType("tpu7x-standard-1t", TPU7X, 1, 56, 240, "1x1x1", multi_host=False,
                       ray_trains_single_host=False),
    )
})

# GKE node labels and taints that GKE itself puts on TPU nodes.
# Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/tpus
ACCELERATOR_LABEL_KEY = "cloud.google.com/gke-tpu-accelerator"
TOPOLOGY_LABEL_KEY = "cloud.google.com/gke-tpu-topology"


def lookup_slice(machine_type: str, topology: str) -> TpuSlice:
    """The slice for a machine type and topology, or ValueError saying what is allowed."""
    machine = MACHINE_TYPES.get(machine_type)
    if machine is None:
        raise ValueError(f"unknown TPU machine type {machine_type!r}; known: {', '.join(MACHINE_TYPES)}")
    if topology not in machine.topologies():
        raise ValueError(
            f"topology {topology!r} is not valid for {machine_type}; allowed: {', '.join(machine.topologies())}"
        )
    return TpuSlice(machine, topology)
