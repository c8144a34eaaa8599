"""The GKE cluster with its CPU pool, the node identity, and the Kubernetes provider built from it."""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s
import yaml

from infra.settings import PlatformSettings

# APIs the cluster needs: GKE, Cloud TPU, and image streaming's container file system.
# Ref: https://cloud.google.com/kubernetes-engine/docs/how-to/image-streaming
REQUIRED_APIS = ("container", "tpu", "containerfilesystem")
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
# Least privilege for nodes: the one role GKE needs for logs, metrics and image pulls.
# Ref: https://cloud.google.com/kubernetes-engine/docs/how-to/hardening-your-cluster#use_least_privilege_sa
NODE_ROLES = ("roles/container.defaultNodeServiceAccount",)
# What GKE turns on for a new Standard cluster at 1.34, kept on beside managed Prometheus: the provider sends
# `enable_components` even when it is unset, container.v1 reads an empty list as "disable all monitoring"
# (MonitoringComponentConfig), and a shorter list would turn GKE's default packages off.
# Ref: https://github.com/hashicorp/terraform-provider-google/blob/main/google/services/container/resource_container_cluster.go (expandMonitoringConfig)
# Ref: https://cloud.google.com/kubernetes-engine/docs/how-to/kube-state-metrics (kube state packages: default on
#      Standard since 1.29.2-gke.2000, JOBSET since 1.32.1-gke.1357001)
# Ref: https://cloud.google.com/kubernetes-engine/docs/how-to/cadvisor-kubelet-metrics (default since 1.29.3-gke.1093000)
MONITORING_COMPONENTS = ("SYSTEM_COMPONENTS", "STORAGE", "POD", "DEPLOYMENT", "STATEFULSET", "DAEMONSET", "HPA",
                         "JOBSET", "CADVISOR", "KUBELET")


def monitoring_config() -> dict:
    """Managed collection of Google Cloud Managed Service for Prometheus: GKE runs the collectors that the
    stack's PodMonitorings configure (infra/monitoring.py).
    Ref: https://cloud.google.com/stackdriver/docs/managed-prometheus/setup-managed"""
    return {"enable_components": list(MONITORING_COMPONENTS), "managed_prometheus": {"enabled": True}}


def node_config_common(service_account_email: pulumi.Input[str]) -> dict:
    """What every pool's nodes share: a dedicated identity, Workload Identity, image streaming."""
    return {
        # Unset scopes give no scopes at all; access is governed by IAM roles instead.
        "oauth_scopes": [CLOUD_PLATFORM_SCOPE],
        "service_account": service_account_email,
        "workload_metadata_config": {"mode": "GKE_METADATA"},
        "gcfs_config": {"enabled": True},
    }


def kubeconfig_for(name: str, endpoint: str, ca_certificate: str) -> str:
    """A kubeconfig that authenticates through gke-gcloud-auth-plugin, so no token lands in the state."""
    return yaml.safe_dump({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {
            "certificate-authority-data": ca_certificate, "server": f"https://{endpoint}"}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
        "users": [{"name": name, "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": "gke-gcloud-auth-plugin",
            "installHint": "Install gke-gcloud-auth-plugin: gcloud components install gke-gcloud-auth-plugin",
            "provideClusterInfo": True,
        }}}],
    }, sort_keys=False)


def groups_rbac(settings: PlatformSettings) -> dict:
    """With teams: GKE Google Groups for RBAC, so a RoleBinding's subject can be a team's Google group. The cluster
    resolves membership through gke-security-groups@<domain>, which must contain the teams' groups (directly or
    nested) and be visible to the domain's members. Without teams, nothing: the cluster stays as it was.
    Ref: https://cloud.google.com/kubernetes-engine/docs/how-to/google-groups-rbac"""
    if not settings.teams:
        return {}
    return {"authenticator_groups_config": {"security_group": settings.security_group}}


class GkeCluster(pulumi.ComponentResource):
    """A zonal GKE cluster with the Ray Operator add-on, image streaming, Workload Identity and `default-pool`."""

    cluster: gcp.container.Cluster
    node_service_account: gcp.serviceaccount.Account
    provider: k8s.Provider
    kubeconfig: pulumi.Output[str]

    def __init__(self, name: str, settings: PlatformSettings, opts: pulumi.ResourceOptions | None = None,
                 ray_operator: bool = True):
        """`ray_operator`: GKE's Ray Operator add-on (a fleet's manager installs its own pinned KubeRay)."""
        super().__init__("tpu-fallback:infra:GkeCluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        # Kept on destroy: other workloads in the project may use these APIs too.
        apis = [
            gcp.projects.Service(f"{name}-api-{api}", project=settings.project,
                                 service=f"{api}.googleapis.com", disable_on_destroy=False, opts=child)
            for api in REQUIRED_APIS
        ]

        self.node_service_account = gcp.serviceaccount.Account(
            f"{name}-nodes",
            project=settings.project,
            account_id=settings.service_account_id("nodes"),
            display_name=f"GKE nodes of {settings.cluster_name}",
            opts=child,
        )
        node_roles = [
            gcp.projects.IAMMember(
                f"{name}-nodes-{role.rsplit('.', 1)[-1]}",
                project=settings.project,
                role=role,
                member=self.node_service_account.email.apply(lambda email: f"serviceAccount:{email}"),
                opts=child,
            )
            for role in NODE_ROLES
        ]

        system = settings.system_pool
        self.cluster = gcp.container.Cluster(
            f"{name}-gke",
            project=settings.project,
            name=settings.cluster_name,
            location=settings.zone,  # a zone makes a zonal cluster with one control plane
            min_master_version=settings.gke_version,
            # The cluster's own pool keeps GKE's name `default-pool`, which the seed's Kueue flavor and the
            # Ray head select; so it is not removed and replaced by a separate NodePool.
            initial_node_count=system.node_count,
            node_config={"machine_type": system.machine.name, **node_config_common(self.node_service_account.email)},
            node_pool_defaults={"node_config_defaults": {"gcfs_config": {"enabled": True}}},
            addons_config={"ray_operator_configs": [{"enabled": True}]} if ray_operator else None,
            workload_identity_config={"workload_pool": f"{settings.project}.svc.id.goog"},
            # Off: GKE's defaults, untouched.
            monitoring_config=monitoring_config() if settings.monitoring.enabled else None,
            # pulumi-gcp defaults this to true, which makes `pulumi destroy` fail (pulumi/pulumi-gcp#1394).
            deletion_protection=settings.deletion_protection,
            **groups_rbac(settings),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*apis, *node_roles]),
        )

        self.kubeconfig = pulumi.Output.secret(pulumi.Output.all(
            self.cluster.name, self.cluster.endpoint, self.cluster.master_auth.cluster_ca_certificate,
        ).apply(lambda parts: kubeconfig_for(*parts)))
        self.provider = k8s.Provider(
            f"{name}-k8s",
            kubeconfig=self.kubeconfig,
            # Replaced only when the cluster is; a kubeconfig change alone must not replace every object.
            cluster_identifier=self.cluster.id,
            opts=child,
        )
        self.register_outputs({"clusterName": self.cluster.name, "kubeconfig": self.kubeconfig})
