"""Strict validation of Kubernetes custom resources against upstream CRD schemas, like `kubectl --validate=strict`.

The CRDs stay in ../shared/schemas (data, never copied into this repo), or, for one not there, come as a file
from its upstream module (testbed/upstream.py). Unknown fields are errors: every
object schema that lists properties and neither allows additional properties nor preserves unknown fields
gets `additionalProperties: false`. CEL rules (x-kubernetes-validations) are not evaluated here; the rules
that matter to us are asserted by the tests themselves.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

REPO = Path(__file__).resolve().parent.parent
SCHEMAS_ENV = "TPU_FALLBACK_SCHEMAS"
DEFAULT_SCHEMAS = REPO.parent / "shared" / "schemas"
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def schemas_dir() -> Path:
    return Path(os.environ.get(SCHEMAS_ENV, str(DEFAULT_SCHEMAS)))


def _strict(node: Any) -> Any:
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {k: _strict(v) for k, v in node.items() if k != "x-kubernetes-validations"}
    if node.pop("nullable", False) and "type" in node:
        node["type"] = [node["type"], "null"]
    preserve = node.pop("x-kubernetes-preserve-unknown-fields", False)
    node.pop("x-kubernetes-int-or-string", None)  # the CRDs already spell it as anyOf integer/string
    pattern = node.get("pattern")
    if isinstance(pattern, str) and pattern.startswith("^(?i)"):
        node["pattern"] = "(?i)^" + pattern[len("^(?i)"):]  # Go allows inline flags anywhere, Python at the start
    if "properties" in node and "additionalProperties" not in node and not preserve:
        node["additionalProperties"] = False
    return node


@functools.cache
def crd_schema(api_version: str, kind: str, crd_file: Path | None = None) -> dict:
    """The strict JSON schema of a served version of a CRD: `crd_file`, or the one found under the schemas folder."""
    group, version = api_version.split("/")
    plural = kind.lower() + "s"
    matches = [crd_file] if crd_file else list(schemas_dir().glob(f"*/{group}_{plural}.yaml"))
    if not matches:
        raise LookupError(f"no CRD for {group}/{kind} under {schemas_dir()}")
    crd = yaml.load(matches[0].read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    assert crd["spec"]["names"]["kind"] == kind
    for served in crd["spec"]["versions"]:
        if served["name"] == version and served.get("served", False):
            return _strict(served["schema"]["openAPIV3Schema"])
    raise LookupError(f"{group}/{kind} serves no version {version}")


def validation_errors(manifest: dict, crd_file: Path | None = None) -> list[str]:
    """Every schema violation of `manifest`, as readable lines; empty when it is valid."""
    schema = crd_schema(manifest["apiVersion"], manifest["kind"], crd_file)
    validator = jsonschema.Draft202012Validator(schema)
    errors = [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
              for e in validator.iter_errors(manifest)]
    metadata = manifest.get("metadata", {})
    name = metadata.get("name", "")
    if not (_DNS_SUBDOMAIN.match(name) and len(name) <= 253):
        errors.append(f"metadata/name: {name!r} is not a DNS-1123 subdomain")
    unknown_meta = set(metadata) - {"name", "namespace", "labels", "annotations"}
    if unknown_meta:
        errors.append(f"metadata: unexpected fields {sorted(unknown_meta)}")
    return errors
