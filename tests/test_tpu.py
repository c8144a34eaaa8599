"""The TPU catalogue is consistent with itself and with GKE's slice rules."""

from __future__ import annotations

import math

import pytest

from infra.tpu import MACHINE_TYPES, V5E, V5P, V6E, lookup_slice

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
])
def test_known_slices(machine_type, topology, chips, hosts):
    tpu = lookup_slice(machine_type, topology)
    assert (tpu.chips, tpu.hosts) == (chips, hosts)


def test_pod_type_names_the_slice_as_google_does():
    assert lookup_slice("ct6e-standard-4t", "4x4").pod_type == "v6e-16"


def test_labels_are_gke_accelerator_values():
    assert {g.accelerator_label for g in (V6E, V5E, V5P)} == {
        "tpu-v6e-slice", "tpu-v5-lite-podslice", "tpu-v5p-slice"}


@pytest.mark.parametrize("generation", [V6E, V5E, V5P])
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
