"""failover/runtime/'s cache, member caches and manager without a server: a fake API that lists and streams watch
events, the stores and their indexes, the handlers' keys on a controller's queue, and /healthz."""

from __future__ import annotations

import json
import queue as queues
import threading
import time
import urllib.request

import pytest

from failover.runtime.cache import ADDED, DELETED, MODIFIED, Cache, Store
from failover.runtime.controller import Reconciler, Watch
from failover.runtime.informer import Watched
from failover.runtime.manager import Manager
from failover.runtime.members import Member, MemberCaches, MemberWatch

PODS = Watched("pods", "/api/v1/pods")
JOBS = Watched("rayjobs", "/apis/ray.io/v1/rayjobs")


def _pod(name: str, cluster: str | None, node: str = "n1", rv: str = "1") -> dict:
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": rv,
                         "labels": {"ray.io/cluster": cluster} if cluster else {}}, "spec": {"nodeName": node}}


def _by_cluster(key, pod):
    cluster = pod["metadata"]["labels"].get("ray.io/cluster")
    return [(key[0], cluster)] if cluster else []


# ---- the store ---------------------------------------------------------------------------------------------------

def test_a_store_keeps_what_its_transform_makes_and_its_indexes_follow_each_change():
    store = Store(lambda obj, before: obj if obj["metadata"]["labels"] else None,
                  {"cluster": _by_cluster, "node": lambda key, pod: [pod["spec"]["nodeName"]]})
    assert store.apply(ADDED, _pod("unlabelled", None)) is None  # never kept: nothing to tell
    added = store.apply(ADDED, _pod("a", "c1"))
    assert (added.type, added.key, added.old) == (ADDED, ("ns", "a"), None)
    store.apply(ADDED, _pod("b", "c1", node="n2"))
    assert store.by("cluster", ("ns", "c1")) == [("ns", "a"), ("ns", "b")] and store.by("node", "n2") == [("ns", "b")]
    moved = store.apply(MODIFIED, _pod("a", "c2", rv="2"))
    assert moved.old["metadata"]["resourceVersion"] == "1" and moved.new["metadata"]["resourceVersion"] == "2"
    assert store.by("cluster", ("ns", "c1")) == [("ns", "b")] and store.last("cluster", ("ns", "c2")) == ("ns", "a")
    gone = store.apply(DELETED, _pod("b", "c1"))
    assert (gone.type, gone.new) == (DELETED, None) and store.by("cluster", ("ns", "c1")) == []
    assert store.keys() == [("ns", "a")]


def test_the_last_of_an_index_is_the_key_changed_last():
    store = Store(indexers={"cluster": _by_cluster})
    store.apply(ADDED, _pod("a", "c1"))
    store.apply(ADDED, _pod("b", "c1"))
    assert store.last("cluster", ("ns", "c1")) == ("ns", "b")
    store.apply(MODIFIED, _pod("a", "c1", rv="2"))
    assert store.last("cluster", ("ns", "c1")) == ("ns", "a")


def test_a_relist_starts_afresh_and_says_what_it_no_longer_lists():
    befores = []
    store = Store(lambda obj, before: befores.append(before) or obj["metadata"]["resourceVersion"])
    store.replace([_pod("a", "c"), _pod("b", "c")])
    store.apply(MODIFIED, _pod("a", "c", rv="2"))
    assert befores == [None, None, "1"]
    changes = store.replace([_pod("a", "c", rv="3")])
    assert [(c.type, c.key, c.old, c.new, c.listed) for c in changes] == [
        (DELETED, ("ns", "b"), "1", None, True), (ADDED, ("ns", "a"), None, "3", True)]
    assert befores[-1] is None and store.items() == [(("ns", "a"), "3")]


def test_a_second_indexer_of_the_same_name_is_the_first_and_a_new_one_indexes_what_is_kept():
    store = Store()
    store.apply(ADDED, _pod("a", "c1"))
    store.add_indexer("cluster", _by_cluster)
    store.add_indexer("cluster", lambda key, pod: ["other"])
    assert store.by("cluster", ("ns", "c1")) == [("ns", "a")]


# ---- a fake API server: lists, and watch events as they are put ----------------------------------------------

class _Stream:
    def __init__(self, events: queues.Queue):
        self.events = events

    def stream(self, amt=None, decode_content=False):
        while True:
            event = self.events.get()
            if event is None:
                return
            yield (json.dumps(event) + "\n").encode()

    def close(self):
        pass

    def release_conn(self):
        pass


