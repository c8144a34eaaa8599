"""The cluster component: APIs, node identity, the GKE cluster and the Kubernetes provider."""

from __future__ import annotations

import yaml

from infra.cluster import CLOUD_PLATFORM_SCOPE, kubeconfig_for
from infra.offline import SECRET_MARK
from tests.conftest import plan_for

CLUSTER = "gcp:container/cluster:Cluster"


def test_apis_are_enabled_and_kept_on_destroy():
    plan = plan_for()
    component = plan.only("tpu-fallback:infra:GkeCluster").urn  # infra/monitoring.py enables its own API
    services = {s.inputs["service"]: s for s in plan.of_type("gcp:projects/service:Service") if s.parent == component}
    assert set(services) == {"container.googleapis.com", "tpu.googleapis.com", "containerfilesystem.googleapis.com"}
    assert all(s.inputs["disableOnDestroy"] is False for s in services.values())


def test_cluster_waits_for_apis_and_node_identity():
    plan = plan_for()
    cluster = plan.only(CLUSTER)
    index = plan.by_urn()
    waits_for = {index[d].type for d in cluster.dependencies}
    assert {"gcp:projects/service:Service", "gcp:projects/iAMMember:IAMMember"} <= waits_for


def test_cluster_matches_the_seed():
    cluster = plan_for().only(CLUSTER).inputs
    assert cluster["name"] == "tpu-cluster"
    assert cluster["location"] == "us-east5-b"  # zonal: one control plane
    assert cluster["minMasterVersion"] == "1.34"
    assert cluster["initialNodeCount"] == 3
    assert cluster["nodeConfig"]["machineType"] == "n2-standard-16"
    assert cluster["addonsConfig"] == {"rayOperatorConfigs": [{"enabled": True}]}
    assert cluster["nodePoolDefaults"]["nodeConfigDefaults"]["gcfsConfig"] == {"enabled": True}
    assert cluster["nodeConfig"]["gcfsConfig"] == {"enabled": True}
    assert cluster["workloadIdentityConfig"] == {"workloadPool": "example-project.svc.id.goog"}
    assert "removeDefaultNodePool" not in cluster  # default-pool stays: Kueue and Ray heads select it


def test_deletion_protection_follows_config():
    assert plan_for().only(CLUSTER).inputs["deletionProtection"] is False
    protected = plan_for(overrides={"deletionProtection": True})
    assert protected.only(CLUSTER).inputs["deletionProtection"] is True


def test_nodes_run_as_a_dedicated_least_privilege_account():
    plan = plan_for()
    account = plan.named("platform-nodes")
    email = account.outputs["email"]
    assert not email.endswith("-compute@developer.gserviceaccount.com")
    roles = [m.inputs for m in plan.of_type("gcp:projects/iAMMember:IAMMember")]
    assert roles == [{"member": f"serviceAccount:{email}", "project": "example-project",
                      "role": "roles/container.defaultNodeServiceAccount"}]
    for pool_config in [plan.only(CLUSTER).inputs["nodeConfig"],
                        *(p.inputs["nodeConfig"] for p in plan.of_type("gcp:container/nodePool:NodePool"))]:
        assert pool_config["serviceAccount"] == email
        assert pool_config["oauthScopes"] == [CLOUD_PLATFORM_SCOPE]
        assert pool_config["workloadMetadataConfig"] == {"mode": "GKE_METADATA"}


def test_service_account_ids_fit_gcp_limits_for_the_longest_cluster_name():
    plan = plan_for(overrides={"clusterName": "a" * 39 + "b"})
    ids = sorted(a.inputs["accountId"] for a in plan.of_type("gcp:serviceaccount/account:Account"))
    assert ids == ["a" * 24 + "-nodes", "a" * 24 + "-train"]
    assert all(6 <= len(i) <= 30 for i in ids)


def test_provider_uses_exec_auth_and_a_stable_identifier():
    plan = plan_for()
    provider = plan.only("pulumi:providers:kubernetes")
    assert provider.inputs["kubeconfig"] == SECRET_MARK
    assert provider.inputs["clusterIdentifier"] == "projects/example-project/locations/us-east5-b/clusters/tpu-cluster"
    assert "kubeconfig" in plan.secret_outputs


def test_kubeconfig_has_no_token_and_uses_the_gke_plugin():
    config = yaml.safe_load(kubeconfig_for("tpu-cluster", "203.0.113.10", "Q0E="))
    user = config["users"][0]["user"]
    assert set(user) == {"exec"}
    assert user["exec"]["command"] == "gke-gcloud-auth-plugin"
    assert config["clusters"][0]["cluster"] == {"certificate-authority-data": "Q0E=", "server": "https://203.0.113.10"}


def test_every_kubernetes_resource_uses_the_cluster_provider():
    plan = plan_for()
    provider = plan.only("pulumi:providers:kubernetes")
    kubernetes = [r for r in plan.resources if r.custom and r.type.startswith("kubernetes:")]
    assert kubernetes
    assert all(r.provider_urn == provider.urn for r in kubernetes)
