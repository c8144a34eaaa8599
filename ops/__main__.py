"""`python -m ops <tool>`: the operating tools (see ops/__init__.py)."""

from __future__ import annotations

import argparse
import sys

from ops.status import cli as status_cli


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops", description="Operating tools for a tpu-fallback cluster.")
    tools = parser.add_subparsers(dest="tool", required=True)
    status_cli.add_arguments(tools.add_parser(
        "status", help="where every job is on the capacity ladder, and why",
        description="Per rung: flavor, ClusterQueue, quota, jobs. Per job: rung, state in words, since when, "
                    "moves, ProvisioningRequest. The failover controller's health. Reads only."))
    args = parser.parse_args(argv)
    return status_cli.run(args)


if __name__ == "__main__":
    sys.exit(main())