class _Api:
    """Lists `objects[path]` and streams what `emit` puts, one watch at a time per path."""

    def __init__(self, objects: dict[str, list[dict]]):
        self.objects = objects
        self.watches: dict[str, queues.Queue] = {}
        self.lists: dict[str, int] = {}

    def request(self, method, path, query_params=(), header_params=None, serialize=False, _request_timeout=None):
        query = dict(query_params)
        if "watch" not in query:
            self.lists[path] = self.lists.get(path, 0) + 1

            class Listed:
                data = json.dumps({"items": self.objects.get(path, []), "metadata": {"resourceVersion": "1"}})
            return Listed()
        return _Stream(self.watches.setdefault(path, queues.Queue()))

    def emit(self, path: str, event_type: str, obj: dict) -> None:
        self.watches.setdefault(path, queues.Queue()).put({"type": event_type, "object": obj})

    def end(self) -> None:
        for events in self.watches.values():
            events.put(None)


def _wait(condition, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.01)


def test_one_informer_and_one_store_per_kind_whoever_watches_it():
    api = _Api({PODS.path: [_pod("a", "c1")]})
    cache = Cache(api)
    first = cache.store(PODS, indexers={"cluster": _by_cluster})
    told: list[tuple[str, list, bool]] = []
    cache.subscribe(PODS, lambda changes, listed: told.append(("one", [c.key for c in changes], listed)))
    second = cache.subscribe(PODS, lambda changes, listed: told.append(("two", [c.key for c in changes], listed)))
    assert first is second and len(cache.informers) == 1
    with pytest.raises(ValueError):
        cache.store(PODS, transform=lambda obj, before: obj)  # one way per program
    cache.start()
    _wait(cache.synced)
    api.emit(PODS.path, "ADDED", _pod("b", "c1", rv="2"))
    _wait(lambda: len(told) == 4)
    assert told == [("one", [("ns", "a")], True), ("two", [("ns", "a")], True),
                    ("one", [("ns", "b")], False), ("two", [("ns", "b")], False)]
    assert first.by("cluster", ("ns", "c1")) == [("ns", "a"), ("ns", "b")] and api.lists == {PODS.path: 1}
    cache.stop()
    api.end()


def test_a_stopped_cache_changes_and_tells_nothing_more():
    store_told = []
    cache = Cache(_Api({}))
    store = cache.subscribe(PODS, lambda changes, listed: store_told.append(changes))
    informer = cache.informers[PODS]
    informer.on_event("ADDED", _pod("a", "c"))
    cache.stop()
    informer.on_event("ADDED", _pod("b", "c"))
    informer.on_list([])
    assert store.keys() == [("ns", "a")] and len(store_told) == 1


# ---- the manager -------------------------------------------------------------------------------------------------

class _Counter(Reconciler):
    """Queues each pod's RayCluster; reconciles by noting the key."""

    name = "counter"
    resync_seconds = 3600.0

    def __init__(self, cache: Cache):
        super().__init__()
        self.pods = cache.store(PODS, indexers={"cluster": _by_cluster})
        self.seen: list = []
        self.ticks = 0
        self.done = threading.Event()

    def watches(self):
        return [Watch(PODS, lambda change: _by_cluster(change.key, change.new or change.old))]

    def reconcile(self, key):
        self.seen.append((key, self.pods.by("cluster", key)))
        self.done.set()

    def keys(self):
        return [("ns", "every")]


def test_the_manager_fills_the_cache_then_reconciles_what_each_change_maps_to_and_serves_healthz():
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    api = _Api({PODS.path: [_pod("a", "c1")]})
    now = [0.0]
    manager = Manager(api, health_port=port, clock=lambda: now[0])
    counter = manager.add(_Counter(manager.cache))
    manager.start()
    _wait(counter.done.is_set)
    assert counter.seen == [(("ns", "c1"), [("ns", "a")])]  # the list, once every cache was filled
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).read().decode()
    assert body.startswith("ok ")
    counter.done.clear()
    api.emit(PODS.path, "DELETED", _pod("a", "c1"))
    _wait(counter.done.is_set)
    assert counter.seen[-1] == (("ns", "c1"), [])  # the old object maps a deletion
    now[0] = 3600.0
    counter.done.clear()
    manager.step()  # the resync is due
    _wait(counter.done.is_set)
    assert counter.seen[-1] == (("ns", "every"), [])
    manager.stop()
    api.end()


class _Ticking(Reconciler):
    period_seconds = 10.0

    def __init__(self, fail: bool):
        super().__init__()
        self.fail, self.ticks, self.failures = fail, 0, 0

    def tick(self):
        self.ticks += 1
        if self.fail:
            raise RuntimeError("manager unreachable")

    def failed(self):
        self.failures += 1


