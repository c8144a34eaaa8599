"""What every program of this package runs on, as controller-runtime splits it: a manager (manager.py) that runs
the controllers registered on it (controller.py: what each watches, how a change maps to the keys it queues, and
`reconcile(key)`), one shared cache of informers and indexed stores (cache.py, informer.py), a fleet's member
caches (members.py), work queues and workers (workqueue.py), guarded writes and Events (writes.py), Prometheus
metrics (metrics.py), /healthz (health.py) and the API client (cluster_client.py). No decision is made here."""
