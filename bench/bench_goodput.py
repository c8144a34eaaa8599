"""Goodput, side by side: one capacity story (bench/stories/*.yaml) played against each of its setups on the tier (real
Kueue, KubeRay, kube-scheduler, KWOK nodes shaped like the plan's pools, the GKE stand-in), on a compressed clock.

    .venv/bin/python -m bench.bench_goodput [--story bench/stories/scarce-week.yaml] [--setups tutorial,dev,ladder]
    .venv/bin/python -m bench.bench_goodput --random 30 [--seed S] [--setups tutorial,dev]
    .venv/bin/python -m bench.bench_goodput --seed S --index K      # story K of seed S alone, as a run printed it

Per setup, one fresh tier: the setup's stack (a shipped stack's config with the story's keys over it); Kueue with the
stack's release values, or for a `tutorial` setup with Kueue's own defaults (no waitForPodsReady block: 0.19.2 still
applies its defaults, timeout 30m and backoff 60 s to 3600 s) and no failover controller. Every duration of the setup
(Kueue's waitForPodsReady timeouts and backoff, each of the controller's waits) is divided by the story's compression,
as the story's own times are. The bench then plays the story: submissions, stockouts (GKE reports them on the pods),
the reservation held by another team's job, Spot preempted with notice, a host failing silently, DWS provisioning a
slice `dwsDelay` after it is asked; a job ends once it has run `work` (its progress kept across moves: runtime
goodput, what a move costs the training itself, is bench/bench_notice.py's, with real Ray and JAX).

Printed per setup, in story time: submit -> first step (p50, max), scheduling goodput (job-seconds running over
job-seconds since submission), the optimum a perfect scheduler reaches with the same rungs (testbed/story.py), avoidable
badput (waiting while a usable rung had a slice free for the job, or on a broken slice past the rung's recovery
wait), the moves, the TPU chip-hours of slices that existed with no job running on them, and the chip-seconds of
slices idle while a job waited elsewhere (below); then each setup's goodput over the first setup's.

Idle while a job waited elsewhere (`idle-waiting chip-s`, issue 43 item 4): at each look at the cluster (every TICK
tier seconds, counted in story seconds), each TPU slice the GKE stand-in holds (created, nodes not yet gone) that no
Ray pod is bound to (not a story job's, not the reservation holder's; a capacity probe's pod does not count as using
it) adds its chips times the interval, if at that instant some job is waiting elsewhere: submitted, not finished, not
running, and not holding quota on that slice's rung (a job admitted there is on its way to that slice or its own
lost one, not elsewhere). A slice made by a probe, or scaled up for a job that then moved on, sitting there while a
job waits in another queue, is counted; a slice scaling down while every job runs or has finished is not.

`--random N` plays N stories of testbed/story_generator.py (seed `--seed`, or one drawn and printed; story K of a
seed is the same anywhere: `--seed S --index K` replays it alone), each against its setups (the shipped story's), and
prints each story's one-line summary and table, then per setup over the stories: scheduling goodput and the gap to
each story's optimum (p50, p95, worst), the goodput over the tutorial setup's (p50, worst, and how many stories fell
below 1.00x), and the idle-waiting chip-seconds (p50, p95, worst, sum), with the wall time per story. Percentiles are
nearest-rank on the bad side: goodput's p95 is the value 95% of the stories reached or beat, the gap's p95 the value
95% of them stayed within. Binaries must be built (`python -m testbed build`).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import math
import platform
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from failover import api
from infra import kueue as stack_kueue
from testbed import jobs, story as stories, story_generator
from testbed.cluster import ControlPlane
from testbed.failover_tier import NAMESPACE, FailoverTier
from testbed.kube import condition, wait_for
from testbed.plans import plan_for
from testbed.stack import release_configuration, release_values

DEFAULT_STORY = Path(__file__).resolve().parent / "stories" / "scarce-week.yaml"
TICK = 0.25  # tier seconds between two looks at the cluster
# Kueue 0.19.2's waitForPodsReady when the configuration has none (apis/config/v1beta2/defaults.go L48-52, L99-116).
# Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/apis/config/v1beta2/defaults.go
KUEUE_DEFAULT_WAIT = {"timeout": 1800, "backoffBaseSeconds": 60, "backoffMaxSeconds": 3600}
SPOT_NOTICE_SECONDS = 30  # GKE's default Spot notice (compressed like the rest)
RAY_CLUSTER_LABEL = "ray.io/cluster"  # on every pod of a RayCluster (KubeRay), head and workers


def compressed_kueue_values(plan, setup: stories.Setup, k: float) -> dict:
    """The Kueue release's values with waitForPodsReady on the story's clock: the stack's, or Kueue's defaults."""
    values = copy.deepcopy(release_values(plan))
    config = release_configuration(values)
    if setup.tutorial:  # the chart's default configuration; Kueue's own waitForPodsReady defaults, written out to
        # be compressed like the rest
        config = copy.deepcopy(stack_kueue.MANAGER_CONFIG_BASE)
        config["waitForPodsReady"] = {"timeout": f"{KUEUE_DEFAULT_WAIT['timeout']}s", "requeuingStrategy": {
            "backoffBaseSeconds": KUEUE_DEFAULT_WAIT["backoffBaseSeconds"],
            "backoffMaxSeconds": KUEUE_DEFAULT_WAIT["backoffMaxSeconds"]}}
    wait = config["waitForPodsReady"]
    for key in ("timeout", "recoveryTimeout"):
        if key in wait:
            wait[key] = f"{max(1, round(float(wait[key].rstrip('s')) / k))}s"
    strategy = wait.setdefault("requeuingStrategy", {})
    for key in ("backoffBaseSeconds", "backoffMaxSeconds"):
        if key in strategy:
            strategy[key] = max(1, round(strategy[key] / k))
    values["managerConfig"][stack_kueue.VALUES_CONFIG_KEY] = yaml.safe_dump(config, sort_keys=False)
    return values


def _compress_json(value, k: float):
    if isinstance(value, dict):
        return {key: (round(v / k, 2) if key.endswith("Seconds") and isinstance(v, (int, float)) and v
                      else _compress_json(v, k)) for key, v in value.items()}
    if isinstance(value, list):
        return [_compress_json(v, k) for v in value]
    return value


def compressed_controller_env(env: dict[str, str], k: float) -> dict[str, str]:
    """The failover controller's environment with every wait divided by `k` (its resync stays the tier's)."""
    out = dict(env)
    for name, value in env.items():
        if not name.startswith("FAILOVER_") or name == "FAILOVER_RESYNC_SECONDS":
            continue
        if name.endswith("_SECONDS"):
            out[name] = str(round(float(value) / k, 2))
        elif value[:1] in "[{":
            out[name] = json.dumps(_compress_json(json.loads(value), k))
    return out


@dataclass
class Job:
    index: int
    name: str
    submitted: float  # story seconds
    ran: float = 0.0
    first_step: float | None = None
    finished: float | None = None
    waiting_since: float = 0.0
    broken: tuple[float, str, str] | None = None  # (when, the slice lost, its rung) until it runs or is requeued
    was_running: bool = False
    states: list[tuple[float, str, str | None]] = field(default_factory=list)  # (since, state, rung) as it changed
    moves: list[api.Move] = field(default_factory=list)

    def seen(self, t: float, state: str, rung: str | None) -> None:
        if not self.states or self.states[-1][1:] != (state, rung):
            self.states.append((t, state, rung))


@dataclass
class Play:
    """One setup's tier playing the story: `tick()` every TICK tier seconds."""

    story: stories.Story
    setup: stories.Setup
    tier: FailoverTier
    rungs: tuple[str, ...]
    recovery: dict[str, float]
    jobs: list[Job] = field(default_factory=list)
    account: stories.Account = field(default_factory=stories.Account)
    t0: float = 0.0
    wall0: float = 0.0
    asked: dict[str, float] = field(default_factory=dict)  # ProvisioningRequest -> story time first seen
    faults: list[stories.Fault] = field(default_factory=list)
    stocked: set[str] = field(default_factory=set)
    holder: bool = False
    wall_seconds: float = 0.0  # the setup's whole play, its tier's start included
    _rung_of_pool: dict[str, str] | None = None

    def now(self) -> float:
        return (time.monotonic() - self.t0) * self.story.compression

    def capacity_events(self, t: float) -> None:
        for rung in self.rungs:
            out = self.story.capacity(rung, t) == 0 and rung != stories.RESERVATION
            if out and rung not in self.stocked:
                self.tier.stockout(rung)
                self.stocked.add(rung)
            elif not out and rung in self.stocked:
                for pool in self.tier.pools_of(rung):
                    self.tier.gke.restore(pool)
                self.stocked.discard(rung)
        if self.holder and not any(w.holds(t) for w in self.story.held):
            self.tier.kube.delete(*jobs.RAYJOB, "holder", NAMESPACE, propagation="Background")
            self.holder = False

    def submissions(self, t: float) -> None:
        for j in range(len(self.jobs), self.story.jobs):
            if self.story.submitted(j) > t:
                break
            name = f"job-{j}"
            self.tier.kube.create(jobs.dev_rayjob(name, "user-queue"))
            self.jobs.append(Job(j, name, self.story.submitted(j), waiting_since=self.story.submitted(j)))

    def dws(self, t: float) -> None:
        for request in self.tier.kube.list(*jobs.PROVISIONING_REQUEST, namespace=NAMESPACE):
            uid = request["metadata"]["uid"]
            if condition(request, "Provisioned") == "True":
                continue
            seen = self.asked.setdefault(uid, t)
            if t >= seen + self.story.dws_delay:
                jobs.mark_provisioned(self.tier.kube, request, f"bench-{request['metadata']['name']}")

    def fault(self, t: float, running: dict[str, tuple[str, str]]) -> list[str]:
        """The story's faults due by `t`, each on the slice of a job running on its rung; the jobs hit."""
        hit = []
        while self.faults and self.faults[0].at <= t:
            fault = self.faults.pop(0)
            victim = next((job for job in self.jobs if job.name in running and running[job.name][0] == fault.rung),
                          None)
            if victim is None:
                if fault.rung in self.rungs:
                    print(f"  {fault.kind} fault at {t / 60:.1f}m: no job running on {fault.rung}; skipped")
                continue
            slice_id = running[victim.name][1]
            if fault.kind == "spot":
                self.tier.gke.preempt_spot(slice_id, max(1, round(SPOT_NOTICE_SECONDS / self.story.compression)))
            else:
                self.tier.gke.fail_host(slice_id)
            victim.broken = (t, slice_id, fault.rung)
            hit.append(victim.name)
        return hit

    def running_now(self) -> dict[str, tuple[str, str]]:
        """job -> (rung, slice) for each job whose every pod runs and whose Workload is PodsReady."""
        found = {}
        workloads = {o["name"]: w for w in self.tier.kube.list(*jobs.WORKLOAD, namespace=NAMESPACE)
                     for o in w["metadata"].get("ownerReferences") or [] if o["kind"] == "RayJob"}
        self.workloads = workloads
        for job in self.jobs:
            workload = workloads.get(job.name)
            if job.finished is not None or condition(workload, "PodsReady") != "True":
                continue
            if not jobs.pools_of(self.tier.kube, NAMESPACE, job.name):
                continue
            slice_id, _ = self.tier.slice_of_job(job.name)
            if slice_id is None or (job.broken and job.broken[1] == slice_id):
                continue
            found[job.name] = (jobs.tpu_flavor(workload), slice_id)
        return found

    def tick(self, dt: float) -> None:
        t = self.now()
        self.capacity_events(t)
        self.submissions(t)
        self.dws(t)
        running = self.running_now()
        for victim in self.fault(t, running):
            running.pop(victim, None)  # its slice is gone from this instant
        held = {}
        for job in self.jobs:
            workload = self.workloads.get(job.name)
            if job.finished is None and workload and condition(workload, "QuotaReserved") == "True":
                rung = jobs.tpu_flavor(workload)
                held[job.name] = rung
        for job in self.jobs:
            if job.finished is not None:
                continue
            self.account.elapsed += dt
            if job.name in running:  # on a whole slice, not the one it lost
                job.broken = None
                job.ran += dt
                self.account.running += dt
                job.was_running = True
                job.seen(t, stories.RUNNING, running[job.name][0])
                if job.first_step is None:
                    job.first_step = t - job.submitted
                if job.ran >= self.story.work:
                    self.tier.plane.after.ray_head.finish(NAMESPACE, job.name)
                    job.finished = t
                    job.seen(t, "finished", None)
                continue
            if job.was_running and job.broken is None:
                job.waiting_since = t
            job.was_running = False
            rung = held.get(job.name)
            workload = self.workloads.get(job.name)
            if job.broken is not None and rung != job.broken[2]:
                job.broken, job.waiting_since = None, t  # requeued or moved: off the broken slice, waiting
            if job.broken is not None:
                state = stories.BROKEN
            elif condition(workload, "Admitted") == "True" and (
                    rung == stories.DWS or self.story.capacity(rung, t) > 0):
                state = stories.STARTING
            else:
                state = stories.WAITING
            seen = stories.Observation(t, job.index, state, rung, job.broken[0] if job.broken else None,
                                       job.waiting_since)
            job.seen(t, state, rung)
            others: dict[str, int] = {}
            for name, r in held.items():
                if name != job.name and r:
                    others[r] = others.get(r, 0) + 1
            if stories.avoidable(self.story, self.rungs, seen, others, self.recovery):
                self.account.avoidable += dt
        self.idle_chips(running, dt)
        self.idle_while_waiting(running, held, dt)

    def chips(self, pool: str) -> int:
        """A slice's TPU chips (0 for a pool without TPUs)."""
        template = self.tier.gke.by_pool.get(pool)
        if template is None or not template.tpu:
            return 0
        return int(float(template.allocatable[api.TPU_RESOURCE])) * template.hosts

    def idle_chips(self, running: dict[str, tuple[str, str]], dt: float) -> None:
        used = {slice_id for _, slice_id in running.values()}
        for slice_id, each in list(self.tier.gke.slices.items()):
            if slice_id not in used:
                self.account.idle_chip_seconds += self.chips(each.pool) * dt

    def occupied_slices(self) -> set[str]:
        """The slices some Ray pod (a story job's or the holder's) is bound to; a probe's pod is not a Ray pod."""
        slice_of_node = {node: each.id for each in list(self.tier.gke.slices.values()) for node in each.nodes}
        return {slice_of_node.get(pod["spec"].get("nodeName")) for pod in self.tier.kube.list(
            "v1", "Pod", namespace=NAMESPACE) if RAY_CLUSTER_LABEL in (pod["metadata"].get("labels") or {})} - {None}

    def idle_while_waiting(self, running: dict[str, tuple[str, str]], held: dict[str, str], dt: float) -> None:
        """Chip-seconds of slices idle while a job waited elsewhere (the module's docstring says exactly which)."""
        waiting = [job for job in self.jobs if job.finished is None and job.name not in running]
        if not waiting:
            return
        occupied = self.occupied_slices()
        for slice_id, each in list(self.tier.gke.slices.items()):
            rung = self.rung_of_pool.get(each.pool)
            if rung is None or slice_id in occupied:
                continue
            if any(held.get(job.name) != rung for job in waiting):
                self.account.idle_waiting_chip_seconds += self.chips(each.pool) * dt

    @property
    def rung_of_pool(self) -> dict[str, str]:
        if self._rung_of_pool is None:
            self._rung_of_pool = {pool: rung for rung in self.rungs for pool in self.tier.pools_of(rung)}
        return self._rung_of_pool

    def done(self) -> bool:
        return len(self.jobs) == self.story.jobs and all(job.finished is not None for job in self.jobs)