def test_a_tick_runs_at_the_start_and_each_period_and_a_failed_one_is_counted_not_fatal():
    now = [0.0]
    manager = Manager(_Api({}), clock=lambda: now[0])
    ok, failing = manager.add(_Ticking(False)), manager.add(_Ticking(True))
    manager.cache.wait_synced = lambda: None  # nothing watched
    manager.start()
    assert (ok.ticks, failing.ticks, failing.failures) == (1, 1, 1)
    now[0] = 5.0
    manager.step()
    assert ok.ticks == 1
    now[0] = 10.0
    manager.step()
    assert (ok.ticks, failing.ticks, failing.failures) == (2, 2, 2)
    manager.stop()


# ---- the members' caches -----------------------------------------------------------------------------------------

def test_a_member_with_a_new_client_watches_anew_keeping_or_dropping_what_it_held():
    apis = {"w1": _Api({JOBS.path: [_pod("j", None)]})}
    told = []
    keep = [True]
    members = MemberCaches(lambda: dict(apis), [MemberWatch(JOBS, lambda m, changes, listed: told.append(
        (m.name, [c.key for c in changes], listed)))], keep=lambda member: keep[0])
    (member,) = members.refresh()
    _wait(member.synced)
    assert told == [("w1", [("ns", "j")], True)] and member.store(JOBS).keys() == [("ns", "j")]
    first = member.cache
    assert members.refresh() == [member] and member.cache is first  # the same client: nothing to do
    apis["w1"] = _Api({JOBS.path: []})
    keep[0] = True
    members.refresh()
    assert member.cache is not first and member.store(JOBS) is first.stores()[JOBS]  # held until the new list
    _wait(member.synced)
    assert member.store(JOBS).keys() == [] and told[-1] == ("w1", [("ns", "j")], True)
    # Events of the older cache's informer are dropped.
    first.informers[JOBS].on_event("ADDED", _pod("late", None))
    assert member.store(JOBS).keys() == []
    apis["w1"] = _Api({JOBS.path: [_pod("k", None)]})
    member.store(JOBS).apply(ADDED, _pod("held", None))
    keep[0] = False
    held = member.store(JOBS)
    members.refresh()
    assert held.keys() == [] and member.store(JOBS) is not held  # dropped at once
    _wait(member.synced)
    assert member.store(JOBS).keys() == [("ns", "k")]
    del apis["w1"]
    members.refresh()  # no longer in the fleet: stopped
    assert members.all() == {} and member.cache.informers[JOBS].stopping.is_set()
    member.api.end()


def test_a_member_without_a_client_has_no_cache():
    members = MemberCaches(lambda: {"w1": None}, [MemberWatch(JOBS, lambda m, c, listed: None)])
    (member,) = members.refresh()
    assert member.cache is None and member.store(JOBS) is None and not member.synced() and members.synced()
    assert isinstance(members.add(Member("w1")), Member) and members.get("w1") is member


# ---- a controller's watch spec: the failover controller's (failover/regional/watches.py) ------------------------

def _regional_seen():
    """The failover controller's stores and the Workloads each change queues, on a cache whose informers never run."""
    import datetime

    from prometheus_client import CollectorRegistry

    from failover.regional.watches import Seen
    from failover.runtime.metrics import Metrics

    class Chain:
        @staticmethod
        def stocks_out_after_admission(flavor):
            return flavor == "spot"

    cache = Cache(None)
    seen = Seen(cache, Chain(), lambda: datetime.datetime(2026, 12, 1, tzinfo=datetime.timezone.utc),
                Metrics(CollectorRegistry()))
    queued: list = []
    for watch in seen.watches():
        cache.subscribe(watch.watched, lambda changes, listed, watch=watch: queued.extend(
            key for change in changes for key in watch.map(change)))
    return seen, cache.informers, queued


def _regional_workload(name: str, job: str, flavor: str | None = None) -> dict:
    admitted = [{"type": kind, "status": "True", "lastTransitionTime": "2026-12-01T00:00:00Z"}
                for kind in ("QuotaReserved", "Admitted")] if flavor else []
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": "1",
                         "ownerReferences": [{"kind": "RayJob", "name": job}]},
            "spec": {"queueName": "q"}, "status": {"conditions": admitted, "admission": {"podSetAssignments": [
                {"flavors": {"google.com/tpu": flavor}}]} if flavor else {}}}


