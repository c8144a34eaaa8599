"""Operating tools for a cluster this project built: run on a user's machine, against the live cluster.

They read what Kueue, KubeRay and the failover controller write (queues, Workloads, RayJobs, ProvisioningRequests,
the controller's annotations and Events); they change nothing and are not part of the Pulumi program. The names they
look for come from the vocabulary the program and the controllers share (`failover.api`, its `names` module for the
objects the program deploys), so a rename there is a rename here; `ops/` never imports the Pulumi program (infra/).

    python -m ops status [--kubeconfig PATH] [--context NAME] [-n NAMESPACE | -A] [-o table|json] [--watch]
"""
