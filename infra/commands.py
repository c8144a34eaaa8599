"""The commands a user runs after `pulumi up`, derived from the settings (exported as `nextSteps`)."""

from __future__ import annotations

from failover.api import MOVE_EVENT_REASON
from infra import failover
from infra.kueue import LOCAL_QUEUE_NAMESPACE, queue_chain
from infra.settings import PlatformSettings


def next_steps(settings: PlatformSettings, job_names: list[str]) -> list[str]:
    location = f"--location={settings.zone} --project={settings.project}"
    chain = queue_chain(settings)
    steps = [
        f"gcloud container clusters get-credentials {settings.cluster_name} {location}",
        f"kubectl get clusterqueue {' '.join(rung.cluster_queue for rung in chain)}",
        f"kubectl get localqueue {' '.join(rung.local_queue for rung in chain)} -n {LOCAL_QUEUE_NAMESPACE}",
        "kubectl get resourceflavors,admissionchecks",
        f"kubectl get workloads -n {LOCAL_QUEUE_NAMESPACE}",
    ]
    if len(chain) > 1:  # the failover controller: one log line per move, and the Events it records
        steps.append(f"kubectl logs -n {failover.NAMESPACE} deploy/{failover.NAME}")
        steps.append(f"kubectl get events -n {LOCAL_QUEUE_NAMESPACE} --field-selector reason={MOVE_EVENT_REASON}")
    if settings.flex_start is not None:
        for pool in settings.flex_start.pool_names(settings.tpu):
            steps.append(f"gcloud container node-pools describe {pool} --cluster={settings.cluster_name} "
                         f'{location} --format="get(config.flexStart)"')
    for job in job_names[:1]:
        steps.append(f"kubectl get rayjob {job} -w")
        steps.append(f"kubectl logs -f job/{job}")
    return steps
