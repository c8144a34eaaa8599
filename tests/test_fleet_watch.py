"""The fleet watch's findings (failover/watch/): where a fleet job runs against Kueue's record. Pure functions; the
real partition and return are in tests/test_fleet_controlplane.py."""

from __future__ import annotations

import json

from failover.watch.decisions import MEMBER_LOST, RECORD_STALE, RUNNING, RUNNING_TWICE, WARNINGS, Finding, assess, changed


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
    from failover.watch.decisions import eviction_stuck

    running = {"spec": {"suspend": True}, "status": {"jobDeploymentStatus": "Running"}}
    assert eviction_stuck(_workload("Evicted", "QuotaReserved"), running)
    assert not eviction_stuck(_workload("QuotaReserved"), running)  # not evicted
    assert not eviction_stuck(_workload("Evicted"), running)  # the eviction finished: quota released
    assert not eviction_stuck(_workload("Evicted", "QuotaReserved"), {**running, "spec": {"suspend": False}})
    for inactive in ({"jobDeploymentStatus": "Suspended"}, {"jobDeploymentStatus": "New"}, {}):
        assert not eviction_stuck(_workload("Evicted", "QuotaReserved"), {**running, "status": inactive})


def test_a_member_that_cannot_admit_the_job_is_named_with_kueues_reason():
    from failover.watch.decisions import MEMBER_CANNOT_ADMIT

    finding = assess(None, {"w1": False, "w2": False}, frozenset(), {"w1": "LocalQueue fleet-queue doesn't exist"})
    assert (finding.state, finding.blocked) == (MEMBER_CANNOT_ADMIT, (("w1", "LocalQueue fleet-queue doesn't exist"),))
    assert finding.message() == ("w1 cannot admit it: LocalQueue fleet-queue doesn't exist (run `pulumi up` on its "
                                 "stack); the other members still may")
    assert MEMBER_CANNOT_ADMIT in WARNINGS
    # Once it runs somewhere, that is what counts.
    assert assess("w2", {"w1": False, "w2": True}, frozenset(), {"w1": "..."}).state == RUNNING


def test_a_finished_job_is_finished_not_waiting():
    """Seen on the tier: after a normal finish the watch said "waits for a slice in every member"."""
    from failover.watch.decisions import FINISHED

    finding = assess("w2", {"w1": False, "w2": False}, frozenset(), finished=True)
    assert finding.state == FINISHED and finding.message() == "finished (Kueue's record: w2)"


def test_a_run_where_members_answer_names_the_member_that_does_not():
    finding = assess("w1", {"w1": True}, frozenset({"w2"}))
    assert (finding.state, finding.message()) == (RUNNING, "runs in w1; w2 does not answer (a run there may go on)")


# ---- the watch's decisions over its caches (FleetWatch.evaluate), with fake clusters ----------------------------

class _Manager:
    """The manager's API as the watch calls it: patches of RayJobs and their status, server-side applies of a
    Workload's status, Events; writes recorded."""

    def __init__(self):
        self.patches: list[tuple[str, dict]] = []
        self.status_patches: list[tuple[str, dict]] = []
        self.applies: list[tuple[str, dict, list]] = []
        self.events: list[tuple[str, str]] = []

    def patch_namespaced_custom_object(self, group, version, namespace, plural, name, body):
        self.patches.append((name, body))

    def patch_namespaced_custom_object_status(self, group, version, namespace, plural, name, body):
        self.status_patches.append((name, body))

    def create_namespaced_event(self, namespace, event):
        self.events.append((event.reason, event.message))

    def request(self, method, path, body=None, **params):  # the raw client: only the repair's apply
        assert method == "PATCH" and params["content_type"] == "application/apply-patch+yaml"
        self.applies.append((path, json.loads(body), params["query_params"]))

        class Response:  # the pool takes a connection back only with nothing of the answer left unread
            drained = False

            def drain_conn(self):
                self.drained = True

            def release_conn(self):
                assert self.drained, "a connection handed back with its answer unread"
        return Response()