def tpu_rungs(plan) -> tuple[str, ...]:
    flavors = {m["metadata"]["name"] for m in plan.kubernetes_manifests() if m["kind"] == "ResourceFlavor"}
    return tuple(r for r in stories.RUNGS if r in flavors)


def recovery_waits(plan) -> dict[str, float]:
    """Each rung's sliceRecoveryWait in story seconds (the failover chain's recoverySeconds)."""
    chain = next((json.loads(e["value"]) for m in plan.kubernetes_manifests() if m["kind"] == "Deployment"
                  for c in m["spec"]["template"]["spec"]["containers"] for e in c.get("env") or []
                  if e["name"] == "FAILOVER_CHAIN"), [])
    return {rung["flavor"]: float(rung["recoverySeconds"]) for rung in chain}


def play(story: stories.Story, setup: stories.Setup, dev_recovery: dict[str, float]) -> Play:
    k = story.compression
    plan = plan_for(setup.stack, {"workloads": {"jobs": 0}, **setup.config})
    tier = FailoverTier(ControlPlane(compressed_kueue_values(plan, setup, k), nodes_of=plan), plan).start()
    rungs = tpu_rungs(plan)
    run = Play(story, setup, tier, rungs, recovery_waits(plan) or dev_recovery, faults=list(story.faults))
    try:
        if not setup.tutorial:
            tier.start_controller(environ=compressed_controller_env(tier.controller_env(), k))
        if stories.RESERVATION in rungs and story.held:
            tier.submit("holder")
            wait_for(lambda: tier.running_on("holder", stories.RESERVATION), 120, "the holder on the reservation")
            run.holder = True
        run.t0, run.wall0 = time.monotonic(), time.time()
        last = run.t0
        while run.now() < story.horizon and not run.done():
            time.sleep(TICK)
            now = time.monotonic()
            run.tick((now - last) * k)
            last = now
        for job in run.jobs:
            rayjob = tier.kube.get(*jobs.RAYJOB, job.name, NAMESPACE) or {}
            job.moves = api.move_history(rayjob.get("metadata", {}).get("annotations") or {})
        run.account.moves = sum(len(job.moves) for job in run.jobs)
        run.account.first_step = [job.first_step if job.first_step is not None else story.horizon - job.submitted
                                  for job in run.jobs]
    finally:
        tier.plane.stop()
    return run


