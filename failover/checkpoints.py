"""The checkpoint channel: the controller asks a running job to save the step it reached and go on training, before a
disruption it sees coming (a maintenance window, a DWS run's end) or a move it chooses (a climb back). Pure
decisions; the write is GuardedWrites._ask_checkpoint (failover/runtime/writes.py).

The request is an annotation on the job's TPU worker pods (failover.api.CHECKPOINT_REQUEST_ANNOTATION, the value a
CheckpointRequest). The pods read their own annotations through a downwardAPI volume (workloads/rayjob.py); train.py
looks after each step, the hosts agree in the all-gather the termination notice already has, and on a request id
new to them every host saves the step it reached, then goes on (a worker group takes the request it sees at its start
as honoured: it has just restored its newest step). The controller needs `patch` on pods; the job needs
nothing: no exec, no API access.

The kubelet rewrites the file when it syncs the pod: soon after the annotation changes (the pod update wakes the pod's
worker), at the latest at its periodic sync (`syncFrequency`, 1 minute by default). A subPath mount would never be
refreshed, so the volume is mounted whole.
Ref: https://kubernetes.io/docs/concepts/storage/volumes/#downwardapi
Ref: https://kubernetes.io/docs/reference/config-api/kubelet-config.v1beta1/ (syncFrequency)

No answer comes back. The job's only writes to its pods are its probes' results, which decide the pods' readiness
(that the loss rules read as a broken slice), and any other way back (the checkpoint bucket, the Ray dashboard)
would give the controller new rights or reach outside the cluster's API. So a request is taken as answered
`saveTimeout` after it was asked: the kubelet's refresh, one training step and the save must fit in it. A move
after a request also deletes the pods, whose preStop hook gives train.py the termination notice: the step reached
then is saved as well, within the pods' grace period (docs/disruptions.md).
"""

from __future__ import annotations

import datetime

from failover.api import CheckpointRequest
# The pods' answers and the save's end are the request's own (failover/api/checkpoints.py), shared with the moves that
# checkpoint first (failover/api/checkpoint_moves.py); named here too for the channel's readers.
from failover.api.checkpoints import answered_at, pods_to_ask

__all__ = ["KUBELET_SYNC", "answered", "answered_at", "ask_at", "pods_to_ask"]

# The kubelet's default periodic sync: the latest a downwardAPI file shows a new annotation.
KUBELET_SYNC = datetime.timedelta(minutes=1)


def ask_at(deadline: datetime.datetime, lead: datetime.timedelta) -> datetime.datetime:
    """When to ask for a save before `deadline`: `lead` ahead of it."""
    return deadline - lead


def answered(request: CheckpointRequest | None, save_timeout: datetime.timedelta, now: datetime.datetime) -> bool:
    """Whether the job has had its time to save for `request` (None: nothing asked, so nothing to wait for)."""
    return request is None or now >= answered_at(request, save_timeout)
