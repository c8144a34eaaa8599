"""Time to a running slice, on the real tier with real KubeRay, kube-scheduler and GKE-shaped nodes.

    .venv/bin/python -m bench.bench_failover [--runs 3] [--timeout 30] [--grace 4] [--scale-up 0.5]

Per run, on the dev stack's platform with its failover controller:
- first rung: a RayJob submitted with on-demand capacity free: created -> all its pods Running and Ready on the
  on-demand slice (the autoscaler stand-in adds the 4-host slice `--scale-up` seconds after the scheduler found no
  node), and -> Kueue's PodsReady (after the Ray head stand-in answered for the submitted job);
- timeout path: on-demand out of capacity and nothing says so: created -> the dws ProvisioningRequest (Kueue evicts
  after `fallback.podsReadyTimeout`, the controller moves it);
- early path: on-demand out of capacity, GKE's autoscaler says "GCE out of resources" on each worker pod: created ->
  the dws ProvisioningRequest (the controller moves it once `fallback.stockoutGracePeriod` passed since the report);
- eviction -> next rung: for both paths, Kueue's eviction from on-demand -> all the next run's pods Running on the
  DWS slice, DWS provisioning played at once (on GKE it takes what DWS takes: minutes to days).
The controller reacts to watch events and the times it asks to look again; its resync is an hour away
(testbed/failover_tier.py RESYNC_SECONDS; the Deployment's: 300 s). Figures taken before 2026-12-07 had a pass every
second.
Binaries must be built (`python -m testbed build`).
"""

from __future__ import annotations

import argparse
import time


from bench.report import print_medians, run_line
from testbed import jobs
from testbed.failover_tier import NAMESPACE, RESYNC_SECONDS, start_failover_tier
from failover.api import parse_time
from testbed.kube import condition, poll_every, wait_for

WAIT = 180


def _running(tier, job: str) -> float:
    wait_for(lambda: jobs.pools_of(tier.kube, NAMESPACE, job), WAIT, f"{job}: every pod Running")
    return time.monotonic()


def _evicted_at(tier, job: str) -> float:
    """When Kueue evicted the job from on-demand (its Evicted condition, whole seconds), on the monotonic clock."""
    workload = wait_for(lambda: condition(w := jobs.workload_of(tier.kube, NAMESPACE, job), "Evicted") and w,
                        WAIT, f"{job}: evicted")
    moment = parse_time(next(c for c in workload["status"]["conditions"] if c["type"] == "Evicted")
                        ["lastTransitionTime"])
    return time.monotonic() - (time.time() - moment.timestamp())


def _to_the_next_rung(tier, job: str) -> tuple[float, float]:
    """(created -> dws request, eviction -> the dws run's pods Running); DWS provisions as soon as asked."""
    created = tier.submit(job)
    request = jobs.wait_provisioning_request(tier.kube, NAMESPACE, job, timeout=WAIT)
    asked = time.monotonic() - created
    evicted = _evicted_at(tier, job)  # read before the next admission turns the condition off
    jobs.mark_provisioned(tier.kube, request, f"bench-{job}")
    return asked, _running(tier, job) - evicted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=30, help="fallback.podsReadyTimeout, seconds")
    parser.add_argument("--grace", type=int, default=4, help="fallback.stockoutGracePeriod, seconds")
    parser.add_argument("--scale-up", type=float, default=0.5, help="seconds a new slice takes to appear")
    args = parser.parse_args()
    poll_every(0.1)  # as the README's numbers were measured
    tier = start_failover_tier(pods_ready_timeout=args.timeout, grace=args.grace)
    tier.gke.scale_up_seconds = args.scale_up
    results: dict[str, list[float]] = {}
    try:
        tier.start_controller()
        for run in range(args.runs):
            job = f"first-{run}"
            created = tier.submit(job)
            results.setdefault("first rung: created -> pods Running", []).append(_running(tier, job) - created)
            jobs.wait_pods_ready(tier.kube, NAMESPACE, job, WAIT)
            results.setdefault("first rung: created -> PodsReady", []).append(time.monotonic() - created)
            tier.delete_all_jobs()

            tier.stockout("on-demand", reported=False)
            asked, moved = _to_the_next_rung(tier, f"timeout-{run}")
            results.setdefault("timeout path: created -> dws request", []).append(asked)
            results.setdefault("timeout path: eviction -> pods Running on dws", []).append(moved)
            tier.delete_all_jobs()

            tier.stockout("on-demand")
            asked, moved = _to_the_next_rung(tier, f"early-{run}")
            results.setdefault("early path: created -> dws request", []).append(asked)
            results.setdefault("early path: eviction -> pods Running on dws", []).append(moved)
            tier.delete_all_jobs()
            print(run_line(run, results), flush=True)
    finally:
        tier.plane.stop()
    print_medians(f"median of {args.runs} runs (min-max); podsReadyTimeout {args.timeout} s, stockoutGracePeriod "
                  f"{args.grace} s, slice scale-up {args.scale_up} s, controller resync every {RESYNC_SECONDS} s:",
                  results)


if __name__ == "__main__":
    main()