def report(story: stories.Story, plays: list[Play]) -> None:
    k = story.compression
    jobs_of = f"{story.jobs} job{'s' if story.jobs > 1 else ''} of {round(story.work / 60, 1):g} min"
    print(f"\nstory {story.name}: {jobs_of}, "
          f"horizon {round(story.horizon / 60, 1):g} min, "
          f"played {k:g}x faster (1 story minute = {60 / k:g} s on the tier); "
          f"{datetime.date.today()}, {platform.node()} ({platform.machine()}, Python {platform.python_version()})")
    header = (f"{'setup':<10} {'first step p50':>14} {'max':>7} {'goodput':>8} {'optimum':>8} {'gap':>5} "
              f"{'avoidable':>9} {'moves':>5} {'idle chip-h':>11} {'idle-waiting chip-s':>19} "
              f"{'vs ' + plays[0].setup.name:>12}")
    print(header)
    base = plays[0].account.goodput or float("nan")
    for run in plays:
        a = run.account
        best = stories.optimum(story, run.rungs)
        unfinished = sum(1 for job in run.jobs if job.finished is None) + story.jobs - len(run.jobs)
        p50, most = statistics.median(a.first_step) / 60, max(a.first_step) / 60
        print(f"{run.setup.name:<10} {p50:>12.1f}m {most:>6.1f}m {a.goodput:>8.1%} {best:>8.1%} "
              f"{(best - a.goodput) * 100:>4.1f} {a.avoidable_share:>9.1%} {a.moves:>5} "
              f"{a.idle_chip_seconds / 3600:>11.1f} {a.idle_waiting_chip_seconds:>19,.0f} {a.goodput / base:>11.2f}x"
              + (f"  ({unfinished} unfinished at the horizon)" if unfinished else ""))


