"""The TPU catalogue is consistent with itself and with GKE's slice rules."""

from __future__ import annotations

import math

import pytest

from infra.tpu import MACHINE_TYPES, TPU7X, V5E, V5P, V6E, Placement, lookup_slice

ALL_SHAPES = [(m.name, t) for m in MACHINE_TYPES.values() for t in m.topologies()]


@pytest.mark.parametrize("machine_type, topology", ALL_SHAPES)
def test_every_shape_fills_whole_hosts(machine_type, topology):
    tpu = lookup_slice(machine_type, topology)
    assert len(topology.split("x")) == tpu.generation.topology_rank or topology == tpu.machine_type.single_host_topology
    assert tpu.hosts * tpu.chips_per_host == tpu.chips
    assert tpu.is_multi_host == (topology != tpu.machine_type.single_host_topology)


@pytest.mark.parametrize("machine_type, topology, chips, hosts", [
    ("ct6e-standard-4t", "4x4", 16, 4),  # the seed: numOfHosts 4, google.com/tpu 4 per host
    ("ct6e-standard-4t", "2x4", 8, 2),
    ("ct6e-standard-8t", "2x4", 8, 1),
    ("ct6e-standard-1t", "1x1", 1, 1),
    ("ct5lp-hightpu-4t", "16x16", 256, 64),
    ("ct5p-hightpu-4t", "2x2x1", 4, 1),
    ("ct5p-hightpu-4t", "4x4x8", 128, 32),
    ("tpu7x-standard-4t", "2x2x1", 4, 1),  # one VM: 4 chips
    ("tpu7x-standard-4t", "2x2x2", 8, 2),
    ("tpu7x-standard-4t", "4x4x4", 64, 16),
    ("tpu7x-standard-1t", "1x1x1", 1, 1),
])
def test_known_slices(machine_type, topology, chips, hosts):
    tpu = lookup_slice(machine_type, topology)
    assert (tpu.chips, tpu.hosts) == (chips, hosts)


@pytest.mark.parametrize("machine_type, topology, pod_type", [
    ("ct6e-standard-4t", "4x4", "v6e-16"),  # v5e and v6e names count chips
    ("ct5p-hightpu-4t", "2x2x1", "v5p-8"),  # v5p and TPU7x names count TensorCores
    ("tpu7x-standard-4t", "2x2x1", "tpu7x-8"),
    ("tpu7x-standard-4t", "2x2x2", "tpu7x-16"),
])
def test_pod_type_names_the_slice_as_google_does(machine_type, topology, pod_type):
    assert lookup_slice(machine_type, topology).pod_type == pod_type


def test_labels_are_gke_accelerator_values():
    assert {g.accelerator_label for g in (V6E, V5E, V5P, TPU7X)} == {
        "tpu-v6e-slice", "tpu-v5-lite-podslice", "tpu-v5p-slice", "tpu7x"}


@pytest.mark.parametrize("machine_type, topology, devices", [
    ("ct6e-standard-4t", "4x4", 16),  # one device per chip
    ("ct5p-hightpu-4t", "2x2x2", 8),  # a megacore: two cores, one device
    ("tpu7x-standard-4t", "2x2x2", 16),  # each of a chip's two TensorCores is a device
    ("tpu7x-standard-1t", "1x1x1", 2),
])
def test_devices_are_what_jax_counts(machine_type, topology, devices):
    assert lookup_slice(machine_type, topology).devices == devices


@pytest.mark.parametrize("machine_type, topology", ALL_SHAPES)
def test_peak_per_device_times_devices_is_the_slice_peak(machine_type, topology):
    tpu = lookup_slice(machine_type, topology)
    generation = tpu.generation
    assert generation.peak_bf16_tflops_per_device * tpu.devices == generation.peak_bf16_tflops_per_chip * tpu.chips


def test_tpu7x_peak_is_googles():
    assert TPU7X.peak_bf16_tflops_per_chip == 2307 and TPU7X.peak_bf16_tflops_per_device == 1153.5


@pytest.mark.parametrize("machine_type, topology", ALL_SHAPES)
def test_only_multi_host_tpu7x_slices_need_a_workload_policy(machine_type, topology):
    tpu = lookup_slice(machine_type, topology)
    assert tpu.needs_workload_policy == (tpu.generation is TPU7X and tpu.is_multi_host)
    assert (tpu.generation.placement is Placement.WORKLOAD_POLICY) == (tpu.generation is TPU7X)


@pytest.mark.parametrize("generation", [V6E, V5E, V5P, TPU7X])
def test_flex_start_zones_offer_the_generation(generation):
    assert generation.flex_start_zones <= generation.zones


def test_only_four_chip_machines_form_multi_host_slices():
    for machine in MACHINE_TYPES.values():
        assert machine.multi_host == (machine.chips_per_host == 4)
        for topology in machine.generation.multi_host_topologies:
            assert math.prod(map(int, topology.split("x"))) % machine.chips_per_host == 0


@pytest.mark.parametrize("machine_type, topology, message", [
    ("ct6e-standard-2t", "2x2", "unknown TPU machine type"),
    ("ct6e-standard-8t", "4x4", "not valid for ct6e-standard-8t"),
    ("ct5p-hightpu-4t", "4x4", "not valid for ct5p-hightpu-4t"),
])
def test_invalid_shapes_are_rejected(machine_type, topology, message):
    with pytest.raises(ValueError, match=message):
        lookup_slice(machine_type, topology)