def _member(name: str, watch=None, answers: bool = True, copies=(), rayjobs=()):
    """A member that has listed (its informers never started), answering or not, holding `copies` and `rayjobs`;
    added to `watch`'s members."""
    from failover.runtime.cache import Cache
    from failover.runtime.members import Member
    from failover.watch.watches import WATCHED_MEMBER_RAYJOBS, WATCHED_MEMBER_WORKLOADS

    member = Member(name)
    member.api, member.answers, member.cache = object(), answers, Cache(None, name)
    for watched, objects in ((watch.seen.copies if watch else WATCHED_MEMBER_WORKLOADS, copies),
                             (watch.seen.member_rayjobs if watch else WATCHED_MEMBER_RAYJOBS, rayjobs)):
        store = member.cache.store(watched)
        member.cache.informers[watched].synced.set()
        for obj in objects:
            store.apply("ADDED", obj)
    return watch.seen.members.add(member) if watch else member


def _fleet_watch(members=None):
    """A FleetWatch on a manager client that is never called, its members' clients from `members`."""
    from kubernetes import client

    from failover.runtime.members import MemberCaches
    from failover.watch.controller import FleetWatch

    return FleetWatch(client.ApiClient(), MemberCaches(members or (lambda: {})), "tpu-fallback-fleet")


def _condition(kind: str, status: str = "True") -> dict:
    return {"type": kind, "status": status, "lastTransitionTime": "2026-12-01T00:00:00Z"}


def _manager_workload(name: str, *, record: str | None = None, true: tuple[str, ...] = (), checks: str = "Ready",
                      nominated: tuple[str, ...] = ()) -> dict:
    status = {"conditions": [_condition(kind) for kind in true], "admissionChecks": [
        {"name": "fleet-multikueue", "state": checks, "lastTransitionTime": "2026-12-01T00:00:00Z"}]}
    if record:
        status["clusterName"] = record
    if nominated:
        status["nominatedClusterNames"] = list(nominated)
    return {"metadata": {"namespace": "tpu-fleet", "name": f"rayjob-{name}", "uid": f"wl-{name}",
                         "resourceVersion": "7", "ownerReferences": [{"kind": "RayJob", "name": name}]},
            "status": status}


def _manager_rayjob(name: str, *, suspend: bool = False, deployment: str | None = "Running") -> dict:
    return {"metadata": {"namespace": "tpu-fleet", "name": name, "uid": f"uid-{name}", "resourceVersion": "3"},
            "spec": {"suspend": suspend}, "status": {"jobDeploymentStatus": deployment} if deployment else {}}


def _copy(name: str, *true: str) -> dict:
    return {"metadata": {"namespace": "tpu-fleet", "name": f"rayjob-{name}"}, "spec": {"active": True},
            "status": {"conditions": [_condition(kind) for kind in true]}}


def _member_rayjob(name: str, suspend: bool = False) -> dict:
    return {"metadata": {"namespace": "tpu-fleet", "name": name}, "spec": {"suspend": suspend}}


def _watch(members: dict[str, tuple[list[dict], list[dict]] | None], workloads: list[dict], rayjobs: list[dict],
           connected: dict[str, bool] | None = None, settle: float = 1.0, metrics=None):
    """A FleetWatch whose caches hold `workloads` and `rayjobs` (the manager's), Kueue's MultiKueueClusters
    (`connected`), and per member (copies, RayJobs), or None for a member that does not answer."""
    from kubernetes import client

    from failover.runtime.members import MemberCaches
    from failover.watch.controller import FleetWatch

    manager = _Manager()
    watch = FleetWatch(client.ApiClient(), MemberCaches(lambda: {}), "tpu-fallback-fleet", metrics=metrics,
                       settle_seconds=settle)
    watch.custom, watch.core, watch.raw = manager, manager, manager
    for workload in workloads:
        watch.seen.workloads.apply("ADDED", workload)
    for rayjob in rayjobs:
        watch.seen.rayjobs.apply("ADDED", rayjob)
    for name, active in (connected or {}).items():
        watch.seen.connected.apply("ADDED", {"metadata": {"name": name}, "status": {
            "conditions": [_condition("Active", "True" if active else "False")]}})
    for name, state in members.items():
        _member(name, watch, state is not None, *(state or ((), ())))
    return watch, manager