def print_timelines(run: Play) -> None:
    print(f"\n{run.setup.name}: each job's states (story minutes; the rung it held quota on)")
    for job in run.jobs:
        print(f"  {job.name}: " + ", ".join(f"{t / 60:.1f} {state}" + (f" {rung}" if rung else "")
                                            for t, state, rung in job.states))
        for move in job.moves:
            at = (api.parse_time(move.at).timestamp() - run.wall0) * run.story.compression / 60
            print(f"    moved at {at:.1f}: {move.from_flavor} -> {move.to_flavor} ({move.reason})")


def play_setups(story: stories.Story, chosen: list[stories.Setup], dev_recovery: dict[str, float]) -> list[Play]:
    plays = []
    for setup in chosen:
        started = time.monotonic()
        run = play(story, setup, dev_recovery)
        run.wall_seconds = time.monotonic() - started
        plays.append(run)
        print(f"played {setup.name} in {run.wall_seconds:.0f} s", flush=True)
    return plays


# ---- many random stories: the distribution per setup -------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    """One setup's figures on one story (goodput and optimum as shares, the gap in points, idle in chip-seconds)."""

    story: int
    goodput: float
    optimum: float
    idle_waiting: float
    wall: float
    vs_tutorial: float | None  # None: no tutorial setup played

    @property
    def gap(self) -> float:
        return (self.optimum - self.goodput) * 100


