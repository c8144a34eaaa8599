"""What a lost slice costs the training: steps lost with and without GKE's termination notice, and the time from the
loss to the first new step, with real Ray Train and JAX on the CPU (2 workers, as two TPU hosts).

    .venv/bin/python -m bench.bench_notice [--runs 3] [--steps 30] [--checkpoint-every 10]

One fit per run with two faults, as tests/test_train_ray.py: the notice (the file the workers' preStop hook creates on
GKE) after step 5, then a worker killed without notice after step 15. Ray Train restarts the worker group after
each; the new group resumes from the newest orbax step. Per fault: steps lost (the step reached minus the step the
next group starts at) and seconds from the fault (its marker's time) to the next group's first step done (Ray
Train's restart, the processes' start, JAX's distributed init, the restore and the first step's compile).
A second fit per run plays a host maintenance asked ahead: the failover controller's checkpoint request, in the
pods' annotations file (the downwardAPI volume), after step 13, the lead time before the window; training goes on;
at the window, after step 17, GKE terminates the pods (the preStop hook's notice, then the kill). Steps lost: the
last step finished before the kill minus the step the next group starts at.
Each fit's runtime goodput, the job's as train.py derives it when read (ml-goodput-measurement over every run's records,
`--goodput-logger file`; each fit is one run of its own job): productive step time over the job's time, and the badput
by cause in seconds (runtime goodput's part of bench_goodput.py's story: what the faults cost the training once it
runs).
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
REQUEST_AT, WINDOW_AT = 13, 17  # the maintenance: its checkpoint request, then its window (both off the interval)


def one_run(root: Path, steps: int, every: int) -> dict[str, float]:
    argv = ["--storage-path", str(root / "ray"), "--run-name", "bench", "--checkpoint-dir", str(root / "orbax"),
            "--steps", str(steps), "--checkpoint-every", str(every), "--report-every", "10", "--num-workers", "2",
            "--fail-at-step", str(FAIL_AT), "--preempt-at-step", str(NOTICE_AT), "--notice-file", str(root / "notice"),
            "--goodput-logger", "file"]
    result = train.main(argv)
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
    found.update(runtime_goodput(argv, "two faults"))
    found.update(maintenance_run(root / "maintenance", steps, every))
    return found


def runtime_goodput(argv: list, label: str) -> dict[str, float]:
    """The job's runtime goodput, derived from every run's records as `train.py <argv> --goodput-report` prints it: the
    share of the job's time on productive steps, then each badput cause in seconds."""
    result = train.job_goodput(train.resolve_config(train.build_parser().parse_args(argv)))
    found = {f"{label}: runtime goodput, %": 100 * result["goodput"],
             f"{label}: job time, s": result["seconds"]["job"]}
    for cause, seconds in sorted(result["seconds"]["badput"].items()):
        if isinstance(seconds, (int, float)):
            found[f"{label}: badput {cause}, s"] = seconds
    return found


def maintenance_run(root: Path, steps: int, every: int) -> dict[str, float]:
    """The maintenance asked ahead: request after REQUEST_AT, the window's notice and kill after WINDOW_AT."""
    argv = ["--storage-path", str(root / "ray"), "--run-name", "bench", "--checkpoint-dir", str(root / "orbax"),
            "--steps", str(steps), "--checkpoint-every", str(every), "--report-every", "10", "--num-workers", "2",
            "--request-at-step", str(REQUEST_AT), "--pod-annotations-file", str(root / "podinfo" / "annotations"),
            "--preempt-at-step", str(WINDOW_AT), "--notice-file", str(root / "notice"), "--goodput-logger", "file"]
    result = train.main(argv)
    markers = [json.loads(p.read_text()) for p in (root / "ray").rglob("meta.json")]
    assert result.metrics["step"] == steps
    # The first group saved for the request and trained on: the last step it finished is the window's.
    first = [m["step"] for m in markers if m["start_step"] == 0]
    assert REQUEST_AT in first and max(first) == WINDOW_AT, first
    window = float((root / "orbax" / f"injected-notice-at-step-{WINDOW_AT}").read_text())
    after = min((m for m in markers if m["step"] > WINDOW_AT), key=lambda m: m["step"])
    return {"maintenance: steps lost": WINDOW_AT - after["start_step"],
            "maintenance: window -> first new step, s": after["first_step_at"] - window,
            **runtime_goodput(argv, "maintenance")}


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
                  f"after step {NOTICE_AT}, a worker killed after step {FAIL_AT}; a maintenance: request after step "
                  f"{REQUEST_AT}, window after step {WINDOW_AT}:", results, unit="")


if __name__ == "__main__":
    main()
