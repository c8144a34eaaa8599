"""Metrics on Google Cloud Managed Service for Prometheus (GMP): PodMonitorings that scrape Kueue and the failover
controller, and a Cloud Monitoring dashboard over both. GKE's managed collection is turned on in infra/cluster.py.

Kueue 0.19.2 serves /metrics over HTTPS on the manager container's port `metrics` (8443), with a certificate the
manager makes itself at each start (no CA to verify it against), behind controller-runtime's authentication and
authorization filter: the scraper sends a bearer token, and Kueue asks the API server who it is (TokenReview) and
whether it may `get` the non-resource URL /metrics (SubjectAccessReview).
Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/cmd/kueue/main.go (L184-235)
Ref: https://github.com/kubernetes-sigs/controller-runtime/blob/v0.24.1/pkg/metrics/filters/filters.go
GMP's collector reads a scrape token only from a Secret in the PodMonitoring's own namespace, so Kueue's scrape
identity is a ServiceAccount in kueue-system with one right (get /metrics), whose token Secret the collector may
read, and nothing else. The failover controller serves plain HTTP inside the cluster: no token.
Ref: https://github.com/GoogleCloudPlatform/prometheus-engine/blob/v0.17.2/pkg/operator/apis/monitoring/v1/http_types.go (L90-106)
"""

from __future__ import annotations

import json

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from infra.failover import FailoverController
from infra.failover import NAME as FAILOVER_NAME
from infra.failover import NAMESPACE as FAILOVER_NAMESPACE
from infra.kueue import CHART_NAME, RELEASE_NAME, Kueue
from infra.kueue import NAMESPACE as KUEUE_NAMESPACE
from infra.settings import PlatformSettings

GMP_API_VERSION = "monitoring.googleapis.com/v1"
SCRAPE_INTERVAL = "30s"
METRICS_PATH = "/metrics"
# The chart's manager pod: its selector labels and the name of its 8443 container port.
# Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/charts/kueue/templates/_helpers.tpl (L64-68)
# Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/charts/kueue/templates/manager/manager.yaml (L79-81)
KUEUE_POD_LABELS = {"app.kubernetes.io/name": CHART_NAME, "app.kubernetes.io/instance": RELEASE_NAME,
                    "control-plane": "controller-manager"}
KUEUE_METRICS_PORT = "metrics"
FAILOVER_METRICS_PORT = "metrics"  # the Deployment's name for METRICS_PORT (infra/failover.py)
# Kueue's scrape identity: a ServiceAccount and its long-lived token (GMP reads tokens from Secrets only).
# Ref: https://kubernetes.io/docs/concepts/configuration/secret/#serviceaccount-token-secrets
KUEUE_READER = "tpu-fallback-kueue-metrics-reader"
TOKEN_SECRET = f"{KUEUE_READER}-token"
TOKEN_KEY = "token"
# GKE's managed collectors run as this ServiceAccount; Google's own sample grants it a Secret the same way.
# Ref: https://github.com/GoogleCloudPlatform/prometheus-engine/blob/v0.17.2/examples/inference-optimized-gateway/secret.yaml
COLLECTOR = {"kind": "ServiceAccount", "name": "collector", "namespace": "gmp-system"}
COLLECTOR_ROLE = "tpu-fallback-gmp-collector-token-reader"
# The collector watches the one Secret by name and reads it once (no list): both verbs, on that name only.
# Ref: https://github.com/GoogleCloudPlatform/prometheus/blob/main/google/secrets/watch.go (secretWatcher.start)
COLLECTOR_VERBS = ("get", "watch")
CONSOLE = "https://console.cloud.google.com/monitoring/dashboards/builder"
MONITORING_API = "monitoring.googleapis.com"

# The series the dashboard reads. Kueue's names and labels are those of its source at 0.19.2
# (pkg/metrics/metrics.go: Subsystem "kueue"); the controller's are fixed by failover/metrics.py.
KUEUE_PENDING = "kueue_pending_workloads"  # gauge {cluster_queue, status: active|inadmissible, replica_role}
MOVES = "tpu_fallback_moves_total"  # {from_flavor, to_flavor, reason}
MOVE_DELAY = "tpu_fallback_move_delay_seconds"  # histogram {reason}
ADMISSION_WAIT = "tpu_fallback_admission_wait_seconds"  # histogram {flavor}; Kueue's wait times are per queue
CHECK_OUTCOMES = "tpu_fallback_admission_check_outcomes_total"  # {admission_check, state}
RECONCILES = "tpu_fallback_reconciles_total"
RESYNCS = "tpu_fallback_resyncs_total"
ERRORS = "tpu_fallback_errors_total"
WATCHED = "tpu_fallback_workloads_watched"  # gauge


# ---- Kubernetes objects ------------------------------------------------------------------------------------------

def _rbac_ref(kind: str, name: str) -> dict:
    return {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}


def kueue_reader_account() -> dict:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": KUEUE_READER, "namespace": KUEUE_NAMESPACE}}