def outcomes(index: int, story: stories.Story, plays: list[Play]) -> dict[str, Outcome]:
    tutorial = next((run.account.goodput for run in plays if run.setup.tutorial), None)
    found = {}
    for run in plays:
        goodput = run.account.goodput
        ratio = None if tutorial is None else (goodput / tutorial if tutorial else (1.0 if not goodput else math.inf))
        found[run.setup.name] = Outcome(index, goodput, stories.optimum(story, run.rungs),
                                        run.account.idle_waiting_chip_seconds, run.wall_seconds, ratio)
    return found


def nearest_rank(values: list[float], share: float, higher_is_worse: bool) -> float:
    """The value `share` of the stories did no worse than (nearest rank; share 1.0: the worst story)."""
    ordered = sorted(values, reverse=not higher_is_worse)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def spread(values: list[float], higher_is_worse: bool) -> tuple[float, float, float]:
    """p50, p95 and the worst, each on the bad side."""
    return tuple(nearest_rank(values, share, higher_is_worse) for share in (0.5, 0.95, 1.0))


def report_distribution(seed: int, results: list[dict[str, Outcome]]) -> None:
    names = list(results[0])
    print(f"\n{len(results)} random stories of seed {seed} (testbed/story_generator.py; replay one: "
          f"--seed {seed} --index K); {datetime.date.today()}, {platform.node()}")
    print("each story: goodput (gap to its optimum, points) idle-waiting chip-s, per setup")
    for result in results:
        first = next(iter(result.values()))
        print(f"  story {first.story:>3}: " + "   ".join(
            f"{name} {o.goodput:.1%} ({o.gap:.1f}) {o.idle_waiting:,.0f}" for name, o in result.items()))
    print(f"\n{'setup':<10} {'goodput p50':>11} {'p95':>6} {'worst':>6} {'gap p50':>8} {'p95':>5} {'worst':>6} "
          f"{'vs tutorial p50':>15} {'worst':>6} {'below':>5} {'idle-waiting chip-s p50':>23} {'p95':>6} "
          f"{'worst':>6} {'sum':>7} {'wall p50':>8} {'max':>5}")
    for name in names:
        seen = [result[name] for result in results]
        goodput = spread([o.goodput for o in seen], higher_is_worse=False)
        gap = spread([o.gap for o in seen], higher_is_worse=True)
        idle = spread([o.idle_waiting for o in seen], higher_is_worse=True)
        ratios = [o.vs_tutorial for o in seen if o.vs_tutorial is not None]
        vs = (f"{nearest_rank(ratios, 0.5, False):>14.2f}x {min(ratios):>5.2f}x {sum(r < 1 for r in ratios):>5}"
              if ratios else f"{'-':>15} {'-':>6} {'-':>5}")
        walls = [o.wall for o in seen]
        print(f"{name:<10} {goodput[0]:>11.1%} {goodput[1]:>6.1%} {goodput[2]:>6.1%} {gap[0]:>8.1f} {gap[1]:>5.1f} "
              f"{gap[2]:>6.1f} {vs} {idle[0]:>23,.0f} {idle[1]:>6,.0f} {idle[2]:>6,.0f} "
              f"{sum(o.idle_waiting for o in seen):>7,.0f} {statistics.median(walls):>7.0f}s {max(walls):>4.0f}s")


