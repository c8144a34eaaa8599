"""What a program knows of one cluster: per watched kind, one informer (informer.py) and one store of what it last
listed and watched, with indexes; every controller that watches the kind reads the same store and is told each
change. The split is controller-runtime's cache (an informer and an indexed store per kind, shared by every
controller of the manager, handlers told each change) in this package's words.
Ref: https://pkg.go.dev/sigs.k8s.io/controller-runtime/pkg/cache

A store keeps, per (namespace, name), what its `transform` makes of the object (a view, a slim record, the object
itself) or nothing (an object the program never reads); an index answers "which keys have this value" (a Workload
by its owner RayJob, a pod by its RayCluster or its node) without a pass over the store.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from failover.runtime.informer import Informer, RawClient, Watched

log = logging.getLogger("tpu-fallback.runtime")
Key = tuple[str, str]  # (namespace, name); "" for a cluster-scoped object
ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"
# What the store keeps of an object: `transform(obj, before)` (before: what it kept until now, None on a list).
Transform = Callable[[dict, Any], Any]
Indexer = Callable[[Key, Any], Iterable[Hashable]]  # the index values of what the store keeps


def key_of(obj: Mapping) -> Key:
    return obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def whole(obj: dict, _before: Any = None) -> dict:
    """The default transform: the object as the API server sent it."""
    return obj


@dataclass(frozen=True)
class Change:
    """One change of a store. `old` is what it kept before, None for an object new to it; a (re)list starts
    afresh (`listed`: every object it lists comes with old None, as on first sight, and what it no longer lists
    comes as DELETED), so a handler decides on a list as on the first one. `obj` is the object as received
    (None for a DELETED a list found)."""

    type: str
    key: Key
    old: Any
    new: Any
    obj: dict | None
    listed: bool = False


class Store:
    """Objects of one kind, by key, as `transform` keeps them, with indexes kept in step. Thread-safe; each index
    lists its keys in the order they last changed (the last is the most recent)."""

    def __init__(self, transform: Transform = whole, indexers: Mapping[str, Indexer] | None = None):
        self.transform = transform
        self._lock = threading.RLock()
        self._items: dict[Key, Any] = {}
        self._indexers: dict[str, Indexer] = {}
        self._indexes: dict[str, dict[Hashable, dict[Key, None]]] = {}
        for name, indexer in (indexers or {}).items():
            self.add_indexer(name, indexer)

    def add_indexer(self, name: str, indexer: Indexer) -> None:
        with self._lock:
            if name in self._indexers:
                return  # two controllers index a kind the same way: once is enough
            self._indexers[name], self._indexes[name] = indexer, {}
            for key, value in self._items.items():
                self._index(name, key, value)

    # ---- reads -------------------------------------------------------------------------------------------------
    def get(self, key: Key, default: Any = None) -> Any:
        with self._lock:
            return self._items.get(key, default)

    def keys(self) -> list[Key]:
        with self._lock:
            return list(self._items)

    def items(self) -> list[tuple[Key, Any]]:
        with self._lock:
            return list(self._items.items())

    def values(self) -> list[Any]:
        with self._lock:
            return list(self._items.values())

    def by(self, index: str, value: Hashable) -> list[Key]:
        """The keys whose `index` values include `value`, least recently changed first."""
        with self._lock:
            return list(self._indexes[index].get(value, ()))

    def last(self, index: str, value: Hashable) -> Key | None:
        """The key most recently changed among `by(index, value)`: one RayJob's Workload, one RayCluster's job."""
        with self._lock:
            keys = self._indexes[index].get(value)
            return next(reversed(keys)) if keys else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def __contains__(self, key: Key) -> bool:
        with self._lock:
            return key in self._items

    # ---- writes (the informer's) -------------------------------------------------------------------------------
    def apply(self, event_type: str, obj: dict) -> Change | None:
        """One watched change; None when the store neither kept nor keeps the object."""
        key = key_of(obj)
        with self._lock:
            old = self._items.get(key)
            new = None if event_type == DELETED else self.transform(obj, old)
            if old is None and new is None:
                return None
            self._set(key, old, new)
        return Change(DELETED if new is None else event_type, key, old, new, obj)

    def replace(self, items: list[dict]) -> list[Change]:
        """A (re)list: what it lists replaces what was kept (see Change for what handlers are told)."""
        with self._lock:
            listed = {key_of(item): item for item in items}
            changes = [Change(DELETED, key, old, None, None, listed=True)
                       for key, old in list(self._items.items()) if key not in listed]
            for change in changes:
                self._set(change.key, change.old, None)
            for key, obj in listed.items():
                old, new = self._items.get(key), self.transform(obj, None)
                if new is None and old is None:
                    continue
                self._set(key, old, new)
                changes.append(Change(DELETED, key, old, None, obj, listed=True) if new is None
                               else Change(ADDED, key, None, new, obj, listed=True))
            return changes

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            for index in self._indexes.values():
                index.clear()

    def _set(self, key: Key, old: Any, new: Any) -> None:
        if old is not None:
            for name in self._indexers:
                self._unindex(name, key, old)
        if new is None:
            self._items.pop(key, None)
            return
        self._items[key] = new
        for name in self._indexers:
            self._index(name, key, new)

    def _index(self, name: str, key: Key, value: Any) -> None:
        for index_value in self._indexers[name](key, value):
            self._indexes[name].setdefault(index_value, {})[key] = None

    def _unindex(self, name: str, key: Key, value: Any) -> None:
        index = self._indexes[name]
        for index_value in self._indexers[name](key, value):
            keys = index.get(index_value)
            if keys is not None:
                keys.pop(key, None)
                if not keys:
                    del index[index_value]


# Told each change as it is applied; a (re)list's in one call, with `listed` True (an empty list included).
Handler = Callable[[list[Change], bool], None]


class Cache:
    """One cluster's informers and stores: `store(watched)` is the one store of that kind (made, with its informer,
    the first time it is asked for), `subscribe(watched, handler)` tells `handler` each change of it. `on_event`
    (the kind's resource name) and `on_error` are told of every watched event and every failed watch. A cache
    whose informers are restarted (a member's new kubeconfig) is a new Cache; `stores` may carry what an older one
    holds until the new lists replace it."""

    def __init__(self, api, name: str = "", on_event: Callable[[str], object] = lambda _resource: None,
                 on_error: Callable[[Exception], object] = lambda _error: None, stores: Mapping[Watched, Store] = ()):
        self.raw = RawClient(api) if isinstance(api, client.ApiClient) else api  # or a DynamicClient, a test's fake
        self.name = name  # the member's name, or "" for the program's own cluster
        self.on_event, self.on_error = on_event, on_error
        self._carried = dict(stores)
        self._stores: dict[Watched, Store] = {}
        self._handlers: dict[Watched, list[Handler]] = {}
        self.informers: dict[Watched, Informer] = {}
        self._lock = threading.Lock()
        self._running = threading.Lock()  # held while a change is applied: once `stop` returns, none is
        self._started = self._stopped = False

    def store(self, watched: Watched, transform: Transform | None = None,
              indexers: Mapping[str, Indexer] | None = None) -> Store:
        """The store of `watched`, with these indexes added; its informer starts with the cache (or at once, if the
        cache runs already). A kind is kept one way per program: a second `transform` must be the first."""
        with self._lock:
            store = self._stores.get(watched)
            if store is None:
                store = self._carried.get(watched) or Store(transform or whole)
                if transform is not None:
                    store.transform = transform
                self._stores[watched], self._handlers[watched] = store, []
                self.informers[watched] = self._informer(watched, store)
                if self._started:
                    self.informers[watched].start()
            elif transform is not None and transform is not store.transform:
                raise ValueError(f"{watched.resource}: kept two ways")
        for name, indexer in (indexers or {}).items():
            store.add_indexer(name, indexer)
        return store

    def subscribe(self, watched: Watched, handler: Handler) -> Store:
        store = self.store(watched)
        with self._lock:
            self._handlers[watched].append(handler)
        return store

    def stores(self) -> dict[Watched, Store]:
        with self._lock:
            return dict(self._stores)

    def _informer(self, watched: Watched, store: Store) -> Informer:
        def listed(items: list[dict]) -> None:
            with self._running:
                if self._stopped:
                    return  # a stopped informer's last list: its stores may be a newer cache's now
                changes = store.replace(items)
            self._tell(watched, changes, True)

        def changed(event_type: str, obj: dict) -> None:
            with self._running:
                if self._stopped:
                    return
                change = store.apply(event_type, obj)
            self.on_event(watched.resource)
            if change is not None:
                self._tell(watched, [change], False)

        informer = Informer(self.raw, watched, listed, changed, self.on_error)
        if self.name:
            informer.name = f"{informer.name}-{self.name}"
        return informer

    def _tell(self, watched: Watched, changes: list[Change], listed: bool) -> None:
        with self._lock:
            handlers = list(self._handlers[watched])
        for handler in handlers:
            handler(changes, listed)

    # ---- running -----------------------------------------------------------------------------------------------
    def start(self) -> None:
        with self._lock:
            self._started = True
            informers = list(self.informers.values())
        for informer in informers:
            if not informer.is_alive():
                informer.start()

    def stop(self) -> None:
        """Stop every informer; no change reaches a store or a handler after this returns."""
        with self._running:
            self._stopped = True
        with self._lock:
            informers = list(self.informers.values())
        for informer in informers:
            informer.stop()

    def synced(self) -> bool:
        with self._lock:
            informers = list(self.informers.values())
        return bool(informers) and all(informer.synced.is_set() for informer in informers)

    def wait_synced(self) -> None:
        """Until every informer has handled its first list (logged every 10 s while one has not)."""
        for informer in list(self.informers.values()):
            while not informer.synced.wait(timeout=10):
                log.info("waiting for the first list of %s", informer.watched.resource)
