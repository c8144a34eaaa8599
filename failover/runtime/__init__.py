"""What every program of this package runs on: informers and their cache (informer.py), a work queue (workqueue.py),
guarded writes and Events (writes.py), Prometheus metrics (metrics.py), /healthz (health.py), the API client
(cluster_client.py) and a fleet's member clients (members.py). No decision is made here."""
