"""The checkpoint channel's decisions (failover/checkpoints.py) and its request's value (failover.api)."""

import datetime

import pytest

from failover import checkpoints
from failover.api import CheckpointRequest

T0 = datetime.datetime(2026, 12, 1, 9, 40, tzinfo=datetime.timezone.utc)
WINDOW = datetime.datetime(2026, 12, 1, 10, 0, tzinfo=datetime.timezone.utc)
MINUTE = datetime.timedelta(minutes=1)


def test_a_request_is_named_by_its_cause_and_deadline_so_asking_again_asks_the_same():
    first = CheckpointRequest.about("Maintenance", WINDOW, T0)
    assert first == CheckpointRequest("maintenance-20261201t100000z", "2026-12-01T09:40:00Z")
    assert first.value() == "maintenance-20261201t100000z 2026-12-01T09:40:00Z"
    assert CheckpointRequest.parse(first.value()) == first and first.asked_at == T0
    assert CheckpointRequest.about("maintenance", WINDOW, T0 + MINUTE).id == first.id


@pytest.mark.parametrize("text", [None, "", "only-an-id", "id not-a-time", "Upper 2026-12-01T09:40:00Z",
                                  'quoted" 2026-12-01T09:40:00Z'])
def test_an_unreadable_request_is_none(text):
    assert CheckpointRequest.parse(text) is None


def test_an_id_the_annotations_file_could_not_quote_plainly_is_refused():
    with pytest.raises(ValueError):
        CheckpointRequest('a"b', "2026-12-01T09:40:00Z")


def test_the_pods_asked_are_those_without_the_request():
    request = CheckpointRequest.about("maintenance", WINDOW, T0)
    older = CheckpointRequest.about("dws-end", WINDOW - MINUTE, T0 - MINUTE)
    asked = {"w-1": request.value(), "w-0": None, "w-2": older.value(), "w-3": "garbage"}
    assert checkpoints.pods_to_ask(request, asked) == ["w-0", "w-2", "w-3"]
    assert checkpoints.pods_to_ask(request, {"w-1": request.value()}) == []


def test_the_save_is_taken_as_done_save_timeout_after_the_request():
    request = CheckpointRequest.about("maintenance", WINDOW, T0)
    timeout = 2 * MINUTE
    assert checkpoints.ask_at(WINDOW, 20 * MINUTE) == T0
    assert checkpoints.answered_at(request, timeout) == T0 + timeout
    assert not checkpoints.answered(request, timeout, T0 + timeout - datetime.timedelta(seconds=1))
    assert checkpoints.answered(request, timeout, T0 + timeout)
    assert checkpoints.answered(None, timeout, T0)  # nothing asked: nothing to wait for


class _Pods:
    """The API server's pods as the dynamic client reaches them: a merge patch each, a gone pod's 404."""

    def __init__(self, names):
        self.annotations = {name: {} for name in names}
        self.resources = self

    def get(self, api_version, kind):
        assert (api_version, kind) == ("v1", "Pod")
        return "pods"

    def patch(self, resource, body, name, namespace, content_type):
        from kubernetes.client import ApiException
        assert (resource, namespace, content_type) == ("pods", "ns", "application/merge-patch+json")
        assert "resourceVersion" not in body["metadata"]  # not guarded: the kubelet rewrites a running pod often
        if name not in self.annotations:
            raise ApiException(status=404)
        self.annotations[name].update(body["metadata"]["annotations"])


def test_the_write_annotates_each_pod_asked_and_skips_one_gone():
    from failover.api import CHECKPOINT_REQUEST_ANNOTATION
    from failover.runtime.writes import GuardedWrites

    writes, request = GuardedWrites(), CheckpointRequest.about("maintenance", WINDOW, T0)
    writes.api = _Pods(["w-0", "w-1"])
    assert writes._ask_checkpoint("ns", ["w-0", "w-1", "w-gone"], request) == 2
    assert writes.api.annotations == {pod: {CHECKPOINT_REQUEST_ANNOTATION: request.value()} for pod in ("w-0", "w-1")}
