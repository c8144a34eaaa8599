"""Plan C's dispatch overhead: how long the MultiKueue fleet itself takes to fan a job out to its members, to move
it to the member whose slice came first, and to report the winner's status back, on three real control planes
(the fleet tier of tests/test_fleet_controlplane.py: the shipped fleet stack on a manager, the shipped member
stacks on two members, each etcd + kube-apiserver + kube-controller-manager + Kueue 0.19.2, and the fleet watch as
deployed).

    .venv/bin/python -m bench.bench_fleet [--rounds 5] [--pause 1.0] [--json samples.json]
                                          [--scripts all|none|S1,S2,...] [--script-rounds 1] [--dws-seconds 10]

Each round submits a new copy of the fleet plan's RayJob on the manager and times, from just before each call:
1. the create -> a Workload copy in every member (the last member's), and -> a ProvisioningRequest in every member;
2. one member's request marked Provisioned (GKE's autoscaler played; the winner alternates between rounds) ->
   the RayJob exists in the winner (the dispatch overhead; goal p95 <= 5 s), -> the winner's Kueue starts it
   (unsuspended), -> the loser's copy and its request are gone, -> the manager's Workload records
   `status.clusterName` = the winner;
3. the winner's KubeRay (real, like the scheduler and each member's pools) reports the job Running -> the manager's
   RayJob shows `jobDeploymentStatus: Running`.
Then the job is deleted on the manager and the bench waits until nothing of it is left in any cluster.

Then the fleet's ladder (issue 18) side by side with that DWS-only fleet, on scripted capacity (which member has
which capacity when; `SCRIPTS`): each script runs on today's fleet (DWS only, the tier above) and on a fleet whose
members offer their on-demand rung (testbed/ladder_tier.py: a tier of its own, started after the first
is stopped, with the ladder controller as deployed; stepWait 5 s, members' stockoutGracePeriod 4 s and
podsReadyTimeout 30 s). Per script and fleet: submission -> the RayJob in the member that has the capacity (the job
can start; both tiers run real KubeRay, the scheduler and each member's pools: also -> its pods ready there), and the cost of each failed step: the member's autoscaler stand-in's "GCE out of resources" Event on
the run's real pods (its timestamp has whole seconds: up to 1 s early) -> the next step admitted, less the grace
period (the early path), or the step's admission -> the next step's, less podsReadyTimeout less the ladder's lead
(a stockout nobody reports: the ladder moves it PODS_READY_LEAD before the member would evict it). DWS provisions
in the scripted member `--dws-seconds` after its request exists: on GKE, minutes to hours;
the bench's number is a placeholder, the same on both fleets. Goals: a free on-demand slice in any member used
within 2 s of submission; each failed step <= its grace or timeout + 2 s.
Polls every `--interval` s (default 0.02) with a monotonic clock; a time is taken when the poll that saw the
change returned, so each number is an upper bound by at most one poll round (the interval plus a few API calls).
Reading the numbers: the manager's Kueue handles a member's change (its copy admitted, its RayJob's status) after
a fixed 1 s batch (MultiKueue's eventsBatchPeriod = constants.UpdatesBatchPeriod, not configurable in 0.19.2:
pkg/controller/admissionchecks/multikueue/controllers.go, workload.go), so the Provisioned -> ... measures cannot
go much below 1 s; the rest is the tier's own API round trips and the machine's load.

What it cannot measure: real DWS provisioning times (minutes to hours, the dominant term on GKE; here a status
patch), cross-region latency between the manager and the members (here all on 127.0.0.1), the pods' image pulls and
Ray's start (KWOK makes them Running at once), and GKE API servers' latency under load. The three
control planes share this machine's cores with the bench (and with whatever else runs): the load average at start
is printed; compare runs on a quiet machine.
Binaries must be built (`python -m testbed build`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path


from failover.ladder.decisions import PODS_READY_LEAD
from infra.fleet_member import FLEET_NAMESPACE
from testbed import jobs
from testbed.fleet_tier import (MEMBERS, PODS_READY_TIMEOUT_SECONDS, REACTION, W1, W2,
                                MANAGER, WORKLOAD, FleetStacks, FleetTier, applied_fleet, fleet_plan,
                                member_plan, member_values)
from testbed.kube import poll_every, wait_for
from testbed.ladder_tier import (GRACE_SECONDS, ON_DEMAND_ONLY, ON_DEMAND_W1, ON_DEMAND_W2,
                                 LadderFleet, ladder_fleet_plan, ladder_member_plan)
from testbed.stack import release_values

GOAL_SECONDS = 5.0
NOT_READY_SECONDS = PODS_READY_TIMEOUT_SECONDS - PODS_READY_LEAD.total_seconds()  # when the ladder moves a silent one
COPIES = "submitted -> a Workload copy in every member"
REQUESTS = "submitted -> a ProvisioningRequest in every member"
DISPATCH = "Provisioned -> the RayJob in the winner"
STARTED = "Provisioned -> the winner's RayJob started (unsuspended)"
LOSER_GONE = "Provisioned -> the loser's copy and request gone"
RECORDED = "Provisioned -> manager Workload clusterName = winner"
MIRRORED = "winner's RayJob Running -> manager's RayJob Running"
MEASURES = (COPIES, REQUESTS, DISPATCH, STARTED, LOSER_GONE, RECORDED, MIRRORED)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (p95 of 5 samples is the largest)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def first_times(started: float, probes: dict[str, Callable[[], object]], interval: float,
                timeout: float = REACTION) -> tuple[dict[str, float], dict[str, object]]:
    """Poll every probe not yet satisfied, in order, every `interval` s: for each, the seconds since `started` at
    which the poll that first saw it truthy returned, and that value."""
    times: dict[str, float] = {}
    values: dict[str, object] = {}
    deadline = time.monotonic() + timeout
    while len(times) < len(probes):
        for name, probe in probes.items():
            if name not in times and (value := probe()):
                times[name] = time.monotonic() - started
                values[name] = value
        if len(times) == len(probes):
            break
        if time.monotonic() > deadline:
            missing = [name for name in probes if name not in times]
            raise TimeoutError(f"not within {timeout:.0f} s: {missing}")
        time.sleep(interval)
    return times, values


def copy_of(fleet: FleetStacks, member: str, job: str) -> dict | None:
    """The member's copy of the job's Workload (named as the manager's: rayjob-<job>-<hash>)."""
    prefix = f"rayjob-{job}-"
    found = [w for w in fleet.kubes[member].list(*WORKLOAD, namespace=FLEET_NAMESPACE)
             if w["metadata"]["name"].startswith(prefix) and len(w["metadata"]["name"]) == len(prefix) + 5]
    return found[0] if found else None


def quiet(fleet: FleetStacks) -> bool:
    """Nothing of any job left in the members (no copy, request or RayJob) nor on the manager."""
    return (not fleet.manager.list(*jobs.RAYJOB, namespace=FLEET_NAMESPACE)
            and not fleet.manager.list(*WORKLOAD, namespace=FLEET_NAMESPACE)
            and not any(fleet.kubes[m].list(*kind, namespace=FLEET_NAMESPACE)
                        for m in MEMBERS for kind in (WORKLOAD, jobs.PROVISIONING_REQUEST, jobs.RAYJOB)))


def one_round(fleet: FleetStacks, job: str, winner: str, interval: float, pause: float) -> dict:
    loser = next(m for m in MEMBERS if m != winner)
    copies: dict[str, dict] = {}

    def copy_probe(member: str) -> Callable[[], dict | None]:
        def probe() -> dict | None:
            if member not in copies and (found := copy_of(fleet, member, job)):
                copies[member] = found
            return copies.get(member)
        return probe

    def request_probe(member: str) -> Callable[[], dict | None]:
        return lambda: member in copies and (jobs.provisioning_requests(
            fleet.kubes[member], FLEET_NAMESPACE, copies[member]) or [None])[0]

    # 1. Submit on the manager (its client, in a thread) while this thread polls the members (their own clients).
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="submit") as pool:
        submitted = time.monotonic()
        future = pool.submit(fleet.submit, job)
        seen, _ = first_times(submitted, {**{("copy", m): copy_probe(m) for m in MEMBERS},
                                          **{("request", m): request_probe(m) for m in MEMBERS}}, interval)
        workload = future.result()
    assert all(copies[m]["metadata"]["name"] == workload for m in MEMBERS), (workload, copies)
    sample = {"job": job, "winner": winner,
              COPIES: max(seen["copy", m] for m in MEMBERS),
              REQUESTS: max(seen["request", m] for m in MEMBERS),
              "per member": {m: {"copy": round(seen["copy", m], 4), "request": round(seen["request", m], 4)}
                             for m in MEMBERS}}

    # 2. DWS has the winner's slice (after `pause`: on GKE it comes minutes later, not during the fan-out).
    time.sleep(pause)
    (request,) = fleet.requests_in(winner, workload)
    loser_copy = copies[loser]["metadata"]["uid"]

    def loser_gone() -> bool:
        return fleet.copy_in(loser, workload) is None and not any(
            o.get("uid") == loser_copy for r in fleet.all_requests(loser) for o in r["metadata"].get(
                "ownerReferences") or [])

    def started_in_winner() -> bool:
        remote = fleet.rayjob_in(winner, job)
        return remote is not None and not jobs.suspended(remote)

    provisioned = time.monotonic()
    fleet.provision(winner, request)
    seen, _ = first_times(provisioned, {
        DISPATCH: lambda: fleet.rayjob_in(winner, job),
        STARTED: started_in_winner,
        LOSER_GONE: loser_gone,
        RECORDED: lambda: ((fleet.manager_workload(workload) or {}).get("status") or {}).get(
            "clusterName") == winner,
    }, interval)
    sample.update(seen)
    running = fleet.running_in(job)
    assert running == [winner], f"{job} runs in {running}, not only in {winner}"

    # 3. KubeRay in the winner runs the job and reports it running; the manager's RayJob should say the same.
    wait_for(lambda: ((fleet.rayjob_in(winner, job) or {}).get("status") or {}).get("jobDeploymentStatus") == "Running",
             REACTION, f"{job} Running in {winner}", interval=interval)
    running_at = time.monotonic()
    seen, _ = first_times(running_at, {MIRRORED: lambda: ((fleet.manager.get(*jobs.RAYJOB, job, FLEET_NAMESPACE) or {})
                                                          .get("status") or {}).get("jobDeploymentStatus") == "Running"},
                          interval)
    sample.update(seen)

    fleet.finish(job)
    wait_for(lambda: quiet(fleet), REACTION, f"nothing of {job} left anywhere", interval=0.2)
    return sample


