"""The fleet watch (plan C): `python -m failover.watch` (failover/watch/__main__.py says what it does and how it is
configured); decisions.py decides, controller.py carries it out."""
