"""A running job that loses its slice: what the failover controller decides, as pure functions (no I/O here).

Kueue does not see it. Its RayJob integration reads PodsReady from the RayCluster's `state`, which KubeRay never moves
back from `ready`, so `waitForPodsReady.recoveryTimeout` never fires for a RayJob (measured on the tier); a job whose
slice is gone holds its quota for good. And on GKE a multi-host slice is recreated whole, so one lost host stops
every worker of the job.
Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/controller/jobs/rayjob/rayjob_controller.go#L229-L231
Ref: https://github.com/ray-project/kuberay/blob/v1.5.0/ray-operator/controllers/ray/raycluster_controller.go#L1444-L1448

So the controller reads GKE's own signals on the job's TPU hosts, where they appear first: a node tainted as going (a
Spot VM's termination notice, the autoscaler's removal, a TPU maintenance), a node NotReady or deleted, a TPU pod
being deleted or no longer ready, fewer TPU pods than the job's hosts. The first such moment is the loss; it is
written on the RayJob (`LostSlice`, for `ops status` and for a restart), and the job waits its rung's recovery wait
for its slice to be whole again (GKE recreates the slice: on-demand and reserved capacity usually comes back, a
reclaimed Spot or an ended DWS slice seldom does). Whole again: the loss is marked recovered. Still broken at the
deadline: the job moves to the next rung (reason failover.api.SLICE_LOST), or, on the last rung, is requeued there
(a DWS job gets a new ProvisioningRequest), so it never holds quota on a broken slice for longer than the wait.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from failover.api import (ACTIVE_MAINTENANCE_LABEL, CHECKPOINT_REQUEST_ANNOTATION, LOST, MAINTENANCE_ONGOING, RECOVERED,
                          SCHEDULED_MAINTENANCE_LABEL, LostSlice, format_time, parse_time)

# Node taints that say a host is going, with why. GKE adds the first during a Spot VM's (or preemptible VM's)
# termination notice; the cluster autoscaler adds the second before it deletes a node; the node lifecycle controller
# adds the last two when the kubelet stops reporting.
# Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms#termination-graceful-shutdown
# Ref: https://kubernetes.io/docs/reference/labels-annotations-taints/ (node.kubernetes.io/*, ToBeDeletedByClusterAutoscaler)
GOING_TAINTS: Mapping[str, str] = {
    "cloud.google.com/impending-node-termination": "received a termination notice",
    "ToBeDeletedByClusterAutoscaler": "is being removed by the autoscaler",
    "node.kubernetes.io/unreachable": "is unreachable",
    "node.kubernetes.io/not-ready": "is not ready",
}


@dataclass(frozen=True)
class NodeView:
    """What the loss rules read of a Node."""

    name: str
    ready: bool
    ready_since: datetime.datetime | None  # the Ready condition's lastTransitionTime
    going: tuple[str, datetime.datetime | None] | None = None  # (why, since) of its first GOING_TAINTS taint
    # GKE's maintenance labels (failover/maintenance.py): the window's start while scheduled, and ONGOING during it
    maintenance_at: datetime.datetime | None = None
    maintenance_ongoing: bool = False

    @classmethod
    def from_object(cls, obj: Mapping) -> NodeView:
        status, spec = obj.get("status") or {}, obj.get("spec") or {}
        ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
        going = None
        for taint in spec.get("taints") or []:
            why = GOING_TAINTS.get(taint.get("key", ""))
            if why is not None:
                since = parse_time(taint.get("timeAdded"))
                if going is None or (since is not None and (going[1] is None or since < going[1])):
                    going = (why, since)
        labels = obj["metadata"].get("labels") or {}
        ongoing = labels.get(ACTIVE_MAINTENANCE_LABEL) == MAINTENANCE_ONGOING
        if ongoing and going is None:  # the window has begun: the host goes (its taint usually comes with it)
            going = ("is under maintenance", None)
        scheduled = labels.get(SCHEDULED_MAINTENANCE_LABEL, "")
        maintenance_at = (datetime.datetime.fromtimestamp(int(scheduled), datetime.timezone.utc)
                          if scheduled.isdigit() else None)  # Unix seconds, as GKE writes it
        # No Ready condition at all: a node whose kubelet never reported (KWOK's before it takes the node) is
        # not counted as lost; only a reported False or Unknown is.
        return cls(obj["metadata"]["name"], ready is None or ready.get("status") == "True",
                   parse_time((ready or {}).get("lastTransitionTime")), going, maintenance_at, ongoing)


@dataclass(frozen=True)
class HostView:
    """One TPU pod of the job (a Ray worker: one per TPU host)."""

    pod: str
    node: str | None  # spec.nodeName
    ready: bool
    ready_since: datetime.datetime | None  # the Ready condition's lastTransitionTime
    deleting_since: datetime.datetime | None = None  # deletionTimestamp less the grace period: when it was asked
    checkpoint_request: str | None = None  # its CHECKPOINT_REQUEST_ANNOTATION (failover/checkpoints.py)

    @classmethod
    def from_object(cls, obj: Mapping) -> HostView:
        meta, status = obj["metadata"], obj.get("status") or {}
        ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
        deleting = parse_time(meta.get("deletionTimestamp"))
        if deleting is not None:
            deleting -= datetime.timedelta(seconds=meta.get("deletionGracePeriodSeconds") or 0)
        return cls(meta["name"], (obj.get("spec") or {}).get("nodeName"),
                   status.get("phase") == "Running" and (ready or {}).get("status") == "True",
                   parse_time((ready or {}).get("lastTransitionTime")), deleting,
                   (meta.get("annotations") or {}).get(CHECKPOINT_REQUEST_ANNOTATION))


@dataclass(frozen=True)
class Loss:
    """What is wrong with a slice now, and since when (the earliest signal)."""

    at: datetime.datetime
    cause: str


def slice_loss(hosts_needed: int, hosts: Iterable[HostView], nodes: Mapping[str, NodeView],
               gone: Mapping[str, datetime.datetime], now: datetime.datetime) -> Loss | None:
    """None while the slice is whole: `hosts_needed` TPU pods ready on nodes that exist and are not going. `gone`:
    the nodes seen deleted, and when. Otherwise the earliest signal of the loss; a pod that is missing or not yet
    placed counts from `now` (the caller keeps the first loss it recorded)."""
    signals: list[Loss] = []
    healthy = 0
    hosts = list(hosts)
    for host in hosts:
        node = nodes.get(host.node) if host.node else None
        if host.deleting_since is not None:
            signals.append(Loss(host.deleting_since, f"its pod {host.pod} is being deleted"))
        elif host.node is not None and host.node in gone:
            signals.append(Loss(gone[host.node], f"its host {host.node} is gone"))
        elif node is not None and node.going is not None:
            signals.append(Loss(node.going[1] or now, f"its host {host.node} {node.going[0]}"))
        elif node is not None and not node.ready:
            signals.append(Loss(node.ready_since or now, f"its host {host.node} is not ready"))
        elif host.node is not None and node is None:
            signals.append(Loss(now, f"its host {host.node} is gone"))
        elif not host.ready:
            signals.append(Loss(host.ready_since or now, f"its pod {host.pod} is not ready"))
        else:
            healthy += 1
    if healthy >= hosts_needed:
        return None
    if len(hosts) < hosts_needed:
        signals.append(Loss(now, f"{len(hosts)} of its {hosts_needed} TPU pods exist"))
    first = min(signals, key=lambda loss: loss.at)
    return replace(first, at=min(first.at, now))


@dataclass(frozen=True)
class RecordLoss:
    lost: LostSlice


@dataclass(frozen=True)
class RecordRecovery:
    lost: LostSlice


@dataclass(frozen=True)
class GiveUpSlice:
    """The wait is over: move the job on (or requeue it on its last rung)."""

    lost: LostSlice


LossAction = RecordLoss | RecordRecovery | GiveUpSlice | None


def decide_loss(flavor: str | None, running_since: datetime.datetime | None, recorded: LostSlice | None,
                loss: Loss | None, recovery: datetime.timedelta, now: datetime.datetime) -> LossAction:
    """The next step for a job admitted on `flavor` whose pods were all ready (`running_since`: this admission), from
    the loss it recorded and the slice's state now. A record from an earlier admission does not count."""
    if flavor is None or running_since is None:
        return None
    current = recorded if (recorded is not None and recorded.flavor == flavor
                           and (parse_time(recorded.at) or now) >= running_since) else None
    if current is None or current.state == RECOVERED:
        if loss is None:
            return None
        at = max(loss.at, running_since)
        # Whole seconds on the RayJob: `at` rounded down, the deadline up, so the job waits at least its wait.
        until = at + recovery
        if until.microsecond:
            until += datetime.timedelta(microseconds=1_000_000 - until.microsecond)
        return RecordLoss(LostSlice(flavor, format_time(at), loss.cause, format_time(until)))
    if loss is None:
        return RecordRecovery(replace(current, state=RECOVERED, recovered_at=format_time(now)))
    if now >= (parse_time(current.until) or now):
        return GiveUpSlice(current)
    return None


def waiting_until(recorded: LostSlice) -> datetime.datetime | None:
    return parse_time(recorded.until) if recorded.state == LOST else None


def loss_message(lost: LostSlice) -> str:
    """`ops status`'s line and the Event's message for a loss."""
    if lost.state == RECOVERED:
        return f"lost its slice on {lost.flavor} at {lost.at} ({lost.cause}); whole again at {lost.recovered_at}"
    return f"lost its slice on {lost.flavor} at {lost.at} ({lost.cause}); waiting for recovery until {lost.until}"

