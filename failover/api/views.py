"""What the programs read of a Kueue Workload, as a plain value (the regional controller decides on it; the fleet's
watch reads a member's copy with it; `ops status` and the benchmarks read it too)."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass

from failover.api.annotations import (ADMITTED_FLAVOR_ANNOTATION, MAX_RUN_ANNOTATION, MULTIKUEUE_ORIGIN_LABEL,
                                      TPU_RESOURCE)
from failover.api.times import parse_time

@dataclass(frozen=True)
class WorkloadView:
    """The parts of a Kueue Workload the decisions read."""

    name: str
    namespace: str
    queue_name: str
    active: bool
    quota_reserved: bool
    admitted: bool
    admitted_at: datetime.datetime | None  # when QuotaReserved last turned True
    flavor: str | None  # the TPU pod set's flavor while quota is reserved
    recorded_flavor: str | None  # ADMITTED_FLAVOR_ANNOTATION
    evicted_reason: str | None  # the Evicted condition's reason while it is True
    rayjob: str | None  # the owning RayJob's name
    pending_since: datetime.datetime | None = None  # waiting for quota since (creation, or losing its quota)
    check_states: tuple[tuple[str, str], ...] = ()  # (admission check, state), as Kueue reports them
    multikueue_origin: str | None = None  # set on a fleet manager's copy (MULTIKUEUE_ORIGIN_LABEL)
    pods_ready_since: datetime.datetime | None = None  # PodsReady True since (this admission), else None
    tpu_hosts: int = 0  # the TPU pods the job needs: its TPU pod sets' counts
    finished: bool = False  # Kueue's Finished: the job ended (its pods go as they should)
    requeue_state: bool = False  # status.requeueState is set (the requeue backoff of a PodsReady eviction)
    # When things last changed, for a job's time account (failover/api/goodput.py): Kueue keeps only each condition's
    # last transition.
    created_at: datetime.datetime | None = None
    admitted_since: datetime.datetime | None = None  # Admitted True since (a rung with a check: once it is Ready)
    pods_ready_reason: str | None = None  # PodsReady's reason, True or False: Started, Recovered, WaitForRecovery...
    pods_ready_changed_at: datetime.datetime | None = None  # its last transition, True or False
    requeued_reason: str | None = None  # Requeued True's reason: Reactivated once a move's deactivation ends
    requeued_at: datetime.datetime | None = None  # and since when
    finished_at: datetime.datetime | None = None
    # A DWS job's: how long its run may last, counted from its admission (MAX_RUN_ANNOTATION, copied by Kueue)
    max_run_seconds: int | None = None
    tpu_chips: int = 0  # the TPU chips the job needs: its TPU pod sets' counts times their requests

    @classmethod
    def from_object(cls, obj: Mapping) -> WorkloadView:
        meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
        conditions = {c["type"]: c for c in status.get("conditions") or []}

        def true(kind: str) -> bool:
            return (conditions.get(kind) or {}).get("status") == "True"

        def changed(kind: str) -> datetime.datetime | None:
            return parse_time((conditions.get(kind) or {}).get("lastTransitionTime"))

        flavor = None
        for assignment in (status.get("admission") or {}).get("podSetAssignments") or []:
            flavor = (assignment.get("flavors") or {}).get(TPU_RESOURCE) or flavor
        reserved = true("QuotaReserved")
        owner = next((o["name"] for o in meta.get("ownerReferences") or [] if o.get("kind") == "RayJob"), None)
        pending_since = None
        tpu_hosts = sum(int(pod_set.get("count", 1)) for pod_set in spec.get("podSets") or []
                        if any(TPU_RESOURCE in ((c.get("resources") or {}).get("requests") or {})
                               for c in ((pod_set.get("template") or {}).get("spec") or {}).get("containers") or []))
        tpu_chips = sum(int(pod_set.get("count", 1)) * int(((c.get("resources") or {}).get("requests") or {}).get(
            TPU_RESOURCE, 0)) for pod_set in spec.get("podSets") or []
            for c in ((pod_set.get("template") or {}).get("spec") or {}).get("containers") or [])
        max_run = str((meta.get("annotations") or {}).get(MAX_RUN_ANNOTATION, ""))
        if not reserved:
            pending_since = parse_time((conditions.get("QuotaReserved") or {}).get("lastTransitionTime")
                                       or meta.get("creationTimestamp"))
        return cls(
            name=meta["name"], namespace=meta["namespace"], queue_name=spec.get("queueName", ""),
            active=spec.get("active", True) is not False, quota_reserved=reserved, admitted=true("Admitted"),
            admitted_at=parse_time(conditions["QuotaReserved"]["lastTransitionTime"]) if reserved else None,
            flavor=flavor if reserved else None,
            recorded_flavor=(meta.get("annotations") or {}).get(ADMITTED_FLAVOR_ANNOTATION),
            evicted_reason=conditions["Evicted"].get("reason") if true("Evicted") else None,
            rayjob=owner, pending_since=pending_since,
            check_states=tuple((c["name"], c.get("state", "")) for c in status.get("admissionChecks") or []),
            multikueue_origin=(meta.get("labels") or {}).get(MULTIKUEUE_ORIGIN_LABEL),
            pods_ready_since=(parse_time(conditions["PodsReady"].get("lastTransitionTime"))
                              if reserved and true("PodsReady") else None),
            tpu_hosts=tpu_hosts, finished=true("Finished"), requeue_state=status.get("requeueState") is not None,
            created_at=parse_time(meta.get("creationTimestamp")),
            admitted_since=changed("Admitted") if true("Admitted") else None,
            pods_ready_reason=(conditions.get("PodsReady") or {}).get("reason"),
            pods_ready_changed_at=changed("PodsReady"),
            requeued_reason=(conditions["Requeued"].get("reason") if true("Requeued") else None),
            requeued_at=changed("Requeued") if true("Requeued") else None,
            finished_at=changed("Finished") if true("Finished") else None,
            max_run_seconds=int(max_run) if max_run.isdigit() else None, tpu_chips=tpu_chips)
