"""Settings: every bad value stops the program, names its key, and leaves nothing registered."""

from __future__ import annotations

import json

import pytest
import yaml

from infra.offline import OfflineEngine
from infra.settings import (DEFAULTS, ConfigReader, SettingsError, gke_version_at_least, read_fallback_settings,
                            read_platform_settings)
from workloads.settings import WORKLOAD_DEFAULTS
from tests.conftest import REPO, config_with, plan_for

LISTS_OF_OBJECTS = {"teams"}
V6E_4X4 = {"machineType": "ct6e-standard-4t", "topology": "4x4"}


class StubConfig(dict):
    """Raw config values by key, read through `get` as pulumi.Config reads them."""

# (id, overrides of the dev stack, the key the message must name)
BAD_CONFIGS = [
    ("project-missing", {"gcp:project": None}, "gcp:project"),
    ("project-malformed", {"gcp:project": "My_Project"}, "gcp:project"),
    ("zone-malformed", {"zone": "useast5b"}, "tpu-fallback:zone"),
    ("zone-without-v6e", {"zone": "europe-west1-b"}, "tpu-fallback:zone"),
    ("zone-without-flex-start", {"zone": "us-central1-b"}, "tpu-fallback:zone"),
    ("cluster-name-uppercase", {"clusterName": "TPU_Cluster"}, "tpu-fallback:clusterName"),
    ("cluster-name-too-long", {"clusterName": "a" * 41}, "tpu-fallback:clusterName"),
    ("gke-version-malformed", {"gkeVersion": "latest"}, "tpu-fallback:gkeVersion"),
    ("gke-too-old-for-queued-tpu", {"gkeVersion": "1.33"}, "tpu-fallback:gkeVersion"),
    ("gke-too-old-for-v6e", {"gkeVersion": "1.31.1-gke.100", "flexStart": {"maxSlices": 0}},
     "tpu-fallback:gkeVersion"),
    ("deletion-protection-not-boolean", {"deletionProtection": "yes"}, "tpu-fallback:deletionProtection"),
    ("system-machine-unknown", {"systemPool": {"machineType": "n2-standard-15"}}, "tpu-fallback:systemPool.machineType"),
    ("system-node-count-zero", {"systemPool": {"nodeCount": 0}}, "tpu-fallback:systemPool.nodeCount"),
    ("system-node-count-string", {"systemPool": {"nodeCount": "3"}}, "tpu-fallback:systemPool.nodeCount"),
    ("system-field-typo", {"systemPool": {"machinetype": "n2-standard-8"}}, "tpu-fallback:systemPool.machinetype"),
    ("system-not-object", {"systemPool": "n2-standard-16"}, "tpu-fallback:systemPool"),
    ("tpu-machine-unknown", {"tpu": {"machineType": "ct6e-standard-2t"}}, "tpu-fallback:tpu.machineType"),
    ("tpu-topology-invalid", {"tpu": {"topology": "4x5"}}, "tpu-fallback:tpu.topology"),
    ("tpu-8t-cannot-be-multi-host", {"tpu": {"machineType": "ct6e-standard-8t", "topology": "4x4"}},
     "tpu-fallback:tpu.topology"),
    ("tpu-v5p-needs-3d-topology", {"tpu": {"machineType": "ct5p-hightpu-4t", "topology": "4x4"}},
     "tpu-fallback:tpu.topology"),
    ("on-demand-negative", {"onDemand": {"maxSlices": -1}}, "tpu-fallback:onDemand.maxSlices"),
    ("flex-too-many", {"flexStart": {"maxSlices": 65}}, "tpu-fallback:flexStart.maxSlices"),
    ("both-plans-off", {"onDemand": {"maxSlices": 0}, "flexStart": {"maxSlices": 0}}, "tpu-fallback:onDemand.maxSlices"),
    ("pool-name-invalid", {"flexStart": {"nodePool": "DWS pool"}}, "tpu-fallback:flexStart.nodePool"),
    ("pool-names-clash", {"flexStart": {"nodePool": "on-demand-pool"}}, "tpu-fallback:flexStart.nodePool"),
    ("pool-named-default-pool", {"onDemand": {"nodePool": "default-pool"}}, "tpu-fallback:onDemand.nodePool"),
    ("derived-pool-name-too-long", {"onDemand": {"nodePool": "p" * 39, "maxSlices": 2}},
     "tpu-fallback:onDemand.nodePool"),
    ("kueue-version-with-v", {"kueue": {"version": "v0.19.2"}}, "tpu-fallback:kueue.version"),
    ("kueue-before-v1beta2-storage", {"kueue": {"version": "0.15.3"}}, "tpu-fallback:kueue.version"),
    ("unknown-top-level-key", {"zonee": "us-east5-b"}, "tpu-fallback:zonee"),
    ("pods-ready-timeout-not-duration", {"fallback": {"podsReadyTimeout": "15min"}},
     "tpu-fallback:fallback.podsReadyTimeout"),
    ("pods-ready-timeout-not-string", {"fallback": {"podsReadyTimeout": 900}},
     "tpu-fallback:fallback.podsReadyTimeout"),
    ("pods-ready-timeout-too-short", {"fallback": {"podsReadyTimeout": "299s", "stockoutGracePeriod": "0s"}},
     "tpu-fallback:fallback.podsReadyTimeout"),
    ("pods-ready-timeout-too-long", {"fallback": {"podsReadyTimeout": "25h"}},
     "tpu-fallback:fallback.podsReadyTimeout"),
    ("stockout-grace-not-duration", {"fallback": {"stockoutGracePeriod": "-1m"}},
     "tpu-fallback:fallback.stockoutGracePeriod"),
    ("stockout-grace-not-shorter-than-timeout", {"fallback": {"podsReadyTimeout": "5m", "stockoutGracePeriod": "300s"}},
     "tpu-fallback:fallback.stockoutGracePeriod"),
    ("fallback-field-typo", {"fallback": {"podsReadyTimeOut": "5m"}}, "tpu-fallback:fallback.podsReadyTimeOut"),
    ("recovery-wait-not-duration", {"fallback": {"sliceRecoveryWait": {"spot": "2 minutes"}}},
     "tpu-fallback:fallback.sliceRecoveryWait.spot"),
    ("recovery-wait-too-short", {"fallback": {"sliceRecoveryWait": {"default": "10s"}}},
     "tpu-fallback:fallback.sliceRecoveryWait.default"),
    ("recovery-wait-too-long", {"fallback": {"sliceRecoveryWait": {"flexStart": "25h"}}},
     "tpu-fallback:fallback.sliceRecoveryWait.flexStart"),
    ("recovery-wait-unknown-rung", {"fallback": {"sliceRecoveryWait": {"preemptible": "1m"}}},
     "tpu-fallback:fallback.sliceRecoveryWait.preemptible"),
    ("recovery-wait-not-a-dict", {"fallback": {"sliceRecoveryWait": "5m"}}, "tpu-fallback:fallback.sliceRecoveryWait"),
    ("spot-grace-not-one-gke-allows", {"spot": {"maxSlices": 1, "gracefulTermination": "60s"}},
     "tpu-fallback:spot.gracefulTermination"),
    ("spot-grace-120s-on-gke-1.34", {"spot": {"maxSlices": 1, "gracefulTermination": "120s"}},
     "tpu-fallback:spot.gracefulTermination"),
]


