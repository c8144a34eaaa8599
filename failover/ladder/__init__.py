"""The fleet's ladder controller (plan C): `python -m failover.ladder` (failover/ladder/__main__.py says what it
does and how it is configured); decisions.py decides, controller.py carries it out."""
