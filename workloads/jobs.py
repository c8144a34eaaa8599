"""The training jobs: checkpoint bucket, keyless identity, the script's ConfigMap and one RayJob per job."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from infra.kueue import LOCAL_QUEUE_NAMESPACE, Kueue, local_queues
from infra.settings import PlatformSettings
from workloads.rayjob import SCRIPT_KEY, SCRIPT_PATH, rayjob_manifest
from workloads.settings import WorkloadSettings

KSA_NAME = "ray-training"
TRAIN_ROLE = "train"
TEAM_ROLE_MAX = 24  # leaves the cluster name at least 5 of an account ID's 30 characters
SCRIPT_CONFIGMAP_PREFIX = "train-script"
BUCKET_SUFFIX = "ckpt"
# The bucket only: objects read/write/delete, and bucket metadata that gcsfs and pyarrow look up.
BUCKET_ROLES = ("roles/storage.objectUser", "roles/storage.legacyBucketReader")


def script_configmap_name(script: str) -> str:
    """Named after the script's content: a changed script is a new ConfigMap (created before the old one is
    deleted, no name clash) and the RayJobs follow it; the same script keeps the same name, known at preview."""
    return f"{SCRIPT_CONFIGMAP_PREFIX}-{hashlib.sha256(script.encode()).hexdigest()[:10]}"


# Bucket names: 3-63 characters of [a-z0-9-_.], a letter or digit at both ends, not starting with "goog", not
# containing "google" or a close misspelling such as "g00gle"; public and globally unique.
# Ref: https://cloud.google.com/storage/docs/buckets#naming
BUCKET_NAME_MAX = 63
_BUCKET_HASH_LENGTH = 8
_NOT_NAME_CHARS = re.compile(r"[^a-z0-9]+")
_GOOGLE_LIKE = re.compile(r"g[o0]{2,}g[l1]*e?")  # "goog" (the prefix), "google", "g00gle", "goog1e", ...


def checkpoint_bucket_name(gcp_project: str, stack: str, pulumi_project: str = "") -> str:
    """`<gcp project>-<stack>-ckpt-<hash>`: readable, fixed for a stack (so known at preview), and globally unique.

    GCP project IDs are globally unique and one stack is one team and zone in it; the hash covers all three
    names as given, so names cut to fit, or made valid, never collide. Anything Google forbids is dropped.
    """
    digest = hashlib.sha256(f"{gcp_project}\0{pulumi_project}\0{stack}".encode()).hexdigest()[:_BUCKET_HASH_LENGTH]
    tail = f"-{BUCKET_SUFFIX}-{digest}"

    def clean(text: str) -> str:
        return _NOT_NAME_CHARS.sub("-", _GOOGLE_LIKE.sub("-", text.lower())).strip("-")

    room = BUCKET_NAME_MAX - len(tail)
    project, stack_part = clean(gcp_project), clean(stack)
    if len(project) + 1 + len(stack_part) > room:  # too long: the project keeps at least half the room
        project = project[:max(room // 2, room - 1 - len(stack_part))].strip("-")
    readable = "-".join(part for part in (project, stack_part) if part)[:room].strip("-")
    return f"{readable}{tail}" if readable else tail.lstrip("-")


@dataclass(frozen=True)
class TeamNamespace:
    """A team's namespace on a shared cluster, which the platform stack made with the team's LocalQueues."""

    team: str
    namespace: str
    local_queue: str  # the first rung's, which jobs are submitted to


@dataclass(frozen=True)
class JobSite:
    """A cluster where the jobs' pods may run though they are submitted elsewhere (a fleet member: the manager
    creates the RayJob there): it needs the jobs' Kubernetes ServiceAccount and script, and Workload Identity in
    its project."""

    name: str
    provider: k8s.Provider
    project: str


@dataclass(frozen=True)
class PlatformHandles:
    """What the workloads take from the platform: declared in the same stack (one team: `kueue` and `cluster`), or
    by a platform stack this stack only reads (a team stack: `team`, the rest lives in the other stack)."""

    settings: PlatformSettings
    provider: k8s.Provider
    cluster: pulumi.Resource | None  # Workload Identity's pool exists once the cluster does
    kueue: Kueue | None
    team: TeamNamespace | None = None
    # A fleet: the pods run on these clusters, not on `provider`'s, which only queues the RayJobs (after `ready`).
    sites: tuple[JobSite, ...] = ()
    ready: tuple[pulumi.Resource, ...] = ()
    bucket_location: str | None = None  # default: the platform's region

    def __post_init__(self):
        if (self.team is None) == (self.kueue is None):
            raise ValueError("PlatformHandles: either this stack's Kueue or a team's namespace on another stack's")


def training_account_id(platform: PlatformSettings, team: TeamNamespace | None) -> str:
    """`<cluster>-train`; on a shared cluster `<cluster>-<team>-train`: every team stack otherwise claims one account.
    Account IDs are 6-30 characters, so a long team name is cut and told apart by a digest.
    Ref: https://cloud.google.com/iam/docs/service-accounts-create#creating"""
    if team is None:
        return platform.service_account_id(TRAIN_ROLE)
    role = f"{team.team}-{TRAIN_ROLE}"
    if len(role) > TEAM_ROLE_MAX:
        digest = hashlib.sha256(team.team.encode()).hexdigest()[:4]
        role = f"{team.team[:TEAM_ROLE_MAX - len(TRAIN_ROLE) - 6].rstrip('-')}-{digest}-{TRAIN_ROLE}"
    return platform.service_account_id(role)


