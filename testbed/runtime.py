"""After admission, for real: kube-scheduler, KWOK's nodes, the KubeRay operator, and GKE and the Ray head played.

Started on a ControlPlane (cluster.py) that was given a plan: the scheduler places every pod, KWOK makes the nodes
of the plan's pools Ready and the pods on them Running (no container runs), KubeRay turns RayJobs into RayClusters,
pods and submitter Jobs (all namespaces, `spec.managedBy` and Kueue's suspend honoured, as upstream always does), and
kube-controller-manager's job, podgc and nodelifecycle controllers do what they do on GKE. Played: GCE capacity
(gke.Autoscaler, over the plan's node templates) and the Ray head's Jobs API (ray_head.RayHead).
Ref: https://kwok.sigs.k8s.io/docs/user/kwok-out-of-cluster/,
https://github.com/ray-project/kuberay/blob/v1.6.2/ray-operator/controllers/ray/rayjob_controller.go
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from infra.offline import Plan
from testbed import build, gke
from testbed.processes import Process, Supervisor, free_port, http_ok
from testbed.ray_head import EXIT_CODE_ANNOTATION, RayHead

# KWOK's own stages (its module's kustomize/stage): nodes become Ready and keep a heartbeat, pods become Running and
# Ready on their node, deleted pods go. Its pod-complete stage is left out: it completes every Job-owned pod at once,
# KubeRay's submitter included; the submitter ends when the Ray head says so (ray_head.py, pod_exit_stages).
KWOK_STAGES = ("node/fast/node-initialize.yaml", "node/heartbeat/node-heartbeat.yaml", "pod/fast/pod-ready.yaml",
               "pod/fast/pod-delete.yaml")
POD_CIDR = "10.64.0.0/16"


def pod_exit_stages() -> list[dict]:
    """KWOK stages that end a Running pod the Ray head stand-in annotated with its exit code: `ray job submit`
    returning with the Ray job's outcome."""
    stages = []
    for code, phase, reason in ((0, "Succeeded", "Completed"), (1, "Failed", "Error")):
        stages.append({
            "apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": f"tier-pod-exit-{code}"},
            "spec": {
                "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
                "selector": {"matchAnnotations": {EXIT_CODE_ANNOTATION: str(code)},
                             "matchExpressions": [
                                 {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
                                 {"key": ".status.phase", "operator": "In", "values": ["Running"]}]},
                "next": {"statusTemplate": (
                    "{{ $now := Now }}\n"
                    # A kubelet's terminated pod: not Ready any more (KWOK's pod-ready stage set it True).
                    "conditions:\n"
                    "- lastTransitionTime: {{ $now | Quote }}\n  status: \"True\"\n  type: Initialized\n"
                    "- lastTransitionTime: {{ $now | Quote }}\n  status: \"False\"\n  type: Ready\n"
                    "  reason: PodCompleted\n"
                    "- lastTransitionTime: {{ $now | Quote }}\n  status: \"False\"\n  type: ContainersReady\n"
                    "  reason: PodCompleted\n"
                    "- lastTransitionTime: {{ $now | Quote }}\n  status: \"True\"\n  type: PodScheduled\n"
                    "containerStatuses:\n"
                    "{{ range .spec.containers }}\n"
                    "- image: {{ .image | Quote }}\n"
                    "  name: {{ .name | Quote }}\n"
                    "  ready: false\n"
                    "  restartCount: 0\n"
                    "  started: false\n"
                    "  state:\n"
                    "    terminated:\n"
                    f"      exitCode: {code}\n"
                    "      finishedAt: {{ $now | Quote }}\n"
                    f"      reason: {reason}\n"
                    "      startedAt: {{ $now | Quote }}\n"
                    "{{ end }}\n"
                    f"phase: {phase}\n")}}})
    return stages


@dataclass
class AfterAdmission:
    """The parts after admission, on a started plane (its supervisor stops the processes)."""

    supervisor: Supervisor
    workdir: Path
    kubeconfig: Path
    plan: Plan
    scale_up_seconds: float = 0.5
    processes: dict[str, Process] = field(default_factory=dict)

    def start(self) -> AfterAdmission:
        binaries = {name: build.build(name) for name in ("kube-scheduler", "kwok", "kuberay-operator")}
        self._start_scheduler(binaries["kube-scheduler"])
        self._start_kwok(binaries["kwok"])
        self.ray_head = RayHead(self.kubeconfig).start()
        self._start_kuberay(binaries["kuberay-operator"])
        cluster = self.plan.only(gke.CLUSTER_TYPE).inputs
        self.gke = gke.Autoscaler(self.kubeconfig, gke.node_templates(self.plan), cluster["name"],
                                  cluster["location"], log=self.supervisor.logs / "gke-autoscaler.log",
                                  scale_up_seconds=self.scale_up_seconds).start()
        return self

    def stop(self) -> None:
        for part in ("gke", "ray_head"):
            if hasattr(self, part):
                getattr(self, part).stop()

    def _start_scheduler(self, binary: Path) -> None:
        config = self.workdir / "kube-scheduler.yaml"
        config.write_text(yaml.safe_dump({
            "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(self.kubeconfig)}, "leaderElection": {"leaderElect": False}}))
        port = free_port()
        process = self.supervisor.start("kube-scheduler", [
            str(binary), f"--config={config}", f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}", "--bind-address=127.0.0.1", f"--secure-port={port}",
            f"--cert-dir={self.workdir / 'scheduler-certs'}"])
        insecure = ssl.create_default_context()
        insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE  # its self-signed serving cert
        self.supervisor.wait_until(process, lambda: http_ok(f"https://127.0.0.1:{port}/healthz", insecure), 60,
                                   "/healthz")
        self.processes["kube-scheduler"] = process

    def _start_kwok(self, binary: Path) -> None:
        stage_dir = build.module_dir("kwok") / "kustomize" / "stage"
        own = self.workdir / "kwok-stages.yaml"
        own.write_text(yaml.safe_dump_all(pod_exit_stages()))
        configs = [str(stage_dir / stage) for stage in KWOK_STAGES] + [str(own)]
        port = free_port()
        process = self.supervisor.start("kwok", [
            str(binary), *[arg for c in configs for arg in ("-c", c)], f"--kubeconfig={self.kubeconfig}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={gke.KWOK_ANNOTATION[0]}={gke.KWOK_ANNOTATION[1]}",
            f"--cidr={POD_CIDR}", "--node-ip=10.128.0.1", f"--server-address=127.0.0.1:{port}"],
            env={"HOME": str(self.workdir)})  # no ~/.kwok of the user's is read
        self.supervisor.wait_until(process, lambda: http_ok(f"http://127.0.0.1:{port}/healthz"), 60, "/healthz")
        self.processes["kwok"] = process

    def _start_kuberay(self, binary: Path) -> None:
        port = free_port()
        env = {"KUBECONFIG": str(self.kubeconfig), "HOME": str(self.workdir),
               # Every dashboard call goes to the Ray head stand-in; the API server (127.0.0.1) is never proxied.
               "HTTP_PROXY": self.ray_head.proxy_url, "NO_PROXY": "127.0.0.1,localhost"}
        process = self.supervisor.start("kuberay-operator", [
            str(binary), "--enable-leader-election=false", "--metrics-addr=0",
            f"--health-probe-bind-address=127.0.0.1:{port}", "--log-stdout-encoder=console"], env=env)
        self.supervisor.wait_until(process, lambda: http_ok(f"http://127.0.0.1:{port}/readyz"), 90, "/readyz")
        self.processes["kuberay-operator"] = process
