"""Capacity probes: how a job that waits below a rung learns that GCE has the rung's TPUs again.

Nothing in the cluster shows that a stocked-out rung has capacity again: no pod asks for it once its jobs moved down,
so the autoscaler never tries it, and no idle slice appears for a waiting job to climb to. A probe is one pending pod
shaped like one host of the job's slice on that rung (the rung's node labels and tolerations, one host's TPU chips),
with no Kueue queue: the cluster autoscaler keeps trying to scale the pool up for it, at the pace of its own backoff,
and a multi-host TPU pool grows by whole slices. Once the probe is placed the slice exists: the waiting job climbs
onto it (failover/regional/climb.py decide_climb_waiting) and the controller deletes the probe.
Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/tpus (atomicity: a multi-host slice is one unit)
Ref: https://github.com/kubernetes/autoscaler/blob/master/cluster-autoscaler/FAQ.md#how-can-i-configure-overprovisioning-with-cluster-autoscaler
(the placeholder-pod pattern the probe follows)

The stack writes where probes go and what they look like (FAILOVER_PROBES, failover/config.py); the controller
decides when (failover/regional/probes.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# On every probe pod: the rung (Kueue flavor) it probes. The controller lists its probes by this label.
PROBE_LABEL = "tpu-fallback/capacity-probe"


@dataclass(frozen=True)
class ProbeShape:
    """One rung's probe: what one host of a job's slice asks of the node there, as Kueue would place it."""

    flavor: str
    node_selector: Mapping[str, str]  # the rung's ResourceFlavor nodeLabels and the slice's accelerator and topology
    tolerations: tuple[Mapping[str, str], ...]  # GKE's TPU taint and the rung's own (Spot's)
    tpu_chips: int  # one host's chips

    def as_data(self) -> dict[str, Any]:
        return {"flavor": self.flavor, "nodeSelector": dict(self.node_selector),
                "tolerations": [dict(t) for t in self.tolerations], "tpuChips": self.tpu_chips}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> ProbeShape:
        flavor, selector, tolerations, chips = (data["flavor"], data["nodeSelector"], data["tolerations"],
                                                data["tpuChips"])
        if not isinstance(flavor, str) or not flavor:
            raise TypeError(f"flavor must be a name: {dict(data)!r}")
        if not isinstance(selector, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in selector.items()):
            raise TypeError(f"nodeSelector must map labels to values: {dict(data)!r}")
        if not isinstance(tolerations, list) or not all(isinstance(t, dict) for t in tolerations):
            raise TypeError(f"tolerations must be a list of tolerations: {dict(data)!r}")
        if isinstance(chips, bool) or not isinstance(chips, int) or chips <= 0:
            raise TypeError(f"tpuChips must be a whole number above 0: {dict(data)!r}")
        return cls(flavor, dict(selector), tuple(dict(t) for t in tolerations), chips)


@dataclass(frozen=True)
class Probes:
    """fallback.climbBack.probe as the controller reads it: where its probes go, their image, each rung's shape.
    No shape: probing is off."""

    namespace: str  # the controller's own namespace: its Role there lets it create and delete pods, nowhere else
    image: str  # a pinned pause image: the probe runs nothing
    shapes: tuple[ProbeShape, ...] = ()

    def shape(self, flavor: str) -> ProbeShape | None:
        return next((shape for shape in self.shapes if shape.flavor == flavor), None)

    def as_data(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "image": self.image, "rungs": [shape.as_data() for shape in self.shapes]}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Probes:
        namespace, image, rungs = data["namespace"], data["image"], data["rungs"]
        if not isinstance(namespace, str) or not namespace or not isinstance(image, str) or not image:
            raise TypeError(f"namespace and image must be names: {dict(data)!r}")
        if not isinstance(rungs, list):
            raise TypeError(f"rungs must be a list: {dict(data)!r}")
        return cls(namespace, image, tuple(ProbeShape.from_data(rung) for rung in rungs))
