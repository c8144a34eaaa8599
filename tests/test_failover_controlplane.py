"""The failover controller against a real kube-apiserver 1.36 and Kueue 0.19.2, with its ServiceAccount's rights,
over real KubeRay, kube-scheduler and nodes shaped like the plan's pools.

A stockout is a pod no node ever takes: the test scripts a rung's pool as unable to grow, and GKE's autoscaler
stand-in says so on the pod ("GCE out of resources") unless the stockout is silent. Kueue runs with what the chart
renders from the stack's values, `stockoutGracePeriod: 4s` set through stack config, and its waitForPodsReady timeout
on the tier's clock, 30 s (stack.release_values: the stack accepts no less than GKE's start of a RayJob takes).
"""

from __future__ import annotations

import datetime
import time

import pytest

from failover import api
from failover.api.climbs import CLIMB_BACK_WAITING
from failover.api.probes import PROBE_LABEL
from failover.regional import decisions
from infra import kueue as stack_kueue
from infra.tpu_pool import PLAN_LABEL_KEY
from testbed import jobs
from testbed.failover_tier import (GRACE_SECONDS, NAMESPACE, PODS_READY_TIMEOUT_SECONDS,
                                   controller_running, start_failover_tier)
from ops.status import jobs as status_jobs
from ops.status.render import report_dict
from ops.status.report import build_report
from ops.status.snapshot import ClusterReader
from testbed.kube import condition, server_seconds, wait_for

pytestmark = pytest.mark.controlplane

# How long to wait for Kueue or the controller to react where no timing is being measured: generous, because the
# suite runs four test files at a time on two cores (the restart test failed once under that load, cause not
# captured; the tier keeps its logs on failure now).
REACTION_TIMEOUT = 60


@pytest.fixture(scope="module")
def tier(request):
    with controller_running(start_failover_tier(), request.session) as tier:
        yield tier


@pytest.fixture
def clean(tier):
    yield tier
    if tier.controller is None:
        tier.start_controller()
    tier.delete_all_jobs()


def test_kueue_runs_the_tiers_timeout_from_the_release(tier):
    # The release's values with the tier's timeout, rendered by the chart (test_kueue: stack config sets the value).
    assert tier.plane.kueue_config["waitForPodsReady"]["timeout"] == f"{PODS_READY_TIMEOUT_SECONDS}s"
    assert tier.plane.kueue.alive()


def test_the_controllers_objects_are_accepted_and_its_rbac_is_enough(tier):
    for kind, name in (("Deployment", "failover-controller"), ("ConfigMap", None)):
        found = [m for m in tier.plan.kubernetes_manifests() if m["kind"] == kind]
        assert found and all(tier.kube.get(m["apiVersion"], kind, m["metadata"]["name"],
                                           m["metadata"].get("namespace")) for m in found), kind
    # The controller runs with its ServiceAccount's token and completes passes (its health says so).
    assert tier.controller.alive()
    assert "Forbidden" not in tier.controller.tail(200)


def test_the_controller_serves_every_move_series_the_moves_alert_reads(tier):
    # Scraped as GMP would (issue 27): each (from, to, reason) a move can have exists from the start, so the first
    # move of each is an increase the alert sees (tests/test_alerts_promtool.py).
    chain = api.Chain.from_json(tier.controller_env()["FAILOVER_CHAIN"])
    for upper, lower, reason in decisions.possible_moves(chain):
        assert tier.samples("tpu_fallback_moves_total", from_flavor=upper, to_flavor=lower, reason=reason), \
            (upper, lower, reason)


def test_capacity_is_counted_once_across_the_chain(clean):
    tier = clean
    tier.submit("fill-on-demand")
    tier.submit("borrow-dws", queue="user-queue")  # plan A full: reserves dws, whose quota cluster-queue-dws holds
    tier.submit("direct-dws", queue="user-queue-dws")
    flavors = {job: jobs.decision(tier.kube, NAMESPACE, job).flavor
               for job in ("fill-on-demand", "borrow-dws", "direct-dws")}
    assert flavors == {"fill-on-demand": "on-demand", "borrow-dws": "dws", "direct-dws": None}, flavors


