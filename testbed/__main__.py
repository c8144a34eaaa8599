"""The real control plane by hand.

    python -m testbed build [NAME...]   build what is missing (all by default) into the cache
    python -m testbed up [STACK]        start the tier (Kueue configured as STACK's release, dev
                                        by default), print how to reach it, stop on Ctrl-C
    python -m testbed wrappers          regenerate testbed/gomod/* after a version bump
"""

from __future__ import annotations

import signal
import sys
import time

from testbed import build


def up(stack: str = "dev") -> int:
    from infra.offline import PLACEHOLDER_PROJECT, run_program, stack_config
    from testbed.cluster import ControlPlane
    from testbed.stack import release_values

    config = {"gcp:project": PLACEHOLDER_PROJECT, **stack_config(stack)}
    plane = ControlPlane(release_values(run_program(config, stack)))  # Kueue as this stack's release configures it
    plane.start()
    print(f"control plane up in {sum(plane.timings.steps.values()):.1f} s: {plane.timings.steps}")
    print(f"  export KUBECONFIG={plane.kubeconfig}")
    print(f"  logs: {plane.supervisor.logs}")
    print("Ctrl-C stops it and removes its folder.", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while all(process.alive() for process in plane.supervisor.processes):
            time.sleep(1)
        print("a process exited:", {p.name: p.popen.returncode for p in plane.supervisor.processes}, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        plane.stop()


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "up"
    if command == "build":
        for name in argv[1:] or build.versions.BINARIES:
            print(f"{name}: {build.build(name)}")
        return 0
    if command == "wrappers":
        build.write_wrappers()
        return 0
    if command == "up":
        return up(*argv[1:2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
