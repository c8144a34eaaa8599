"""Metrics on Google Cloud Managed Service for Prometheus (GMP): PodMonitorings that scrape Kueue and the failover
controller (a fleet's manager: Kueue and the fleet watch), a Cloud Monitoring dashboard and alert policies over
them. GKE's managed collection is turned on in infra/cluster.py. The platform (`Monitoring`) and a fleet's manager
(`FleetMonitoring`) share every builder here.

Kueue 0.19.2 serves /metrics over HTTPS on the manager container's port `metrics` (8443), with a certificate the
manager makes itself at each start (no CA to verify it against), behind controller-runtime's authentication and
authorization filter: the scraper sends a bearer token, and Kueue asks the API server who it is (TokenReview) and
whether it may `get` the non-resource URL /metrics (SubjectAccessReview).
Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/cmd/kueue/main.go (L184-235)
Ref: https://github.com/kubernetes-sigs/controller-runtime/blob/v0.24.1/pkg/metrics/filters/filters.go
GMP's collector reads a scrape token only from a Secret in the PodMonitoring's own namespace, so Kueue's scrape
identity is a ServiceAccount in kueue-system with one right (get /metrics), and a Secret the collector may read,
and nothing else. That Secret holds a one-hour token of the ServiceAccount (TokenRequest), which a small renewer
in kueue-system (failover/credentials.py) replaces before half its life: no never-expiring token Secret, and none
in the stack's state. The failover controller serves plain HTTP inside the cluster: no token.
Ref: https://github.com/GoogleCloudPlatform/prometheus-engine/blob/v0.17.2/pkg/operator/apis/monitoring/v1/http_types.go (L90-106)
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from failover import credentials
from failover.config import ScrapeRenewerConfig
from infra import failover as failover_code
from infra.failover import METRICS_PORT_NAME, FailoverController
from infra.failover import NAME as FAILOVER_NAME
from infra.failover import NAMESPACE as FAILOVER_NAMESPACE
from infra.fleet import CLUSTER_QUEUE as FLEET_CLUSTER_QUEUE
from infra.fleet import LADDER_NAME, WATCH_NAME, FleetManager
from infra.kueue import CHART_NAME, RELEASE_NAME, Kueue, queue_chain
from infra.kueue import NAMESPACE as KUEUE_NAMESPACE
from infra.settings import DEFAULT_RUNG, PlatformSettings
from infra.teams import team_chain

GMP_API_VERSION = "monitoring.googleapis.com/v1"
SCRAPE_INTERVAL = "30s"
METRICS_PATH = "/metrics"
# The chart's manager pod: its selector labels and the name of its 8443 container port.
# Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/charts/kueue/templates/_helpers.tpl (L64-68)
# Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/charts/kueue/templates/manager/manager.yaml (L79-81)
KUEUE_POD_LABELS = {"app.kubernetes.io/name": CHART_NAME, "app.kubernetes.io/instance": RELEASE_NAME,
                    "control-plane": "controller-manager"}
KUEUE_METRICS_PORT = "metrics"
# Kueue's scrape identity: a ServiceAccount, and a Secret that holds its current one-hour token (GMP reads tokens from
# Secrets only), renewed by SCRAPE_RENEWER. Ref: https://kubernetes.io/docs/reference/kubernetes-api/authentication-resources/token-request-v1/
KUEUE_READER = "tpu-fallback-kueue-metrics-reader"
TOKEN_SECRET = f"{KUEUE_READER}-token"
TOKEN_KEY = credentials.TOKEN_KEY
SCRAPE_RENEWER = "tpu-fallback-scrape-token"
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
# (pkg/metrics/metrics.go: Subsystem "kueue"); the controller's are fixed by failover/runtime/metrics.py.
KUEUE_PENDING = "kueue_pending_workloads"  # gauge {cluster_queue, status: active|inadmissible, replica_role}
MOVES = "tpu_fallback_moves_total"  # {from_flavor, to_flavor, reason}
MOVE_DELAY = "tpu_fallback_move_delay_seconds"  # histogram {reason}
ADMISSION_WAIT = "tpu_fallback_admission_wait_seconds"  # histogram {flavor}; Kueue's wait times are per queue
CHECK_OUTCOMES = "tpu_fallback_admission_check_outcomes_total"  # {admission_check, state}
RECONCILES = "tpu_fallback_reconciles_total"
RESYNCS = "tpu_fallback_resyncs_total"
ERRORS = "tpu_fallback_errors_total"
WATCHED = "tpu_fallback_workloads_watched"  # gauge
# The goodput controller's (failover/regional/goodput.py): each unfinished job's scheduling goodput, and per namespace
# the job-seconds of each state on each rung (docs/goodput.md).
JOB_GOODPUT = "tpu_fallback_job_scheduling_goodput"  # gauge {job_namespace, job_name}
SCHEDULING_SECONDS = "tpu_fallback_scheduling_seconds_total"  # {job_namespace, state, rung}
RUNNING_STATE = "running"  # failover/api/goodput.py RUNNING
# Kueue's per-ClusterQueue gauges of quota reserved and of admitted Workloads (a DWS or MultiKueue job waits between
# the two), and its admissions counter. Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/pkg/metrics/metrics.go
KUEUE_RESERVING = "kueue_reserving_active_workloads"
KUEUE_ADMITTED_ACTIVE = "kueue_admitted_active_workloads"
KUEUE_ADMITTED = "kueue_admitted_workloads_total"
# The fleet watch's (failover/runtime/metrics.py FleetMetrics).
FLEET_FINDINGS = "tpu_fallback_fleet_findings"  # gauge {state}
FLEET_REACHABLE = "tpu_fallback_fleet_member_reachable"  # gauge {member}: 1 or 0
FLEET_PASS = "tpu_fallback_fleet_pass_duration_seconds"  # histogram
FLEET_PASS_FAILURES = "tpu_fallback_fleet_pass_failures_total"
# GMP writes a target's scrape health as `up`, labelled job=<the PodMonitoring's name>, like Prometheus does.
# Ref: https://github.com/GoogleCloudPlatform/prometheus-engine/blob/main/e2e/collector_test.go (testValidateCollectorUpMetrics)
UP = "up"
LEADER = 'replica_role!="follower"'  # a follower replica (leader election) would report the same queues again

# ---- alerts ----
# Each query is proven on Prometheus's own rule engine (tests/test_alerts_promtool.py) over series shaped as the
# exporters and Managed Prometheus make them (docs/monitoring.md): labelled counters born at their
# first increment, a counter's first sample dropped by GMP, no staleness markers (a gone target's series lingers
# for the 5-minute lookback), `increase()` extrapolated to its window's edges, and `for` counting only from the
# first evaluation that returns a series.
STEP_SECONDS = 30  # the scrape interval, and the step of the subqueries that hold a condition inside the query
# A controller or watch that has not been scraped, or answered no scrape, for this long is down: ten 30 s scrapes,
# past the minute of pip installs at each start (infra/failover.py start_command).
DOWN_SECONDS = 300
# Looked at over two scrapes' range (never an instant selector, whose 5-minute lookback on Managed Prometheus keeps a
# gone target's last sample alive: `absent()` there fires 5 minutes late), then held by the policy's duration for
# the rest of DOWN_SECONDS. A target that never appeared (a pod never Running) counts from the policy's creation:
# it alerts DOWN_SECONDS - DOWN_RANGE_SECONDS after it.
DOWN_RANGE_SECONDS = 60
# The fleet watch asks each member every 10 s (infra/fleet.py WATCH_SECONDS); five minutes of silence is an outage,
# not a slow answer. MultiKueue gives up on the member only after workerLostTimeout (15m by default).
MEMBER_LOST_SECONDS = 300
# Policies are declared in the `pulumi up` that starts the exporters; Cloud Monitoring refuses a PromQL condition
# over a metric it has no series of yet, unless validation is off. Ref: monitoring.v3 discovery document,
# PrometheusQueryLanguageCondition.disableMetricValidation ("alerting policies ... on metrics that do not yet exist")
DISABLE_METRIC_VALIDATION = True
SEVERITY_WARNING, SEVERITY_ERROR = "WARNING", "ERROR"


# ---- Kubernetes objects ------------------------------------------------------------------------------------------

def _rbac_ref(kind: str, name: str) -> dict:
    return {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}


def kueue_reader_account() -> dict:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": KUEUE_READER, "namespace": KUEUE_NAMESPACE}}


def token_secret() -> dict:
    """Empty as the stack creates it (and ignores its data after): the renewer writes `token`."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": TOKEN_SECRET, "namespace": KUEUE_NAMESPACE}}


