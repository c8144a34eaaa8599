"""The configuration table's keys besides a regional stack's own: the training jobs' (every stack that runs them),
a fleet stack's and a team stack's (infra/settings/keys.py has the rest and the rules)."""

from __future__ import annotations

from infra.settings.constants import FLEET_CLIMB_BACK_RUNGS, MAX_SAVE_TIMEOUT_SECONDS, MIN_SAVE_TIMEOUT_SECONDS
from infra.settings.schema import (BOOLEAN, DURATION, FLEET as FLEET_STACK, INTEGER, JOBS, OBJECT, REQUIRED, STRING,
                                   STRINGS, TEAM as TEAM_STACK, Bounds, Setting)

S = Setting
_QUANTITY = "a quantity such as {example} that fits one {host}"

WORKLOADS = S("workloads", OBJECT, "The training RayJobs (workloads/).", stacks=JOBS, fields=(
    S("enabled", BOOLEAN, "false declares none (a platform only)", True),
    S("jobs", INTEGER, "how many (the seed submits two: the first lands on plan A, the second falls back to plan B)",
      2, bounds=Bounds(0, 50)),
    S("namespace", STRING, "where they run (a LocalQueue is made there)", "default",
      rule="a Kubernetes namespace name"),
    S("namePrefix", STRING, "jobs are <prefix>-1..N (empty: rayjob-tpu-<generation>-<topology>, e.g. "
                            "rayjob-tpu-v5e-4x4)", "", rule="job names that are DNS labels of at most 40 characters"),
    S("headCpu", STRING, "CPU request per Ray head", "2",
      rule=_QUANTITY.format(example="2 or 500m", host="systemPool node")),
    S("headMemory", STRING, "memory request per Ray head", "4Gi",
      rule=_QUANTITY.format(example="4Gi or 512Mi", host="systemPool node")),
    S("workerCpu", STRING, "CPU request per TPU host", "8", rule=_QUANTITY.format(example="8", host="TPU VM")),
    S("workerMemory", STRING, "memory request per TPU host", "16Gi",
      rule=_QUANTITY.format(example="16Gi", host="TPU VM")),
    S("checkpointEvery", INTEGER, "steps between checkpoints: a slice lost without notice costs up to this many (with "
                                  "GKE's termination notice the workers' preStop hook has them save the step they "
                                  "reached)", 100, bounds=Bounds(1, 100_000)),
    S("trainingArgs", STRINGS, "flags for workloads/train.py (the default trains a ~100M-parameter model in bf16, "
                               "real matmul work for a slice, still quick to compile)",
      ["--steps", "500", "--dtype", "bfloat16", "--lr", "1e-3", "--vocab", "8192", "--seq-len", "1024",
       "--d-model", "1024", "--layers", "8", "--heads", "16", "--batch-size", "256"],
      rule="flags train.py knows, none it derives from the platform (slice, bucket, job name, --checkpoint-every); "
           "--batch-size a multiple of the slice's JAX devices (its chips; twice as many on TPU7x)"),
    S("maxRunDuration", INTEGER, "seconds a DWS request may run (plan B: DWS nodes run for up to seven days)", 86400,
      bounds=Bounds(1, 7 * 24 * 3600)),
    S("backoffLimit", INTEGER, "RayJob retries, each resuming from the checkpoint", 2, bounds=Bounds(1, 10)),
    S("rayImageRepository", STRING, "where the pinned Ray image comes from (Docker Hub's by default, or the "
                                    "mirror of an air-gapped cluster)", "rayproject/ray",
      rule="registry/path with no tag: the tag is the Ray pin"),
))



# A climb's waits (fallback.climbBack, fleet.climbBack): each one's range and default, written here once. The lows
# are the test bed's clock; the defaults GKE's: a freed slice's nodes stay about 10 min, so a 5 min settle still sees
# an idle on-demand or Spot slice; a climb costs a restart from the checkpoint, so one an hour at most, and none in a
# job's first 10 min on a rung.
_CLIMB_WAITS = {"settle": (Bounds(1, 24 * 3600, duration=True), "5m"),
                "minInterval": (Bounds(60, 7 * 24 * 3600, duration=True), "1h"),
                "minRuntime": (Bounds(0, 24 * 3600, duration=True), "10m"),
                "runEndMargin": (Bounds(0, 24 * 3600, duration=True), "30m")}


def climb_wait(name: str, description: str) -> Setting:
    """A climb's wait (fallback.climbBack, fleet.climbBack), with its range and default."""
    bounds, default = _CLIMB_WAITS[name]
    return S(name, DURATION, description, default, bounds=bounds)