def test_timeout_path_moves_a_stocked_out_job_to_plan_b(clean):
    tier = clean
    # Nothing reports these stockouts: on-demand's pods wait for good, and so will dws's once "provisioned".
    tier.stockout("on-demand", "dws", reported=False)
    created = tier.submit("stockout-timeout")
    assert jobs.decision(tier.kube, NAMESPACE, "stockout-timeout").flavor == "on-demand"
    request = jobs.wait_provisioning_request(tier.kube, NAMESPACE, "stockout-timeout",
                                             timeout=PODS_READY_TIMEOUT_SECONDS + REACTION_TIMEOUT)
    print(f"timeout path: RayJob created -> dws ProvisioningRequest in {time.monotonic() - created:.1f} s "
          f"(podsReadyTimeout {PODS_READY_TIMEOUT_SECONDS} s)")
    # Not before the timeout, on the server's clock (whole seconds): the RayJob was created before Kueue admitted it,
    # and the timeout counts from the admission. How soon after is bench/bench_failover.py's to measure (created ->
    # request 30.5 s idle); a loaded CI run once took 42 s, so no upper bound on a test's clock here.
    rayjob = tier.kube.get(*jobs.RAYJOB, "stockout-timeout", NAMESPACE)
    waited = server_seconds(request["metadata"]["creationTimestamp"]) - server_seconds(
        rayjob["metadata"]["creationTimestamp"])
    assert waited >= PODS_READY_TIMEOUT_SECONDS - 1, waited
    assert request["spec"]["provisioningClassName"] == stack_kueue.PROVISIONING_CLASS
    assert tier.queues_of("stockout-timeout") == ("user-queue-dws", "user-queue-dws")
    move = wait_for(lambda: (m := tier.move_of("stockout-timeout")) and m.state == api.MOVED and m, 10,
                    "the move recorded")
    assert (move.from_flavor, move.to_flavor, move.reason) == ("on-demand", "dws", "PodsReadyTimeout")
    # The Event comes before the done mark (failover/regional/controller.py _record_done); waited for all the same.
    events = wait_for(lambda: tier.moves_recorded("stockout-timeout"), 10, "the move's Event")
    assert [e["message"] for e in events] == [decisions.move_message(move, "user-queue")]
    assert "default/stockout-timeout: moved from on-demand to dws" in tier.controller.tail(50)

    jobs.mark_provisioned(tier.kube, request, "tier-resize-timeout")
    wait_for(lambda: jobs.decision(tier.kube, NAMESPACE, "stockout-timeout").admitted, 20, "Admitted on dws")
    assert jobs.decision(tier.kube, NAMESPACE, "stockout-timeout").flavor == "dws"

    # On dws the pods never come either: Kueue evicts it again, and the controller moves nothing: it is on the
    # last rung. Passes keep seeing the same Evicted condition (a repeated event): still one move, one Event.
    wait_for(lambda: jobs.workload_of(tier.kube, NAMESPACE, "stockout-timeout")["status"].get("requeueState"),
             PODS_READY_TIMEOUT_SECONDS + 15, "the eviction from dws")
    tier.looked_at("stockout-timeout")
    assert tier.queues_of("stockout-timeout") == ("user-queue-dws", "user-queue-dws")
    assert tier.move_of("stockout-timeout") == move
    assert len(tier.moves_recorded("stockout-timeout")) == 1


