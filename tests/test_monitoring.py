"""Metrics on Managed Prometheus (infra/monitoring.py): the recorded graph, the PodMonitorings against GMP's upstream
CRD, the dashboard against monitoring.v1's discovery schema, the queried series against their sources, and the
scrape RBAC on the real tier's authorizer. Each check has a case it must reject.
"""

from __future__ import annotations

import copy
import json
import os
import re

import pytest

from infra import monitoring as mon
from infra.cluster import MONITORING_COMPONENTS
from infra.failover import METRICS_PORT
from infra.kueue import NAMESPACE as KUEUE_NAMESPACE
from infra.offline import OfflineEngine
from infra.settings import SettingsError
from tests import upstream
from tests.conftest import SHIPPED_STACKS, config_with, plan_for
from tests.gcp_schema import check_resource
from tests.k8s_schema import validation_errors

COMPONENT = "tpu-fallback:infra:Monitoring"
DASHBOARD = "gcp:monitoring/dashboard:Dashboard"
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
        "kueue", "failover", "api", "dashboard")}
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
                      "monitoring-collector-binding"}


def test_the_controllers_monitoring_waits_for_it_and_selects_its_pods_and_metrics_port():
    plan = plan_for()
    monitor = pod_monitorings(plan)[mon.FAILOVER_NAME]
    controller = plan.named("failover-deployment")
    assert controller.urn in plan.named("monitoring-failover").dependencies
    (deployment,) = [m for m in plan.kubernetes_manifests() if m["kind"] == "Deployment"]
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
    ({"dashboard": True}, "tpu-fallback:monitoring.dashboard: unknown field; allowed: enabled"),
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
    secret = manifests[("Secret", mon.TOKEN_SECRET)]
    assert secret["type"] == "kubernetes.io/service-account-token" and "data" not in secret  # no token in the state
    assert secret["metadata"]["annotations"] == {"kubernetes.io/service-account.name": mon.KUEUE_READER}


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
    controller = [mon.FAILOVER_NAME] if any(m["kind"] == "Deployment" for m in plan.kubernetes_manifests()) else []
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
        "Failover controller: reconciles, resyncs and errors per second; Workloads watched"]


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
    """The failover controller's metrics, from its own registry (failover/metrics.py)."""
    from failover.metrics import Metrics

    found = {}
    for metric in vars(Metrics()).values():
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
    from tests.controlplane.kube import Rejected
    from tests.controlplane.stack import deploy, destroy

    plan = plan_for()
    component = plan.only(COMPONENT).urn
    wanted = {r.urn for r in plan.resources if r.parent == component} | {plan.named("kueue-namespace").urn,
                                                                         plan.named("failover-namespace").urn}
    kube = control_plane.kube
    deployed = deploy(kube, Plan([r for r in plan.resources if r.urn in wanted], {}, set()))
    try:
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
        assert destroy(kube, deployed.steps).stuck == {}


@pytest.mark.controlplane
def test_the_kueue_monitoring_selects_the_charts_manager_pod_and_its_metrics_port(control_plane):
    """Against the chart rendered with the stack's values (tests/controlplane/chart.py)."""
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
