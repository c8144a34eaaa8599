"""A controller killed (`kill -9`) after its n-th write, for the unit tests of the controllers that resume (the
failover controller, the fleet's ladder): the two dynamic-client calls `GuardedWrites` makes (its guarded merge patch
stays the real one) and the Core API's Event create, over in-memory objects."""

from __future__ import annotations

import copy
from collections.abc import Callable

from kubernetes.client import ApiException


class Killed(Exception):
    """The controller's process ends here: the write before it was applied, nothing after it happens."""


def merge_patch(target: dict, patch: dict) -> None:
    """A JSON merge patch (RFC 7386): null removes a key."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge_patch(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class Events(list):
    """The reasons of the Events written, in order, and their names (unique, as the API server keeps them); kept
    across the kill and the restart."""

    def __init__(self):
        super().__init__()
        self.names: set[str] = set()


class _Found(dict):
    def to_dict(self) -> dict:
        return copy.deepcopy(dict(self))


class KilledAfter:
    """The dynamic client's get and patch (`object_of(resource)` is the object, `apply(obj, body)` the server's write)
    and the Core API's create_namespaced_event; raises Killed after the `kill_after`-th write (None: never)."""

    def __init__(self, object_of: Callable[[str], dict], apply: Callable[[dict, dict], dict], events: Events,
                 kill_after: int | None):
        self.object_of, self.apply, self.events, self.kill_after = object_of, apply, events, kill_after
        self.writes: list[str] = []

    def _wrote(self, what: str) -> None:
        self.writes.append(what)
        if self.kill_after is not None and len(self.writes) >= self.kill_after:
            raise Killed

    def get(self, resource, name, namespace):
        return _Found(self.object_of(resource))

    def patch(self, resource, body, name, namespace, content_type):
        result = self.apply(self.object_of(resource), body)
        self._wrote(resource)
        return _Found(result)

    def create_namespaced_event(self, namespace, event):
        if event.metadata.name in self.events.names:
            raise ApiException(status=409, reason="AlreadyExists")
        self.events.names.add(event.metadata.name)
        self.events.append(event.reason)
        self._wrote("event")
