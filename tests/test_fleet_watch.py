"""The fleet watch's findings (failover/fleet.py): where a fleet job runs against Kueue's record. Pure functions; the
real partition and return are in tests/test_fleet_controlplane.py."""

from __future__ import annotations

import json

from failover.fleet import (MEMBER_LOST, RECORD_STALE, RUNNING, RUNNING_TWICE, WARNINGS, Finding, assess, changed)


def test_a_job_running_where_kueue_says_is_running():
    finding = assess("w2", {"w1": False, "w2": True}, frozenset())
    assert finding == Finding(RUNNING, ("w2",), "w2")
    assert finding.message() == "runs in w2" and RUNNING not in WARNINGS


def test_a_job_that_runs_nowhere_waits():
    finding = assess(None, {"w1": False, "w2": False}, frozenset())
    assert (finding.state, finding.runs_in) == ("Waiting", ()) and "Waiting" not in WARNINGS


def test_after_the_return_the_run_is_where_kueue_kept_it_not_where_its_record_says():
    """Measured on Kueue 0.19.2: back from a partition, w2 keeps the job (older admission), the record says w1."""
    finding = assess("w1", {"w1": False, "w2": True}, frozenset())
    assert (finding.state, finding.runs_in, finding.record) == (RECORD_STALE, ("w2",), "w1")
    assert finding.message().startswith("runs in w2; Kueue's record still names w1")
    assert RECORD_STALE in WARNINGS
    # Measured too: back from a partition before the other member provisioned, no record at all.
    nowhere = assess(None, {"w1": False, "w2": True}, frozenset())
    assert nowhere.state == RECORD_STALE and nowhere.message().startswith("runs in w2; Kueue's record names no member")


def test_two_runs_at_once_are_said_whatever_the_record():
    for record in ("w1", "w2", None):
        finding = assess(record, {"w1": True, "w2": True}, frozenset())
        assert (finding.state, finding.runs_in) == (RUNNING_TWICE, ("w1", "w2"))


def test_a_lost_member_that_holds_the_record():
    finding = assess("w2", {"w1": False}, frozenset({"w2"}))
    assert (finding.state, finding.unreachable) == (MEMBER_LOST, ("w2",))
    assert finding.message().startswith("w2, where Kueue admitted it, does not answer; a run there may go on")
    # Nothing runs where members answer, and one does not (Kueue cleared its record on the eviction): not "waiting".
    cleared = assess(None, {"w1": False}, frozenset({"w2"}))
    assert cleared.state == MEMBER_LOST and cleared.message().startswith("w2 does not answer; a run there may go on")
    # Re-dispatched meanwhile and running in w1: the record (w1 once Kueue re-admits) decides; before that, stale.
    assert assess("w2", {"w1": True}, frozenset({"w2"})).state == RECORD_STALE
    assert assess("w1", {"w1": True}, frozenset({"w2"})).state == RUNNING


def test_the_annotation_changes_only_when_the_finding_does():
    finding = assess("w1", {"w1": False, "w2": True}, frozenset())
    written = finding.annotation("2026-11-30T18:00:00Z")
    assert json.loads(written) == {"state": RECORD_STALE, "runsIn": ["w2"], "kueueRecord": "w1", "unreachable": [], "blocked": {},
                                   "since": "2026-11-30T18:00:00Z"}
    assert not changed(written, finding)
    assert changed(written, assess("w2", {"w2": True}, frozenset()))
    assert changed(None, finding) and changed("not json", finding)


def _workload(*true: str) -> dict:
    return {"status": {"conditions": [{"type": kind, "status": "True"} for kind in true]}}


def test_an_eviction_kueue_cannot_finish_on_the_manager_is_recognised():
    """Kueue waits for the evicted job to stop; the manager's RayJob shows the member's last status (Running)
    forever. Only then: not before the eviction, not once the status says Suspended or New."""
    from failover.fleet import eviction_stuck

    running = {"spec": {"suspend": True}, "status": {"jobDeploymentStatus": "Running"}}
    assert eviction_stuck(_workload("Evicted", "QuotaReserved"), running)
    assert not eviction_stuck(_workload("QuotaReserved"), running)  # not evicted
    assert not eviction_stuck(_workload("Evicted"), running)  # the eviction finished: quota released
    assert not eviction_stuck(_workload("Evicted", "QuotaReserved"), {**running, "spec": {"suspend": False}})
    for inactive in ({"jobDeploymentStatus": "Suspended"}, {"jobDeploymentStatus": "New"}, {}):
        assert not eviction_stuck(_workload("Evicted", "QuotaReserved"), {**running, "status": inactive})


