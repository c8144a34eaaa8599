"""A real control plane on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager and Kueue, configured from the
chart the stack installs.

Given a plan, the parts after admission run too (runtime.py): kube-scheduler, KWOK nodes shaped like the plan's
pools, the KubeRay operator, and GKE's autoscaler and the Ray head played. Without one, nothing runs a pod: TPU pods
never become ready (a natural stockout) and RayJobs are judged by Kueue's and KubeRay's CRDs and webhooks only.
Ref: https://kubernetes.io/docs/reference/command-line-tools-reference/kube-apiserver/,
https://kueue.sigs.k8s.io/docs/installation/ (the chart), https://kwok.sigs.k8s.io/docs/user/kwok-out-of-cluster/
"""

from __future__ import annotations

import base64
import fcntl
import functools
import hashlib
import json
import os
import shutil
import signal
import ssl
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from failover import credentials
from infra import kueue as stack_kueue
from infra.offline import Plan
from testbed import upstream
from testbed import build, chart, pki, versions
from testbed.kube import Kube, wait_for
from testbed.processes import Process, StartError, Supervisor, free_port, http_ok
from testbed.runtime import AfterAdmission

# Kueue opens this pair whenever its internal cert management is off, metrics or not (cmd/kueue/main.go).
KUEUE_METRICS_CERTS = Path("/etc/kueue/metrics/certs")
# RayService's too: the KubeRay operator watches all three kinds and does not start without them.
RAY_CRDS = tuple(upstream.crd("ray.io", plural) for plural in ("rayjobs", "rayclusters", "rayservices"))
PROVISIONING_REQUEST_CRD = upstream.crd("autoscaling.x-k8s.io", "provisioningrequests")
SERVICE_CIDR = "10.0.0.0/24"
# What deletion needs (the garbage collector removes `foregroundDeletion` finalizers and cascades to dependents; the
# namespace controller empties and removes deleted namespaces), and what fills a `kubernetes.io/service-account-token`
# Secret with `token` and `ca.crt` (the scrape token of infra/monitoring.py), and what fills the
# user-facing ClusterRoles (`edit`, `view`, `admin`: the API server creates them with an aggregation rule and no
# rules) from the ClusterRoles labelled to aggregate into them, the Kueue chart's among them, as on GKE.
# Ref: https://kubernetes.io/docs/reference/access-authn-authz/rbac/#aggregated-clusterroles
# Measured: no slower to start (the controller-manager step 0.24 s either way, median of 4 interleaved starts).
# And what real nodes need: `job` runs KubeRay's submitter Job, `podgc` deletes the pods of a node that is gone,
# `nodelifecycle` lifts the not-ready taint every new node is created with.
# Ref: https://kubernetes.io/docs/reference/command-line-tools-reference/kube-controller-manager/ (--controllers)
# The node lifecycle controller marks a node whose heartbeats stopped for this long Unknown, and its pods NotReady.
# The tier plays a failed host itself (testbed/gke.py _fail_host); a gap in heartbeats is only ever ours: a
# partition played by freezing the API server (`freeze`). At the default 50 s the controller tried to mark a member's
# nodes during a ~70 s partition (its log: "Error updating node"), and once the member answered again a Ray head just
# started there stayed NotReady (KWOK, unlike a kubelet, never reports a pod Ready again) until its job was evicted at
# podsReadyTimeout (the ladder tier's partition of the running member, right after its partition in the middle of a
# move, run beside another tier file).
NODE_MONITOR_GRACE = "10m"
# Kueue's clients (MultiKueue's to each member among them) find a server that stopped answering through client-go's
# HTTP/2 health check: a connection idle for HTTP2_READ_IDLE_TIMEOUT_SECONDS (default 30) is pinged, and closed when
# the ping is unanswered for HTTP2_PING_TIMEOUT_SECONDS (15); the next request then spends the TLS handshake timeout
# (10 s) on the frozen server: a partition scenario waited ~55 s for Kueue to lose the member. On the tier's clock, as
# podsReadyTimeout (testbed/stack.py): 10 + 5, so ~25 s. On GKE the defaults apply.
# Ref: k8s.io/apimachinery/pkg/util/net/http.go readIdleTimeoutSeconds, pingTimeoutSeconds (kubernetes/kubernetes#95981)
KUEUE_CLIENT_ENV = {"HTTP2_READ_IDLE_TIMEOUT_SECONDS": "10", "HTTP2_PING_TIMEOUT_SECONDS": "5"}
CONTROLLERS = ("garbagecollector", "namespace", "serviceaccount-token", "clusterrole-aggregation", "job", "podgc",
               "nodelifecycle")


