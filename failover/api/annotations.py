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

# ---- the fleet's (failover/watch/, failover/ladder/) -------------------------------------------------------------
# On the manager's RayJob: where the job runs as the members show it, against Kueue's record (the watch's Finding).
FLEET_ANNOTATION = "tpu-fallback/fleet"
# On the manager's RayJob: the job's own maximum wait (a duration such as 90s, 2h, 1h30m, 1d; or "none": never give
# it up), over the fleet's `fleet.maxWait`.
MAX_WAIT_ANNOTATION = "tpu-fallback/max-wait"
# On the manager's RayJob: that the ladder gave the job up, why and when (JSON, see GiveUp); written once the Workload
# is deactivated (with the ladder's Workload annotation, so a restart finishes it), `done` once the Event is out.
GAVE_UP_ANNOTATION = "tpu-fallback/gave-up"
