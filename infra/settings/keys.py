"""The configuration table: every `tpu-fallback:` key the program reads, with its one default, type, range and
description.

This is the only place a key's default is written. The readers merge a stack's values over `DEFAULTS` (and the
workloads' and the fleet's over theirs, below); Pulumi.yaml's `config:` block and docs/configuration.md are rendered
from this table by `python -m infra.settings.table --write`, and tests/test_settings_table.py fails when either
file, or a reader's checks, disagree with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infra.rungs import FLEX_START, ON_DEMAND, RUNG_KINDS, SPOT, RungKind
from infra.settings.constants import (DEFAULT_RUNG, MAX_GOODPUT_WINDOW_SECONDS, MAX_MOVES_PER_HOUR,
                                      MAX_PENDING_ALERT_SECONDS, MIN_GOODPUT_WINDOW_SECONDS,
                                      MAX_PODS_READY_TIMEOUT_SECONDS, MAX_RECOVERY_WAIT_SECONDS,
                                      MAX_SLICES_PER_PLAN, MAX_SYSTEM_NODES, MIN_GKE_FOR_QUEUED_TPU,
                                      MIN_GKE_FOR_RAY_OPERATOR, MIN_GKE_FOR_SPOT_GRACE, MIN_KUEUE_VERSION,
                                      MIN_PENDING_ALERT_SECONDS, MIN_PODS_READY_TIMEOUT_SECONDS,
                                      MIN_RECOVERY_WAIT_SECONDS, MIN_SYSTEM_NODES, SHARE_ORDERS,
                                      SPOT_CRITICAL_PODS_SECONDS, SPOT_GRACE_CHOICES, SPOT_GRACE_SECONDS,
                                      SYSTEM_NAMESPACE_PREFIXES, SYSTEM_NAMESPACES)
from infra.settings.constants import (CLIMB_BACK_RUNGS, MAINTENANCE_ACTIONS, MAX_MAINTENANCE_LEAD_SECONDS,
                                      MIN_MAINTENANCE_LEAD_SECONDS)
from infra.settings.keys_roles import FLEET, PLATFORM_STACK, TEAM, WORKLOADS, climb_wait, save_timeout
from infra.settings.schema import (BOOLEAN, DURATION, INTEGER, OBJECT, OBJECTS, PER_RUNG, REQUIRED, STRING,
                                   STRINGS, UNSET, REGION, Bounds, Setting)
from infra.tpu import MACHINE_TYPES

S = Setting
_RUNGS = ", ".join(RUNG_KINDS)
_NODE_POOL_RULE = ("a GKE node pool name (lowercase letters, digits, hyphens; starts with a letter), at most 40 "
                   "characters with its -N suffix; unique across rungs, and not default-pool")
_SLICES = Bounds(0, MAX_SLICES_PER_PLAN)


def _plan(kind: RungKind, description: str, max_slices: int, *more: Setting) -> Setting:
    """An on-demand, Spot or DWS rung: its pools' name and how many slices it may hold (and its own fields)."""
    return S(kind.key, OBJECT, description, fields=(
        S("nodePool", STRING, "the rung's node pool (suffixed -1..-N for N multi-host slices)",
          kind.default_node_pool, rule=_NODE_POOL_RULE),
        S("maxSlices", INTEGER, "the most slices the rung holds at once, 0 to turn it off (at least one rung must "
                                "be on)", max_slices, bounds=_SLICES), *more))


_SPOT_GRACE = S(
    "gracefulTermination", DURATION,
    f"how long a Spot VM shuts down gracefully after GKE's preemption notice: {SPOT_GRACE_SECONDS}s, GKE's default "
    f"(the pods {SPOT_GRACE_SECONDS - SPOT_CRITICAL_PODS_SECONDS} s, then the system pods "
    f"{SPOT_CRITICAL_PODS_SECONDS} s), or {SPOT_GRACE_CHOICES[-1]}s through the pools' node system config (the pods "
    f"{SPOT_GRACE_CHOICES[-1] - SPOT_CRITICAL_PODS_SECONDS} s). The TPU workers' preStop hook and "
    "terminationGracePeriodSeconds follow the pods' part (docs/disruptions.md)", f"{SPOT_GRACE_SECONDS}s",
    choices=tuple(f"{seconds}s" for seconds in SPOT_GRACE_CHOICES),
    rule=f"{SPOT_GRACE_CHOICES[-1]}s needs gkeVersion {MIN_GKE_FOR_SPOT_GRACE} or later while the rung is on")


