"""/healthz for a program of this package: the liveness probe of its Deployment."""

from __future__ import annotations

import http.server
import os
import threading
import time


class Health:
    """Healthy while every watch runs and the main loop keeps ticking: a dead watch or a stuck loop fails the
    liveness probe, and the kubelet restarts the controller."""

    LIMIT_SECONDS = 60

    def __init__(self, informers):
        self.informers = informers
        self.last_tick = time.monotonic()

    def ok(self) -> bool:
        return (time.monotonic() - self.last_tick < self.LIMIT_SECONDS
                and all(informer.is_alive() for informer in self.informers))

    def bind(self, port: int) -> http.server.ThreadingHTTPServer:
        """The /healthz server, bound now (a port that is taken fails the start at once) and served by `serve`. It
        answers "ok <pid>": whoever probes can tell this process from another one on the port."""
        health = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - the stdlib's name
                healthy = self.path == "/healthz" and health.ok()
                self.send_response(200 if healthy else 503)
                self.end_headers()
                self.wfile.write(f"ok {os.getpid()}\n".encode() if healthy else b"stale\n")

            def log_message(self, *args):  # probes every few seconds: not worth a log line each
                pass

        return http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler)

    @staticmethod
    def serve(server: http.server.ThreadingHTTPServer) -> None:
        threading.Thread(target=server.serve_forever, daemon=True).start()
