"""The other records the programs keep on a RayJob as JSON annotations: a lost slice (the regional controller's) and a
give-up (the fleet's ladder's). A Move is in moves.py."""

from __future__ import annotations

import json
from dataclasses import dataclass

LOST, RECOVERED = "lost", "recovered"
GIVING_UP, GAVE_UP = "deactivating", "done"


@dataclass(frozen=True)
class LostSlice:
    """The RayJob's SLICE_LOST_ANNOTATION: the loss of this admission, and its end."""

    flavor: str
    at: str  # RFC 3339: the first signal
    cause: str
    until: str  # at + the rung's recovery wait
    state: str = LOST
    recovered_at: str = ""

    def to_json(self) -> str:
        return json.dumps({"flavor": self.flavor, "at": self.at, "cause": self.cause, "until": self.until,
                           "state": self.state, "recoveredAt": self.recovered_at}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> LostSlice | None:
        if not text:
            return None
        try:
            data = json.loads(text)
            return cls(data["flavor"], data["at"], data["cause"], data["until"], data["state"],
                       data.get("recoveredAt", ""))
        except (ValueError, KeyError, TypeError):
            return None


@dataclass(frozen=True)
class GiveUp:
    """That the ladder gave a job up; its JSON form is the RayJob annotation GAVE_UP_ANNOTATION."""

    at: str  # RFC 3339
    max_wait: str  # the limit, as a duration (2h)
    waited: str  # how long it had waited, as a duration
    step: str  # the step (LocalQueue) it was waiting at
    source: str  # where the limit came from: fleet.maxWait or the RayJob's annotation
    state: str = GIVING_UP

    def to_json(self) -> str:
        return json.dumps({"at": self.at, "maxWait": self.max_wait, "waited": self.waited, "step": self.step,
                           "source": self.source, "state": self.state}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> GiveUp | None:
        if not text:
            return None
        try:
            data = json.loads(text)
            return cls(data["at"], data["maxWait"], data["waited"], data["step"], data["source"], data["state"])
        except (ValueError, KeyError, TypeError):
            return None

    def done(self) -> GiveUp:
        return GiveUp(self.at, self.max_wait, self.waited, self.step, self.source, GAVE_UP)

    def message(self) -> str:
        return (f"given up: no member admitted it within its maximum wait of {self.max_wait} ({self.source}); it "
                f"waited {self.waited}, last at step {self.step}. Its Workload is deactivated and its copies and "
                "DWS requests in the members are deleted; submit it again, or reactivate its Workload, to retry")