@pytest.mark.parametrize("overrides, key", [pytest.param(o, k, id=i) for i, o, k in BAD_CONFIGS])
def test_bad_config_is_rejected_by_key_before_any_resource(overrides, key):
    engine = OfflineEngine()
    with pytest.raises(SettingsError) as raised:
        engine.run(config_with(overrides))
    assert any(problem.startswith(f"{key}:") for problem in raised.value.problems), raised.value.problems
    assert engine.recorded == [], "a resource was registered after a bad value"


def test_enough_distinct_bad_configs_are_covered():
    assert len({key for _, _, key in BAD_CONFIGS}) >= 15
    assert len(BAD_CONFIGS) == len({i for i, _, _ in BAD_CONFIGS})


def test_all_problems_are_reported_at_once():
    with pytest.raises(SettingsError) as raised:
        OfflineEngine().run(config_with({"zone": "nowhere", "clusterName": "X", "kueue": {"version": "1"}}))
    named = {problem.split(":", 2)[1] for problem in raised.value.problems}
    assert {"zone", "clusterName", "kueue.version"} <= named


def test_allowed_values_are_listed_in_the_message():
    with pytest.raises(SettingsError, match="allowed: 2x2, 2x4, 4x4"):
        OfflineEngine().run(config_with({"tpu": {"topology": "3x3"}}))