# ---- scripted capacity: the fleet's ladder side by side with the DWS-only fleet ------------------------------

FREE, REPORTED, SILENT = "free", "stockout reported", "stockout not reported"


@dataclass(frozen=True)
class Script:
    """Capacity per member: its on-demand slice (free; stocked out and GKE's autoscaler says so; stocked out and
    nothing says so, so only its podsReadyTimeout tells), and the member whose DWS request provisions first."""

    name: str
    words: str
    on_demand: dict[str, str]
    dws_winner: str


SCRIPTS = (
    Script("S1", "member 1 has a free on-demand slice", {W1: FREE, W2: FREE}, W2),
    Script("S2", "member 1 stocked out (reported), member 2 has a free on-demand slice", {W1: REPORTED, W2: FREE}, W2),
    Script("S3", "no on-demand slice anywhere (both reported); DWS provisions in member 2",
           {W1: REPORTED, W2: REPORTED}, W2),
    Script("S4", "member 1 stocked out (not reported), member 2 has a free on-demand slice", {W1: SILENT, W2: FREE}, W2),
)
LADDER_STEPS = ((ON_DEMAND_W1, W1), (ON_DEMAND_W2, W2))


def _admitted_copy(fleet: FleetStacks, member: str, workload: str, queue: str) -> dict | None:
    found = fleet.copy_in(member, workload)
    if found and found["spec"].get("queueName") == queue and any(
            c["type"] == "Admitted" and c["status"] == "True" for c in (found.get("status") or {}).get("conditions") or []):
        return found
    return None


