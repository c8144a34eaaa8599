"""Reading one Pulumi config namespace: every problem collected, each naming its key, and reported at once."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

import pulumi

from infra.rungs import RUNG_KINDS
from infra.settings.constants import DEFAULT_RUNG, NAMESPACE
from infra.settings.formats import duration_seconds
from infra.settings.keys import setting


class SettingsError(pulumi.RunError, ValueError):
    """The stack configuration is invalid; `problems` holds one line per bad key.

    A RunError: the Pulumi CLI prints its message alone, with no "Program failed with an unhandled exception"
    and no traceback. Ref: https://github.com/pulumi/pulumi/blob/master/sdk/python/cmd/pulumi-language-python-exec
    """

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid stack configuration:\n" + "\n".join(f"  - {p}" for p in problems))


class ConfigReader:
    """Reads keys of one Pulumi config namespace, collecting problems instead of stopping at the first."""

    def __init__(self, config: pulumi.Config, namespace: str = NAMESPACE):
        self.config = config
        self.namespace = namespace
        self.problems: list[str] = []

    def key(self, name: str) -> str:
        return f"{self.namespace}:{name}"

    def fail(self, name: str, message: str) -> None:
        self.problems.append(f"{self.key(name)}: {message}")

    def raise_if_failed(self) -> None:
        if self.problems:
            raise SettingsError(self.problems)

    def text(self, name: str, default: str, pattern: re.Pattern[str] | None = None, rule: str = "") -> str:
        value = self.config.get(name)
        if value is None:
            return default
        if pattern is not None and not pattern.match(value):
            self.fail(name, f"{value!r} is not valid; {rule}")
        return value

    def boolean(self, name: str, default: bool) -> bool:
        value = self.config.get(name)
        if value is None:
            return default
        if value.lower() not in ("true", "false"):
            self.fail(name, f"{value!r} is not a boolean; use true or false")
            return default
        return value.lower() == "true"

    def _structured(self, name: str, kind: type, expected: str) -> Any:
        """A JSON object or list key as the CLI passes it; None when unset or (a problem) of another kind."""
        raw = self.config.get(name)
        if raw is None:
            return None
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = None
        if not isinstance(value, kind):
            self.fail(name, f"must be {expected}; got {raw!r}")
            return None
        return value

    def obj(self, name: str, defaults: Mapping[str, Any]) -> dict[str, Any]:
        """An object key merged over its defaults; unknown or mistyped fields are problems."""
        return self.fields(name, self._structured(name, dict, f"an object with fields {', '.join(defaults)}"),
                           defaults)

    def fields(self, name: str, value: Mapping[str, Any] | None, defaults: Mapping[str, Any]) -> dict[str, Any]:
        """An object's fields (a key's, or a nested object's) merged over its defaults; unknown or mistyped
        fields are problems."""
        merged = dict(defaults)
        for field, given in (value or {}).items():
            if field not in defaults:
                self.fail(f"{name}.{field}", f"unknown field; allowed: {', '.join(defaults)}")
            elif type(given) is not type(defaults[field]):
                kind = type(defaults[field]).__name__.replace("str", "string").replace("bool", "boolean")
                self.fail(f"{name}.{field}", f"must be a {kind}; got {given!r}")
            else:
                merged[field] = given
        return merged

    def array(self, name: str, default: list) -> list:
        value = self._structured(name, list, "a list")
        return list(default) if value is None else value

    def check(self, name: str, ok: bool, message: str) -> bool:
        if not ok:
            self.fail(name, message)
        return ok

    def unknown_keys(self, known: set[str]) -> None:
        """Top-level keys of this namespace that nothing reads: typos must not pass silently."""
        prefix = f"{self.namespace}:"
        present = set(pulumi.runtime.config.CONFIG.get()) | set(pulumi.runtime.config.get_config_env())
        for full_key in sorted(present):
            if full_key.startswith(prefix) and full_key[len(prefix):] not in known:
                self.fail(full_key[len(prefix):], f"unknown key; known keys: {', '.join(sorted(known))}")


def lookup_or_fail(reader: ConfigReader, name: str, lookup: Callable[[str], Any], value: str) -> Any:
    """A catalogue entry (infra/tpu.py, infra/cpu.py), or None with its ValueError as the key's problem."""
    try:
        return lookup(value)
    except ValueError as err:
        reader.fail(name, str(err))
        return None


def read_duration(reader: ConfigReader, name: str, value: str) -> int | None:
    seconds = duration_seconds(value)
    reader.check(name, seconds is not None, f"{value!r} is not a duration; use a number and s, m or h, "
                                            "such as 90s, 15m or 1h")
    return seconds


def read_bounded_duration(reader: ConfigReader, name: str, value: str, table_name: str | None = None) -> int | None:
    """The seconds of a duration within the range the table states for `table_name` (`name` by default; a dotted
    path of infra/settings/keys.py), or None: unreadable or out of range, a problem that names it."""
    bounds = setting(table_name or name).bounds
    seconds = read_duration(reader, name, value)
    if seconds is not None and reader.check(name, seconds in bounds, f"{value} is out of range; use {bounds.text()}"):
        return seconds
    return None


def read_per_rung_durations(reader: ConfigReader, name: str, given: dict, defaults: Mapping[str, str]
                            ) -> tuple[tuple[str, int], ...]:
    """A duration per rung config key, or `default`; the given keys over the defaults. A rung that is off in this
    stack is allowed (its entry waits for it), a name that is no rung is not. Each within the table's range of
    `name`."""
    waits = dict(defaults)
    for rung, value in given.items():
        where = f"{name}.{rung}"
        if rung != DEFAULT_RUNG and rung not in RUNG_KINDS:
            reader.fail(where, f"unknown rung {rung!r}; use {DEFAULT_RUNG} or one of {', '.join(RUNG_KINDS)}")
        elif not isinstance(value, str):
            reader.fail(where, f"must be a duration string such as 90m; got {value!r}")
        else:
            waits[rung] = value
    found = []
    for rung, value in waits.items():
        seconds = read_bounded_duration(reader, f"{name}.{rung}", value, table_name=name)
        if seconds is not None:
            found.append((rung, seconds))
    return tuple(found)