def test_stockout_grace_message_says_why_it_must_be_shorter():
    with pytest.raises(SettingsError, match="already evicted the job, so the early failover would never act"):
        OfflineEngine().run(config_with({"fallback": {"podsReadyTimeout": "6m", "stockoutGracePeriod": "2h"}}))


@pytest.mark.parametrize("fallback, seconds", [
    ({}, (900, 30)),  # the defaults: 15m and 30s
    ({"podsReadyTimeout": "5m", "stockoutGracePeriod": "0s"}, (300, 0)),  # the lowest allowed
    ({"podsReadyTimeout": "24h", "stockoutGracePeriod": "90m"}, (86400, 5400)),  # the highest timeout
])
def test_fallback_durations_are_read_as_seconds(fallback, seconds):
    reader = ConfigReader(StubConfig({"fallback": json.dumps(fallback)}))
    settings = read_fallback_settings(reader, ())
    assert reader.problems == []
    assert (settings.pods_ready_timeout_seconds, settings.stockout_grace_period_seconds) == seconds


def test_unlisted_zone_is_accepted_when_asked():
    plan = plan_for(overrides={"zone": "europe-west1-b", "tpu": {**V6E_4X4, "allowUnlistedZone": True}})
    cluster = plan.only("gcp:container/cluster:Cluster")
    assert cluster.inputs["location"] == "europe-west1-b"


def test_older_gke_is_fine_without_plan_b():
    plan = plan_for(overrides={"gkeVersion": "1.33", "flexStart": {"maxSlices": 0}})
    assert plan.only("gcp:container/cluster:Cluster").inputs["minMasterVersion"] == "1.33"


def test_object_keys_merge_field_by_field():
    plan = plan_for(overrides={"onDemand": {"maxSlices": 2}})
    names = sorted(p.inputs["name"] for p in plan.of_type("gcp:container/nodePool:NodePool"))
    assert names == ["dws-pool", "on-demand-pool-1", "on-demand-pool-2"]


@pytest.mark.parametrize("version, minimum, expected", [
    ("1.34", "1.34", True),
    ("1.35.0-gke.1", "1.34", True),
    ("1.33.9-gke.9", "1.34", False),
    ("1.31", "1.31.2-gke.1115000", True),  # a prefix lets GKE pick a current patch
    ("1.31.1-gke.100", "1.31.2-gke.1115000", False),
    ("1.31.2-gke.1115000", "1.31.2-gke.1115000", True),
])
def test_gke_version_comparison(version, minimum, expected):
    assert gke_version_at_least(version, minimum) is expected


def test_pulumi_yaml_documents_every_key_with_the_code_default():
    declared = yaml.safe_load((REPO / "Pulumi.yaml").read_text())["config"]
    project_keys = {key.split(":", 1)[1]: decl for key, decl in declared.items() if key.startswith("tpu-fallback:")}
    defaults = {**DEFAULTS, "workloads": WORKLOAD_DEFAULTS}
    assert set(project_keys) == set(defaults)
    for key, decl in project_keys.items():
        assert decl["default"] == defaults[key], key
        assert len(decl.get("description", "")) > 20, key
        # Pulumi's project schema types only scalars and arrays of them; objects, and lists of objects (teams),
        # must stay untyped.
        assert ("type" in decl) == (not isinstance(defaults[key], dict) and key not in LISTS_OF_OBJECTS), key


def _cli_output(config: dict[str, str]) -> str:
    """What `pulumi up` prints for a failed program: the Python language host logs a RunError's message alone,
    and anything else as "Program failed with an unhandled exception" plus the traceback.
    Ref: https://github.com/pulumi/pulumi/blob/master/sdk/python/cmd/pulumi-language-python-exec"""
    import traceback

    import pulumi

    try:
        OfflineEngine("dev").run(config)
    except pulumi.RunError as error:
        return f"error: {error}"
    except Exception:  # noqa: BLE001 - what the language host does with any other exception
        return "Program failed with an unhandled exception:\n" + traceback.format_exc()
    return ""


