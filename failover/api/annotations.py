"""The labels, annotations and resource names the programs read and write on Kubernetes objects (their values are
the contract with `ops status`, the docs and anyone who scripts against the controllers)."""

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# On the copies a MultiKueue manager makes in this cluster (a fleet member's, plan C). The manager owns them: any
# change of a copy's spec makes it delete and recreate the copy, and an eviction here re-dispatches the job to
# every member. So the controller leaves them alone.
# Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/controller/admissionchecks/multikueue/workload.go#L490-L536
MULTIKUEUE_ORIGIN_LABEL = "kueue.x-k8s.io/multikueue-origin"
TPU_RESOURCE = "google.com/tpu"

# ---- the regional controller's (failover/regional/) --------------------------------------------------------------
# On the Workload: the rung it was last admitted on. Kueue clears `status.admission` when it evicts, so the
# controller writes it down while the Workload is admitted.
ADMITTED_FLAVOR_ANNOTATION = "tpu-fallback/admitted-flavor"
# On the RayJob: the move, written before the first change so a restart finishes it (JSON, see Move).
FAILOVER_ANNOTATION = "tpu-fallback/failover"
# On the RayJob: every completed move, oldest first (a JSON list of Move objects), written in the same guarded patch
# that marks the move done. Events expire (an hour by default); this history lasts as long as the job.
MOVES_ANNOTATION = "tpu-fallback/moves"
# On the RayJob: the slice it lost this admission (JSON, see LostSlice).
SLICE_LOST_ANNOTATION = "tpu-fallback/slice-lost"
# On a running job's TPU worker pods: a request to save the step it reached and go on training (the value:
# failover.api.CheckpointRequest). The pods read their own annotations through a downwardAPI volume
# (workloads/rayjob.py), so the job needs no new rights; train.py saves once per new request id.
CHECKPOINT_REQUEST_ANNOTATION = "tpu-fallback/checkpoint-request"
# On the RayJob: a disruption of its slice seen coming (a host's scheduled maintenance, a DWS run's end), and what the
# controller did ahead of it (JSON, see Ahead).
AHEAD_ANNOTATION = "tpu-fallback/disruption-ahead"
# GKE's signals of a TPU or GPU host's maintenance: the label with the window's start (Unix seconds) while it is
# scheduled, then, during it, the label ONGOING (and the taint failover/slices.py reads as the host going).
# Ref: https://cloud.google.com/kubernetes-engine/docs/how-to/view-maintenance-events (GKE 1.31.1-gke.2008000+)
# Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/handle-disruption-gpu-tpu
SCHEDULED_MAINTENANCE_LABEL = "cloud.google.com/scheduled-maintenance-time"
ACTIVE_MAINTENANCE_LABEL, MAINTENANCE_ONGOING = "cloud.google.com/active-node-maintenance", "ONGOING"
# On a DWS job (its RayJob, which Kueue copies to the Workload and the ProvisioningRequest): how long the run may last.
# Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/util/admissioncheck/admissioncheck.go
# (FilterProvReqAnnotations: the annotations a job's Workload keeps)
MAX_RUN_ANNOTATION = "provreq.kueue.x-k8s.io/maxRunDurationSeconds"

# ---- the fleet's (failover/watch/, failover/ladder/) -------------------------------------------------------------
# On the manager's RayJob: where the job runs as the members show it, against Kueue's record (the watch's Finding).
FLEET_ANNOTATION = "tpu-fallback/fleet"
# On the manager's RayJob: the job's own maximum wait (a duration such as 90s, 2h, 1h30m, 1d; or "none": never give
# it up), over the fleet's `fleet.maxWait`.
MAX_WAIT_ANNOTATION = "tpu-fallback/max-wait"
# On the manager's RayJob: that the ladder gave the job up, why and when (JSON, see GiveUp); written once the Workload
# is deactivated (with the ladder's Workload annotation, so a restart finishes it), `done` once the Event is out.
GAVE_UP_ANNOTATION = "tpu-fallback/gave-up"