# On by default, onto a reservation only: its slices are paid for whether used or not, and held by GCE for the
# project, so a job on Spot, DWS or on-demand below it gains the most and risks the least (docs/ladder-and-failover.md
# "Climbing back").
_CLIMB_BACK = S(
    "climbBack", OBJECT, "a running job below its ladder's first rung moves back up to a rung named in `to` once that "
                         "rung has had a free slice for it for `settle` (its quota free in Kueue and, except on a "
                         "reservation, an idle slice of its own nodes; no stockout there meanwhile); it is asked to "
                         "checkpoint first and moves fallback.maintenance.saveTimeout later, by the same route as a "
                         "move down (docs/ladder-and-failover.md; fields merged over these defaults)", fields=(
        S("to", STRINGS, "the rungs a running job may climb back to (empty: never; a job that waits below a rung, "
                         "holding no quota or a DWS request not yet provisioned, goes back up to any rung above it "
                         "with a free slice whatever this says: it has nothing to lose)", ["reservation"],
          rule=f"rung config keys without an admission check ({', '.join(CLIMB_BACK_RUNGS)}), each once; one that is "
               "off in this stack is skipped"),
        climb_wait("settle", "how long the rung must have had a free slice for the job, and no stockout, before it "
                              "climbs"),
        climb_wait("minInterval", "at most one climb per job in this long"),
        climb_wait("minRuntime", "no climb in a job's first this long on a rung"),
        climb_wait("runEndMargin", "no climb for a DWS run that ends within this long (its end is a disruption "
                                    "ahead: fallback.maintenance)"),
        S("probe", BOOLEAN, "while a job waits below a rung whose quota is free for it but that has no slice (a "
                            "stockout, or nothing asked for it since), keep one pending pod shaped like a host of "
                            "the slice on that rung, so the autoscaler keeps trying it; once placed, the probe goes "
                            "and the job climbs onto the new slice (not for a reservation, whose quota is its "
                            "capacity, nor DWS)", True)))