def test_early_path_moves_on_the_autoscalers_stockout_before_the_timeout(clean):
    tier = clean
    tier.stockout("on-demand")
    submitted = tier.submit("stockout-early")
    admitted = time.monotonic()
    jobs.wait_provisioning_request(tier.kube, NAMESPACE, "stockout-early", timeout=PODS_READY_TIMEOUT_SECONDS)
    requested = time.monotonic()
    time_to_plan_b = requested - admitted
    print(f"early path: stockout reported -> dws ProvisioningRequest in {time_to_plan_b:.1f} s "
          f"(grace {GRACE_SECONDS} s)")
    # Before Kueue's timeout, and by the early path (the reason, below). How soon after the report is the bench's to
    # measure (bench/bench_failover.py: grace + 1.7 s); on a loaded suite submission -> request took 15.4 s once.
    assert time_to_plan_b < PODS_READY_TIMEOUT_SECONDS
    # The done mark is written after the reactivation that lets Kueue create the request: wait for it.
    move = wait_for(lambda: (m := tier.move_of("stockout-early")) and m.state == api.MOVED and m,
                    REACTION_TIMEOUT, "the move marked done")
    assert move.reason == "Stockout"
    workload = jobs.workload_of(tier.kube, NAMESPACE, "stockout-early")
    assert workload["spec"].get("active", True) is True  # it always ends active

    # KubeRay tore the stocked-out run down when Kueue suspended the job (no slice held on on-demand), and the
    # next run's pods land on the DWS slice once GKE provisions it.
    wait_for(lambda: not [p for p in tier.kube.list("v1", "Pod", namespace=NAMESPACE)
                          if (p["spec"].get("nodeSelector") or {}).get(PLAN_LABEL_KEY) == "on-demand"],
             REACTION_TIMEOUT, "the on-demand run's pods gone")
    assert not any(tier.gke.nodes_of(pool) for pool in tier.pools_of("on-demand"))
    request = jobs.wait_provisioning_request(tier.kube, NAMESPACE, "stockout-early")
    time.sleep(max(0.0, requested + DWS_WAIT_SECONDS - time.monotonic()))  # GKE takes its time to provision
    jobs.mark_provisioned(tier.kube, request, "tier-resize-early")
    provisioned = time.monotonic()
    jobs.wait_pods_ready(tier.kube, NAMESPACE, "stockout-early", REACTION_TIMEOUT)
    ready = time.monotonic()
    placed = wait_for(lambda: jobs.pools_of(tier.kube, NAMESPACE, "stockout-early"), REACTION_TIMEOUT,
                      "the DWS run's pods Running")
    assert (placed["head"], placed["submitter"]) == (["default-pool"], ["default-pool"])
    assert tier.on_one_slice_of("dws", placed["worker"]), placed
    assert len(tier.kube.list(*jobs.RAYCLUSTER, namespace=NAMESPACE)) == 1  # one run, never two

    time.sleep(max(0.0, ready + RUN_SECONDS - time.monotonic()))
    looked = time.monotonic()
    _goodput_is_accounted(tier, "stockout-early", move, looked - submitted, provisioned - requested, looked - ready)


# The early path's story on the scenario's clock, for its goodput: the DWS request is provisioned at least
# DWS_WAIT_SECONDS after it appears, and the job runs at least RUN_SECONDS before `ops status` looks (the test's clock
# says how long each took). Server timestamps are whole seconds and the test sees each change up to a poll later:
# each stretch the account reports is within a second below and GOODPUT_TOLERANCE_SECONDS above the test's.
DWS_WAIT_SECONDS, RUN_SECONDS, GOODPUT_TOLERANCE_SECONDS = 4, 4, 3


