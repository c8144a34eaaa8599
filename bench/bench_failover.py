"""Time to plan B: from a RayJob's submission to its DWS ProvisioningRequest, on the real tier.

    .venv/bin/python bench/bench_failover.py [--runs 3] [--timeout 30] [--grace 4]

Timeout path: no kubelet, so job 1's pods never become ready on on-demand; Kueue evicts it after
`fallback.podsReadyTimeout` and the failover controller moves it to the dws queue (goal: timeout + 10 s).
Early path: the test plays GKE's autoscaler reporting "GCE out of resources" on the job's TPU pod right after
admission; the controller moves it once `fallback.stockoutGracePeriod` has passed (goal: grace + 10 s).
The controller polls every second here (the Deployment: every 5 s, which adds up to 5 s in production).
Binaries must be built (`python -m tests.controlplane build`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.controlplane import jobs  # noqa: E402
from tests.controlplane.failover_tier import NAMESPACE, RESYNC_SECONDS, start_failover_tier  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=30, help="fallback.podsReadyTimeout, seconds")
    parser.add_argument("--grace", type=int, default=4, help="fallback.stockoutGracePeriod, seconds")
    args = parser.parse_args()
    tier = start_failover_tier(pods_ready_timeout=args.timeout, grace=args.grace)
    timeout_path, early_path = [], []
    try:
        tier.start_controller()
        for run in range(args.runs):
            created = tier.submit(f"timeout-{run}")
            jobs.wait_provisioning_request(tier.kube, NAMESPACE, f"timeout-{run}", timeout=args.timeout + 60)
            timeout_path.append(time.monotonic() - created)
            tier.delete_all_jobs()

            created = tier.submit(f"early-{run}")
            tier.play_kuberay_and_a_stockout(f"early-{run}")
            jobs.wait_provisioning_request(tier.kube, NAMESPACE, f"early-{run}", timeout=args.timeout + 60)
            early_path.append(time.monotonic() - created)
            tier.delete_all_jobs()
            print(f"run {run + 1}: timeout path {timeout_path[-1]:.1f} s, early path {early_path[-1]:.1f} s",
                  flush=True)
    finally:
        tier.plane.stop()
    print(f"\ntime to plan B (RayJob created -> dws ProvisioningRequest), median of {args.runs} runs; "
          f"podsReadyTimeout {args.timeout} s, stockoutGracePeriod {args.grace} s, controller pass every "
          f"{RESYNC_SECONDS} s, Kueue requeue backoff 60 s base (skipped by the move):")
    for label, values, goal in (("timeout path", timeout_path, args.timeout + 10),
                                ("early path", early_path, args.grace + 10)):
        print(f"  {label}: {statistics.median(values):.1f} s (min {min(values):.1f}, max {max(values):.1f}; "
              f"goal <= {goal} s)")


if __name__ == "__main__":
    main()