def save_timeout(description: str) -> Setting:
    """How long after a checkpoint request the save is taken as done (fallback.maintenance.saveTimeout, and
    fleet.climbBack.saveTimeout, as a fleet stack has no fallback), with its range and default."""
    return S("saveTimeout", DURATION, description, "2m",
             bounds=Bounds(MIN_SAVE_TIMEOUT_SECONDS, MAX_SAVE_TIMEOUT_SECONDS, duration=True))


# Climbing back in a fleet (failover/ladder/climb.py): the regional key's waits, and the save's wait a fleet has no
# fallback.maintenance for; onto a member's reservation only, the one rung whose free quota alone shows a free slice
# (the ladder reads no nodes in a member).
_FLEET_CLIMB_BACK = S(
    "climbBack", OBJECT, "a fleet job running at a step below the ladder's first moves back up to an earlier step "
                         "whose rung is named in `to` once that member's quota has had room for it for `settle` "
                         "(no capacity failure there meanwhile); it is asked to checkpoint first (its TPU pods in "
                         "the member running it) and moves `saveTimeout` later by route D (docs/fleet.md "
                         "\"Climbing back\"; fields merged over these defaults)", fields=(
        S("to", STRINGS, "the rungs a fleet job may climb back to (empty: never climb)", list(FLEET_CLIMB_BACK_RUNGS),
          rule=f"{', '.join(FLEET_CLIMB_BACK_RUNGS)}, each once: a rung whose free quota is a free slice"),
        climb_wait("settle", "how long the step's member must have had room for the job, and no capacity failure "
                             "there, before it climbs"),
        climb_wait("minInterval", "at most one climb per job in this long"),
        climb_wait("minRuntime", "no climb in a job's first this long at a step"),
        climb_wait("runEndMargin", "no climb for a DWS run (the last step) that ends within this long"),
        save_timeout("how long after the checkpoint request the save is taken as done (the job cannot answer): the "
                     "kubelet's refresh of the pods' annotations file (up to 1 min), the step in progress and the "
                     "save")))

FLEET = S("fleet", OBJECT, "Makes this stack a fleet (plan C, roles/fleet.py): one queue over the member stacks, Kueue "
                           "MultiKueue on a small manager cluster. A fleet stack also reads zone, clusterName, "
                           "gkeVersion, deletionProtection, systemPool, kueue, failoverController, monitoring and "
                           "workloads.", stacks=FLEET_STACK, fields=(
    S("members", STRINGS, "the member stacks, each with fleetMember enabled", [],
      rule="2 to 20 stacks, <organization>/<project>/<stack>, each once; a stack name is a DNS label"),
    S("dispatcher", STRING, "how MultiKueue dispatches a job: to every member at once, or to a few at a time",
      "AllAtOnce", choices=("AllAtOnce", "Incremental")),
    S("workerLostTimeout", DURATION, "how long the manager waits for a member that stopped answering before it "
                                     "dispatches the member's jobs again (Kueue's default: shorter re-dispatches "
                                     "sooner, but makes two runs at once likelier after a short partition)", "15m",
      bounds=Bounds(10, 24 * 3600, duration=True)),
    S("checkpointLocation", STRING, "where the fleet's one checkpoint bucket is (empty: the first member's region)",
      "", rule="a Cloud Storage location such as US, EU or us-east5"),
    S("memberOrder", STRINGS, "the members again, in the order a rung's steps are tried (empty: the members' order)",
      [], rule="each member once"),
    S("rungOrder", STRINGS, "the order the fleet's ladder tries the members' rungs (empty: reservation, onDemand, "
                            "spot), DWS everywhere always being the last step", [],
      rule="reservation, onDemand, spot, each once"),
    S("stepWait", DURATION, "how long a job waits at a busy step of the fleet's ladder (a free reservation or "
                            "on-demand slice admits within a second)", "30s", bounds=Bounds(5, 3600, duration=True)),
    S("maxWait", DURATION, "how long a job may wait with no member admitting it before it is given up (empty: never)",
      "", bounds=Bounds(60, 720 * 3600, duration=True)),
    _FLEET_CLIMB_BACK,
))

PLATFORM_STACK = S("platformStack", STRING, "Makes this stack a team stack (roles/team.py): the platform stack whose "
                                            "cluster the team uses.", REQUIRED, stacks=TEAM_STACK,
                   rule="<organization>/<project>/<stack>, another stack")
TEAM = S("team", STRING, "The team (of the platform stack's teams) a team stack deploys for.", REQUIRED,
         stacks=TEAM_STACK, rule="a team name")
