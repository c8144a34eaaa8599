"""What a lost slice costs the training: steps lost with and without GKE's termination notice, and the time from the
loss to the first new step, with real Ray Train and JAX on the CPU (2 workers, as two TPU hosts).

    .venv/bin/python -m bench.bench_notice [--runs 3] [--steps 30] [--checkpoint-every 10]

One fit per run with two faults, as tests/test_train.py: the notice (the file the workers' preStop hook creates on
GKE) after step 5, then a worker killed without notice after step 15. Ray Train restarts the worker group after
each; the new group resumes from the newest orbax step. Per fault: steps lost (the step reached minus the step the
next group starts at) and seconds from the fault (its marker's time) to the next group's first step done (Ray
Train's restart, the processes' start, JAX's distributed init, the restore and the first step's compile).
On a TPU slice the restart is that of the whole RayCluster's worker group, on new hosts: add the slice's return.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path


from bench.report import print_medians, run_line
from workloads import train

NOTICE_AT, FAIL_AT = 5, 15


def one_run(root: Path, steps: int, every: int) -> dict[str, float]:
    result = train.main(["--storage-path", str(root / "ray"), "--run-name", "bench", "--checkpoint-dir",
                         str(root / "orbax"), "--steps", str(steps), "--checkpoint-every", str(every),
                         "--report-every", "10", "--num-workers", "2", "--fail-at-step", str(FAIL_AT),
                         "--preempt-at-step", str(NOTICE_AT), "--notice-file", str(root / "notice")])
    # The Ray markers, not the metrics: a report is dropped when a worker dies before Ray Train collects it.
    markers = [json.loads(p.read_text()) for p in (root / "ray").rglob("meta.json")]
    assert result.metrics["step"] == steps
    found = {}
    for label, at, marker in (("with notice", NOTICE_AT, f"injected-notice-at-step-{NOTICE_AT}"),
                              ("without notice", FAIL_AT, f"injected-failure-at-step-{FAIL_AT}")):
        fault_time = float((root / "orbax" / marker).read_text())
        after = min((m for m in markers if m["step"] > at), key=lambda m: m["step"])  # the next group's first
        found[f"{label}: steps lost"] = at - after["start_step"]
        found[f"{label}: fault -> first new step, s"] = after["first_step_at"] - fault_time
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    args = parser.parse_args()
    import ray
    os.environ.setdefault("RAY_worker_niceness", "0")  # as a submitted job's workers (tests/test_train.py)
    ray.init(num_cpus=2, include_dashboard=False)
    results: dict[str, list[float]] = {}
    try:
        for run in range(args.runs):
            with tempfile.TemporaryDirectory() as directory:
                for label, value in one_run(Path(directory), args.steps, args.checkpoint_every).items():
                    results.setdefault(label, []).append(value)
            print(run_line(run, results, unit=""), flush=True)
    finally:
        ray.shutdown()
    print_medians(f"median of {args.runs} runs (min-max); checkpoint every {args.checkpoint_every} steps, notice "
                  f"after step {NOTICE_AT}, a worker killed after step {FAIL_AT}:", results, unit="")


if __name__ == "__main__":
    main()
