"""The real control plane: start time, and how fast Kueue decides on the dev stack's RayJobs.

    .venv/bin/python -m bench.bench_controlplane [--runs 5]

Per run: a fresh tier (etcd, kube-apiserver, kube-controller-manager, Kueue), the dev stack's objects applied in
dependency order, then job 1 (to Workload Admitted on on-demand) and job 2 (to its DWS ProvisioningRequest),
each timed from its RayJob's creation. Prints each run and the medians. Binaries must be built
(`python -m testbed build`).
"""

from __future__ import annotations

import argparse
import statistics
import time


from infra.offline import PLACEHOLDER_PROJECT, run_program, stack_config
from testbed import jobs
from testbed.cluster import ControlPlane
from testbed.kube import poll_every, wait_for
from testbed.stack import creation_order, deploy, release_values


def one_run(plan) -> dict[str, float]:
    started = time.monotonic()
    plane = ControlPlane(release_values(plan)).start()
    try:
        result = {"start": time.monotonic() - started}
        kube = plane.kube
        rayjobs = [s for s in creation_order(plan) if s.manifest and s.manifest["kind"] == "RayJob"]
        first, second = (s.manifest["metadata"]["name"] for s in rayjobs[:2])
        created: dict[str, float] = {}

        def timed(step) -> None:
            if step.manifest and step.manifest["kind"] == "RayJob":
                created[step.manifest["metadata"]["name"]] = time.monotonic()
                if step.manifest["metadata"]["name"] == first:
                    wait_for(lambda: jobs.decision(kube, "default", first).admitted, 30, "job 1 admitted")
                    result["admitted_on_demand"] = time.monotonic() - created[first]
                else:
                    jobs.wait_provisioning_request(kube, "default", second, timeout=30)
                    result["provisioning_request"] = time.monotonic() - created[second]

        deploy(kube, plan, after_create=timed)
        return result
    finally:
        plane.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    poll_every(0.1)  # as the README's numbers were measured
    plan = run_program({"gcp:project": PLACEHOLDER_PROJECT, **stack_config("dev")}, "dev")
    runs = []
    for index in range(args.runs):
        runs.append(one_run(plan))
        print(f"run {index + 1}: " + ", ".join(f"{k} {v:.3f} s" for k, v in runs[-1].items()), flush=True)
    print(f"\nmedian of {args.runs} runs (dev stack, Kueue 0.19.2, kube-apiserver 1.36.3):")
    for key, label in (("start", "control plane start (all processes ready, CRDs established)"),
                       ("admitted_on_demand", "RayJob created -> Workload Admitted on on-demand"),
                       ("provisioning_request", "RayJob created -> dws ProvisioningRequest created")):
        values = [run[key] for run in runs]
        print(f"  {label}: {statistics.median(values):.3f} s (min {min(values):.3f}, max {max(values):.3f})")


if __name__ == "__main__":
    main()