def test_a_bad_config_shows_its_problems_without_a_traceback():
    output = _cli_output(config_with({"tpu": {"machineType": "ct6e-standard-4t", "topology": "3x3"}}))
    assert output.startswith("error: invalid stack configuration:")
    assert "Traceback" not in output and "unhandled exception" not in output
    assert "tpu-fallback:tpu.topology: topology '3x3' is not valid" in output


def test_every_key_is_checked_in_one_pass():
    # A wrong topology no longer hides the zone; a platform problem no longer hides the workloads'.
    config = config_with({"tpu": {"machineType": "ct6e-standard-4t", "topology": "3x3"}, "zone": "europe-west9-z",
                          "workloads": {"headCpu": "two"}})
    config.pop("gcp:project")
    output = _cli_output(config)
    for key in ("gcp:project", "tpu-fallback:tpu.topology", "tpu-fallback:zone", "tpu-fallback:workloads.headCpu"):
        assert f"  - {key}:" in output, (key, output)


@pytest.mark.parametrize("runtime, key", [
    ({"image": "python:latest"}, "failoverController.image"),
    ({"image": "registry.example/failover"}, "failoverController.image"),  # no tag: not pinned
    ({"pipIndexUrl": "http://pypi.corp.example/simple"}, "failoverController.pipIndexUrl"),
    ({"image": "registry.example/failover:1", "pipIndexUrl": "https://pypi.corp.example/simple"},
     "failoverController"),
])
def test_failover_controller_runtime_rules(runtime, key):
    with pytest.raises(SettingsError) as error:
        plan_for("dev", {"failoverController": runtime})
    assert any(p.startswith(f"tpu-fallback:{key}:") for p in error.value.problems), error.value.problems


# --- spot.gracefulTermination: a Spot VM's graceful shutdown ---

@pytest.mark.parametrize("value, seconds, pods", [("30s", 30, 15), ("120s", 120, 105), ("2m", 120, 105)])
def test_spot_grace_is_one_gke_allows_and_gives_the_pods_all_but_the_system_pods_15_s(value, seconds, pods):
    """GKE's default 30 s is 15 s for the pods, then 15 s for the system pods; the extended 120 s keeps the system
    pods' 15 s, so the pods get 105 s. Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms"""
    platform = _platform({"gkeVersion": "1.35.0-gke.1171000", "spot": {"maxSlices": 1, "gracefulTermination": value}})
    shutdown = platform.spot_shutdown
    assert (shutdown.seconds, shutdown.critical_pods_seconds, shutdown.pods_seconds) == (seconds, 15, pods)
    # The rung holds only an extension (what its pools send GKE); GKE's default is no setting at all.
    assert platform.plan("spot").shutdown == (None if seconds == 30 else shutdown)


@pytest.mark.parametrize("value", ["0s", "15s", "29s", "31s", "60s", "119s", "121s", "5m", "2 minutes"])
def test_spot_grace_other_than_30s_or_120s_is_refused_listing_both(value):
    """NodeKubeletConfig.shutdownGracePeriodSeconds: "Allowed values: 0, 30, 120"; 0 turns the graceful shutdown off,
    and with it the notice the training saves on. Ref:
    https://cloud.google.com/kubernetes-engine/docs/reference/rest/v1/NodeConfig#NodeKubeletConfig"""
    with pytest.raises(SettingsError) as raised:
        plan_for(overrides={"gkeVersion": "1.35", "spot": {"maxSlices": 1, "gracefulTermination": value}})
    (problem,) = raised.value.problems
    assert problem.startswith("tpu-fallback:spot.gracefulTermination:") and "30s, 120s" in problem, problem


