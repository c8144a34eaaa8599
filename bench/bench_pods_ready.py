"""What Kueue's PodsReady waits for with real KubeRay: each step from admission to PodsReady, on the tier.

    .venv/bin/python -m bench.bench_pods_ready [--runs 3] [--scale-up 0.5] [--submit-delay 0]

The dev stack's first job on its plan-A rung, with a free slice after `--scale-up` seconds. Steps, from the
Workload's admission: the RayCluster created; its head and workers Running and Ready; the RayCluster `ready`;
KubeRay's submitter Job created (K8sJobMode, the default the jobs use); its pod Running; the Ray head's first answer
for the job (`--submit-delay`: how long `ray job submit` takes to reach the head after the submitter starts); and
Kueue's PodsReady. On the tier no image is pulled and no container starts; on GKE each "Running" also waits for the
node to come up, the image pull (rayproject/ray, streamed) and Ray's start, and the submitter adds its own pod start.
Binaries must be built (`python -m testbed build`).
"""

from __future__ import annotations

import argparse
import statistics
import time


from testbed import jobs
from testbed.cluster import ControlPlane
from testbed.kube import condition
from testbed.plans import plan_for
from testbed.stack import deploy, release_values

NAMESPACE = "default"
STEPS = ("RayCluster created", "head and workers Running", "RayCluster ready", "submitter Job created",
         "submitter Running", "head answered", "PodsReady")


def observe(kube, head, job: str, timeout: float = 180) -> dict[str, float]:
    """Seconds from admission to each step, polled every 0.05 s."""
    seen: dict[str, float] = {}
    admitted = None
    deadline = time.monotonic() + timeout
    while len(seen) < len(STEPS) and time.monotonic() < deadline:
        now = time.monotonic()
        workload = jobs.workload_of(kube, NAMESPACE, job)
        if admitted is None:
            if condition(workload, "Admitted") == "True":
                admitted = now
            time.sleep(0.05)
            continue
        rayjob = kube.get(*jobs.RAYJOB, job, NAMESPACE) or {}
        cluster_name = (rayjob.get("status") or {}).get("rayClusterName")
        cluster = kube.get("ray.io/v1", "RayCluster", cluster_name, NAMESPACE) if cluster_name else None
        roles = jobs.pods_of(kube, NAMESPACE, job)
        checks = {
            "RayCluster created": cluster is not None,
            "head and workers Running": roles["head"] and len(roles["worker"]) > 0 and all(
                jobs.running(p) for p in roles["head"] + roles["worker"]),
            "RayCluster ready": ((cluster or {}).get("status") or {}).get("state") == "ready",
            "submitter Job created": kube.get("batch/v1", "Job", job, NAMESPACE) is not None,
            "submitter Running": any(jobs.running(p) for p in roles["submitter"]),
            "head answered": head.asked_for(NAMESPACE, (rayjob.get("status") or {}).get("jobId")),
            "PodsReady": condition(workload, "PodsReady") == "True",
        }
        for step, done in checks.items():
            if done and step not in seen:
                seen[step] = now - admitted
        time.sleep(0.05)
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scale-up", type=float, default=0.5, help="seconds a new slice takes to appear")
    parser.add_argument("--submit-delay", type=float, default=0.0, help="seconds `ray job submit` takes")
    args = parser.parse_args()
    plan = plan_for("dev", {"workloads": {"jobs": 0}})
    plane = ControlPlane(release_values(plan), nodes_of=plan).start()
    plane.after.gke.scale_up_seconds = args.scale_up
    plane.after.ray_head.submit_delay = args.submit_delay
    results: dict[str, list[float]] = {}
    try:
        deploy(plane.kube, plan)
        jobs.prepare_namespace(plane.kube, NAMESPACE)
        for run in range(args.runs):
            job = f"ready-{run}"
            plane.kube.create(jobs.dev_rayjob(job))
            seen = observe(plane.kube, plane.after.ray_head, job)
            for step in STEPS:
                results.setdefault(step, []).append(seen.get(step, float("nan")))
            print(f"run {run + 1}: " + ", ".join(f"{s} {seen.get(s, float('nan')):.2f}" for s in STEPS), flush=True)
            plane.kube.delete(*jobs.RAYJOB, job, NAMESPACE, propagation="Background")
            while plane.kube.list("v1", "Pod", namespace=NAMESPACE):
                time.sleep(0.2)
            plane.after.gke.remove_idle()
    finally:
        plane.stop()
    print(f"\nseconds from admission, median of {args.runs} (min-max); slice scale-up {args.scale_up} s, "
          f"submit delay {args.submit_delay} s:")
    for step in STEPS:
        values = results[step]
        print(f"  {step}: {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")


if __name__ == "__main__":
    main()