class TrainingJobs(pulumi.ComponentResource):
    """Checkpoint storage and identity, then the RayJobs, each queued by Kueue on the platform's LocalQueue."""

    bucket: gcp.storage.Bucket
    bucket_name: str  # fixed by the program: checkpoint_bucket_name()
    script_configmap_name: str  # fixed by the program: script_configmap_name()
    service_account: gcp.serviceaccount.Account
    rayjobs: list[k8s.apiextensions.CustomResource]
    job_names: list[str]

    def __init__(self, name: str, platform: PlatformHandles, settings: WorkloadSettings,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpu-fallback:workloads:TrainingJobs", name, None, opts)
        project, child = platform.settings.project, pulumi.ResourceOptions(parent=self)
        on_cluster = pulumi.ResourceOptions(parent=self, provider=platform.provider)

        self.bucket_name = checkpoint_bucket_name(project, pulumi.get_stack(), pulumi.get_project())
        self.bucket = gcp.storage.Bucket(
            f"{name}-checkpoints",
            # Fixed, so the RayJobs that write to it are known at preview. A stack deployed when the bucket was
            # auto-named gets a new bucket under this name (the old one, checkpoints included, is deleted).
            name=self.bucket_name,
            project=project,
            location=platform.bucket_location or platform.settings.region,  # next to the slices
            uniform_bucket_level_access=True,
            public_access_prevention="enforced",
            # `pulumi destroy` removes everything, checkpoints included; copy out what you want to keep.
            force_destroy=True,
            opts=child,
        )
        self.service_account = gcp.serviceaccount.Account(
            f"{name}-gsa", project=project, account_id=training_account_id(platform.settings, platform.team),
            display_name="Ray training pods (checkpoint bucket only)", opts=child)
        member = self.service_account.email.apply(lambda email: f"serviceAccount:{email}")
        grants: list[pulumi.Resource] = [
            gcp.storage.BucketIAMMember(f"{name}-bucket-{role.rsplit('.', 1)[-1]}", bucket=self.bucket.name,
                                        role=role, member=member, opts=child)
            for role in BUCKET_ROLES
        ]

        if platform.team is not None:
            # A team stack: the platform stack made Kueue, the namespace and its queues; nothing here to wait for.
            if settings.namespace != platform.team.namespace:
                raise ValueError(f"team {platform.team.team} deploys into {platform.team.namespace}, "
                                 f"not {settings.namespace}")
            namespace_ready, kueue_ready, local_queue = [], [], platform.team.local_queue
        else:
            # Every rung's LocalQueue, not only the one jobs are submitted to: a failover moves jobs down the chain.
            namespace_ready = list(platform.kueue.local_queues.values())
            if settings.namespace != LOCAL_QUEUE_NAMESPACE:
                namespace_ready = self._namespace_with_queue(name, settings.namespace, platform, on_cluster)
            kueue_ready, local_queue = [platform.kueue.release], platform.kueue.local_queue_name
        script_text = SCRIPT_PATH.read_text()
        self.script_configmap_name = script_configmap_name(script_text)
        sites = platform.sites or (JobSite("", platform.provider, project),)
        on_sites: list[pulumi.Resource] = []
        for site in sites:
            # The single-cluster names stay as they were (`<name>-ksa`), so a deployed stack keeps its URNs.
            prefix = f"{name}-{site.name}" if site.name else name
            at_site = pulumi.ResourceOptions(parent=self, provider=site.provider, depends_on=namespace_ready)
            on_sites.append(k8s.core.v1.ServiceAccount(
                f"{prefix}-ksa",
                metadata={"name": KSA_NAME, "namespace": settings.namespace,
                          "annotations": {"iam.gke.io/gcp-service-account": self.service_account.email}},
                opts=at_site))
            on_sites.append(k8s.core.v1.ConfigMap(
                f"{prefix}-script", metadata={"name": self.script_configmap_name, "namespace": settings.namespace},
                data={SCRIPT_KEY: script_text}, opts=at_site))
        # One binding per project: Workload Identity's pool is the project's, whatever the cluster.
        for site_project in dict.fromkeys(site.project for site in sites):
            suffix = "" if site_project == project else f"-{site_project}"
            grants.append(gcp.serviceaccount.IAMMember(
                f"{name}-workload-identity{suffix}",
                service_account_id=self.service_account.name,
                role="roles/iam.workloadIdentityUser",
                member=f"serviceAccount:{site_project}.svc.id.goog[{settings.namespace}/{KSA_NAME}]",
                opts=pulumi.ResourceOptions(parent=self,
                                            depends_on=[platform.cluster] if platform.cluster else [])))

        self.job_names = list(settings.job_names())
        self.rayjobs = []
        for job_name in self.job_names:
            # Plain values only, no output of another resource: the whole RayJob is known at preview, and a
            # targeted update that skips the ConfigMap or the bucket still builds it. Order is kept by depends_on.
            manifest = rayjob_manifest(platform.settings, settings, job_name, configmap=self.script_configmap_name,
                                       bucket=self.bucket_name, service_account=KSA_NAME,
                                       local_queue=local_queue)
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
                    depends_on=[*kueue_ready, *platform.ready, *namespace_ready, *on_sites, self.bucket,
                                *grants]))))
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
