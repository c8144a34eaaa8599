"""Benchmark: how long the mock evaluation of the program takes, and how it grows with slices per plan.

    .venv/bin/python -m bench.bench_mock_eval [--repeat 5]

Runs the real __main__.py under the recording engine (what the tests and the offline plan do) for the dev
stack, then with 1, 2, 4, 8 and 16 multi-host 4x4 slices in each plan (one node pool per slice), and
prints a table: resources declared, median and best wall time per evaluation.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


from infra.offline import PLACEHOLDER_PROJECT, OfflineEngine, stack_config


def evaluate(config: dict[str, str], repeat: int) -> tuple[int, list[float]]:
    times, count = [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        plan = OfflineEngine().run(config)
        times.append(time.perf_counter() - start)
        count = len(plan.resources)
    return count, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    base = stack_config("dev")
    base.setdefault("gcp:project", PLACEHOLDER_PROJECT)
    evaluate(base, 1)  # warm-up: imports of pulumi_gcp / pulumi_kubernetes modules
    print(f"{'case':<22}{'resources':>10}{'median ms':>12}{'best ms':>10}{'ms/resource':>13}")
    cases = [("dev stack", base)]
    for slices in (1, 2, 4, 8, 16):
        config = dict(base)
        config["tpu-fallback:onDemand"] = json.dumps({"maxSlices": slices})
        config["tpu-fallback:flexStart"] = json.dumps({"maxSlices": slices})
        cases.append((f"{slices} slice(s)/plan", config))
    for label, config in cases:
        count, times = evaluate(config, args.repeat)
        median = statistics.median(times) * 1000
        print(f"{label:<22}{count:>10}{median:>12.1f}{min(times) * 1000:>10.1f}{median / count:>13.2f}")


if __name__ == "__main__":
    main()