def _dws(fleet: FleetStacks, job: str, workload: str, winner: str, dws_seconds: float, started: float) -> dict:
    """Requests in every member, then the winner's provisioned `dws_seconds` after it appeared; the times."""
    times, _ = first_times(started, {("request", m): (lambda m=m: fleet.requests_in(m, workload)) for m in MEMBERS},
                           0.05)
    time.sleep(max(0.0, started + times["request", winner] + dws_seconds - time.monotonic()))
    provisioned = time.monotonic()
    fleet.provision_until_created(winner, workload, job)
    return {"requests everywhere": max(times.values()), "dispatch": time.monotonic() - provisioned}


def script_round(fleet: FleetStacks, script: Script, job: str, ladder: bool, dws_seconds: float) -> dict:
    """One job through a script on one fleet: submission -> the RayJob in the member that has the capacity, and what
    each failed step cost."""
    if ladder:  # the script's capacity, as each member's GKE has it: its on-demand pool free, or stocked out
        for member, state in script.on_demand.items():
            if state != FREE:
                fleet.stockout(member, "on-demand", reported=state == REPORTED)
    started = time.monotonic()
    workload = fleet.submit(job)
    sample: dict = {"script": script.name, "fleet": "ladder" if ladder else "DWS only", "failed steps": []}
    where = None
    if ladder:
        for step, member in LADDER_STEPS:
            wait_for(lambda: _admitted_copy(fleet, member, workload, step), REACTION + PODS_READY_TIMEOUT_SECONDS,
                     f"{job} admitted at {step}", interval=0.02)
            admitted = time.monotonic()
            wait_for(lambda: fleet.rayjob_in(member, job), REACTION, f"{job}'s RayJob in {member}", interval=0.02)
            state = script.on_demand[member]
            if state == FREE:
                where = member
                break
            if state == REPORTED:  # the member's GKE says "GCE out of resources" on the run's pods
                reported = fleet.stockout_reported(member, job)
            if step == ON_DEMAND_W1:
                wait_for(lambda: _admitted_copy(fleet, W2, workload, ON_DEMAND_W2),
                         REACTION + PODS_READY_TIMEOUT_SECONDS, f"{job} admitted at {ON_DEMAND_W2}", interval=0.02)
            else:
                wait_for(lambda: all(fleet.requests_in(m, workload) for m in MEMBERS),
                         REACTION + PODS_READY_TIMEOUT_SECONDS, f"{job}'s DWS requests", interval=0.02)
            moved = time.monotonic()
            sample["failed steps"].append(
                {"step": step, "kind": "early path" if state == REPORTED else "podsReadyTimeout",
                 "seconds": moved - (reported if state == REPORTED else admitted),
                 "over": moved - (reported + GRACE_SECONDS if state == REPORTED else admitted + NOT_READY_SECONDS)})
    if where is None:
        sample.update(_dws(fleet, job, workload, script.dws_winner, dws_seconds, started))
        where = script.dws_winner
        wait_for(lambda: fleet.rayjob_in(where, job), REACTION, f"{job}'s RayJob in {where}", interval=0.02)
    sample["runs in"] = where
    sample["to a RayJob in the member"] = time.monotonic() - started
    jobs.wait_pods_ready(fleet.kubes[where], FLEET_NAMESPACE, job, REACTION)  # the member's KubeRay runs it
    sample["to pods ready in the member"] = time.monotonic() - started
    assert fleet.running_in(job) == [where], fleet.running_in(job)
    sample["requests anywhere"] = any(fleet.all_requests(m) for m in MEMBERS)
    fleet.finish(job)
    fleet.restore()
    wait_for(lambda: quiet(fleet), REACTION, f"nothing of {job} left anywhere", interval=0.2)
    return sample