def _pass(runs: dict[str, set[str]], lost: set[str], jobs: dict[str, str | None]):
    """Every job evaluated once over a manager with `jobs` (name: Kueue's record) and members: `runs` (member: the
    jobs it runs) answer, `lost` do not."""
    from prometheus_client import CollectorRegistry

    from failover.watch.decisions import STATES
    from failover.runtime.metrics import FleetMetrics

    metrics = FleetMetrics(STATES, CollectorRegistry())
    watch, manager = _watch({member: ([], [_member_rayjob(job) for job in names]) for member, names in runs.items()}
                            | {member: None for member in lost},
                            [_manager_workload(name, record=record) for name, record in jobs.items()],
                            [_manager_rayjob(name, deployment=None) for name in jobs], metrics=metrics)
    findings = {("tpu-fleet", name): watch.reconcile(("tpu-fleet", name)) for name in jobs}
    watch.record(0.2)
    return findings, metrics.registry, manager


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
    # Running is published at once; a warning only once it has held for a second (queued to look again then).
    assert [name for name, _ in manager.patches] == ["a", "b"]


def test_a_warning_is_published_once_it_has_held():
    """Kueue creates the member's RayJob and records the member as two writes: a look between them must not cry
    RecordStale; the same finding a settle period later is published."""
    jobs = [_manager_workload("c", record="w1")], [_manager_rayjob("c", deployment=None)]
    watch, manager = _watch({"w1": ([], []), "w2": ([], [_member_rayjob("c")])}, *jobs)
    assert watch.reconcile(("tpu-fleet", "c")).state == RECORD_STALE and manager.patches == []
    assert len(watch.queue) == 1  # looked at again once the settle period is over
    settled, manager = _watch({"w1": ([], []), "w2": ([], [_member_rayjob("c")])}, *jobs, settle=0.0)
    settled.reconcile(("tpu-fleet", "c"))
    assert [name for name, _ in manager.patches] == ["c"] and manager.events[0][0] == "FleetRecordStale"


def test_a_dispatch_kueue_is_recording_is_not_called_stale_until_it_has_held_far_longer():
    """Kueue nominated w1, created the job's RayJob there, and has not yet written its record: measured on a loaded
    tier for over the 1 s a warning settles, which published a transient RecordStale, then a second one when the
    real one came (w2 back from its partition). The member was nominated; after a return it is not."""
    from failover.watch.decisions import RECORDING_SECONDS, being_recorded, settle_for

    recording = _manager_workload("c", true=("QuotaReserved",), checks="Pending", nominated=("w1",))
    finding = assess(None, {"w1": True, "w2": False}, frozenset({"w2"}))
    assert finding.state == RECORD_STALE and being_recorded(recording, finding)
    assert settle_for(recording, finding, 1.0) == RECORDING_SECONDS > 1.0
    # The return's case: the run is in a member Kueue did not nominate. A warning, settled as any other.
    returned = assess(None, {"w1": False, "w2": True}, frozenset())
    assert not being_recorded(recording, returned) and settle_for(recording, returned, 1.0) == 1.0
    # A record that names another member is stale whatever the nomination; what is not a warning waits for nothing.
    assert settle_for(recording, assess("w2", {"w1": True}, frozenset()), 1.0) == 1.0
    assert settle_for(recording, assess("w1", {"w1": True}, frozenset()), 1.0) == 0.0

    jobs = [recording], [_manager_rayjob("c", deployment=None)]
    watch, manager = _watch({"w1": ([], [_member_rayjob("c")]), "w2": None}, *jobs, settle=0.0)
    assert watch.reconcile(("tpu-fleet", "c")).state == RECORD_STALE and manager.patches == []
    assert len(watch.queue) == 1  # looked at again: by then Kueue has recorded w1, or it is stale


# ---- when the watch may mark an evicted job Suspended, and when it repairs Kueue's record -------------------------

def test_a_run_in_a_member_is_one_that_is_not_suspended_or_an_admitted_copy():
    from failover.watch.decisions import live

    assert live(None, _member_rayjob("j"))
    # MultiKueue makes a suspended RayJob for a copy evicted on the manager's word: no run.
    assert not live(_copy("j", "QuotaReserved", "Evicted"), _member_rayjob("j", suspend=True))
    assert live(_copy("j", "QuotaReserved", "Admitted"), None)  # about to run: the member unsuspends it
    assert not live(_copy("j", "QuotaReserved", "Admitted", "DeactivationTarget"), None)  # being deactivated
    assert not live(_copy("j", "QuotaReserved"), None) and not live(None, None)


