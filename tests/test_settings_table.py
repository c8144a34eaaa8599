"""The configuration table (infra/settings/keys.py) agrees with Pulumi.yaml, docs/configuration.md and the readers.

The two files are rendered from the table and must equal the rendering; every range, choice and type the table
states is probed on the reader of its key: the bounds accepted, one past them refused by a problem naming the key.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from infra.fleet import FLEET_DEFAULTS, FLEET_KEY, read_fleet_settings
from infra.settings import ConfigReader, DEFAULTS, KEYS, read_fallback_settings, read_monitoring_settings
from infra.settings.formats import duration_seconds
from infra.settings.keys import BY_NAME, key_default
from infra.settings.regional import read_platform_settings
from infra.settings.schema import (BOOLEAN, DURATION, FLEET, INTEGER, JOBS, OBJECT, OBJECTS, PER_RUNG, PYTHON_TYPES,
                                   REGION, REQUIRED, STRING, STRINGS, TEAM, Setting)
from infra.settings.table import (DOCS_FILE, PROJECT_FILE, PULUMI_TYPES, configuration_markdown,
                                  render_project_file)
from roles.team import PLATFORM_STACK_KEY, TEAM_KEY, WORKLOADS_KEY
from workloads.settings import WORKLOAD_DEFAULTS, read_workload_settings

PREFIX = "tpu-fallback:"


class StubConfig(dict):
    """Raw config values by key, read through `get` as pulumi.Config reads them."""


def _problems(stacks: str, config: dict[str, str]) -> list[str]:
    """What the reader of a key of this kind of stack says about `config` (the rest at its defaults)."""
    reader = ConfigReader(StubConfig(config))
    if stacks == REGION:
        read_platform_settings(reader, StubConfig({"project": "example-project"}))
    elif stacks == JOBS:
        read_workload_settings(reader, None)
    elif stacks == FLEET:
        read_fleet_settings(reader, ("tpu-fallback", "fleet"))
    return reader.problems


def _config(path: str, value: Any) -> dict[str, str]:
    """A stack's config with one field set: fallback.podsReadyTimeout=5m as {"fallback": '{"podsReadyTimeout": ...}'}."""
    key, *fields = path.split(".")
    for field in reversed(fields):
        value = {field: value}
    return {key: value if isinstance(value, str) else json.dumps(value)}


def _names(problems: list[str], path: str) -> list[str]:
    return [p for p in problems if p.startswith(f"{PREFIX}{path}:")]


def _settings(*, stacks: tuple[str, ...] = (REGION, JOBS, FLEET), items: bool = False) -> list[tuple[str, Setting]]:
    """(path, setting) of every key and field of these stacks; the fields of a list's items only when asked."""
    found = [(path, setting) for key in KEYS if key.stacks in stacks for path, setting in key.walk()]
    return [(path, setting) for path, setting in found if items or "[]" not in path]


def _id(entry: tuple[str, Setting]) -> str:
    return entry[0]


# --- the rendered files ---

def test_pulumi_yaml_config_block_is_rendered_from_the_table():
    text = PROJECT_FILE.read_text()
    assert text == render_project_file(text), "run python -m infra.settings.table --write"


def test_docs_configuration_page_is_rendered_from_the_table():
    assert DOCS_FILE.read_text() == configuration_markdown(), "run python -m infra.settings.table --write"


def test_pulumi_yaml_declares_each_key_with_the_table_type_default_and_description():
    declared = yaml.safe_load(PROJECT_FILE.read_text())["config"]
    assert list(declared) == [f"{PREFIX}{key.name}" for key in KEYS if key.declared]
    for key in KEYS:
        if not key.declared:
            continue
        decl = declared[f"{PREFIX}{key.name}"]
        assert decl["default"] == key.value, key.name  # as YAML reads it back: no quoting lost
        assert decl.get("type") == PULUMI_TYPES.get(key.kind), key.name
        assert decl["description"].startswith(key.description), key.name
        for field in key.fields:
            assert f"{field.name}: {field.description}" in decl["description"], (key.name, field.name)


# --- the table and the program's defaults ---

def test_the_table_holds_every_key_the_program_reads():
    # roles/: a regional stack reads DEFAULTS and workloads; a team stack also platformStack and team; a fleet, fleet.
    read = {*DEFAULTS, WORKLOADS_KEY, PLATFORM_STACK_KEY, TEAM_KEY, FLEET_KEY}
    assert set(BY_NAME) == read
    assert [key.name for key in KEYS if key.stacks == REGION] == list(DEFAULTS)
    assert {BY_NAME[WORKLOADS_KEY].stacks, BY_NAME[FLEET_KEY].stacks, BY_NAME[TEAM_KEY].stacks} == {JOBS, FLEET, TEAM}


