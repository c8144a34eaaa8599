"""bench/bench_goodput.py: the distribution over random stories, on the bad side (no server)."""

from __future__ import annotations

from bench import bench_goodput as bench

TWENTY = [float(v) for v in range(1, 21)]


def test_the_p95_of_a_gap_is_the_value_95_percent_of_the_stories_stay_within():
    assert bench.nearest_rank(TWENTY, 0.95, higher_is_worse=True) == 19.0


def test_the_p95_of_a_goodput_is_the_value_95_percent_of_the_stories_reach():
    assert bench.nearest_rank(TWENTY, 0.95, higher_is_worse=False) == 2.0


def test_the_spread_of_a_goodput_ends_at_its_worst_story():
    assert bench.spread([0.5, 0.2, 0.9], higher_is_worse=False) == (0.5, 0.2, 0.2)


def test_a_single_story_is_its_own_p50_p95_and_worst():
    assert bench.spread([3.0], higher_is_worse=True) == (3.0, 3.0, 3.0)


def test_the_gap_is_in_points_below_the_optimum():
    outcome = bench.Outcome(story=0, goodput=0.25, optimum=0.5, idle_waiting=0.0, wall=60.0, vs_tutorial=None)
    assert outcome.gap == 25.0