def test_an_eviction_is_never_unblocked_where_the_job_runs():
    """QA's failing inputs (issue 19): the watch marked the job Suspended while the member that took over ran it
    (Kueue then deleted that run), and again after the lost member's return (both runs deleted). Only where no
    member that answers runs it."""
    from failover.watch.decisions import may_unblock

    stuck = _manager_workload("j", true=("QuotaReserved", "Evicted"), checks="Pending")
    suspended = _manager_rayjob("j", suspend=True)
    assert may_unblock(stuck, suspended, [])
    assert not may_unblock(stuck, suspended, ["w1"])  # the takeover runs
    assert not may_unblock(stuck, suspended, ["w2"])  # back: its run goes on
    assert not may_unblock(_manager_workload("j", true=("QuotaReserved",)), suspended, [])  # not evicted


def test_the_watch_leaves_a_stuck_eviction_to_kueue_while_a_member_runs_the_job():
    stuck = [_manager_workload("j", true=("QuotaReserved", "Evicted"), checks="Pending", nominated=("w1",))]
    suspended = [_manager_rayjob("j", suspend=True)]
    # The takeover's run in w1 while w2 is cut off.
    watch, manager = _watch({"w1": ([_copy("j", "QuotaReserved", "Admitted")], [_member_rayjob("j")]), "w2": None},
                            stuck, suspended, {"w1": True, "w2": False})
    watch.reconcile(("tpu-fleet", "j"))
    assert manager.status_patches == []
    # After the return, before Kueue reconnects: w2 answers and its run goes on.
    watch, manager = _watch({"w1": ([_copy("j", "QuotaReserved")], []),
                             "w2": ([_copy("j", "QuotaReserved", "Admitted")], [_member_rayjob("j")])},
                            stuck, suspended, {"w1": True, "w2": False})
    watch.reconcile(("tpu-fleet", "j"))
    assert manager.status_patches == []
    # Nothing runs where members answer: marked, and said so.
    watch, manager = _watch({"w1": ([_copy("j", "QuotaReserved")], []), "w2": None}, stuck, suspended,
                            {"w1": True, "w2": False})
    watch.reconcile(("tpu-fleet", "j"))
    assert manager.status_patches == [("j", {"status": {"jobDeploymentStatus": "Suspended"},
                                             "metadata": {"resourceVersion": "3"}})]
    assert manager.events[0][0] == "FleetEvictionUnblocked"
    assert manager.events[0][1].endswith("dispatches it again; a run may go on in w2, which does not answer")


def test_a_job_whose_member_kueue_lost_is_marked_before_kueue_evicts_it():
    """Kueue lost w2, where it admitted the job; its eviction after workerLostTimeout would wait for a stop it cannot
    see, and undo the dispatch to w1 meanwhile. Marked at once, only when Kueue and the watch both lose w2."""
    from failover.watch.decisions import lost_admission

    admitted = _manager_workload("j", record="w2", true=("QuotaReserved", "Admitted"))
    running = _manager_rayjob("j")
    assert lost_admission(admitted, running, {"w1": True, "w2": False}, ["w1"]) == "w2"
    assert lost_admission(admitted, running, {"w1": True, "w2": True}, ["w1"]) is None  # Kueue reaches it
    assert lost_admission(admitted, running, {"w1": True}, ["w1"]) is None  # Kueue's view not known yet
    assert lost_admission(admitted, running, {"w2": False}, ["w1", "w2"]) is None  # the watch reaches it
    assert lost_admission(admitted, _manager_rayjob("j", deployment="Suspended"), {"w2": False}, []) is None
    evicted = _manager_workload("j", true=("QuotaReserved", "Evicted"), checks="Pending")
    assert lost_admission(evicted, running, {"w2": False}, []) is None
    watch, manager = _watch({"w1": ([], []), "w2": None}, [admitted], [running], {"w1": True, "w2": False})
    watch.reconcile(("tpu-fleet", "j"))
    assert [name for name, _ in manager.status_patches] == ["j"]
    assert manager.events[0][0] == "FleetEvictionUnblocked" and manager.events[0][1].startswith("Kueue lost w2")