def _goodput_is_accounted(tier, job: str, move: api.Move, elapsed: float, dws_wait: float, run: float) -> None:
    """`ops status -o json`'s goodput of a job that waited on a stocked-out on-demand rung, moved to DWS, waited for
    its slice there and runs: each state's seconds against the scenario's times and the objects' own timestamps,
    and the controller's metric of it (failover/regional/goodput.py)."""
    report = report_dict(build_report(ClusterReader(tier.kube.api_client).read(NAMESPACE, "tier")))
    found = next(j["goodput"] for j in report["jobs"] if j["name"] == job)
    rayjob = tier.kube.get(*jobs.RAYJOB, job, NAMESPACE)
    workload = jobs.workload_of(tier.kube, NAMESPACE, job)
    changed = {c["type"]: server_seconds(c["lastTransitionTime"]) for c in workload["status"]["conditions"]}
    now, created = server_seconds(report["generatedAt"]), server_seconds(rayjob["metadata"]["creationTimestamp"])
    by_rung = {(part["state"], part["rung"]): part["seconds"] for part in found["byRung"]}
    print(f"goodput: {found['scheduling']:.3f} of {found['elapsedSeconds']} s (test clock {elapsed:.1f} s); "
          f"{by_rung}; the test's DWS wait {dws_wait:.1f} s, run {run:.1f} s")
    # Every second since the submission is in one state; the test's own clock agrees on how many.
    assert sum(found["seconds"].values()) == pytest.approx(found["elapsedSeconds"], abs=0.5)
    assert abs(found["elapsedSeconds"] - elapsed) <= GOODPUT_TOLERANCE_SECONDS, (found["elapsedSeconds"], elapsed)
    # Before the move: on-demand's capacity wait, from the submission to the move's start (estimated: what the job
    # did inside is no longer recorded), at least the stockout grace period.
    on_demand = by_rung[("capacity_wait", "on-demand")]
    assert on_demand == pytest.approx(server_seconds(move.at) - created, abs=0.5)
    assert on_demand >= GRACE_SECONDS - 1
    assert found["estimatedSeconds"] == pytest.approx(on_demand, abs=0.5)
    # The move, from its start to the reactivation (Kueue's Requeued condition): the controller's seconds.
    assert by_rung.get(("moving", "dws"), 0) == pytest.approx(changed["Requeued"] - server_seconds(move.at), abs=0.5)
    assert by_rung.get(("moving", "dws"), 0) <= GOODPUT_TOLERANCE_SECONDS
    # On DWS: the wait for the slice the scenario set, then the run it set.
    assert dws_wait - 1 <= by_rung[("capacity_wait", "dws")] <= dws_wait + GOODPUT_TOLERANCE_SECONDS, dws_wait
    running = by_rung[("running", "dws")]
    assert running == pytest.approx(now - changed["PodsReady"], abs=1)
    assert run - 1 <= running <= run + GOODPUT_TOLERANCE_SECONDS, (running, run)
    assert found["scheduling"] == pytest.approx(running / found["elapsedSeconds"], abs=0.01)  # both rounded
    # The controller exports it too (each pass, every 15 s).
    sample = wait_for(lambda: tier.samples("tpu_fallback_job_scheduling_goodput", job_namespace=NAMESPACE,
                                           job_name=job), 20, "the job's goodput series")
    assert 0 <= sample[0].value <= 1


def test_a_job_outside_the_chain_is_left_alone(clean):
    tier = clean
    tier.kube.create({"apiVersion": stack_kueue.KUEUE_API_VERSION, "kind": "LocalQueue",
                      "metadata": {"name": "outside-queue", "namespace": NAMESPACE},
                      "spec": {"clusterQueue": stack_kueue.CLUSTER_QUEUE}})
    try:
        tier.stockout("on-demand", reported=False)
        tier.submit("outside", queue="outside-queue")
        wait_for(lambda: jobs.workload_of(tier.kube, NAMESPACE, "outside")["status"].get("requeueState"),
                 PODS_READY_TIMEOUT_SECONDS + 15, "the PodsReady eviction")
        tier.looked_at("outside")
        assert tier.queues_of("outside") == ("outside-queue", "outside-queue")
        assert tier.move_of("outside") is None
    finally:
        tier.delete_all_jobs()
        tier.kube.delete(stack_kueue.KUEUE_API_VERSION, "LocalQueue", "outside-queue", NAMESPACE)