def scrape_renewer_account() -> dict:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": SCRAPE_RENEWER, "namespace": KUEUE_NAMESPACE}}


def scrape_renewer_role() -> dict:
    """The renewer may ask for tokens of the scrape identity and rewrite its Secret, nothing else."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": SCRAPE_RENEWER, "namespace": KUEUE_NAMESPACE},
            "rules": [{"apiGroups": [""], "resources": ["serviceaccounts/token"], "resourceNames": [KUEUE_READER],
                       "verbs": ["create"]},
                      {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [TOKEN_SECRET],
                       "verbs": ["get", "patch"]}]}


def scrape_renewer_binding() -> dict:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": SCRAPE_RENEWER, "namespace": KUEUE_NAMESPACE},
            "roleRef": _rbac_ref("Role", SCRAPE_RENEWER),
            "subjects": [{"kind": "ServiceAccount", "name": SCRAPE_RENEWER, "namespace": KUEUE_NAMESPACE}]}


def scrape_renewer_sources() -> dict[str, str]:
    return failover_code.package_sources(failover_code.RENEWER_FILES)


def scrape_renewer_deployment(settings: PlatformSettings) -> dict:
    configmap = failover_code.code_configmap_name(scrape_renewer_sources(), SCRAPE_RENEWER)
    config = ScrapeRenewerConfig((KUEUE_NAMESPACE, KUEUE_READER), (KUEUE_NAMESPACE, TOKEN_SECRET),
                                 datetime.timedelta(seconds=credentials.SCRAPE_TOKEN_SECONDS))
    return failover_code.controller_deployment(settings, SCRAPE_RENEWER, failover_code.RENEWER_MODULE, configmap,
                                               env=config.to_env(), namespace=KUEUE_NAMESPACE,
                                               files=failover_code.RENEWER_FILES)


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


def controller_pod_monitoring(name: str) -> dict:
    """A Deployment of infra/failover.py controller_deployment (pods labelled app=<name>), its plain-HTTP port."""
    return _pod_monitoring(name, FAILOVER_NAMESPACE, {"app": name}, {"port": METRICS_PORT_NAME, "scheme": "http"})


def failover_pod_monitoring() -> dict:
    return controller_pod_monitoring(FAILOVER_NAME)


def fleet_watch_pod_monitoring() -> dict:
    return controller_pod_monitoring(WATCH_NAME)


def fleet_ladder_pod_monitoring() -> dict:
    return controller_pod_monitoring(LADDER_NAME)


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
    return f"histogram_quantile({q}, sum by ({', '.join(filter(None, (by, 'le')))}) (rate({bucket}[{window}])))"


def data_set(query: str, plot: str = "LINE", axis: str = "Y1") -> dict:
    return {"timeSeriesQuery": {"prometheusQuery": query}, "plotType": plot, "targetAxis": axis}


def chart(title: str, data_sets: list[dict], y_label: str, y2_label: str | None = None) -> dict:
    xy: dict = {"dataSets": data_sets, "yAxis": {"label": y_label, "scale": "LINEAR"}}
    if y2_label:
        xy["y2Axis"] = {"label": y2_label, "scale": "LINEAR"}
    return {"title": title, "xyChart": xy}


def pending_chart(settings: PlatformSettings) -> dict:
    pending = series(KUEUE_PENDING, settings, LEADER)
    return chart("Pending workloads per ClusterQueue (active: in the queue; inadmissible: waiting for a change)",
                 [data_set(f"sum by (cluster_queue, status) ({pending})")], "workloads")


def widgets(settings: PlatformSettings) -> list[dict]:
    s = settings
    return [
        pending_chart(s),
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


def goodput_share(settings: PlatformSettings, window: str) -> str:
    """Per namespace, the share of its jobs' time over `window` they ran on a whole slice: running job-seconds over
    all job-seconds (their scheduling goodput over the window)."""
    running = series(SCHEDULING_SECONDS, settings, f'state="{RUNNING_STATE}"')
    every = series(SCHEDULING_SECONDS, settings)
    return (f"sum by (job_namespace) (increase({running}[{window}])) / "
            f"sum by (job_namespace) (increase({every}[{window}]))")


def goodput_widgets(settings: PlatformSettings) -> list[dict]:
    """The failover controller's goodput account (docs/goodput.md): per namespace over an hour, the jobs in each
    state on each rung, and the jobs that got least."""
    s = settings
    return [
        chart("Scheduling goodput per namespace (share of the jobs' time on a whole slice, over 1h)",
              [data_set(goodput_share(s, "1h"))], "share"),
        chart("Jobs in each state per rung (job-seconds per second, over 5m)",
              [data_set(f"sum by (state, rung) (rate({series(SCHEDULING_SECONDS, s)}[5m]))", "STACKED_AREA")],
              "jobs"),
        chart("The 10 unfinished jobs with the lowest scheduling goodput since their submission",
              [data_set(f"bottomk(10, min by (job_namespace, job_name) ({series(JOB_GOODPUT, s)}))")], "goodput"),
    ]


def mosaic(items: list[dict], columns: int = 48, per_row: int = 2, height: int = 16) -> dict:
    width = columns // per_row
    return {"columns": columns, "tiles": [
        {"xPos": (i % per_row) * width, "yPos": (i // per_row) * height, "width": width, "height": height,
         "widget": widget} for i, widget in enumerate(items)]}


def fleet_widgets(settings: PlatformSettings) -> list[dict]:
    """A fleet manager's: where its jobs run (the fleet watch), which members answer, its queue, the watch's pace."""
    s = settings
    return [
        chart("Fleet jobs by finding of the fleet watch's last pass (Running, Waiting, MemberLost, ...)",
              [data_set(f"sum by (state) ({series(FLEET_FINDINGS, s)})", "STACKED_BAR")], "jobs"),
        chart("Members answering the fleet watch (1: answers; 0: does not)",
              [data_set(f"min by (member) ({series(FLEET_REACHABLE, s)})")], "answers"),
        pending_chart(s),
        chart("Fleet watch: pass duration (p50, p95 over 30m); failed passes per hour",
              [*(data_set(quantile(q, FLEET_PASS, "", s, "30m")) for q in (0.5, 0.95)),
               data_set(f"sum(increase({series(FLEET_PASS_FAILURES, s)}[1h]))", axis="Y2")],
              "seconds", y2_label="failed passes"),
    ]


def dashboard(settings: PlatformSettings, items: list[dict] | None = None, kind: str = "") -> dict:
    """`kind` names the dashboard's stack role in its title (a fleet's), so several stacks can share a project."""
    title = " ".join(filter(None, ("tpu-fallback", kind, settings.cluster_name)))
    return {"displayName": f"{title} ({settings.zone})",
            "mosaicLayout": mosaic(widgets(settings) if items is None else items)}


def dashboard_url(dashboard_id: str, project: str) -> str:
    """The console page of a dashboard; its resource name is projects/<number>/dashboards/<id>."""
    return f"{CONSOLE}/{dashboard_id.rsplit('/', 1)[-1]}?project={project}"


# ---- alerts ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Alert:
    """One alert policy with one PromQL condition: it fires once `query` has returned a series for `for_seconds`
    (0: at once). Ref: https://cloud.google.com/monitoring/promql/create-promql-alerts"""

    key: str  # names the resource: <component>-alert-<key>
    title: str
    query: str
    for_seconds: int
    severity: str
    about: str  # markdown, sent with every notification


