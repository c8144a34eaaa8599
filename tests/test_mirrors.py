"""Mirrors for air-gapped and enterprise clusters: the Kueue chart's repository and the Ray image's."""

from __future__ import annotations

import pytest

from infra.offline import OfflineEngine
from infra.settings import SettingsError
from tests.conftest import config_with, plan_for

RELEASE = "kubernetes:helm.sh/v3:Release"


def _images(plan) -> set[str]:
    images = set()
    for job in (m for m in plan.kubernetes_manifests() if m["kind"] == "RayJob"):
        cluster = job["spec"]["rayClusterSpec"]
        for template in (cluster["headGroupSpec"]["template"],
                         *(group["template"] for group in cluster["workerGroupSpecs"])):
            images.update(container["image"] for container in template["spec"]["containers"])
    return images


def test_defaults_are_the_public_registries():
    plan = plan_for()
    assert plan.only(RELEASE).inputs["chart"] == "oci://registry.k8s.io/kueue/charts/kueue"
    assert "repositoryOpts" not in plan.only(RELEASE).inputs
    assert {image.split(":")[0] for image in _images(plan)} == {"rayproject/ray"}


def test_an_oci_mirror_of_the_chart_and_a_mirror_of_the_ray_image():
    plan = plan_for("dev", {"kueue": {"chartRepository": "oci://mirror.example.com/kueue/charts"},
                            "workloads": {"rayImageRepository": "mirror.example.com:5000/hub/rayproject/ray"}})
    release = plan.only(RELEASE).inputs
    assert release["chart"] == "oci://mirror.example.com/kueue/charts/kueue" and release["version"] == "0.19.2"
    assert {image.rsplit(":", 1)[0] for image in _images(plan)} == {"mirror.example.com:5000/hub/rayproject/ray"}


def test_an_https_chart_repository_is_named_by_repo_option():
    release = plan_for("dev", {"kueue": {"chartRepository": "https://charts.example.com/kueue"}}).only(RELEASE)
    assert release.inputs["chart"] == "kueue"
    assert release.inputs["repositoryOpts"] == {"repo": "https://charts.example.com/kueue"}


@pytest.mark.parametrize("overrides, key", [
    ({"kueue": {"chartRepository": "registry.k8s.io/kueue/charts"}}, "kueue.chartRepository"),  # no scheme
    ({"kueue": {"chartRepository": "http://charts.example.com"}}, "kueue.chartRepository"),  # not TLS
    ({"workloads": {"rayImageRepository": "rayproject/ray:2.60.0"}}, "workloads.rayImageRepository"),  # a tag
    ({"workloads": {"rayImageRepository": "Mirror/Ray"}}, "workloads.rayImageRepository"),
])
def test_bad_mirrors_are_rejected_by_key(overrides, key):
    engine = OfflineEngine("dev")
    with pytest.raises(SettingsError) as error:
        engine.run(config_with(overrides))
    assert engine.recorded == []
    assert any(problem.startswith(f"tpu-fallback:{key}:") for problem in error.value.problems), error.value
