"""A disruption of a running job's slice seen coming, as the regional controller records it on the RayJob
(AHEAD_ANNOTATION) and `ops status` shows it: a host's scheduled maintenance, or a DWS run's end."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

MAINTENANCE, RUN_END = "maintenance", "run-end"
# fallback.maintenance.action: what the controller does ahead of it (failover/maintenance.py)
MOVE, CHECKPOINT, NOTHING = "move", "checkpoint", "none"
ACTIONS = (MOVE, CHECKPOINT, NOTHING)


@dataclass(frozen=True)
class Ahead:
    """The disruption the job's slice will meet first, on the rung it runs on, and what was done ahead of it."""

    kind: str  # MAINTENANCE or RUN_END
    at: str  # RFC 3339: the maintenance window's start, or the DWS run's end
    host: str  # the node to be maintained ("" for a run's end)
    flavor: str  # the rung it runs on
    seen_at: str  # RFC 3339: when the controller first saw it
    checkpoint: str = ""  # the CheckpointRequest's value, once asked
    moved_to: str = ""  # the rung it moved to ahead of it (action move)
    # Recorded but not announced yet (no Event, not counted): a DWS run's end further off than the announce horizon
    # (failover/maintenance.py announce_at). Absent in the JSON once announced, as records before it were.
    quiet: bool = False

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind, "at": self.at, "host": self.host, "flavor": self.flavor,
                           "seenAt": self.seen_at, "checkpoint": self.checkpoint, "movedTo": self.moved_to,
                           **({"quiet": True} if self.quiet else {})}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> Ahead | None:
        if not text:
            return None
        try:
            data = json.loads(text)
            return cls(data["kind"], data["at"], data["host"], data["flavor"], data["seenAt"],
                       data.get("checkpoint", ""), data.get("movedTo", ""), data.get("quiet", False) is True)
        except (ValueError, KeyError, TypeError):
            return None

    def same_disruption(self, other: Ahead | None) -> bool:
        return other is not None and (self.kind, self.at, self.host, self.flavor) == (
            other.kind, other.at, other.host, other.flavor)

    def with_(self, **changes) -> Ahead:
        return replace(self, **changes)

    def message(self) -> str:
        """`ops status`'s line and the Event's message."""
        what = (f"maintenance of host {self.host} at {self.at}" if self.kind == MAINTENANCE
                else f"its DWS run ends at {self.at}")
        done = []
        if self.checkpoint:
            done.append(f"checkpoint asked at {self.checkpoint.split(' ', 1)[-1]}")
        if self.moved_to:
            done.append(f"moved to {self.moved_to}")
        return f"{what} (on {self.flavor})" + (f"; {', '.join(done)}" if done else "")
