"""testbed/story_generator.py: random capacity stories, seeded, reproducible and bounded (no server)."""

from __future__ import annotations

import functools
from pathlib import Path

import yaml

from testbed import story as stories
from testbed import story_generator as generator

SHIPPED_STORY = Path(__file__).resolve().parent.parent / "bench" / "stories" / "scarce-week.yaml"
SEEDS = range(300)  # enough stories that every branch of the generator is taken many times


@functools.cache
def every_story() -> tuple[stories.Story, ...]:
    return tuple(generator.story(seed, index) for seed in SEEDS for index in range(2))


def test_the_same_seed_and_index_give_the_same_story():
    assert generator.generate(7, 3) == generator.generate(7, 3)


def test_different_seeds_give_different_stories():
    assert len({yaml.safe_dump(generator.generate(seed)) for seed in SEEDS}) == len(SEEDS)


def test_the_stories_of_one_seed_differ_by_index():
    assert len({yaml.safe_dump(generator.generate(1, index)) for index in range(50)}) == 50


def test_a_seed_gives_the_story_it_gave_before():
    # The seed hashes the same on any machine: a story printed by one run is the story replayed by another.
    assert generator.describe(generator.story(1, 0)) == (
        "4 jobs of 2m10s every 1m10s; reservation held until 3m40s; on-demand out 0s, back 6m00s; DWS after 2m30s")


def test_every_generated_story_survives_its_yaml_form():
    for seed in SEEDS:
        document = generator.generate(seed)
        assert stories.parse(yaml.safe_load(yaml.safe_dump(document))) == stories.parse(document), seed


def test_each_setup_plays_a_story_in_a_minute_of_tier_time():
    assert {s.tier_seconds(s.horizon) for s in every_story()} == {60.0}


def test_the_jobs_stay_within_their_bounds():
    for s in every_story():
        assert (generator.JOBS[0] <= s.jobs <= generator.JOBS[1]
                and generator.JOB_GAP[0] <= s.submit_every <= generator.JOB_GAP[1]
                and generator.WORK[0] <= s.work <= generator.WORK[1]), s.name


def test_every_number_of_jobs_from_one_to_four_is_drawn():
    assert {s.jobs for s in every_story()} == {1, 2, 3, 4}


def test_stockouts_fall_only_on_on_demand_from_the_start_and_on_spot():
    for s in every_story():
        assert set(s.stockouts) <= {stories.ON_DEMAND, stories.SPOT}, s.name
        assert all(w.start == 0 and generator.STOCKOUT_LENGTH[0] <= w.end <= generator.STOCKOUT_LENGTH[1]
                   for w in s.stockouts.get(stories.ON_DEMAND, ())), s.name


def test_every_spot_stockout_begins_with_a_preemption_within_the_horizon():
    for s in every_story():
        windows = s.stockouts.get(stories.SPOT, ())
        preemptions = [f.at for f in s.faults if f.kind == "spot"]
        assert [w.start for w in windows] == preemptions, s.name
        assert all(w.end <= s.horizon and w.end - w.start <= generator.SPOT_OUT_LENGTH[1] for w in windows), s.name


def test_spot_stockouts_do_not_overlap():
    for s in every_story():
        windows = s.stockouts.get(stories.SPOT, ())
        assert all(a.end < b.start for a, b in zip(windows, windows[1:])), s.name


def test_hosts_are_lost_on_any_rung_within_the_horizon():
    hosts = [f for s in every_story() for f in s.faults if f.kind == "host"]
    assert {f.rung for f in hosts} == set(stories.RUNGS)
    assert all(generator.HOST_LOSS_AT[0] <= f.at <= generator.HOST_LOSS_AT[1] for f in hosts)


def test_the_reservation_is_held_from_the_start_and_freed_within_its_bounds():
    for s in every_story():
        assert len(s.held) <= 1 and all(
            w.start == 0 and generator.HELD_UNTIL[0] <= w.end <= generator.HELD_UNTIL[1] for w in s.held), s.name


def test_dws_delays_stay_within_their_bounds():
    assert all(generator.DWS_DELAY[0] <= s.dws_delay <= generator.DWS_DELAY[1] for s in every_story())


def test_dws_provisions_before_the_on_demand_stockout_ends_in_some_stories_and_after_in_others():
    relations = {s.dws_delay < s.stockouts[stories.ON_DEMAND][0].end for s in every_story()
                 if stories.ON_DEMAND in s.stockouts}
    assert relations == {True, False}


def test_every_generated_time_is_a_whole_step():
    for s in every_story():
        times = ([s.submit_every, s.work, s.dws_delay] + [f.at for f in s.faults] + [w.end for w in s.held]
                 + [t for ws in s.stockouts.values() for w in ws for t in (w.start, w.end)])
        assert all(t % generator.STEP == 0 for t in times), s.name


def test_a_random_story_compares_the_shipped_storys_setups():
    shipped = stories.parse(yaml.safe_load(SHIPPED_STORY.read_text()))
    assert generator.story(1).setups == shipped.setups


def test_a_random_storys_quotas_are_the_ladders():
    assert generator.story(1).slices == {rung: 1 for rung in stories.RUNGS}