def test_only_a_copy_of_the_jobs_current_step_counts_as_admitted_for_the_record():
    from failover.watch.decisions import admitted_at_current_step

    workload = _manager_workload("j", true=("QuotaReserved",), checks="Pending")
    workload["spec"] = {"queueName": "fleet-on-demand-w2"}

    def copy(queue: str, *true: str) -> dict:
        return {"metadata": {"name": "j"}, "spec": {"queueName": queue},
                "status": {"conditions": [{"type": kind, "status": "True"} for kind in true]}}

    # Member 1 was cut off in the middle of a move: its copy of the step the job left still shows admitted.
    copies = {"w1": copy("fleet-on-demand-w1", "QuotaReserved", "Admitted"), "w2": copy("fleet-on-demand-w2")}
    assert admitted_at_current_step(workload, copies) == []
    copies["w2"] = copy("fleet-on-demand-w2", "QuotaReserved", "Admitted")
    assert admitted_at_current_step(workload, copies) == ["w2"]
    assert admitted_at_current_step(workload, {"w1": None, "w2": None}) == []


def test_kueues_record_is_repaired_only_when_it_cannot_record_the_member_it_adopted():
    from failover.watch.decisions import record_to_repair, repaired_status

    broken = _manager_workload("j", true=("QuotaReserved",), checks="Pending", nominated=("w1",))
    assert record_to_repair(broken, ["w2"], {"w1", "w2"}) == "w2"
    assert record_to_repair(broken, ["w1"], {"w1", "w2"}) is None  # nominated: Kueue records it itself
    assert record_to_repair(broken, ["w2"], {"w1"}) is None  # Kueue does not reach w2 yet: it would nominate w1 again
    assert record_to_repair(broken, ["w1", "w2"], {"w1", "w2"}) is None  # two admitted: Kueue keeps the older
    assert record_to_repair(broken, [], {"w1", "w2"}) is None
    for other in (_manager_workload("j", record="w1", true=("QuotaReserved",), checks="Pending"),
                  _manager_workload("j", true=("QuotaReserved", "Evicted"), checks="Pending"),
                  _manager_workload("j", true=("QuotaReserved", "Admitted"), checks="Ready"),
                  _manager_workload("j", checks="Pending")):
        assert record_to_repair(other, ["w2"], {"w1", "w2"}) is None
    status = repaired_status(broken, "w2")
    assert status == {**broken["status"], "nominatedClusterNames": ["w1", "w2"]}  # the whole status, plus w2
    assert broken["status"]["nominatedClusterNames"] == ["w1"]  # not changed in place


def test_the_repair_is_a_forced_apply_of_the_whole_status_as_kueue_after_it_held():
    broken = _manager_workload("j", true=("QuotaReserved",), checks="Pending", nominated=("w1",))
    members = {"w1": ([_copy("j", "QuotaReserved")], []),
               "w2": ([_copy("j", "QuotaReserved", "Admitted")], [_member_rayjob("j")])}
    watch, manager = _watch(members, [broken], [_manager_rayjob("j")], {"w1": True, "w2": True})
    watch.reconcile(("tpu-fleet", "j"))
    assert manager.applies == []  # Kueue may record it itself within a reconcile: looked at again later
    watch._repair_seen[("tpu-fleet", "j")] = ("w2", -1e9)  # as if it had held since long ago
    watch.reconcile(("tpu-fleet", "j"))
    ((path, body, query),) = manager.applies
    assert path == "/apis/kueue.x-k8s.io/v1beta2/namespaces/tpu-fleet/workloads/rayjob-j/status"
    assert query == [("fieldManager", "kueue-admission"), ("force", "true")]
    assert body["metadata"] == {"name": "rayjob-j", "namespace": "tpu-fleet", "resourceVersion": "7"}
    assert body["status"] == {**broken["status"], "nominatedClusterNames": ["w1", "w2"]}
    assert [reason for reason, _ in manager.events if reason == "FleetRecordRepaired"] == ["FleetRecordRepaired"]
    watch.reconcile(("tpu-fleet", "j"))
    assert len(manager.applies) == 1  # not again before the retry period


def test_an_idle_fleet_still_says_whether_each_member_answers_and_forgets_a_removed_one():
    """Issue 27: the member gauge was written only after a job was evaluated, so "a fleet member does not answer"
    could never fire on a fleet with no job. Every period writes it; a member taken out of the fleet loses it."""
    from kubernetes import client
    from prometheus_client import CollectorRegistry

    from failover.runtime.members import MemberCaches
    from failover.watch.controller import FleetWatch
    from failover.watch.decisions import STATES
    from failover.runtime.metrics import FleetMetrics

    metrics = FleetMetrics(STATES, CollectorRegistry())
    clients = {"w1": None}  # no usable kubeconfig: it cannot answer
    watch = FleetWatch(client.ApiClient(), MemberCaches(lambda: dict(clients)), "tpu-fallback-fleet", metrics=metrics)
    value = metrics.registry.get_sample_value
    watch.tick()
    assert value("tpu_fallback_fleet_member_reachable", {"member": "w1"}) == 0
    assert value("tpu_fallback_fleet_pass_duration_seconds_count") == 0  # no job was evaluated
    clients.clear()
    watch.tick()
    assert value("tpu_fallback_fleet_member_reachable", {"member": "w1"}) is None