def test_a_restart_mid_move_finishes_the_move(clean):
    tier = clean
    tier.stop_controller()
    tier.stockout("on-demand")
    tier.submit("restart")
    # What a controller that crashed after its first two writes leaves: the intent, and the Workload inactive.
    move = api.Move("on-demand", "dws", "user-queue-dws", "Stockout", "2026-11-30T00:00:00Z")
    tier.kube.patch(*jobs.RAYJOB, "restart", {"metadata": {"annotations": {
        api.FAILOVER_ANNOTATION: move.to_json()}}}, namespace=NAMESPACE)
    workload = jobs.workload_of(tier.kube, NAMESPACE, "restart")
    tier.kube.patch(*jobs.WORKLOAD, workload["metadata"]["name"], {"spec": {"active": False}}, namespace=NAMESPACE)
    wait_for(lambda: jobs.suspended(tier.kube.get(*jobs.RAYJOB, "restart", NAMESPACE)), REACTION_TIMEOUT,
             "Kueue suspends it")

    tier.start_controller()
    jobs.wait_provisioning_request(tier.kube, NAMESPACE, "restart", timeout=REACTION_TIMEOUT)
    assert tier.queues_of("restart") == ("user-queue-dws", "user-queue-dws")
    assert jobs.workload_of(tier.kube, NAMESPACE, "restart")["spec"].get("active", True) is True
    # The done mark is the move's last write, after the reactivation that lets Kueue create the request: the two
    # race, so wait for it (the cause of this test's one unexplained failure, captured in the kept logs since).
    wait_for(lambda: tier.move_of("restart") == move.done(), REACTION_TIMEOUT, "the move marked done")
    assert len(tier.moves_recorded("restart")) == 1



def test_a_job_that_fails_is_retried_in_place_shown_failed_and_never_moved(clean):
    """The Ray job fails every time (a bug, not capacity): KubeRay retries it with a new RayCluster on the same
    admission (`backoffLimit`), then calls it Failed; Kueue finishes the Workload and frees the quota; the controller
    never takes a failure for a stockout; `ops status` says it failed."""
    tier = clean
    # One retry (the stack's default is 2): each failed run costs KubeRay's submitter Job its own pod retries
    # (measured: about 40 s a run), and one retry shows the retry stays on the admission as well as two.
    backoff_limit = 1
    job = jobs.dev_rayjob("fails")
    job["spec"]["backoffLimit"] = backoff_limit
    tier.kube.create(job)
    jobs.wait_decided(tier.kube, NAMESPACE, "fails")
    runs = set()

    def failed_for_good():
        job = tier.kube.get(*jobs.RAYJOB, "fails", NAMESPACE)
        status = job.get("status") or {}
        if status.get("jobDeploymentStatus") == "Failed":
            return job
        submission = status.get("jobId")
        if submission and submission not in runs and tier.plane.after.ray_head.asked_for(NAMESPACE, submission):
            tier.plane.after.ray_head.finish(NAMESPACE, "fails", "FAILED", "Traceback: a bug in train.py")
            runs.add(submission)
        return None
    job = wait_for(failed_for_good, REACTION_TIMEOUT * (backoff_limit + 2), "the RayJob Failed after its retries")
    assert len(runs) == backoff_limit + 1 and job["status"]["failed"] == backoff_limit + 1, (runs, job["status"])
    workload = wait_for(lambda: (w := jobs.workload_of(tier.kube, NAMESPACE, "fails")) and condition(
        w, "Finished") == "True" and w, REACTION_TIMEOUT, "the Workload Finished")
    assert jobs.tpu_flavor(workload) == "on-demand"  # every retry ran on the rung it was admitted on
    tier.looked_at("fails")
    assert tier.move_of("fails") is None and tier.queues_of("fails") == ("user-queue", "user-queue")
    assert not tier.moves_recorded("fails")

    report = build_report(ClusterReader(tier.kube.api_client).read(NAMESPACE, "tier"))
    (view,) = [j for j in report.jobs if j.name == "fails"]
    assert view.state == status_jobs.FINISHED and view.words == "finished (Failed)", (view.state, view.words)


# ---- the controller reacts to what its watches deliver, not to a resync ---------------------------------------------
# With the resync an hour away, both paths still move a stocked-out job, a waiting job climbs onto its probe's slice,
# and the controller's metrics say what happened. Behaviour tests; the one-second goals live in
# bench/bench_controller_scale.py, but for the climb onto a probe's slice, whose bound is the (43).


@pytest.fixture
def watch_only(clean):
    """A fresh controller, its counters from 0 (no resync since its start: the tier's is an hour away,
    failover_tier.RESYNC_SECONDS); `clean` starts the usual one again after."""
    tier = clean
    tier.stop_controller()
    tier.start_controller()
    yield tier
    tier.stop_controller()


def _moved(tier, job: str) -> api.Move:
    return wait_for(lambda: (m := tier.move_of(job)) and m.state == api.MOVED and m, REACTION_TIMEOUT,
                    f"{job}'s move recorded")