def test_workloads_and_fleet_readers_merge_over_the_table_defaults():
    assert WORKLOAD_DEFAULTS == key_default(WORKLOADS_KEY)
    assert FLEET_DEFAULTS == key_default(FLEET_KEY)


@pytest.mark.parametrize("entry", _settings(stacks=(REGION, JOBS, FLEET, TEAM), items=True), ids=_id)
def test_each_default_has_the_kind_and_range_the_table_states(entry):
    path, setting = entry
    if setting.default is REQUIRED or setting.default is None:
        return  # no value: an item's required field, an unset limit, an object made of its fields
    assert type(setting.default) is PYTHON_TYPES[setting.kind], path
    if setting.choices:
        assert setting.default in setting.choices, path
    if setting.bounds and setting.kind == INTEGER:
        assert setting.default in setting.bounds, path
    if setting.bounds and setting.kind == DURATION and setting.default:  # "" : the fleet's maxWait, never
        assert duration_seconds(setting.default) in setting.bounds, path
    if setting.kind == PER_RUNG:
        assert all(duration_seconds(wait) in setting.bounds for wait in setting.default.values()), path


def test_an_empty_stack_reads_the_table_defaults():
    reader = ConfigReader(StubConfig())
    fallback, monitoring = read_fallback_settings(reader, ()), read_monitoring_settings(reader)
    assert reader.problems == []
    table = DEFAULTS["fallback"]
    assert fallback.pods_ready_timeout_seconds == duration_seconds(table["podsReadyTimeout"])
    assert fallback.stockout_grace_period_seconds == duration_seconds(table["stockoutGracePeriod"])
    assert dict(fallback.slice_recovery_wait) == {
        rung: duration_seconds(wait) for rung, wait in table["sliceRecoveryWait"].items()}
    alerts = DEFAULTS["monitoring"]["alerts"]
    assert dict(monitoring.alerts.pending_too_long) == {
        rung: duration_seconds(wait) for rung, wait in alerts["pendingTooLong"].items()}
    assert monitoring.alerts.moves_per_hour == alerts["movesPerHour"]


# --- the readers enforce what the table states ---

def _probe(setting: Setting, number: int) -> tuple[Any, str]:
    """A value of `number` in the setting's kind, and the path a problem with it names below the setting's."""
    value = f"{number}s" if setting.kind in (DURATION, PER_RUNG) else number
    return ({"default": value}, ".default") if setting.kind == PER_RUNG else (value, "")


@pytest.mark.parametrize("entry", [e for e in _settings() if e[1].bounds], ids=_id)
def test_reader_accepts_the_table_range_and_refuses_one_past_it(entry):
    path, setting = entry
    stacks = BY_NAME[path.split(".")[0]].stacks
    low, high = setting.bounds.low, setting.bounds.high
    for number, accepted in ((low, True), (high, True), (low - 1, False), (high + 1, False)):
        if number < 0 and setting.kind != INTEGER:
            continue  # no duration below 0s can be written
        value, below = _probe(setting, number)
        named = _names(_problems(stacks, _config(path, value)), path + below)
        assert (named == []) is accepted, (path, value, named)


@pytest.mark.parametrize("entry", [e for e in _settings() if e[1].choices], ids=_id)
def test_reader_refuses_a_value_outside_the_table_choices_and_lists_them(entry):
    path, setting = entry
    named = _names(_problems(BY_NAME[path.split(".")[0]].stacks, _config(path, "none-of-these")), path)
    assert named, path
    assert all(choice in named[0] for choice in setting.choices), named


_WRONG = {STRING: 1, DURATION: 1, INTEGER: "1", BOOLEAN: "true", STRINGS: {}, OBJECTS: {}, OBJECT: [], PER_RUNG: []}


@pytest.mark.parametrize("entry", [e for e in _settings() if "." in e[0]], ids=_id)
def test_reader_refuses_a_field_of_another_kind_than_the_table(entry):
    path, setting = entry
    named = _names(_problems(BY_NAME[path.split(".")[0]].stacks, _config(path, _WRONG[setting.kind])), path)
    assert named, (path, setting.kind)
