"""Start and stop the tier's processes: each logs to a file, and teardown stops exactly what was started."""

from __future__ import annotations

import itertools
import os
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


def _ephemeral_range_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


# Listening ports come from just below the kernel's ephemeral range. A port picked by bind(0) lies inside it, so it
# is free only until the next outgoing connection takes it as its local port: seen in CI (2026-12-03), Kueue's
# health port taken between the pick and Kueue's bind ("bind: address already in use"). Each xdist worker draws from
# a block of its own, so two workers never pick the same port; Ray's worker ports (10002-19999) lie below them all.
PORT_BLOCK = 1500
PORT_BLOCKS = 8


def _worker_block() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # set before xdist's worker imports any test module
    return int(worker[2:]) % PORT_BLOCKS if worker[2:].isdigit() else 0


_BLOCK_START = _ephemeral_range_start() - PORT_BLOCK * (PORT_BLOCKS - _worker_block())
_next_ports = itertools.cycle(range(_BLOCK_START, _BLOCK_START + PORT_BLOCK))


def free_port() -> int:
    """A port nobody listens on now, outside the ephemeral range and this worker's alone (see above)."""
    for port in itertools.islice(_next_ports, PORT_BLOCK):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:  # in use (by a process of ours still running, or anyone else's)
                continue
            return port
    raise RuntimeError(f"no free port in {_BLOCK_START}-{_BLOCK_START + PORT_BLOCK - 1} (below the kernel's "
                       "ephemeral range, net.ipv4.ip_local_port_range)")


# The tier's Go programs (etcd, kube-apiserver, Kueue, KubeRay...) collect garbage a quarter as often as by default,
# each heap held under a soft 1 GiB: the suite is CPU-bound on 2 cores and memory is plentiful. Measured on the failover
# tier's file: the API server's CPU 45.7 -> 40.3 s. A GOGC or GOMEMLIMIT in the environment wins (to compare).
# Ref: https://go.dev/doc/gc-guide
GO_RUNTIME_ENV = {"GOGC": "400", "GOMEMLIMIT": "1GiB"}


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
        env = {**GO_RUNTIME_ENV, **(os.environ if env is None else env)}
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

