"""A running job that loses its slice, on the real tier (Kueue, KubeRay, kube-scheduler, KWOK nodes shaped like the
plan's pools) with the failover controller: how long until it runs again.

    .venv/bin/python -m bench.bench_lost_slice [--runs 3] [--wait 30]

Per run, per fault (testbed/gke.py `lose_slice` plays GKE: the whole multi-host slice goes, its pods
terminated with the VM's grace period):
- Spot preemption, capacity back: GKE's signal -> the loss recorded by the controller; -> the job Running again on
  Spot (KubeRay's new pods on the recreated slice, which the stand-in adds 0.5 s after the scheduler found no node);
- a failed on-demand host, no capacity back: the signal -> the job moved (at the rung's wait, `--wait`) -> Running
  on Spot, the next rung.
On GKE add what the tier does not have: a new slice takes minutes (a node boots in 80-120 s, then the Ray image's
pull), and Spot capacity that was just reclaimed seldom comes back at once.
Binaries must be built (`python -m testbed build`).
"""

from __future__ import annotations

import argparse
import time


from bench.report import print_medians, run_line
from failover import api
from testbed import jobs
from testbed.failover_tier import NAMESPACE, start_failover_tier
from testbed.kube import poll_every, wait_for

WAIT = 240
SPOT_GRACE_SECONDS = 15
UNREACHABLE = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}


def _running(tier, job: str, flavor: str) -> float:
    wait_for(lambda: tier.running_on(job, flavor), WAIT, f"{job} running on {flavor}", interval=0.05)
    return time.monotonic()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--wait", type=int, default=30, help="fallback.sliceRecoveryWait on on-demand, seconds")
    args = parser.parse_args()
    poll_every(0.1)  # as the README's numbers were measured
    overrides = {"spot": {"maxSlices": 1},
                 "fallback": {"sliceRecoveryWait": {"onDemand": f"{args.wait}s", "spot": "10m"}}}
    tier = start_failover_tier(overrides=overrides)
    results: dict[str, list[float]] = {}
    try:
        tier.start_controller()
        for run in range(args.runs):
            job = f"spot-{run}"
            tier.submit(job, queue="user-queue-spot")
            _running(tier, job, "spot")
            jobs.wait_pods_ready(tier.kube, NAMESPACE, job, WAIT)
            signal, _ = tier.lose_slice_of(job, grace_seconds=SPOT_GRACE_SECONDS)
            wait_for(lambda: tier.lost_of(job), WAIT, "the loss recorded", interval=0.02)
            results.setdefault("Spot preemption: signal -> loss recorded", []).append(time.monotonic() - signal)
            back = _running(tier, job, "spot") - signal
            results.setdefault("Spot preemption, capacity back: signal -> Running on Spot", []).append(back)
            tier.delete_all_jobs()

            job = f"host-{run}"
            tier.submit(job)
            _running(tier, job, "on-demand")
            jobs.wait_pods_ready(tier.kube, NAMESPACE, job, WAIT)
            tier.stockout("on-demand")
            signal, _ = tier.lose_slice_of(job, grace_seconds=0, going_taint=UNREACHABLE)
            wait_for(lambda: tier.lost_of(job), WAIT, "the loss recorded", interval=0.02)
            results.setdefault("failed host: signal -> loss recorded", []).append(time.monotonic() - signal)
            wait_for(lambda: (m := tier.move_of(job)) and m.reason == api.SLICE_LOST, WAIT + args.wait,
                     "the move", interval=0.05)
            results.setdefault(f"failed host, no capacity: signal -> move started (wait {args.wait} s)", []).append(
                time.monotonic() - signal)
            results.setdefault("failed host, no capacity: signal -> Running on Spot", []).append(
                _running(tier, job, "spot") - signal)
            tier.delete_all_jobs()
            print(run_line(run, results), flush=True)
    finally:
        tier.plane.stop()
    print_medians(f"median of {args.runs} runs (min-max); on-demand's sliceRecoveryWait {args.wait} s, a new slice "
                  f"0.5 s after the scheduler found no node:", results)


if __name__ == "__main__":
    main()
