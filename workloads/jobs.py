"""The training jobs: checkpoint bucket, keyless identity, the script's ConfigMap and one RayJob per job."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from infra.kueue import LOCAL_QUEUE_NAMESPACE, Kueue, local_queues
from infra.settings import PlatformSettings
from workloads.rayjob import SCRIPT_KEY, SCRIPT_PATH, rayjob_manifest
from workloads.settings import WorkloadSettings

KSA_NAME = "ray-training"
# The bucket only: objects read/write/delete, and bucket metadata that gcsfs and pyarrow look up.
BUCKET_ROLES = ("roles/storage.objectUser", "roles/storage.legacyBucketReader")


@dataclass(frozen=True)
class PlatformHandles:
    """What the workloads take from the platform."""

    settings: PlatformSettings
    provider: k8s.Provider
    cluster: pulumi.Resource  # Workload Identity's pool exists once the cluster does
    kueue: Kueue


class TrainingJobs(pulumi.ComponentResource):
    """Checkpoint storage and identity, then the RayJobs, each queued by Kueue on the platform's LocalQueue."""

    bucket: gcp.storage.Bucket
    service_account: gcp.serviceaccount.Account
    rayjobs: list[k8s.apiextensions.CustomResource]
    job_names: list[str]

    def __init__(self, name: str, platform: PlatformHandles, settings: WorkloadSettings,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpu-fallback:workloads:TrainingJobs", name, None, opts)
        project, child = platform.settings.project, pulumi.ResourceOptions(parent=self)
        on_cluster = pulumi.ResourceOptions(parent=self, provider=platform.provider)

        self.bucket = gcp.storage.Bucket(
            f"{name}-checkpoints",
            project=project,
            location=platform.settings.region,  # next to the slices
            uniform_bucket_level_access=True,
            public_access_prevention="enforced",
            # `pulumi destroy` removes everything, checkpoints included; copy out what you want to keep.
            force_destroy=True,
            opts=child,
        )
        self.service_account = gcp.serviceaccount.Account(
            f"{name}-gsa", project=project, account_id=platform.settings.service_account_id("train"),
            display_name="Ray training pods (checkpoint bucket only)", opts=child)
        member = self.service_account.email.apply(lambda email: f"serviceAccount:{email}")
        grants: list[pulumi.Resource] = [
            gcp.storage.BucketIAMMember(f"{name}-bucket-{role.rsplit('.', 1)[-1]}", bucket=self.bucket.name,
                                        role=role, member=member, opts=child)
            for role in BUCKET_ROLES
        ]

        # Every rung's LocalQueue, not only the one jobs are submitted to: a failover moves jobs down the chain.
        namespace_ready: list[pulumi.Resource] = list(platform.kueue.local_queues.values())
        if settings.namespace != LOCAL_QUEUE_NAMESPACE:
            namespace_ready = self._namespace_with_queue(name, settings.namespace, platform, on_cluster)
        ksa = k8s.core.v1.ServiceAccount(
            f"{name}-ksa",
            metadata={"name": KSA_NAME, "namespace": settings.namespace,
                      "annotations": {"iam.gke.io/gcp-service-account": self.service_account.email}},
            opts=pulumi.ResourceOptions.merge(on_cluster, pulumi.ResourceOptions(depends_on=namespace_ready)))
        grants.append(gcp.serviceaccount.IAMMember(
            f"{name}-workload-identity",
            service_account_id=self.service_account.name,
            role="roles/iam.workloadIdentityUser",
            member=f"serviceAccount:{project}.svc.id.goog[{settings.namespace}/{KSA_NAME}]",
            opts=pulumi.ResourceOptions(parent=self, depends_on=[platform.cluster])))

        # Auto-named: a changed script makes a new ConfigMap and the RayJobs follow it, no name clash.
        script = k8s.core.v1.ConfigMap(
            f"{name}-script", metadata={"namespace": settings.namespace},
            data={SCRIPT_KEY: SCRIPT_PATH.read_text()},
            opts=pulumi.ResourceOptions.merge(on_cluster, pulumi.ResourceOptions(depends_on=namespace_ready)))

        self.job_names = list(settings.job_names())
        self.rayjobs = []
        for job_name in self.job_names:
            manifest = pulumi.Output.all(script.metadata["name"], self.bucket.name).apply(
                lambda names, job=job_name: rayjob_manifest(
                    platform.settings, settings, job, configmap=names[0], bucket=names[1],
                    service_account=KSA_NAME, local_queue=platform.kueue.local_queue_name))
            self.rayjobs.append(k8s.apiextensions.CustomResource(
                f"{name}-{job_name}",
                api_version="ray.io/v1",
                kind="RayJob",
                metadata=manifest["metadata"],
                spec=manifest["spec"],
                # Created only once Kueue's webhook runs: an earlier RayJob is never suspended and skips the
                # queue. And only once its pods may write checkpoints. No await on the job itself: it runs
                # for as long as training does.
                opts=pulumi.ResourceOptions.merge(on_cluster, pulumi.ResourceOptions(
                    depends_on=[platform.kueue.release, *namespace_ready, ksa, *grants]))))
        self.register_outputs({"jobs": self.job_names, "bucket": self.bucket.name})

    def _namespace_with_queue(self, name: str, namespace: str, platform: PlatformHandles,
                              on_cluster: pulumi.ResourceOptions) -> list[pulumi.Resource]:
        """A namespace of its own, with the chain's LocalQueues, each pointing at its rung's ClusterQueue."""
        created = k8s.core.v1.Namespace(f"{name}-namespace", metadata={"name": namespace}, opts=on_cluster)
        queues: list[pulumi.Resource] = []
        for index, manifest in enumerate(local_queues(platform.settings, namespace)):
            # The first rung's keeps the resource name it had before the chain, so a deployed stack keeps it.
            suffix = "" if index == 0 else f"-{manifest['metadata']['name']}"
            cluster_queue = platform.kueue.cluster_queues[manifest["spec"]["clusterQueue"]]
            queues.append(k8s.apiextensions.CustomResource(
                f"{name}-localqueue{suffix}", api_version=manifest["apiVersion"], kind=manifest["kind"],
                metadata=manifest["metadata"], spec=manifest["spec"],
                opts=pulumi.ResourceOptions.merge(on_cluster, pulumi.ResourceOptions(
                    depends_on=[created, platform.kueue.release, cluster_queue]))))
        return queues
