"""failover/runtime/informer.py's raw calls against a real HTTP/1.1 server: an answer handed back to the connection pool
leaves nothing unread for the next request on that connection."""

from __future__ import annotations

import http.server
import json
import threading

import pytest
from kubernetes import client

from failover.runtime.informer import RawClient, release
from testbed.google import JsonHandler

BIG = "x" * 200_000  # a Workload's whole status with its managedFields, as an apply answers it


class _Handler(JsonHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one connection serves the requests in turn

    def do_PATCH(self):
        self._read_body()
        self._json({"kind": "Workload", "status": {"big": BIG}})

    def do_POST(self):
        self._read_body()
        self._json({"kind": "Event"})

    def _read_body(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))


@pytest.fixture
def raw():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.server_port}"
    try:
        yield RawClient(client.ApiClient(configuration))
    finally:
        server.shutdown()
        server.server_close()


def test_an_answer_released_unread_does_not_spoil_the_next_request_on_its_connection(raw):
    for _ in range(3):  # the fleet watch's repair, then an Event, on the same connection
        release(raw.request("PATCH", "/apis/kueue.x-k8s.io/v1beta2/namespaces/n/workloads/w/status", body="{}",
                            serialize=False, content_type="application/apply-patch+yaml"))
        # A POST, as the Event the watch writes next: urllib3 retries a GET on a spoilt connection, never a POST.
        created = raw.request("POST", "/api/v1/namespaces/n/events", body="{}", serialize=False)
        assert json.loads(created.data) == {"kind": "Event"}