@dataclass
class Timings:
    """Seconds each start step took, for the benchmark and the logs."""

    steps: dict[str, float] = field(default_factory=dict)

    def mark(self, step: str, since: float) -> float:
        now = time.monotonic()
        self.steps[step] = round(now - since, 2)
        return now


class ControlPlane:
    """Start with `start()`, stop with `stop()`; `kube` is an admin client, `kubeconfig` its file."""

    def __init__(self, kueue_values: dict, workdir: Path | None = None, apiserver_args: tuple[str, ...] = (),
                 nodes_of: Plan | None = None):
        """`kueue_values`: the values a stack's Helm release passes (stack.release_values(plan)); `apiserver_args`:
        more flags for kube-apiserver (a fleet member's: the Google-like token issuer it trusts); `nodes_of`: the
        plan whose node pools the tier plays, with the parts after admission (`after`) running."""
        self.kueue_values = kueue_values
        self.nodes_of = nodes_of
        self.after: AfterAdmission | None = None
        self.apiserver_args = tuple(apiserver_args)
        self._own_workdir = workdir is None
        self.workdir = Path(tempfile.mkdtemp(prefix="tpu-fallback-cp-")) if workdir is None else workdir
        self.supervisor = Supervisor(self.workdir / "logs")
        self.timings = Timings()
        self.kube: Kube | None = None
        self.apiserver: Process | None = None
        self.frozen = False
        self.chart: chart.RenderedChart | None = None
        self.kueue_config: dict = {}

    # ---- start -------------------------------------------------------------------------------------------------
    def start(self) -> ControlPlane:
        try:
            self._start()
        except BaseException:
            self.stop(keep_workdir=True)
            raise
        return self

    def _start(self) -> None:
        now = time.monotonic()
        binaries = build.build_all()
        now = self.timings.mark("binaries", now)
        pki_dir = self.workdir / "pki"
        self.ca = pki.Authority(pki_dir)
        serving = self.ca.serving("apiserver")
        self.sa_keys = pki.service_account_keys(pki_dir)
        admin = self.ca.client("admin", "tpu-fallback-admin", "system:masters")
        self.chart = chart.render(self.kueue_values, self.workdir)
        now = self.timings.mark("pki+chart", now)

        self._start_etcd(binaries["etcd"], seed=seeded_etcd(binaries))
        now = self.timings.mark("etcd", now)
        self._start_apiserver(binaries["kube-apiserver"], serving)
        self.kubeconfig = self._write_kubeconfig("admin", admin)
        self.kube = Kube(self.kubeconfig)
        now = self.timings.mark("kube-apiserver", now)
        self.webhook_port = free_port()
        self._install_crds()
        now = self.timings.mark("crds", now)
        self._install_cluster_roles()
        now = self.timings.mark("cluster roles", now)
        # After the CRDs: the garbage collector discovers resource types at start and then only every 30 s
        # (kube-controller-manager's GC sync), so a deletion right after a CRD appears could wait that long.
        self._start_controller_manager(binaries["kube-controller-manager"])
        now = self.timings.mark("kube-controller-manager", now)
        self._start_kueue(binaries["kueue"])
        now = self.timings.mark("kueue", now)
        if self.nodes_of is not None:
            self.after = AfterAdmission(self.supervisor, self.workdir, self.kubeconfig, self.nodes_of)
            self.after.start()  # assigned first: a start that fails half-way is stopped whole
            self.timings.mark("after admission", now)

    def _start_etcd(self, binary: Path, seed: Path | None = None) -> None:
        """etcd on free ports; from a copy of `seed` (a stopped etcd's data folder: seeded_etcd) when given."""
        if seed is not None:
            shutil.copytree(seed, self.workdir / "etcd")
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        process = self.supervisor.start("etcd", [
            str(binary), "--name", "tier", "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer}", "--initial-cluster", f"tier=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync", "--log-level", "warn"])
        self.supervisor.wait_until(process, lambda: http_ok(f"{self.etcd_url}/health", expect='"health":"true"'),
                                   30, "health")

    def _start_apiserver(self, binary: Path, serving: pki.KeyPair) -> None:
        port = free_port()
        self.server = f"https://127.0.0.1:{port}"
        process = self.supervisor.start("kube-apiserver", [
            str(binary), "--etcd-servers", self.etcd_url,
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={port}",
            f"--tls-cert-file={serving.cert}", f"--tls-private-key-file={serving.key}",
            f"--client-ca-file={self.ca.cert}", f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--service-account-issuer=https://127.0.0.1", f"--service-account-key-file={self.sa_keys.cert}",
            f"--service-account-signing-key-file={self.sa_keys.key}",
            "--authorization-mode=RBAC", "--disable-admission-plugins=ServiceAccount",
            "--endpoint-reconciler-type=none", f"--cert-dir={self.workdir / 'apiserver-certs'}",
            *self.apiserver_args])
        context = ssl.create_default_context(cafile=str(self.ca.cert))
        self.supervisor.wait_until(process, lambda: http_ok(f"{self.server}/readyz", context), 90, "/readyz")
        self.apiserver = process

    def _write_kubeconfig(self, user: str, credentials: pki.KeyPair | None = None, token: str | None = None) -> Path:
        auth = {"token": token} if token else {"client-certificate": str(credentials.cert),
                                               "client-key": str(credentials.key)}
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "tier",
            "clusters": [{"name": "tier", "cluster": {"server": self.server,
                                                      "certificate-authority": str(self.ca.cert)}}],
            "users": [{"name": user, "user": auth}],
            "contexts": [{"name": "tier", "context": {"cluster": "tier", "user": user}}],
        }
        path = self.workdir / f"{user}.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def kubeconfig_for_service_account(self, namespace: str, name: str) -> Path:
        """A kubeconfig holding a fresh token of a ServiceAccount: to run something with its RBAC, not admin's."""
        token = self.kube.service_account_token(namespace, name)
        return self._write_kubeconfig(f"sa-{namespace}-{name}", token=token)

    def kubeconfig_for_user(self, user: str, group: str, namespace: str | None = None) -> Path:
        """A kubeconfig of a person in a group, as GKE's Google Groups for RBAC presents a team member (their email
        as the user, their Google group's as a group; the server adds system:authenticated): a client certificate
        whose CN is the user and O the group. `namespace`: the context's, as `gcloud ... get-credentials` and a
        `kubectl config set-context --namespace` leave it."""
        stem = "user-" + "".join(c if c.isalnum() else "-" for c in user)
        path = self._write_kubeconfig(stem, self.ca.client(stem, user, group))
        if namespace:
            config = yaml.safe_load(path.read_text())
            config["contexts"][0]["context"]["namespace"] = namespace
            path.write_text(yaml.safe_dump(config))
        return path

    def client(self) -> Kube:
        """A new admin client: one per thread (a Kube must not be shared across threads)."""
        return Kube(self.kubeconfig)

    @property
    def access(self) -> dict[str, str]:
        """Where a fleet's manager reaches this plane, as a member publishes it (`fleetMember.access`): its server
        by IP (the serving certificate names 127.0.0.1, so the CA alone verifies it) and its CA."""
        return {"server": self.server, "certificateAuthorityData": base64.b64encode(self.ca.cert_pem).decode()}

    def inline_kubeconfig(self, token: str, name: str = "tier") -> str:
        """A kubeconfig text as the fleet's renewer writes it for the manager (failover/credentials.py)."""
        return credentials.inline_kubeconfig(name, self.access["server"], self.access["certificateAuthorityData"],
                                             token)

    def _start_controller_manager(self, binary: Path) -> None:
        port = free_port()
        process = self.supervisor.start("kube-controller-manager", [
            str(binary), f"--kubeconfig={self.kubeconfig}", f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}", "--bind-address=127.0.0.1", f"--secure-port={port}",
            "--leader-elect=false", f"--controllers={','.join(CONTROLLERS)}",
            "--use-service-account-credentials=false", f"--root-ca-file={self.ca.cert}",
            f"--service-account-private-key-file={self.sa_keys.key}",
            f"--node-monitor-grace-period={NODE_MONITOR_GRACE}",
            f"--cert-dir={self.workdir / 'kcm-certs'}"])
        insecure = ssl.create_default_context()
        insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE  # its self-signed serving cert
        self.supervisor.wait_until(process, lambda: http_ok(f"https://127.0.0.1:{port}/healthz", insecure),
                                   60, "/healthz")

    def _install_crds(self) -> None:
        """Kueue's CRDs from the chart (conversion by the local Kueue: each plane's own webhook port and CA), and the
        ones every plane shares, already in etcd's seed (`shared_crds`): KubeRay's, the ProvisioningRequest CRD,
        which must exist before Kueue starts or Kueue skips its provisioning controller, and GMP's PodMonitoring,
        which GKE's managed collection brings (before the garbage collector starts: measured, a PodMonitoring's
        foreground deletion waited 24 s for its 30 s rediscovery when the CRD came later)."""
        kueue = [chart.local_crd(crd, self.webhook_port, self.ca.cert_pem) for crd in self.chart.crds()]
        for crd in kueue:
            self.kube.create(crd)
        for crd in [*kueue, *shared_crds()]:
            self.kube.wait_crd_established(crd["metadata"]["name"], timeout=120)

    def _install_cluster_roles(self) -> None:
        """The chart's ClusterRoles, as the release installs them: its viewer roles aggregate into `view`, `edit`
        and `admin`, so what a team's `edit` binding grants on the tier is what it grants on GKE. Kueue runs with
        the admin credential here, so its own manager role is installed but not what Kueue runs with."""
        for role in self.chart.of_kind("ClusterRole"):
            self.kube.create(role)

    def _start_kueue(self, binary: Path) -> None:
        cert_dir = self.workdir / "kueue-webhook-certs"
        cert_dir.mkdir()
        serving = self.ca.serving("kueue-webhook")
        shutil.copy(serving.cert, cert_dir / "tls.crt")
        shutil.copy(serving.key, cert_dir / "tls.key")
        self._ensure_metrics_certs()

        health = free_port()
        self.kueue_config = chart.out_of_cluster_config(self.chart.manager_config(), health, self.webhook_port,
                                                        cert_dir)
        config_file = self.workdir / "kueue-config.yaml"
        config_file.write_text(yaml.safe_dump(self.kueue_config))
        self.webhook_configurations = chart.local_webhook_configurations(self.chart, self.webhook_port,
                                                                         self.ca.cert_pem)
        for configuration in self.webhook_configurations:
            self.kube.create(configuration)
        args = chart.with_feature_gates(self.chart.manager_args(), chart.TIER_FEATURE_GATES)
        self._kueue_argv = [str(binary), f"--config={config_file}", f"--kubeconfig={self.kubeconfig}", *args]
        self._kueue_health = health
        self._run_kueue()

    def _ensure_metrics_certs(self) -> None:
        """Any matching pair will do (metrics are off); a lock keeps tiers started in parallel from mixing a
        certificate of one with the key of another."""
        KUEUE_METRICS_CERTS.mkdir(parents=True, exist_ok=True)
        with open(KUEUE_METRICS_CERTS / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (KUEUE_METRICS_CERTS / "tls.crt").exists():
                metrics = self.ca.serving("kueue-metrics")
                shutil.copy(metrics.key, KUEUE_METRICS_CERTS / "tls.key")
                shutil.copy(metrics.cert, KUEUE_METRICS_CERTS / "tls.crt")  # last: its presence means done

    def _run_kueue(self, attempts: int = 3) -> None:
        """Start Kueue and wait until its webhook answers. Kueue exits when its informers do not sync within
        controller-runtime's timeout ("failed waiting for *v1.RayJob Informer to sync": seen with four planes of a
        fleet starting beside two busy loops); in a cluster its Deployment's pod is restarted, so the tier starts it
        again, as the kubelet would."""
        health = self._kueue_health
        for attempt in range(attempts):
            process = self.supervisor.start("kueue", self._kueue_argv, env={**os.environ, **KUEUE_CLIENT_ENV})
            try:
                self.supervisor.wait_until(process, lambda: http_ok(f"http://127.0.0.1:{health}/readyz"), 90,
                                           "/readyz")
                break
            except StartError as error:
                if "Informer to sync" not in str(error) or attempt == attempts - 1:
                    raise
                self.supervisor.stop(process)
        # Ready means the webhook answers through the API server, not only that the process listens.
        probe = {"apiVersion": stack_kueue.KUEUE_API_VERSION, "kind": "ResourceFlavor",
                 "metadata": {"name": "tier-readiness-probe"}, "spec": {}}
        self.supervisor.wait_until(process, lambda: self.kube.create(probe, dry_run=True) is not None, 90,
                                   "a webhook-checked dry-run")
        self.kueue = process

    # ---- stop --------------------------------------------------------------------------------------------------
    def stop_kueue(self) -> None:
        """Stop Kueue alone (to show what deleting after the controller is gone does)."""
        self.supervisor.stop(self.kueue)

    def restart_kueue(self) -> None:
        self._run_kueue()

    def uninstall_kueue(self, timeout: float = 60.0) -> None:
        """What `helm uninstall kueue` removes: the controller, its webhook configurations and its CRDs (the
        chart ships them as templates). KubeRay's and the ProvisioningRequest CRDs belong to GKE and stay."""
        self.stop_kueue()
        for configuration in self.webhook_configurations:
            self.kube.delete(configuration["apiVersion"], configuration["kind"], configuration["metadata"]["name"],
                             propagation="Background")
        for crd in self.chart.crds():
            self.kube.delete("apiextensions.k8s.io/v1", "CustomResourceDefinition", crd["metadata"]["name"],
                             propagation="Background")
        for crd in self.chart.crds():
            wait_for(lambda n=crd["metadata"]["name"]: self.kube.get(
                "apiextensions.k8s.io/v1", "CustomResourceDefinition", n) is None, timeout, f"CRD {crd['metadata']['name']} gone")

    def freeze(self) -> None:
        """SIGSTOP the kube-apiserver: a network partition as its clients see it (connections hang, TLS handshakes
        time out), while etcd, the controllers and Kueue keep running."""
        os.kill(self.apiserver.popen.pid, signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        """SIGCONT the kube-apiserver (harmless when it was not frozen)."""
        if self.apiserver is not None and self.apiserver.alive():
            os.kill(self.apiserver.popen.pid, signal.SIGCONT)
        self.frozen = False

    def stop(self, keep_workdir: bool = False) -> None:
        self.thaw()  # a stopped process ignores SIGTERM, and Kueue's shutdown would wait on the API server
        if self.after is not None:
            self.after.stop()
        self.supervisor.stop_all()
        if self._own_workdir and not keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


@functools.cache
def shared_crds() -> tuple[dict, ...]:
    """The CRDs that are the same in every plane: KubeRay's, the ProvisioningRequest, GMP's PodMonitoring. Parsed
    once per process (about 1 MiB of YAML), not at each plane's start; never changed by a caller."""
    return tuple(chart.load_yaml(upstream.path(item).read_text())
                 for item in (*RAY_CRDS, PROVISIONING_REQUEST_CRD, upstream.PODMONITORING_CRD))


def seeded_etcd(binaries: dict[str, Path]) -> Path:
    """An etcd data folder that holds the shared CRDs, established, made once per machine and kept in the cache,
    keyed by the versions and the CRDs; each plane's etcd starts from a copy. Measured (2 cores): creating
    KubeRay's three CRDs (300-430 KiB of schema each) costs the API server ~10 s of CPU per plane (validation,
    managed fields, OpenAPI), 21 planes in a suite; a plane started from the seed serves them at once."""
    seed = _seed_path(str(binaries["etcd"]), str(binaries["kube-apiserver"]))
    seed.parent.mkdir(parents=True, exist_ok=True)
    with open(seed.parent / ".lock", "w") as lock:  # one maker; planes started in parallel wait for it
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not seed.is_dir():
            _make_seed(binaries, shared_crds(), seed)
    return seed


@functools.cache
def _seed_path(etcd: str, apiserver: str) -> Path:
    """Where the seed of these builds and CRDs lies (hashed once per process)."""
    key = hashlib.sha256(json.dumps([etcd, apiserver, SERVICE_CIDR, shared_crds()],
                                    sort_keys=True).encode()).hexdigest()[:16]
    return versions.cache_dir() / "etcd-seed" / key


def _make_seed(binaries: dict[str, Path], crds: tuple[dict, ...], seed: Path) -> None:
    maker = ControlPlane({})
    try:
        maker.ca = pki.Authority(maker.workdir / "pki")
        maker.sa_keys = pki.service_account_keys(maker.workdir / "pki")
        maker._start_etcd(binaries["etcd"])
        maker._start_apiserver(binaries["kube-apiserver"], maker.ca.serving("apiserver"))
        maker.kube = Kube(maker._write_kubeconfig("admin", maker.ca.client("admin", "tpu-fallback-admin",
                                                                           "system:masters")))
        for crd in crds:
            maker.kube.create(crd)
        for crd in crds:
            maker.kube.wait_crd_established(crd["metadata"]["name"], timeout=120)
        for process in list(reversed(maker.supervisor.processes)):  # stopped cleanly: etcd's data is whole
            maker.supervisor.stop(process)
        partial = seed.with_name(seed.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(maker.workdir / "etcd", partial)
        partial.rename(seed)  # whole or absent
    finally:
        maker.stop()
