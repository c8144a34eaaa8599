"""Operating tools for a cluster this project built: run on a user's machine, against the live cluster.

They read what Kueue, KubeRay and the failover controller write (queues, Workloads, RayJobs, ProvisioningRequests,
the controller's annotations and Events); they change nothing and are not part of the Pulumi program. The names they
look for come from the program and the controller (`infra.kueue`, `infra.failover`, `failover.regional.decisions`), so a rename
there is a rename here.

    python -m ops status [--kubeconfig PATH] [--context NAME] [-n NAMESPACE | -A] [-o table|json] [--watch]
"""
