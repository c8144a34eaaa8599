"""The commands a user runs after `pulumi up`, derived from the settings (exported as `nextSteps`)."""

from __future__ import annotations

from infra.kueue import CLUSTER_QUEUE, LOCAL_QUEUE, LOCAL_QUEUE_NAMESPACE
from infra.settings import PlatformSettings


def next_steps(settings: PlatformSettings, job_names: list[str]) -> list[str]:
    location = f"--location={settings.zone} --project={settings.project}"
    steps = [
        f"gcloud container clusters get-credentials {settings.cluster_name} {location}",
        f"kubectl get clusterqueue {CLUSTER_QUEUE}",
        f"kubectl get localqueue {LOCAL_QUEUE} -n {LOCAL_QUEUE_NAMESPACE}",
        "kubectl get resourceflavors,admissionchecks",
        f"kubectl get workloads -n {LOCAL_QUEUE_NAMESPACE}",
    ]
    if settings.flex_start.enabled:
        for pool in settings.flex_start.pool_names(settings.tpu):
            steps.append(f"gcloud container node-pools describe {pool} --cluster={settings.cluster_name} "
                         f'{location} --format="get(config.flexStart)"')
    for job in job_names[:1]:
        steps.append(f"kubectl get rayjob {job} -w")
        steps.append(f"kubectl logs -f job/{job}")
    return steps
