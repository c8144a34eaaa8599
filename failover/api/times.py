"""Timestamps as the Kubernetes API writes them (RFC 3339, whole seconds, UTC) and as the programs write theirs."""

from __future__ import annotations

import datetime


def parse_time(text: str | None) -> datetime.datetime | None:
    if not text:
        return None
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def format_time(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