def test_the_failover_controllers_watches_queue_the_workloads_a_change_touches():
    from failover.api import FAILOVER_ANNOTATION
    from failover.regional.watches import (WATCHED_EVENTS, WATCHED_NODES, WATCHED_PODS, WATCHED_RAYJOBS,
                                           WATCHED_WORKLOADS)

    seen, informers, queued = _regional_seen()
    informers[WATCHED_WORKLOADS].on_list([_regional_workload("wl-a", "a", "spot"),
                                          _regional_workload("wl-b", "b", "on-demand")])
    assert queued == [("ns", "wl-a"), ("ns", "wl-b")]
    job = {"metadata": {"namespace": "ns", "name": "a", "resourceVersion": "1"}, "status": {"rayClusterName": "c"}}
    informers[WATCHED_RAYJOBS].on_event("ADDED", job)
    informers[WATCHED_RAYJOBS].on_event("MODIFIED", {**job, "spec": {"entrypoint": "other"}})  # nothing it reads
    annotated = {**job, "metadata": {**job["metadata"], "annotations": {FAILOVER_ANNOTATION: "{}"}}}
    informers[WATCHED_RAYJOBS].on_event("MODIFIED", annotated)
    assert queued[2:] == [("ns", "wl-a"), ("ns", "wl-a")]  # its RayCluster, then its move
    pod = {"metadata": {"namespace": "ns", "name": "c-tpu-0", "labels": {"ray.io/cluster": "c"}},
           "spec": {"nodeName": "n1", "containers": [{"resources": {"requests": {"google.com/tpu": "4"}}}]}}
    informers[WATCHED_PODS].on_event("ADDED", pod)
    informers[WATCHED_PODS].on_event("ADDED", {**pod, "metadata": {**pod["metadata"], "name": "cpu", "labels": {}}})
    assert queued[4:] == [("ns", "wl-a")] and set(seen.hosts(("ns", "c"))) == {"c-tpu-0"}
    node = {"metadata": {"name": "n1"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    informers[WATCHED_NODES].on_event("ADDED", node)
    informers[WATCHED_NODES].on_event("MODIFIED", node)  # a heartbeat
    informers[WATCHED_NODES].on_event("DELETED", node)
    assert queued[5:] == [("ns", "wl-a"), ("ns", "wl-a")] and "n1" in seen.node_views()[1]
    stockout = {"metadata": {"namespace": "ns", "name": "e"}, "involvedObject": {"kind": "Pod", "name": "c-tpu-0"},
                "reason": "FailedScaleUp", "message": "GCE out of resources"}
    informers[WATCHED_EVENTS].on_event("ADDED", stockout)
    # Admitted in the namespace on a rung that stocks out after admission: wl-a only.
    assert queued[7:] == [("ns", "wl-a")] and len(seen.stockouts_in("ns")) == 1


# ---- every program serves /healthz and /metrics, and its Deployment says where -----------------------------------

@pytest.mark.parametrize("stack, name, prefix", [
    ("dev", "failover-controller", "FAILOVER"), ("fleet", "fleet-watch", "FLEET"), ("fleet", "fleet-ladder", "LADDER")])
def test_every_program_s_deployment_probes_healthz_on_the_port_it_serves(stack, name, prefix):
    from infra import failover as stack_failover
    from tests.conftest import plan_for
    from tests.test_fleet_ladder import cached_ladder_plan

    plan = plan_for() if stack == "dev" else cached_ladder_plan()
    (deployment,) = [m for m in plan.kubernetes_manifests()
                     if m["kind"] == "Deployment" and m["metadata"]["name"] == name]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item["value"] for item in container["env"]}
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"health": stack_failover.HEALTH_PORT,
                     stack_failover.METRICS_PORT_NAME: stack_failover.METRICS_PORT}
    assert env[f"{prefix}_HEALTH_PORT"] == str(ports["health"])
    assert env[f"{prefix}_METRICS_PORT"] == str(ports["metrics"])
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}


def test_the_programs_log_level_is_info_unless_set_and_a_level_that_is_none_ends_the_program(monkeypatch, capsys):
    """manager.configured: FAILOVER_LOG_LEVEL=DEBUG shows each reconciled key (the tier tests set it); a misspelt
    level is refused at start, exit status 2, naming the variable, as any configuration it cannot read."""
    import logging

    from failover.runtime.manager import LOG_LEVEL_VARIABLE, PROGRAMS_LOGGER, configured

    programs = logging.getLogger(PROGRAMS_LOGGER)
    kept = programs.level
    try:
        monkeypatch.delenv(LOG_LEVEL_VARIABLE, raising=False)
        assert configured("program", lambda environ: "read") == "read"
        assert logging.getLogger("tpu-fallback.failover").getEffectiveLevel() == logging.INFO
        monkeypatch.setenv(LOG_LEVEL_VARIABLE, "DEBUG")
        configured("program", lambda environ: "read")
        assert logging.getLogger("tpu-fallback.failover").getEffectiveLevel() == logging.DEBUG
        monkeypatch.setenv(LOG_LEVEL_VARIABLE, "LOUD")
        with pytest.raises(SystemExit) as exited:
            configured("program", lambda environ: "read")
        assert exited.value.code == 2
        assert capsys.readouterr().err == ("program: FAILOVER_LOG_LEVEL='LOUD' is not a log level (DEBUG, INFO, "
                                           "WARNING, ERROR)\n")
    finally:
        programs.setLevel(kept)
