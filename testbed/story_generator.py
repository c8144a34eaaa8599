"""Random capacity stories, seeded and reproducible, bounded to what GKE does (bench/bench_goodput.py --random).

A story is generated as the YAML document a user would write (bench/stories/*.yaml) and parsed by
testbed/story.py's own `parse`, so its validation, the optimum and the avoidable-badput rules apply unchanged. Story
`index` of seed `seed` is the same document on any machine and Python (random.Random seeded with a string hashes it
with SHA-512, not Python's salted hash): one story of a run is replayed alone from its seed and index.

What varies, and within what (story seconds, in steps of STEP):
- 1-4 jobs, JOB_GAP apart, each needing WORK of training; the story ends at HORIZON, finished or not;
- on-demand out of stock from the start (ON_DEMAND_STOCKOUT_CHANCE) for STOCKOUT_LENGTH: a zone out of TPUs when the
  jobs arrive. Only from the start, because GCE does not take running on-demand VMs back when it runs out, while
  the optimum counts a rung out of stock as holding no slice (testbed/story.py `optimum`): a stockout starting under
  a running on-demand job would put the optimum below what any setup can reach;
- Spot preempted with GKE's notice, then out of stock for SPOT_OUT_LENGTH (SPOT_PREEMPTIONS times, apart): GCE
  reclaims Spot capacity when it needs it, so a Spot stockout begins with the preemption of whoever runs there;
- hosts lost silently (HOST_LOSSES, on any rung; the slice comes back from the autoscaler as GKE recreates it);
- the reservation held by another team's job from the start, then freed (HELD_CHANCE, until HELD_UNTIL): the bench
  plays the holder as a RayJob running before the story begins, deleted when the window ends;
- DWS provisioning a request DWS_DELAY after it is asked, shorter than the on-demand stockout in half the stories
  and longer in the other half (the move to DWS is a bet that wins or loses: issue 43's two stories).
Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms (preemption, notice)
Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/tpus ("multi-host slice": one host lost, slice lost)
"""

from __future__ import annotations

import random

from testbed import story as stories

STEP = 10  # story seconds: every generated time is a multiple (readable summaries, whole-second durations)
# The clock (Kueue's timeout 15m -> 90 s, the grace 30 s -> 3 s on the tier), and 60 s of tier time per
# setup once the tier is up: HORIZON / COMPRESSION.
COMPRESSION = 10
HORIZON = 600
JOBS = (1, 4)
JOB_GAP = (0, 90)
WORK = (120, 240)
STOCKOUT_LENGTH = (40, 360)
ON_DEMAND_STOCKOUT_CHANCE = 0.75
SPOT_PREEMPTIONS = (0, 2)
SPOT_FIRST = (30, 300)  # the first preemption's time
SPOT_OUT_LENGTH = (30, 240)
SPOT_APART = (30, 180)  # from Spot's capacity back to the next preemption
HOST_LOSSES = (0, 2)
HOST_LOSS_AT = (60, HORIZON - 60)
HELD_CHANCE = 0.75
HELD_UNTIL = (60, 360)
DWS_DELAY = (20, 480)
# The quotas of the setups below (dev: one on-demand and one DWS slice; the ladder: one of each rung).
SLICES = {stories.RESERVATION: 1, stories.ON_DEMAND: 1, stories.SPOT: 1, stories.DWS: 1}
# The shipped story's setups (bench/stories/scarce-week.yaml), so a random story compares the same three.
SETUPS = (
    {"name": "tutorial", "tutorial": True},
    {"name": "dev"},
    {"name": "ladder", "config": {
        "reservation": {"reservations": [{"name": "team-v6e", "slices": 1}]},
        "spot": {"maxSlices": 1},
        "fallback": {"climbBack": {"to": ["reservation", "onDemand"]}}}},
)


def _between(rng: random.Random, bounds: tuple[int, int]) -> int:
    """A multiple of STEP within `bounds`, both ends included."""
    low, high = bounds
    return rng.randrange(low, high + 1, STEP)


def _duration(seconds: int) -> str:
    return f"{seconds}s"


def _window(rung: str | None, start: int, end: int) -> dict:
    window = {"from": _duration(start), "until": _duration(end)}
    return {"rung": rung, **window} if rung else window