@pytest.mark.parametrize("version, accepted", [
    ("1.34", False),
    ("1.34.1-gke.1829001", False),
    ("1.35.0-gke.1170999", False),
    ("1.35.0-gke.1171000", True),
    ("1.35", True),  # a prefix lets GKE pick a current 1.35 patch
    ("1.36.2-gke.1000", True),
])
def test_spot_grace_of_120s_needs_gke_1_35_0_gke_1171000(version, accepted):
    """GKE extends a Standard pool's Spot VMs' graceful termination to 120 s (node system config) only when the
    cluster's control plane runs 1.35.0-gke.1171000 or later; gkeVersion is that control plane's minimum.
    Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms"""
    config = {"gkeVersion": version, "spot": {"maxSlices": 1, "gracefulTermination": "120s"}}
    if accepted:
        assert _platform(config).spot_shutdown.seconds == 120
        return
    with pytest.raises(SettingsError) as raised:
        plan_for(overrides=config)
    (problem,) = raised.value.problems
    assert problem == (f"tpu-fallback:spot.gracefulTermination: 120s needs GKE 1.35.0-gke.1171000 or later on the "
                       f"control plane (gkeVersion is {version}); raise gkeVersion, or use 30s")


def test_spot_grace_of_a_spot_rung_that_is_off_needs_no_version_and_sizes_nothing():
    """No pool carries it, so nothing asks GKE for it: the workers keep GKE's default."""
    platform = _platform({"spot": {"maxSlices": 0, "gracefulTermination": "120s"}})
    assert platform.plan("spot") is None
    assert (platform.spot_shutdown.seconds, platform.spot_shutdown.pods_seconds) == (30, 15)


def _platform(overrides: dict):
    """The dev stack's PlatformSettings with these keys replaced, read the way the program reads them."""
    config = {key.split(":", 1)[1]: value for key, value in config_with(overrides).items()
              if key.startswith("tpu-fallback:")}
    reader = ConfigReader(StubConfig(config))
    platform = read_platform_settings(reader, StubConfig({"project": "example-project"}))
    assert reader.problems == []
    return platform


# --- TPU7x (Ironwood): what GKE refuses, each naming its key and source, all in one pass -----------------------------
IRONWOOD = "ironwood-us-central1-c"


def _stack_problems(stack: str, overrides: dict) -> list[str]:
    with pytest.raises(SettingsError) as raised:
        OfflineEngine().run(config_with(overrides, stack))
    return raised.value.problems


def test_the_ironwood_stack_passes_tpu7x_s_gke_version_gate():
    plan = plan_for(IRONWOOD)
    version = plan.only("gcp:container/cluster:Cluster").inputs["minMasterVersion"]
    assert gke_version_at_least(version, "1.34.0-gke.2201000")


def test_tpu7x_refusals_name_their_keys_and_sources_in_one_pass():
    """An older GKE, a zone without TPU7x (so without its flex-start either): three problems, one run."""
    problems = _stack_problems(IRONWOOD, {"zone": "us-east5-b", "gkeVersion": "1.34.0-gke.2200000"})
    ironwood, zones = ("https://cloud.google.com/kubernetes-engine/docs/concepts/tpu-ironwood",
                       "https://cloud.google.com/tpu/docs/types-zones")
    assert [p for p in problems if p.startswith("tpu-fallback:gkeVersion: ")] == [
        f"tpu-fallback:gkeVersion: 1.34.0-gke.2200000 is older than TPU tpu7x's 1.34.0-gke.2201000 ({ironwood})"]
    zone_problems = [p for p in problems if p.startswith("tpu-fallback:zone: ")]
    assert len(zone_problems) == 2 and all(zones in p and "us-central1-c" in p for p in zone_problems)
    assert "offers no TPU tpu7x" in zone_problems[0] and "offers no flex-start TPU tpu7x" in zone_problems[1]


@pytest.mark.parametrize("machine_type, topology", [("tpu7x-standard-4t", "4x4"), ("tpu7x-standard-1t", "2x2x2"),
                                                    ("tpu7x-standard-4t", "2x2x3")])
def test_tpu7x_topologies_are_the_catalogue_s(machine_type, topology):
    problems = _stack_problems(IRONWOOD, {"tpu": {"machineType": machine_type, "topology": topology}})
    assert any(p.startswith(f"tpu-fallback:tpu.topology: topology {topology!r} is not valid for {machine_type}")
               for p in problems), problems
