"""failover/config.py: each program's configuration comes back from its environment as the stack wrote it, and a
variable that is missing or malformed is refused with its name."""

from __future__ import annotations

import datetime
import subprocess
import sys
from pathlib import Path

import pytest

from failover.api import Chain, Ladder, Rung, Step
from failover.api.climbs import ClimbPolicy
from failover.api.probes import Probes, ProbeShape
from failover.maintenance import Policy
from failover.config import (ConfigError, FleetRenewerConfig, FleetWatchConfig, LadderConfig, MemberAccess,
                             RegionalConfig, ScrapeRenewerConfig, renewer_config)
from infra import failover as stack_failover
from infra import fleet as stack_fleet
from tests.conftest import plan_for

REPO = Path(__file__).resolve().parent.parent
SECONDS = datetime.timedelta(seconds=1)

REGIONAL = RegionalConfig(
    Chain((Rung("on-demand", "cluster-queue", "user-queue", False, 600),
           Rung("dws", "cluster-queue-dws", "user-queue-dws", True, 120))),
    180 * SECONDS, 300 * SECONDS, 4, 8080, 9090, Policy("move", 900 * SECONDS, 120 * SECONDS),
    ClimbPolicy(("on-demand",), (), 300 * SECONDS, 3600 * SECONDS, 600 * SECONDS, 1800 * SECONDS, 120 * SECONDS),
    Probes("tpu-fallback-system", "registry.k8s.io/pause:3.10", (
        ProbeShape("on-demand", {"tpu-fallback/capacity": "on-demand"},
                   ({"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"},), 4),)))
WATCH = FleetWatchConfig({"w1": "w1-kubeconfig", "w2": "w2-kubeconfig"}, "tpu-fallback-fleet", "kueue-system",
                         10 * SECONDS, 300 * SECONDS, 8080, 9090)
LADDER = LadderConfig(
    Ladder((Step("fleet-on-demand-w1", "fleet-on-demand-w1", "fleet-on-demand-w1", ("w1",), "onDemand", 180 * SECONDS,
                 900 * SECONDS),
            Step("fleet-queue", "fleet-cluster-queue", "fleet-multikueue", ("w1", "w2"), ""))),
    "tpu-fleet", 30 * SECONDS, 6 * 3600 * SECONDS, {"w1": "w1-kubeconfig", "w2": "w2-kubeconfig"}, "kueue-system",
    10 * SECONDS, 60 * SECONDS, 2, 8080, 9090,
    ClimbPolicy(("reservation",), ("reservation",), 300 * SECONDS, 3600 * SECONDS, 600 * SECONDS, 1800 * SECONDS,
                120 * SECONDS))
FLEET_RENEWER = FleetRenewerConfig({"w1": MemberAccess("w1-kubeconfig", "https://203.0.113.1", "Q0Ex")},
                                   "kueue-system")
SCRAPE_RENEWER = ScrapeRenewerConfig(("kueue-system", "kueue-reader"), ("kueue-system", "scrape-token"),
                                     3600 * SECONDS)
CONFIGS = [REGIONAL, WATCH, LADDER, FLEET_RENEWER, SCRAPE_RENEWER]


def environ(config) -> dict[str, str]:
    return {item["name"]: item["value"] for item in config.to_env()}


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: type(c).__name__)
def test_a_program_reads_back_what_the_stack_wrote(config):
    assert type(config).from_env(environ(config)) == config


def test_the_ladder_s_maximum_wait_is_the_one_variable_that_may_be_left_out():
    unbounded = LadderConfig(*[None if name == "max_wait" else getattr(LADDER, name)
                               for name in LADDER.__dataclass_fields__])
    assert "FLEET_MAX_WAIT_SECONDS" not in environ(unbounded)
    assert LadderConfig.from_env(environ(unbounded)).max_wait is None


def test_the_renewer_s_job_follows_from_its_variables():
    assert renewer_config(environ(FLEET_RENEWER)) == FLEET_RENEWER
    assert renewer_config(environ(SCRAPE_RENEWER)) == SCRAPE_RENEWER


