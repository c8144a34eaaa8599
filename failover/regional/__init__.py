"""The regional failover controller, one per platform stack: `python -m failover.regional` (failover/regional/__main__.py
says how it is configured); decisions.py decides where a job that never got its slice goes next, failover/slices.py
what a running job that lost its slice waits for, and controller.py carries both out."""