_ROUTES = (
    S("zone", STRING, "Zone of the zonal cluster and of every pool; the region is derived from it.", "us-east5-b",
      rule="a zone such as us-east5-b that offers the TPU generation (and flex-start, with flexStart on) per "
           "infra/tpu.py, unless tpu.allowUnlistedZone"),
    S("clusterName", STRING, "GKE cluster name.", "tpu-cluster",
      rule="1-40 lowercase letters, digits or hyphens; starts with a letter, ends alphanumeric"),
    S("gkeVersion", STRING, "Minimum master version; TPU flex-start with queued provisioning (plan B) needs "
                            f"{MIN_GKE_FOR_QUEUED_TPU} or later.", "1.34",
      rule=f"a GKE version such as 1.34 or 1.34.1-gke.1829001, at least {MIN_GKE_FOR_RAY_OPERATOR} (the Ray Operator "
           f"add-on) and the TPU generation's minimum; {MIN_GKE_FOR_QUEUED_TPU} or later with flexStart on"),
    S("deletionProtection", BOOLEAN, "GKE deletion protection. pulumi-gcp defaults it to true, which makes "
                                     "`pulumi destroy` fail.", False),
    S("systemPool", OBJECT, "The cluster's CPU pool, named default-pool (Kueue, the Ray heads).", fields=(
        S("machineType", STRING, "its machine type", "n2-standard-16",
          rule="a predefined n2, n2d, e2, c3 or n4 shape, <family>-<standard|highmem|highcpu>-<vCPUs>"),
        S("nodeCount", INTEGER, "its nodes", 3, bounds=Bounds(MIN_SYSTEM_NODES, MAX_SYSTEM_NODES)))),
    S("tpu", OBJECT, "The slice shape every rung shares (infra/tpu.py: v6e, v5e, v5p, TPU7x).", fields=(
        S("machineType", STRING, "the TPU VM's machine type", "ct6e-standard-4t", choices=tuple(MACHINE_TYPES)),
        S("topology", STRING, "the slice's topology", "4x4",
          rule="one the machine type offers (infra/tpu.py); a multi-host TPU7x slice gets a workload policy"),
        S("allowUnlistedZone", BOOLEAN, "accept a zone the catalogue does not list yet", False))),
    S("reservation", OBJECT, "Rung: TPUs you reserved (DWS calendar mode included), tried first by default; its pools "
                             "consume them with SPECIFIC_RESERVATION. Off while the list is empty.", fields=(
        S("nodePool", STRING, "the rung's node pool (suffixed -1..-N when there are several)",
          RUNG_KINDS["reservation"].default_node_pool, rule=_NODE_POOL_RULE),
        S("reservations", OBJECTS, "the reservations the rung consumes", [],
          rule=f"each once, at most {MAX_SLICES_PER_PLAN} slices in all", fields=(
              S("name", STRING, "a reservation in this project, or projects/<project>/reservations/<name> for a "
                                "shared one", REQUIRED),
              S("slices", INTEGER, "the reservation's size in slices (its Kueue quota)", REQUIRED,
                bounds=Bounds(1, MAX_SLICES_PER_PLAN)))))),
    _plan(ON_DEMAND, "Plan A: on-demand TPUs.", 1),
    _plan(SPOT, "Rung: Spot TPUs (cheaper, interruptible; preemptible quota). Its pools are tainted "
                "cloud.google.com/gke-spot=true:NoSchedule, tolerated through the Kueue flavor.", 0, _SPOT_GRACE),
    _plan(FLEX_START, "Plan B: DWS flex-start with queued provisioning, used when plan A's quota is taken.", 1),
    S("rungOrder", STRINGS, "The order Kueue and the failover controller try the enabled rungs, e.g. [reservation, "
                            "onDemand, spot, flexStart]; empty: that catalogue order.", [],
      rule=f"exactly the enabled rungs ({_RUNGS}), each once"),
    S("kueue", OBJECT, "The Kueue Helm chart and where it comes from.", fields=(
        S("version", STRING, "the chart's version (no leading v)", "0.19.2",
          rule=f"{'.'.join(map(str, MIN_KUEUE_VERSION))} or later, the first that stores v1beta2"),
        S("chartRepository", STRING, "its repository (a mirror for air-gapped clusters)",
          "oci://registry.k8s.io/kueue/charts", rule="oci://host/path or https://host/path"))),
)

