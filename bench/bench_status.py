"""`python -m ops status` with many jobs: the time of one call against the real tier (goal: 1,000 Workloads in the
namespace under 3 s on 2 cores).

    .venv/bin/python -m bench.bench_status [--jobs 1000] [--calls 5]

A tier with the status tests' ladder (reservation, on-demand, Spot, two DWS slices); `--jobs` RayJobs submitted to
the chain's first LocalQueue (Kueue admits the first few and queues the rest: one Workload each); then `--calls`
calls of the command as a user runs it (a new process: imports, kubeconfig, discovery, every list, the report, the
table) and of the same read in this process, to tell the start-up from the work. Prints each call, then p50 and max.
Binaries must be built (`python -m testbed build`).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


from ops.status.render import render_table
from ops.status.report import build_report
from ops.status.snapshot import ClusterReader
from testbed import jobs
from testbed.cluster import ControlPlane
from testbed.failover_tier import FailoverTier
from testbed.kube import poll_every, wait_for
from testbed.stack import release_values
from testbed.status_states import NAMESPACE, ladder_plan

REPO = Path(__file__).resolve().parent.parent


def submit_many(tier: FailoverTier, count: int) -> None:
    template = jobs.dev_rayjob("bench", "user-queue")

    def one(index: int) -> None:
        job = copy.deepcopy(template)
        job["metadata"]["name"] = f"bench-{index:04d}"
        tier.kube.create(job)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(count)))
    wait_for(lambda: len(tier.kube.list(jobs.WORKLOAD[0], "Workload", NAMESPACE)) >= count, 600,
             f"{count} Workloads", interval=2)


def summary(label: str, values: list[float]) -> str:
    return f"  {label}: p50 {statistics.median(values):.2f} s, max {max(values):.2f} s ({len(values)} calls)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args()
    poll_every(0.1)  # as the README's numbers were measured
    plan = ladder_plan()
    tier = FailoverTier(ControlPlane(release_values(plan)), plan).start()
    try:
        started = time.monotonic()
        submit_many(tier, args.jobs)
        print(f"{args.jobs} RayJobs and their Workloads in {time.monotonic() - started:.1f} s", flush=True)
        command, in_process = [], []
        for call in range(args.calls):
            began = time.monotonic()
            run = subprocess.run([sys.executable, "-m", "ops", "status", "--kubeconfig", str(tier.plane.kubeconfig)],
                                 cwd=REPO, capture_output=True, text=True)
            command.append(time.monotonic() - began)
            began = time.monotonic()
            report = build_report(ClusterReader(tier.kube.api_client).read(NAMESPACE))
            render_table(report)
            in_process.append(time.monotonic() - began)
            print(f"call {call + 1}: command {command[-1]:.2f} s (exit {run.returncode}, "
                  f"{len(run.stdout.splitlines())} lines), read+report+table in process {in_process[-1]:.2f} s, "
                  f"{len(report.jobs)} jobs", flush=True)
        load = os.getloadavg()[0]
        print(f"\n{args.jobs} Workloads in namespace {NAMESPACE}, 2-core goal 3 s (load {load:.1f}):")
        print(summary("python -m ops status (a new process)", command))
        print(summary("read + report + table (in process)", in_process))
    finally:
        tier.plane.stop()


if __name__ == "__main__":
    main()