@pytest.mark.parametrize("config, name", [(config, item["name"]) for config in CONFIGS for item in config.to_env()
                                          if item["name"] != "FLEET_MAX_WAIT_SECONDS"],
                         ids=lambda value: value if isinstance(value, str) else type(value).__name__)
def test_a_missing_variable_is_refused_by_its_name(config, name):
    without = {key: value for key, value in environ(config).items() if key != name}
    with pytest.raises(ConfigError) as refused:
        type(config).from_env(without)
    assert refused.value.name == name and "missing" in str(refused.value)


MALFORMED = {
    "FAILOVER_CHAIN": ['[{"flavor": "spot"}]', "[]", "{", '[{"flavor": "spot", "clusterQueue": "cq", "localQueue": '
                       '"lq", "admissionCheck": false}]'],  # the slice-recovery wait has no default in the program
    "FAILOVER_GRACE_SECONDS": ["3m", "-1"],
    "FAILOVER_RESYNC_SECONDS": ["0", "soon"],
    "FAILOVER_WORKERS": ["0", "four"],
    "FAILOVER_HEALTH_PORT": ["70000", "http"],
    "FAILOVER_METRICS_PORT": ["-1"],
    "FAILOVER_MAINTENANCE_ACTION": ["drain", ""],
    "FAILOVER_MAINTENANCE_LEAD_SECONDS": ["0", "15m"],
    "FAILOVER_SAVE_TIMEOUT_SECONDS": ["-5"],
    "FAILOVER_CLIMB_BACK": ['{"to": "on-demand"}', '{"to": [], "reserved": [], "settleSeconds": -1, '
                            '"minIntervalSeconds": 0, "minRuntimeSeconds": 0, "runEndMarginSeconds": 0, '
                            '"saveTimeoutSeconds": 0}'],
    "FAILOVER_PROBES": ['{"namespace": "", "image": "pause", "rungs": []}', '{"namespace": "n", "image": "pause", '
                        '"rungs": [{"flavor": "spot", "nodeSelector": {}, "tolerations": [], "tpuChips": 0}]}'],
    "FLEET_CLIMB_BACK": ['{"to": ["reservation"]}', '{"to": ["reservation"], "reserved": ["reservation"], '
                         '"settleSeconds": true, "minIntervalSeconds": 0, "minRuntimeSeconds": 0, '
                         '"runEndMarginSeconds": 0, "saveTimeoutSeconds": 0}'],
    "FLEET_MEMBERS": ['["w1"]', '{"w1": 1}'],
    "FLEET_WATCH_SECONDS": ["0"],
    "FLEET_RESYNC_SECONDS": ["nan"],
    "FLEET_LADDER": ['[{"localQueue": "q"}]', "[]", '[{"localQueue": "q", "clusterQueue": "q", "admissionCheck": '
                     '"c", "rung": "", "members": "w1"}]'],
    "FLEET_STEP_WAIT_SECONDS": ["30s"],
    "FLEET_MAX_WAIT_SECONDS": ["", "6h"],
    "LADDER_WORKERS": ["2.5"],
    "FLEET_ACCESS": ["{}", '{"w1": {"secret": "s"}}'],
    "SCRAPE_SECRET": ["scrape-token", "kueue-system/"],
    "SCRAPE_TOKEN_SECONDS": ["1h"],
}


@pytest.mark.parametrize("config, name, value", [
    (config, name, value) for config in CONFIGS for name, values in MALFORMED.items() for value in values
    if name in environ(config) or (name == "FLEET_MAX_WAIT_SECONDS" and config is LADDER)],
    ids=lambda value: value if isinstance(value, str) else type(value).__name__)
def test_a_malformed_variable_is_refused_by_its_name(config, name, value):
    with pytest.raises(ConfigError) as refused:
        type(config).from_env({**environ(config), name: value})
    assert refused.value.name == name and str(refused.value).startswith(f"{name}: ")


def deployment_env(plan, name: str) -> dict[str, str]:
    (deployment,) = [m for m in plan.kubernetes_manifests()
                     if m["kind"] == "Deployment" and m["metadata"]["name"] == name]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {item["name"]: item["value"] for item in container["env"]}


