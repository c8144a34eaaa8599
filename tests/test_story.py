"""testbed/story.py: a capacity story's parsing, its optimum and what counts as avoidable badput (no server)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from testbed import story as stories

SHIPPED = Path(__file__).resolve().parent.parent / "bench" / "stories"


def a_story(**fields) -> stories.Story:
    document = {"name": "t", "compression": 20, "horizon": "2h", "jobs": {"count": 1, "work": "10m"},
                "slices": {"on-demand": 1, "spot": 1, "dws": 1}, "setups": [{"name": "dev"}], **fields}
    return stories.parse(document)


def test_the_shipped_stories_parse_with_the_three_setups():
    paths = sorted(SHIPPED.glob("*.yaml"))
    assert paths, f"no story in {SHIPPED}"  # an empty glob would pass the loop below without a story
    for path in paths:
        story = stories.parse(yaml.safe_load(path.read_text()))
        assert [s.name for s in story.setups] == ["tutorial", "dev", "ladder"], path
        assert [s.tutorial for s in story.setups] == [True, False, False], path


def test_a_job_with_a_free_slice_from_its_submission_reaches_the_whole_optimum():
    assert stories.optimum(a_story(), ["on-demand"]) == 1.0


def test_a_stockout_with_nowhere_else_to_go_halves_a_job_that_waits_as_long_as_it_trains():
    story = a_story(stockouts=[{"rung": "on-demand", "from": "0m", "until": "10m"}])
    assert stories.optimum(story, ["on-demand"]) == 0.5


def test_a_perfect_scheduler_asks_dws_at_once_and_runs_from_its_delay():
    story = a_story(stockouts=[{"rung": "on-demand", "from": "0m", "until": "10m"}], dwsDelay="4m")
    # On DWS from minute 4 (climbing to on-demand at 10 is free), done at 14: 10 of 14 minutes.
    assert stories.optimum(story, ["on-demand", "dws"]) == pytest.approx(10 / 14, abs=1e-3)


def test_a_spot_preemption_costs_the_time_spot_stays_out():
    story = a_story(stockouts=[{"rung": "spot", "from": "5m", "until": "10m"}], faults=[{"at": "5m", "kind": "spot"}])
    assert stories.optimum(story, ["spot"]) == pytest.approx(10 / 15, abs=1e-3)


def test_a_held_reservation_counts_only_once_freed():
    story = a_story(slices={"reservation": 1}, held=[{"from": "0m", "until": "5m"}])
    assert (story.capacity("reservation", 299), story.capacity("reservation", 300)) == (0, 1)
    assert stories.optimum(story, ["reservation"]) == pytest.approx(10 / 15, abs=1e-3)


@pytest.mark.parametrize("field, value, key", [
    ("stockouts", [{"rung": "gpu", "from": "0m", "until": "1m"}], "stockouts[0].rung"),
    ("stockouts", [{"rung": "spot", "from": "5m", "until": "1m"}], "stockouts[0]: until must come after from"),
    ("faults", [{"at": "soon", "kind": "spot"}], "faults[0].at"),
    ("faults", [{"at": "1m", "kind": "quake"}], "faults[0].kind"),
    ("dwsDelay", "six minutes", "dwsDelay"),
])
def test_a_bad_story_names_its_key(field, value, key):
    with pytest.raises(ValueError, match=key.replace("[", r"\[").replace("]", r"\]")):
        a_story(**{field: value})


def seen(state: str, t: float = 600.0, rung: str | None = None, **fields) -> stories.Observation:
    return stories.Observation(t, 0, state, rung, **fields)


def test_waiting_while_a_usable_rung_has_a_free_slice_is_avoidable():
    story = a_story(stockouts=[{"rung": "on-demand", "from": "0m", "until": "5m"}])
    assert stories.avoidable(story, ["on-demand"], seen(stories.WAITING, t=600), {}, {})
    assert not stories.avoidable(story, ["on-demand"], seen(stories.WAITING, t=100), {}, {})  # stocked out
    assert not stories.avoidable(story, ["on-demand"], seen(stories.WAITING, t=600), {"on-demand": 1}, {})  # taken


def test_dws_is_free_for_a_waiting_job_only_its_delay_after_the_wait_began():
    story = a_story(dwsDelay="4m")
    early = seen(stories.WAITING, t=200, waiting_since=0.0)
    late = seen(stories.WAITING, t=240, waiting_since=0.0)
    assert (stories.avoidable(story, ["dws"], early, {}, {}), stories.avoidable(story, ["dws"], late, {}, {})) == (
        False, True)


def test_a_broken_slice_is_avoidable_only_past_the_rungs_recovery_wait():
    story = a_story()
    within = seen(stories.BROKEN, t=700, rung="on-demand", broken_since=100.0)
    past = seen(stories.BROKEN, t=701, rung="on-demand", broken_since=100.0)
    recovery = {"on-demand": 600.0}
    assert (stories.avoidable(story, ["on-demand"], within, {}, recovery),
            stories.avoidable(story, ["on-demand"], past, {}, recovery)) == (False, True)


def test_starting_on_a_slice_gce_can_give_is_not_avoidable():
    assert not stories.avoidable(a_story(), ["on-demand"], seen(stories.STARTING, rung="on-demand"), {}, {})