def token_secret() -> dict:
    """The token controller fills `token` for the named ServiceAccount; it stays valid while both exist."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
            "metadata": {"name": TOKEN_SECRET, "namespace": KUEUE_NAMESPACE,
                         "annotations": {"kubernetes.io/service-account.name": KUEUE_READER}}}


def metrics_reader_role() -> dict:
    """The one right Kueue's filter checks; the same rule as the chart's own `kueue-metrics-reader`.
    Non-resource URLs can only be granted cluster-wide. Ref: charts/kueue/templates/rbac/metrics_reader_role.yaml"""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": KUEUE_READER},
            "rules": [{"nonResourceURLs": [METRICS_PATH], "verbs": ["get"]}]}


def metrics_reader_binding() -> dict:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": KUEUE_READER}, "roleRef": _rbac_ref("ClusterRole", KUEUE_READER),
            "subjects": [{"kind": "ServiceAccount", "name": KUEUE_READER, "namespace": KUEUE_NAMESPACE}]}


def collector_token_role() -> dict:
    """GMP's collector may read the token Secret and no other (resourceNames), in kueue-system only."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": COLLECTOR_ROLE, "namespace": KUEUE_NAMESPACE},
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": [TOKEN_SECRET],
                       "verbs": list(COLLECTOR_VERBS)}]}


def collector_token_binding() -> dict:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": COLLECTOR_ROLE, "namespace": KUEUE_NAMESPACE},
            "roleRef": _rbac_ref("Role", COLLECTOR_ROLE), "subjects": [dict(COLLECTOR)]}


def _pod_monitoring(name: str, namespace: str, labels: dict, endpoint: dict) -> dict:
    return {"apiVersion": GMP_API_VERSION, "kind": "PodMonitoring",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": {"matchLabels": dict(labels)},
                     "endpoints": [{"path": METRICS_PATH, "interval": SCRAPE_INTERVAL, **endpoint}]}}


def kueue_pod_monitoring() -> dict:
    # Kueue's certificate is self-signed at each start for "localhost" (controller-runtime's fallback when no
    # certificate is mounted), so it cannot be verified; the chart's own ServiceMonitor skips verification too
    # (values.yaml metrics.serviceMonitor.tlsConfig.insecureSkipVerify). The token only lets its holder read
    # /metrics. Ref: https://github.com/kubernetes-sigs/controller-runtime/blob/v0.24.1/pkg/metrics/server/server.go
    return _pod_monitoring("kueue-controller-manager", KUEUE_NAMESPACE, KUEUE_POD_LABELS, {
        "port": KUEUE_METRICS_PORT,
        "scheme": "https",
        "tls": {"insecureSkipVerify": True},
        "authorization": {"type": "Bearer",
                          "credentials": {"secret": {"name": TOKEN_SECRET, "key": TOKEN_KEY}}},
    })


def failover_pod_monitoring() -> dict:
    return _pod_monitoring(FAILOVER_NAME, FAILOVER_NAMESPACE, {"app": FAILOVER_NAME},
                           {"port": FAILOVER_METRICS_PORT, "scheme": "http"})


# ---- the dashboard -----------------------------------------------------------------------------------------------

def series(metric: str, settings: PlatformSettings, *matchers: str) -> str:
    """A metric of this stack's cluster only: GMP labels every series with its cluster and location, and several
    stacks may share a project."""
    where = ",".join((f'cluster="{settings.cluster_name}"', f'location="{settings.zone}"', *matchers))
    return f"{metric}{{{where}}}"


def per_hour(metric: str, by: str, settings: PlatformSettings) -> str:
    return f"sum by ({by}) (increase({series(metric, settings)}[1h]))"


def quantile(q: float, histogram: str, by: str, settings: PlatformSettings, window: str) -> str:
    bucket = series(f"{histogram}_bucket", settings)
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({bucket}[{window}])))"


def data_set(query: str, plot: str = "LINE", axis: str = "Y1") -> dict:
    return {"timeSeriesQuery": {"prometheusQuery": query}, "plotType": plot, "targetAxis": axis}


def chart(title: str, data_sets: list[dict], y_label: str, y2_label: str | None = None) -> dict:
    xy: dict = {"dataSets": data_sets, "yAxis": {"label": y_label, "scale": "LINEAR"}}
    if y2_label:
        xy["y2Axis"] = {"label": y2_label, "scale": "LINEAR"}
    return {"title": title, "xyChart": xy}


