"""`python -m ops status` against a real kube-apiserver 1.36 and Kueue 0.19.2, with real objects in every state.

One tier for the file: the dev stack's platform with the whole ladder (reservation, on-demand, Spot, two DWS slices),
its objects deployed as `pulumi up` creates them, the failover controller's Deployment included but not run (nothing
here moves: the moves are written as the controller writes them). testbed/status_states.py puts each job
in its state; every expectation below is read back from the tier or from the scenario, never from the report.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import subprocess
import sys

import pytest
import yaml

from failover import api
from failover.regional import decisions
from failover.api import TPU_RESOURCE, parse_time
from infra import failover as stack_failover
from infra import kueue as stack_kueue
from ops.status import cli, health
from ops.status import jobs as states
from ops.status.ladder import FROM_CLUSTER_QUEUES, FROM_CONTROLLER, chain_of_controller
from ops.status.report import Report, build_report
from ops.status.snapshot import ClusterReader
from testbed import jobs
from testbed.cluster import ControlPlane
from testbed.failover_tier import FailoverTier
from testbed.kube import condition, wait_for
from testbed.stack import release_values
from testbed.status_states import (NAMESPACE, OTHER_NAMESPACE, PODS_READY_TIMEOUT_SECONDS, REACTION_TIMEOUT,
                                   create_every_state, install_kueue_config_map, ladder_plan,
                                   play_a_healthy_controller)
from tests.conftest import REPO

pytestmark = pytest.mark.controlplane

EXPECTED_STATES = {
    "st-finished": states.FINISHED, "st-running": states.RUNNING, "st-admitted": states.ADMITTED,
    "st-evicted": states.EVICTED, "st-moving": states.MOVING, "st-dws-wait": states.WAITING_FOR_SLICE,
    "st-dws-provisioned": states.ADMITTED, "st-waiting": states.WAITING_FOR_QUOTA,
    "st-moved-waiting": states.WAITING_FOR_QUOTA, "st-no-queue": states.NOT_QUEUED,
}
# The states whose job holds quota on its rung (or finished there).
HOLDING = {states.FINISHED, states.RUNNING, states.ADMITTED, states.WAITING_FOR_SLICE}


@pytest.fixture(scope="module")
def tier(request):
    plan = ladder_plan()
    tier = FailoverTier(ControlPlane(release_values(plan, PODS_READY_TIMEOUT_SECONDS), nodes_of=plan), plan).start()
    try:
        install_kueue_config_map(tier)
        tier.placed = create_every_state(tier)
    except BaseException:
        tier.plane.stop(keep_workdir=True)
        raise
    yield tier
    failed = request.session.testsfailed > 0
    tier.plane.stop(keep_workdir=failed)
    if failed:
        print(f"\nstatus tier logs kept in {tier.plane.supervisor.logs}")


def read(tier: FailoverTier, namespace: str | None = NAMESPACE, api_client=None) -> Report:
    return build_report(ClusterReader(api_client or tier.kube.api_client).read(namespace, "tier"))


def controllers_chain(tier: FailoverTier):
    (deployment,) = [m for m in tier.plan.kubernetes_manifests()
                     if m["kind"] == "Deployment" and m["metadata"]["name"] == stack_failover.NAME]
    return chain_of_controller(deployment)


def chips_per_job() -> int:
    """The dev RayJob's TPU chips: its TPU worker pods (replicas x hosts) times each pod's request."""
    (group,) = jobs.dev_rayjob()["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    (container,) = [c for c in group["template"]["spec"]["containers"]
                    if TPU_RESOURCE in (c.get("resources") or {}).get("requests", {})]
    return group.get("replicas", 1) * group.get("numOfHosts", 1) * int(container["resources"]["requests"][TPU_RESOURCE])


def test_every_job_state_from_real_objects(tier):
    # The conditions are compared with the objects the report was built from: Kueue rewrites a pending Workload's
    # message as quota moves, so a second read may differ.
    snapshot = ClusterReader(tier.kube.api_client).read(NAMESPACE, "tier")
    report = build_report(snapshot)

    def workload_condition(job: str, kind: str) -> dict:
        (workload,) = [w for w in snapshot.workloads if any(
            o["kind"] == "RayJob" and o["name"] == job for o in w["metadata"].get("ownerReferences") or [])]
        return next(c for c in workload["status"]["conditions"] if c["type"] == kind)

    views = {job.name: job for job in report.jobs}
    print("\n" + "\n".join(f"{j.name}: {j.state} | {j.words} | {j.detail}" for j in report.jobs))
    assert {name: view.state for name, view in views.items()} == EXPECTED_STATES  # research's job not shown

    chain = controllers_chain(tier)
    first_rung = chain.rungs[0].flavor
    for name, view in views.items():
        placed = tier.placed[name]
        if view.state in HOLDING:  # the flavor Kueue reserved when it decided, read back from its Workload then
            assert view.rung == placed.holds, name
        assert view.local_queue == placed.queue, name

    # Since when: the condition Kueue set for that state.
    for name, kind in (("st-finished", "Finished"), ("st-running", "PodsReady"), ("st-admitted", "Admitted"),
                       ("st-evicted", "Evicted"), ("st-dws-wait", "QuotaReserved")):
        assert views[name].since == parse_time(workload_condition(name, kind)["lastTransitionTime"]), name

    evicted = views["st-evicted"]
    reason = workload_condition("st-evicted", "Evicted")
    print(f"Kueue 0.19.2, deactivated while admitted: Evicted {reason['reason']}: {reason['message']}")
    assert evicted.words == f"evicted from {tier.placed['st-evicted'].holds}: deactivated"
    assert reason["message"] in evicted.detail and evicted.rung == first_rung  # Kueue would retry its queue's first

    waiting = views["st-waiting"]
    assert waiting.detail == workload_condition("st-waiting", "QuotaReserved")["message"]
    assert waiting.rung == chain.rungs[chain.start_of_queue("user-queue-dws")].flavor

    moved = views["st-moved-waiting"]
    (moved_workload,) = [w for w in snapshot.workloads if w["metadata"]["name"] == moved.workload]
    print("Kueue 0.19.2, a pending Workload moved by deactivate/repoint/reactivate:",
          [(c["type"], c["status"], c["reason"]) for c in moved_workload["status"]["conditions"]])
    assert [(m.from_flavor, m.to_flavor) for m in moved.moves] == [("on-demand", "dws")] and moved.rung == "dws"
    assert moved.detail.startswith("moved here from on-demand by the failover controller")

    moving = views["st-moving"]
    assert (moving.words, moving.rung) == (f"moving from {tier.placed['st-moving'].holds} to dws", "dws")

    walked = views["st-dws-wait"]
    assert [(m.from_flavor, m.to_flavor, m.reason) for m in walked.moves] == [
        ("on-demand", "spot", api.STOCKOUT), ("spot", "dws", api.PODS_READY_TIMEOUT)]
    for name, request_state in (("st-dws-wait", "Accepted"), ("st-dws-provisioned", "Provisioned")):
        workload = jobs.workload_of(tier.kube, NAMESPACE, name)
        (request,) = jobs.provisioning_requests(tier.kube, NAMESPACE, workload)
        assert (views[name].request.name, views[name].request.state) == (request["metadata"]["name"], request_state)
        assert views[name].request.dws
    assert walked.words == "waiting for a DWS slice" and dict(walked.checks) == jobs.check_states(
        jobs.workload_of(tier.kube, NAMESPACE, "st-dws-wait"))
    assert views["st-finished"].words == "finished (Succeeded)" and views["st-no-queue"].workload is None


def test_the_rungs_their_queues_and_their_quota(tier):
    chain = controllers_chain(tier)
    chips = chips_per_job()
    slices = {"reservation": 1, "on-demand": 1, "spot": 1, "dws": 2}  # status_states.LADDER on the dev stack
    # Who holds quota where now (the finished job released its own; the deactivated ones theirs).
    holding = [p for p in tier.placed.values() if p.name in ("st-running", "st-admitted", "st-other-team",
                                                             "st-dws-wait", "st-dws-provisioned")]
    not_admitted = {"st-dws-wait"}

    def expected(rung) -> tuple:
        here = [p for p in holding if p.holds == rung.flavor]
        borrowed = [p for p in here if (chain.rungs[chain.start_of_queue(p.queue)].cluster_queue != rung.cluster_queue)]
        return (slices[rung.flavor] * chips, len(here) * chips,
                len([p for p in here if p.name not in not_admitted]) * chips, len(borrowed) * chips)

    def quotas(report: Report) -> list[tuple]:
        return [(q.nominal, q.reserved, q.used, q.borrowed) for q in
                (s.rung.quota_of(TPU_RESOURCE) for s in report.rungs)]

    # Kueue writes ClusterQueue status after its cache: wait for it to settle, then compare.
    report = read(tier)
    want = [expected(s.rung) for s in report.rungs]
    report = wait_for(lambda: (r := read(tier)) and quotas(r) == want and r, REACTION_TIMEOUT, "quota as placed")
    assert report.ladder.source == FROM_CONTROLLER
    assert [(s.rung.flavor, s.rung.entry_queue, s.rung.local_queue) for s in report.rungs] == [
        (r.flavor, r.cluster_queue, r.local_queue) for r in chain.rungs]
    assert [s.rung.admission_check is not None for s in report.rungs] == [r.admission_check for r in chain.rungs]
    assert all(s.rung.flavor_exists and s.rung.check_active is not False for s in report.rungs)
    assert all(q.active for q in report.ladder.queues)
    # Jobs in namespace default: reservation runs st-running; on-demand admits st-admitted (the deactivated
    # st-evicted waits for nothing); Spot's job is research's; dws admits one and has four waiting for it
    # (st-dws-wait's slice, st-waiting, st-moved-waiting, st-moving's target).
    assert [(s.rung.flavor, s.admitted, s.pending) for s in report.rungs] == [
        ("reservation", 1, 0), ("on-demand", 1, 0), ("spot", 0, 0), ("dws", 1, 4)]


def test_all_namespaces_and_the_command_line(tier):
    kubeconfig = str(tier.plane.kubeconfig)
    run = subprocess.run([sys.executable, "-m", "ops", "status", "--kubeconfig", kubeconfig, "--context", "tier",
                          "-A", "-o", "json"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    found = {(j["namespace"], j["name"]): j for j in data["jobs"]}
    assert data["namespace"] is None and data["context"] == "tier"
    assert found[(OTHER_NAMESPACE, "st-other-team")]["state"] == states.ADMITTED
    assert {name for namespace, name in found if namespace == NAMESPACE} == set(EXPECTED_STATES)
    spot = next(r for r in data["rungs"] if r["flavor"] == tier.placed["st-other-team"].holds)
    assert spot["admittedJobs"] == 1 and spot["quota"][TPU_RESOURCE]["borrowed"] == chips_per_job()

    run = subprocess.run([sys.executable, "-m", "ops", "status", "--kubeconfig", kubeconfig, "-n", OTHER_NAMESPACE],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert f"JOBS (namespace {OTHER_NAMESPACE})" in run.stdout and "st-other-team" in run.stdout
    assert "st-running" not in run.stdout and "LADDER (rungs from the failover controller's chain" in run.stdout


def test_what_a_user_may_not_read_is_reported_not_fatal(tier):
    """A user who may list jobs and Workloads only: the jobs are shown, the rest is named as a problem."""
    kube = tier.kube
    name = "status-reader"
    kube.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": NAMESPACE}})
    kube.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
                 "rules": [{"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": ["list"]},
                           {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["list"]}]})
    kube.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                 "metadata": {"name": name},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                 "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]})
    from kubernetes import config

    restricted = config.new_client_from_config(config_file=str(
        tier.plane.kubeconfig_for_service_account(NAMESPACE, name)))
    report = wait_for(lambda: (r := read(tier, api_client=restricted)) and r.jobs and r, REACTION_TIMEOUT,
                      "the binding in effect")
    assert {j.name: j.state for j in report.jobs}["st-running"] == states.RUNNING
    who = f"system:serviceaccount:{NAMESPACE}:{name}"
    assert f"cannot list ClusterQueues (cluster-wide): 403 Forbidden for {who}" in report.problems, report.problems
    assert (f"cannot get Deployment {stack_failover.NAMESPACE}/{stack_failover.NAME}: 403 Forbidden for {who}"
            in report.problems), report.problems
    # Neither the ClusterQueues nor the LocalQueues: the ladder is unknown, not empty.
    assert report.controller.state == health.UNKNOWN and report.rungs == () and report.ladder.source == "unknown"
    assert not report.complete


def test_the_controllers_health_and_a_stack_without_one(tier):
    # Deployed as the stack declares it, but no controller-manager makes its pods: not ready.
    report = read(tier)
    assert (report.controller.state, report.controller.ready, report.controller.desired) == (health.DEGRADED, 0, 1)
    assert report.controller.latest_move is None

    walked = tier.placed["st-dws-wait"]
    message = decisions.move_message(api.Move("spot", "dws", "user-queue-dws", api.PODS_READY_TIMEOUT,
                                              "2026-11-30T00:00:00Z"), "user-queue-spot")
    play_a_healthy_controller(tier.kube, restarts=3, moved=walked, message=message)
    report = read(tier)
    controller = report.controller
    assert (controller.state, controller.ready, controller.desired, controller.restarts) == (health.HEALTHY, 1, 1, 3)
    assert (controller.latest_move.job, controller.latest_move.message) == (walked.name, message)
    rungs_with_controller = [(s.rung.flavor, s.rung.entry_queue, s.rung.local_queue) for s in report.rungs]

    # A stack without a controller (one rung has none): the ladder comes from the ClusterQueues, the same.
    tier.kube.delete("apps/v1", "Deployment", stack_failover.NAME, stack_failover.NAMESPACE, propagation="Background")
    wait_for(lambda: tier.kube.get("apps/v1", "Deployment", stack_failover.NAME, stack_failover.NAMESPACE) is None,
             REACTION_TIMEOUT, "the Deployment gone")
    report = read(tier)
    assert report.controller.state == health.NOT_DEPLOYED and report.ladder.source == FROM_CLUSTER_QUEUES
    assert [(s.rung.flavor, s.rung.entry_queue, s.rung.local_queue) for s in report.rungs] == rungs_with_controller
    assert report.controller.latest_move.job == walked.name  # the Events outlive the controller


# ---- truth under denial and failure (issue: ops status never mistakes a denial for absence) -------------------------
def ops_status(*argv: str, in_a_process: bool = False) -> subprocess.CompletedProcess:
    """The command as a user runs it: in this process (its streams captured; an exception would fail the test as a
    traceback would), or, where the process itself is the point, as `python -m ops status`."""
    if in_a_process:
        return subprocess.run([sys.executable, "-m", "ops", "status", *argv], cwd=REPO, capture_output=True,
                              text=True, timeout=90)
    out, err = io.StringIO(), io.StringIO()
    code = cli.run(cli.add_arguments(argparse.ArgumentParser()).parse_args(list(argv)), out, err)
    return subprocess.CompletedProcess(list(argv), code, out.getvalue(), err.getvalue())


def namespace_viewer(tier: FailoverTier, name: str = "team-viewer") -> str:
    """A team member's usual rights: the built-in `view` role in the jobs' namespace only (the Kueue chart's viewer
    roles aggregate into it), as a kubeconfig path."""
    kube = tier.kube
    kube.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": NAMESPACE}})
    kube.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                 "metadata": {"name": name, "namespace": NAMESPACE},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
                 "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]})
    return str(tier.plane.kubeconfig_for_service_account(NAMESPACE, name))


def test_a_namespace_only_identity_is_told_what_it_cannot_read(tier):
    kubeconfig = namespace_viewer(tier)
    who = f"system:serviceaccount:{NAMESPACE}:team-viewer"
    admin = read(tier)

    def allowed():
        run = ops_status("--kubeconfig", kubeconfig, "-o", "json")
        data = json.loads(run.stdout) if run.stdout else {}
        return (run, data) if data.get("jobs") else None
    run, data = wait_for(allowed, REACTION_TIMEOUT, "the view binding in effect")
    assert run.returncode == 3 and "Traceback" not in run.stderr, run.stderr  # partial: a script can tell
    assert data["complete"] is False and data["clusterQueues"] is None
    assert data["readable"]["cluster_queues"] is False and data["readable"]["workloads"] is True
    assert f"cannot list ClusterQueues (cluster-wide): 403 Forbidden for {who}" in data["problems"]
    # The rungs are still known (from the LocalQueues' status), in the chain's order; their quota is not.
    assert [r["flavor"] for r in data["rungs"]] == [s.rung.flavor for s in admin.rungs]
    assert all(r["quota"] is None for r in data["rungs"]) and data["quotaKnown"] is False
    # Every job keeps its state and rung; the one waiting for a DWS slice is still waiting for a slice.
    restricted = {j["name"]: (j["state"], j["rung"]) for j in data["jobs"]}
    assert restricted == {j.name: (j.state, j.rung) for j in admin.jobs}
    assert restricted["st-dws-wait"][0] == states.WAITING_FOR_SLICE
    assert data["failoverController"]["state"] == health.UNKNOWN

    run = ops_status("--kubeconfig", kubeconfig)
    assert run.returncode == 3
    assert f"  quota unknown: cannot list ClusterQueues (cluster-wide): 403 Forbidden for {who}" in run.stdout
    assert "no ClusterQueue with TPU quota" not in run.stdout and "CLUSTERQUEUES unknown" in run.stdout
    assert "rungs from the LocalQueues shown" in run.stdout

    # A namespace it may not read: unknown, never "no jobs".
    run = ops_status("--kubeconfig", kubeconfig, "-n", OTHER_NAMESPACE, "-o", "json")
    data = json.loads(run.stdout)
    assert run.returncode == 3 and data["jobs"] is None and data["readable"]["workloads"] is False
    assert (f"cannot list Workloads in namespace {OTHER_NAMESPACE}: 403 Forbidden for {who}" in data["problems"])
    run = ops_status("--kubeconfig", kubeconfig, "-n", OTHER_NAMESPACE)
    assert f"JOBS (namespace {OTHER_NAMESPACE}) unknown" in run.stdout and "no jobs" not in run.stdout


def one_error_line(run: subprocess.CompletedProcess) -> str:
    assert run.returncode == 1 and run.stdout == "" and run.stderr.count("\n") == 1, (run.stdout, run.stderr)
    assert "Traceback" not in run.stderr
    return run.stderr


def test_a_server_that_is_down_frozen_or_rejects_the_token_and_a_bad_kubeconfig(tier, tmp_path):
    from testbed.processes import free_port

    admin = yaml.safe_load(tier.plane.kubeconfig.read_text())

    def kubeconfig_with(name: str, server: str | None = None, token: str | None = None) -> str:
        changed = json.loads(json.dumps(admin))
        if server:
            changed["clusters"][0]["cluster"]["server"] = server
        if token:
            changed["users"][0]["user"] = {"token": token}
        path = tmp_path / name
        path.write_text(yaml.safe_dump(changed))
        return str(path)

    # A stopped API server: nothing listens on its port (a real process: no traceback on its stderr).
    down = f"https://127.0.0.1:{free_port()}"
    error = one_error_line(ops_status("--kubeconfig", kubeconfig_with("down", server=down), in_a_process=True))
    assert error.startswith(f"error: cannot reach the API server at {down}: ") and "Connection refused" in error
    # A rejected token: the first call, and again once the client's discovery cache exists for that server.
    for _ in range(2):
        error = one_error_line(ops_status("--kubeconfig", kubeconfig_with("bad-token", token="not-a-token")))
        assert error == f"error: the API server at {tier.plane.server} rejected the credentials: 401 Unauthorized\n"
    # A kubeconfig that is not YAML.
    broken = tmp_path / "broken"
    broken.write_text("clusters: [{name: tier")
    error = one_error_line(ops_status("--kubeconfig", str(broken)))
    assert error.startswith(f"error: kubeconfig {broken} is not YAML: ")
    # A job that does not exist: kubectl's NotFound, exit 1; the JSON names it.
    run = ops_status("--kubeconfig", str(tier.plane.kubeconfig), "no-such-job", "-o", "json")
    assert run.returncode == 1 and run.stderr == f'Error from server (NotFound): no job "no-such-job" in namespace {NAMESPACE}\n'
    assert json.loads(run.stdout)["notFound"] == ["no-such-job"] and json.loads(run.stdout)["jobs"] == []
    # A server that accepts and never answers (frozen: SIGSTOP): one line after the request timeout, not a hang.
    tier.plane.freeze()
    try:
        error = one_error_line(ops_status("--kubeconfig", str(tier.plane.kubeconfig), "--request-timeout", "1"))
    finally:
        tier.plane.thaw()
    assert error.startswith(f"error: cannot reach the API server at {tier.plane.server}: ") and "timed out" in error


def test_a_batch_job_in_a_ladder_queue_is_shown_with_its_chips_and_state(tier):
    """Kueue admits more than RayJobs: a batch Job in a LocalQueue of the ladder is a job like any other."""
    kube, namespace, name = tier.kube, "batch-team", "train-batch"
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    kube.create({"apiVersion": stack_kueue.KUEUE_API_VERSION, "kind": "LocalQueue",
                 "metadata": {"name": stack_kueue.LOCAL_QUEUE, "namespace": namespace},
                 "spec": {"clusterQueue": stack_kueue.CLUSTER_QUEUE}})
    hosts, chips_per_host = 4, 4
    # Suspended, as Kueue's Job webhook would make it (the tier installs only Kueue's and Ray's webhooks).
    kube.create({"apiVersion": "batch/v1", "kind": "Job", "metadata": {
        "name": name, "namespace": namespace, "labels": {jobs.QUEUE_LABEL: stack_kueue.LOCAL_QUEUE}},
        "spec": {"suspend": True, "parallelism": hosts, "completions": hosts, "template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "train", "image": "python:3.11", "resources": {
                "requests": {TPU_RESOURCE: str(chips_per_host), "cpu": "1"},
                "limits": {TPU_RESOURCE: str(chips_per_host)}}}]}}}})
    # Kueue's verdict on the Job's Workload: it waits. Every rung's quota is held by the scenario's jobs
    # (create_every_state: st-running on the reservation, st-admitted on on-demand, st-other-team on Spot, the two
    # DWS jobs on both DWS slices), and none is freed while the module runs: no job ends, and none is evicted before
    # Kueue's pods-ready timeout (PODS_READY_TIMEOUT_SECONDS, which the next test relies on too). Nothing else waits
    # in the Job's ClusterQueue (the waiting jobs are in the DWS one), so it is first in line.
    workload = wait_for(lambda: next((w for w in tier.kube.list(stack_kueue.KUEUE_API_VERSION, "Workload", namespace)
                                      if jobs.decided(w)), None), REACTION_TIMEOUT, "Kueue's verdict on the Job")
    assert condition(workload, "QuotaReserved") == "False", workload["status"]
    run = ops_status("--kubeconfig", str(tier.plane.kubeconfig), "-n", namespace, "-o", "json")
    assert run.returncode == 0, run.stderr
    (job,) = json.loads(run.stdout)["jobs"]
    assert (job["kind"], job["name"], job["workload"]) == ("Job", name, workload["metadata"]["name"])
    assert (job["chips"], job["hosts"], job["podsNeeded"], job["podsReady"]) == (hosts * chips_per_host, hosts,
                                                                                 hosts, 0)
    assert job["state"] == states.WAITING_FOR_QUOTA
    assert job["position"] == {"inClusterQueue": 0, "source": "computed"}
    run = ops_status("--kubeconfig", str(tier.plane.kubeconfig), "-n", namespace, name)
    assert run.returncode == 0 and name in run.stdout and " Job " in run.stdout


def test_admitted_waiting_for_pods_says_when_kueue_evicts_it(tier):
    """Admission + waitForPodsReady's timeout, read from Kueue's ConfigMap as the chart installs it."""
    report = read(tier)
    (admitted,) = [j for j in report.jobs if j.name == "st-admitted"]
    workload = jobs.workload_of(tier.kube, NAMESPACE, "st-admitted")
    admitted_at = parse_time(next(c for c in workload["status"]["conditions"] if c["type"] == "Admitted")[
        "lastTransitionTime"])
    assert admitted.evict_at == admitted_at + datetime.timedelta(seconds=PODS_READY_TIMEOUT_SECONDS)
    assert [j.name for j in report.jobs if j.evict_at is not None] == sorted(
        j.name for j in report.jobs if j.state == states.ADMITTED)
