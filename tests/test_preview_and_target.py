"""How a real `pulumi preview` and a targeted `pulumi up --target` look to the program.

Both run the real __main__.py under the recording engine (infra/offline.py) with mocks that answer the way the
engine does in those two cases, swapped in for RecordingMocks (the one hook: `OfflineEngine.run` builds its mocks
from the module's `RecordingMocks`; each test checks its mocks were used, so the hook cannot silently fall off).
"""

from __future__ import annotations

import copy
from typing import Any

import pulumi
import pytest

from infra import offline
from infra.kueue import NAMESPACE
from tests.conftest import base_config

RAYJOB = "kubernetes:ray.io/v1:RayJob"
UNKNOWN = pulumi.runtime.rpc.UNKNOWN  # "04da6b54-80e4-46f7-96ec-b56ff0331ba9", an unknown on the wire


def unknown_paths(value: Any, path: str = "") -> list[str]:
    """Where a recorded value holds an unknown. The recorder keeps them (keep_unknowns=True) as the SDK reads them
    off the wire, `pulumi.output.Unknown` objects; the wire string is matched too, should one get through."""
    if isinstance(value, pulumi.output.Unknown) or value == UNKNOWN:
        return [path or "."]
    if isinstance(value, dict):
        return [p for key, item in value.items() for p in unknown_paths(item, f"{path}.{key}")]
    if isinstance(value, list):
        return [p for index, item in enumerate(value) for p in unknown_paths(item, f"{path}[{index}]")]
    return []


def _computed_as_unknown(inputs: Any, outputs: Any) -> Any:
    """What a preview of a create returns: the inputs as given, and unknown wherever the cloud computes a value."""
    if isinstance(inputs, dict) and isinstance(outputs, dict):
        return {key: _computed_as_unknown(inputs[key], value) if key in inputs else UNKNOWN
                for key, value in outputs.items()}
    return outputs if outputs == inputs else UNKNOWN


class PreviewMocks(offline.RecordingMocks):
    """`pulumi preview` of a new stack: nothing exists yet, so every value the recording mocks invent (auto-names,
    emails, endpoints, release status) is unknown and ids are unknown; what the program passed in stays known."""

    calls = 0

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        PreviewMocks.calls += 1
        inputs = dict(args.inputs)
        # An input the program itself left unknown (an apply over computed values) stays unknown.
        unknown = {key for key, value in inputs.items() if isinstance(value, pulumi.output.Unknown)}
        known = copy.copy(args)
        known.inputs = {key: value for key, value in inputs.items() if key not in unknown}
        _, outputs = super().new_resource(known)
        return "", {**_computed_as_unknown(inputs, outputs), **{key: UNKNOWN for key in unknown}}


class SkippedKubernetesMocks(offline.RecordingMocks):
    """`pulumi up --target <GCP resources>` on a stack whose cluster objects were never created: the engine skips
    every Kubernetes object, and with no prior state it answers with no name the cluster would have made up.

    `inputs-echoed`: the inputs as given (a skipped create). `no-metadata`: no `metadata` at all; outside a preview
    the SDK then falls back to the inputs, so it reads like the first. `metadata-without-name`: a `metadata` that
    holds no name, the harshest answer, so that no object's name can be lifted, even one the program gave.
    """

    calls = 0

    def __init__(self, mode: str):
        super().__init__()
        self.mode = mode

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        SkippedKubernetesMocks.calls += 1
        if not args.typ.startswith("kubernetes:"):
            return super().new_resource(args)
        outputs = dict(args.inputs)
        if self.mode == "no-metadata":
            outputs.pop("metadata", None)
        elif self.mode == "metadata-without-name":
            outputs["metadata"] = {}
        return f"{args.name}-id", outputs


def run_with(monkeypatch, mocks: type, stack: str = "dev", preview: bool = False, **kwargs) -> offline.Plan:
    monkeypatch.setattr(offline, "RecordingMocks", lambda: mocks(**kwargs))
    before = mocks.calls
    plan = offline.OfflineEngine(stack, preview=preview).run(base_config(stack))
    assert mocks.calls > before, "OfflineEngine.run no longer builds its mocks from offline.RecordingMocks"
    return plan


# ---- 3. a preview that shows the jobs -------------------------------------------------------------------------

@pytest.mark.parametrize("stack", ["dev", "team-b-us-east5-a"])
def test_preview_of_a_new_stack_shows_every_rayjob_in_full(monkeypatch, stack):
    plan = run_with(monkeypatch, PreviewMocks, stack, preview=True)
    # The mocks do answer as a preview: what the cloud computes is unknown.
    assert unknown_paths(plan.only("gcp:container/cluster:Cluster").outputs)
    jobs = plan.of_type(RAYJOB)
    assert len(jobs) == 2
    for job in jobs:
        assert {"apiVersion", "kind", "metadata", "spec"} <= set(job.inputs)
        assert unknown_paths(job.inputs) == [], job.name
        assert job.inputs["metadata"]["name"].startswith("rayjob-")
        assert job.inputs["spec"]["entrypoint"].startswith("python /app/train.py")
    # The script ConfigMap and the bucket are known too; only the KSA's Google account email is the cloud's.
    assert unknown_paths(plan.named("training-script").inputs) == []
    assert unknown_paths(plan.only("gcp:storage/bucket:Bucket").inputs) == []
    assert unknown_paths(plan.named("training-ksa").inputs) == [".metadata.annotations.iam.gke.io/gcp-service-account"]


def test_preview_and_up_build_the_same_rayjobs(monkeypatch):
    preview = run_with(monkeypatch, PreviewMocks, preview=True)
    monkeypatch.undo()
    up = offline.OfflineEngine("dev").run(base_config("dev"))
    assert ({job.name: job.inputs for job in preview.of_type(RAYJOB)}
            == {job.name: job.inputs for job in up.of_type(RAYJOB)})


# ---- 4. `pulumi up --target` works ----------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["inputs-echoed", "no-metadata", "metadata-without-name"])
def test_targeted_update_that_skips_kubernetes_objects_completes(monkeypatch, mode):
    plan = run_with(monkeypatch, SkippedKubernetesMocks, mode=mode)
    # The program ran to the end: every resource registered and the stack outputs computed.
    assert plan.outputs["trainingJobs"] == ["rayjob-tpu-v6e-dws-1", "rayjob-tpu-v6e-dws-2"]
    release = plan.only("kubernetes:helm.sh/v3:Release")
    assert release.inputs["namespace"] == NAMESPACE
    # Ordering is kept with explicit dependencies, not by lifting names from objects.
    assert plan.named("kueue-namespace").urn in release.dependencies
    script = plan.named("training-script")
    name = script.inputs["metadata"]["name"]
    for job in plan.of_type(RAYJOB):
        assert script.urn in job.dependencies
        volumes = job.inputs["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["volumes"]
        assert volumes == [{"name": "train-script", "configMap": {"name": name}}]
