"""The offline plans the test bed deploys: a shipped stack's config as the CLI would pass it, and its recorded graph
(infra/offline.py). The tests' fixtures (tests/conftest.py) and the benchmarks (bench/) read the same ones."""

from __future__ import annotations

import functools
from pathlib import Path

from infra.offline import PLACEHOLDER_PROJECT, OfflineEngine, Plan, config_value, namespaced, stack_config

REPO = Path(__file__).resolve().parent.parent


def base_config(stack: str = "dev") -> dict[str, str]:
    """A shipped stack's config as the CLI would pass it, with the project a user sets by hand."""
    config = stack_config(stack)
    config.setdefault("gcp:project", PLACEHOLDER_PROJECT)
    return config


@functools.cache
def _cached_plan(stack: str) -> Plan:
    return OfflineEngine(stack).run(base_config(stack))


def config_with(overrides: dict[str, object], stack: str = "dev") -> dict[str, str]:
    """A shipped stack's config with keys replaced; values are given as YAML would give them."""
    config = base_config(stack)
    for key, value in overrides.items():
        if value is None:
            config.pop(namespaced(key), None)
        else:
            config[namespaced(key)] = config_value(value)
    return config


def plan_for(stack: str = "dev", overrides: dict[str, object] | None = None) -> Plan:
    """The recorded graph of a stack (cached when not overridden)."""
    if not overrides:
        return _cached_plan(stack)
    return OfflineEngine(stack).run(config_with(overrides, stack))
