"""ops/ runs on a user's machine against a live cluster: it reads the names it looks for from failover.api and never
imports the Pulumi program (infra/), whose modules import pulumi, pulumi_kubernetes and pulumi_gcp (issue 45 item 5)."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import ops

ROOT = Path(__file__).resolve().parent.parent

# In a fresh interpreter (this one has pulumi loaded by other tests): import every module of ops/, then list what
# was loaded of pulumi and of the program.
IMPORT_EVERY_OPS_MODULE = """
import importlib, json, pkgutil, sys
import ops
names = [m.name for m in pkgutil.walk_packages(ops.__path__, "ops.")]
for name in names:
    importlib.import_module(name)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("pulumi", "pulumi_kubernetes", "pulumi_gcp", "infra"))
print(json.dumps({"imported": names, "loaded": loaded}))
"""


def test_no_ops_module_imports_pulumi_or_the_program():
    done = subprocess.run([sys.executable, "-c", IMPORT_EVERY_OPS_MODULE], cwd=ROOT, capture_output=True, text=True,
                          check=True)
    result = json.loads(done.stdout)
    assert sorted(result["imported"]) == sorted(m.name for m in pkgutil.walk_packages(ops.__path__, "ops."))
    assert "ops.status.snapshot" in result["imported"]
    assert result["loaded"] == []