def test_the_controller_reads_the_stack_s_settings_from_its_deployment():
    """dev: on-demand then DWS; the stack's defaults (fallback.stockoutGracePeriod 30s, sliceRecoveryWait 10m and, for
    flexStart, 2m) reach the program, and the constants of infra/failover.py."""
    config = RegionalConfig.from_env(deployment_env(plan_for(), stack_failover.NAME))
    assert [(r.flavor, r.admission_check, r.recovery_seconds) for r in config.chain.rungs] == [
        ("on-demand", False, 600), ("dws", True, 120)]
    assert (config.stockout_grace, config.resync, config.workers, config.health_port, config.metrics_port) == (
        30 * SECONDS, stack_failover.RESYNC_SECONDS * SECONDS, stack_failover.WORKERS, stack_failover.HEALTH_PORT,
        stack_failover.METRICS_PORT)
    assert config.maintenance == Policy("checkpoint", 900 * SECONDS, 120 * SECONDS)  # fallback.maintenance's defaults


def test_the_stack_s_climb_back_settings_reach_the_controller():
    """fallback.climbBack's rungs by their flavors (the reservation's quota is its capacity), its waits, and the save's
    wait of fallback.maintenance; the default (reservation only) is off in a stack without a reservation."""
    assert RegionalConfig.from_env(deployment_env(plan_for(), stack_failover.NAME)).climb_back.to == ()
    overrides = {"reservation": {"reservations": [{"name": "team-v6e", "slices": 1}]}, "spot": {"maxSlices": 1},
                 "fallback": {"climbBack": {"to": ["onDemand", "reservation"], "settle": "90s", "minRuntime": "0s"},
                              "maintenance": {"saveTimeout": "30s"}}}
    config = RegionalConfig.from_env(deployment_env(plan_for(overrides=overrides), stack_failover.NAME))
    assert config.climb_back == ClimbPolicy(("on-demand", "reservation"), ("reservation",), 90 * SECONDS,
                                            3600 * SECONDS, 0 * SECONDS, 1800 * SECONDS, 30 * SECONDS)


def test_the_stack_s_maintenance_settings_reach_the_controller():
    overrides = {"fallback": {"maintenance": {"action": "move", "leadTime": "1h", "saveTimeout": "90s"}}}
    config = RegionalConfig.from_env(deployment_env(plan_for(overrides=overrides), stack_failover.NAME))
    assert config.maintenance == Policy("move", 3600 * SECONDS, 90 * SECONDS)


@pytest.mark.parametrize("program, variable", [("failover.regional", "FAILOVER_CHAIN"),
                                               ("failover.watch", "FLEET_MEMBERS"),
                                               ("failover.ladder", "FLEET_LADDER"),
                                               ("failover.credentials", "SCRAPE_SERVICE_ACCOUNT")])
def test_a_program_without_its_configuration_says_what_is_missing_and_exits_2(program, variable):
    ran = subprocess.run([sys.executable, "-m", program], cwd=REPO, env={"PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 2, ran.stderr
    assert f"{program}: {variable}: missing" in ran.stderr


def test_the_fleet_s_programs_read_what_the_fleet_stack_wrote():
    from tests.test_fleet_ladder import cached_ladder_plan

    plan = cached_ladder_plan()
    watch = FleetWatchConfig.from_env(deployment_env(plan, stack_fleet.WATCH_NAME))
    ladder = LadderConfig.from_env(deployment_env(plan, stack_fleet.LADDER_NAME))
    renewer = renewer_config(deployment_env(plan, stack_fleet.CREDENTIALS_NAME))
    assert sorted(watch.members) == sorted(ladder.members) == sorted(renewer.members)  # every member
    assert (watch.period, watch.resync, ladder.resync, ladder.workers) == (
        stack_fleet.WATCH_SECONDS * SECONDS, stack_fleet.WATCH_RESYNC_SECONDS * SECONDS,
        stack_fleet.LADDER_RESYNC_SECONDS * SECONDS, stack_fleet.LADDER_WORKERS)
    assert ladder.step_wait == 30 * SECONDS and ladder.max_wait is None  # fleet.stepWait's default; no maxWait
    assert ladder.ladder.steps[-1].local_queue == "fleet-queue" and len(ladder.ladder.steps) > 1
