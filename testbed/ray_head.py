"""The one part of Ray the tier plays: the Ray head's Jobs API that KubeRay asks for a job's status.

KubeRay 1.6 asks `GET http://<head service>.<namespace>.svc.cluster.local:8265/api/jobs/<submission id>` with Go's
default transport (ray-operator `controllers/ray/utils/util.go`, `dashboardclient/dashboard_httpclient.go`), so
the operator runs with `HTTP_PROXY` pointing here and every dashboard call lands on this server, which reads the
URL's host for the namespace.

What it answers follows what a real head does in KubeRay's default K8sJobMode:
- 404 until the submitter pod (KubeRay's Job named after the RayJob) is Running: `ray job submit` has not reached
  the head yet, and KubeRay reads a 404 as "not submitted" (no PodsReady for Kueue before it);
- then `RUNNING`, until a test ends the job with `finish` (`SUCCEEDED`, `FAILED` or `STOPPED`);
- at the end, the submitter's `ray job submit` returns with the job's outcome: its pod is annotated with the exit
  code, and KWOK's `pod-exit` stage (runtime.py) terminates it, so the real job controller completes (or fails)
  KubeRay's Job, which KubeRay waits for before it calls the RayJob done. A submitter pod the Job controller starts
  again after a failure returns at once with the same outcome (the submission exists and has ended).
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from testbed.kube import Kube

RAYJOB = ("ray.io/v1", "RayJob")
DASHBOARD_PORT = 8265
JOBS_PATH = "/api/jobs/"
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
# Read by KWOK's pod-exit stage (runtime.py): the submitter's exit code once `ray job submit` returns.
EXIT_CODE_ANNOTATION = "tier.tpu-fallback/exit-code"


@dataclass
class RayJobState:
    rayjob: str
    status: str = "RUNNING"
    started_ms: int = 0
    ended_ms: int = 0
    message: str = ""


@dataclass
class RayHead:
    """`start()`; `proxy_url` is what KubeRay's HTTP_PROXY is set to; `finish(namespace, rayjob, status)` ends the
    Ray job of a RayJob's current run."""

    kubeconfig: Path
    jobs: dict[tuple[str, str], RayJobState] = field(default_factory=dict)  # (namespace, submission id)
    asked: int = 0
    submit_delay: float = 0.0  # seconds from the submitter pod Running to its `ray job submit` reaching the head
    _submitter_seen: dict[tuple[str, str], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._kube: Kube | None = None

    def start(self) -> RayHead:
        self._kube = Kube(self.kubeconfig)
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True, name="ray-head").start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def proxy_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    # ---- the tests' side ---------------------------------------------------------------------------------------
    def finish(self, namespace: str, rayjob: str, status: str = "SUCCEEDED", message: str = "") -> str:
        """End the Ray job of `rayjob`'s current run; its submission id."""
        if status not in TERMINAL:
            raise ValueError(f"{status!r} is not a terminal Ray job status: {TERMINAL}")
        with self._lock:
            job = self._kube.get(*RAYJOB, rayjob, namespace)
            submission = ((job or {}).get("status") or {}).get("jobId")
            state = self.jobs.get((namespace, submission or ""))
            if state is None:
                raise RuntimeError(f"{namespace}/{rayjob} has no Ray job running on its head (jobId {submission!r})")
            state.status, state.ended_ms, state.message = status, int(time.time() * 1000), message
            self._submitter_exits(namespace, rayjob, 0 if status == "SUCCEEDED" else 1)
        return submission

    def _submitter_exits(self, namespace: str, rayjob: str, code: int) -> None:
        for pod in self._submitter_pods(namespace, rayjob):
            if EXIT_CODE_ANNOTATION in (pod["metadata"].get("annotations") or {}):
                continue
            self._kube.patch("v1", "Pod", pod["metadata"]["name"],
                             {"metadata": {"annotations": {EXIT_CODE_ANNOTATION: str(code)}}}, namespace=namespace)

    def _submitter_pods(self, namespace: str, rayjob: str) -> list[dict]:
        return [pod for pod in self._kube.list("v1", "Pod", namespace=namespace)
                if any(o["kind"] == "Job" and o["name"] == rayjob
                       for o in pod["metadata"].get("ownerReferences") or [])
                and not pod["metadata"].get("deletionTimestamp")]

    def asked_for(self, namespace: str, submission: str | None) -> bool:
        """The head has answered for this job (KubeRay's GetJobInfo got it)."""
        with self._lock:
            return (namespace, submission or "") in self.jobs

    # ---- the head's side ---------------------------------------------------------------------------------------
    def answer(self, method: str, url: str) -> tuple[int, dict]:
        parts = urlsplit(url)
        host = parts.hostname or ""
        if not parts.path.startswith(JOBS_PATH) or ".svc." not in host:
            return 404, {"error": f"the tier's Ray head plays only {JOBS_PATH}"}
        namespace = host.split(".")[1]
        rest = parts.path[len(JOBS_PATH):].strip("/").split("/")
        submission = rest[0]
        with self._lock:
            self.asked += 1
            state = self.jobs.get((namespace, submission))
            if state is None:
                rayjob = self._submitted(namespace, submission) if method == "GET" else None
                if rayjob is None:
                    return 404, {"error": f"Job {submission} does not exist"}
                state = self.jobs[(namespace, submission)] = RayJobState(rayjob, started_ms=int(time.time() * 1000))
            if state.status in TERMINAL:  # a submitter started again after the end returns at once
                self._submitter_exits(namespace, state.rayjob, 0 if state.status == "SUCCEEDED" else 1)
            if method == "POST" and rest[1:] == ["stop"]:
                if state.status not in TERMINAL:
                    state.status, state.ended_ms = "STOPPED", int(time.time() * 1000)
                return 200, {"stopped": True}
            if method == "DELETE":
                del self.jobs[(namespace, submission)]
                return 200, {"deleted": True}
            info = {"job_id": submission, "submission_id": submission, "status": state.status,
                    "entrypoint": "", "message": state.message, "start_time": state.started_ms}
            if state.ended_ms:
                info["end_time"] = state.ended_ms
            return 200, info

    def _submitted(self, namespace: str, submission: str) -> str | None:
        """The RayJob whose run this is, once `ray job submit` has run: its submitter pod Running (for
        `submit_delay` seconds)."""
        for job in self._kube.list(*RAYJOB, namespace=namespace):
            if (job.get("status") or {}).get("jobId") == submission:
                name = job["metadata"]["name"]
                if not any((pod.get("status") or {}).get("phase") == "Running"
                           for pod in self._submitter_pods(namespace, name)):
                    return None
                seen = self._submitter_seen.setdefault((namespace, submission), time.monotonic())
                return name if time.monotonic() - seen >= self.submit_delay else None
        return None

    def _handler(self) -> type:
        head = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _reply(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                code, body = head.answer(self.command, self.path)
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _reply  # noqa: N815 - http.server's names

            def log_message(self, *args) -> None:
                pass

        return Handler
