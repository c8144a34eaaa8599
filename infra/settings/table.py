"""Pulumi.yaml's `config:` block and docs/configuration.md, rendered from the configuration table (keys.py).

    python -m infra.settings.table --write   # rewrite both files from the table (the rest of Pulumi.yaml is kept)
    python -m infra.settings.table --check   # exit 1, naming the file, when either one differs from the table

tests/test_settings_table.py runs the check, so a key edited in one place only fails the tests.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import yaml

from infra.settings.constants import NAMESPACE
from infra.settings.keys import KEYS
from infra.tpu import MACHINE_TYPES, Placement, TpuGeneration
from infra.settings.schema import (BOOLEAN, FLEET, INTEGER, JOBS, OBJECT, OBJECTS, REGION, REQUIRED, STRING,
                                   STRINGS, TEAM, Setting)

ROOT = Path(__file__).resolve().parents[2]
PROJECT_FILE, DOCS_FILE = ROOT / "Pulumi.yaml", ROOT / "docs" / "configuration.md"
WIDTH = 120  # a default longer than this on one line is written as a block, one field a line
# Pulumi's project config types only scalars and arrays of them; an object key (or a list of objects) stays untyped,
# and a stack file may then set any subset of its fields.
# Ref: https://www.pulumi.com/docs/iac/concepts/projects/project-file/#config-options
PULUMI_TYPES = {STRING: "string", INTEGER: "integer", BOOLEAN: "boolean", STRINGS: "array"}
_PLAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
# Read as a number by some YAML parser (1.34, 0.19.2 by a lenient one, 1e-3 by YAML 1.2's, which Pulumi's Go uses).
_NUMBER_LIKE = re.compile(r"^[-+]?[0-9][0-9_]*(\.[0-9_]*)*([eE][-+]?[0-9]+)?$")


# --- YAML values as a person writes them ---

def yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    # Plain when every YAML reads it back as the same string (not 1.34, a number; not yes, a boolean); else quoted.
    if _PLAIN.match(value) and not _NUMBER_LIKE.match(value) and yaml.safe_load(value) == value:
        return value
    return json.dumps(value)


def yaml_flow(value: Any) -> str:
    """One line: {a: 1, b: [x, y]}."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {yaml_flow(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(yaml_flow(item) for item in value) + "]"
    return yaml_scalar(value)


def _yaml_entry(key: str, value: Any, indent: int) -> list[str]:
    """`key: value` at `indent`, an object too long for one line as a block of its fields."""
    line = f"{' ' * indent}{key}: {yaml_flow(value)}"
    if len(line) <= WIDTH or not isinstance(value, dict):
        return [line]
    return [f"{' ' * indent}{key}:", *(out for field, item in value.items()
                                       for out in _yaml_entry(field, item, indent + 2))]


# --- Pulumi.yaml ---

def _leaf_phrases(setting: Setting, prefix: str = "") -> list[str]:
    """`field: description [range]` for every field of an object (nested ones as a.b), for one description."""
    phrases = []
    for field in setting.fields:
        phrase = f"{prefix}{field.name}: {field.description}"
        if field.allowed:
            phrase += f" [{field.allowed}]"
        if field.kind == OBJECT and field.fields:
            phrases.extend([phrase, *_leaf_phrases(field, f"{prefix}{field.name}.")])
        else:
            phrases.append(phrase)
    return phrases


def pulumi_description(key: Setting) -> str:
    """A key's description in Pulumi.yaml: what it is and, in brackets, what it may be; then each field (or each
    item's field) likewise."""
    text = key.description
    if key.kind != OBJECT and key.allowed:
        text += f" [{key.allowed}]"
    if key.fields:
        each = "Each item: " if key.kind == OBJECTS else ""
        text += f" {each}" + "; ".join(_leaf_phrases(key)) + "."
    return text


