"""Start and stop the tier's processes: each logs to a file, and teardown stops exactly what was started."""

from __future__ import annotations

import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


class StartError(RuntimeError):
    """A process of the tier did not start; the message ends with the tail of its log."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Process:
    name: str
    popen: subprocess.Popen
    log: Path

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def alive(self) -> bool:
        return self.popen.poll() is None


@dataclass
class Supervisor:
    """The processes one control plane started, in start order."""

    logs: Path
    processes: list[Process] = field(default_factory=list)

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None,
              cwd: Path | None = None) -> Process:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        with log.open("ab") as sink:
            # A session of its own: a signal to the test runner's group never reaches it, and we stop it alone.
            popen = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, env=env, cwd=cwd)
        process = Process(name, popen, log)
        self.processes.append(process)
        return process

    def wait_until(self, process: Process, ready: Callable[[], bool], timeout: float, what: str) -> float:
        """Seconds until `ready()`; a StartError if the process exits or the timeout passes first."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if not process.alive():
                raise StartError(f"{process.name} exited ({process.popen.returncode}) before {what}:\n"
                                 f"{process.tail()}")
            try:
                if ready():
                    return time.monotonic() - started
            except Exception:  # noqa: BLE001 - not up yet: connection refused, TLS not ready, 503...
                pass
            time.sleep(0.1)
        raise StartError(f"{process.name}: no {what} within {timeout:.0f} s:\n{process.tail()}")

    def stop(self, process: Process, grace: float = 10.0) -> None:
        if process.alive():
            process.popen.send_signal(signal.SIGTERM)
            try:
                process.popen.wait(grace)
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.popen.wait()
        if process in self.processes:
            self.processes.remove(process)

    def stop_all(self) -> None:
        for process in reversed(list(self.processes)):
            self.stop(process)


def start_serving(supervisor, name: str, argv: list[str], env: dict[str, str], cwd, timeout: float,
                  health_port: str, other_ports: tuple[str, ...] = (), attempts: int = 3) -> tuple[Process, dict]:
    """Start a program of ours that serves `/healthz` (answering "ok <its pid>") on the port in env[health_port],
    on ports free just now (and the `other_ports` env keys too); (the process, its env). A port taken between the
    pick and the program's bind (four test files start planes at once) is picked again, and an answer from another
    process on that port does not count (seen: a controller's port taken, the test talking to someone else's)."""
    for attempt in range(attempts):
        ports = {key: str(free_port()) for key in (health_port, *other_ports)}
        full = {**env, **ports}
        process = supervisor.start(name, argv, env=full, cwd=cwd)
        url = f"http://127.0.0.1:{ports[health_port]}/healthz"
        try:
            supervisor.wait_until(process, lambda: http_ok(url, expect=f"ok {process.popen.pid}\n"), timeout,
                                  "/healthz")
            return process, full
        except StartError as error:
            if "Address already in use" not in str(error) or attempt == attempts - 1:
                raise
            supervisor.stop(process)
    raise AssertionError("unreachable")


def http_ok(url: str, context: ssl.SSLContext | None = None, expect: str | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            body = response.read().decode(errors="replace")
            return response.status == 200 and (expect is None or expect in body)
    except (urllib.error.URLError, ConnectionError, TimeoutError, ssl.SSLError):
        return False

