"""Metrics on Managed Prometheus (infra/monitoring.py): the recorded graph, the PodMonitorings against GMP's upstream
CRD, the dashboard against monitoring.v1's discovery schema, the queried series against their sources, and the
scrape RBAC on the real tier's authorizer. Each check has a case it must reject.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import sys
import time

import pytest

from infra import monitoring as mon
from infra.cluster import MONITORING_COMPONENTS
from infra import failover as failover_code
from infra.failover import METRICS_PORT
from infra.kueue import NAMESPACE as KUEUE_NAMESPACE
from infra.offline import OfflineEngine
from infra.settings import SettingsError
from testbed import upstream
from tests.conftest import REPO, SHIPPED_STACKS, config_with, plan_for
from tests.gcp_schema import check_resource
from tests.k8s_schema import validation_errors

COMPONENT = "tpu-fallback:infra:Monitoring"
DASHBOARD = "gcp:monitoring/dashboard:Dashboard"
ALERT_POLICY = "gcp:monitoring/alertPolicy:AlertPolicy"
POD_MONITORING = "kubernetes:monitoring.googleapis.com/v1:PodMonitoring"
CLUSTER = "gcp:container/cluster:Cluster"
OFF = {"monitoring": {"enabled": False}}
ONE_RUNG = {"flexStart": {"maxSlices": 0}}  # one rung: no failover controller


def pod_monitorings(plan) -> dict[str, dict]:
    return {m["metadata"]["name"]: m for m in plan.kubernetes_manifests() if m["kind"] == "PodMonitoring"}


def dashboard_of(plan) -> dict:
    return json.loads(plan.only(DASHBOARD).inputs["dashboardJson"])


def queries(dashboard: dict) -> list[str]:
    return [d["timeSeriesQuery"]["prometheusQuery"] for tile in dashboard["mosaicLayout"]["tiles"]
            for d in tile["widget"]["xyChart"]["dataSets"]]


def policies(plan) -> dict[str, dict]:
    """Alert policies by their resource name less the component's prefix: {"alert-moves": inputs, ...}."""
    return {r.name.removeprefix("monitoring-"): r.inputs for r in plan.of_type(ALERT_POLICY)}


def condition(policy: dict) -> dict:
    (only,) = policy["conditions"]
    return only["conditionPrometheusQueryLanguage"]


def alert_queries(plan) -> list[str]:
    return [condition(policy)["query"] for policy in policies(plan).values()]


def _plan(stack: str):
    """A shipped platform stack's plan, or the fleet's (its members answered by their own plans)."""
    if stack == "fleet":
        from tests.test_fleet import cached_fleet_plan
        return cached_fleet_plan()
    return plan_for(stack)


@pytest.fixture(scope="session")
def podmonitoring_crd():
    try:
        return upstream.path(upstream.PODMONITORING_CRD)
    except upstream.Unavailable as err:
        if os.environ.get("CI") == "true":  # CI proves the schema check: a missing CRD fails, never skips
            pytest.fail(str(err), pytrace=False)
        pytest.skip(str(err))


# ---- the graph ---------------------------------------------------------------------------------------------------

def test_cluster_runs_managed_prometheus_and_keeps_gkes_system_metrics():
    assert plan_for().only(CLUSTER).inputs["monitoringConfig"] == {
        "enableComponents": list(MONITORING_COMPONENTS), "managedPrometheus": {"enabled": True}}


def test_every_child_is_the_components_and_kubernetes_ones_use_the_cluster_provider():
    plan = plan_for()
    component = plan.only(COMPONENT)
    children = [r for r in plan.resources if r.parent == component.urn]
    assert {r.name for r in children} == {f"monitoring-{suffix}" for suffix in (
        "reader-account", "reader-token", "reader-role", "reader-binding", "collector-role", "collector-binding",
        "renewer-account", "renewer-role", "renewer-binding", "renewer-code", "renewer", "kueue", "failover", "api", "dashboard", "alert-waiting-ondemand", "alert-waiting-flexstart", "alert-moves",
        "alert-failover-controller-down", "alert-goodput")}
    provider = plan.only("pulumi:providers:kubernetes").urn
    assert all(r.provider_urn == provider for r in children if r.type.startswith("kubernetes:"))


def test_kueue_scrape_objects_wait_for_the_release_and_the_monitoring_for_its_token_and_rights():
    plan = plan_for()
    release, index = plan.only("kubernetes:helm.sh/v3:Release").urn, plan.by_urn()
    for name in ("monitoring-reader-account", "monitoring-reader-token", "monitoring-collector-role",
                 "monitoring-collector-binding", "monitoring-kueue"):
        assert release in plan.ancestors_and_dependencies(plan.named(name)), name
    direct = {index[urn].name for urn in plan.named("monitoring-kueue").dependencies}
    assert direct == {"kueue-release", "monitoring-reader-token", "monitoring-reader-binding",
                      "monitoring-collector-binding", "monitoring-renewer"}


