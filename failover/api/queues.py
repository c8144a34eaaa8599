"""The queues a program is given: the regional controller's chain of rungs (FAILOVER_CHAIN, also the stack's
`queueChain` output) and the fleet's ladder of steps (FLEET_LADDER), rung or step 0 first. The stack writes them
with `to_json` and the programs read them with `from_json` (failover/config.py): every field is the stack's to say,
so a missing one is an error, not a default."""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Rung:
    flavor: str
    cluster_queue: str
    local_queue: str
    admission_check: bool  # a rung with a check (DWS) provisions before admission: nothing to time out early
    recovery_seconds: float  # how long a job that lost its slice here waits for it (fallback.sliceRecoveryWait)

    def as_data(self) -> dict[str, Any]:
        return {"flavor": self.flavor, "clusterQueue": self.cluster_queue, "localQueue": self.local_queue,
                "admissionCheck": self.admission_check, "recoverySeconds": _number(self.recovery_seconds)}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Rung:
        rung = cls(_string(data, "flavor"), _string(data, "clusterQueue"), _string(data, "localQueue"),
                   data["admissionCheck"], data["recoverySeconds"])
        if not isinstance(rung.admission_check, bool):
            raise TypeError(f"admissionCheck must be true or false: {dict(data)!r}")
        if isinstance(rung.recovery_seconds, bool) or not isinstance(rung.recovery_seconds, (int, float)) or \
                rung.recovery_seconds <= 0:
            raise TypeError(f"recoverySeconds must be a number above 0: {dict(data)!r}")
        return rung


@dataclass(frozen=True)
class Chain:
    """The queue chain the stack declared, rung 0 first."""

    rungs: tuple[Rung, ...]

    def to_json(self) -> str:
        return json.dumps([rung.as_data() for rung in self.rungs])

    @classmethod
    def from_data(cls, data: Sequence[Mapping[str, Any]]) -> Chain:
        return cls(tuple(Rung.from_data(rung) for rung in _list(data)))

    @classmethod
    def from_json(cls, text: str) -> Chain:
        return cls.from_data(json.loads(text))

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
    cluster_queue: str
    admission_check: str
    members: tuple[str, ...]
    rung: str  # "" for the last step
    stockout_grace: datetime.timedelta | None = None  # the member's stockout grace period (the early path)
    pods_ready_timeout: datetime.timedelta | None = None  # the member's podsReadyTimeout (Kueue's waitForPodsReady)
    # The member's Kueue flavor of the rung (a one-member step's: what a climb back reads of the member's quota); ""
    # for the last step, or a member that did not publish it (an older version)
    flavor: str = ""

    @property
    def member(self) -> str | None:
        """The member of a one-member step (a rung offered by one member); None for the last step."""
        return self.members[0] if self.rung and len(self.members) == 1 else None

    def as_data(self) -> dict[str, Any]:
        """Its JSON form; the members' two durations and the flavor only where they published them (an older
        member did not)."""
        data: dict[str, Any] = {"localQueue": self.local_queue, "clusterQueue": self.cluster_queue,
                                "admissionCheck": self.admission_check, "rung": self.rung,
                                "members": list(self.members)}
        if self.stockout_grace is not None:
            data["stockoutGracePeriodSeconds"] = _number(self.stockout_grace.total_seconds())
        if self.pods_ready_timeout is not None:
            data["podsReadyTimeoutSeconds"] = _number(self.pods_ready_timeout.total_seconds())
        if self.flavor:
            data["flavor"] = self.flavor
        return data

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Step:
        members = _list(data["members"])
        if not all(isinstance(member, str) for member in members):
            raise TypeError(f"members must be a list of strings: {dict(data)!r}")
        return cls(_string(data, "localQueue"), _string(data, "clusterQueue"), _string(data, "admissionCheck"),
                   tuple(members), _string(data, "rung", empty=True), _seconds(data.get("stockoutGracePeriodSeconds")),
                   _seconds(data.get("podsReadyTimeoutSeconds")), _string(data, "flavor", empty=True)
                   if "flavor" in data else "")


@dataclass(frozen=True)
class Ladder:
    """The fleet's ladder the fleet stack declared, step 0 first; the last step is DWS in every member."""

    steps: tuple[Step, ...]

    def to_json(self) -> str:
        return json.dumps([step.as_data() for step in self.steps], sort_keys=True)

    @classmethod
    def from_data(cls, data: Sequence[Mapping[str, Any]]) -> Ladder:
        return cls(tuple(Step.from_data(step) for step in _list(data)))

    @classmethod
    def from_json(cls, text: str) -> Ladder:
        return cls.from_data(json.loads(text))

    def index(self, local_queue: str) -> int | None:
        return next((i for i, step in enumerate(self.steps) if step.local_queue == local_queue), None)

    def step_of(self, local_queue: str) -> Step | None:
        index = self.index(local_queue)
        return None if index is None else self.steps[index]


def _list(data: Any) -> list:
    if not isinstance(data, list):
        raise TypeError(f"expected a list: {data!r}")
    return data


def _string(data: Mapping[str, Any], key: str, empty: bool = False) -> str:
    value = data[key]
    if not isinstance(value, str) or not (value or empty):
        raise TypeError(f"{key} must be a {'string' if empty else 'non-empty string'}: {dict(data)!r}")
    return value


def _seconds(value: int | None) -> datetime.timedelta | None:
    return datetime.timedelta(seconds=value) if value is not None else None


def _number(seconds: float) -> int | float:
    """Whole seconds as a JSON integer (120, not 120.0), as the stack has always written them."""
    return int(seconds) if seconds == int(seconds) else seconds
