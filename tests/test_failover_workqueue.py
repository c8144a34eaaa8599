"""The controller's work queue: each key once, never in two workers at once, and due at a given time."""

from __future__ import annotations

import threading

from failover.runtime.workqueue import WorkQueue


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_key_added_twice_is_handed_out_once():
    queue = WorkQueue()
    queue.add("a")
    queue.add("a")
    queue.add("b")
    assert [queue.get(timeout=0), queue.get(timeout=0), queue.get(timeout=0)] == ["a", "b", None]


def test_a_key_added_while_processed_comes_back_after_done_not_before():
    queue = WorkQueue()
    queue.add("a")
    assert queue.get(timeout=0) == "a"
    queue.add("a")  # a change arrives while a worker holds the key
    assert queue.get(timeout=0) is None  # a second worker must not get it
    queue.done("a")
    assert queue.get(timeout=0) == "a"


def test_a_delayed_key_is_due_at_its_time_and_an_earlier_add_wins():
    clock = FakeClock()
    queue = WorkQueue(clock)
    queue.add("grace", delay=30)
    assert queue.get(timeout=0) is None
    clock.now += 29.9
    assert queue.get(timeout=0) is None
    clock.now += 0.2
    assert queue.get(timeout=0) == "grace"
    queue.done("grace")
    queue.add("x", delay=60)
    queue.add("x", delay=0)  # a watch event before the timer: handled now, once
    assert queue.get(timeout=0) == "x"
    queue.done("x")
    clock.now += 61
    assert queue.get(timeout=0) is None


def test_a_waiting_worker_wakes_on_add_and_on_close():
    queue = WorkQueue()
    got = []
    worker = threading.Thread(target=lambda: got.append(queue.get(timeout=10)))
    worker.start()
    queue.add("woken")
    worker.join(5)
    assert got == ["woken"]
    closing = threading.Thread(target=lambda: got.append(queue.get(timeout=10)))
    closing.start()
    queue.close()
    closing.join(5)
    assert got == ["woken", None] and not closing.is_alive()


def test_a_worker_requeues_each_failure_after_its_delay_and_counts_the_real_ones():
    """The controllers' shared worker (runtime/workqueue.py work): 404/409 back soon and not counted, another API
    error after 1 s, any other failure after 5 s, both counted; it stops when told."""
    import logging
    import threading

    from kubernetes.client import ApiException

    from failover.runtime.workqueue import work

    now = [0.0]
    queue = WorkQueue(clock=lambda: now[0])
    stopping, errors, seen = threading.Event(), [], []
    outcomes = {("ns", "gone"): ApiException(status=404), ("ns", "refused"): ApiException(status=500),
                ("ns", "broken"): ValueError("bad object")}

    def reconcile(key):
        seen.append(key)
        if len(seen) == len(outcomes):
            stopping.set()
        raise outcomes[key]

    for key in outcomes:
        queue.add(key)
    work(queue, reconcile, stopping, logging.getLogger("test"), on_error=lambda: errors.append(1))
    assert sorted(seen) == sorted(outcomes) and len(errors) == 2
    assert {key: round(due, 1) for key, due in queue._due.items()} == {
        ("ns", "gone"): 0.2, ("ns", "refused"): 1.0, ("ns", "broken"): 5.0}


def test_a_worker_logs_each_key_it_reconciled_with_what_the_reconcile_returned(caplog):
    """The DEBUG line per reconciled key (runtime/workqueue.py work): the tier tests' sign that the controller looked
    at a job and decided; a failed reconcile has its own warning instead."""
    import logging

    from kubernetes.client import ApiException

    from failover.runtime.workqueue import work

    queue, stopping = WorkQueue(), threading.Event()
    returned = {("ns", "looked-at"): 0, "on-demand": 1, ("ns", "refused"): ApiException(status=500)}

    def reconcile(key):
        if key == ("ns", "refused"):
            stopping.set()
            raise returned[key]
        return returned[key]

    queue.add(("ns", "looked-at"))
    queue.add("on-demand", delay=0.02)  # a probe's key: its flavor
    queue.add(("ns", "refused"), delay=0.05)
    with caplog.at_level(logging.DEBUG, logger="test.worker"):
        work(queue, reconcile, stopping, logging.getLogger("test.worker"))
    assert [(r.levelname, r.getMessage()) for r in caplog.records if r.levelname == "DEBUG"] == [
        ("DEBUG", "ns/looked-at: reconciled: 0"), ("DEBUG", "on-demand: reconciled: 1")]
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "ns/refused: (500)\nReason: None\n; queued again"]