def rung_queues(settings: PlatformSettings) -> list[tuple[str, tuple[str, ...]]]:
    """Per enabled rung (config key), the ClusterQueues whose jobs wait on it: the chain's, and each team's."""
    chains = [queue_chain(settings), *(team_chain(settings, team) for team in settings.teams)]
    return [(plan.config_key, tuple(chain[index].cluster_queue for chain in chains))
            for index, plan in enumerate(settings.plans)]


def _total(metric: str, queues: Sequence[str], settings: PlatformSettings) -> str:
    return f"sum by (cluster_queue) ({series(metric, settings, _queue_match(queues), LEADER)})"


def _queue_match(queues: Sequence[str]) -> str:
    return f'cluster_queue="{queues[0]}"' if len(queues) == 1 else f'cluster_queue=~"{"|".join(sorted(queues))}"'


def _checks_waiting(queues: Sequence[str], settings: PlatformSettings) -> str:
    """Jobs holding quota while an admission check has not admitted them (DWS's ProvisioningRequest, MultiKueue's
    dispatch): reserving less admitted. admitted_active exists once a job was admitted there (`or ... * 0`)."""
    reserving = _total(KUEUE_RESERVING, queues, settings)
    return f"({reserving} - ({_total(KUEUE_ADMITTED_ACTIVE, queues, settings)} or {reserving} * 0))"


