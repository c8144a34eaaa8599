"""Shapes of the general-purpose machine types the CPU pool may use, for Kueue's cpu/memory quotas.

Ref: https://cloud.google.com/compute/docs/general-purpose-machines (predefined shapes, read 2026-11).
"""

from __future__ import annotations

from dataclasses import dataclass

# family -> (GiB of memory per vCPU for standard/highmem/highcpu, the vCPU counts offered)
_FAMILIES: dict[str, tuple[dict[str, int], tuple[int, ...]]] = {
    "n2": ({"standard": 4, "highmem": 8, "highcpu": 1}, (2, 4, 8, 16, 32, 48, 64, 80, 96, 128)),
    "n2d": ({"standard": 4, "highmem": 8, "highcpu": 1}, (2, 4, 8, 16, 32, 48, 64, 80, 96, 128, 224)),
    "e2": ({"standard": 4, "highmem": 8, "highcpu": 1}, (2, 4, 8, 16, 32)),
    "c3": ({"standard": 4, "highmem": 8, "highcpu": 2}, (4, 8, 22, 44, 88, 176)),
    "n4": ({"standard": 4, "highmem": 8, "highcpu": 2}, (2, 4, 8, 16, 32, 48, 64, 80)),
}


@dataclass(frozen=True)
class CpuMachineType:
    name: str
    vcpus: int
    memory_gib: int


def lookup_cpu_machine(name: str) -> CpuMachineType:
    """The shape of a predefined machine type such as n2-standard-16, or ValueError saying what is allowed."""
    parts = name.split("-")
    allowed = "<family>-<standard|highmem|highcpu>-<vCPUs> with family one of " + ", ".join(_FAMILIES)
    if len(parts) != 3 or parts[0] not in _FAMILIES or not parts[2].isdigit():
        raise ValueError(f"unsupported machine type {name!r}; expected {allowed}")
    family, shape, count = parts[0], parts[1], int(parts[2])
    per_vcpu, counts = _FAMILIES[family]
    if shape not in per_vcpu or count not in counts:
        raise ValueError(
            f"{name!r} is not a predefined {family} shape; shapes: {', '.join(per_vcpu)}, "
            f"vCPUs: {', '.join(map(str, counts))}"
        )
    return CpuMachineType(name, count, count * per_vcpu[shape])