_CONTROLLERS = (
    S("fallback", OBJECT, "When a job counts as stocked out on a rung, or as having lost its slice.", fields=(
        S("podsReadyTimeout", DURATION, "Kueue's waitForPodsReady timeout: a job whose pods are not all ready this "
                                        "long after admission is evicted and requeued (a RayJob's start on GKE takes "
                                        "minutes)", "15m",
          bounds=Bounds(MIN_PODS_READY_TIMEOUT_SECONDS, MAX_PODS_READY_TIMEOUT_SECONDS, duration=True)),
        # Short: once GKE's autoscaler reports a failed scale-up, it backs the node pool off (upstream: 5m, doubling
        # to 30m) and does not retry it meanwhile, so a longer grace only delays the next rung's ask (the goodput
        # bench: docs/goodput.md). Ref: https://github.com/kubernetes/autoscaler/blob/master/cluster-autoscaler/FAQ.md
        S("stockoutGracePeriod", DURATION, "how long a failover controller waits before acting on clear stockout "
                                           "signs", "30s", rule="0s up to, not including, podsReadyTimeout"),
        S("sliceRecoveryWait", PER_RUNG, f"per rung config key ({_RUNGS}) or {DEFAULT_RUNG}, how long a running job "
                                         "that lost its slice (a Spot preemption, a failed host, a maintenance, the "
                                         "end of a DWS run) waits for it to be whole again before the failover "
                                         "controller moves it to the next rung, or requeues it on the last (the "
                                         "given entries are merged over the defaults)",
          {DEFAULT_RUNG: "10m", "spot": "2m", "flexStart": "2m"},
          bounds=Bounds(MIN_RECOVERY_WAIT_SECONDS, MAX_RECOVERY_WAIT_SECONDS, duration=True)),
        S("maintenance", OBJECT, "a disruption of a running job's slice seen coming: a TPU host's scheduled "
                                 "maintenance (GKE's node label cloud.google.com/scheduled-maintenance-time) or the "
                                 "end of a DWS run (its start plus workloads.maxRunDuration); the window itself is a "
                                 "lost slice (sliceRecoveryWait), whatever the action (docs/disruptions.md; fields "
                                 "merged over these defaults)", fields=(
            S("action", STRING, "checkpoint: ask the job to save the step it reached leadTime ahead (an annotation "
                                "its TPU pods read, no new rights for the job); move: that, then, saveTimeout later "
                                "and before the disruption, move it to another rung without a check (reservation, "
                                "onDemand, spot) whose ClusterQueue has free quota for it; none: only record it "
                                "(ops status, an Event, a metric)", MAINTENANCE_ACTIONS[0],
              choices=MAINTENANCE_ACTIONS),
            S("leadTime", DURATION, "how long before the disruption the job is asked to checkpoint", "15m",
              bounds=Bounds(MIN_MAINTENANCE_LEAD_SECONDS, MAX_MAINTENANCE_LEAD_SECONDS, duration=True),
              rule="longer than saveTimeout"),
            save_timeout("how long after the request the save is taken as done (the job cannot answer without new "
                         "rights): the kubelet's refresh of the pods' annotations file (up to 1 min), the step in "
                         "progress and the save"))),
        _CLIMB_BACK)),
    S("failoverController", OBJECT, "Where the failover controller's pinned Python packages come from. Default (both "
                                    "empty): PyPI, at each start. Not both.", fields=(
        S("image", STRING, "a prebuilt image that has the pins (failover/Dockerfile): nothing is installed at start",
          "", rule="pinned by tag or digest, never :latest"),
        S("pipIndexUrl", STRING, "an index mirror instead of PyPI", "", rule="an https:// URL"))),
    S("monitoring", OBJECT, "Metrics: GKE Managed Service for Prometheus on the cluster, PodMonitorings that scrape "
                            "Kueue and the failover controller (a fleet's manager: Kueue and the fleet watch), a Cloud "
                            "Monitoring dashboard and alert policies (infra/monitoring.py).", fields=(
        S("enabled", BOOLEAN, "false declares none of them and leaves the cluster's monitoring to GKE's defaults",
          True),
        S("alerts", OBJECT, "the alert policies (fields merged over these defaults)", fields=(
            S("enabled", BOOLEAN, "false declares no alert policy", True),
            S("pendingTooLong", PER_RUNG, f"per rung config key ({_RUNGS}) or {DEFAULT_RUNG}, how long a job may "
                                          "wait on that rung (pending, or holding quota while DWS or MultiKueue has "
                                          "not admitted it) with nothing admitted there before an alert (a fleet's "
                                          f"manager uses {DEFAULT_RUNG})", {DEFAULT_RUNG: "1h", "flexStart": "6h"},
              bounds=Bounds(MIN_PENDING_ALERT_SECONDS, MAX_PENDING_ALERT_SECONDS, duration=True)),
            S("movesPerHour", INTEGER, "the failover controller's moves down the ladder from one rung in an hour above "
                                       "which an alert fires (a stockout)", 3, bounds=Bounds(0, MAX_MOVES_PER_HOUR)),
            S("goodputBelow", OBJECT, "an alert when the jobs of a namespace ran on a whole slice less than `percent` "
                                      "of their time over the last `window` (their scheduling goodput, "
                                      "docs/goodput.md), once that time adds up to a window at least (the failover "
                                      "controller's metrics; fields merged over these defaults)", fields=(
                S("percent", INTEGER, "the threshold, 0 to turn the alert off", 50, bounds=Bounds(0, 100)),
                S("window", DURATION, "the window the share is taken over", "6h",
                  bounds=Bounds(MIN_GOODPUT_WINDOW_SECONDS, MAX_GOODPUT_WINDOW_SECONDS, duration=True)))),
            S("notificationChannels", STRINGS, "the Cloud Monitoring channels every policy notifies (none: incidents "
                                               "in the console only)", [],
              rule="projects/<project>/notificationChannels/<id>, each once"))))),
)

