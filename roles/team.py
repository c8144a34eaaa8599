"""The team role: one team's training jobs on the shared cluster of a platform stack."""

from __future__ import annotations

import pulumi

PLATFORM_STACK_KEY = "platformStack"


def is_team_stack(config: pulumi.Config) -> bool:
    """A stack that names its platform stack is a team stack; any other is a platform."""
    return config.get(PLATFORM_STACK_KEY) is not None


def deploy() -> None:
    raise NotImplementedError