def test_a_member_that_cannot_admit_the_job_is_named_with_kueues_reason():
    from failover.fleet import MEMBER_CANNOT_ADMIT

    finding = assess(None, {"w1": False, "w2": False}, frozenset(), {"w1": "LocalQueue fleet-queue doesn't exist"})
    assert (finding.state, finding.blocked) == (MEMBER_CANNOT_ADMIT, (("w1", "LocalQueue fleet-queue doesn't exist"),))
    assert finding.message() == ("w1 cannot admit it: LocalQueue fleet-queue doesn't exist (run `pulumi up` on its "
                                 "stack); the other members still may")
    assert MEMBER_CANNOT_ADMIT in WARNINGS
    # Once it runs somewhere, that is what counts.
    assert assess("w2", {"w1": False, "w2": True}, frozenset(), {"w1": "..."}).state == RUNNING


def test_a_finished_job_is_finished_not_waiting():
    """Seen on the tier: after a normal finish the watch said "waits for a slice in every member"."""
    from failover.fleet import FINISHED

    finding = assess("w2", {"w1": False, "w2": False}, frozenset(), finished=True)
    assert finding.state == FINISHED and finding.message() == "finished (Kueue's record: w2)"


def test_a_run_where_members_answer_names_the_member_that_does_not():
    finding = assess("w1", {"w1": True}, frozenset({"w2"}))
    assert (finding.state, finding.message()) == (RUNNING, "runs in w1; w2 does not answer (a run there may go on)")


# ---- the watch's metrics (failover/metrics.py FleetMetrics), from a pass over fake clusters ----------------------

class _Manager:
    """The manager's API as the watch calls it: lists, a get and patches of RayJobs; writes recorded."""

    def __init__(self, workloads: list[dict], rayjobs: list[dict]):
        self.items = {"workloads": workloads, "rayjobs": rayjobs}
        self.patches: list[tuple[str, dict]] = []
        self.events: list[str] = []

    def list_cluster_custom_object(self, group, version, plural, **_):
        return {"items": self.items[plural]}

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        return next(j for j in self.items[plural] if j["metadata"]["name"] == name)

    def patch_namespaced_custom_object(self, group, version, namespace, plural, name, body):
        self.patches.append((name, body))

    def create_namespaced_event(self, namespace, event):
        self.events.append(event.reason)


def _fleet_job(name: str, record: str | None) -> tuple[dict, dict]:
    meta = {"namespace": "tpu-fleet", "uid": f"uid-{name}", "resourceVersion": "1"}
    workload = {"metadata": {**meta, "name": f"rayjob-{name}", "ownerReferences": [{"kind": "RayJob", "name": name}]},
                "status": {"clusterName": record} if record else {}}
    return workload, {"metadata": {**meta, "name": name}, "spec": {}, "status": {}}


def _pass(runs: dict[str, set[str]], lost: set[str], jobs: dict[str, str | None]):
    """One reconcile over a manager with `jobs` (name: Kueue's record) and members: `runs` (member: the jobs it
    runs) answer, `lost` do not."""
    from kubernetes import client
    from prometheus_client import CollectorRegistry

    from failover.fleet import STATES, FleetWatch
    from failover.metrics import FleetMetrics

    made = [_fleet_job(name, record) for name, record in jobs.items()]
    manager = _Manager([w for w, _ in made], [j for _, j in made])
    members = {member: object() for member in runs} | {member: None for member in lost}  # None: no client

    class Watch(FleetWatch):
        def _member_state(self, api):
            member = next(name for name, each in members.items() if each is api)
            return {("tpu-fleet", job) for job in runs[member]}, {}, {}

    metrics = FleetMetrics(STATES, CollectorRegistry())
    watch = Watch(client.ApiClient(), lambda: members, "tpu-fallback-fleet", metrics=metrics)
    watch.custom, watch.core = manager, manager
    return watch.reconcile(), metrics.registry, manager