def run_scripts(fleet: FleetStacks, scripts: list[Script], rounds: int, ladder: bool, dws_seconds: float) -> list:
    samples = []
    for script in scripts:
        for number in range(rounds):
            sample = script_round(fleet, script, f"bench-{'ladder' if ladder else 'dws'}-{script.name.lower()}-"
                                                 f"{number + 1}", ladder, dws_seconds)
            samples.append(sample)
            steps = "; ".join(f"{s['step']} failed ({s['kind']}) {s['seconds']:.2f} s, +{s['over']:.2f} s over"
                              for s in sample["failed steps"])
            print(f"{sample['fleet']:>8} {script.name} round {number + 1}: RayJob in {sample['runs in']} "
                  f"{sample['to a RayJob in the member']:.2f} s after submission"
                  + (f" (DWS dispatch {sample['dispatch']:.2f} s)" if "dispatch" in sample else "")
                  + (f"; {steps}" if steps else ""), flush=True)
    return samples


def print_side_by_side(scripts: list[Script], samples: list[dict], dws_seconds: float) -> None:
    print(f"\nscripted capacity, submission -> the RayJob in the member with capacity (median of rounds; DWS "
          f"provisions {dws_seconds:.0f} s after its request, a placeholder for GKE's minutes to hours):")
    print(f"  {'script':<6} {'DWS only':>9} {'ladder':>9}  capacity")
    for script in scripts:
        row = {}
        for kind in ("DWS only", "ladder"):
            values = [s["to a RayJob in the member"] for s in samples if s["script"] == script.name
                      and s["fleet"] == kind]
            row[kind] = f"{statistics.median(values):8.2f}s" if values else "       -"
        print(f"  {script.name:<6} {row['DWS only']:>9} {row['ladder']:>9}  {script.words}")
    failed = [step for s in samples if s["fleet"] == "ladder" for step in s["failed steps"]]
    for kind, budget in (("early path", GRACE_SECONDS), ("podsReadyTimeout", NOT_READY_SECONDS)):
        over = [f["over"] for f in failed if f["kind"] == kind]
        if over:
            print(f"  failed step, {kind}: {len(over)} step(s), each {budget} s + {min(over):.2f}-{max(over):.2f} s "
                  f"(goal <= {budget} + 2 s: {'PASS' if max(over) <= 2 else 'FAIL'})")
    free = [s["to a RayJob in the member"] for s in samples if s["fleet"] == "ladder" and s["script"] == "S1"]
    if free:
        print(f"  a free on-demand slice used {max(free):.2f} s after submission at worst (goal <= 2 s: "
              f"{'PASS' if max(free) <= 2 else 'FAIL'}); DWS requests anywhere while it ran: "
              f"{any(s['requests anywhere'] for s in samples if s['fleet'] == 'ladder' and s['script'] == 'S1')}")
    dispatch = [s["dispatch"] for s in samples if "dispatch" in s]
    if dispatch:
        print(f"  DWS dispatch in the scripts (Provisioned -> the RayJob in the winner): p95 "
              f"{percentile(dispatch, 0.95):.2f} s over {len(dispatch)} (goal <= 5 s)")