def _held(expression: str, seconds: int) -> str:
    """`expression` (per cluster_queue) above 0 at every scrape step of the last `seconds` and one step more, and
    there the whole time: the wait is held inside the query. (Held by the policy's duration instead, the condition
    would start counting only once a gate like "no admission in the window" let it through: up to twice late.) The
    extra step: a sample stands for the scrape interval before it, so a job seen at its first scrape may have come
    up to a step earlier, never later."""
    steps = -(-seconds // STEP_SECONDS) + 1
    window = f"[{steps * STEP_SECONDS}s:{STEP_SECONDS}s]"
    return (f"(min_over_time(({expression}){window}) > 0 "
            f"and on (cluster_queue) count_over_time(({expression}){window}) >= {steps})")


def _admitted_within(queues: Sequence[str], seconds: int, settings: PlatformSettings) -> str:
    """The ClusterQueues that admitted a job in the last `seconds`: the counter grew, or a series of it appeared
    (Kueue's labelled counter is born at 1 by an admission, and Managed Prometheus drops its first sample: the
    admission that created it is no increase). One scrape step more: `increase()` sees a step only with the sample
    before it in its range (promtool: with the bare `seconds`, an admission 9.5 minutes old was no longer seen by a
    10-minute window)."""
    admitted = series(KUEUE_ADMITTED, settings, _queue_match(queues), LEADER)
    window = seconds + STEP_SECONDS
    return (f"(sum by (cluster_queue) (increase({admitted}[{window}s])) > 0) "
            f"or count by (cluster_queue) ({admitted} unless {admitted} offset {window}s)")


def waiting_query(pending_queues: Sequence[str], check_queues: Sequence[str], seconds: int,
                  settings: PlatformSettings) -> str:
    """A job of these ClusterQueues has waited `seconds`: one was pending in `pending_queues`, or held quota in
    `check_queues` while its admission check waited, at every step of that time, and the queue admitted none.

    Kueue exports no job's age, only counts: a queue that never empties but admits is busy, not stuck. A wait for
    an admission check is judged by the checked rung's threshold whichever ClusterQueue holds the quota (a job of
    the first rung's queue may wait for a DWS slice it borrowed)."""
    queues = sorted({*pending_queues, *check_queues})
    return (f"{_held(_waiting(pending_queues, check_queues, settings), seconds)} "
            f"unless on (cluster_queue) ({_admitted_within(queues, seconds, settings)})")


def _waiting(pending_queues: Sequence[str], check_queues: Sequence[str], settings: PlatformSettings) -> str:
    """Per ClusterQueue, the jobs that wait: pending, plus holding quota while their admission check waits. One
    sum, so a wait that goes from one state to the other is one wait: held apart, a job pending 2 h and then
    waiting 2 h for its ProvisioningRequest restarted the clock and fired a 4 h threshold at 6 h."""
    parts = ([_total(KUEUE_PENDING, pending_queues, settings)] if pending_queues else []) + (
        [_checks_waiting(check_queues, settings)] if check_queues else [])
    if len(parts) == 1:
        return parts[0]
    pending, checking = parts
    return f"(({pending} + {checking}) or {pending} or {checking})"


def _duration(seconds: int) -> str:
    return f"{seconds // 3600}h" if seconds % 3600 == 0 else f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"


def waiting_alert(key: str, what: str, pending_queues: Sequence[str], check_queues: Sequence[str], seconds: int,
                  settings: PlatformSettings) -> Alert:
    queues = sorted({*pending_queues, *check_queues})
    return Alert(
        f"waiting-{key.lower()}", f"a job waits over {_duration(seconds)} {what}",
        waiting_query(pending_queues, check_queues, seconds, settings), 0, SEVERITY_WARNING,
        f"A job of ClusterQueue {', '.join(queues)} has waited over {_duration(seconds)} (pending, or holding quota "
        "while its admission check waits) and the queue admitted none meanwhile. `python -m ops status` says why "
        "each job waits; `kubectl get workloads -A` shows Kueue's view.")


def moves_query(settings: PlatformSettings) -> str:
    """Moves from each rung in the last hour, counted exactly: the counter now less an hour ago (no extrapolation:
    `increase()` reads 2 moves as 2.0168), or its whole value for a series younger than that (the controller
    declares every series at 0 when it starts: failover/runtime/metrics.py declare_moves). A counter reset inside the window
    (a container restart in the same pod) counts the moves since the restart only."""
    moves = series(MOVES, settings)
    return f"sum by (from_flavor) ((({moves} - {moves} offset 1h) >= 0) or {moves})"


def moves_alert(settings: PlatformSettings) -> Alert:
    limit = settings.monitoring.alerts.moves_per_hour
    return Alert(
        "moves", f"more than {limit} moves down the ladder from one rung in an hour",
        f"{moves_query(settings)} > {limit}", 0, SEVERITY_WARNING,
        "The failover controller keeps moving jobs off this rung (`from_flavor`): its TPUs do not come, a stockout "
        "in progress. The jobs go on lower rungs; check the rung's quota and the zone's capacity. The threshold is "
        "tpu-fallback:monitoring.alerts.movesPerHour.")


def goodput_alert(settings: PlatformSettings) -> Alert | None:
    """The jobs of a namespace ran on a whole slice less than the threshold's share of their time over the window,
    once that time adds up to a window (a lone job's first minutes say nothing yet); None with a threshold of 0. The
    controller counts each job's seconds as they pass (failover/regional/goodput.py), so `increase()` over the window
    is the window's account, a restart (a counter reset) included. A window's time less one scrape step: a lone job
    that waited all the window adds up to that, its first sample in the window being its start (promtool)."""
    below = settings.monitoring.alerts
    if not below.goodput_below_percent:
        return None
    window, every = _duration(below.goodput_window_seconds), series(SCHEDULING_SECONDS, settings)
    share = below.goodput_below_percent / 100
    return Alert(
        "goodput", f"jobs ran less than {below.goodput_below_percent}% of their time over {window}",
        f"({goodput_share(settings, window)} < {share:g}) and on (job_namespace) "
        f"(sum by (job_namespace) (increase({every}[{window}])) >= {below.goodput_window_seconds - STEP_SECONDS})",
        0,
        SEVERITY_WARNING,
        f"Over the last {window} the jobs of this namespace (`job_namespace`) ran on a whole slice less than "
        f"{below.goodput_below_percent}% of their time: their scheduling goodput (docs/goodput.md). `python -m ops "
        "status -o json` says where each job's time went (waiting for quota, for capacity on each rung, starting, "
        "on a broken slice, moving). The threshold and window are tpu-fallback:monitoring.alerts.goodputBelow.")


def down_alert(job: str, what: str, settings: PlatformSettings) -> Alert:
    """No scrape at all (the pod is gone, or collection stopped) or only failed scrapes (it does not answer), over
    DOWN_RANGE_SECONDS, held for the rest of DOWN_SECONDS."""
    up = series(UP, settings, f'namespace="{FAILOVER_NAMESPACE}"', f'job="{job}"')
    window = f"[{DOWN_RANGE_SECONDS}s]"
    return Alert(
        f"{job}-down", f"the {what} is down",
        f"absent_over_time({up}{window}) or max(max_over_time({up}{window})) == 0",
        DOWN_SECONDS - DOWN_RANGE_SECONDS, SEVERITY_ERROR,
        f"The {what} (Deployment {FAILOVER_NAMESPACE}/{job}) has not been scraped for {_duration(DOWN_SECONDS)}. "
        f"`kubectl -n {FAILOVER_NAMESPACE} get deploy {job}` and its logs say why.")


def member_alert(settings: PlatformSettings) -> Alert:
    return Alert(
        "member-unreachable", "a fleet member does not answer",
        f"min by (member) ({series(FLEET_REACHABLE, settings)}) == 0", MEMBER_LOST_SECONDS, SEVERITY_ERROR,
        f"The fleet watch has not reached this member (`member`) for {_duration(MEMBER_LOST_SECONDS)}, through the "
        "kubeconfig MultiKueue uses: MultiKueue likely cannot either (`kubectl get multikueueclusters`). A job "
        "admitted there is dispatched again after workerLostTimeout, while its run there may go on.")


def platform_alerts(settings: PlatformSettings, controller: bool) -> list[Alert]:
    """A job waiting too long on each rung (a wait for a rung's admission check, DWS's, in any ClusterQueue is that
    rung's); with a failover controller, too many moves, the controller down, and the jobs' goodput too low."""
    waits = settings.monitoring.alerts
    by_rung = rung_queues(settings)
    every_queue = [queue for _, queues in by_rung for queue in queues]
    checked = {plan.config_key for plan in settings.plans if plan.kind.admission_check}
    alerts = [waiting_alert(rung, f"on rung {rung}", queues, every_queue if rung in checked else (),
                            waits.pending_seconds(rung), settings)
              for rung, queues in by_rung]
    if controller:
        alerts += [moves_alert(settings), down_alert(FAILOVER_NAME, "failover controller", settings)]
        alerts += [alert for alert in (goodput_alert(settings),) if alert is not None]
    return alerts


def fleet_alerts(settings: PlatformSettings) -> list[Alert]:
    """A fleet job waiting too long for a member, the fleet watch or the fleet's ladder controller down, a member that
    does not answer."""
    seconds = settings.monitoring.alerts.pending_seconds(DEFAULT_RUNG)
    return [waiting_alert("fleet", "for a fleet member", [FLEET_CLUSTER_QUEUE], [FLEET_CLUSTER_QUEUE], seconds,
                          settings),
            down_alert(WATCH_NAME, "fleet watch", settings),
            down_alert(LADDER_NAME, "fleet's ladder controller", settings), member_alert(settings)]


def alert_policy(alert: Alert, settings: PlatformSettings) -> dict:
    """The AlertPolicy's arguments. Channels come from config; with none, incidents open in the console only."""
    condition: dict = {"query": alert.query, "disable_metric_validation": DISABLE_METRIC_VALIDATION}
    if alert.for_seconds:
        condition["duration"] = f"{alert.for_seconds}s"
    return {
        "display_name": f"tpu-fallback {settings.cluster_name} ({settings.zone}): {alert.title}",
        "combiner": "OR",  # one condition; the provider requires a combiner
        "severity": alert.severity,
        "conditions": [{"display_name": alert.title, "condition_prometheus_query_language": condition}],
        "documentation": {"content": alert.about, "mime_type": "text/markdown"},
        "notification_channels": list(settings.monitoring.alerts.notification_channels),
        "user_labels": {"app": "tpu-fallback", "cluster": settings.cluster_name},
    }


# ---- the components ----------------------------------------------------------------------------------------------

class _Observed(pulumi.ComponentResource):
    """What every stack's monitoring declares: Kueue's scrape identity and PodMonitoring, other PodMonitorings,
    the Cloud Monitoring API, a dashboard and the alert policies."""

    dashboard_url: pulumi.Output[str]

    def __init__(self, token: str, name: str, provider: k8s.Provider, opts: pulumi.ResourceOptions | None):
        super().__init__(token, name, None, opts)
        self._name, self._provider = name, provider
        self._monitors: list[dict] = []

    def _scrape_kueue(self, settings: PlatformSettings, release: pulumi.Resource) -> None:
        # Kueue's namespace and pods come with its release; the PodMonitoring CRD with GKE's managed collection.
        account = self._object("reader-account", kueue_reader_account(), [release])
        token = self._object("reader-token", token_secret(), [release], ignore_changes=["data", "stringData"])
        role = self._object("reader-role", metrics_reader_role())
        reader = self._object("reader-binding", metrics_reader_binding(), [role, account])
        collector_role = self._object("collector-role", collector_token_role(), [release])
        collector = self._object("collector-binding", collector_token_binding(), [collector_role])
        renewer = self._scrape_renewer(settings, [release, account, token])
        # Scraped once its token is written and authorized: the first scrapes do not fail.
        self._scrape("kueue", kueue_pod_monitoring(), [release, token, reader, collector, renewer])

    def _scrape_renewer(self, settings: PlatformSettings, after: list[pulumi.Resource]) -> pulumi.Resource:
        """The scrape token's renewer: its ServiceAccount and Role, its code (the renewer's files of the failover
        package), its Deployment, all in Kueue's namespace."""
        account = self._object("renewer-account", scrape_renewer_account(), after)
        role = self._object("renewer-role", scrape_renewer_role(), after)
        binding = self._object("renewer-binding", scrape_renewer_binding(), [role, account])
        sources = scrape_renewer_sources()
        code = self._object("renewer-code", {
            "apiVersion": "v1", "kind": "ConfigMap", "data": sources,
            "metadata": {"name": failover_code.code_configmap_name(sources, SCRAPE_RENEWER),
                         "namespace": KUEUE_NAMESPACE}}, after)
        return self._object("renewer", scrape_renewer_deployment(settings), [binding, code, *after])

    def _scrape(self, suffix: str, monitor: dict, after: list[pulumi.Resource]) -> None:
        self._monitors.append(monitor)
        self._object(suffix, monitor, after)

    def _publish(self, settings: PlatformSettings, board: dict, alerts: list[Alert]) -> None:
        name, project = self._name, settings.project
        api = gcp.projects.Service(f"{name}-api", project=project, service=MONITORING_API,
                                   disable_on_destroy=False, opts=pulumi.ResourceOptions(parent=self))
        after_api = pulumi.ResourceOptions(parent=self, depends_on=[api])
        self.dashboard = gcp.monitoring.Dashboard(f"{name}-dashboard", project=project,
                                                  dashboard_json=json.dumps(board, sort_keys=True), opts=after_api)
        if not settings.monitoring.alerts.enabled:
            alerts = []
        self.alert_policies = [gcp.monitoring.AlertPolicy(f"{name}-alert-{alert.key}", project=project,
                                                          **alert_policy(alert, settings), opts=after_api)
                               for alert in alerts]
        self.dashboard_url = self.dashboard.id.apply(lambda id_: dashboard_url(id_, project))
        self.register_outputs({"dashboardUrl": self.dashboard_url,
                               "podMonitorings": [f"{m['metadata']['namespace']}/{m['metadata']['name']}"
                                                  for m in self._monitors],
                               "alertPolicies": [alert.title for alert in alerts]})

    def _object(self, suffix: str, manifest: dict, after: list[pulumi.Resource] | None = None,
                ignore_changes: list[str] | None = None) -> pulumi.Resource:
        """A Kubernetes object from its manifest, on the cluster's provider."""
        opts = pulumi.ResourceOptions(parent=self, provider=self._provider, depends_on=after or [],
                                      ignore_changes=ignore_changes)
        name, kind = f"{self._name}-{suffix}", manifest["kind"]
        body = {k: v for k, v in manifest.items() if k not in ("apiVersion", "kind")}
        typed = {"ServiceAccount": k8s.core.v1.ServiceAccount, "Secret": k8s.core.v1.Secret,
                 "ClusterRole": k8s.rbac.v1.ClusterRole, "ClusterRoleBinding": k8s.rbac.v1.ClusterRoleBinding,
                 "Role": k8s.rbac.v1.Role, "RoleBinding": k8s.rbac.v1.RoleBinding,
                 "ConfigMap": k8s.core.v1.ConfigMap, "Deployment": k8s.apps.v1.Deployment}
        if kind in typed:
            return typed[kind](name, **{_snake(k): v for k, v in body.items()}, opts=opts)
        return k8s.apiextensions.CustomResource(name, api_version=manifest["apiVersion"], kind=kind, **body,
                                                opts=opts)


def _snake(key: str) -> str:
    """roleRef -> role_ref: the typed resources take Python argument names."""
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in key)


