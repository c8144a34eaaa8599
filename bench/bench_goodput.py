"""Goodput, side by side: one capacity story (bench/stories/*.yaml) played against each of its setups on the tier (real
Kueue, KubeRay, kube-scheduler, KWOK nodes shaped like the plan's pools, the GKE stand-in), on a compressed clock.

    .venv/bin/python -m bench.bench_goodput [--story bench/stories/scarce-week.yaml] [--setups tutorial,dev,ladder]

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
wait), the moves, and the TPU chip-hours of slices that existed with no job running on them; then each setup's
goodput over the first setup's. Binaries must be built (`python -m testbed build`).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from failover import api
from infra import kueue as stack_kueue
from testbed import jobs, story as stories
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
                    print(f"  {fault.kind} fault at {t / 60:.0f}m: no job running on {fault.rung}; skipped")
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

    def idle_chips(self, running: dict[str, tuple[str, str]], dt: float) -> None:
        used = {slice_id for _, slice_id in running.values()}
        for slice_id, each in list(self.tier.gke.slices.items()):
            template = self.tier.gke.by_pool.get(each.pool)
            if template is not None and template.tpu and slice_id not in used:
                chips = int(float(template.allocatable[api.TPU_RESOURCE])) * template.hosts
                self.account.idle_chip_seconds += chips * dt

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
    print(f"\nstory {story.name}: {story.jobs} jobs of {story.work / 60:.0f} min, "
          f"horizon {story.horizon / 60:.0f} min, "
          f"played {k:g}x faster (1 story minute = {60 / k:g} s on the tier); "
          f"{datetime.date.today()}, {platform.node()} ({platform.machine()}, Python {platform.python_version()})")
    header = (f"{'setup':<10} {'first step p50':>14} {'max':>7} {'goodput':>8} {'optimum':>8} {'gap':>5} "
              f"{'avoidable':>9} {'moves':>5} {'idle chip-h':>11} {'vs ' + plays[0].setup.name:>12}")
    print(header)
    base = plays[0].account.goodput or float("nan")
    for run in plays:
        a = run.account
        best = stories.optimum(story, run.rungs)
        unfinished = sum(1 for job in run.jobs if job.finished is None) + story.jobs - len(run.jobs)
        p50, most = statistics.median(a.first_step) / 60, max(a.first_step) / 60
        print(f"{run.setup.name:<10} {p50:>12.1f}m {most:>6.1f}m {a.goodput:>8.1%} {best:>8.1%} "
              f"{(best - a.goodput) * 100:>4.1f} {a.avoidable_share:>9.1%} {a.moves:>5} "
              f"{a.idle_chip_seconds / 3600:>11.1f} {a.goodput / base:>11.2f}x"
              + (f"  ({unfinished} unfinished at the horizon)" if unfinished else ""))


def print_timelines(run: Play) -> None:
    print(f"\n{run.setup.name}: each job's states (story minutes; the rung it held quota on)")
    for job in run.jobs:
        print(f"  {job.name}: " + ", ".join(f"{t / 60:.1f} {state}" + (f" {rung}" if rung else "")
                                            for t, state, rung in job.states))
        for move in job.moves:
            at = (api.parse_time(move.at).timestamp() - run.wall0) * run.story.compression / 60
            print(f"    moved at {at:.1f}: {move.from_flavor} -> {move.to_flavor} ({move.reason})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--story", type=Path, default=DEFAULT_STORY)
    parser.add_argument("--setups", help="comma-separated names of the story's setups to play (default: all)")
    parser.add_argument("--timelines", action="store_true", help="print each job's states as they changed")
    args = parser.parse_args()
    story = stories.parse(yaml.safe_load(args.story.read_text()))
    chosen = [s for s in story.setups if not args.setups or s.name in args.setups.split(",")]
    dev_recovery = recovery_waits(plan_for("dev", {"workloads": {"jobs": 0}}))
    plays = []
    for setup in chosen:
        started = time.monotonic()
        plays.append(play(story, setup, dev_recovery))
        print(f"played {setup.name} in {time.monotonic() - started:.0f} s", flush=True)
    report(story, plays)
    if args.timelines:
        for run in plays:
            print_timelines(run)


if __name__ == "__main__":
    main()
