"""The regional program's goodput controller: every PERIOD_SECONDS, each job of the chain's scheduling goodput and
where its time went (failover/api/goodput.py), from the shared cache, as metrics (failover/runtime/metrics.py):
  tpu_fallback_job_scheduling_goodput{job_namespace, job_name}   each unfinished job's goodput since its submission;
  tpu_fallback_scheduling_seconds_total{job_namespace, state, rung}   the job-seconds of each state on each rung since
      the controller started, the part of each job's timeline between two passes: `increase()` over a window is
      the namespace's goodput over that window (infra/monitoring.py's alert).
It reads the Workloads as the failover controller keeps them (the same store, failover/regional/watches.py) and the
RayJobs' metadata (their creation and the controller's records: its own metadata-only informer). It writes nothing.

What the objects no longer hold, it remembers: each job's timeline as it last computed it, so a stretch it watched
stays exact after a move (goodput.merge). A restart loses that memory, not the account: the objects give it again,
with what is inside the stretches before a move estimated (docs/goodput.md), and the counters start again from 0 (a
counter reset, which `increase()` takes in its stride) without counting a second time what came before.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from dataclasses import dataclass

from failover.api import (FAILOVER_ANNOTATION, MOVES_ANNOTATION, SLICE_LOST_ANNOTATION, STATES, Chain, JobTimes,
                          Segment, account, clipped)
from failover.regional.watches import WATCHED_WORKLOADS, CachedWorkload, cached_workload
from failover.runtime.cache import Cache, Change, Key
from failover.runtime.controller import Reconciler, Watch
from failover.runtime.informer import Watched
from failover.runtime.metrics import Metrics
from failover.runtime.writes import utcnow

log = logging.getLogger("tpu-fallback.failover")
# Half the PodMonitoring's scrape interval (infra/monitoring.py SCRAPE_INTERVAL): each scrape sees a fresh pass.
PERIOD_SECONDS = 15.0
# The RayJobs' metadata: their creation (the submission) and the controller's records on them. Metadata only, so a
# second informer of the kind costs little (the failover controller's keeps what it decides on, not these).
WATCHED_JOB_RECORDS = Watched("rayjob-records", "/apis/ray.io/v1/rayjobs", metadata_only=True)
RECORDS = (FAILOVER_ANNOTATION, MOVES_ANNOTATION, SLICE_LOST_ANNOTATION)
NO_RUNG = "none"  # a segment on no known rung (the metric's label)
# A new namespace's series are scraped at 0 before they count (`_counting`): the PodMonitoring's scrape interval
# (infra/monitoring.py SCRAPE_INTERVAL, 30 s) and a margin.
DECLARED_SECONDS = 35.0


def job_record(obj: dict, _before: object = None) -> dict:
    """What the account reads of a RayJob: its creation and the controller's records."""
    meta = obj["metadata"]
    annotations = meta.get("annotations") or {}
    return {"creationTimestamp": meta.get("creationTimestamp"),
            "annotations": {key: annotations[key] for key in RECORDS if key in annotations}}


def _no_keys(_change: Change) -> list[Key]:
    return []  # nothing is reconciled per key: each pass takes every job


@dataclass
class _Kept:
    """What the controller keeps of a job between passes: its timeline as last computed, and up to when its seconds
    are counted."""

    segments: tuple[Segment, ...]
    counted_until: datetime.datetime


class GoodputController(Reconciler):
    name = "goodput"
    log = log
    workers = 1
    period_seconds = PERIOD_SECONDS

    def __init__(self, cache: Cache, chain: Chain, metrics: Metrics,
                 clock: Callable[[], datetime.datetime] = utcnow):
        Reconciler.__init__(self)
        self.chain, self.metrics, self.clock = chain, metrics, clock
        self.workloads = cache.store(WATCHED_WORKLOADS, cached_workload)
        self.jobs = cache.store(WATCHED_JOB_RECORDS, job_record)
        self.started_at = clock()
        self._kept: dict[Key, _Kept] = {}
        self._shown: dict[Key, tuple[str, str]] = {}  # Workload -> the (namespace, job) of its goodput series
        self._declared: dict[str, datetime.datetime] = {}  # namespace -> when its seconds are counted from

    def watches(self) -> list[Watch]:
        return [Watch(WATCHED_WORKLOADS, _no_keys, transform=cached_workload),
                Watch(WATCHED_JOB_RECORDS, _no_keys, transform=job_record)]

    def reconcile(self, key: Key) -> int:
        return 0

    def started(self) -> None:
        log.info("goodput: every job of the chain's account every %.0f s", self.period_seconds)

    def tick(self) -> None:
        """One pass: every job's account now, its goodput series and its seconds since the last pass."""
        now = self.clock()
        present = set()
        for key, cached in self.workloads.items():
            if self._in_chain(cached):
                present.add(key)
                self._account(key, cached, now)
        for key in set(self._kept) - present:  # deleted, or no longer the chain's
            del self._kept[key]
            self._hide(key)

    def _in_chain(self, cached: CachedWorkload) -> bool:
        return self.chain.start_of_queue(cached.view.queue_name) is not None

    def _account(self, key: Key, cached: CachedWorkload, now: datetime.datetime) -> None:
        view = cached.view
        start = self.chain.start_of_queue(view.queue_name)
        record = self.jobs.get((key[0], view.rayjob)) if view.rayjob else None
        if view.rayjob and record is None:  # its RayJob not listed yet (a pass before the caches are), or deleted
            self._hide(key)  # before its Workload: its moves unknown, nothing shown or kept
            return
        times = JobTimes.of(record, view, self.chain.rungs[start].flavor)
        if times is None:
            return
        kept = self._kept.get(key)
        result = account(times, now, kept.segments if kept else ())
        since = kept.counted_until if kept else self.started_at
        if self._counting(key[0], now):
            for (state, rung), seconds in clipped(result.segments, since, now).items():
                self.metrics.scheduling_seconds.labels(key[0], state, rung or NO_RUNG).inc(seconds)
            since = now
        self._kept[key] = _Kept(result.segments, since)
        if view.finished or result.goodput is None:
            self._hide(key)
        else:
            self._shown[key] = (key[0], view.rayjob or key[1])
            self.metrics.job_goodput.labels(*self._shown[key]).set(result.goodput)

    def _counting(self, namespace: str, now: datetime.datetime) -> bool:
        """Whether the namespace's seconds are counted yet. A new namespace's series are declared at 0 first, and
        counted from a scrape later (what came meanwhile then): a counter born by its first increase loses it, as
        GMP drops a counter's first sample and `increase()` never sees it."""
        since = self._declared.get(namespace)
        if since is None:
            for state in STATES:
                for rung in (*(r.flavor for r in self.chain.rungs), NO_RUNG):
                    self.metrics.scheduling_seconds.labels(namespace, state, rung)
            self._declared[namespace] = since = now + datetime.timedelta(seconds=DECLARED_SECONDS)
        return now >= since

    def _hide(self, key: Key) -> None:
        shown = self._shown.pop(key, None)
        if shown is not None and shown not in self._shown.values():
            self.metrics.job_goodput.remove(*shown)