def test_a_pass_sets_the_findings_by_state_the_members_reachable_and_its_duration():
    findings, registry, manager = _pass({"w1": {"a"}, "w2": {"b", "c"}}, {"w3"},
                                        {"a": "w1", "b": "w2", "c": "w1", "d": None})
    assert {key[1]: f.state for key, f in findings.items()} == {
        "a": RUNNING, "b": RUNNING, "c": RECORD_STALE, "d": MEMBER_LOST}
    value = registry.get_sample_value
    assert value("tpu_fallback_fleet_findings", {"state": RUNNING}) == 2
    assert value("tpu_fallback_fleet_findings", {"state": RECORD_STALE}) == 1
    assert value("tpu_fallback_fleet_findings", {"state": MEMBER_LOST}) == 1
    # Every state is exported, zero included: a series that vanished would read as "no data", not as none.
    assert value("tpu_fallback_fleet_findings", {"state": RUNNING_TWICE}) == 0
    assert {m: value("tpu_fallback_fleet_member_reachable", {"member": m}) for m in ("w1", "w2", "w3")} == {
        "w1": 1, "w2": 1, "w3": 0}
    assert value("tpu_fallback_fleet_pass_duration_seconds_count") == 1
    assert 0 <= value("tpu_fallback_fleet_pass_duration_seconds_sum") < 5
    assert [name for name, _ in manager.patches] == ["a", "b"]  # the pass ran whole: Running published at once


def test_the_next_pass_replaces_the_last_ones_numbers():
    from prometheus_client import CollectorRegistry

    from failover.fleet import STATES
    from failover.metrics import FleetMetrics

    metrics = FleetMetrics(STATES, CollectorRegistry())
    metrics.record_pass([RUNNING, RUNNING], {"w1": True, "w2": False}, 0.5)
    metrics.record_pass([RUNNING_TWICE], {"w1": True, "w2": True}, 1.5)
    value = metrics.registry.get_sample_value
    assert value("tpu_fallback_fleet_findings", {"state": RUNNING}) == 0
    assert value("tpu_fallback_fleet_findings", {"state": RUNNING_TWICE}) == 1
    assert value("tpu_fallback_fleet_member_reachable", {"member": "w2"}) == 1
    assert value("tpu_fallback_fleet_pass_duration_seconds_count") == 2
    assert value("tpu_fallback_fleet_pass_duration_seconds_sum") == 2.0
    assert value("tpu_fallback_fleet_pass_duration_seconds_bucket", {"le": "1.0"}) == 1


def test_every_finding_state_is_exported():
    from failover.fleet import STATES

    found = {assess(*case).state for case in (
        ("w1", {"w1": True}, frozenset()), (None, {"w1": False}, frozenset()),
        ("w1", {"w1": False}, frozenset(), None, True), ("w1", {"w2": True}, frozenset()),
        (None, {"w1": True, "w2": True}, frozenset()), ("w2", {"w1": False}, frozenset({"w2"})),
        (None, {"w1": False}, frozenset(), {"w1": "no queue"}))}
    assert found == set(STATES) and len(STATES) == len(found)


def test_the_watch_serves_its_metrics_over_http():
    import socket
    import urllib.request

    from prometheus_client import CollectorRegistry

    from failover.fleet import STATES
    from failover.metrics import FleetMetrics

    metrics = FleetMetrics(STATES, CollectorRegistry())
    metrics.record_pass([RUNNING], {"w1": False}, 0.2)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    metrics.serve(port)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'tpu_fallback_fleet_member_reachable{member="w1"} 0.0' in body.splitlines()
    assert 'tpu_fallback_fleet_findings{state="Running"} 1.0' in body.splitlines()


def test_the_rung_a_fleet_job_holds_in_the_member_where_it_runs():
    """The copy's flavor in the member that runs it goes with the finding, its annotation and `ops status`."""
    from failover.fleet import RUNNING, assess
    from ops.status.jobs import fleet_of

    finding = assess("w1", {"w1": True, "w2": False}, frozenset(), flavors={"w1": "on-demand", "w2": "dws"})
    assert (finding.state, finding.rungs) == (RUNNING, (("w1", "on-demand"),))  # only where it runs
    annotation = json.loads(finding.annotation("2026-12-01T00:00:00Z"))
    assert annotation["rungs"] == {"w1": "on-demand"}
    rayjob = {"metadata": {"name": "j", "namespace": "tpu-fleet", "annotations": {
        "tpu-fallback/fleet": finding.annotation("2026-12-01T00:00:00Z")}}}
    placement = fleet_of(rayjob, {"status": {"clusterName": "w1"}})
    assert placement.words() == "runs in w1 (on-demand)"
    assert "rungs" not in json.loads(assess("w1", {"w1": False}, frozenset()).annotation("x"))  # as before