def test_the_controllers_monitoring_waits_for_it_and_selects_its_pods_and_metrics_port():
    plan = plan_for()
    monitor = pod_monitorings(plan)[mon.FAILOVER_NAME]
    controller = plan.named("failover-deployment")
    assert controller.urn in plan.named("monitoring-failover").dependencies
    (deployment,) = [m for m in plan.kubernetes_manifests()
                     if m["kind"] == "Deployment" and m["metadata"]["name"] == mon.FAILOVER_NAME]
    template = deployment["spec"]["template"]
    assert monitor["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    ports = {p["name"]: p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert ports[endpoint["port"]] == METRICS_PORT
    assert endpoint["scheme"] == "http" and "authorization" not in endpoint  # plain HTTP inside the cluster


def test_a_one_rung_stack_scrapes_kueue_only():
    assert set(pod_monitorings(plan_for(overrides=ONE_RUNG))) == {"kueue-controller-manager"}


def test_monitoring_off_declares_nothing_and_leaves_the_clusters_monitoring_to_gke():
    plan = plan_for(overrides=OFF)
    assert not plan.of_type(COMPONENT) and not plan.of_type(DASHBOARD) and not pod_monitorings(plan)
    assert "monitoringConfig" not in plan.only(CLUSTER).inputs
    assert plan.outputs["dashboardUrl"] is None


@pytest.mark.parametrize("value, message", [
    ({"enabled": "yes"}, "tpu-fallback:monitoring.enabled: must be a boolean; got 'yes'"),
    ({"dashboard": True}, "tpu-fallback:monitoring.dashboard: unknown field; allowed: enabled, alerts"),
])
def test_the_monitoring_key_is_validated(value, message):
    engine = OfflineEngine()
    with pytest.raises(SettingsError) as raised:
        engine.run(config_with({"monitoring": value}))
    assert message in raised.value.problems
    assert engine.recorded == []


def test_dashboard_url_names_the_dashboard_and_project():
    assert mon.dashboard_url("projects/123456/dashboards/0f1e", "example-project") == \
        f"{mon.CONSOLE}/0f1e?project=example-project"
    assert plan_for().outputs["dashboardUrl"] == f"{mon.CONSOLE}/monitoring-dashboard-id?project=example-project"


def test_the_dashboard_needs_the_monitoring_api_kept_on_destroy():
    plan = plan_for()
    api = plan.named("monitoring-api")
    assert api.inputs == {"project": "example-project", "service": mon.MONITORING_API, "disableOnDestroy": False}
    assert api.urn in plan.named("monitoring-dashboard").dependencies


# ---- least privilege, as declared ---------------------------------------------------------------------------------

def test_the_scrape_token_reads_metrics_only_and_the_collector_reads_that_token_only():
    manifests = {(m["kind"], m["metadata"]["name"]): m for m in plan_for().kubernetes_manifests()}
    assert manifests[("ClusterRole", mon.KUEUE_READER)]["rules"] == [{"nonResourceURLs": ["/metrics"],
                                                                    "verbs": ["get"]}]
    assert [s["name"] for s in manifests[("ClusterRoleBinding", mon.KUEUE_READER)]["subjects"]] == [mon.KUEUE_READER]
    role = manifests[("Role", mon.COLLECTOR_ROLE)]
    assert role["metadata"]["namespace"] == KUEUE_NAMESPACE
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": [mon.TOKEN_SECRET],
                              "verbs": ["get", "watch"]}]
    assert manifests[("RoleBinding", mon.COLLECTOR_ROLE)]["subjects"] == [mon.COLLECTOR]
    # No never-expiring token: the Secret is created empty and the renewer writes a one-hour TokenRequest token.
    secret = manifests[("Secret", mon.TOKEN_SECRET)]
    assert secret["type"] == "Opaque" and "data" not in secret and "annotations" not in secret["metadata"]
    assert {"data", "stringData"} <= set(plan_for().named("monitoring-reader-token").options["ignoreChanges"])
    assert not [m for m in manifests.values() if m.get("type") == "kubernetes.io/service-account-token"]
    renewer = manifests[("Role", mon.SCRAPE_RENEWER)]
    assert renewer["metadata"]["namespace"] == KUEUE_NAMESPACE
    assert renewer["rules"] == [
        {"apiGroups": [""], "resources": ["serviceaccounts/token"], "resourceNames": [mon.KUEUE_READER],
         "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [mon.TOKEN_SECRET], "verbs": ["get", "patch"]}]
    deployment = manifests[("Deployment", mon.SCRAPE_RENEWER)]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert (env["SCRAPE_SERVICE_ACCOUNT"], env["SCRAPE_SECRET"], env["SCRAPE_TOKEN_SECONDS"]) == (
        f"{KUEUE_NAMESPACE}/{mon.KUEUE_READER}", f"{KUEUE_NAMESPACE}/{mon.TOKEN_SECRET}", "3600")
    assert "python -m failover.credentials" in container["command"][-1]
    code = manifests[("ConfigMap", deployment["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"])]
    assert sorted(code["data"]) == sorted(("__init__.py", "config.py", "credentials.py", "runtime.__init__.py",
                                           "runtime.cluster_client.py", "requirements.txt"))
    (volume,) = deployment["spec"]["template"]["spec"]["volumes"]
    assert [item["path"] for item in volume["configMap"]["items"]] == list(failover_code.RENEWER_FILES)


def test_the_kueue_monitoring_reads_its_token_from_its_own_namespace():
    # GMP refuses a Secret in another namespace than the PodMonitoring's (http_types.go toPrometheusSecretRef).
    monitor = pod_monitorings(plan_for())["kueue-controller-manager"]
    (endpoint,) = monitor["spec"]["endpoints"]
    secret = endpoint["authorization"]["credentials"]["secret"]
    assert secret == {"name": mon.TOKEN_SECRET, "key": mon.TOKEN_KEY}
    assert monitor["metadata"]["namespace"] == KUEUE_NAMESPACE
    assert (endpoint["port"], endpoint["scheme"], endpoint["tls"]) == ("metrics", "https", {"insecureSkipVerify": True})


# ---- the PodMonitorings against GMP's CRD --------------------------------------------------------------------------

@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_pod_monitoring_validates_strictly_against_gmps_crd(stack, podmonitoring_crd):
    plan = plan_for(stack)
    found = pod_monitorings(plan)
    controller = [mon.FAILOVER_NAME] if any(m["kind"] == "Deployment" and m["metadata"]["name"] == mon.FAILOVER_NAME
                                            for m in plan.kubernetes_manifests()) else []
    assert sorted(found) == sorted(["kueue-controller-manager", *controller])
    for name, manifest in found.items():
        assert validation_errors(manifest, podmonitoring_crd) == [], name


def _broken(change):
    manifest = copy.deepcopy(mon.kueue_pod_monitoring())
    change(manifest["spec"]["endpoints"][0])
    return manifest


@pytest.mark.parametrize("change, fragment", [
    (lambda e: e["tls"].update(insecureSkipVerifiy=True),
     "Additional properties are not allowed ('insecureSkipVerifiy'"),
    (lambda e: e.update(scheme="HTTPS"), "'HTTPS' is not one of ['http', 'https']"),
    (lambda e: e.pop("interval"), "'interval' is a required property"),
    (lambda e: e["authorization"]["credentials"]["secret"].pop("key"), "'key' is a required property"),
], ids=["misspelled-tls-field", "scheme-case", "no-interval", "secret-without-key"])
def test_a_broken_pod_monitoring_is_rejected_by_the_crd(change, fragment, podmonitoring_crd):
    errors = validation_errors(_broken(change), podmonitoring_crd)
    assert len(errors) == 1 and fragment in errors[0], errors


# ---- the dashboard against monitoring.v1 ----------------------------------------------------------------------------

def test_the_dashboard_validates_against_monitoring_v1():
    built = plan_for().only(DASHBOARD)
    assert check_resource(built.type, built.name, built.inputs).problems == []
    assert [tile["widget"]["title"].split(" (")[0] for tile in dashboard_of(plan_for())["mosaicLayout"]["tiles"]] == [
        "Pending workloads per ClusterQueue", "Admission wait per flavor", "Moves down the queue chain by reason",
        "ProvisioningRequest outcomes by admission check and state", "Move delay by reason",
        "Failover controller: reconciles, resyncs and errors per second; Workloads watched",
        "Scheduling goodput per namespace", "Jobs in each state per rung",
        "The 10 unfinished jobs with the lowest scheduling goodput since their submission"]


@pytest.mark.parametrize("change, fragment", [
    (lambda d: d["mosaicLayout"]["tiles"][0]["widget"].update(xyCharts=d["mosaicLayout"]["tiles"][0]["widget"].pop(
        "xyChart")), "Widget has no field 'xyCharts' (did you mean 'xyChart'?)"),
    (lambda d: d["mosaicLayout"]["tiles"][2]["widget"]["xyChart"]["dataSets"][0].update(plotType="BARS"),
     "'BARS' is not a value of DataSet.plotType; allowed: LINE, STACKED_AREA, STACKED_BAR, HEATMAP"),
    (lambda d: d["mosaicLayout"].update(columns="48"), "'48' is a string; MosaicLayout.columns takes integer (int32)"),
], ids=["misspelled-widget-field", "plot-type", "columns-as-string"])
def test_a_broken_dashboard_is_rejected_naming_the_field(change, fragment):
    built = plan_for().only(DASHBOARD)
    body = dashboard_of(plan_for())
    change(body)
    problems = check_resource(built.type, built.name, {**built.inputs, "dashboardJson": json.dumps(body)}).problems
    assert len(problems) == 1 and fragment in problems[0], problems
    assert problems[0].startswith(f"{DASHBOARD} monitoring-dashboard: dashboardJson.")


def test_dashboard_json_that_is_not_an_object_is_rejected():
    built = plan_for().only(DASHBOARD)
    problems = check_resource(built.type, built.name, {**built.inputs, "dashboardJson": "[]"}).problems
    assert problems == [f"{DASHBOARD} monitoring-dashboard: dashboardJson -> monitoring.v1 Dashboard: must be a JSON "
                        "object in a string; got a string"]


def test_an_empty_component_list_would_switch_gkes_monitoring_off_and_is_rejected():
    built = plan_for().only(CLUSTER)
    inputs = copy.deepcopy(built.inputs)
    inputs["monitoringConfig"]["enableComponents"] = []
    (problem,) = check_resource(built.type, built.name, inputs).problems
    assert "componentConfig.enableComponents: [] breaks the rule" in problem


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_query_reads_this_stacks_cluster_only(stack):
    plan = plan_for(stack)
    cluster = plan.only(CLUSTER).inputs
    selector = f'cluster="{cluster["name"]}",location="{cluster["location"]}"'
    found = queries(dashboard_of(plan))
    assert found and all(q.count("{") == q.count(selector) for q in found), found


# ---- the alert policies ----------------------------------------------------------------------------------------

def test_a_platform_alerts_on_each_rungs_wait_on_moves_on_the_controller_down_and_on_goodput():
    plan = plan_for()
    found = policies(plan)
    assert set(found) == {"alert-waiting-ondemand", "alert-waiting-flexstart", "alert-moves",
                          "alert-failover-controller-down", "alert-goodput"}
    durations = {name: condition(policy).get("duration") for name, policy in found.items()}
    # The waits are held inside their queries; the down alert's range covers 60 s of its 300 (test_alerts_promtool).
    assert durations == {"alert-waiting-ondemand": None, "alert-waiting-flexstart": None,
                         "alert-moves": None, "alert-failover-controller-down": "240s", "alert-goodput": None}
    for name, policy in found.items():
        assert policy["notificationChannels"] == [], name  # none by default; the policies exist all the same
        assert policy["displayName"].startswith("tpu-fallback tpu-cluster (us-east5-b): "), name
        assert condition(policy)["disableMetricValidation"] is True, name  # declared before any series exists
        assert policy["documentation"]["mimeType"] == "text/markdown" and policy["documentation"]["content"]
        assert plan.named("monitoring-api").urn in plan.named(f"monitoring-{name}").dependencies
    assert {name: policy["severity"] for name, policy in found.items()} == {
        "alert-waiting-ondemand": "WARNING", "alert-waiting-flexstart": "WARNING", "alert-moves": "WARNING",
        "alert-failover-controller-down": "ERROR", "alert-goodput": "WARNING"}


def test_each_rungs_wait_alert_reads_its_own_queue_over_its_own_wait():
    found = policies(plan_for(overrides={"monitoring": {"alerts": {"pendingTooLong": {"onDemand": "30m"}}}}))
    on_demand, dws = condition(found["alert-waiting-ondemand"]), condition(found["alert-waiting-flexstart"])
    # Held 30 m and one scrape step inside the query, no admission in that time (promtool proves the timing).
    assert "[1830s:30s]" in on_demand["query"] and "[1830s]" in on_demand["query"]
    assert 'cluster_queue="cluster-queue",' in on_demand["query"] and "cluster-queue-dws" not in on_demand["query"]
    assert "[21630s:30s]" in dws["query"] and 'cluster_queue="cluster-queue-dws"' in dws["query"]  # its default kept
    # A wait for the DWS check is DWS's, in whichever queue holds the quota: never judged by on-demand's 30 m.
    assert mon.KUEUE_RESERVING not in on_demand["query"]
    assert f'{mon.KUEUE_RESERVING}{{cluster="tpu-cluster",location="us-east5-b",' \
           f'cluster_queue=~"cluster-queue|cluster-queue-dws"' in dws["query"]
    assert mon.KUEUE_ADMITTED_ACTIVE in dws["query"]
    assert f"unless on (cluster_queue) ((sum by (cluster_queue) (increase({mon.KUEUE_ADMITTED}" in dws["query"]


def test_with_teams_a_rungs_wait_alert_covers_every_teams_queue_of_that_rung():
    found = policies(plan_for("platform-us-east5-b"))  # teams research, prod, interns; four rungs
    queues = {name: set(re.findall(r'cluster_queue=~"([^"]+)"', condition(policy)["query"]))
              for name, policy in found.items() if name.startswith("alert-waiting-")}
    pending = {rung: "|".join(sorted(f"{team}cluster-queue{suffix}" for team in ("", "research-", "prod-", "interns-")))
               for rung, suffix in (("reservation", ""), ("onDemand", "-on-demand"), ("spot", "-spot"),
                                    ("flexStart", "-dws"))}
    every = "|".join(sorted(q for regex in pending.values() for q in regex.split("|")))  # DWS waits, any queue
    assert queues == {f"alert-waiting-{rung.lower()}": {regex, every} if rung == "flexStart" else {regex}
                      for rung, regex in pending.items()}


def test_the_moves_alert_counts_moves_per_rung_over_an_hour_above_the_configured_number():
    found = policies(plan_for(overrides={"monitoring": {"alerts": {"movesPerHour": 5}}}))
    query = condition(found["alert-moves"])["query"]
    moves = f'{mon.MOVES}{{cluster="tpu-cluster",location="us-east5-b"}}'
    # Exact counts (no increase() extrapolation), series younger than the hour whole (they are declared at 0).
    assert query == f"sum by (from_flavor) ((({moves} - {moves} offset 1h) >= 0) or {moves}) > 5"


def test_the_controller_down_alert_reads_the_scrape_of_its_pod_monitoring():
    plan = plan_for()
    query = condition(policies(plan)["alert-failover-controller-down"])["query"]
    monitor = pod_monitorings(plan)[mon.FAILOVER_NAME]
    up = (f'up{{cluster="tpu-cluster",location="us-east5-b",namespace="{monitor["metadata"]["namespace"]}",'
          f'job="{monitor["metadata"]["name"]}"}}')  # GMP's job label is the PodMonitoring's name
    assert query == f"absent_over_time({up}[60s]) or max(max_over_time({up}[60s])) == 0"


def test_the_goodput_alert_compares_each_namespaces_running_share_over_its_window_with_the_threshold():
    found = policies(plan_for(overrides={"monitoring": {"alerts": {"goodputBelow": {"percent": 80, "window": "2h"}}}}))
    query = condition(found["alert-goodput"])["query"]
    every = f'{mon.SCHEDULING_SECONDS}{{cluster="tpu-cluster",location="us-east5-b"}}'
    running = f'{mon.SCHEDULING_SECONDS}{{cluster="tpu-cluster",location="us-east5-b",state="running"}}'
    # The window's job-seconds, once they add up to a window less a scrape step (7170 s): a lone job's first minutes
    # say nothing yet (test_alerts_promtool.py).
    assert query == (f"(sum by (job_namespace) (increase({running}[2h])) / "
                     f"sum by (job_namespace) (increase({every}[2h])) < 0.8) and on (job_namespace) "
                     f"(sum by (job_namespace) (increase({every}[2h])) >= 7170)")
    assert "tpu-fallback:monitoring.alerts.goodputBelow" in found["alert-goodput"]["documentation"]["content"]


def test_a_goodput_threshold_of_zero_declares_no_goodput_alert_and_the_panels_stay():
    plan = plan_for(overrides={"monitoring": {"alerts": {"goodputBelow": {"percent": 0}}}})
    assert "alert-goodput" not in policies(plan) and "alert-moves" in policies(plan)
    assert any(mon.JOB_GOODPUT in q for q in queries(dashboard_of(plan)))


def test_the_dashboard_shows_goodput_per_namespace_states_per_rung_and_the_lowest_jobs():
    found = queries(dashboard_of(plan_for()))
    every = f'{mon.SCHEDULING_SECONDS}{{cluster="tpu-cluster",location="us-east5-b"}}'
    running = f'{mon.SCHEDULING_SECONDS}{{cluster="tpu-cluster",location="us-east5-b",state="running"}}'
    assert [q for q in found if mon.SCHEDULING_SECONDS in q or mon.JOB_GOODPUT in q] == [
        f"sum by (job_namespace) (increase({running}[1h])) / sum by (job_namespace) (increase({every}[1h]))",
        f'sum by (state, rung) (rate({mon.SCHEDULING_SECONDS}{{cluster="tpu-cluster",location="us-east5-b"}}[5m]))',
        f'bottomk(10, min by (job_namespace, job_name) ({mon.JOB_GOODPUT}{{cluster="tpu-cluster",'
        f'location="us-east5-b"}}))']
    assert not any(mon.SCHEDULING_SECONDS in q for q in queries(dashboard_of(plan_for(overrides=ONE_RUNG))))


def test_a_one_rung_stack_alerts_on_the_wait_only():
    assert set(policies(plan_for(overrides=ONE_RUNG))) == {"alert-waiting-ondemand"}


def test_notification_channels_from_config_reach_every_policy():
    channels = ["projects/example-project/notificationChannels/123", "projects/987654/notificationChannels/456"]
    found = policies(plan_for(overrides={"monitoring": {"alerts": {"notificationChannels": channels}}}))
    assert found and all(policy["notificationChannels"] == channels for policy in found.values())


def test_alerts_off_declares_no_policy_and_keeps_the_dashboard():
    plan = plan_for(overrides={"monitoring": {"alerts": {"enabled": False}}})
    assert not plan.of_type(ALERT_POLICY) and plan.of_type(DASHBOARD)


@pytest.mark.parametrize("stack", [*SHIPPED_STACKS, "fleet"])
def test_every_alert_policy_validates_against_monitoring_v3(stack):
    plan = _plan(stack)
    built = plan.of_type(ALERT_POLICY)
    assert built
    for policy in built:
        assert check_resource(policy.type, policy.name, policy.inputs).problems == [], policy.name


@pytest.mark.parametrize("stack", [*SHIPPED_STACKS, "fleet"])
def test_every_alert_query_reads_this_stacks_cluster_only(stack):
    plan = _plan(stack)
    cluster = plan.only(CLUSTER).inputs
    selector = f'cluster="{cluster["name"]}",location="{cluster["location"]}"'
    found = alert_queries(plan)
    assert found and all(q.count("{") == q.count(selector) for q in found), found


def _broken_policy(change):
    built = plan_for().named("monitoring-alert-waiting-flexstart")
    inputs = copy.deepcopy(built.inputs)
    change(inputs)
    return check_resource(built.type, built.name, inputs).problems


@pytest.mark.parametrize("change, fragment", [
    (lambda p: p["conditions"][0]["conditionPrometheusQueryLanguage"].update(duration="6h"),
     "'6h' is not a google-duration; PrometheusQueryLanguageCondition.duration takes seconds with the suffix s"),
    (lambda p: p.update(severity="WARN"), "'WARN' is not a value of AlertPolicy.severity; allowed: CRITICAL, ERROR, "
                                          "WARNING"),
    (lambda p: p.update(notificationChannels=["alerts@example.com"]),
     "breaks the rule AlertPolicy.notificationChannels's description states"),
    (lambda p: p.update(conditions=p["conditions"] * 7), "allowed: 1 to 6 conditions"),
    (lambda p: p["documentation"].update(mimeType="text/plain"), "allowed: text/markdown"),
    (lambda p: p["conditions"][0].update(conditionPromQl=p["conditions"][0].pop("conditionPrometheusQueryLanguage")),
     "Condition has no field 'conditionPromQl'"),
], ids=["duration-not-seconds", "severity", "channel-not-a-name", "seven-conditions", "mime-type", "misspelled"])
def test_a_broken_alert_policy_is_rejected_naming_the_field(change, fragment):
    problems = _broken_policy(change)
    assert len(problems) == 1 and fragment in problems[0], problems
    assert problems[0].startswith(f"{ALERT_POLICY} monitoring-alert-waiting-flexstart: ")


# (the setting, the problem it must report naming its key)
BAD_ALERTS = [
    ({"pendingTooLong": {"onDemand": "90min"}},
     "tpu-fallback:monitoring.alerts.pendingTooLong.onDemand: '90min' is not a duration"),
    ({"pendingTooLong": {"default": "1m"}},
     "tpu-fallback:monitoring.alerts.pendingTooLong.default: 1m is out of range; use 5m to 24h"),
    ({"pendingTooLong": {"flexStart": "25h"}},
     "tpu-fallback:monitoring.alerts.pendingTooLong.flexStart: 25h is out of range"),
    ({"pendingTooLong": {"ondemand": "1h"}},
     "tpu-fallback:monitoring.alerts.pendingTooLong.ondemand: unknown rung 'ondemand'; use default or one of "
     "reservation, onDemand, spot, flexStart"),
    ({"pendingTooLong": {"spot": 3600}},
     "tpu-fallback:monitoring.alerts.pendingTooLong.spot: must be a duration string such as 90m; got 3600"),
    ({"pendingTooLong": "1h"}, "tpu-fallback:monitoring.alerts.pendingTooLong: must be a dict; got '1h'"),
    ({"movesPerHour": -1}, "tpu-fallback:monitoring.alerts.movesPerHour: -1 is out of range"),
    ({"movesPerHour": 2.5}, "tpu-fallback:monitoring.alerts.movesPerHour: must be a int; got 2.5"),
    ({"notificationChannels": ["alerts@example.com"]},
     "tpu-fallback:monitoring.alerts.notificationChannels[0]: 'alerts@example.com' is not a notification channel's "
     "name, projects/<project>/notificationChannels/<id>"),
    ({"notificationChannels": ["projects/example-project/notificationChannels/12"] * 2},
     "tpu-fallback:monitoring.alerts.notificationChannels: a channel is listed twice"),
    ({"notificationChannels": "projects/example-project/notificationChannels/12"},
     "tpu-fallback:monitoring.alerts.notificationChannels: must be a list"),
    ({"enabled": "no"}, "tpu-fallback:monitoring.alerts.enabled: must be a boolean; got 'no'"),
    ({"channels": []}, "tpu-fallback:monitoring.alerts.channels: unknown field; allowed: enabled, pendingTooLong, "
                       "movesPerHour, goodputBelow, notificationChannels"),
    ({"goodputBelow": {"percent": 101}}, "tpu-fallback:monitoring.alerts.goodputBelow.percent: 101 is out of range"),
    ({"goodputBelow": {"window": "10m"}},
     "tpu-fallback:monitoring.alerts.goodputBelow.window: 10m is out of range; use 30m to 24h"),
    ({"goodputBelow": {"share": 50}}, "tpu-fallback:monitoring.alerts.goodputBelow.share: unknown field; allowed: "
                                      "percent, window"),
]


@pytest.mark.parametrize("alerts, message", BAD_ALERTS, ids=[
    "duration-malformed", "duration-too-short", "duration-too-long", "unknown-rung", "duration-not-string",
    "waits-not-object", "negative-rate", "fractional-rate", "channel-malformed", "channel-twice", "channels-not-list",
    "enabled-not-boolean", "unknown-field", "goodput-percent-too-high", "goodput-window-too-short",
    "goodput-unknown-field"])
def test_each_alert_setting_is_validated_naming_its_key_before_anything_is_declared(alerts, message):
    engine = OfflineEngine()
    with pytest.raises(SettingsError) as raised:
        engine.run(config_with({"monitoring": {"alerts": alerts}}))
    assert any(problem.startswith(message) for problem in raised.value.problems), raised.value.problems
    assert engine.recorded == []


def test_a_rung_that_is_off_may_keep_its_wait():
    """The default's flexStart entry, or a user's, waits for the rung to be turned on; it is no error."""
    plan = plan_for(overrides={**ONE_RUNG, "monitoring": {"alerts": {"pendingTooLong": {"flexStart": "2h"}}}})
    assert set(policies(plan)) == {"alert-waiting-ondemand"}


# ---- a fleet's manager (plan C) ------------------------------------------------------------------------------------

FLEET_COMPONENT = "tpu-fallback:infra:FleetMonitoring"


def test_the_fleet_manager_runs_managed_prometheus_and_shares_the_platforms_kueue_scrape():
    plan = _plan("fleet")
    assert plan.only(CLUSTER).inputs["monitoringConfig"] == {
        "enableComponents": list(MONITORING_COMPONENTS), "managedPrometheus": {"enabled": True}}
    component = plan.only(FLEET_COMPONENT)
    children = {r.name for r in plan.resources if r.parent == component.urn}
    assert children == {f"monitoring-{suffix}" for suffix in (
        "reader-account", "reader-token", "reader-role", "reader-binding", "collector-role", "collector-binding",
        "renewer-account", "renewer-role", "renewer-binding", "renewer-code", "renewer", "kueue", "watch", "ladder",
        "api", "dashboard", "alert-waiting-fleet", "alert-fleet-watch-down", "alert-fleet-ladder-down",
        "alert-member-unreachable")}
    manifests = {(m["kind"], m["metadata"]["name"]): m for m in plan.kubernetes_manifests()}
    # The very objects a platform declares, from the same builders.
    for manifest in (mon.kueue_reader_account(), mon.token_secret(), mon.metrics_reader_role(),
                     mon.metrics_reader_binding(), mon.collector_token_role(), mon.collector_token_binding(),
                     mon.kueue_pod_monitoring()):
        assert manifests[(manifest["kind"], manifest["metadata"]["name"])] == manifest
    release = next(r for r in plan.helm_releases() if r.inputs["name"] == "kueue").urn
    assert release in plan.named("monitoring-kueue").dependencies
    assert plan.outputs["dashboardUrl"] == f"{mon.CONSOLE}/monitoring-dashboard-id?project=example-project"


@pytest.mark.parametrize("program, port_variable", [("watch", "FLEET_METRICS_PORT"),
                                                    ("ladder", "LADDER_METRICS_PORT")])
def test_each_fleet_programs_monitoring_selects_its_pods_and_metrics_port(program, port_variable):
    from infra.fleet import LADDER_NAME, WATCH_NAME

    name = {"watch": WATCH_NAME, "ladder": LADDER_NAME}[program]
    plan = _plan("fleet")
    monitor = pod_monitorings(plan)[name]
    deployment = next(m for m in plan.kubernetes_manifests()
                      if m["kind"] == "Deployment" and m["metadata"]["name"] == name)
    template = deployment["spec"]["template"]
    assert monitor["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    (container,) = template["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert ports[endpoint["port"]] == METRICS_PORT and endpoint["scheme"] == "http"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env[port_variable] == str(METRICS_PORT)  # the port the program serves /metrics on (failover/config.py)
    assert plan.named(f"fleet-{program}").urn in plan.named(f"monitoring-{program}").dependencies


def test_every_fleet_pod_monitoring_validates_strictly_against_gmps_crd(podmonitoring_crd):
    found = pod_monitorings(_plan("fleet"))
    assert sorted(found) == ["fleet-ladder", "fleet-watch", "kueue-controller-manager"]
    for name, manifest in found.items():
        assert validation_errors(manifest, podmonitoring_crd) == [], name


def test_the_fleet_dashboard_validates_and_is_named_for_the_fleet():
    plan = _plan("fleet")
    built = plan.only(DASHBOARD)
    assert check_resource(built.type, built.name, built.inputs).problems == []
    body = dashboard_of(plan)
    assert body["displayName"] == "tpu-fallback fleet tpu-fleet (us-central1-a)"
    assert [tile["widget"]["title"].split(" (")[0] for tile in body["mosaicLayout"]["tiles"]] == [
        "Fleet jobs by finding of the fleet watch's last pass", "Members answering the fleet watch",
        "Pending workloads per ClusterQueue", "Fleet watch: pass duration"]


def test_the_fleet_alerts_on_its_queue_its_watch_its_ladder_and_its_members():
    found = policies(_plan("fleet"))
    waiting = condition(found["alert-waiting-fleet"])
    assert "duration" not in waiting and "[3630s:30s]" in waiting["query"]
    assert 'cluster_queue="fleet-cluster-queue"' in waiting["query"]
    assert mon.KUEUE_RESERVING in waiting["query"]  # a job holding quota while MultiKueue has not dispatched it
    assert 'job="fleet-watch"' in condition(found["alert-fleet-watch-down"])["query"]
    assert 'job="fleet-ladder"' in condition(found["alert-fleet-ladder-down"])["query"]
    member = condition(found["alert-member-unreachable"])
    assert member == {"query": f'min by (member) ({mon.FLEET_REACHABLE}{{cluster="tpu-fleet",location="us-central1-a"}})'
                               " == 0", "duration": "300s", "disableMetricValidation": True}


def test_the_fleet_reads_its_monitoring_key_and_off_declares_none():
    from tests.test_fleet import fleet_plan

    plan = fleet_plan({"monitoring": {"enabled": False}})
    assert not plan.of_type(FLEET_COMPONENT) and not plan.of_type(DASHBOARD) and not pod_monitorings(plan)
    assert "monitoringConfig" not in plan.only(CLUSTER).inputs and plan.outputs["dashboardUrl"] is None
    waits = fleet_plan({"monitoring": {"alerts": {"pendingTooLong": {"default": "3h"}}}})
    assert "[10830s:30s]" in condition(policies(waits)["alert-waiting-fleet"])["query"]


# ---- the queried series exist, with the labels grouped by ------------------------------------------------------

SERIES = re.compile(r"\b((?:kueue|tpu_fallback)_\w+)\{")
# prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: constants.KueueName, Name: "...", ...}, []string{labels})
KUEUE_METRIC = re.compile(r'prometheus\.New(Counter|Gauge|Histogram)Vec\(\s*prometheus\.\w+Opts\{\s*Subsystem:\s*'
                          r'constants\.KueueName,\s*Name:\s*"(\w+)",.*?\[\]string\{([^}]*)\}', flags=re.DOTALL)
BY = re.compile(r"\bby \(([^)]*)\)")


def kueue_series() -> dict[str, set[str]]:
    """Kueue's metric names and labels, from its source (Subsystem "kueue", names and label lists)."""
    source = upstream.path(upstream.KUEUE_METRICS).read_text()
    found = {}
    for kind, name, labels in KUEUE_METRIC.findall(source):
        found.update(_samples(f"kueue_{name}", kind.lower(), set(re.findall(r'"(\w+)"', labels))))
    return found


def controller_series() -> dict[str, set[str]]:
    """The failover controller's and the fleet watch's metrics, from their own registries (failover/runtime/metrics.py)."""
    from failover.watch.decisions import STATES
    from failover.runtime.metrics import FleetMetrics, Metrics

    found = {}
    for metric in [*vars(Metrics()).values(), *vars(FleetMetrics(STATES)).values()]:
        if hasattr(metric, "_labelnames"):
            found.update(_samples(metric._name, metric._type, set(metric._labelnames)))
    return found


def _samples(name: str, kind: str, labels: set[str]) -> dict[str, set[str]]:
    """The series a family exposes: counters end in _total, histograms have _bucket (with le), _sum, _count."""
    if kind == "counter":
        return {name.removesuffix("_total") + "_total": labels}
    if kind == "histogram":
        return {f"{name}_bucket": labels | {"le"}, f"{name}_sum": labels, f"{name}_count": labels}
    return {name: labels}


def unknown_series(query_list: list[str], known: dict[str, set[str]]) -> list[str]:
    problems = []
    for query in query_list:
        grouped = {label.strip() for group in BY.findall(query) for label in group.split(",")}
        for metric in SERIES.findall(query):
            if metric not in known:
                problems.append(f"{metric}: no such series")
            elif grouped - known[metric]:
                problems.append(f"{metric}: no label(s) {sorted(grouped - known[metric])}")
    return problems


@pytest.fixture(scope="module")
def known_series():
    try:
        kueue = kueue_series()
    except upstream.Unavailable as err:
        if os.environ.get("CI") == "true":
            pytest.fail(str(err), pytrace=False)
        pytest.skip(str(err))
    return {**kueue, **controller_series()}


def test_every_queried_series_and_label_exists_in_kueue_or_the_controller(known_series):
    assert known_series["kueue_pending_workloads"] >= {"cluster_queue", "status", "replica_role"}
    found = queries(dashboard_of(plan_for()))
    assert {m for q in found for m in SERIES.findall(q)} >= {
        mon.KUEUE_PENDING, mon.MOVES, f"{mon.ADMISSION_WAIT}_bucket", mon.CHECK_OUTCOMES, f"{mon.MOVE_DELAY}_bucket"}
    assert unknown_series(found, known_series) == []


@pytest.mark.parametrize("stack", [*SHIPPED_STACKS, "fleet"])
def test_every_series_and_label_an_alert_queries_exists(stack, known_series):
    found = alert_queries(_plan(stack))
    assert unknown_series(found, known_series) == []
    grouped = {label.strip() for q in found for group in BY.findall(q) for label in group.split(",")}
    assert grouped and "cluster_queue" in grouped


def test_the_alerts_read_kueues_waiting_gauges_and_admissions(known_series):
    found = {m for q in alert_queries(plan_for()) for m in SERIES.findall(q)}
    assert found >= {mon.KUEUE_PENDING, mon.KUEUE_RESERVING, mon.KUEUE_ADMITTED_ACTIVE, mon.KUEUE_ADMITTED, mon.MOVES}
    fleet = {m for q in alert_queries(_plan("fleet")) for m in SERIES.findall(q)}
    assert mon.FLEET_REACHABLE in fleet and {"member"} <= known_series[mon.FLEET_REACHABLE]
    # The fleet dashboard's too.
    assert unknown_series(queries(dashboard_of(_plan("fleet"))), known_series) == []


def test_a_misnamed_series_or_label_is_caught(known_series):
    assert unknown_series(['sum by (queue) (kueue_pending_workloads{cluster="c"})',
                           'sum(rate(tpu_fallback_moves{cluster="c"}[5m]))'], known_series) == [
        "kueue_pending_workloads: no label(s) ['queue']", "tpu_fallback_moves: no such series"]


def test_kueue_has_no_per_flavor_wait_metric_so_the_controllers_is_used(known_series):
    waits = {name: labels for name, labels in known_series.items()
             if name.startswith("kueue_") and "wait_time_seconds" in name}
    assert waits and not any("flavor" in labels for labels in waits.values()), waits
    assert "flavor" in known_series[f"{mon.ADMISSION_WAIT}_bucket"]


# ---- the real tier: the server accepts the objects, and its RBAC authorizer agrees ---------------------------------

def _review(kube, user: str, **attributes) -> bool:
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "metadata": {}, "spec": {"user": user, **attributes}}
    return kube.create(review)["status"].get("allowed", False)


@pytest.mark.controlplane
def test_on_the_tier_the_objects_apply_the_token_reads_metrics_only_and_the_collector_that_token_only(
        control_plane):
    from infra.offline import Plan
    from testbed.kube import Rejected, wait_for
    from testbed.stack import deploy, destroy

    plan = plan_for()
    component = plan.only(COMPONENT).urn
    wanted = {r.urn for r in plan.resources if r.parent == component} | {plan.named("kueue-namespace").urn,
                                                                         plan.named("failover-namespace").urn}
    kube = control_plane.kube
    renewers = []

    def run_renewer(step) -> None:
        """The scrape token's renewer, as its Deployment runs it (no kubelet here), with its own rights."""
        if step.manifest["kind"] == "Deployment" and step.manifest["metadata"]["name"] == mon.SCRAPE_RENEWER:
            (container,) = step.manifest["spec"]["template"]["spec"]["containers"]
            env = {e["name"]: e["value"] for e in container["env"] if e["name"].startswith("SCRAPE_")}
            kubeconfig = control_plane.kubeconfig_for_service_account(KUEUE_NAMESPACE, mon.SCRAPE_RENEWER)
            renewers.append(control_plane.supervisor.start("scrape-token", [
                sys.executable, "-m", "failover.credentials"], env={**os.environ, **env,
                                                                    "KUBECONFIG": str(kubeconfig)}, cwd=REPO))

    deployed = deploy(kube, Plan([r for r in plan.resources if r.urn in wanted], {}, set()), after_create=run_renewer)
    try:
        # The renewer wrote a token of the scrape identity that expires within the hour, and the API server says
        # whose it is: what Kueue's filter will ask (TokenReview).
        def written() -> str | None:
            data = (kube.get("v1", "Secret", mon.TOKEN_SECRET, KUEUE_NAMESPACE) or {}).get("data") or {}
            return base64.b64decode(data[mon.TOKEN_KEY]).decode() if data.get(mon.TOKEN_KEY) else None
        token = wait_for(written, 60, "the scrape token written by the renewer")
        claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
        assert claims["exp"] - claims["iat"] == 3600 and claims["exp"] > time.time()
        review = kube.create({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "metadata": {},
                              "spec": {"token": token}})["status"]
        assert review["authenticated"] and review["user"]["username"] == (
            f"system:serviceaccount:{KUEUE_NAMESPACE}:{mon.KUEUE_READER}")
        renewer = f"system:serviceaccount:{KUEUE_NAMESPACE}:{mon.SCRAPE_RENEWER}"
        tokens = {"namespace": KUEUE_NAMESPACE, "resource": "serviceaccounts", "subresource": "token",
                  "verb": "create"}
        assert _review(kube, renewer, resourceAttributes={**tokens, "name": mon.KUEUE_READER})
        assert not _review(kube, renewer, resourceAttributes={**tokens, "name": "kueue-controller-manager"})
        assert not _review(kube, renewer, resourceAttributes={"namespace": KUEUE_NAMESPACE, "resource": "secrets",
                                                              "verb": "get", "name": "kueue-webhook-server-cert"})
        reader = f"system:serviceaccount:{KUEUE_NAMESPACE}:{mon.KUEUE_READER}"
        collector = f"system:serviceaccount:{mon.COLLECTOR['namespace']}:{mon.COLLECTOR['name']}"
        secret = {"namespace": KUEUE_NAMESPACE, "resource": "secrets", "version": "v1"}
        assert _review(kube, reader, nonResourceAttributes={"path": "/metrics", "verb": "get"})
        assert not _review(kube, reader, nonResourceAttributes={"path": "/metrics", "verb": "post"})
        assert not _review(kube, reader, resourceAttributes={**secret, "verb": "get", "name": mon.TOKEN_SECRET})
        for verb in mon.COLLECTOR_VERBS:
            assert _review(kube, collector, resourceAttributes={**secret, "verb": verb, "name": mon.TOKEN_SECRET})
        other = {**secret, "verb": "get", "name": "kueue-webhook-server-cert"}
        assert not _review(kube, collector, resourceAttributes=other)
        assert not _review(kube, collector, resourceAttributes={**secret, "verb": "list"})
        assert not _review(kube, collector, resourceAttributes={**secret, "namespace": "default", "verb": "get",
                                                                  "name": mon.TOKEN_SECRET})
        # The CRD's CEL rules, which the offline check does not evaluate, run here: one kind of auth at a time.
        both = _broken(lambda e: e.update(basicAuth={"username": "scraper"}))
        with pytest.raises(Rejected, match="has\\(self.authorization\\)"):
            kube.create(both, dry_run=True)
    finally:
        for process in renewers:
            control_plane.supervisor.stop(process)
        assert destroy(kube, deployed.steps).stuck == {}


@pytest.mark.controlplane
def test_the_kueue_monitoring_selects_the_charts_manager_pod_and_its_metrics_port(control_plane):
    """Against the chart rendered with the stack's values (testbed/chart.py)."""
    (manager,) = [d for d in control_plane.chart.of_kind("Deployment")
                  if d["metadata"]["name"].endswith("controller-manager")]
    template = manager["spec"]["template"]
    (endpoint,) = mon.kueue_pod_monitoring()["spec"]["endpoints"]
    assert mon.KUEUE_POD_LABELS.items() <= template["metadata"]["labels"].items()
    ports = {p["name"]: p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
    assert ports[endpoint["port"]] == 8443
    (chart_reader,) = [r for r in control_plane.chart.of_kind("ClusterRole")
                       if r["metadata"]["name"].endswith("-metrics-reader")]
    assert chart_reader["rules"] == mon.metrics_reader_role()["rules"]  # the same one right as the chart grants