def widgets(settings: PlatformSettings) -> list[dict]:
    s = settings
    # A follower replica (leader election) would report the same queues again.
    pending = series(KUEUE_PENDING, s, 'replica_role!="follower"')
    return [
        chart("Pending workloads per ClusterQueue (active: in the queue; inadmissible: waiting for a change)",
              [data_set(f"sum by (cluster_queue, status) ({pending})")], "workloads"),
        chart("Admission wait per flavor (creation or requeue to quota reserved; p50, p95 over 30m)",
              [data_set(quantile(q, ADMISSION_WAIT, "flavor", s, "30m")) for q in (0.5, 0.95)], "seconds"),
        chart("Moves down the queue chain by reason (per hour)",
              [data_set(per_hour(MOVES, "reason", s), "STACKED_BAR")], "moves"),
        chart("ProvisioningRequest outcomes by admission check and state (per hour)",
              [data_set(per_hour(CHECK_OUTCOMES, "admission_check, state", s), "STACKED_BAR")], "results"),
        chart("Move delay by reason (admission or first stockout signal to the move; p95 over 1h)",
              [data_set(quantile(0.95, MOVE_DELAY, "reason", s, "1h"))], "seconds"),
        chart("Failover controller: reconciles, resyncs and errors per second; Workloads watched",
              [*(data_set(f"sum(rate({series(metric, s)}[5m]))") for metric in (RECONCILES, RESYNCS, ERRORS)),
               # Each replica watches every Workload: the largest cache, not the sum.
               data_set(f"max({series(WATCHED, s)})", axis="Y2")],
              "per second", y2_label="Workloads"),
    ]


def mosaic(items: list[dict], columns: int = 48, per_row: int = 2, height: int = 16) -> dict:
    width = columns // per_row
    return {"columns": columns, "tiles": [
        {"xPos": (i % per_row) * width, "yPos": (i // per_row) * height, "width": width, "height": height,
         "widget": widget} for i, widget in enumerate(items)]}


def dashboard(settings: PlatformSettings) -> dict:
    return {"displayName": f"tpu-fallback {settings.cluster_name} ({settings.zone})",
            "mosaicLayout": mosaic(widgets(settings))}


def dashboard_url(dashboard_id: str, project: str) -> str:
    """The console page of a dashboard; its resource name is projects/<number>/dashboards/<id>."""
    return f"{CONSOLE}/{dashboard_id.rsplit('/', 1)[-1]}?project={project}"


# ---- the component -----------------------------------------------------------------------------------------------

class Monitoring(pulumi.ComponentResource):
    """Kueue's scrape identity and PodMonitoring, the controller's PodMonitoring, and the dashboard."""

    dashboard_url: pulumi.Output[str]

    def __init__(self, name: str, settings: PlatformSettings, kueue: Kueue, failover: FailoverController | None,
                 provider: k8s.Provider, opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpu-fallback:infra:Monitoring", name, None, opts)
        self._name, self._provider = name, provider
        # Kueue's namespace and pods come with its release; the PodMonitoring CRD with GKE's managed collection.
        account = self._object("reader-account", kueue_reader_account(), [kueue.release])
        token = self._object("reader-token", token_secret(), [account])
        role = self._object("reader-role", metrics_reader_role())
        reader = self._object("reader-binding", metrics_reader_binding(), [role, account])
        collector_role = self._object("collector-role", collector_token_role(), [kueue.release])
        collector = self._object("collector-binding", collector_token_binding(), [collector_role])
        # Scraped once its token is readable and authorized: the first scrapes do not fail.
        monitors = [kueue_pod_monitoring()]
        self._object("kueue", monitors[0], [kueue.release, token, reader, collector])
        if failover is not None:  # a one-rung stack runs no controller
            monitors.append(failover_pod_monitoring())
            self._object("failover", monitors[-1], [failover])

        api = gcp.projects.Service(f"{name}-api", project=settings.project, service=MONITORING_API,
                                   disable_on_destroy=False, opts=pulumi.ResourceOptions(parent=self))
        self.dashboard = gcp.monitoring.Dashboard(
            f"{name}-dashboard", project=settings.project,
            dashboard_json=json.dumps(dashboard(settings), sort_keys=True),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[api]))
        self.dashboard_url = self.dashboard.id.apply(lambda id_: dashboard_url(id_, settings.project))
        self.register_outputs({"dashboardUrl": self.dashboard_url,
                               "podMonitorings": [f"{m['metadata']['namespace']}/{m['metadata']['name']}"
                                                  for m in monitors]})

    def _object(self, suffix: str, manifest: dict, after: list[pulumi.Resource] | None = None) -> pulumi.Resource:
        """A Kubernetes object from its manifest, on the cluster's provider."""
        opts = pulumi.ResourceOptions(parent=self, provider=self._provider, depends_on=after or [])
        name, kind = f"{self._name}-{suffix}", manifest["kind"]
        body = {k: v for k, v in manifest.items() if k not in ("apiVersion", "kind")}
        typed = {"ServiceAccount": k8s.core.v1.ServiceAccount, "Secret": k8s.core.v1.Secret,
                 "ClusterRole": k8s.rbac.v1.ClusterRole, "ClusterRoleBinding": k8s.rbac.v1.ClusterRoleBinding,
                 "Role": k8s.rbac.v1.Role, "RoleBinding": k8s.rbac.v1.RoleBinding}
        if kind in typed:
            return typed[kind](name, **{_snake(k): v for k, v in body.items()}, opts=opts)
        return k8s.apiextensions.CustomResource(name, api_version=manifest["apiVersion"], kind=kind, **body,
                                                opts=opts)


def _snake(key: str) -> str:
    """roleRef -> role_ref: the typed resources take Python argument names."""
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in key)