def test_the_next_pass_replaces_the_last_ones_numbers():
    from prometheus_client import CollectorRegistry

    from failover.watch.decisions import STATES
    from failover.runtime.metrics import FleetMetrics

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
    from failover.watch.decisions import STATES

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

    from failover.watch.decisions import STATES
    from failover.runtime.metrics import FleetMetrics

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
    from failover.watch.decisions import RUNNING, assess
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


# ---- a member's kubeconfig renewed: a new client and new watches -------------------------------------------------

def test_a_renewed_kubeconfig_gives_a_new_client_and_the_same_text_the_same():
    import base64

    import yaml

    from failover.runtime.members import member_clients

    def kubeconfig(token: str) -> str:
        return yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "current-context": "m",
                               "clusters": [{"name": "m", "cluster": {"server": "https://127.0.0.1:1"}}],
                               "users": [{"name": "m", "user": {"token": token}}],
                               "contexts": [{"name": "m", "context": {"cluster": "m", "user": "m"}}]})

    texts = {"w1-kubeconfig": kubeconfig("one")}

    class Core:
        def read_namespaced_secret(self, name, namespace):
            class Secret:
                data = {"kubeconfig": base64.b64encode(texts[name].encode()).decode()}
            return Secret()

    load = member_clients(Core(), {"w1": "w1-kubeconfig"}, "kueue-system")
    first = load()["w1"]
    assert load()["w1"] is first  # re-read each period, rebuilt only when the text changes
    texts["w1-kubeconfig"] = kubeconfig("two")
    renewed = load()["w1"]
    assert renewed is not first and "two" in str(renewed.configuration.api_key)


def test_the_watch_restarts_a_members_watches_on_a_new_client_keeping_what_it_holds():
    """A renewed token: the member still answers, and what it holds stays until the new watches have listed. A
    member back after no answer: listed afresh, and it answers only once listed."""
    from failover.watch.watches import answers

    clients = {"w1": object()}
    watch = _fleet_watch(lambda: dict(clients))
    restarts = []
    watch.seen.members.restart = lambda member, stale=True: restarts.append((member.name, stale))
    watch.seen.probe = lambda member: None
    watch.tick()
    assert restarts == [("w1", True)]  # its first watches
    member = watch.seen.members.get("w1")
    member.answers, member.primed, member.cache = True, True, _member("w1").cache
    watch.tick()
    assert restarts == [("w1", True)]  # the same client: nothing to do
    clients["w1"] = object()
    watch.tick()
    assert restarts[-1] == ("w1", False) and member.api is clients["w1"]
    assert answers(member)


# ---- a copy an older step of the fleet's ladder left behind a partition (issue 18) -----------------------------

def _stepped(copy: dict, queue: str) -> dict:
    return {**copy, "spec": {**copy["spec"], "queueName": queue}}


