"""`python -m ops status`: flags as kubectl users expect them, and the --watch loop."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import TextIO

from kubernetes import config

from ops.status.render import render_json, render_table
from ops.status.report import Report, build_report
from ops.status.snapshot import ClusterReader

CLEAR_SCREEN = "\x1b[H\x1b[2J"
DEFAULT_NAMESPACE = "default"


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("jobs", nargs="*", metavar="JOB", help="only these RayJobs (default: every one shown)")
    parser.add_argument("--kubeconfig", help="the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    parser.add_argument("--context", help="the kubeconfig context (default: its current context)")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", help="the jobs' namespace (default: the context's, else default)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="jobs in every namespace")
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table",
                        help="table (default) or json; with --watch, json prints one document per line")
    parser.add_argument("-w", "--watch", action="store_true", help="redraw every --interval seconds until Ctrl-C")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between redraws with --watch (2)")
    return parser


def context_namespace(kubeconfig: str | None, context: str | None) -> tuple[str, str]:
    """(the context's name, its namespace) as kubectl resolves them."""
    contexts, current = config.list_kube_config_contexts(config_file=kubeconfig)
    chosen = next((c for c in contexts if c["name"] == context), None) if context else current
    if chosen is None:
        raise config.ConfigException(f"context {context!r} not found in the kubeconfig")
    return chosen["name"], (chosen.get("context") or {}).get("namespace") or DEFAULT_NAMESPACE


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None,
        sleep: Callable[[float], None] = time.sleep, reader: ClusterReader | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    if args.interval <= 0:
        err.write("error: --interval must be positive\n")
        return 2
    try:
        context, own_namespace = context_namespace(args.kubeconfig, args.context)
        reader = reader or ClusterReader(config.new_client_from_config(config_file=args.kubeconfig, context=context))
    except (config.ConfigException, OSError) as error:
        err.write(f"error: {error}\n")
        return 1
    namespace = None if args.all_namespaces else (args.namespace or own_namespace)
    try:
        while True:
            try:
                report = build_report(reader.read(namespace, context), args.jobs)
            except Exception as error:  # noqa: BLE001 - an unreachable API server: say so, keep watching
                if not args.watch:
                    err.write(f"error: cannot read the cluster: {error}\n")
                    return 1
                out.write(f"{CLEAR_SCREEN}error: cannot read the cluster: {error}\n")
            else:
                out.write(render(report, args))
            out.flush()
            if not args.watch:
                return 0
            sleep(args.interval)
    except KeyboardInterrupt:
        return 0


def render(report: Report, args: argparse.Namespace) -> str:
    if args.output == "json":
        return render_json(report, indent=None if args.watch else 2) + "\n"
    text = render_table(report)
    return f"{CLEAR_SCREEN}every {args.interval:g}s, Ctrl-C to stop\n\n{text}" if args.watch else text