def _spot_preemptions(rng: random.Random) -> list[tuple[int, int]]:
    """(preempted at, capacity back at) for each Spot preemption, in order, within the horizon."""
    found, at = [], _between(rng, SPOT_FIRST)
    for _ in range(rng.randint(*SPOT_PREEMPTIONS)):
        if at >= HORIZON - STEP:
            break
        back = min(at + _between(rng, SPOT_OUT_LENGTH), HORIZON)
        found.append((at, back))
        at = back + _between(rng, SPOT_APART)
    return found


def _dws_delay(rng: random.Random, stockout: int | None) -> int:
    """Shorter than the on-demand stockout (or the longest Spot one) in half the stories, longer in the rest."""
    if stockout is None:
        return _between(rng, DWS_DELAY)
    if rng.random() < 0.5 and stockout - STEP >= DWS_DELAY[0]:
        return _between(rng, (DWS_DELAY[0], stockout - STEP))
    return _between(rng, (stockout + STEP, DWS_DELAY[1]))


def generate(seed: int, index: int = 0) -> dict:
    """Story `index` of seed `seed`, as its YAML document (`story(seed, index)` parses it)."""
    rng = random.Random(f"{seed}/{index}")
    count, gap, work = rng.randint(*JOBS), _between(rng, JOB_GAP), _between(rng, WORK)
    on_demand = _between(rng, STOCKOUT_LENGTH) if rng.random() < ON_DEMAND_STOCKOUT_CHANCE else None
    spot = _spot_preemptions(rng)
    hosts = sorted((_between(rng, HOST_LOSS_AT), rng.choice(stories.RUNGS)) for _ in range(rng.randint(*HOST_LOSSES)))
    held = _between(rng, HELD_UNTIL) if rng.random() < HELD_CHANCE else None
    longest_spot = max((back - at for at, back in spot), default=None)
    dws_delay = _dws_delay(rng, on_demand if on_demand is not None else longest_spot)
    faults = ([{"at": _duration(at), "kind": "spot"} for at, _ in spot]
              + [{"at": _duration(at), "kind": "host", "rung": rung} for at, rung in hosts])
    return {
        "name": f"random-{seed}-{index}",
        "compression": COMPRESSION,
        "horizon": _duration(HORIZON),
        "jobs": {"count": count, "every": _duration(gap), "work": _duration(work)},
        "slices": dict(SLICES),
        "dwsDelay": _duration(dws_delay),
        "stockouts": ([_window(stories.ON_DEMAND, 0, on_demand)] if on_demand is not None else [])
                     + [_window(stories.SPOT, at, back) for at, back in spot],
        "held": [_window(None, 0, held)] if held is not None else [],
        "faults": sorted(faults, key=lambda f: int(f["at"].rstrip("s"))),
        "setups": [dict(s) for s in SETUPS],
    }


def story(seed: int, index: int = 0) -> stories.Story:
    return stories.parse(generate(seed, index))


def _minutes(seconds: float) -> str:
    whole = int(round(seconds))
    return f"{whole // 60}m{whole % 60:02d}s" if whole >= 60 else f"{whole}s"


def describe(story: stories.Story) -> str:
    """One line: what the story does, in story time (printed beside each story's figures so it can be read alone)."""
    parts = [f"{story.jobs} job{'s' if story.jobs > 1 else ''} of {_minutes(story.work)}"
             + (f" every {_minutes(story.submit_every)}" if story.jobs > 1 else "")]
    parts += [f"reservation held until {_minutes(w.end)}" for w in story.held]
    preempted = {f.at for f in story.faults if f.kind == "spot"}
    for rung, windows in story.stockouts.items():
        for w in windows:
            lost = "preempted" if rung == stories.SPOT and w.start in preempted else "out"
            parts.append(f"{rung} {lost} {_minutes(w.start)}, back {_minutes(w.end)}")
    windows = {w.start for w in story.stockouts.get(stories.SPOT, ())}
    parts += [f"{'spot preempted' if f.kind == 'spot' else f'{f.rung} host lost'} at {_minutes(f.at)}"
              for f in story.faults if not (f.kind == "spot" and f.at in windows)]
    parts.append(f"DWS after {_minutes(story.dws_delay)}")
    return "; ".join(parts)
