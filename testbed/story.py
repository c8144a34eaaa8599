"""A capacity story (bench/stories/*.yaml): jobs submitted, and what GCE's capacity does to them, on the story's own
clock. Pure: parsing, the capacity each rung has at a time, the optimum a perfect scheduler would reach, and the
account of what a setup's jobs were seen doing (bench/bench_goodput.py plays the story on the tier and observes).

The story's times are story seconds (durations such as "30m"); the tier plays them `compression` times faster, and
every duration of the setups under test (Kueue's timeouts, the failover controller's waits) is compressed by as much.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from infra.settings.formats import duration_seconds

# The rungs a story speaks of, in the ladder's order (the ResourceFlavors the dev stack's catalogue names them by).
RESERVATION, ON_DEMAND, SPOT, DWS = "reservation", "on-demand", "spot", "dws"
RUNGS = (RESERVATION, ON_DEMAND, SPOT, DWS)
# What a job was seen doing at an instant (Observation.state).
RUNNING, STARTING, WAITING, BROKEN = "running", "starting", "waiting", "broken"


@dataclass(frozen=True)
class Window:
    start: float
    end: float

    def holds(self, t: float) -> bool:
        return self.start <= t < self.end


@dataclass(frozen=True)
class Fault:
    """A running slice lost at `at`: `spot` (preempted with notice) or `host` (a host fails silently, on `rung`)."""

    at: float
    kind: str
    rung: str


@dataclass(frozen=True)
class Setup:
    """One stack to play the story against: a shipped stack's config with `config` over it; `tutorial`: Kueue in its
    default configuration and no failover controller (Google's tutorial as written)."""

    name: str
    stack: str = "dev"
    config: Mapping = field(default_factory=dict)
    tutorial: bool = False


@dataclass(frozen=True)
class Story:
    name: str
    compression: float  # story seconds per tier second
    jobs: int
    submit_every: float  # between two submissions
    work: float  # seconds of training each job needs
    horizon: float  # the story ends here, finished or not
    slices: Mapping[str, int]  # how many slices of each rung a setup's quota holds
    stockouts: Mapping[str, tuple[Window, ...]]  # GCE has no capacity behind the rung
    held: tuple[Window, ...]  # the reservation's slice held by another team's job
    faults: tuple[Fault, ...]
    dws_delay: float  # from a ProvisioningRequest to its slice
    setups: tuple[Setup, ...]

    def submitted(self, job: int) -> float:
        return job * self.submit_every

    def capacity(self, rung: str, t: float) -> int:
        """The slices GCE gives the rung at `t` (a DWS slice also needs its delay from the ask: `free_for`)."""
        if any(w.holds(t) for w in self.stockouts.get(rung, ())):
            return 0
        if rung == RESERVATION and any(w.holds(t) for w in self.held):
            return 0
        return self.slices.get(rung, 0)

    def tier_seconds(self, story_seconds: float) -> float:
        return story_seconds / self.compression


def _seconds(value, key: str) -> float:
    seconds = duration_seconds(str(value))
    if seconds is None:
        raise ValueError(f"{key}: {value!r} is not a duration such as 90s, 30m or 2h")
    return float(seconds)


def _window(item: Mapping, key: str) -> Window:
    window = Window(_seconds(item["from"], f"{key}.from"), _seconds(item["until"], f"{key}.until"))
    if window.end <= window.start:
        raise ValueError(f"{key}: until must come after from")
    return window


def parse(document: Mapping) -> Story:
    """A story from its YAML document; every error names the key."""
    jobs = document["jobs"]
    stockouts: dict[str, list[Window]] = {}
    for i, item in enumerate(document.get("stockouts") or ()):
        if item["rung"] not in RUNGS:
            raise ValueError(f"stockouts[{i}].rung: {item['rung']!r} is not one of {', '.join(RUNGS)}")
        stockouts.setdefault(item["rung"], []).append(_window(item, f"stockouts[{i}]"))
    faults = []
    for i, item in enumerate(document.get("faults") or ()):
        kind = item["kind"]
        if kind not in ("spot", "host"):
            raise ValueError(f"faults[{i}].kind: {kind!r} is not spot or host")
        rung = SPOT if kind == "spot" else item["rung"]
        if rung not in RUNGS:
            raise ValueError(f"faults[{i}].rung: {rung!r} is not one of {', '.join(RUNGS)}")
        faults.append(Fault(_seconds(item["at"], f"faults[{i}].at"), kind, rung))
    setups = tuple(Setup(s["name"], s.get("stack", "dev"), s.get("config") or {}, bool(s.get("tutorial")))
                   for s in document["setups"])
    story = Story(
        name=document["name"], compression=float(document["compression"]), jobs=int(jobs["count"]),
        submit_every=_seconds(jobs.get("every", "0s"), "jobs.every"), work=_seconds(jobs["work"], "jobs.work"),
        horizon=_seconds(document["horizon"], "horizon"),
        slices={rung: int(n) for rung, n in (document.get("slices") or {}).items()},
        stockouts={rung: tuple(ws) for rung, ws in stockouts.items()},
        held=tuple(_window(w, f"held[{i}]") for i, w in enumerate(document.get("held") or ())),
        faults=tuple(sorted(faults, key=lambda f: f.at)),
        dws_delay=_seconds(document.get("dwsDelay", "0s"), "dwsDelay"),
        setups=setups)
    if story.compression < 1:
        raise ValueError("compression: at least 1 (story seconds per tier second)")
    unknown = set(story.slices) - set(RUNGS)
    if unknown:
        raise ValueError(f"slices: unknown rungs {sorted(unknown)}")
    return story


# ---- the optimum: a perfect scheduler over the same capacity ------------------------------------------------------
def optimum(story: Story, rungs: Iterable[str], step: float = 1.0) -> float:
    """Scheduling goodput a perfect scheduler reaches with these rungs (in ladder order): every job on the best slice
    free for it at every instant, moving, climbing and recovering in no time, asking DWS the moment it waits with DWS's
    quota free (the slice comes `dws_delay` after the ask, as a ProvisioningRequest's does). Job-seconds running over
    job-seconds from submission to finish (or the horizon): the share of time a slice the job may use existed for it."""
    rungs = [r for r in RUNGS if r in set(rungs)]
    remaining = [story.work] * story.jobs
    on: list[str | None] = [None] * story.jobs
    asked: dict[int, float] = {}  # job -> when it asked DWS (its quota held while it waits)
    ran = elapsed = 0.0
    faults = list(story.faults)
    t = 0.0

    def used(rung: str) -> int:
        return sum(1 for j, r in enumerate(on) if r == rung and remaining[j] > 0) + (len(asked) if rung == DWS else 0)

    while t < story.horizon and any(r > 0 for r in remaining):
        while faults and faults[0].at <= t:  # the slice on the fault's rung is gone
            fault = faults.pop(0)
            for j in range(story.jobs):
                if on[j] == fault.rung and remaining[j] > 0:
                    on[j] = None
                    break
        for j in reversed(range(story.jobs)):  # capacity gone takes its slices (the latest jobs' first)
            if on[j] is not None and on[j] != DWS and used(on[j]) > story.capacity(on[j], t):
                on[j] = None
        for j in range(story.jobs):
            if story.submitted(j) > t or remaining[j] <= 0:
                continue
            if j in asked and t >= asked[j] + story.dws_delay:
                del asked[j]
                on[j] = DWS
            better = [r for r in (rungs if on[j] is None else rungs[:rungs.index(on[j])]) if r != DWS]
            free = next((r for r in better if story.capacity(r, t) - used(r) > 0), None)
            if free is not None:
                if on[j] == DWS or j in asked:
                    asked.pop(j, None)
                on[j] = free
            elif on[j] is None and j not in asked and DWS in rungs and story.capacity(DWS, t) - used(DWS) > 0:
                asked[j] = t
            elapsed += step
            if on[j] is not None:
                remaining[j] -= step
                ran += step
                if remaining[j] <= 0:
                    on[j] = None
        t += step
    return ran / elapsed if elapsed else 0.0


# ---- what a setup's jobs were seen doing ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Observation:
    """One job at one instant, as the bench saw it (story seconds since the story began)."""

    t: float
    job: int
    state: str  # RUNNING, STARTING (admitted on a rung with capacity), WAITING, BROKEN
    rung: str | None  # the rung it is admitted on, if any
    broken_since: float | None = None  # BROKEN: when its slice was lost
    waiting_since: float | None = None  # WAITING: since when it has not run (its submission or its last loss)


@dataclass
class Account:
    """A setup's figures over the story, in story seconds."""

    elapsed: float = 0.0
    running: float = 0.0
    avoidable: float = 0.0
    idle_chip_seconds: float = 0.0
    idle_waiting_chip_seconds: float = 0.0  # bench/bench_goodput.py's docstring: idle while a job waited elsewhere
    first_step: list[float] = field(default_factory=list)
    moves: int = 0

    @property
    def goodput(self) -> float:
        return self.running / self.elapsed if self.elapsed else 0.0

    @property
    def avoidable_share(self) -> float:
        return self.avoidable / self.elapsed if self.elapsed else 0.0


def avoidable(story: Story, rungs: Iterable[str], seen: Observation, others: Mapping[str, int],
              recovery: Mapping[str, float]) -> bool:
    """Whether this instant of a job not running is avoidable badput: it waited while a rung it may use had a slice
    free for it (`others`: slices of each rung held by the other jobs now; DWS's slice only once its delay has passed
    since the wait began), or it sat on a broken slice past the rung's recovery wait."""
    if seen.state == RUNNING:
        return False
    if seen.state == BROKEN:
        return seen.t - seen.broken_since > recovery.get(seen.rung, 0.0)
    if seen.state == STARTING:
        return False  # on a slice GCE can give: the start's own time
    since = seen.waiting_since if seen.waiting_since is not None else seen.t
    for rung in rungs:
        free = story.capacity(rung, seen.t) - others.get(rung, 0) > 0
        if free and (rung != DWS or seen.t >= since + story.dws_delay):
            return True
    return False
