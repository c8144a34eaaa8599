"""Capacity probes, decided (failover/api/probes.py says what a probe is; probing.py carries these out): where one
stands, and when it goes. Pure functions of what the controller reads: the jobs waiting below a rung
(climb.waiting_rung), each rung's free quota and idle slices (free_slices.py), and the probe pods.

A probe stands on a rung while a job waits below it that the rung could take: a rung above the job
(climb.waiting_targets) with a probe shape (not a reservation: its free quota is its capacity), whose quota is free for
the job (Kueue would admit it there) and that has no idle slice for it (an idle slice needs no probe: the job climbs).
It goes once no job wants it any more, placed or not. Placed, it stays until the controller's own view of the rung
shows the slice idle (a probe is not a job's pod: it does not make a host busy there), which is also what lets the
job climb: deleted the moment it is placed, it was made again and placed again five times in 150 ms on the tier,
the node informer a step behind the pod informer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from failover.api import TPU_RESOURCE, Chain
from failover.api.probes import PROBE_LABEL, Probes, ProbeShape
from failover.regional import climb

CREATE, DELETE = "create", "delete"


@dataclass(frozen=True)
class ProbePod:
    """What the controller reads of a probe pod."""

    name: str
    flavor: str
    bound: bool  # the scheduler placed it: the slice it asked for exists
    deleting: bool


def probe_pod_view(obj: dict, _before: object = None) -> ProbePod:
    meta = obj["metadata"]
    return ProbePod(meta["name"], (meta.get("labels") or {}).get(PROBE_LABEL, ""),
                    bool((obj.get("spec") or {}).get("nodeName")), meta.get("deletionTimestamp") is not None)


def wanted(chain: Chain, probes: Probes, waiting: Iterable[tuple[int, climb.Need]],
           now_on: Callable[[str], climb.Sample | None]) -> set[str]:
    """The flavors a probe should stand on, for these waiting jobs ((rung, need) each) and each rung's numbers now
    (`now_on(flavor)`: its latest sample, None when unknown)."""
    found = set()
    for rung, need in waiting:
        for index in climb.waiting_targets(chain, rung):
            flavor = chain.rungs[index].flavor
            sample = now_on(flavor)
            if probes.shape(flavor) is None or sample is None:
                continue
            if sample.free_chips >= need.chips and sample.idle_hosts < need.hosts:
                found.add(flavor)
    return found


def next_probe_step(wanted_here: bool, pods: Iterable[ProbePod]) -> tuple[str, str | None] | None:
    """(CREATE or DELETE, the pod to delete) for one rung's probe, or None: nothing to do."""
    pods = list(pods)
    for pod in pods:
        if not pod.deleting and not wanted_here:
            return DELETE, pod.name
    if wanted_here and not pods:  # one still going is waited for: its name is the new one's
        return CREATE, None
    return None


def probe_name(flavor: str) -> str:
    return f"capacity-probe-{flavor}"[:63].rstrip("-")


def probe_pod(shape: ProbeShape, probes: Probes) -> dict:
    """The probe pod: one host of a slice on the rung, running a pause image, in no Kueue queue (Kueue manages only
    pods that name one). Never restarted: it only has to be placed."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": probe_name(shape.flavor), "namespace": probes.namespace,
                     "labels": {PROBE_LABEL: shape.flavor}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "nodeSelector": dict(shape.node_selector),
            "tolerations": [dict(t) for t in shape.tolerations],
            "containers": [{
                "name": "probe", "image": probes.image,
                "resources": {"requests": {TPU_RESOURCE: str(shape.tpu_chips)},
                              "limits": {TPU_RESOURCE: str(shape.tpu_chips)}},
            }],
        },
    }

