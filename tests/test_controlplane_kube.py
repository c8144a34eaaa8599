"""The tier's polling helper (testbed/kube.py wait_for): the pace of its polls, without a server."""

from __future__ import annotations

import pytest

from testbed import kube


@pytest.fixture
def pauses(monkeypatch):
    """The pauses wait_for takes, recorded instead of slept."""
    taken: list[float] = []
    monkeypatch.setattr(kube.time, "sleep", taken.append)
    monkeypatch.setattr(kube, "POLL_FIRST", kube.POLL_FIRST)  # poll_every below changes them: restored after
    monkeypatch.setattr(kube, "POLL_MOST", kube.POLL_MOST)
    return taken


def ready_at(call: int):
    calls = iter(range(1, 100))
    return lambda: next(calls) >= call and "ready"


def test_polls_start_at_a_tenth_of_a_second_and_grow_to_half_a_second(pauses):
    assert kube.wait_for(ready_at(7), 10, "the probe") == "ready"
    assert pauses == pytest.approx([0.1, 0.15, 0.225, 0.3375, 0.5, 0.5])


def test_a_given_interval_is_kept_and_a_benchmark_can_fix_the_pace(pauses):
    kube.wait_for(ready_at(4), 10, "the probe", interval=0.05)
    assert pauses == [0.05, 0.05, 0.05]
    pauses.clear()
    kube.poll_every(0.1)
    kube.wait_for(ready_at(4), 10, "the probe")
    assert pauses == [0.1, 0.1, 0.1]


def test_the_timeout_names_what_was_awaited_and_the_last_answer(monkeypatch):
    monkeypatch.setattr(kube.time, "sleep", lambda _: None)
    with pytest.raises(TimeoutError, match=r"no the probe within 0 s \(last: False\)"):
        kube.wait_for(lambda: False, 0.01, "the probe")


def test_server_seconds_reads_an_api_servers_timestamp():
    assert kube.server_seconds("2026-12-03T10:32:34Z") - kube.server_seconds("2026-12-03T10:32:04Z") == 30
    assert kube.server_seconds("1970-01-01T00:01:00Z") == 60