def test_a_copy_from_an_older_step_is_stale_only_while_the_job_runs_where_kueue_admitted_it():
    from failover.watch.decisions import stale_step_copies

    admitted = _manager_workload("j", record="w2", true=("QuotaReserved", "Admitted"))
    admitted["spec"] = {"queueName": "fleet-on-demand-w2"}
    old = _stepped(_copy("j", "QuotaReserved", "Admitted"), "fleet-on-demand-w1")
    new = _stepped(_copy("j", "QuotaReserved", "Admitted"), "fleet-on-demand-w2")
    runs = {"w1": _member_rayjob("j"), "w2": _member_rayjob("j")}
    assert stale_step_copies(admitted, {"w1": old, "w2": new}, runs) == ["w1"]
    # The same step's copy (a DWS step's other members), or none: nothing stale.
    assert stale_step_copies(admitted, {"w1": _stepped(old, "fleet-on-demand-w2"), "w2": new}, runs) == []
    assert stale_step_copies(admitted, {"w1": None, "w2": new}, runs) == []
    # Not while the job does not run where Kueue admitted it, or that member does not answer: the old run may be
    # the only one.
    assert stale_step_copies(admitted, {"w1": old, "w2": None}, {"w1": runs["w1"], "w2": None}) == []
    assert stale_step_copies(admitted, {"w1": old}, {"w1": runs["w1"]}) == []
    # Not during a move (deactivated: Evicted, no longer Admitted), nor before Kueue records a member.
    for other in (_manager_workload("j", true=("QuotaReserved", "Evicted"), checks="Pending"),
                  _manager_workload("j", record="w2", true=("QuotaReserved", "Admitted", "Evicted")),
                  _manager_workload("j", true=("QuotaReserved",), checks="Pending")):
        other["spec"] = {"queueName": "fleet-on-demand-w2"}
        assert stale_step_copies(other, {"w1": old, "w2": new}, runs) == []


def test_one_job_is_judged_whole_from_what_is_seen_without_a_server():
    """`judge`, the watch's decision for one job, from plain objects: each of its rules in the one verdict the
    controller carries out."""
    from failover.watch.decisions import RECORD_STALE, RUNNING, Sighting, judge

    # Admitted in w2 and running there: nothing to do, and it says so.
    admitted = _manager_workload("j", record="w2", true=("QuotaReserved", "Admitted"))
    admitted["spec"] = {"queueName": "fleet-on-demand-w2"}
    new = _stepped(_copy("j", "QuotaReserved", "Admitted"), "fleet-on-demand-w2")
    seen = Sighting(admitted, _manager_rayjob("j"), {"w1": None, "w2": new}, {"w1": None, "w2": _member_rayjob("j")},
                    frozenset(), {"w1": True, "w2": True})
    verdict = judge(seen)
    assert (verdict.finding.state, verdict.finding.runs_in) == (RUNNING, ("w2",))
    assert (verdict.lost, verdict.unblock, verdict.left_to_kueue, verdict.repair, verdict.stale) == (
        None, False, (), None, ())
    # An older step's copy and run left in w1 after a partition: removed, and not counted as a second run.
    old = _stepped(_copy("j", "QuotaReserved", "Admitted"), "fleet-on-demand-w1")
    verdict = judge(Sighting(admitted, _manager_rayjob("j"), {"w1": old, "w2": new},
                             {"w1": _member_rayjob("j"), "w2": _member_rayjob("j")}, frozenset(),
                             {"w1": True, "w2": True}))
    assert verdict.stale == ("w1",) and (verdict.finding.state, verdict.finding.runs_in) == (RUNNING, ("w2",))
    # Kueue lost w2, where it admitted the job, and the watch cannot reach it either: marked before the eviction.
    verdict = judge(Sighting(admitted, _manager_rayjob("j"), {"w1": None}, {"w1": None}, frozenset({"w2"}),
                             {"w1": True, "w2": False}))
    assert verdict.lost == "w2" and not verdict.unblock
    # An eviction Kueue cannot finish: unblocked where no member that answers runs it, left to Kueue where one does.
    stuck = _manager_workload("j", true=("QuotaReserved", "Evicted"), checks="Pending", nominated=("w1",))
    suspended = _manager_rayjob("j", suspend=True)
    verdict = judge(Sighting(stuck, suspended, {"w1": _copy("j", "QuotaReserved")}, {"w1": None}, frozenset({"w2"}),
                             {"w1": True, "w2": False}))
    assert verdict.unblock and verdict.left_to_kueue == ()
    verdict = judge(Sighting(stuck, suspended, {"w1": _copy("j", "QuotaReserved", "Admitted")},
                             {"w1": _member_rayjob("j")}, frozenset({"w2"}), {"w1": True, "w2": False}))
    assert not verdict.unblock and verdict.left_to_kueue == ("w1",)
    # Kueue adopted w1's returning copy but cannot record it: the member to name; the record is stale meanwhile.
    unrecorded = _manager_workload("j", true=("QuotaReserved",), checks="Pending")
    unrecorded["spec"] = {"queueName": "fleet-on-demand-w2"}
    verdict = judge(Sighting(unrecorded, _manager_rayjob("j"), {"w1": None, "w2": new},
                             {"w1": None, "w2": _member_rayjob("j")}, frozenset(), {"w1": True, "w2": True}))
    assert verdict.repair == "w2" and verdict.finding.state == RECORD_STALE


