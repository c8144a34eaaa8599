"""The queues a program is given: the regional controller's chain of rungs (`queueChain`, FAILOVER_CHAIN) and the
fleet's ladder of steps (FLEET_LADDER), rung or step 0 first."""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass

DEFAULT_RECOVERY_SECONDS = 300.0  # when the chain does not say (infra/settings.py has the stack's defaults)


@dataclass(frozen=True)
class Rung:
    flavor: str
    cluster_queue: str
    local_queue: str
    admission_check: bool  # a rung with a check (DWS) provisions before admission: nothing to time out early
    recovery_seconds: float = DEFAULT_RECOVERY_SECONDS  # how long a job that lost its slice here waits for it


@dataclass(frozen=True)
class Chain:
    """The queue chain the stack declared, rung 0 first (the `queueChain` output, passed to the controller)."""

    rungs: tuple[Rung, ...]

    @classmethod
    def from_json(cls, text: str) -> Chain:
        return cls(tuple(Rung(r["flavor"], r["clusterQueue"], r["localQueue"], bool(r.get("admissionCheck")),
                              float(r.get("recoverySeconds", DEFAULT_RECOVERY_SECONDS)))
                         for r in json.loads(text)))

    def start_of_queue(self, local_queue: str) -> int | None:
        """The rung a LocalQueue's ClusterQueue starts at; None for a queue outside the chain."""
        return next((i for i, rung in enumerate(self.rungs) if rung.local_queue == local_queue), None)

    def index_of_flavor(self, flavor: str | None) -> int | None:
        return next((i for i, rung in enumerate(self.rungs) if rung.flavor == flavor), None)

    def stocks_out_after_admission(self, flavor: str | None) -> bool:
        """A rung without an admission check admits before capacity exists; DWS provisions first."""
        rung = self.index_of_flavor(flavor)
        return rung is not None and not self.rungs[rung].admission_check


@dataclass(frozen=True)
class Step:
    local_queue: str
    admission_check: str
    members: tuple[str, ...]
    rung: str  # "" for the last step
    stockout_grace: datetime.timedelta | None = None  # the member's stockout grace period (the early path)
    pods_ready_timeout: datetime.timedelta | None = None  # the member's podsReadyTimeout (Kueue's waitForPodsReady)

    @property
    def member(self) -> str | None:
        """The member of a one-member step (a rung offered by one member); None for the last step."""
        return self.members[0] if self.rung and len(self.members) == 1 else None


@dataclass(frozen=True)
class Ladder:
    """The fleet's ladder the fleet stack declared, step 0 first (FLEET_LADDER, passed to the ladder)."""

    steps: tuple[Step, ...]

    @classmethod
    def from_json(cls, text: str) -> Ladder:
        return cls(tuple(
            Step(s["localQueue"], s["admissionCheck"], tuple(s.get("members") or ()), s.get("rung", ""),
                 _seconds(s.get("stockoutGracePeriodSeconds")), _seconds(s.get("podsReadyTimeoutSeconds")))
            for s in json.loads(text)))

    def index(self, local_queue: str) -> int | None:
        return next((i for i, step in enumerate(self.steps) if step.local_queue == local_queue), None)

    def step_of(self, local_queue: str) -> Step | None:
        index = self.index(local_queue)
        return None if index is None else self.steps[index]


def _seconds(value: int | None) -> datetime.timedelta | None:
    return datetime.timedelta(seconds=value) if value is not None else None