def pulumi_config_block() -> str:
    """Pulumi.yaml from its `config:` line to the end: every key with a project default, typed where Pulumi can."""
    lines = ["config:"]
    for key in KEYS:
        if not key.declared:
            continue
        lines.append(f"  {NAMESPACE}:{key.name}:")
        if key.kind in PULUMI_TYPES:
            lines.append(f"    type: {PULUMI_TYPES[key.kind]}")
        if key.kind == STRINGS:
            lines.append("    items: {type: string}")
        lines.extend(_yaml_entry("default", key.value, 4))
        lines.append(f"    description: {json.dumps(pulumi_description(key), ensure_ascii=False)}")
    undeclared = ", ".join(f"{NAMESPACE}:{key.name}" for key in KEYS if not key.declared)
    note = (f"Not declared: {undeclared}. They have no project default, since setting one gives a stack its role "
            "(roles/); docs/configuration.md lists their fields, defaults and ranges.")
    lines += [f"  # {line}" for line in textwrap.wrap(note, WIDTH - 4)]
    return "\n".join(lines) + "\n"


def render_project_file(current: str) -> str:
    """`current` (Pulumi.yaml's text) with its `config:` block, which runs to the end, rendered from the table."""
    head, found, _ = current.partition("\nconfig:\n")
    if not found:
        raise ValueError("Pulumi.yaml has no top-level `config:` block")
    return f"{head}\n{pulumi_config_block()}"


# --- docs/configuration.md ---

_SECTIONS = (
    (REGION, "Every regional stack",
     "A platform's (or the seed's single stack's) own keys. A team stack must leave them at their defaults (it reads "
     "its platform's), and a fleet stack reads only zone, clusterName, gkeVersion, deletionProtection, systemPool, "
     "kueue, failoverController and monitoring."),
    (JOBS, "The training jobs, in every stack", ""),
    (FLEET, "A fleet stack", "Setting `fleet` makes a stack a fleet's manager ([fleet.md](fleet.md))."),
    (TEAM, "A team stack", "Setting `platformStack` makes a stack a team's ([teams.md](teams.md)); `team` is then "
                           "required."),
)


def _markdown_text(text: str) -> str:
    """Text in a table cell: <, *, _ and | escaped outside `code`, so that <project> or kube-* read as written."""
    parts = text.split("`")
    for index in range(0, len(parts), 2):
        parts[index] = re.sub(r"([\\<>*_|])", r"\\\1", parts[index])
    return "`".join(parts)


def _markdown_default(setting: Setting) -> str:
    if setting.default is REQUIRED:
        return "required"
    if setting.kind == OBJECT:
        return ""  # its fields' rows below
    return "unset" if setting.default is None else f"`{yaml_flow(setting.default)}`"


def _markdown_rows(key: Setting) -> list[str]:
    rows = []
    for path, setting in key.walk():
        cells = (f"`{path}`", setting.kind, _markdown_default(setting), _markdown_text(setting.allowed),
                 _markdown_text(setting.description))
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def configuration_markdown() -> str:
    lines = [
        "# Configuration",
        "",
        f"Every key lives in the `{NAMESPACE}:` namespace of a stack file (`Pulumi.<stack>.yaml`) or is set with "
        f"`pulumi config set {NAMESPACE}:<key> <value>` (one field of an object: `pulumi config set --path "
        f"'{NAMESPACE}:fallback.podsReadyTimeout' 20m`). An object key is merged field by field over its "
        "defaults, so a stack file sets only the fields it changes. Before any resource is declared, every value is "
        "checked; each problem names its key (`tpu-fallback:fallback.podsReadyTimeout: 2m is out of range; use 300s "
        "to 24h`) and all of them are reported at once.",
        "",
        "This page, the `config:` block of Pulumi.yaml and the program's defaults all come from one table, "
        "`infra/settings/keys.py` (and `keys_roles.py`); edit a key there and run "
        "`python -m infra.settings.table --write`. `tests/test_settings_table.py` fails when this page, Pulumi.yaml "
        "or the readers' checks disagree with the table.",
        "",
        "Types: a duration is a number and `s`, `m` or `h` (`90s`, `15m`, `1h`); a duration per rung is an object "
        "of durations by rung config key (`reservation`, `onDemand`, `spot`, `flexStart`) or `default`, merged over "
        "the defaults. `key[].field` is a field of each item of a list.",
    ]
    for stacks, title, intro in _SECTIONS:
        lines += ["", f"## {title}", ""]
        if intro:
            lines += [intro, ""]
        lines += ["| Key | Type | Default | Range | Description |", "| --- | --- | --- | --- | --- |"]
        for key in KEYS:
            if key.stacks == stacks:
                lines += _markdown_rows(key)
    lines += catalogue_markdown()
    return "\n".join(lines) + "\n"


