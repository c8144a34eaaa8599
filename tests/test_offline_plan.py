"""The offline plan: the dev stack's rendered tree and Kubernetes objects are checked into tests/golden/dev.

After an intended change, regenerate with: UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_offline_plan.py
"""

from __future__ import annotations

import os
import subprocess
import sys

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


def test_the_ironwood_plan_prints_its_workload_policy_and_the_pools_after_it(tmp_path, capsys):
    """TPU7x: one resource policy (high throughput, 2x2x2), which every rung's pool names and is created after."""
    assert offline_main(["ironwood-us-central1-c", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("+ gcp:compute/resourcePolicy:ResourcePolicy tpu-workload-policy") == 1
    assert "type: HIGH_THROUGHPUT" in printed and "acceleratorTopology: 2x2x2" in printed
    pools = [line for line in printed.splitlines() if "gcp:container/nodePool:NodePool" in line]
    assert len(pools) == 4 and all("tpu-workload-policy)" in line for line in pools)
    assert printed.count("policyName: ironwood-tpu7x-2x2x2-c") == 4 and "tpuTopology" not in printed


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


# (stack, what to change in its stack file's config, the key the error must name): one of each role.
BAD_STACKS = [
    ("fleet", {"tpu-fallback:fleet": {"members": ["my-org/tpu-fallback/member-us-east5-a",
                                                  "my-org/tpu-fallback/member-asia-northeast1-b"],
                                      "dispatcher": "Sometimes"}}, "tpu-fallback:fleet.dispatcher"),
    ("research", {"tpu-fallback:team": "reserch"}, "tpu-fallback:team"),
    ("dev", {"tpu-fallback:googleGroupsDomain": "example.com"}, "tpu-fallback:googleGroupsDomain"),
]


def bad_stack_file(tmp_path, stack: str, changes: dict) -> str:
    config = yaml.safe_load((REPO / f"Pulumi.{stack}.yaml").read_text())
    config["config"].update(changes)
    path = tmp_path / f"Pulumi.{stack}.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


@pytest.mark.parametrize("stack, changes, key", BAD_STACKS, ids=[stack for stack, _, _ in BAD_STACKS])
def test_the_offline_command_prints_a_bad_config_as_the_error_alone(stack, changes, key, tmp_path):
    """As the Pulumi CLI shows a RunError: `error:` and the problems, exit status 1, no traceback. The lines before
    it are the command's own notes (which stack answers a StackReference, the placeholder project)."""
    run = subprocess.run([sys.executable, "-m", "infra.offline", stack, "--config-file",
                          bad_stack_file(tmp_path, stack, changes), "--out", str(tmp_path / "plan")],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stderr
    header, *problems = run.stderr.splitlines()
    assert header == "error: invalid stack configuration:", run.stderr
    assert problems and all(line.startswith("  - tpu-fallback:") for line in problems), run.stderr
    assert any(line.startswith(f"  - {key}: ") for line in problems), run.stderr
    assert all(line.startswith("(") for line in run.stdout.splitlines()), run.stdout
    assert not (tmp_path / "plan").exists()


def test_a_stack_file_that_is_not_yaml_is_an_error_line_too(tmp_path, capsys):
    broken = tmp_path / "Pulumi.dev.yaml"
    broken.write_text("config:\n  tpu-fallback:zone: [us-east5-b\n")
    assert offline_main(["dev", "--config-file", str(broken), "--out", str(tmp_path / "plan")]) == 1
    printed = capsys.readouterr()
    assert printed.err.startswith("error: Pulumi.dev.yaml: not YAML: ") and "Traceback" not in printed.err


def test_a_bad_referenced_stack_is_named(tmp_path, monkeypatch, capsys):
    import infra.offline as offline

    shipped = offline.stack_config
    monkeypatch.setattr(offline, "stack_config", lambda stack, root=REPO, stack_file=None: {
        **shipped(stack, root, stack_file), **({"tpu-fallback:zone": "mars-1a"} if stack.startswith("platform")
                                               else {})})
    assert offline_main(["research", "--out", str(tmp_path)]) == 1
    first = capsys.readouterr().err.splitlines()[0]
    assert first == ("error: my-org/tpu-fallback/platform-us-east5-b, which this stack reads: "
                     "invalid stack configuration:")


def test_an_unexpected_exception_keeps_its_traceback(tmp_path, monkeypatch):
    """A bug is not a configuration error: the command does not hide it."""
    import infra.offline as offline

    def broken(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(offline, "render_tree", broken)
    with pytest.raises(KeyError, match="a bug"):
        offline_main(["dev", "--out", str(tmp_path)])
