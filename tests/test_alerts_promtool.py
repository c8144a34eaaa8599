"""The alert policies the plans render, judged by Prometheus's own rule engine (`promtool test rules`, Prometheus
v0.316.0 built from Go modules like the tier's binaries, testbed/versions.py).

Each policy becomes one alerting rule: its PromQL condition as `expr`, its duration as `for`, evaluated every 30 s
(the PodMonitorings' scrape interval and Cloud Monitoring's evaluation). The input series are shaped as the
exporters and Managed Prometheus make them (../shared/notes/alerts-promql.md): every series carries GMP's target
labels; Kueue's labelled counters are born at their first increment and GMP drops a counter's first sample (so the
first stored value is 0, v - first); the failover controller declares its move counters at 0 when it starts; a gone
target leaves no samples (`_`: no staleness marker, as on GMP). Each case says when the alert must fire (never before
its threshold) and that a healthy or short case never fires.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
import yaml

from infra import monitoring as mon
from tests.conftest import plan_for

pytestmark = pytest.mark.controlplane  # needs a Go-built binary, like the tier (leave out with -m 'not controlplane')

ALERT_POLICY = "gcp:monitoring/alertPolicy:AlertPolicy"
STEP = mon.STEP_SECONDS
# Short thresholds (the shortest accepted is 5m) keep the evaluated spans small; the shipped ones are checked to parse.
WAITS = {"monitoring": {"alerts": {"pendingTooLong": {"onDemand": "10m", "flexStart": "20m"}}}}
CLUSTER = {"project_id": "example-project", "location": "us-east5-b", "cluster": "tpu-cluster"}
KUEUE_TARGET = {**CLUSTER, "namespace": "kueue-system", "job": "kueue-controller-manager",
                "instance": "kueue-controller-manager-5d9c7:metrics"}
CONTROLLER_TARGET = {**CLUSTER, "namespace": "tpu-fallback-system", "job": "failover-controller",
                     "instance": "failover-controller-7f6b9:metrics"}


@pytest.fixture(scope="module")
def promtool() -> str:
    from tests.conftest import _tier_unavailable_or_fail
    from testbed import build

    if "promtool" in build.missing() and shutil.which("go") is None:
        _tier_unavailable_or_fail("promtool is not built and Go is not installed")
    return str(build.build("promtool"))


def alert_name(resource_name: str) -> str:
    """`monitoring-alert-waiting-ondemand` -> `waiting_ondemand` (an alert name is a metric-like name)."""
    return resource_name.split("alert-", 1)[1].replace("-", "_")


def rules_of(plan) -> dict:
    """Each AlertPolicy of the plan as a Prometheus alerting rule: its query, its duration as `for`."""
    rules = []
    for policy in plan.of_type(ALERT_POLICY):
        (condition,) = policy.inputs["conditions"]
        promql = condition["conditionPrometheusQueryLanguage"]
        rules.append({"alert": alert_name(policy.name), "expr": promql["query"], "for": promql.get("duration", "0s")})
    return {"groups": [{"name": "tpu-fallback", "interval": f"{STEP}s", "rules": rules}]}


def series(name: str, labels: dict, values: Sequence[float | None]) -> dict:
    """One input series, one value per 30 s step from 0 (None: no sample)."""
    text = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    return {"series": f"{name}{{{text}}}",
            "values": " ".join("_" if v is None else f"{v:g}" for v in values)}


def steps(minutes: float) -> int:
    return round(minutes * 60 / STEP)


def timeline(total_minutes: float, changes: dict[float, float | None], start: float | None = 0) -> list:
    """Values per step for `total_minutes`: `start` until the first change, each change (minute -> value) from its
    minute on."""
    values, current = [], start
    for index in range(steps(total_minutes) + 1):
        minute = index * STEP / 60
        for at in sorted(changes):
            if at <= minute:
                current = changes[at]
        values.append(current)
    return values


def kueue(metric: str, queue: str, values: list, **labels: str) -> dict:
    return series(metric, {**KUEUE_TARGET, "cluster_queue": queue, "replica_role": "leader", **labels}, values)


@dataclass(frozen=True)
class Expect:
    minute: float
    alert: str
    firing: tuple[dict, ...] = ()  # the firing alerts' own labels (besides alertname); () = none firing


def case(input_series: list[dict], expectations: Sequence[Expect]) -> dict:
    return {"interval": f"{STEP}s", "input_series": input_series,
            "alert_rule_test": [{"eval_time": f"{int(e.minute * 60)}s", "alertname": e.alert,
                                 "exp_alerts": [{"exp_labels": dict(labels)} for labels in e.firing]}
                                for e in expectations]}


def check_rules(promtool: str, tmp_path, plan, name: str = "rules") -> str:
    """The plan's rules written to `<name>.yaml`, which `promtool check rules` must accept; the file's name."""
    (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(rules_of(plan), sort_keys=False))
    checked = subprocess.run([promtool, "check", "rules", f"{name}.yaml"], cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)
    assert checked.returncode == 0, (name, checked.stdout + checked.stderr)
    return f"{name}.yaml"


def run(promtool: str, tmp_path, plan, cases: list[dict]) -> None:
    check_rules(promtool, tmp_path, plan)
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(
        {"rule_files": ["rules.yaml"], "evaluation_interval": f"{STEP}s", "tests": cases}, sort_keys=False))
    result = subprocess.run([promtool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]


# ---- a job waiting too long -------------------------------------------------------------------------------------

ON_DEMAND_QUEUE, DWS_QUEUE = "cluster-queue", "cluster-queue-dws"


def test_every_shipped_stacks_rules_parse(promtool, tmp_path):
    from tests.conftest import SHIPPED_STACKS
    from tests.test_monitoring import _plan

    for stack in [*SHIPPED_STACKS, "fleet"]:
        check_rules(promtool, tmp_path, _plan(stack), stack)


def test_a_job_waiting_its_rungs_threshold_fires_then_and_never_before(promtool, tmp_path):
    """A job first seen pending at 5m (it came after the 4m30s scrape) on a 10m rung: firing from 15m, not at 14m30s;
    a pending blip of 5 minutes never fires."""
    waiting = case([kueue(mon.KUEUE_PENDING, ON_DEMAND_QUEUE, timeline(20, {5: 1}), status="active")],
                   [Expect(14.5, "waiting_ondemand"),
                    Expect(15, "waiting_ondemand", ({"cluster_queue": ON_DEMAND_QUEUE},)),
                    Expect(15, "waiting_flexstart")])
    blip = case([kueue(mon.KUEUE_PENDING, ON_DEMAND_QUEUE, timeline(30, {5: 1, 10: 0}), status="active")],
                [Expect(minute, "waiting_ondemand") for minute in (10, 15, 20, 25, 30)])
    run(promtool, tmp_path, plan_for(overrides=WAITS), [waiting, blip])


def test_a_job_arriving_just_after_an_admission_is_not_judged_twice_late(promtool, tmp_path):
    """Job A waits, is admitted at 5m; job B is first seen at 5m30s and never admitted. B has waited 10 minutes at
    15m30s: the alert fires then (counted from the admission's window, it would wait until about 25m)."""
    pending = timeline(30, {5: 0, 5.5: 1}, start=1)
    admitted = timeline(30, {2: None, 2.5: 0, 5: 1}, start=None)  # born at 1 at 2m, first sample dropped by GMP
    run(promtool, tmp_path, plan_for(overrides=WAITS), [case(
        [kueue(mon.KUEUE_PENDING, ON_DEMAND_QUEUE, pending, status="active"),
         kueue(mon.KUEUE_ADMITTED, ON_DEMAND_QUEUE, admitted)],
        [Expect(15, "waiting_ondemand"), Expect(15.5, "waiting_ondemand", ({"cluster_queue": ON_DEMAND_QUEUE},))])])


def test_a_queues_first_admission_since_kueue_started_counts(promtool, tmp_path):
    """A busy queue: a job always pending, an admission every 8 minutes from 8m, the first one creating the counter
    (born at 1, its first sample dropped). It is never stuck while it admits: no alert until 10 minutes after the
    last admission (seen at the 24m scrape), then one."""
    pending = timeline(40, {}, start=1)
    admitted = timeline(40, {8.5: 0, 16: 1, 24: 2}, start=None)
    run(promtool, tmp_path, plan_for(overrides=WAITS), [case(
        [kueue(mon.KUEUE_PENDING, ON_DEMAND_QUEUE, pending, status="active"),
         kueue(mon.KUEUE_ADMITTED, ON_DEMAND_QUEUE, admitted)],
        [*(Expect(minute, "waiting_ondemand") for minute in (10, 10.5, 12, 18, 26, 30, 33.5)),
         Expect(34, "waiting_ondemand", ({"cluster_queue": ON_DEMAND_QUEUE},))])])


def test_a_dws_wait_in_the_first_rungs_queue_is_judged_by_the_dws_threshold(promtool, tmp_path):
    """A job of the first rung's queue holds borrowed DWS quota while its ProvisioningRequest waits (reserving 1,
    nothing admitted there yet): on-demand's 10 minutes say nothing; DWS's 20 fire at 20m."""
    reserving = timeline(30, {}, start=1)
    run(promtool, tmp_path, plan_for(overrides=WAITS), [case(
        [kueue(mon.KUEUE_RESERVING, ON_DEMAND_QUEUE, reserving),
         kueue(mon.KUEUE_PENDING, ON_DEMAND_QUEUE, timeline(30, {}), status="active")],
        [Expect(15, "waiting_ondemand"), Expect(25, "waiting_ondemand"), Expect(19.5, "waiting_flexstart"),
         Expect(20, "waiting_flexstart", ({"cluster_queue": ON_DEMAND_QUEUE},))])])


def test_a_wait_that_goes_from_pending_to_its_admission_check_is_one_wait(promtool, tmp_path):
    """A job pending in the DWS queue from minute 5, then holding quota from minute 12 while its ProvisioningRequest
    waits: one wait since minute 5, so DWS's 20 minutes fire at 25m (two clocks fired at 32m)."""
    run(promtool, tmp_path, plan_for(overrides=WAITS), [case(
        [kueue(mon.KUEUE_PENDING, DWS_QUEUE, timeline(40, {5: 1, 12: 0}), status="active"),
         kueue(mon.KUEUE_RESERVING, DWS_QUEUE, timeline(40, {12: 1}))],
        [Expect(24.5, "waiting_flexstart"),
         Expect(25, "waiting_flexstart", ({"cluster_queue": DWS_QUEUE},)),
         Expect(35, "waiting_flexstart", ({"cluster_queue": DWS_QUEUE},))])])


# ---- moves ------------------------------------------------------------------------------------------------------

def moves(values: list, from_flavor: str = "on-demand", reason: str = "Stockout",
          target: dict = CONTROLLER_TARGET) -> dict:
    return series(mon.MOVES, {**target, "from_flavor": from_flavor, "to_flavor": "dws", "reason": reason}, values)


def test_any_move_fires_with_a_limit_of_zero_even_the_first_after_a_start(promtool, tmp_path):
    """movesPerHour 0: the controller declared its counters at 0 at start; the first move (at 10m) fires at once,
    and the alert resolves an hour later."""
    plan = plan_for(overrides={"monitoring": {"alerts": {"movesPerHour": 0}}})
    run(promtool, tmp_path, plan, [case([moves(timeline(80, {10: 1}))],
                                        [Expect(9.5, "moves"), Expect(10, "moves", ({"from_flavor": "on-demand"},)),
                                         Expect(69.5, "moves", ({"from_flavor": "on-demand"},)),
                                         Expect(70.5, "moves")])])


def test_exactly_the_limit_in_an_hour_does_not_fire_and_one_more_does(promtool, tmp_path):
    """movesPerHour 3 (the default): three moves in an hour never fire (increase() would read 3.03); a fourth does,
    counted across reasons and across a controller restart (a new pod: a new series declared at 0; the old pod's
    series is read for the 5 minutes GMP still returns its last sample, then its moves are no longer counted)."""
    exactly = case([moves(timeline(70, {5: 1, 10: 2, 15: 3}))],
                   [Expect(minute, "moves") for minute in (15, 30, 59.5, 65)])
    restarted = dict(CONTROLLER_TARGET, instance="failover-controller-8c1a2:metrics")
    more = case([moves(timeline(40, {5: 1, 10: 2, 27: None})),  # its pod gone at 27m
                 moves(timeline(40, {27: 0, 28: 1}, start=None), target=restarted),
                 moves(timeline(40, {30: 1}), reason="PodsReadyTimeout")],
                [Expect(29.5, "moves"), Expect(30, "moves", ({"from_flavor": "on-demand"},))])
    run(promtool, tmp_path, plan_for(), [exactly, more])


# ---- down -------------------------------------------------------------------------------------------------------

def up(values: list) -> dict:
    return series(mon.UP, CONTROLLER_TARGET, values)


def test_the_controller_down_fires_five_minutes_after_its_last_good_scrape(promtool, tmp_path):
    """Gone (no samples after 10m, as on GMP: no staleness marker): firing at 15m, not at 14m30s. Failing (up 0
    from 10m30s): the same. Back after 3 minutes: never. A pod whose first minute's scrapes fail (pip installs):
    never."""
    down = {"alertname": "failover_controller_down"}
    gone = case([up(timeline(25, {10.5: None}, start=1))],
                [Expect(14.5, down["alertname"]), Expect(15, down["alertname"], ({"job": "failover-controller",
                                                                                 "namespace": "tpu-fallback-system",
                                                                                 "cluster": "tpu-cluster",
                                                                                 "location": "us-east5-b"},))])
    failing = case([up(timeline(25, {10.5: 0}, start=1))],
                   [Expect(14.5, down["alertname"]), Expect(15, down["alertname"], ({},))])
    short = case([up(timeline(25, {10.5: None, 13: 1}, start=1))],
                 [Expect(minute, down["alertname"]) for minute in (12, 13.5, 15, 20)])
    starting = case([up(timeline(20, {0: None, 2: 0, 3: 1}, start=None))],
                    [Expect(minute, down["alertname"]) for minute in (1, 2, 3, 4, 8)])
    run(promtool, tmp_path, plan_for(), [gone, failing, short, starting])


# ---- a fleet member that does not answer ----------------------------------------------------------------------

def test_a_member_that_stops_answering_fires_after_five_minutes_of_zeros(promtool, tmp_path):
    """The fleet watch writes every member's gauge every period, jobs or none (failover/watch/ tick); a member
    answering no more from 10m30s: firing at 15m30s, not at 15m; three minutes without an answer: never."""
    from tests.test_monitoring import _plan

    target = {"project_id": "example-project", "location": "us-central1-a", "cluster": "tpu-fleet",
              "namespace": "tpu-fallback-system", "job": "fleet-watch", "instance": "fleet-watch-6c2d1:metrics"}

    def reachable(values: list) -> dict:
        return series(mon.FLEET_REACHABLE, {**target, "member": "member-us-east5-a"}, values)

    lost = case([reachable(timeline(25, {10.5: 0}, start=1))],
                [Expect(15, "member_unreachable"),
                 Expect(15.5, "member_unreachable", ({"member": "member-us-east5-a"},))])
    short = case([reachable(timeline(25, {10.5: 0, 13.5: 1}, start=1))],
                 [Expect(minute, "member_unreachable") for minute in (12, 14, 16, 20)])
    run(promtool, tmp_path, _plan("fleet"), [lost, short])


# ---- scheduling goodput -----------------------------------------------------------------------------------------

GOODPUT = {"monitoring": {"alerts": {"goodputBelow": {"percent": 50, "window": "30m"}}}}


def job_seconds(state: str, values: list, namespace: str = "team", rung: str = "on-demand") -> dict:
    """The goodput controller's counter of a namespace's job-seconds in one state (declared at 0 when the namespace
    is first seen: failover/regional/goodput.py)."""
    return series(mon.SCHEDULING_SECONDS, {**CONTROLLER_TARGET, "job_namespace": namespace, "state": state,
                                           "rung": rung}, values)


def accrued(total_minutes: float, spans: Sequence[tuple[float, float]], born: float = 0) -> list:
    """A counter from minute `born` on: 60 s a minute for each job while in the state (each span: from, until)."""
    return [None if index * STEP / 60 < born else
            60 * sum(max(0.0, min(index * STEP / 60, until) - since) for since, until in spans)
            for index in range(steps(total_minutes) + 1)]


def test_goodput_below_the_threshold_over_the_window_fires_then_and_never_before(promtool, tmp_path):
    """percent 50 over 30m. Job A runs from 0 and job B waits from 0: exactly half, no alert. A's slice breaks at
    minute 20: below half from the next scrape on, firing at 20m30s, not at 20m. A lone job waiting from minute 5
    of a new namespace fires once its time adds up to the window less a scrape (34m30s), not at 34m."""
    halves = case([job_seconds("running", accrued(40, [(0, 20)])),
                   job_seconds("broken_slice", accrued(40, [(20, 40)])),
                   job_seconds("quota_wait", accrued(40, [(0, 40)]))],
                  [Expect(10, "goodput"), Expect(19.5, "goodput"), Expect(20, "goodput"),
                   Expect(20.5, "goodput", ({"job_namespace": "team"},)),
                   Expect(40, "goodput", ({"job_namespace": "team"},))])
    lone = case([job_seconds("running", accrued(40, [], born=4), namespace="lone"),
                 job_seconds("quota_wait", accrued(40, [(5, 40)], born=4), namespace="lone")],
                [Expect(20, "goodput"), Expect(34, "goodput"),
                 Expect(34.5, "goodput", ({"job_namespace": "lone"},))])
    run(promtool, tmp_path, plan_for(overrides=GOODPUT), [halves, lone])
