"""Keys waiting to be reconciled, the way client-go's workqueue holds them.

A key is in the queue at most once, is never handed to two workers at once (a key added while a worker holds it
comes back after `done`), and may be added for later (the early path's grace period ends at a known time).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable

from kubernetes.client import ApiException


class WorkQueue:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.Condition()
        self._heap: list[tuple[float, int, Hashable]] = []
        self._due: dict[Hashable, float] = {}  # the earliest time each queued key is due
        self._processing: set[Hashable] = set()
        self._again: dict[Hashable, float] = {}  # added while processing: queued again on done()
        self._order = itertools.count()
        self._closed = False

    def add(self, key: Hashable, delay: float = 0.0) -> None:
        due = self._clock() + max(delay, 0.0)
        with self._lock:
            if key in self._processing:
                self._again[key] = min(due, self._again.get(key, due))
                return
            if key in self._due and self._due[key] <= due:
                return  # already due as early or earlier
            self._due[key] = due
            heapq.heappush(self._heap, (due, next(self._order), key))
            self._lock.notify()

    def get(self, timeout: float | None = None) -> Hashable | None:
        """The next due key, marked as processing; None after `timeout` seconds or once closed."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._lock:
            while not self._closed:
                while self._heap and self._due.get(self._heap[0][2]) != self._heap[0][0]:
                    heapq.heappop(self._heap)  # superseded by an earlier add of the same key
                now = self._clock()
                if self._heap and self._heap[0][0] <= now:
                    _, _, key = heapq.heappop(self._heap)
                    del self._due[key]
                    self._processing.add(key)
                    return key
                waits = [t - now for t in (deadline, self._heap[0][0] if self._heap else None) if t is not None]
                if deadline is not None and now >= deadline:
                    return None
                self._lock.wait(min(waits) if waits else None)
            return None

    def done(self, key: Hashable) -> None:
        with self._lock:
            self._processing.discard(key)
            again = self._again.pop(key, None)
        if again is not None:
            self.add(key, again - self._clock())

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()

    def __len__(self) -> int:
        with self._lock:
            return len(self._due)


def work(queue: WorkQueue, reconcile: Callable[[Hashable], object], stopping: threading.Event, log: logging.Logger,
         on_error: Callable[[], object] = lambda: None, api_error_delay: float = 1.0,
         after: Callable[[float], object] = lambda _seconds: None) -> None:
    """A controller's worker: reconcile queued (namespace, name) keys until `stopping` is set. A key the API answered
    404 (gone) or 409 (someone wrote first) comes back in 0.2 s, the watch brings the change; another API error in
    `api_error_delay` (1 s), any other failure in 5 s, both logged and counted (`on_error`): one bad object must not
    end the worker. `after` is told each key's seconds once it is done. Each key reconciled is a DEBUG line (what
    `reconcile` returned): the sign that the controller looked at a job and decided, which the tier tests wait on
    before asserting that it did nothing (manager.LOG_LEVEL_VARIABLE turns it on)."""
    while not stopping.is_set():
        key = queue.get(timeout=1.0)
        if key is None:
            continue
        began = time.monotonic()
        try:
            log.debug("%s: reconciled: %r", named(key), reconcile(key))
        except ApiException as error:
            if error.status in (404, 409):
                queue.add(key, delay=0.2)
            else:
                on_error()
                log.warning("%s: %s; queued again", named(key), error)
                queue.add(key, delay=api_error_delay)
        except Exception:  # noqa: BLE001 - one bad object must not end the worker
            on_error()
            log.exception("%s: reconcile failed; queued again", named(key))
            queue.add(key, delay=5.0)
        finally:
            queue.done(key)
        after(time.monotonic() - began)


def named(key: Hashable) -> str:
    """A key as its log lines name it: `namespace/name` for an object's key, else as it is (a probe's flavor)."""
    return "/".join(key) if isinstance(key, tuple) else str(key)