_TEAMS = (
    S("teams", OBJECTS, "Teams sharing this cluster (a platform stack; empty: one team, the single chain).", [],
      rule="each name and namespace once; a rung's shares add up to at most its slices, and the teams' Ray heads "
           "(one per guaranteed slice) fit in systemPool", fields=(
          S("name", STRING, "prefixes its ClusterQueues and Cohort", REQUIRED,
            rule="1-30 lowercase letters, digits, hyphens; starts with a letter"),
          S("namespace", STRING, "its own namespace", REQUIRED,
            rule=f"a DNS label, no system namespace ({', '.join(sorted(SYSTEM_NAMESPACES))}, "
                 f"{'*, '.join(SYSTEM_NAMESPACE_PREFIXES)}*)"),
          S("groups", STRINGS, "Google group emails bound to the ClusterRole edit there", REQUIRED,
            rule="at least one, each once"),
          S("shares", OBJECT, "guaranteed slices per guaranteed rung, {reservation, onDemand}", REQUIRED,
            rule=f"0 to {MAX_SLICES_PER_PLAN} per rung"),
          S("borrowingLimit", INTEGER, "slices the team may use beyond its share on each rung (unset: no limit)",
            UNSET, bounds=_SLICES),
          S("lendingLimit", INTEGER, "slices of each share others may borrow (unset: all)", UNSET, bounds=_SLICES,
            rule="at most the team's smallest share"))),
    S("teamShareOrder", STRING, "With teams only: how a team's job takes its shares. ladder: in the ladder's order "
                                "(rungOrder), reclaiming a share lent to another team before going down to its next "
                                "rung, and borrowing only when no share of its own can serve it (a reservation is "
                                "paid for whether used or not). freeFirst: a free share of its own on any rung before "
                                "a reclaim (fewer restarts of borrowers, more cost).", SHARE_ORDERS[0],
      choices=SHARE_ORDERS),
    S("googleGroupsDomain", STRING, "Required with teams, only then: the domain whose gke-security-groups@<domain> "
                                    "group holds the teams' groups (GKE Google Groups for RBAC, set on the cluster).",
      "", rule="a domain such as example.com"),
    S("fleetMember", OBJECT, "Plan C: this regional stack as a member of a fleet (a stack with tpu-fallback:fleet, "
                             "roles/fleet.py). Not with teams.", fields=(
        S("enabled", BOOLEAN, "declare the fleet's LocalQueue (namespace tpu-fleet, fleet-queue) and a ClusterRole "
                              "with MultiKueue's worker RBAC (the fleet binds it to its manager's Google service "
                              "account; no token is made here), and publish fleetMember (queue, capacity, endpoint "
                              "and CA)", False),
        S("startRung", STRING, "where fleet jobs start here (flexStart: admitted once DWS has provisioned a slice, "
                               "so the first region with TPUs wins)", FLEX_START.key, rule="an enabled rung"),
        S("rungs", STRINGS, "the rungs besides startRung the fleet may use here one member at a time, each a step of "
                            "the fleet's ladder before DWS everywhere (empty: DWS only)", [],
          rule="enabled rungs without an admission check (reservation, onDemand, spot), each once"))),
)

KEYS: tuple[Setting, ...] = (*_ROUTES, *_CONTROLLERS, *_TEAMS, WORKLOADS, FLEET, PLATFORM_STACK, TEAM)
BY_NAME: Mapping[str, Setting] = {key.name: key for key in KEYS}

# The defaults of every key a regional stack owns (a team or fleet stack refuses them when they differ). Object keys
# are merged field by field, so a stack file sets only the fields it changes.
DEFAULTS: Mapping[str, Any] = {key.name: key.value for key in KEYS if key.stacks == REGION}


def key_default(name: str) -> Any:
    """A key's default as its reader merges over it (e.g. workloads/settings.py WORKLOAD_DEFAULTS)."""
    return BY_NAME[name].value


def setting(path: str) -> Setting:
    """The table's entry of a dotted path such as fallback.sliceRecoveryWait or teams[].name."""
    for key in KEYS:
        for found, entry in key.walk():
            if found == path:
                return entry
    raise KeyError(path)
