"""Reclaim time: from the owner's RayJob submitted to the borrower's eviction, and to the owner's admission, on the
real tier with the teams of tests/test_teams_controlplane.py.

    .venv/bin/python -m bench.bench_reclaim [--runs 5]

Each run: team C (no share) takes the unowned on-demand slice, team B its share and team A's idle one; then A
submits. Kueue evicts one borrower (InCohortReclamation) and suspends its RayJob; the bench plays KubeRay at once
(status Suspended, which frees the quota) and times A's admission on on-demand. Playing KubeRay costs a few API
calls; on GKE, KubeRay deletes the RayCluster first (seconds to minutes), which adds to the second number.
Binaries must be built (`python -m testbed build`).
"""

from __future__ import annotations

import argparse
import statistics
import time


from testbed import jobs
from testbed.kube import poll_every, wait_for
from tests.test_teams_controlplane import (TEAM_A, TEAM_B, TEAM_C, TEAMS, evictions, flavor,
                                           start_teams_tier, submit)


def clear(tier) -> None:
    for team in TEAMS:
        for job in tier.kube.list(*jobs.RAYJOB, namespace=team["namespace"]):
            tier.kube.delete(*jobs.RAYJOB, job["metadata"]["name"], team["namespace"], propagation="Background")
    wait_for(lambda: not any(tier.kube.list(*jobs.WORKLOAD, namespace=t["namespace"]) for t in TEAMS), 60,
             "no Workload left")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    poll_every(0.1)  # as the README's numbers were measured
    tier = start_teams_tier()
    to_eviction, to_admission = [], []
    try:
        for run in range(args.runs):
            submit(tier, TEAM_C, f"c-{run}")
            submit(tier, TEAM_B, f"b-{run}-1")
            submit(tier, TEAM_B, f"b-{run}-2")
            created = time.monotonic()
            job = jobs.dev_rayjob(f"a-{run}")
            job["metadata"]["namespace"] = TEAM_A["namespace"]
            tier.kube.create(job)
            (victim,) = wait_for(lambda: evictions(tier), 60, "a reclaim", interval=0.02)
            to_eviction.append(time.monotonic() - created)
            owner = TEAM_C if victim.startswith("c-") else TEAM_B
            wait_for(lambda: jobs.suspended(tier.kube.get(*jobs.RAYJOB, victim, owner["namespace"])), 60,
                     "the victim suspended", interval=0.02)
            tier.kube.patch(*jobs.RAYJOB, victim, {"status": {"jobDeploymentStatus": "Suspended"}},
                            namespace=owner["namespace"], subresource="status")
            wait_for(lambda: flavor(tier, TEAM_A, f"a-{run}") == "on-demand", 60, "A admitted", interval=0.02)
            to_admission.append(time.monotonic() - created)
            print(f"run {run + 1}: eviction {to_eviction[-1]:.2f} s, admission {to_admission[-1]:.2f} s "
                  f"(victim {victim})", flush=True)
            clear(tier)
    finally:
        tier.plane.stop()
    print(f"\nreclaim time, owner's RayJob created -> ..., median of {args.runs} runs:")
    for label, values in (("borrower evicted (Preempted, InCohortReclamation)", to_eviction),
                          ("owner admitted on on-demand (KubeRay played at once)", to_admission)):
        print(f"  {label}: {statistics.median(values):.2f} s (min {min(values):.2f}, max {max(values):.2f})")


if __name__ == "__main__":
    main()