def test_the_early_path_acts_when_the_grace_period_ends_without_a_resync(watch_only):
    tier = watch_only
    tier.stockout("on-demand")
    tier.submit("watch-early")
    # The event arrives by watch; the grace period ends with no other change: the controller must have queued
    # the Workload for that moment.
    jobs.wait_provisioning_request(tier.kube, NAMESPACE, "watch-early", timeout=GRACE_SECONDS + REACTION_TIMEOUT)
    move = _moved(tier, "watch-early")
    assert (move.from_flavor, move.to_flavor, move.reason) == ("on-demand", "dws", api.STOCKOUT)
    assert tier.metric("tpu_fallback_resyncs_total") == 0
    assert tier.metric("tpu_fallback_moves_total", from_flavor="on-demand", to_flavor="dws",
                       reason=api.STOCKOUT) == 1
    # Seconds from the stockout signal to the move's first write: at least the grace period.
    assert tier.metric("tpu_fallback_move_delay_seconds_count", reason=api.STOCKOUT) == 1
    assert tier.metric("tpu_fallback_move_delay_seconds_sum", reason=api.STOCKOUT) >= GRACE_SECONDS - 1
    assert tier.metric("tpu_fallback_watch_events_total", resource="events") >= 1


def test_a_podsready_eviction_is_moved_without_a_resync(watch_only):
    tier = watch_only
    waits_before = {flavor: tier.metric("tpu_fallback_admission_wait_seconds_count", flavor=flavor)
                    for flavor in ("on-demand", "dws")}
    tier.stockout("on-demand", reported=False)
    tier.submit("watch-timeout")
    assert jobs.decision(tier.kube, NAMESPACE, "watch-timeout").flavor == "on-demand"
    request = jobs.wait_provisioning_request(tier.kube, NAMESPACE, "watch-timeout",
                                             timeout=PODS_READY_TIMEOUT_SECONDS + REACTION_TIMEOUT)
    move = _moved(tier, "watch-timeout")
    assert (move.from_flavor, move.to_flavor, move.reason) == ("on-demand", "dws", api.PODS_READY_TIMEOUT)
    assert tier.queues_of("watch-timeout") == ("user-queue-dws", "user-queue-dws")
    assert tier.metric("tpu_fallback_resyncs_total") == 0
    assert tier.metric("tpu_fallback_moves_total", reason=api.PODS_READY_TIMEOUT) == 1
    # From admission to the move: Kueue's timeout, at least.
    assert tier.metric("tpu_fallback_move_delay_seconds_sum",
                       reason=api.PODS_READY_TIMEOUT) >= PODS_READY_TIMEOUT_SECONDS - 1
    # Quota reserved on on-demand, then (after the move) on dws: one wait each.
    assert tier.metric("tpu_fallback_admission_wait_seconds_count", flavor="on-demand") == waits_before["on-demand"] + 1
    history = api.move_history(tier.kube.get(*jobs.RAYJOB, "watch-timeout", NAMESPACE)["metadata"]
                               .get("annotations"))
    assert history == [move]

    # GKE provisions the DWS slice: the check's result is counted once.
    (check,) = jobs.check_states(jobs.workload_of(tier.kube, NAMESPACE, "watch-timeout"))
    jobs.mark_provisioned(tier.kube, request, "watch-resize")
    wait_for(lambda: jobs.decision(tier.kube, NAMESPACE, "watch-timeout").admitted, REACTION_TIMEOUT,
             "Admitted on dws")
    wait_for(lambda: tier.metric("tpu_fallback_admission_check_outcomes_total", admission_check=check,
                                 state="Ready") == 1, 10, "the check's Ready counted")
    assert tier.metric("tpu_fallback_admission_wait_seconds_count", flavor="dws") == waits_before["dws"] + 1


CLIMB_BOUND_SECONDS = 2  # issue 43: from the probe's slice appearing to the waiting job's climb
GOODPUT_ELAPSED_SECONDS = 60  # the account compared once it spans this long: 2 points are 1.2 s of it


