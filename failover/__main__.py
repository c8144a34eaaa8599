"""Run the failover controller: `python -m failover`.

Configuration (environment, set by the stack's Deployment):
    FAILOVER_CHAIN            JSON list of {flavor, clusterQueue, localQueue, admissionCheck}, rung 0 first
    FAILOVER_GRACE_SECONDS    how long the autoscaler must report no capacity before the early move (default 180)
    FAILOVER_RESYNC_SECONDS   seconds between passes over the Workloads (default 5)
    FAILOVER_HEALTH_PORT      /healthz port (default 8080; 0 turns it off)
    KUBECONFIG                outside a cluster; in a Pod the ServiceAccount's credentials are used
"""

from __future__ import annotations

import datetime
import http.server
import logging
import os
import sys
import threading
import time

from kubernetes import client, config

from failover.controller import Controller
from failover.decisions import Chain

log = logging.getLogger("tpu-fallback.failover")


class Health:
    """Healthy while passes keep completing: a stuck or crashing loop fails the liveness probe."""

    def __init__(self, resync: float):
        self.limit = 3 * resync + 30
        self.last_pass = time.monotonic()

    def ok(self) -> bool:
        return time.monotonic() - self.last_pass < self.limit

    def serve(self, port: int) -> None:
        health = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - the stdlib's name
                healthy = self.path == "/healthz" and health.ok()
                self.send_response(200 if healthy else 503)
                self.end_headers()
                self.wfile.write(b"ok\n" if healthy else b"stale\n")

            def log_message(self, *args):  # probes every few seconds: not worth a log line each
                pass

        server = http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()


def api_client() -> client.ApiClient:
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        config.load_incluster_config()
        return client.ApiClient()
    return config.new_client_from_config(config_file=os.environ.get("KUBECONFIG"))


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    chain = Chain.from_json(os.environ["FAILOVER_CHAIN"])
    grace = datetime.timedelta(seconds=float(os.environ.get("FAILOVER_GRACE_SECONDS", "180")))
    resync = float(os.environ.get("FAILOVER_RESYNC_SECONDS", "5"))
    health = Health(resync)
    port = int(os.environ.get("FAILOVER_HEALTH_PORT", "8080"))
    if port:
        health.serve(port)
    controller = Controller(api_client(), chain, grace)
    log.info("watching %s, grace %s, every %.1f s",
             " -> ".join(f"{r.flavor} ({r.local_queue})" for r in chain.rungs), grace, resync)
    while True:
        try:
            controller.reconcile_all()
            health.last_pass = time.monotonic()
        except Exception:  # noqa: BLE001 - one bad pass (API hiccup) must not end the controller
            log.exception("pass failed; retrying")
        time.sleep(resync)


if __name__ == "__main__":
    sys.exit(main())
