"""`python -m ops status`: flags as kubectl users expect them, and the --watch loop."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import TextIO

import yaml
from kubernetes import config

from ops.status.render import render_json, render_table
from ops.status.report import Report, build_report
from ops.status.snapshot import DEFAULT_REQUEST_TIMEOUT, ClusterError, ClusterReader

CLEAR_SCREEN = "\x1b[H\x1b[2J"
DEFAULT_NAMESPACE = "default"
# Exit codes, as kubectl's habits go: 1 for nothing shown (no cluster to read, no such job), 2 for a bad flag
# (argparse's own), and a code of our own for a view with holes, so a script can tell "no jobs" from "not allowed".
EXIT_OK = 0  # everything read
EXIT_ERROR = 1  # cannot reach or authenticate to the server, a bad kubeconfig, or a named job that does not exist
EXIT_USAGE = 2
EXIT_PARTIAL = 3  # shown, but some reads were refused (PROBLEMS, and JSON's `readable`, say which)


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("jobs", nargs="*", metavar="JOB",
                        help="only these jobs, by name (default: every one shown); one that does not exist exits 1")
    parser.add_argument("--kubeconfig", help="the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    parser.add_argument("--context", help="the kubeconfig context (default: its current context)")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", help="the jobs' namespace (default: the context's, else default)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="jobs in every namespace")
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table",
                        help="table (default) or json; with --watch, json prints one document per line")
    parser.add_argument("-w", "--watch", action="store_true", help="redraw every --interval seconds until Ctrl-C")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between redraws with --watch (2)")
    parser.add_argument("--request-timeout", type=float, default=DEFAULT_REQUEST_TIMEOUT, metavar="SECONDS",
                        help=f"seconds one API call may take before the server counts as not answering "
                             f"({DEFAULT_REQUEST_TIMEOUT:g})")
    return parser


def kubeconfig_paths(kubeconfig: str | None) -> list[str]:
    """The files kubectl would read: --kubeconfig, else each file of $KUBECONFIG, else ~/.kube/config."""
    if kubeconfig:
        return [kubeconfig]
    listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    return listed or [os.path.expanduser(config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION)]


def check_kubeconfig(kubeconfig: str | None) -> None:
    """A kubeconfig that is not YAML, or not a mapping, is one line naming the file (the client would raise a
    parser's or a TypeError's traceback). A missing file is left to the client, which names it."""
    for path in kubeconfig_paths(kubeconfig):
        try:
            with open(path, encoding="utf-8") as file:
                loaded = yaml.safe_load(file)
        except FileNotFoundError:
            continue
        except UnicodeDecodeError:
            raise config.ConfigException(f"kubeconfig {path} is not YAML (not UTF-8 text)") from None
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(error, "problem", None) or str(error).splitlines()[0]
            raise config.ConfigException(f"kubeconfig {path} is not YAML: {problem}{where}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise config.ConfigException(f"kubeconfig {path} is not a kubeconfig: a YAML mapping with clusters, "
                                         f"users and contexts was expected, not a {type(loaded).__name__}")


def context_namespace(kubeconfig: str | None, context: str | None) -> tuple[str, str]:
    """(the context's name, its namespace) as kubectl resolves them."""
    check_kubeconfig(kubeconfig)
    contexts, current = config.list_kube_config_contexts(config_file=kubeconfig)
    chosen = next((c for c in contexts if c["name"] == context), None) if context else current
    if chosen is None:
        raise config.ConfigException(f"context {context!r} not found in the kubeconfig")
    return chosen["name"], (chosen.get("context") or {}).get("namespace") or DEFAULT_NAMESPACE


def exit_code(report: Report) -> int:
    if report.missing:
        return EXIT_ERROR
    return EXIT_OK if report.complete else EXIT_PARTIAL


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None,
        sleep: Callable[[float], None] = time.sleep, reader: ClusterReader | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    for flag, value in (("--interval", args.interval), ("--request-timeout", args.request_timeout)):
        if value <= 0:
            err.write(f"error: {flag} must be positive\n")
            return EXIT_USAGE
    try:
        context, own_namespace = context_namespace(args.kubeconfig, args.context)
        reader = reader or ClusterReader(config.new_client_from_config(config_file=args.kubeconfig, context=context),
                                         args.request_timeout)
    except (config.ConfigException, OSError, ValueError) as error:
        err.write(f"error: {error}\n")
        return EXIT_ERROR
    namespace = None if args.all_namespaces else (args.namespace or own_namespace)
    try:
        while True:
            try:
                report = build_report(reader.read(namespace, context), args.jobs)
            except ClusterError as error:  # the whole cluster: one line, no traceback; keep watching
                if not args.watch:
                    err.write(f"error: {error}\n")
                    return EXIT_ERROR
                out.write(f"{CLEAR_SCREEN}error: {error}\n")
            else:
                out.write(render(report, args))
                for name in report.missing:  # kubectl's words for a name that does not exist
                    err.write(f'Error from server (NotFound): no job "{name}" in '
                              f'{"any namespace" if namespace is None else "namespace " + namespace}\n')
                if not args.watch:
                    out.flush()
                    return exit_code(report)
            out.flush()
            sleep(args.interval)
    except KeyboardInterrupt:
        return EXIT_OK


def render(report: Report, args: argparse.Namespace) -> str:
    if args.output == "json":
        return render_json(report, indent=None if args.watch else 2) + "\n"
    text = render_table(report)
    return f"{CLEAR_SCREEN}every {args.interval:g}s, Ctrl-C to stop\n\n{text}" if args.watch else text