class _MemberApi:
    def __init__(self, missing: bool = False):
        self.deleted: list[tuple[str, str, str]] = []
        self.missing = missing

    def delete_namespaced_custom_object(self, group, version, namespace, plural, name, **kwargs):
        from kubernetes.client import ApiException

        assert kwargs["propagation_policy"] == "Background"
        if self.missing:
            raise ApiException(status=404)
        self.deleted.append((plural, namespace, name))


def test_the_watch_deletes_an_older_steps_run_and_copy_in_a_member_back_from_a_partition_once():
    admitted = _manager_workload("j", record="w2", true=("QuotaReserved", "Admitted"))
    admitted["spec"] = {"queueName": "fleet-on-demand-w2"}
    old = _stepped(_copy("j", "QuotaReserved", "Admitted"), "fleet-on-demand-w1")
    new = _stepped(_copy("j", "QuotaReserved", "Admitted"), "fleet-on-demand-w2")
    members = {"w1": ([old], [_member_rayjob("j")]), "w2": ([new], [_member_rayjob("j")])}
    watch, manager = _watch(members, [admitted], [_manager_rayjob("j")], {"w1": True, "w2": True})
    apis = {}
    watch.member_custom = lambda api: apis.setdefault(id(api), _MemberApi())
    finding = watch.reconcile(("tpu-fleet", "j"))
    assert finding.state == RUNNING and finding.runs_in == ("w2",)  # the old run is not counted: it is deleted
    (api,) = apis.values()
    assert api.deleted == [("rayjobs", "tpu-fleet", "j"), ("workloads", "tpu-fleet", "rayjob-j")]
    (event,) = [m for reason, m in manager.events if reason == "FleetStaleStepRemoved"]
    assert event.startswith("deleted the run and the copy in w1 left by an older step of the ladder")
    # The caches lag: the copy seen again, being deleted, is left alone; gone already (404): no second Event.
    copies = watch.seen.members.get("w1").store(watch.seen.copies)
    copies.apply("MODIFIED", {**old, "metadata": {**old["metadata"], "deletionTimestamp": "2026-12-01T00:00:01Z"}})
    watch.reconcile(("tpu-fleet", "j"))
    assert len(api.deleted) == 2
    copies.apply("MODIFIED", old)
    watch.member_custom = lambda api: _MemberApi(missing=True)
    watch.reconcile(("tpu-fleet", "j"))
    assert len([reason for reason, _ in manager.events if reason == "FleetStaleStepRemoved"]) == 1


def test_a_member_that_answered_is_lost_only_after_two_missed_probes_in_a_row(monkeypatch):
    """Measured on a loaded CI run: a member's API server just resumed after a partition missed one probe, the finding
    flipped to MemberLost for one period and back, and the return was announced twice. One miss is not a loss; two
    in a row are; a member that never answered must answer first; back after a loss, its watches list afresh."""
    import failover.watch.watches as fleet_module
    from failover.runtime.members import Member
    from failover.watch.decisions import MISSES_BEFORE_LOST, still_answers

    assert MISSES_BEFORE_LOST == 2
    assert [still_answers(True, missed) for missed in (0, 1, 2, 3)] == [True, True, False, False]
    assert [still_answers(False, missed) for missed in (0, 1)] == [True, False]

    answers = []

    class Response:
        def drain_conn(self):
            pass

        def release_conn(self):
            pass

    class Probe:
        def __init__(self, api_client):
            pass

        def request(self, *args, **kwargs):
            if not answers.pop(0):
                raise OSError("timed out")
            return Response()

    monkeypatch.setattr(fleet_module, "RawClient", Probe)
    watch = _fleet_watch()
    restarts = []
    seen = []
    watch.seen.members.restart = lambda member, stale=True: restarts.append(len(seen))  # at which probe
    member = Member("w1")
    member.api = object()
    for answered in (False, True, False, True, False, False, False, True):
        answers.append(answered)
        watch.seen.probe(member)
        seen.append(member.answers)
    assert seen == [False, True, True, True, True, False, False, True]
    # Listed afresh when it answers after none (its first answer, after a miss) and when it is back after the loss;
    # not after a single miss, whose watches are still its own.
    assert restarts == [1, 7]