# --- the TPU catalogue (infra/tpu.py), in the same page ---

def _generations() -> list[TpuGeneration]:
    return list(dict.fromkeys(machine.generation for machine in MACHINE_TYPES.values()))


def catalogue_markdown() -> list[str]:
    """The `tpu` key's choices: one row per generation of infra/tpu.py, then what TPU7x does differently."""
    lines = ["", "## TPU slices (`tpu`)", "",
             "What `tpu.machineType` and `tpu.topology` accept, from the catalogue `infra/tpu.py`, which every pool, "
             "quota, selector and worker derives from. Zones outside these lists need `tpu.allowUnlistedZone`.", "",
             "| Generation | Machine types (chips per VM) | Topologies | Zones | Flex-start zones | GKE | "
             "JAX devices per chip | Peak bf16 TFLOP/s per chip | Multi-host placement |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for generation in _generations():
        machines = [m for m in MACHINE_TYPES.values() if m.generation is generation]
        topologies = dict.fromkeys(t for m in machines for t in m.topologies())
        placement = ("a workload policy" if generation.placement is Placement.WORKLOAD_POLICY
                     else "the pool's TPU topology")
        cells = (generation.name, ", ".join(f"`{m.name}` ({m.chips_per_host})" for m in machines),
                 ", ".join(topologies), ", ".join(sorted(generation.zones)),
                 ", ".join(sorted(generation.flex_start_zones)), f"{generation.min_gke_version} or later",
                 str(generation.devices_per_chip), f"{generation.peak_bf16_tflops_per_chip:g}", placement)
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "", "### TPU7x (Ironwood)", "",
        "A multi-host TPU7x slice (2x2x2 and up) is placed by a Compute Engine workload policy, not by a TPU topology "
        "on the pool: the stack creates one resource policy of type high throughput with the slice's topology, in the "
        "cluster's region, named `<clusterName>-tpu7x-<topology>-<zone letter>`, and every rung's pools name it "
        "(`placementPolicy.policyName`, no `tpuTopology`). Pulumi creates it before the pools and deletes it after "
        "them. A single-host slice (2x2x1, or `tpu7x-standard-1t`) has none; `tpu7x-standard-1t` runs no training jobs (Ray has "
        "no 1x1x1 TPU7x slice). Each chip is two JAX devices (its two "
        "TensorCores): `--batch-size` in `workloads.trainingArgs` must be a multiple of twice the slice's chips, and "
        "MFU is reported against half a chip's peak per device. Kueue's quotas, the node selectors and the workers' "
        "`google.com/tpu` requests still count chips. What could not be confirmed is in [limits.md](limits.md#tpu7x-ironwood).",
        "",
        "Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/tpu-ironwood, "
        "https://cloud.google.com/tpu/docs/tpu7x",
    ]
    return lines


# --- the command ---

def rendered() -> dict[Path, str]:
    """What each file must hold, from the table."""
    return {PROJECT_FILE: render_project_file(PROJECT_FILE.read_text()), DOCS_FILE: configuration_markdown()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.settings.table", description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="rewrite Pulumi.yaml's config block and the docs page")
    action.add_argument("--check", action="store_true", help="exit 1 when either differs from the table")
    args = parser.parse_args(argv)
    stale = [path for path, text in rendered().items() if not path.exists() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(ROOT)} differs from infra/settings/keys.py; run python -m infra.settings.table "
                  "--write", file=sys.stderr)
        return 1 if stale else 0
    for path, text in rendered().items():
        if path in stale:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
