"""The offline plan: the dev stack's rendered tree and Kubernetes objects are checked into tests/golden/dev.

After an intended change, regenerate with: UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_offline_plan.py
"""

from __future__ import annotations

import os

import pytest
import yaml

from infra.offline import main as offline_main
from infra.offline import render_manifests, render_tree
from tests.conftest import REPO, SHIPPED_STACKS, plan_for

GOLDEN = REPO / "tests" / "golden" / "dev"


@pytest.mark.parametrize("name, render", [("plan.txt", render_tree), ("manifests.yaml", render_manifests)])
def test_dev_plan_matches_golden(name, render):
    rendered = render(plan_for("dev"))
    golden = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(rendered)
    assert golden.exists(), f"{golden} missing; run with UPDATE_GOLDEN=1"
    assert rendered == golden.read_text(), f"{name} changed; review the diff and regenerate with UPDATE_GOLDEN=1"


def test_rendering_is_deterministic():
    assert render_tree(plan_for("dev")) == render_tree(plan_for("dev", {"zone": "us-east5-b"}))


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_offline_command_writes_plan_and_manifests(stack, tmp_path, capsys):
    assert offline_main([stack, "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "tpu-fallback:infra:Kueue kueue" in printed
    documents = list(yaml.safe_load_all((tmp_path / "manifests.yaml").read_text()))
    assert documents[0]["# helm release"]["name"] == "kueue"
    kinds = {d.get("kind") for d in documents[1:]}
    assert {"ClusterQueue", "LocalQueue", "ResourceFlavor", "Namespace"} <= kinds


def test_secrets_never_reach_the_plan():
    assert "gke-gcloud-auth-plugin" not in render_tree(plan_for("dev"))


def test_preview_declares_the_same_graph_as_up():
    from infra.offline import OfflineEngine
    from tests.conftest import base_config

    preview = OfflineEngine(preview=True).run(base_config("dev"))
    up = plan_for("dev")
    assert sorted((r.type, r.name) for r in preview.resources) == sorted((r.type, r.name) for r in up.resources)


def test_manifests_are_copies_so_a_test_cannot_corrupt_a_cached_plan():
    plan = plan_for()
    first = plan.kubernetes_manifests()
    first[0]["metadata"]["name"] = "changed"
    first[0]["spec" if "spec" in first[0] else "metadata"]["extra"] = True
    assert plan.kubernetes_manifests()[0]["metadata"]["name"] != "changed"
