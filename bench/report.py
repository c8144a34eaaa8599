"""How the benchmarks print what they measured: a line per run, then each measure's median and range."""

from __future__ import annotations

import statistics


def run_line(run: int, results: dict[str, list[float]], unit: str = " s") -> str:
    """`run 3: label 1.2 s, ...`: the last value of each measure, printed as each run ends."""
    return f"run {run + 1}: " + ", ".join(f"{label.split(':')[0]} {values[-1]:.1f}{unit}"
                                          for label, values in results.items())


def print_medians(heading: str, results: dict[str, list[float]], unit: str = " s") -> None:
    """The heading, then `label: median (min-max)` per measure."""
    print(f"\n{heading}")
    for label, values in results.items():
        print(f"  {label}: {statistics.median(values):.2f}{unit} ({min(values):.2f}-{max(values):.2f})")
