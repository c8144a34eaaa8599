"""A request to a running job to save the step it reached and go on (the checkpoint channel): its value on the TPU
worker pods' CHECKPOINT_REQUEST_ANNOTATION, as train.py reads it back from the pods' downwardAPI file."""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from dataclasses import dataclass

from failover.api.times import format_time, parse_time

# An id the annotation's file holds without quoting trouble (the kubelet writes each value Go-quoted).
REQUEST_ID = re.compile(r"[a-z0-9][a-z0-9.-]{0,62}")


@dataclass(frozen=True)
class CheckpointRequest:
    """`<id> <at>`: the id names what the save is for (a restart that asks again asks the same), `at` is when it was
    asked (RFC 3339): the channel has no answer, so the save is taken as done a bounded time after `at`."""

    id: str
    at: str

    def __post_init__(self):
        if not REQUEST_ID.fullmatch(self.id):
            raise ValueError(f"checkpoint request id {self.id!r} is not [a-z0-9][a-z0-9.-]{{0,62}}")

    @classmethod
    def about(cls, reason: str, deadline: datetime.datetime, now: datetime.datetime) -> CheckpointRequest:
        """A request for a save before `deadline` (a maintenance window, a DWS run's end, a move), asked `now`; the
        id is the reason and the deadline, so the same cause always asks the same request."""
        return cls(f"{reason.lower()}-{deadline.astimezone(datetime.timezone.utc):%Y%m%dt%H%M%Sz}", format_time(now))

    def value(self) -> str:
        return f"{self.id} {self.at}"

    @classmethod
    def parse(cls, text: str | None) -> CheckpointRequest | None:
        request_id, _, at = (text or "").strip().partition(" ")
        try:
            return cls(request_id, at) if parse_time(at) is not None else None
        except ValueError:
            return None

    @property
    def asked_at(self) -> datetime.datetime:
        return parse_time(self.at)


# ---- the pods' answers ------------------------------------------------------------------------------------------
def pods_to_ask(request: CheckpointRequest, asked: Mapping[str, str | None]) -> list[str]:
    """The pods (of {pod: its request annotation now}) that do not carry `request` yet, by name. A pod created after
    the request is asked too, which costs nothing: train.py takes the request a worker group sees at its start as
    honoured (it has just restored its newest step; nothing is unsaved yet)."""
    return sorted(pod for pod, value in asked.items() if CheckpointRequest.parse(value) != request)


def answered_at(request: CheckpointRequest, save_timeout: datetime.timedelta) -> datetime.datetime:
    """When the save is taken as done: `save_timeout` after the request (the channel has no answer)."""
    return request.asked_at + save_timeout
