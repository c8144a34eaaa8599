"""The shape of the configuration table (infra/settings/keys.py): one `Setting` per config key and per field.

A key's default, type, range and description are written once, in the table; the readers take their defaults
from it, and Pulumi.yaml's `config:` block and docs/configuration.md are rendered from it (infra/settings/table.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from infra.settings.formats import short_duration

# The kinds of value a key or field holds (the docs' Type column) and the Python type a config value of each has.
STRING, INTEGER, BOOLEAN, DURATION = "string", "integer", "boolean", "duration"
STRINGS, OBJECTS = "list of strings", "list of objects"
OBJECT = "object"  # fields merged one by one over their defaults
PER_RUNG = "duration per rung"  # {<rung config key> or default: <duration>}, merged over the defaults
PYTHON_TYPES = {STRING: str, DURATION: str, INTEGER: int, BOOLEAN: bool, STRINGS: list, OBJECTS: list,
                OBJECT: dict, PER_RUNG: dict}

# Which stacks read a key (roles/): every regional stack (a platform, the keys whose defaults are DEFAULTS), every
# stack that runs the training jobs, a fleet stack only, a team stack only. Keys of the last two have no project
# default: setting one gives a stack that role (__main__.py picks it).
REGION, JOBS, FLEET, TEAM = "region", "jobs", "fleet", "team"


class _Required:
    """The default of a field that has none: an item of a list must give it."""

    def __repr__(self) -> str:
        return "required"


REQUIRED = _Required()
UNSET = None  # the default of an optional field with no value (e.g. a team's borrowingLimit: no limit)


@dataclass(frozen=True)
class Bounds:
    """The inclusive range of an integer, or of a duration in seconds (written as 30s, 5m, 24h)."""

    low: int
    high: int
    duration: bool = False

    def __contains__(self, value: int) -> bool:
        return self.low <= value <= self.high

    def text(self) -> str:
        if self.duration:
            return f"{short_duration(self.low)} to {short_duration(self.high)}"
        return f"{self.low} to {self.high}"


@dataclass(frozen=True)
class Setting:
    """A config key, or a field of an object key (or of a list's items), as a user sets it."""

    name: str
    kind: str
    description: str
    default: Any = None  # an object's is made of its fields' defaults
    bounds: Bounds | None = None
    choices: tuple[str, ...] = ()
    rule: str = ""  # what else a value must be, in words
    fields: tuple[Setting, ...] = ()  # an object's fields, or each item's of a list of objects
    stacks: str = REGION  # top-level keys only

    @property
    def value(self) -> Any:
        """The default as the reader merges over it: an object's from its fields, in their order."""
        if self.kind == OBJECT:
            return {field.name: field.value for field in self.fields}
        return self.default

    @property
    def allowed(self) -> str:
        """The range, choices and rule in words (the docs' Range column)."""
        parts = [self.bounds.text()] if self.bounds else []
        if self.choices:
            parts.append("one of " + ", ".join(self.choices))
        if self.rule:
            parts.append(self.rule)
        return "; ".join(parts)

    @property
    def declared(self) -> bool:
        """Declared in Pulumi.yaml with a project default (a fleet's or a team's own keys are not)."""
        return self.stacks in (REGION, JOBS)

    def walk(self, prefix: str = "") -> Iterator[tuple[str, Setting]]:
        """(dotted path, setting) of this setting and every field under it; a list's item fields as key[].field."""
        path = f"{prefix}{self.name}"
        yield path, self
        below = f"{path}[]." if self.kind == OBJECTS else f"{path}."
        for field in self.fields:
            yield from field.walk(below)