def machine() -> dict:
    return {"nproc": len(os.sched_getaffinity(0)), "cpu_count": os.cpu_count(),
            "loadavg": [round(x, 2) for x in os.getloadavg()]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--interval", type=float, default=0.02, help="poll interval, seconds (20-50 ms)")
    parser.add_argument("--pause", type=float, default=1.0,
                        help="seconds between the requests in every member and the winner's Provisioned")
    parser.add_argument("--json", type=Path, help="write the raw samples here")
    parser.add_argument("--scripts", default="all",
                        help="scripted capacity on both fleets: all, none, or names such as S1,S2 (see SCRIPTS)")
    parser.add_argument("--script-rounds", type=int, default=1, help="rounds of each script on each fleet")
    parser.add_argument("--dws-seconds", type=float, default=10.0,
                        help="seconds from a DWS request to its Provisioned in the scripted member")
    args = parser.parse_args()
    poll_every(0.1)  # as the README's numbers were measured
    # A SIGTERM unwinds like Ctrl-C: the planes run in their own sessions and only the `finally` stops them.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    at_start = machine()
    print(f"machine: {at_start['nproc']} CPUs usable ({at_start['cpu_count']} online), load average at start "
          f"{' '.join(map(str, at_start['loadavg']))} (1, 5, 15 min)", flush=True)
    members = {m: member_plan(m) for m in MEMBERS}
    manager_plan = fleet_plan(members)
    tier = FleetTier(release_values(manager_plan), {m: member_values(p) for m, p in members.items()},
                     nodes_of={MANAGER: manager_plan, **members})  # real KubeRay, scheduler and pools everywhere
    print(f"starting the fleet tier in {tier.workdir} ...", flush=True)
    samples: list[dict] = []
    scripts = [] if args.scripts == "none" else [s for s in SCRIPTS if args.scripts == "all"
                                                 or s.name in args.scripts.split(",")]
    scripted: list[dict] = []
    failed = True
    try:
        tier.start()
        timings = tier.timings()
        print(f"fleet started in {timings['fleet']['wall']:.1f} s (all planes in parallel; each: "
              + ", ".join(f"{name} {t['start']:.1f} s" for name, t in timings.items() if name != "fleet") + ")",
              flush=True)
        fleet = FleetStacks(tier, manager_plan, members)
        began = time.monotonic()
        fleet.apply()
        fleet.start_watch()
        applied = time.monotonic() - began
        print(f"stacks applied (members, then the fleet; MultiKueueClusters Active) in {applied:.1f} s; "
              f"fleet watch started", flush=True)
        for number in range(args.rounds):
            winner = MEMBERS[number % len(MEMBERS)]
            sample = one_round(fleet, f"bench-fleet-{number + 1}", winner, args.interval, args.pause)
            samples.append(sample)
            print(f"round {number + 1} (winner {winner}): " + ", ".join(
                f"{label} {sample[m]:.3f}" for label, m in (("copies", COPIES), ("requests", REQUESTS),
                                                            ("dispatch", DISPATCH), ("started", STARTED),
                                                            ("loser gone", LOSER_GONE), ("recorded", RECORDED),
                                                            ("mirrored", MIRRORED))) + " s", flush=True)
        scripted += run_scripts(fleet, scripts, args.script_rounds, False, args.dws_seconds)
        failed = False
    finally:
        tier.stop(keep_workdir=failed)
        if failed:
            print(f"\nfleet tier logs kept in {tier.workdir}")
    if scripts:
        scripted += ladder_scripts(scripts, args.script_rounds, args.dws_seconds)
    at_end = machine()

    print(f"\nplan C dispatch overhead on the fleet tier (manager + {len(MEMBERS)} members on 127.0.0.1), "
          f"{len(samples)} rounds, polled every {1000 * args.interval:.0f} ms:")
    width = max(map(len, MEASURES))
    print(f"  {'measure':<{width}}  {'p50':>7}  {'p95':>7}  {'max':>7}  n")
    for measure in MEASURES:
        values = [s[measure] for s in samples]
        print(f"  {measure:<{width}}  {statistics.median(values):>6.3f}s  {percentile(values, 0.95):>6.3f}s  "
              f"{max(values):>6.3f}s  {len(values)}")
    dispatch_p95 = percentile([s[DISPATCH] for s in samples], 0.95)
    print(f"goal: dispatch overhead (Provisioned -> the RayJob in the winner) p95 {dispatch_p95:.3f} s <= "
          f"{GOAL_SECONDS:.0f} s: {'PASS' if dispatch_p95 <= GOAL_SECONDS else 'FAIL'}")
    print(f"fleet start {timings['fleet']['wall']:.1f} s, stacks applied in {applied:.1f} s; machine: "
          f"{at_start['nproc']} CPUs, load average {' '.join(map(str, at_start['loadavg']))} at start, "
          f"{' '.join(map(str, at_end['loadavg']))} at the end")
    if scripts:
        print_side_by_side(scripts, scripted, args.dws_seconds)
    if args.json:
        args.json.write_text(json.dumps({
            "scripts": scripted, "dws_seconds": args.dws_seconds,
            "machine": {"start": at_start, "end": at_end}, "fleet_start": timings, "apply_seconds": round(applied, 3),
            "interval": args.interval, "pause": args.pause, "goal_seconds": GOAL_SECONDS,
            "rounds": samples, "samples": {m: [s[m] for s in samples] for m in MEASURES},
        }, indent=2) + "\n")
        print(f"raw samples written to {args.json}")


def ladder_scripts(scripts: list[Script], rounds: int, dws_seconds: float) -> list[dict]:
    """The scripts on a fleet whose members offer their on-demand rung: a tier of its own."""
    members = {m: ladder_member_plan(m, ON_DEMAND_ONLY) for m in MEMBERS}
    print("\nstarting the ladder's fleet tier ...", flush=True)
    with applied_fleet(ladder_fleet_plan(members), members, LadderFleet, nodes=True) as fleet:
        fleet.start_ladder()
        print(f"ladder: {' -> '.join(s['localQueue'] for s in fleet.manager_plan.outputs['ladder'])}", flush=True)
        return run_scripts(fleet, scripts, rounds, True, dws_seconds)


if __name__ == "__main__":
    main()
