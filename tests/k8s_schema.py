"""Strict validation of Kubernetes custom resources against upstream CRD schemas, like `kubectl --validate=strict`.

The CRDs come from their pinned upstream modules at the versions the tier installs (testbed/upstream.py: the Go
module cache, copied once into the tier's cache; never into this repo). Unknown fields are errors: every
object schema that lists properties and neither allows additional properties nor preserves unknown fields
gets `additionalProperties: false`. CEL rules (x-kubernetes-validations) are not evaluated here; the rules
that matter to us are asserted by the tests themselves.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from testbed import upstream

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


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
    """The strict JSON schema of a served version of a CRD: `crd_file`, or its group's in the pinned upstream module
    (upstream.Unavailable where neither cached nor obtainable)."""
    group, version = api_version.split("/")
    if crd_file is None:
        if group not in upstream.CRD_FOLDERS:
            raise LookupError(f"no upstream module holds the CRDs of {group} (testbed/upstream.py CRD_FOLDERS)")
        crd_file = upstream.path(upstream.crd(group, kind.lower() + "s"))
    crd = yaml.load(crd_file.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
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