def test_a_job_waiting_for_dws_climbs_onto_its_probes_slice_within_2_s_without_a_resync(watch_only):
    """The capacity story the dev stack once lost to the tutorial (issue 43): on-demand out of stock for less than
    the DWS request takes, so the job moved to DWS after the grace period, and a probe stood on on-demand. Capacity
    comes back (here before `fallback.climbBack.settle`, 5 m as deployed, has passed since the job's own stockout,
    and DWS never provisions): the autoscaler grows the slice for the probe, and the waiting job climbs onto it
    within CLIMB_BOUND_SECONDS of the slice appearing, with no resync. It once waited there, the slice idle and
    billed, until its stockout was `settle` old."""
    tier = watch_only
    kept = tier.gke.scale_down_seconds
    tier.gke.scale_down_seconds = 600  # the probed slice stays, as GKE's scale-down delay keeps it
    try:
        tier.stockout("on-demand")
        submitted = datetime.datetime.now(datetime.timezone.utc)
        tier.submit("story-2")
        jobs.wait_provisioning_request(tier.kube, NAMESPACE, "story-2", timeout=GRACE_SECONDS + REACTION_TIMEOUT)
        assert _moved(tier, "story-2").to_flavor == "dws"
        probe = wait_for(lambda: next(iter(tier.capacity_probes()), None), REACTION_TIMEOUT, "a probe on on-demand")
        assert probe["metadata"]["labels"][PROBE_LABEL] == "on-demand" and not probe["spec"].get("nodeName")
        wait_for(lambda: tier.gke.reported.get(probe["metadata"]["uid"]), REACTION_TIMEOUT,
                 "the stockout reported on the probe")

        pools, restored = tier.pools_of("on-demand"), time.monotonic()
        for pool in pools:
            tier.gke.restore(pool)
        climb = wait_for(lambda: (m := tier.move_of("story-2")) and m.reason == CLIMB_BACK_WAITING and m,
                         REACTION_TIMEOUT, "the climb to on-demand", interval=0.05)
        seen = time.monotonic()
        (appeared,) = [at for at, what, pool, _slice in tier.gke.history
                       if what == "up" and pool in pools and at >= restored]
        assert (climb.from_flavor, climb.to_flavor) == ("dws", "on-demand")
        assert seen - appeared <= CLIMB_BOUND_SECONDS, seen - appeared
        wait_for(lambda: tier.running_on("story-2", "on-demand"), REACTION_TIMEOUT, "the job on the probe's slice",
                 interval=0.1)
        running_from = datetime.datetime.now(datetime.timezone.utc)
        wait_for(lambda: not tier.capacity_probes(), REACTION_TIMEOUT, "the probe gone")
        assert tier.metric("tpu_fallback_resyncs_total") == 0
        assert tier.metric("tpu_fallback_capacity_probes_total", flavor="on-demand", outcome="found") == 1
        assert tier.metric("tpu_fallback_idle_tpu_chips_while_waiting", flavor="on-demand") == 0

        # The goodput `ops status -o json` says matches the one measured here within 2 points (issue 43 item 5):
        # running since the test saw every pod ready, over the time since it asked for the job.
        def reported() -> dict | None:
            (job,) = [j for j in report_dict(build_report(ClusterReader(tier.kube.api_client).read(NAMESPACE, "tier")))
                      ["jobs"] if j["name"] == "story-2"]
            return job["goodput"] if job["goodput"]["elapsedSeconds"] >= GOODPUT_ELAPSED_SECONDS else None
        goodput = wait_for(reported, GOODPUT_ELAPSED_SECONDS + REACTION_TIMEOUT, "a minute of the job's account")
        until = api.parse_time(goodput["until"])
        measured = (until - running_from) / (until - submitted)
        assert abs(goodput["scheduling"] - measured) <= 0.02, (goodput["scheduling"], measured)
        print(f"\nthe waiting job climbed {seen - appeared:.2f} s after its probe's slice appeared; goodput "
              f"{goodput['scheduling']:.3f} reported, {measured:.3f} measured")
    finally:
        tier.gke.scale_down_seconds = kept