def play_random(args, dev_recovery: dict[str, float]) -> None:
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1_000_000)
    indices = [args.index] if args.index is not None else list(range(args.random or 1))
    print(f"random stories: seed {seed}, {len(indices)} of them (story K alone: --seed {seed} --index K)", flush=True)
    results = []
    for index in indices:
        story = story_generator.story(seed, index)
        print(f"\nstory {index} of seed {seed}: {story_generator.describe(story)}", flush=True)
        plays = play_setups(story, chosen_setups(story, args.setups), dev_recovery)
        report(story, plays)
        if args.timelines:
            for run in plays:
                print_timelines(run)
        results.append(outcomes(index, story, plays))
    report_distribution(seed, results)


def chosen_setups(story: stories.Story, names: str | None) -> list[stories.Setup]:
    chosen = [s for s in story.setups if not names or s.name in names.split(",")]
    if not chosen:
        raise SystemExit(f"--setups: none of {names!r} is a setup of {story.name} "
                         f"({', '.join(s.name for s in story.setups)})")
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--story", type=Path, default=DEFAULT_STORY)
    parser.add_argument("--random", type=int, metavar="N", help="play N generated stories instead of --story")
    parser.add_argument("--seed", type=int, help="the generated stories' seed (default: one drawn and printed)")
    parser.add_argument("--index", type=int, metavar="K", help="play only story K of the seed (a story of a run)")
    parser.add_argument("--setups", help="comma-separated names of the story's setups to play (default: all)")
    parser.add_argument("--timelines", action="store_true", help="print each job's states as they changed")
    args = parser.parse_args()
    dev_recovery = recovery_waits(plan_for("dev", {"workloads": {"jobs": 0}}))
    if args.random is not None or args.index is not None:
        play_random(args, dev_recovery)
        return
    story = stories.parse(yaml.safe_load(args.story.read_text()))
    plays = play_setups(story, chosen_setups(story, args.setups), dev_recovery)
    report(story, plays)
    if args.timelines:
        for run in plays:
            print_timelines(run)


if __name__ == "__main__":
    main()