class Monitoring(_Observed):
    """A platform's: Kueue's scrape identity and PodMonitoring, the controller's PodMonitoring, the dashboard and
    the alerts (`tpu-fallback:infra:Monitoring`)."""

    def __init__(self, name: str, settings: PlatformSettings, kueue: Kueue, failover: FailoverController | None,
                 provider: k8s.Provider, opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpu-fallback:infra:Monitoring", name, provider, opts)
        self._scrape_kueue(settings, kueue.release)
        if failover is not None:  # a one-rung stack runs no controller
            self._scrape("failover", failover_pod_monitoring(), [failover])
        board = dashboard(settings, widgets(settings) + (goodput_widgets(settings) if failover is not None else []))
        self._publish(settings, board, platform_alerts(settings, failover is not None))


class FleetMonitoring(_Observed):
    """A fleet manager's (plan C): Kueue's scrape as on a platform, the fleet watch's and the fleet ladder's
    PodMonitorings, the fleet's dashboard and alerts (`tpu-fallback:infra:FleetMonitoring`)."""

    def __init__(self, name: str, settings: PlatformSettings, manager: FleetManager, provider: k8s.Provider,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpu-fallback:infra:FleetMonitoring", name, provider, opts)
        self._scrape_kueue(settings, manager.release)
        self._scrape("watch", fleet_watch_pod_monitoring(), [manager.watch])
        self._scrape("ladder", fleet_ladder_pod_monitoring(), [manager.ladder])
        self._publish(settings, dashboard(settings, fleet_widgets(settings), kind="fleet"), fleet_alerts(settings))
